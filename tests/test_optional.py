"""Which files of an image always load (buildmatrix.optional), through ``check``.

The files are nvcc-built and laid out as real packages lay them out
(tests/optional_fixtures.py): an extension with sm_80 and PTX that names two
libraries in DT_NEEDED, an sm_90a-only extension beside it, cuda12x/cuda13x sibling
libraries, standalone cubins, a library nothing names (dlopen) and a program that
names it. Every arrangement of them is judged through the CLI on every profile, and
the expected verdicts are computed here from the compatibility rules
(docs/compatibility.md) over cuobjdump's lists of each file and over what the recipe
made each file, never from buildmatrix's reader: binutils' readelf and nm are the
oracle for what the reader takes from the ELF files.
"""

from __future__ import annotations

import functools
import itertools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from buildmatrix.binary.dynamic import read_dso
from buildmatrix.binary.source import BytesSource
from tests.conftest import NVCC_CACHE, CliRunner
from tests.cuobjdump import cuobjdump_lists, find_cuobjdump
from tests.fixtures.build import have_nvcc
from tests.images import Entry, Image, Layer, Symlink, write_docker_archive
from tests.optional_fixtures import BY_KEY, PARTS, SITE, build_parts, lay_out

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_nvcc(), reason="nvcc is needed to build the fixtures"),
]

