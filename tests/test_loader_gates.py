"""Rule (e) of buildmatrix.optional: a module a package's own loader uses only on some
GPUs (buildmatrix/data/loaders.yaml, read by buildmatrix.loaders).

Two properties:
- the table is its packages' source: each entry's range equals, on every compute
  capability from 3.0 to 13.9, what the cited function of the real wheel answers
  (run from the wheel's own text, with torch's capability query as the only
  stand-in: no GPU here);
- check on nvcc-built modules laid out at each entry's path, beside a real
  ``.dist-info`` folder: outside the range a module without code for the GPU is
  skipped with the entry's citation; inside it counts as a file that always loads
  (a module there without code for the GPU fails the image, never a false pass);
  with another version of the package the entry does not apply.
"""

from __future__ import annotations

import ast
import hashlib
import shutil
import subprocess
import tempfile
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

from buildmatrix.arch import ComputeCapability
from buildmatrix.loaders import Gate, load_gates
from tests.conftest import NVCC_CACHE, CliRunner
from tests.corpus_expected import runs_on
from tests.fixtures.build import SRC, have_nvcc
from tests.wheels import extracted

# nvcc 13.0 builds no code for 7.0 (CUDA 13.0 dropped sm_50 ... sm_72)
PROFILES = ("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "12.0", "12.1")
DRIVER = "580.65.06"  # CUDA 13.0's: every PTX nvcc 13.0 writes JIT-compiles on it
SITE = "usr/local/lib/python3.11/site-packages"
RANK = {"none": 0, "jit": 1, "native": 2}
# the module's code, per case: SASS for 9.0a alone (a file without code for most of
# any range), SASS for 8.0 alone, and PTX for 7.5 (runs on every profile)
CODES: dict[str, tuple[str, ...]] = {
    "sm90a": ("sm_90a",),
    "sm80": ("sm_80",),
    "ptx75": ("compute_75",),
}
# the package's other extension module, which always loads: PTX for 7.5, JIT everywhere
MAIN = ("compute_75",)
# where the wheels the table cites are (package as its .dist-info spells it -> wheel)
WHEELS = {"vllm": "vllm", "xformers": "xformers", "sgl_kernel": "sgl-kernel"}


def _grid() -> list[tuple[int, int]]:
    return [(major, minor) for major in range(3, 14) for minor in range(10)]


def _function(path: Path, name: str) -> str:
    """The source of the function (or Class.method) ``name`` of ``path``."""
    tree = ast.parse(path.read_text())
    owner, _, leaf = name.rpartition(".")
    for node in ast.walk(tree):
        if owner and isinstance(node, ast.ClassDef) and node.name == owner:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == leaf:
                    return ast.unparse(item)
        if not owner and isinstance(node, ast.FunctionDef) and node.name == leaf:
            return ast.unparse(node)
    raise AssertionError(f"{path}: no function {name}")


def _torch(cc: tuple[int, int]) -> SimpleNamespace:
    """torch as the functions use it: the GPU's capability (the stand-in for a GPU)."""
    return SimpleNamespace(
        cuda=SimpleNamespace(get_device_capability=lambda device=None: cc),
        version=SimpleNamespace(cuda="12.8", hip=None),
    )


def _vllm_oracle(tree: Path, gate: Gate, cc: tuple[int, int]) -> bool:
    """The cited function of vllm/vllm_flash_attn/flash_attn_interface.py, run from
    the wheel's text with both modules importable: whether vLLM may use it on ``cc``."""
    code = _function(tree / gate.source, gate.function)
    scope: dict[str, typing.Any] = {
        "torch": _torch(cc),
        "Tuple": typing.Tuple,  # noqa: UP006 - the names the file's annotations use
        "Optional": typing.Optional,
        "FA2_AVAILABLE": True,
        "FA3_AVAILABLE": True,
        "FA2_UNAVAILABLE_REASON": None,
        "FA3_UNAVAILABLE_REASON": None,
    }
    exec(code, scope)
    ok, _ = scope[gate.function](None)
    return bool(ok)


def _xformers_oracle(tree: Path, gate: Gate, cc: tuple[int, int]) -> bool:
    """xformers' AttentionOpBase.not_supported_reasons refuses ``device_capability <
    cls.CUDA_MINIMUM_COMPUTE_CAPABILITY``; flash3.py's FwOp sets the minimum, BwOp
    takes FwOp's."""
    check = _function(tree / gate.source, gate.function)
    assert "device_capability < cls.CUDA_MINIMUM_COMPUTE_CAPABILITY" in check
    flash3 = ast.parse((tree / "xformers/ops/fmha/flash3.py").read_text())
    minimum: dict[str, str] = {}
    for node in ast.walk(flash3):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and isinstance(item.targets[0], ast.Name)
                    and item.targets[0].id == "CUDA_MINIMUM_COMPUTE_CAPABILITY"
                ):
                    minimum[node.name] = ast.unparse(item.value)
    assert minimum["BwOp"] == "FwOp.CUDA_MINIMUM_COMPUTE_CAPABILITY", minimum
    low = ast.literal_eval(minimum["FwOp"])
    assert isinstance(low, tuple), low
    return cc >= low


