"""An arch-specific file loads where its own code runs, with what it names
(buildmatrix.optional_choice.choose, rule (a)).

An extension of sm_90a code alone is optional by rule (a): whatever imports it checks
the GPU first. On a 9.0 GPU that check passes and the extension loads, and with it
every library it names in DT_NEEDED (glibc's loader, through ctypes, is the oracle);
such a library without code for 9.0 fails the image there, where before it and the
extension were both skipped. Files built by nvcc; cuobjdump lists their code.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import NVCC_CACHE, CliRunner
from tests.cuobjdump import cuobjdump_lists, find_cuobjdump
from tests.fixtures.build import SRC, have_nvcc

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_nvcc(), reason="nvcc is needed to build the fixtures"),
]

SITE = "usr/lib/python3/dist-packages/pkg"
# (file, gencode, DT_NEEDED of the other parts, PyInit_ name)
PARTS = {
    "dep": ("libdep.so", "arch=compute_80,code=sm_80", (), ""),
    "hopper": ("_hopper_C.abi3.so", "arch=compute_90a,code=sm_90a", ("dep",), "_hopper_C"),
    "core": ("_C.abi3.so", "arch=compute_80,code=sm_80 arch=compute_90,code=sm_90", (), "_C"),
}


@pytest.fixture(scope="module")
def built() -> dict[str, Path]:
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True)
    recipe = repr(PARTS) + nvcc.stdout + (SRC / "kernels.cu").read_text()
    folder = NVCC_CACHE / f"specific-deps-{hashlib.sha256(recipe.encode()).hexdigest()[:16]}"
    out = {k: folder / name for k, (name, *_rest) in PARTS.items()}
    if all(p.is_file() for p in out.values()):
        return out
    folder.mkdir(parents=True, exist_ok=True)
    for key in ("dep", "hopper", "core"):
        name, codes, needs, init = PARTS[key]
        extra = []
        if init:
            (folder / f"{key}.c").write_text(f"void *PyInit_{init}(void) {{ return 0; }}\n")
            extra.append(str(folder / f"{key}.c"))
        else:
            extra += ["-Xlinker", f"-soname={name}"]
        libs = [f"-Xlinker=-L{folder}", *(f"-Xlinker=-l:{PARTS[n][0]}" for n in needs)]
        gencode = [f"-gencode={c}" for c in codes.split()]
        command = ["nvcc", "-O2", "-shared", "-Xcompiler", "-fPIC", *gencode,
                   "-Xlinker", "--no-as-needed", "-o", str(out[key]),
                   str(SRC / "kernels.cu"), *extra, *libs]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True)
    return out


def test_the_loader_maps_the_library_with_the_extension(built: dict[str, Path]) -> None:
    probe = (
        "import ctypes, sys; ctypes.CDLL(sys.argv[1]); "
        "print(any(l.rstrip().endswith('/libdep.so') for l in open('/proc/self/maps')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(built["hopper"])],
        capture_output=True,
        text=True,
        check=True,
        env={"LD_LIBRARY_PATH": str(built["dep"].parent)},
    )
    assert out.stdout.strip() == "True"


def test_what_an_arch_specific_file_loads_counts_where_it_runs(
    cli: CliRunner, tmp_path: Path, built: dict[str, Path]
) -> None:
    """On 9.0 the sm_90a extension runs, so libdep.so (sm_80 alone) loads and fails
    it; on 8.0 the extension is skipped and libdep.so, which runs there, with it."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump (pip nvidia-cuda-cuobjdump) is needed as the reference")
    want = {"dep": {"sm_80"}, "hopper": {"sm_90a"}, "core": {"sm_80", "sm_90"}}
    for key, sass in want.items():
        got, ptx = cuobjdump_lists(tool, built[key])
        assert (set(got), set(ptx)) == (sass, set()), key
    root = tmp_path / "root"
    for key, path in built.items():
        place = root / SITE / ("lib" if key == "dep" else "") / path.name
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_bytes(path.read_bytes())
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3").write_bytes(Path(sys.executable).resolve().read_bytes())
    doc = cli(
        "check", f"dir:{root}", "--sm", "8.0", "--sm", "9.0", "--driver", "580.65.06", "--json"
    ).json()
    assert isinstance(doc, dict)
    on = {t["compute_capability"]: t for t in doc["targets"]}
    assert on["8.0"]["verdict"] == "native"
    assert {Path(s["path"]).name for s in on["8.0"]["skipped"]} == {"_hopper_C.abi3.so"}
    assert on["9.0"]["verdict"] == "none"
    assert on["9.0"]["skipped"] == []
    assert any("libdep.so" in r and "so it loads" in r for r in on["9.0"]["reasons"])


_MAIN = """__global__ void k(int *p) { *p = 1; }
int main() { int *d; cudaMalloc(&d, 4); k<<<1, 1>>>(d); return (int)cudaDeviceSynchronize(); }
"""


def test_a_program_of_arch_specific_code_counts(
    cli: CliRunner, tmp_path: Path, built: dict[str, Path]
) -> None:
    """A program built for sm_90a alone is run as it is, on whatever GPU: nothing checks
    the GPU before it starts, so rule (a) does not make it optional, and on 8.0 the
    image fails though its extension runs there (readelf: an executable; cuobjdump:
    sm_90a alone)."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump (pip nvidia-cuda-cuobjdump) is needed as the reference")
    src = tmp_path / "app.cu"
    src.write_text(_MAIN)
    program = tmp_path / "app90a"
    command = ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-o", str(program), str(src)]
    subprocess.run(command, check=True, capture_output=True)
    header = subprocess.run(
        ["readelf", "-lhW", str(program)], capture_output=True, text=True, check=True
    ).stdout
    assert "Executable file" in header and "INTERP" in header
    sass, ptx = cuobjdump_lists(tool, program)
    assert (set(sass), set(ptx)) == ({"sm_90a"}, set())
    root = tmp_path / "root"
    (root / SITE).mkdir(parents=True)
    (root / SITE / built["core"].name).write_bytes(built["core"].read_bytes())
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/app90a").write_bytes(program.read_bytes())
    doc = cli(
        "check", f"dir:{root}", "--sm", "8.0", "--sm", "9.0", "--driver", "580.65.06", "--json"
    ).json()
    assert isinstance(doc, dict)
    on = {t["compute_capability"]: t for t in doc["targets"]}
    assert (on["8.0"]["verdict"], on["9.0"]["verdict"]) == ("none", "native")
    assert on["8.0"]["skipped"] == []
    assert doc["loading"]["optional"] == []