PROFILES = ("7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "12.0", "12.1")
DRIVER = "580.65.06"  # CUDA 13.0's: every PTX nvcc 13.0 writes JIT-compiles on it
RANK = {"none": 0, "jit": 1, "native": 2}
# What may be present or not: the two cubins come and go together.
TOGGLES = ("ext", "core", "needed", "fa3", "ops12", "ops13", "cubins", "lazy", "tool")


@pytest.fixture(scope="module")
def parts() -> dict[str, Path]:
    return build_parts(NVCC_CACHE)


@pytest.fixture(scope="module")
def lists(parts: dict[str, Path]) -> dict[str, tuple[set[str], set[str]]]:
    """(SASS, PTX) of each part with device code, as cuobjdump lists them."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump (pip nvidia-cuda-cuobjdump) is needed as the reference")
    out = {}
    for key, path in parts.items():
        if BY_KEY[key].gencode:
            sass, ptx = cuobjdump_lists(tool, path)
            out[key] = (set(sass), set(ptx))
    return out


def _cc(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _runs(sass: set[str], ptx: set[str], cc: tuple[int, int]) -> str:
    """DESIGN's rules: sm_XY runs on X.Z, Z >= Y; sm_XYa on X.Y alone; compute_XY
    JIT-compiles for CC >= X.Y (the driver reads nvcc 13.0's PTX ISA)."""
    for arch in sass:
        m = re.fullmatch(r"sm_(\d+)(\d)([af]?)", arch)
        assert m, arch
        at = (int(m[1]), int(m[2]))
        if (m[3] == "a" and cc == at) or (m[3] != "a" and cc[0] == at[0] and cc[1] >= at[1]):
            return "native"
    for arch in ptx:
        m = re.fullmatch(r"compute_(\d+)(\d)([af]?)", arch)
        assert m, arch
        at = (int(m[1]), int(m[2]))
        if (m[3] == "a" and cc == at) or (m[3] != "a" and cc >= at):
            return "jit"
    return "none"


def _expected(
    keys: set[str], lists: dict[str, tuple[set[str], set[str]]], cc: tuple[int, int]
) -> tuple[str, str, set[str]]:
    """(verdict, strict verdict, skipped parts) on ``cc`` of an image of ``keys``, by
    the rules as docs/compatibility.md states them, over the recipe."""
    code = sorted(k for k in keys if k in lists)
    v = {k: _runs(*lists[k], cc) for k in code}
    strict = min((v[k] for k in code), key=RANK.__getitem__, default="native")
    # always loads: the extension and the program (roots) and what they name, down;
    # never an sm_90a-only file (rule a) or data (rule c)
    roots = {k for k in keys if BY_KEY[k].kind in ("ext", "exe") and BY_KEY[k].role == "plain"}
    required = set(roots)
    for root in roots:
        required |= {n for n in BY_KEY[root].needs if n in keys}
    optional = {k for k in code if k not in required}
    siblings = {k for k in optional if BY_KEY[k].role == "sibling"}
    group = siblings if len(siblings) > 1 else set()
    optional -= group
    if not any(BY_KEY[k].kind in ("ext", "exe") for k in keys):
        # no program, no extension: nothing shows what loads the libraries (rule d off)
        required |= {k for k in optional if BY_KEY[k].role in ("plain", "sibling")}
        optional -= required
    counted = [v[k] for k in code if k in required]
    skipped = set()
    if group:
        # The other files' device code shows the CUDA release nvcc wrote it for: of
        # the cuda12x/cuda13x siblings, the one of that major loads (on every GPU).
        shown = any(k not in group for k in code)
        pool = {k for k in group if BY_KEY[k].path.endswith(f"cuda{_nvcc_major()}x.so")}
        best = max(sorted(pool if shown else group), key=lambda k: RANK[v[k]])
        counted.append(v[best])
        if shown:  # the other never loads
            skipped |= group - pool
        elif v[best] != "none":
            skipped |= group - {best}
    if counted:
        verdict = min(counted, key=RANK.__getitem__)
        skipped |= {k for k in optional if v[k] == "none"}
    else:
        runs = [v[k] for k in optional if v[k] != "none"]
        verdict = max(runs, key=RANK.__getitem__) if runs else "none"
        skipped |= {k for k in optional if v[k] == "none"} if runs else set()
    return verdict, strict, skipped


@functools.cache
def _nvcc_major() -> int:
    """The CUDA release of the nvcc that built the parts (``nvcc --version``)."""
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True)
    found = re.search(r"release (\d+)\.", out.stdout)
    assert found, out.stdout
    return int(found[1])


def _keys(toggles: tuple[str, ...]) -> set[str]:
    keys = set(toggles) - {"cubins"}
    return keys | ({"cubin90", "cubin120"} if "cubins" in toggles else set())


def _check(cli: CliRunner, ref: str, *extra: str) -> dict[str, object]:
    args = ["check", ref, "--driver", DRIVER, "--json", *extra]
    for cc in PROFILES:
        args += ["--sm", cc]
    result = cli(*args)
    assert result.code in (0, 1), result.err
    doc = result.json()
    assert isinstance(doc, dict)
    assert result.code == (0 if doc["verdict"] == "pass" else 1)
    return doc


def _path_key(path: str) -> str:
    return next(p.key for p in PARTS if p.path == path)


def _assert_as_expected(
    doc: dict[str, object], keys: set[str], lists: dict[str, tuple[set[str], set[str]]]
) -> None:
    targets = doc["targets"]
    assert isinstance(targets, list)
    assert [t["compute_capability"] for t in targets] == list(PROFILES)
    for t in targets:
        verdict, strict, skipped = _expected(keys, lists, _cc(t["compute_capability"]))
        got = {_path_key(s["path"]) for s in t["skipped"]}
        # one container per file: every file counted is --strict's verdict too
        assert t["every_file_verdict"] == strict
        assert (t["verdict"], t["strict_verdict"], got) == (verdict, strict, skipped), (
            sorted(keys),
            t["compute_capability"],
            t["reasons"],
        )
        for s in t["skipped"]:
            assert f"skipped on {t['compute_capability']}" in s["reason"]
    passes = all(t["verdict"] != "none" and t["driver_ok"] for t in targets)
    assert doc["verdict"] == ("pass" if passes else "fail")
    strict_passes = all(t["strict_verdict"] != "none" and t["driver_ok"] for t in targets)
    assert doc["strict_verdict"] == ("pass" if strict_passes else "fail")


def test_every_arrangement_on_every_profile(
    cli: CliRunner,
    tmp_path: Path,
    parts: dict[str, Path],
    lists: dict[str, tuple[set[str], set[str]]],
) -> None:
    """Every subset of the package's files (512 images, the adversarial ones among
    them: all device code in optional files, a file that always loads lacking code, a
    sibling pair of which none runs), each on every profile: verdict, --strict's
    verdict and the files skipped, as the rules give them."""
    seen = 0
    for n in range(1, len(TOGGLES) + 1):
        for toggles in itertools.combinations(TOGGLES, n):
            keys = _keys(toggles)
            if not keys & set(lists):
                continue  # no device code at all: check's "holds no device code"
            root = lay_out(tmp_path / "-".join(toggles), parts, keys)
            _assert_as_expected(_check(cli, f"dir:{root}"), keys, lists)
            shutil.rmtree(root)
            seen += 1
    assert seen == 2 ** len(TOGGLES) - 2  # all but the empty set and {tool}


def test_strict_judges_every_file(
    cli: CliRunner,
    tmp_path: Path,
    parts: dict[str, Path],
    lists: dict[str, tuple[set[str], set[str]]],
) -> None:
    """--strict keeps the every-file rule: its verdict is strict_verdict, nothing is
    skipped."""
    keys = _keys(TOGGLES)
    root = lay_out(tmp_path / "all", parts, keys)
    doc = _check(cli, f"dir:{root}", "--strict")
    targets = doc["targets"]
    assert isinstance(targets, list)
    for t in targets:
        _, strict, _ = _expected(keys, lists, _cc(t["compute_capability"]))
        assert (t["verdict"], t["strict_verdict"], t["skipped"]) == (strict, strict, [])


def _image_layers(parts: dict[str, Path], keys: set[str]) -> list[Layer]:
    return [{BY_KEY[k].path: parts[k].read_bytes() for k in sorted(keys)}]


@pytest.mark.parametrize(
    "toggles",
    [
        TOGGLES,
        ("ext", "core", "fa3", "ops12", "ops13", "cubins", "lazy"),  # vLLM-like
        ("fa3", "cubins", "lazy"),  # all device code optional
        ("ops12", "ops13"),  # bitsandbytes alone: one of them must run
    ],
)
def test_a_docker_archive_as_the_folder(
    cli: CliRunner,
    tmp_path: Path,
    parts: dict[str, Path],
    lists: dict[str, tuple[set[str], set[str]]],
    toggles: tuple[str, ...],
) -> None:
    """The same rule on a real image: a docker save archive of the files."""
    keys = _keys(toggles)
    archive = write_docker_archive(tmp_path / "img.tar", Image(layers=_image_layers(parts, keys)))
    _assert_as_expected(_check(cli, f"docker-archive:{archive}"), keys, lists)


def test_a_file_given_alone_is_judged(cli: CliRunner, parts: dict[str, Path]) -> None:
    """``check lib.so``: the user asked about that file, so it counts whatever its
    kind (liblazy.so, which nothing names, has sm_75 alone)."""
    doc = cli("check", str(parts["lazy"]), "--sm", "8.0", "--json").json()
    assert doc["verdict"] == "fail"
    assert doc["targets"][0]["verdict"] == "none"
    assert doc["targets"][0]["skipped"] == []


def test_the_text_output_names_what_is_skipped(
    cli: CliRunner, tmp_path: Path, parts: dict[str, Path]
) -> None:
    keys = _keys(("ext", "core", "fa3", "cubins", "lazy"))
    root = lay_out(tmp_path / "img", parts, keys)
    out = cli("check", f"dir:{root}", "--sm", "8.0", "--driver", DRIVER).out
    assert "skipped  optional files without code for the GPU" in out
    assert re.search(r"sm_80: 1 file\(s\), arch-specific code.*_fa3_C\.abi3\.so", out), out
    assert re.search(r"sm_80: 2 file\(s\), a cubin/fatbinary/PTX file.*k_sm120", out), out
    assert re.search(r"sm_80: 1 file\(s\), a library nothing links.*liblazy\.so", out), out
    summary = tmp_path / "summary.md"
    cli("check", f"dir:{root}", "--sm", "8.0", "--driver", DRIVER, "--summary", str(summary))
    assert "4 optional file(s) skipped where they have no code" in summary.read_text()


def _readelf(path: Path) -> tuple[str | None, list[str], bool]:
    """(SONAME, DT_NEEDED, program) as binutils' readelf reads them."""
    dynamic = subprocess.run(
        ["readelf", "-dlhW", str(path)], capture_output=True, text=True, check=True
    ).stdout
    soname = re.search(r"\(SONAME\)\s+Library soname: \[(.*)\]", dynamic)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dynamic)
    program = (
        "EXEC (Executable file)" in dynamic
        or "INTERP" in dynamic
        or re.search(r"\(FLAGS_1\)\s+Flags:.*\bPIE\b", dynamic) is not None
    )
    return (soname[1] if soname else None), needed, program


