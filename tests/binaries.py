"""Build synthetic fatbinaries and ELF files byte by byte, for the corrupt-input tests."""

from __future__ import annotations

import struct

MAGIC = 0xBA55ED50


def entry(
    *,
    kind: int = 2,
    arch: int = 80,
    payload: bytes = b"\0" * 32,
    header_size: int = 64,
    version: tuple[int, int] = (1, 8),
    flags: int = 0x11,
    declared_size: int | None = None,
) -> bytes:
    size = len(payload) if declared_size is None else declared_size
    head = struct.pack(
        "<HHIQ8xHHI8xQ8xQ", kind, 0x101, header_size, size, version[1], version[0], arch, flags, 0
    )
    return head + b"\0" * (header_size - 64) + payload


def container(
    *entries: bytes, declared_size: int | None = None, magic: int = MAGIC, header_size: int = 16
) -> bytes:
    body = b"".join(entries)
    size = len(body) if declared_size is None else declared_size
    return struct.pack("<IHHQ", magic, 1, header_size, size) + b"\0" * (header_size - 16) + body


def elf_with_section(name: str, data: bytes, *, machine: int = 62) -> bytes:
    """A little-endian ELF64 with one named PROGBITS section holding ``data``."""
    names = b"\0.shstrtab\0" + name.encode() + b"\0"
    data_off = 64
    names_off = data_off + len(data)
    shoff = (names_off + len(names) + 7) & ~7
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    ehdr = ident + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 1)
    image = bytearray(ehdr + data + names)
    image += b"\0" * (shoff - len(image))
    image += b"\0" * 64  # section 0
    image += struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, names_off, len(names), 0, 0, 1, 0)
    image += struct.pack("<IIQQQQIIQQ", 11, 1, 2, 0, data_off, len(data), 0, 0, 8, 0)
    return bytes(image)
