"""Compressed fatbin entries (buildmatrix.binary.decompress), held to nvcc and cuobjdump.

The fixtures ``libcompressed.so`` (``-Xfatbin -compress-all``: Zstandard, flag
0x8000), ``libcompressed_size.so`` (``--compress-mode=size``: Zstandard) and
``libcompressed_speed.so`` (``--compress-mode=speed``: LZ4 blocks, flag 0x2000) are
kernels.cu built with the gencode flags of ``libsass_ptx.so``, which nvcc stores
uncompressed: every compressed cubin must decompress to the very bytes nvcc wrote
there, and to what ``cuobjdump -xelf`` extracts.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tracemalloc
from pathlib import Path

import lz4.block
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from buildmatrix.binary.decompress import (
    FLAG_LZ4,
    FLAG_ZSTD,
    MAX_UNCOMPRESSED,
    decompress_head,
    decompress_payload,
)
from buildmatrix.binary.elf import read_elf
from buildmatrix.binary.fatbin import EntryKind, decompressed_cubin, parse_fatbin
from buildmatrix.binary.source import BytesSource, CorruptBinary, FileSource
from tests.cuobjdump import find_cuobjdump

BIN = Path(__file__).parent / "fixtures" / "bin"
COMPRESSED = {
    "libcompressed.so": FLAG_ZSTD,
    "libcompressed_size.so": FLAG_ZSTD,
    "libcompressed_speed.so": FLAG_LZ4,
}


def _sass(path: Path) -> tuple[FileSource, list]:  # type: ignore[type-arg]
    fd = os.open(path, os.O_RDONLY)
    src = FileSource(fd, name=path.name)
    section = read_elf(src).section(".nv_fatbin")
    assert section is not None
    entries = parse_fatbin(src, section.offset, section.size, where="section .nv_fatbin")
    return src, [e for e in entries if e.kind is EntryKind.SASS]


def _cubins(path: Path) -> list[bytes]:
    """The SASS cubins of a fixture, decompressed where compressed, in file order."""
    src, entries = _sass(path)
    out = []
    for e in entries:
        if e.compressed:
            cubin = decompressed_cubin(src, e, name=path.name)
        else:
            cubin = BytesSource(src.read_at(e.offset + 64, e.size), name=path.name)
        out.append(cubin.read_at(0, cubin.size))
    return out


@pytest.mark.parametrize("name", sorted(COMPRESSED))
def test_each_compression_decompresses_to_the_uncompressed_build(name: str) -> None:
    src, entries = _sass(BIN / name)
    assert entries and all(e.compressed for e in entries)
    raw = src.read_at(entries[0].offset + 40, 8)
    assert int.from_bytes(raw, "little") & (FLAG_LZ4 | FLAG_ZSTD) == COMPRESSED[name]
    plain = _cubins(BIN / "libsass_ptx.so")
    # nvcc pads an uncompressed payload to 8 bytes; the header's size is the cubin's
    assert [c.rstrip(b"\0") for c in _cubins(BIN / name)] == [c.rstrip(b"\0") for c in plain]


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(COMPRESSED))
def test_decompressed_cubins_are_what_cuobjdump_extracts(name: str, tmp_path: Path) -> None:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    subprocess.run(
        [str(tool), "-xelf", "all", str(BIN / name)], cwd=tmp_path, check=True, capture_output=True
    )
    extracted = sorted(tmp_path.glob("*.cubin"), key=lambda p: int(p.name.split(".")[-3]))
    assert [p.read_bytes() for p in extracted] == _cubins(BIN / name)


def test_kernels_and_toolkit_of_a_compressed_short_unit_are_read() -> None:
    """The short translation unit of libtwo_compressed.so names its kernel, as the
    uncompressed libtwo.so does."""
    from buildmatrix.binary.scan import inspect_file

    for name in ("libtwo.so", "libtwo_compressed.so"):
        report = inspect_file(BIN / name)
        assert report is not None
        units = {u.index: u for u in report.units()}
        assert units[2].kernels == ("_Z2kbPfPKfi",), name
        assert str(report.toolkit) == "13.0"


@pytest.mark.parametrize("flags", [FLAG_LZ4, FLAG_ZSTD])
def test_a_size_past_the_bound_is_refused_before_anything_is_allocated(flags: int) -> None:
    tracemalloc.start()
    with pytest.raises(CorruptBinary, match="at most 64 MiB"):
        decompress_payload(b"\0" * 16, flags=flags, size=MAX_UNCOMPRESSED + 1, name="x")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20


def test_a_zstd_frame_that_holds_more_than_its_header_says_is_refused_within_the_bound() -> None:
    """A frame of 32 MiB of zeros under a header claiming 1 KiB: the reader stops one
    byte past the claim, so memory stays near the claim, not the frame's content."""
    frame = zstandard.ZstdCompressor().compress(b"\0" * (32 << 20))
    tracemalloc.start()
    with pytest.raises(CorruptBinary, match="decompresses to 1025 bytes"):
        decompress_payload(frame, flags=FLAG_ZSTD, size=1024, name="x")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.parametrize(
    ("flags", "payload", "size", "message"),
    [
        (FLAG_LZ4, b"\xff\xff\xff", 100, "not a valid LZ4 block"),
        (FLAG_LZ4, lz4.block.compress(b"a" * 100, store_size=False), 50, "LZ4"),
        (FLAG_LZ4, lz4.block.compress(b"a" * 100, store_size=False), 200, "LZ4|decompresses"),
        (FLAG_ZSTD, b"not zstd", 10, "not a valid Zstandard frame"),
        (FLAG_ZSTD, zstandard.ZstdCompressor().compress(b"a" * 100), 200, "decompresses to 100"),
        (
            FLAG_ZSTD,
            zstandard.ZstdCompressor().compress(b"a" * 100)[:-3],
            100,
            "Zstandard|decompresses",
        ),
        (FLAG_LZ4 | FLAG_ZSTD, b"", 10, "name no known method"),
        (FLAG_ZSTD, b"", 0, "claims 0 bytes"),
    ],
)
def test_corrupt_payloads_are_refused_with_the_entry_named(
    flags: int, payload: bytes, size: int, message: str
) -> None:
    with pytest.raises(CorruptBinary, match=message) as info:
        decompress_payload(payload, flags=flags, size=size, name="libx.so (sm_90 cubin at 0x40)")
    assert str(info.value).startswith("libx.so (sm_90 cubin at 0x40): ")