SYSTEM = ("/usr/bin/gcc", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/bin/ls")


@pytest.mark.parametrize("key", [p.key for p in PARTS if p.kind != "cubin"] + list(SYSTEM))
def test_links_are_what_readelf_and_nm_read(parts: dict[str, Path], key: str) -> None:
    """SONAME, DT_NEEDED, program or not: readelf's; an extension module: nm's
    ``PyInit_<name>`` among the defined dynamic symbols."""
    path = Path(key) if key.startswith("/") else parts[key]
    if not path.is_file():
        pytest.skip(f"{path} is not on this machine")
    path = path.resolve()
    links = read_dso(BytesSource(path.read_bytes(), name=path.name), name=path.name).links
    soname, needed, program = _readelf(path)
    assert (links.soname, list(links.needed), links.program) == (soname, needed, program)
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True
    ).stdout
    stem = path.name.partition(".")[0]
    module = path.name.endswith(".so") and re.search(rf"\sPyInit_{stem}$", symbols, re.M)
    assert links.python_module == bool(module)
    if not key.startswith("/"):
        assert links.python_module == (BY_KEY[key].kind == "ext")


def _archive_check(
    cli: CliRunner, tmp_path: Path, layer: Layer, *sms: str, env: dict[str, str] | None = None
) -> dict[str, object]:
    archive = write_docker_archive(tmp_path / "img.tar", Image(layers=[layer], env=env or {}))
    args = ["check", f"docker-archive:{archive}", "--driver", DRIVER, "--json"]
    for cc in sms:
        args += ["--sm", cc]
    doc = cli(*args).json()
    assert isinstance(doc, dict)
    return doc


