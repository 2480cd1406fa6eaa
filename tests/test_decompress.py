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
from collections import Counter
from pathlib import Path

import lz4.block
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from buildmatrix.binary.cubin import cubin_facts
from buildmatrix.binary.decompress import (
    FLAG_LZ4,
    FLAG_ZSTD,
    MAX_IN_MEMORY,
    MAX_RATIO,
    ZstdStream,
    decompress_head,
    decompress_payload,
    decompressed_source,
)
from buildmatrix.binary.elf import read_elf
from buildmatrix.binary.fatbin import EntryKind, decompressed_cubin, parse_fatbin
from buildmatrix.binary.scan import inspect_file
from buildmatrix.binary.source import BytesSource, CorruptBinary, FileSource
from tests.conftest import CliRunner
from tests.cuobjdump import cuobjdump_lists, find_cuobjdump
from tests.wheels import member

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

    for name in ("libtwo.so", "libtwo_compressed.so"):
        report = inspect_file(BIN / name)
        assert report is not None
        units = {u.index: u for u in report.units()}
        assert units[2].kernels == ("_Z2kbPfPKfi",), name
        assert str(report.toolkit) == "13.0"


@pytest.mark.parametrize("flags", [FLAG_LZ4, FLAG_ZSTD])
def test_a_claim_past_the_ratio_is_refused_before_anything_is_allocated(flags: int) -> None:
    tracemalloc.start()
    for size in (MAX_RATIO[flags] * 16 + 65, 1 << 40):
        with pytest.raises(CorruptBinary, match=f"more than .* at {MAX_RATIO[flags]}:1"):
            decompress_payload(b"\0" * 16, flags=flags, size=size, name="x")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20


def test_an_lz4_block_past_the_memory_budget_is_refused_before_it_is_decoded() -> None:
    """Within LZ4's 255:1, but more than one entry may take in memory: an LZ4 block
    cannot be decoded in parts, so it is refused, its output never allocated."""
    size = MAX_IN_MEMORY + 1
    block = b"\0" * (size // MAX_RATIO[FLAG_LZ4] + 1)
    tracemalloc.start()
    with pytest.raises(CorruptBinary, match="LZ4 block can only be decoded whole"):
        decompress_payload(block, flags=FLAG_LZ4, size=size, name="x")
    src = BytesSource(block, name="x")
    with pytest.raises(CorruptBinary, match="at most 256 MiB"):
        decompressed_source(src, 0, len(block), flags=FLAG_LZ4, size=size, name="x")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2 * len(block) + (1 << 20)


@pytest.mark.parametrize("name", ["libcompressed.so", "libcompressed_size.so"])
def test_a_zstd_cubin_read_as_a_stream_reads_as_the_whole(name: str) -> None:
    """Past the memory budget (here lowered to 1 KiB) a Zstandard cubin is read from
    the frame as it is asked for: the same bytes anywhere, the same kernels, release
    and arch check as the cubin decompressed whole."""
    src, entries = _sass(BIN / name)
    kernels: set[str] = set()
    for e in entries:
        whole = decompressed_cubin(src, e, name=name)
        raw = src.read_at(e.offset, 64)
        packed = int.from_bytes(raw[16:20], "little")
        flags = int.from_bytes(raw[40:48], "little")
        stream = decompressed_source(
            src, e.offset + 64, packed, flags=flags, size=whole.size, name=name, budget=1024
        )
        assert isinstance(stream, ZstdStream)
        for at, n in ((0, 64), (whole.size - 100, 100), (777, 4096), (whole.size - 1, 5)):
            assert stream.read_at(at, n) == whole.read_at(at, n)
        assert cubin_facts(stream, header=e.arch) == cubin_facts(whole, header=e.arch)
        kernels.update(cubin_facts(stream)[0] or ())
    assert "_Z4axpyfPKfPfi" in kernels  # read through the stream


def test_a_zstd_stream_shorter_than_its_header_says_is_refused() -> None:
    frame = zstandard.ZstdCompressor().compress(b"a" * 1000)
    stream = ZstdStream(BytesSource(frame, name="x"), 0, len(frame), size=5000, name="x")
    assert stream.read_at(990, 10) == b"a" * 10
    with pytest.raises(CorruptBinary, match="decompresses to fewer bytes"):
        stream.read_at(990, 20)


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
    with pytest.raises(CorruptBinary, match="more than LZ4 may at 255:1"):
        decompress_payload(b"\x1f\0", flags=FLAG_LZ4, size=MAX_IN_MEMORY, name="x")
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
    if len(text) > MAX_RATIO[flags] * len(packed) + 64:  # repeated short texts: 5000:1
        with pytest.raises(CorruptBinary, match="decompression bomb"):
            decompress_head(src, 3, len(packed), flags=flags, size=len(text), limit=limit, name="x")
        return
    head = decompress_head(src, 3, len(packed), flags=flags, size=len(text), limit=limit, name="x")
    assert head == text[:limit]


@pytest.mark.parametrize("flags", [FLAG_LZ4, FLAG_ZSTD, FLAG_LZ4 | FLAG_ZSTD, 0])
@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=300), size=st.integers(-1, MAX_IN_MEMORY + 1))
def test_a_head_of_garbage_is_refused_or_read_never_a_crash(
    flags: int, data: bytes, size: int
) -> None:
    with contextlib.suppress(CorruptBinary):
        head = decompress_head(
            BytesSource(data, name="x"), 0, len(data), flags=flags, size=size, limit=4096, name="x"
        )
        assert len(head) <= 4096


@pytest.mark.integration
@pytest.mark.index
def test_nccls_cubins_past_64_mib_are_read_and_judged(cli: CliRunner) -> None:
    """libnccl.so.2 of nvidia-nccl-cu12 2.32.3 holds three LZ4 cubins of 101 to 128 MiB
    (sm_90, sm_100, sm_120: 121,050,416 bytes), once refused by a 64 MiB cap: each is
    decompressed and read (its kernels, its release), and the file's entries are the
    ones cuobjdump lists; NCCL runs on each GPU it was built for."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    lib = member("nvidia-nccl-cu12", "2.32.3", "*/libnccl.so.2")
    report = inspect_file(lib)
    assert report is not None
    src = FileSource(os.open(lib, os.O_RDONLY), name=lib.name)
    large = [
        e
        for e in report.entries
        if int.from_bytes(src.read_at(e.offset + 56, 8), "little") > 64 << 20
    ]
    assert sorted(e.arch_name for e in large) == ["sm_100", "sm_120", "sm_90"]
    assert all(e.compressed and e.kernels for e in large)  # 54 kernels each
    # the release, where the cubin notes it (the old layout's sm_90 one does not)
    assert {str(e.toolkit) for e in large} == {"None", "12.9"}
    sass, ptx = cuobjdump_lists(tool, lib)
    # cuobjdump names a family-specific cubin by its plain SM (its ELF is the same)
    ours = Counter(
        e.arch_name.removesuffix("f") for e in report.entries if e.kind is EntryKind.SASS
    )
    assert ours == sass and ours["sm_120"] > 0
    assert Counter(e.arch_name for e in report.entries if e.kind is EntryKind.PTX) == ptx
    result = cli("check", str(lib), "--sm", "8.0", "--sm", "9.0", "--sm", "12.0", "--json")
    assert result.code == 0, result.out + result.err
    assert [t["verdict"] for t in result.json()["targets"]] == ["native"] * 3