ORACLES = {"vllm": _vllm_oracle, "xformers": _xformers_oracle}


@pytest.mark.integration
@pytest.mark.index
@pytest.mark.parametrize("gate", load_gates(), ids=lambda g: g.module)
def test_each_range_is_what_the_packages_source_says(gate: Gate) -> None:
    assert gate.package in ORACLES, f"{gate.package}: no oracle reads its source"
    for version in gate.versions:
        tree = extracted(WHEELS[gate.package], version)
        assert (tree / gate.module).is_file(), f"{gate.module} is not in the wheel"
        differ = [
            f"{major}.{minor}"
            for major, minor in _grid()
            if gate.admits(ComputeCapability(major, minor))
            != ORACLES[gate.package](tree, gate, (major, minor))
        ]
        assert not differ, f"{gate.module} {version}: the table differs from the source on {differ}"


def _build(name: str, codes: tuple[str, ...]) -> Path:
    """An extension module ``name`` (exporting ``PyInit_<module>``) of ``codes``,
    built by nvcc once and cached."""
    module = name.partition(".")[0]
    init = f"void *PyInit_{module}(void) {{ return 0; }}\n"
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True)
    key = hashlib.sha256(
        (name + repr(codes) + init + nvcc.stdout + (SRC / "kernels.cu").read_text()).encode()
    ).hexdigest()[:16]
    out = NVCC_CACHE / f"gate-{key}" / name
    if out.is_file():
        return out
    NVCC_CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=NVCC_CACHE))
    try:
        (staging / "init.c").write_text(init)
        flags = [f"-gencode=arch=compute_{c.split('_')[1]},code={c}" for c in codes]
        subprocess.run(
            ["nvcc", "-O2", "-shared", "-Xcompiler", "-fPIC", *flags, "-o",
             str(staging / name), str(SRC / "kernels.cu"), str(staging / "init.c")],
            check=True, capture_output=True, cwd=staging,
        )  # fmt: skip
        if not out.parent.exists():
            staging.rename(out.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _lay_out(root: Path, gate: Gate, module: Path, main: Path, version: str) -> Path:
    """The package as pip leaves it: the gated module at its path, the package's
    other extension module beside it, and its .dist-info folder."""
    site = root / SITE
    top = gate.module.partition("/")[0]
    for rel, built in ((gate.module, module), (f"{top}/_main.abi3.so", main)):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).hardlink_to(built)
    info = site / f"{gate.package}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {gate.package}\nVersion: {version}\n"
    )
    return root


def _runs(codes: tuple[str, ...], cc: str) -> str:
    """NVIDIA's rule as tests/corpus_expected.py restates it."""
    if any(c.startswith("sm_") and runs_on(c, cc) for c in codes):
        return "native"
    return "jit" if any(runs_on(c, cc) for c in codes) else "none"