def _targets(doc: dict[str, object]) -> dict[str, dict[str, object]]:
    targets = doc["targets"]
    assert isinstance(targets, list)
    return {t["compute_capability"]: t for t in targets}


def _skipped(target: dict[str, object]) -> dict[str, str]:
    skipped = target["skipped"]
    assert isinstance(skipped, list)
    return {Path(s["path"]).name: s["reason"] for s in skipped}


def _layer(parts: dict[str, Path], *keys: str) -> dict[str, Entry]:
    return {BY_KEY[k].path: parts[k].read_bytes() for k in keys}


def test_an_optional_file_needs_what_it_loads(
    cli: CliRunner, tmp_path: Path, parts: dict[str, Path]
) -> None:
    """libplugin.so (sm_80; nothing names it) names libplugdep.so (sm_90) in
    DT_NEEDED: loading the plugin loads its library, so on 8.0 the plugin is skipped
    because of it, and on 9.0 because of its own code; the library is optional too
    (only the plugin names it)."""
    doc = _archive_check(
        cli, tmp_path, _layer(parts, "ext", "core", "plugin", "plugdep"), "8.6", "9.0"
    )
    on = _targets(doc)
    assert on["8.6"]["verdict"] == "native"  # libneeded absent: the extension's rest runs
    skipped86 = _skipped(on["8.6"])
    assert set(skipped86) == {"libplugin.so", "libplugdep.so"}
    assert skipped86["libplugin.so"].startswith(
        f"it loads {BY_KEY['plugdep'].path}, which has no code for 8.6 — skipped on 8.6"
    )
    assert (
        "only usr/lib/python3/dist-packages/pkg/lib/libplugin.so names it"
        in (skipped86["libplugdep.so"])
    )
    assert set(_skipped(on["9.0"])) == {"libplugin.so"}


def test_a_dt_needed_name_may_be_a_symlinks(
    cli: CliRunner, tmp_path: Path, parts: dict[str, Path]
) -> None:
    """A program names libnosoname.so, which has no DT_SONAME: the file lies at
    libnosoname.so.1.0 and the name is a symlink's. Through the link it always loads
    (sm_75 alone: 8.0 fails); without the link nothing names the file, which is then
    loaded by dlopen if at all (skipped on 8.0)."""
    lib = f"{SITE}/lib/libnosoname.so"
    base = {
        **_layer(parts, "ext", "core", "user"),
        f"{lib}.1.0": parts["nosoname"].read_bytes(),
    }
    linked = _targets(
        _archive_check(cli, tmp_path, {**base, lib: Symlink("libnosoname.so.1.0")}, "8.0")
    )
    assert linked["8.0"]["verdict"] == "none"
    reasons = linked["8.0"]["reasons"]
    assert isinstance(reasons, list)
    assert any("libnosoname.so.1.0: sm_75 SASS" in r for r in reasons)
    (tmp_path / "img.tar").unlink()
    alone = _targets(_archive_check(cli, tmp_path, base, "8.0"))
    assert alone["8.0"]["verdict"] == "native"
    assert set(_skipped(alone["8.0"])) == {"libnosoname.so.1.0"}


