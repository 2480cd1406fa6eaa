"""Every cubin of NVIDIA's cu12 and cu13 library wheels, read as cuobjdump reads it.

The header-trust rules (tests/test_header_trust.py) refuse a file whose fatbinary
entry header and code disagree; they must refuse no real NVIDIA library. For each
library file of cuBLAS, cuFFT, NCCL and cuDNN (CUDA 12 and 13 wheels from the package
index): the (kind, arch) of every entry equals what cuobjdump ``--list-elf
--list-ptx`` lists, for the code the CUDA runtime registers (the file itself) and for
the code kept as data (cuobjdump does not search a file's data: the containers
buildmatrix found there are handed to it as one fatbinary, and each cubin found there
as a file); and every compressed cubin is decompressed and held to its entry header
(``check_cubin_arch``), as the uncompressed ones and every PTX text already are
while the file is listed. cuBLAS 12.8's hand-written sm_50 objects (e_flags
0x3c0d32) were once refused here as sm_50a.

The 17 lighter files take about 100 s on a shared 2-core machine (load average 13).
The four largest (cuBLASLt 12 and 13, cuDNN's engines_precompiled 12 and 13:
4,000 to 6,300 cubins, 1.9 to 2.6 GiB decompressed each) take 25 to 55 s each there,
and cuobjdump up to 2 GB of memory, so they run apart (``serial``).
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from pathlib import Path

import pytest

from buildmatrix.binary.cubin import cubin_facts
from buildmatrix.binary.fatbin import FATBIN_MAGIC_BYTES, EntryKind, FatbinEntry
from buildmatrix.binary.fatbin import decompressed_cubin as decompressed
from buildmatrix.binary.scan import inspect_file
from buildmatrix.binary.source import FileSource
from tests.cuobjdump import cuobjdump_lists, find_cuobjdump
from tests.wheels import member

pytestmark = [pytest.mark.integration, pytest.mark.index]

_CUDNN12 = ("adv", "cnn", "engines_runtime_compiled", "ops")
_CUDNN13 = (*_CUDNN12, "engines_tensor_ir", "ext")
LIBRARIES = [
    ("nvidia-cublas-cu12", "12.8.4.1", "libcublas.so.12"),
    ("nvidia-cufft-cu12", "11.4.1.4", "libcufft.so.11"),
    ("nvidia-cufft-cu12", "11.4.1.4", "libcufftw.so.11"),
    ("nvidia-nccl-cu12", "2.32.3", "libnccl.so.2"),
    # the cuDNN torch 2.8 and 2.9 pin for CUDA 12.6 and 12.8
    *(("nvidia-cudnn-cu12", "9.10.2.21", f"libcudnn_{n}.so.9") for n in _CUDNN12),
    ("nvidia-cublas", "13.1.1.3", "libcublas.so.13"),
    ("nvidia-cufft", "12.0.0.61", "libcufft.so.12"),
    ("nvidia-cufft", "12.0.0.61", "libcufftw.so.12"),
    *(("nvidia-cudnn-cu13", "9.24.0.43", f"libcudnn_{n}.so.9") for n in _CUDNN13),
]
HEAVY = [
    ("nvidia-cublas-cu12", "12.8.4.1", "libcublasLt.so.12"),
    ("nvidia-cublas", "13.1.1.3", "libcublasLt.so.13"),
    ("nvidia-cudnn-cu12", "9.10.2.21", "libcudnn_engines_precompiled.so.9"),
    ("nvidia-cudnn-cu13", "9.24.0.43", "libcudnn_engines_precompiled.so.9"),
]
_CONTAINER = struct.Struct("<IHHQ")


@pytest.fixture(scope="module")
def tool() -> Path:
    found = find_cuobjdump()
    if found is None:
        pytest.skip("cuobjdump (pip package nvidia-cuda-cuobjdump) is the oracle here")
    return found


def _listed(entries: list[FatbinEntry]) -> tuple[Counter[str], Counter[str]]:
    """(SASS, PTX) as cuobjdump names them: a family-specific cubin by its plain SM
    (its ELF is the same), LTO IR not at all."""
    sass = Counter(e.arch_name.removesuffix("f") for e in entries if e.kind is EntryKind.SASS)
    ptx = Counter(e.arch_name for e in entries if e.kind is EntryKind.PTX)
    return sass, ptx


def _kept_as_data(
    tool: Path, lib: Path, kept: list[FatbinEntry], work: Path
) -> tuple[Counter[str], Counter[str]]:
    """cuobjdump's list of the code buildmatrix found in ``lib``'s data: its
    containers concatenated into one fatbinary file, each cubin a file of its own."""
    fd = os.open(lib, os.O_RDONLY)
    by_container: dict[int, list[FatbinEntry]] = {}
    for e in kept:
        by_container.setdefault(e.container, []).append(e)
    blob = bytearray()
    sass: Counter[str] = Counter()
    ptx: Counter[str] = Counter()
    for entries in by_container.values():
        first = min(e.offset for e in entries)
        if os.pread(fd, 4, first) == b"\x7fELF":  # a cubin on its own
            (cubin,) = entries
            path = work / f"kept{first:x}.cubin"
            path.write_bytes(os.pread(fd, cubin.size, first))
            more_sass, _ = cuobjdump_lists(tool, path)
            sass += more_sass
            continue
        start = first - _CONTAINER.size
        magic, _, hsize, size = _CONTAINER.unpack(os.pread(fd, _CONTAINER.size, start))
        assert magic.to_bytes(4, "little") == FATBIN_MAGIC_BYTES and hsize == _CONTAINER.size
        blob += os.pread(fd, hsize + size, start)
    os.close(fd)
    if blob:
        path = work / "kept.fatbin"
        path.write_bytes(blob)
        more_sass, more_ptx = cuobjdump_lists(tool, path)
        sass += more_sass
        ptx += more_ptx
    return sass, ptx


def _read_as_cuobjdump_reads_it(tool: Path, lib: Path, work: Path) -> None:
    report = inspect_file(lib)  # CorruptBinary where a header-trust rule refuses the file
    assert report is not None, lib
    registered = [e for e in report.entries if not e.embedded]
    assert _listed(registered) == cuobjdump_lists(tool, lib), lib.name
    kept = [e for e in report.entries if e.embedded]
    if kept:
        assert _listed(kept) == _kept_as_data(tool, lib, kept, work), lib.name
    src = FileSource(os.open(lib, os.O_RDONLY), name=lib.name)
    packed = [e for e in report.entries if e.kind is EntryKind.SASS and e.compressed]
    for e in packed:  # each held to its entry header: refused if they disagree
        cubin_facts(decompressed(src, e, name=lib.name), header=e.arch)


@pytest.mark.parametrize(
    ("wheel", "version", "lib"), LIBRARIES, ids=[f"{w}-{v}-{lib}" for w, v, lib in LIBRARIES]
)
def test_every_cubin_is_read_as_cuobjdump_reads_it(
    tool: Path, tmp_path: Path, wheel: str, version: str, lib: str
) -> None:
    _read_as_cuobjdump_reads_it(tool, member(wheel, version, f"*/{lib}"), tmp_path)


@pytest.mark.serial  # the largest: up to 55 s each, cuobjdump up to 2 GB of memory
@pytest.mark.parametrize(
    ("wheel", "version", "lib"), HEAVY, ids=[f"{w}-{v}-{lib}" for w, v, lib in HEAVY]
)
def test_every_cubin_of_the_largest_libraries_is_read_as_cuobjdump_reads_it(
    tool: Path, tmp_path: Path, wheel: str, version: str, lib: str
) -> None:
    _read_as_cuobjdump_reads_it(tool, member(wheel, version, f"*/{lib}"), tmp_path)
