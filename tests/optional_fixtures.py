"""nvcc-built files laid out as real GPU packages lay them out, for the rule of which
files always load (buildmatrix.optional; tests/test_optional.py).

Each component is built by nvcc (and linked by gcc's linker through nvcc) with real
``DT_SONAME`` and ``DT_NEEDED`` entries and, for the extension modules, a real
``PyInit_<name>`` export; what each one *is* (an extension, a library another one
names in DT_NEEDED, a sibling, data) is the recipe's, written here, never read back by
buildmatrix's reader. Builds are cached under the fixtures' nvcc cache, keyed by the
recipe, the sources and nvcc's version.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.build import SRC


@dataclass(frozen=True, kw_only=True)
class Part:
    """One file of the package: where it lies, how nvcc builds it, and what it is.

    ``kind``: ``ext`` (a Python extension module), ``lib`` (a shared library),
    ``exe`` (a program), ``cubin``. ``needs``: the parts it names in DT_NEEDED.
    ``role``: what the recipe makes it: ``specific`` (rule a), ``sibling`` (rule b,
    with ``group``), ``data`` (rule c), ``plain`` (judged by who names it)."""

    key: str
    path: str
    kind: str
    gencode: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    role: str = "plain"
    group: str = ""
    named: bool = True  # built with a DT_SONAME (its file name)

    @property
    def soname(self) -> str:
        return Path(self.path).name


def _g(*codes: str) -> tuple[str, ...]:
    """-gencode flags: ``sm_80`` builds SASS, ``compute_80`` PTX."""
    flags = []
    for code in codes:
        number = code.split("_")[1]
        flags.append(f"arch=compute_{number},code={code}")
    return tuple(flags)


SITE = "usr/lib/python3/dist-packages/pkg"
PARTS: tuple[Part, ...] = (
    # an extension with sm_80 and PTX, which needs two libraries of its own
    Part(
        key="ext",
        path=f"{SITE}/_C.cpython-311-x86_64-linux-gnu.so",
        kind="ext",
        gencode=_g("sm_80", "compute_80"),
        needs=("core", "needed"),
    ),
    Part(
        key="core",
        path=f"{SITE}/lib/libcore.so",
        kind="lib",
        gencode=_g("sm_75", "sm_80", "sm_90", "sm_100", "sm_120"),
    ),
    # a library that always loads (the extension names it) and lacks code for most GPUs
    Part(key="needed", path=f"{SITE}/lib/libneeded.so", kind="lib", gencode=_g("sm_86")),
    # vLLM's _vllm_fa3_C: an extension module of sm_90a code alone
    Part(
        key="fa3",
        path=f"{SITE}/_fa3_C.abi3.so",
        kind="ext",
        gencode=_g("sm_90a"),
        role="specific",
    ),
    # bitsandbytes' one library per CUDA release
    Part(
        key="ops12",
        path=f"{SITE}/lib/libops_cuda12x.so",
        kind="lib",
        gencode=_g("sm_80"),
        role="sibling",
        group="ops",
    ),
    Part(
        key="ops13",
        path=f"{SITE}/lib/libops_cuda13x.so",
        kind="lib",
        gencode=_g("sm_90", "sm_100"),
        role="sibling",
        group="ops",
    ),
    # flashinfer's standalone cubins, loaded by name per GPU
    Part(
        key="cubin90",
        path=f"{SITE}/cubins/k_sm90.cubin",
        kind="cubin",
        gencode=_g("sm_90"),
        role="data",
    ),
    Part(
        key="cubin120",
        path=f"{SITE}/cubins/k_sm120.cubin",
        kind="cubin",
        gencode=_g("sm_120"),
        role="data",
    ),
    # torch's libtorch_cuda_linalg.so: nothing names it, dlopen loads it; no sm_80+, no PTX
    Part(key="lazy", path=f"{SITE}/lib/liblazy.so", kind="lib", gencode=_g("sm_75")),
    # a program that names the lazy library in DT_NEEDED: with it, the library always loads
    Part(key="tool", path="usr/bin/tool", kind="exe", needs=("lazy",)),
    # Beyond the arrangements (tests/test_optional.py names their cases):
    # a plugin nothing names, which needs a library of its own without code for 8.0
    Part(
        key="plugin",
        path=f"{SITE}/lib/libplugin.so",
        kind="lib",
        gencode=_g("sm_80"),
        needs=("plugdep",),
    ),
    Part(key="plugdep", path=f"{SITE}/lib/libplugdep.so", kind="lib", gencode=_g("sm_90")),
    # a library without DT_SONAME, which a program names by a symlink's name
    Part(
        key="nosoname",
        path=f"{SITE}/lib/libnosoname.so",
        kind="lib",
        gencode=_g("sm_75"),
        named=False,
    ),
    Part(key="user", path="usr/bin/user", kind="exe", needs=("nosoname",)),
    # a program that names one of the two siblings
    Part(key="tool2", path="usr/bin/tool2", kind="exe", needs=("ops12",)),
)
BY_KEY = {p.key: p for p in PARTS}

_INIT = "void *PyInit_{name}(void) {{ return 0; }}\n"
_MAIN = "int main(void) { return 0; }\n"


def _commands(part: Part, out: Path, built: dict[str, Path]) -> list[list[str]]:
    flags = [f"-gencode={g}" for g in part.gencode]
    src = str(SRC / "kernels.cu")
    if part.kind == "cubin":
        return [["nvcc", "-O2", *flags, "-cubin", "-o", str(out), src]]
    # -L and -l:NAME: DT_NEEDED is the library's SONAME, or without one its file name
    libs = [a for k in part.needs for a in (f"-L{built[k].parent}", f"-l:{built[k].name}")]
    if part.kind == "exe":
        main = out.parent / "main.c"
        main.write_text(_MAIN)
        # --no-as-needed: the program names the library though it calls nothing in it
        return [["gcc", "-o", str(out), str(main), "-Wl,--no-as-needed", *libs]]
    extra: list[str] = []
    if part.kind == "ext":
        init = out.parent / f"{part.key}_init.c"
        init.write_text(_INIT.format(name=Path(part.path).name.partition(".")[0]))
        extra.append(str(init))
    named = part.kind != "ext" and part.named
    soname = ["-Xlinker", f"-soname={part.soname}"] if named else []
    return [
        ["nvcc", "-O2", "-shared", "-Xcompiler", "-fPIC", *flags, *soname,
         "-Xlinker", "--no-as-needed", "-o", str(out), src, *extra,
         *(f"-Xlinker={lib}" for lib in libs)],
    ]  # fmt: skip


def build_parts(cache: Path) -> dict[str, Path]:
    """Every part built (or taken from ``cache``), by key."""
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True)
    recipe = json.dumps([p.__dict__ for p in PARTS], sort_keys=True)
    digest = hashlib.sha256(
        (recipe + nvcc.stdout + (SRC / "kernels.cu").read_text() + _INIT + _MAIN).encode()
    ).hexdigest()[:16]
    folder = cache / f"optional-{digest}"
    done = {p.key: folder / p.key / Path(p.path).name for p in PARTS}
    if all(path.is_file() for path in done.values()):
        return done
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache))
    try:
        built: dict[str, Path] = {}
        # a part's needs first
        order = sorted(PARTS, key=lambda p: (bool(p.needs), p.key))
        for part in order:
            out = staging / part.key / Path(part.path).name
            out.parent.mkdir(parents=True)
            for command in _commands(part, out, built):
                subprocess.run(command, check=True, capture_output=True, cwd=out.parent)
            built[part.key] = out
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return done


def lay_out(root: Path, parts: dict[str, Path], keys: set[str]) -> Path:
    """A root folder holding the parts ``keys`` at their paths (hard links: cheap)."""
    for key in sorted(keys):
        target = root / BY_KEY[key].path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            target.hardlink_to(parts[key])
        except OSError:
            shutil.copy(parts[key], target)
    return root