@pytest.mark.integration
@pytest.mark.skipif(not have_nvcc(), reason="nvcc is needed to build the fixtures")
@pytest.mark.parametrize("gate", load_gates(), ids=lambda g: g.module)
def test_a_gated_module_counts_inside_its_range_alone(
    cli: CliRunner, tmp_path: Path, gate: Gate
) -> None:
    """Every code case, with the version the entry was read for and with another,
    on every profile nvcc 13.0 builds for: verdict and the files skipped."""
    main = _build("_main.abi3.so", MAIN)
    name = gate.module.rpartition("/")[2]
    seen = 0
    for case, codes in CODES.items():
        module = _build(name, codes)
        for version in (gate.versions[0], "0.0.0.other"):
            root = _lay_out(tmp_path / f"{case}-{version}", gate, module, main, version)
            args = ["check", f"dir:{root}", "--driver", DRIVER, "--json"]
            result = cli(*args, *(a for cc in PROFILES for a in ("--sm", cc)))
            assert result.code in (0, 1), result.err
            doc = result.json()
            assert isinstance(doc, dict)
            read = version in gate.versions
            for t in doc["targets"]:
                cc = t["compute_capability"]
                mine, base = _runs(codes, cc), _runs(MAIN, cc)
                inside = gate.admits(ComputeCapability(*map(int, cc.split("."))))
                # rule (e) outside the range; rule (a) where the entry does not apply
                if (read and not inside) or (not read and case == "sm90a"):
                    want = base, ({f"{SITE}/{gate.module}"} if mine == "none" else set())
                else:  # a Python extension module: it always loads
                    want = min(mine, base, key=RANK.__getitem__), set()
                got = t["verdict"], {s["path"] for s in t["skipped"]}
                assert got == want, (case, version, cc, t["reasons"])
                for s in t["skipped"]:
                    rule = "loader" if read else "specific"
                    assert s["rule"] == rule, s
                    if read:
                        assert f"data/loaders.yaml: {gate.package}" in s["reason"], s
                        assert gate.function in s["reason"], s
                if read and inside and mine == "none":  # never a false pass
                    assert t["verdict"] == "none"
                    assert any(gate.module in r for r in t["reasons"]), t["reasons"]
            notes = doc["loading"]["notes"]
            assert any("data/loaders.yaml" in n for n in notes) == (not read), notes
            shutil.rmtree(root)
            seen += 1
    assert seen == 2 * len(CODES)


@pytest.mark.integration
@pytest.mark.skipif(not have_nvcc(), reason="nvcc is needed to build the fixtures")
def test_an_image_whose_code_is_all_for_other_gpus_says_why_it_fails(
    cli: CliRunner, tmp_path: Path
) -> None:
    """flashinfer's arrangement: every file with device code is optional (here an
    sm_90a-only module, rule (a)) and none runs on 8.0; what the package would compile
    at run time is in no file. The target fails, and a reason says so."""
    module = _build("_hopper_only.abi3.so", ("sm_90a",))
    root = tmp_path / "image"
    (root / SITE / "pkg").mkdir(parents=True)
    (root / SITE / "pkg" / module.name).hardlink_to(module)
    result = cli("check", f"dir:{root}", "--driver", DRIVER, "--json", "--sm", "8.0", "--sm", "9.0")
    assert result.code == 1, result.err
    doc = result.json()
    assert isinstance(doc, dict)
    on80, on90 = doc["targets"]
    assert (on80["verdict"], on90["verdict"]) == ("none", "native")
    (why,) = [r for r in on80["reasons"] if r.startswith("none of the image's device code")]
    assert why.startswith("none of the image's device code runs on 8.0"), why
    assert "all optional, for other GPUs" in why and "JIT from source" in why, why
    assert any(r.startswith(f"{SITE}/pkg/{module.name}: ") for r in on80["reasons"])
