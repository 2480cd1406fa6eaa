"""A compressed PTX entry is judged by the head of its text alone
(buildmatrix.binary.fatbin, ``_compressed_ptx``: 512 bytes decompressed, more only
where the directives are not settled by then), which must read as the whole text
reads: the same ``.target`` held to the entry header, the same ``.version``.

The oracle is the whole text, decompressed entire (``ptx_text``) and read as an
uncompressed entry's is, over every compressed PTX entry of NVIDIA's libraries that
hold them (cuFFT 11: 8,131 LZ4 blocks; cuFFT 12: Zstandard frames). A head reading
that stopped too early, or read a directive the whole text does not have, differs.
"""

from __future__ import annotations

import os
import struct

import pytest
from packaging.version import Version

from buildmatrix.binary.fatbin import EntryKind, ptx_text
from buildmatrix.binary.ptx import PTX_HEAD, ptx_directives
from buildmatrix.binary.scan import inspect_file
from buildmatrix.binary.source import FileSource, read_exact
from tests.wheels import member

pytestmark = [pytest.mark.integration, pytest.mark.index]

# The fatbinary entry header (as in fatbin.py): the PTX ISA it claims is at +24
# (minor, u16) and +26 (major, u16).
_ISA = struct.Struct("<HH")

LIBRARIES = [
    ("nvidia-cufft-cu12", "11.4.1.4", "libcufft.so.11"),
    ("nvidia-cufft", "12.0.0.61", "libcufft.so.12"),
]


@pytest.mark.parametrize(("name", "version", "lib"), LIBRARIES)
def test_every_compressed_ptx_head_reads_as_its_whole_text(
    name: str, version: str, lib: str
) -> None:
    path = member(name, version, f"*/{lib}")
    report = inspect_file(path)
    assert report is not None
    packed = [e for e in report.entries if e.kind is EntryKind.PTX and e.compressed]
    if not packed:
        pytest.skip(f"{lib} {version} holds no compressed PTX")
    fd = os.open(path, os.O_RDONLY)
    try:
        src = FileSource(fd, name=lib)
        for e in packed:
            whole = ptx_text(src, e, name=lib)
            found = ptx_directives(whole[:PTX_HEAD])
            assert found is not None, f"{lib}: PTX at {e.offset:#x} has no directives"
            text_arch, text_isa = found
            minor, major = _ISA.unpack(read_exact(src, e.offset + 24, 4, what="isa"))
            assert text_arch.cc == e.arch.cc, f"{lib}: PTX at {e.offset:#x}"
            assert e.ptx_isa == max(Version(f"{major}.{minor}"), text_isa), (
                f"{lib}: PTX at {e.offset:#x}: head read {e.ptx_isa}, whole text {text_isa}"
            )
    finally:
        os.close(fd)