def test_ld_preload_always_loads(cli: CliRunner, tmp_path: Path, parts: dict[str, Path]) -> None:
    """A library the image's LD_PRELOAD names is loaded into every process."""
    layer = _layer(parts, "ext", "core", "lazy")
    plain = _targets(_archive_check(cli, tmp_path, layer, "8.0"))
    assert set(_skipped(plain["8.0"])) == {"liblazy.so"}
    (tmp_path / "img.tar").unlink()
    preload = {"LD_PRELOAD": f"/{BY_KEY['lazy'].path}"}
    loaded = _targets(_archive_check(cli, tmp_path, layer, "8.0", env=preload))
    assert loaded["8.0"]["verdict"] == "none"
    assert loaded["8.0"]["skipped"] == []


def test_a_sibling_a_program_names_always_loads(
    cli: CliRunner, tmp_path: Path, parts: dict[str, Path]
) -> None:
    """tool2 names libops_cuda12x.so (sm_80) in DT_NEEDED: it always loads, so it
    fails 9.0 although its cuda13x sibling runs there; without tool2 the two are one
    group and 9.0 passes."""
    group = _targets(_archive_check(cli, tmp_path, _layer(parts, "ops12", "ops13"), "9.0"))
    assert group["9.0"]["verdict"] == "native"
    (tmp_path / "img.tar").unlink()
    named = _archive_check(cli, tmp_path, _layer(parts, "ops12", "ops13", "tool2"), "9.0")
    assert _targets(named)["9.0"]["verdict"] == "none"
    loading = named["loading"]
    assert isinstance(loading, dict)
    assert loading["groups"] == []


def test_a_file_skipped_everywhere_sets_no_runtime(
    cli: CliRunner, tmp_path: Path, parts: dict[str, Path]
) -> None:
    """The sm_90a-only extension, skipped on every target asked (8.0, 8.6), is no sign
    of the CUDA runtime the image needs; judged on 9.0 too, where it runs, it is."""
    layer = _layer(parts, "ext", "core", "fa3")
    fa3 = BY_KEY["fa3"].path

    def sources(doc: dict[str, object]) -> list[str]:
        found = doc["cuda_runtime_sources"]
        assert isinstance(found, list)
        return [s["source"] for s in found]

    skipped = _archive_check(cli, tmp_path, layer, "8.0", "8.6")
    assert not any(fa3 in s for s in sources(skipped))
    assert any(BY_KEY["core"].path in s for s in sources(skipped))
    (tmp_path / "img.tar").unlink()
    runs = _archive_check(cli, tmp_path, layer, "8.0", "9.0")
    assert any(fa3 in s for s in sources(runs))


def test_an_ld_so_preload_file_turns_rule_d_off(
    cli: CliRunner, tmp_path: Path, parts: dict[str, Path]
) -> None:
    """/etc/ld.so.preload names libraries glibc's loader maps into every process
    (elf/rtld.c dl_main); its names are not read, so a library nothing names counts
    (liblazy.so, sm_75 alone, fails 8.0), as under LD_PRELOAD."""
    layer = {
        **_layer(parts, "ext", "core", "lazy"),
        "etc/ld.so.preload": f"/{BY_KEY['lazy'].path}\n".encode(),
    }
    doc = _archive_check(cli, tmp_path, layer, "8.0")
    on = _targets(doc)
    assert on["8.0"]["verdict"] == "none"
    assert on["8.0"]["skipped"] == []
    loading = doc["loading"]
    assert isinstance(loading, dict)
    assert loading["optional"] == []
    assert any("/etc/ld.so.preload" in n for n in loading["notes"])
