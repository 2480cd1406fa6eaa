"""Tar headers read strictly: only forms Python's tarfile and Go's archive/tar (what
the Docker engine and containerd unpack layers with) read alike pass.

:class:`StrictTarInfo` is tarfile's TarInfo with every header block checked first;
what fails raises :class:`TarHeaderError`, which the layer readers turn into a
refusal (docs/security.md, "What is refused").
"""

from __future__ import annotations

import re
import tarfile
from typing import Self


class TarHeaderError(Exception):
    """A tar header two readers could read differently (kept apart from tarfile's own
    HeaderError, which tarfile turns into a silent end of the archive)."""


# Numeric fields of a header (POSIX ustar): mode, uid, gid, size, mtime, chksum,
# devmajor, devminor. Go's archive/tar (Docker, containerd) trims spaces and NULs on
# both sides and parses octal digits; Python's tarfile cuts at the first NUL and
# accepts what int(x, 8) accepts ("+7", "1_0"). Only forms both read alike pass.
_NUMERIC = (
    (100, 108),
    (108, 116),
    (116, 124),
    (124, 136),
    (136, 148),
    (148, 156),
    (329, 337),
    (337, 345),
)
_OCTAL = re.compile(rb" *[0-7]*[ \0]*")
_USTAR, _GNU, _V7 = b"ustar\x0000", b"ustar  \x00", b"\0" * 8
# Type flags container layers use: files, links, devices, folders, FIFOs, and the
# PAX and GNU long-name extension headers.
_TYPES = frozenset(b"\x0001234567xgLK")


class StrictTarInfo(tarfile.TarInfo):
    """tarfile's TarInfo, but every header block is first checked strictly."""

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        if buf and buf.count(0) != len(buf):  # empty and all-zero blocks: tarfile's ends
            check_header(bytes(buf))
        return super().frombuf(buf, encoding, errors)


def check_header(buf: bytes) -> None:
    """Raise :class:`TarHeaderError` unless one 512-byte header block reads alike in
    Python's tarfile and Go's archive/tar (``reader.go``, ``Reader.readHeader``)."""
    if len(buf) != tarfile.BLOCKSIZE:
        raise TarHeaderError(f"a header is truncated ({len(buf)} bytes)")
    for start, end in _NUMERIC:
        field = buf[start:end]
        if field[0] & 0x80 == 0 and not _OCTAL.fullmatch(field):
            raise TarHeaderError(
                f"a header has a numeric field (bytes {start}..{end}) of {field!r}, which "
                "tar readers parse differently"
            )
    unsigned = sum(buf[:148]) + 8 * 32 + sum(buf[156:])
    if buf[148] & 0x80 or _field(buf, 148, 156) not in (unsigned, _signed(buf)):
        raise TarHeaderError("a header's checksum does not match")
    magic = buf[257:265]
    if buf[156] not in _TYPES:
        raise TarHeaderError(f"a header has the type flag {buf[156:157]!r}, not one of a layer")
    if magic == _USTAR:
        if buf[508:512] == b"tar\0" and 0 not in buf[345:476]:
            raise TarHeaderError("a header is ambiguous between the ustar and star formats")
    elif magic in (_GNU, _V7):
        # Neither format has a prefix field; Python's tarfile would still read one.
        if any(buf[345:500]):
            raise TarHeaderError("a header without a ustar prefix field has bytes in it")
        if magic == _V7 and any(buf[257:345]):
            raise TarHeaderError("a V7 header has bytes after its link name")
    else:
        raise TarHeaderError(f"a header has the unknown magic {magic!r}")


def _field(buf: bytes, start: int, end: int) -> int:
    digits = buf[start:end].strip(b" \0")
    return int(digits, 8) if digits else 0


def _signed(buf: bytes) -> int:
    """The checksum as some old tars compute it, over signed bytes."""
    signed = [b - 256 if b > 127 else b for b in buf]
    return sum(signed[:148]) + 8 * 32 + sum(signed[156:])
