"""Device code that defines no kernel launches nothing, and makes no GPU fail.

A cubin with no entry function (cuobjdump ``-elf``: no ENTRY symbol) and a PTX text
with no ``.entry`` hold nothing a program can launch. A file whose device code is all
such is listed (inspect, check's ``files``) but judged like a file without device
code: an image of nothing else fails as one without device code does, and passes with
``--allow-empty``; beside other files it changes no verdict, so a library with
kernels for other GPUs only still fails. cuobjdump says which images define no
kernel: nvcc's build of a source with only ``__constant__`` data and a ``__device__``
function, the sm_52 cubin of libcufftw.so.11 (nvidia-cufft-cu12 11.4.1.4), and the
six cubins of sgl-kernel's ``spatial_ops``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from buildmatrix.binary.fatbin import EntryKind
from buildmatrix.binary.scan import inspect_file
from tests.conftest import NVCC_CACHE, CliRunner
from tests.cuobjdump import cuobjdump_kernels, cuobjdump_lists, find_cuobjdump
from tests.fixtures.build import BIN, Fixture, cached_build, have_nvcc
from tests.wheels import member

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tool() -> Path:
    found = find_cuobjdump()
    if found is None:
        pytest.skip("cuobjdump (pip package nvidia-cuda-cuobjdump) is the oracle here")
    return found


@pytest.fixture(scope="module")
def no_kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """no_kernel.cu as a shared library: sm_80, sm_90 and compute_90 PTX."""
    if not have_nvcc():
        pytest.skip("nvcc and gcc build this library; .ci/run has them")
    out = tmp_path_factory.mktemp("nokernel")
    fixture = Fixture(
        name="libno_kernel.so",
        kind="shared",
        source="no_kernel.cu",
        gencode=("arch=compute_80,code=sm_80", "arch=compute_90,code=[sm_90,compute_90]"),
    )
    (path,) = cached_build(out, [fixture], NVCC_CACHE, jobs=1)
    return path


def _defines_no_kernel(tool: Path, path: Path) -> None:
    """cuobjdump and inspect agree: the same images, and not one kernel in any."""
    images = cuobjdump_kernels(tool, path)
    assert images and all(kernels == frozenset() for _arch, kernels in images)
    report = inspect_file(path)
    assert report is not None and report.kernel_less
    sass, ptx = cuobjdump_lists(tool, path)
    ours = (
        sorted(e.arch_name for e in report.entries if e.kind is EntryKind.SASS),
        sorted(e.arch_name for e in report.entries if e.kind is EntryKind.PTX),
    )
    assert ours == (sorted(sass.elements()), sorted(ptx.elements()))
    assert all(e.kernels == () for e in report.entries)


def _verdict(cli: CliRunner, root: Path, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    result = cli("check", f"dir:{root}", *args, "--json")
    assert result.out, result.err
    return result.code, result.json()


def _judged_alone(cli: CliRunner, tmp_path: Path, lib: Path, gpus: list[str]) -> None:
    """An image holding only ``lib``: no GPU fails for it, and it passes on its own only
    with --allow-empty, as an image without device code does; inspect lists it."""
    root = tmp_path / "img"
    root.mkdir()
    shutil.copy(lib, root / lib.name)
    sms = [a for sm in gpus for a in ("--sm", sm)]
    code, doc = _verdict(cli, root, *sms, "--allow-empty")
    assert code == 0, doc["problems"]
    assert [f["path"] for f in doc["files"]] == [lib.name]
    code, doc = _verdict(cli, root, *sms)
    assert code == 1
    assert any("defines no kernel" in p and "--allow-empty" in p for p in doc["problems"])


def _never_rescues(cli: CliRunner, tmp_path: Path, lib: Path) -> None:
    """Beside a library with kernels for sm_80 alone, the verdict is that library's:
    it fails on 9.0 and passes on 8.0 (not a false pass, not a false fail)."""
    root = tmp_path / "mixed"
    root.mkdir()
    shutil.copy(lib, root / lib.name)
    shutil.copy(BIN / "libsass_sm80.so", root / "libsass_sm80.so")
    code, doc = _verdict(cli, root, "--sm", "9.0")
    assert code == 1, doc
    assert "libsass_sm80.so" in "\n".join(doc["problems"])
    assert lib.name not in "\n".join(doc["problems"])
    code, doc = _verdict(cli, root, "--sm", "8.0", "--allow-empty")
    assert code == 0, doc["problems"]


@pytest.mark.nvcc
def test_nvccs_kernel_less_library_makes_no_gpu_fail(
    cli: CliRunner, tmp_path: Path, tool: Path, no_kernel: Path
) -> None:
    # 7.5: no image of the file runs there; nothing in it would be launched anyway
    _judged_alone(cli, tmp_path, no_kernel, ["7.5", "8.0", "9.0", "12.0"])
    _defines_no_kernel(tool, no_kernel)
    _never_rescues(cli, tmp_path, no_kernel)


@pytest.mark.index
def test_libcufftw_makes_no_gpu_fail(cli: CliRunner, tmp_path: Path, tool: Path) -> None:
    lib = member("nvidia-cufft-cu12", "11.4.1.4", "*/libcufftw.so.11")
    _judged_alone(cli, tmp_path, lib, ["7.5", "8.0", "9.0", "10.0", "12.0"])
    _defines_no_kernel(tool, lib)
    _never_rescues(cli, tmp_path, lib)


@pytest.mark.index
def test_sgl_kernel_spatial_ops_makes_no_gpu_fail(
    cli: CliRunner, tmp_path: Path, tool: Path
) -> None:
    lib = member("sgl-kernel", "0.3.21", "sgl_kernel/spatial_ops.abi3.so")
    _judged_alone(cli, tmp_path, lib, ["8.0", "8.6", "9.0", "10.0", "12.0"])
    _defines_no_kernel(tool, lib)
