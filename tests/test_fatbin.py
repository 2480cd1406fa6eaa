"""The fatbinary reader on synthetic containers: layout, flags and every corruption."""

from __future__ import annotations

import struct

import pytest
import zstandard

from buildmatrix.binary.fatbin import parse_fatbin
from buildmatrix.binary.source import BytesSource, CorruptBinary
from tests.binaries import container, entry


def parse(data: bytes) -> list[tuple[str, str, str | None, bool, int]]:
    entries = parse_fatbin(BytesSource(data, name="t.fatbin"), 0, len(data), where="fatbin file")
    return [
        (e.kind.value, e.arch_name, str(e.ptx_isa) if e.ptx_isa else None, e.compressed, e.size)
        for e in entries
    ]


def _packed_ptx(
    text: bytes, *, arch: int, version: tuple[int, int], flags: int = 0, header_size: int = 64
) -> bytes:
    """A PTX entry compressed as nvcc 13 compresses by default (a Zstandard frame,
    flag 0x8000), its sizes at +16 (compressed) and +56 (uncompressed)."""
    packed = zstandard.ZstdCompressor().compress(text)
    payload = packed + b"\0" * (-len(packed) % 8)
    raw = bytearray(
        entry(
            kind=1,
            arch=arch,
            version=version,
            flags=0x8011 | flags,
            payload=payload,
            header_size=header_size,
        )
    )
    struct.pack_into("<I", raw, 16, len(packed))
    struct.pack_into("<Q", raw, 56, len(text))
    return bytes(raw)


def test_entries_kinds_suffixes_and_flags() -> None:
    data = container(
        entry(arch=80),
        entry(arch=90, flags=0x100011),  # arch-specific
        entry(arch=100, flags=0x1200011, header_size=112),  # family-specific, long header
        _packed_ptx(b".version 8.4\n.target sm_90\n", arch=90, version=(8, 4), header_size=80),
        _packed_ptx(b".version 9.0\n.target sm_100f\n", arch=100, version=(9, 0), flags=0x200000),
        entry(kind=8, arch=90, header_size=120),  # LTO IR
        entry(arch=75, flags=0x2011),  # LZ4-compressed (older toolkits)
    )
    assert parse(data) == [
        ("sass", "sm_80", None, False, 32),
        ("sass", "sm_90a", None, False, 32),
        ("sass", "sm_100f", None, False, 32),
        ("ptx", "compute_90", "8.4", True, 40),
        ("ptx", "compute_100f", "9.0", True, 40),
        ("ltoir", "lto_90", None, False, 32),
        ("sass", "sm_75", None, True, 32),
    ]


def test_concatenated_containers_with_padding() -> None:
    data = container(entry(arch=80)) + b"\0" * 24 + container(entry(arch=86))
    assert [e[1] for e in parse(data)] == ["sm_80", "sm_86"]


def test_empty_container_is_fine() -> None:
    assert parse(container()) == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "the fatbinary is empty"),
        (container(entry())[:10], "container header .* runs past the end"),
        (container(entry(), magic=0xDEADBEEF), "no fatbinary magic at offset 0x0"),
        (container(entry(), declared_size=1 << 40), "claims 1099511627776 bytes of entries"),
        (container(entry(), header_size=8), "has header size 8"),
        (container(entry(header_size=0)), "has header size 0"),
        (container(entry(header_size=32)), "has header size 32"),
        (container(entry(declared_size=(1 << 64) - 1)), "claims a 18446744073709551615-byte"),
        (container(entry(kind=5)), "unknown kind 5"),
        (container(entry(arch=0)), "has arch 0"),
        (container(entry()) + b"garbage!" * 3, "no fatbinary magic at offset 0x70"),
        (container(entry() + b"\1" * 20), "20 stray bytes"),
    ],
    ids=[
        "empty",
        "truncated header",
        "wrong magic",
        "bogus container size",
        "small header",
        "zero entry header (would loop)",
        "short entry header",
        "payload overflows",
        "unknown kind",
        "arch zero",
        "trailing garbage",
        "stray bytes",
    ],
)
def test_corrupt_fatbins_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(CorruptBinary, match=message) as info:
        parse(data)
    assert str(info.value).startswith("t.fatbin")


def test_region_past_end_of_file() -> None:
    data = container(entry())
    with pytest.raises(CorruptBinary, match="past the end of the file"):
        parse_fatbin(BytesSource(data, name="x"), 16, len(data), where="section .nv_fatbin")


def test_truncated_file() -> None:
    whole = container(entry(payload=b"\0" * 4096))
    with pytest.raises(CorruptBinary, match="claims 4160 bytes of entries but only 184 remain"):
        parse(whole[:200])
