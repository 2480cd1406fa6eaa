"""A static-pie program is a program (buildmatrix.binary.dynamic, buildmatrix.optional).

``gcc -static-pie`` writes an ``ET_DYN`` file without ``PT_INTERP`` (it relocates
itself), like a shared library but for ``DF_1_PIE`` in ``DT_FLAGS_1``. A CUDA program
linked so (nvcc links cudart statically by default) holds device code and is run,
never named in DT_NEEDED: taken for a library loaded by dlopen, it was skipped on a GPU
it has no code for, and an image whose other program runs there passed. file(1) and
readelf are the oracle for what the file is; cuobjdump for its code.
"""

from __future__ import annotations

import hashlib
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

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_nvcc(), reason="nvcc is needed to build the fixtures"),
]

_SRC = """#include <cstdio>
__global__ void k(int *p) { *p = 1; }
int main() { int *d; cudaMalloc(&d, 4); k<<<1, 1>>>(d); return (int)cudaDeviceSynchronize(); }
"""
CUDA_LIB = Path("/usr/local/cuda/lib64")


@pytest.fixture(scope="module")
def programs() -> dict[str, Path]:
    """``static``: a static-pie program with sm_80 SASS alone; ``dynamic``: an
    ordinary (PT_INTERP) program with sm_90 SASS alone."""
    if not (CUDA_LIB / "libcudart_static.a").is_file() or shutil.which("g++") is None:
        pytest.skip("libcudart_static.a and g++ are needed to link a static-pie program")
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True)
    digest = hashlib.sha256((_SRC + nvcc.stdout).encode()).hexdigest()[:16]
    folder = NVCC_CACHE / f"static-pie-{digest}"
    out = {"static": folder / "app_static", "dynamic": folder / "app_dynamic"}
    if all(p.is_file() for p in out.values()):
        return out
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "k.cu"
    src.write_text(_SRC)
    run = [
        ["nvcc", "-gencode=arch=compute_80,code=sm_80", "-Xcompiler", "-fPIE", "-c",
         "-o", str(folder / "k80.o"), str(src)],
        ["g++", "-static-pie", "-o", str(out["static"]), str(folder / "k80.o"),
         f"-L{CUDA_LIB}", "-lcudart_static", "-lpthread", "-ldl", "-lrt"],
        ["nvcc", "-gencode=arch=compute_90,code=sm_90", "-o", str(out["dynamic"]), str(src)],
    ]  # fmt: skip
    for command in run:
        subprocess.run(command, check=True, capture_output=True)
    return out


def test_file_and_readelf_call_it_a_static_pie_program(programs: dict[str, Path]) -> None:
    path = programs["static"]
    kind = subprocess.run(["file", "-b", str(path)], capture_output=True, text=True, check=True)
    assert "static-pie linked" in kind.stdout
    header = subprocess.run(
        ["readelf", "-dlhW", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert "DYN (Position-Independent Executable file)" in header
    assert "INTERP" not in header
    assert re.search(r"\(FLAGS_1\)\s+Flags:.*\bPIE\b", header)
    links = read_dso(BytesSource(path.read_bytes(), name=path.name), name=path.name).links
    assert links.program and not links.python_module


def test_a_static_pie_program_without_code_for_the_gpu_fails(
    cli: CliRunner, tmp_path: Path, programs: dict[str, Path]
) -> None:
    """Two programs: the static-pie one has sm_80 SASS alone (cuobjdump), so on 9.0 the
    image fails, as it does with --strict; the other program runs there."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump (pip nvidia-cuda-cuobjdump) is needed as the reference")
    for name, sm in (("static", "sm_80"), ("dynamic", "sm_90")):
        sass, ptx = cuobjdump_lists(tool, programs[name])
        assert (set(sass), set(ptx)) == ({sm}, set())
    bin_dir = tmp_path / "root" / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    for name, path in programs.items():
        shutil.copy(path, bin_dir / f"app_{name}")
    result = cli(
        "check", f"dir:{tmp_path / 'root'}", "--sm", "9.0", "--driver", "580.65.06", "--json"
    )
    assert result.code == 1
    doc = result.json()
    assert isinstance(doc, dict)
    (target,) = doc["targets"]
    assert (target["verdict"], target["strict_verdict"]) == ("none", "none")
    assert target["skipped"] == []