@pytest.mark.parametrize("flags", [FLAG_LZ4, FLAG_ZSTD])
def test_round_trip_of_random_payloads(flags: int) -> None:
    data = os.urandom(5000) + b"\0" * 5000
    packed = (
        lz4.block.compress(data, store_size=False)
        if flags == FLAG_LZ4
        else zstandard.ZstdCompressor().compress(data)
    )
    assert decompress_payload(packed, flags=flags, size=len(data), name="x") == data


def test_an_lz4_block_is_never_given_more_room_than_it_can_fill() -> None:
    """The LZ4 output buffer is allocated whole, so a size the block cannot reach is
    refused first; the densest real block (zeros, 255:1) still decompresses."""
    zeros = b"\0" * (16 << 20)
    dense = lz4.block.compress(zeros, store_size=False)
    assert decompress_payload(dense, flags=FLAG_LZ4, size=len(zeros), name="x") == zeros
    tracemalloc.start()
    with pytest.raises(CorruptBinary, match="more than such a block can hold"):
        decompress_payload(b"\x1f\0", flags=FLAG_LZ4, size=MAX_UNCOMPRESSED, name="x")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("flags", [FLAG_LZ4, FLAG_ZSTD])
@settings(max_examples=40, deadline=None)
@given(
    text=st.binary(min_size=1, max_size=200_000),
    limit=st.sampled_from([1, 512, 2048, 1 << 16, 1 << 20]),
)
def test_a_head_is_the_start_of_the_whole(flags: int, text: bytes, limit: int) -> None:
    """``decompress_head``: the first ``limit`` bytes of what the payload decompresses
    to, as lz4's and zstandard's own decoders make it (the Zstandard frame read only
    that far), for texts drawn by hypothesis, short and long, repetitive and not."""
    text = text * (1 + 100_000 // len(text)) if len(text) < 64 else text
    packed = (
        lz4.block.compress(text, store_size=False)
        if flags == FLAG_LZ4
        else zstandard.ZstdCompressor().compress(text)
    )
    src = BytesSource(b"pad" + packed + b"tail", name="x")
    head = decompress_head(src, 3, len(packed), flags=flags, size=len(text), limit=limit, name="x")
    assert head == text[:limit]


@pytest.mark.parametrize("flags", [FLAG_LZ4, FLAG_ZSTD, FLAG_LZ4 | FLAG_ZSTD, 0])
@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=300), size=st.integers(-1, MAX_UNCOMPRESSED + 1))
def test_a_head_of_garbage_is_refused_or_read_never_a_crash(
    flags: int, data: bytes, size: int
) -> None:
    with contextlib.suppress(CorruptBinary):
        head = decompress_head(
            BytesSource(data, name="x"), 0, len(data), flags=flags, size=size, limit=4096, name="x"
        )
        assert len(head) <= 4096
