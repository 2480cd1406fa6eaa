"""Tar headers read strictly: only forms Python's tarfile and Go's archive/tar (what
the Docker engine and containerd unpack layers with) read alike pass.

:class:`StrictTarInfo` is tarfile's TarInfo with every header block checked first,
and every member checked with the extension headers before it (PAX ``x``, GNU ``L``
and ``K``): their records are parsed again as Go's reader parses them
(``archive/tar/strconv.go``, ``parsePAXRecord``; ``reader.go``, ``Reader.next``,
``mergePAX``, ``readGNUSparsePAXHeaders``) and only forms whose meaning is the same
to both pass. What fails raises :class:`TarHeaderError`, which the layer readers
turn into a refusal naming the member (docs/security.md, "Tar headers").
tests/test_go_tar.py holds this to Go's reader itself.
"""

from __future__ import annotations

import re
import struct
import tarfile
from typing import IO, Any, NoReturn, Self

from buildmatrix.image.paxheaders import (
    ExtendedTarInfo,
    TarHeaderError,
    check_member,
    refuse_alone,
)

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
_OCTAL = re.compile(rb" *([0-7]*)[ \0]*")
# The numeric fields as tar writers write them (Go's archive/tar, GNU tar, Python's
# tarfile: zero-padded octal and a NUL; the checksum NUL and space; device numbers
# of non-devices all NULs), matched at once: each also matches _OCTAL.
_CANONICAL = re.compile(
    rb"([0-7]{7})\0([0-7]{7})\0([0-7]{7})\0([0-7]{11})\0([0-7]{11})\0([0-7]{6})\0 "
    rb"(?s:.{173})(?:\0{8}|([0-7]{7})\0)(?:\0{8}|([0-7]{7})\0)"
)
# Header blocks tarfile reads as they stand (no old GNU sparse map, no NUL type that
# the name may turn into a folder, no extension header): the string fields at once.
_PLAIN = frozenset(b"0123456")
_STRINGS = struct.Struct("100s57x100s8x32s32s16x155s")
_USTAR, _GNU, _V7 = b"ustar\x0000", b"ustar  \x00", b"\0" * 8
# Type flags container layers use: files, links, devices, folders, FIFOs, and the
# PAX and GNU long-name extension headers.
_TYPES = frozenset(b"\x0001234567xgLK")  # "g" and "7": refused with the member named


class TruncatedTar(TarHeaderError):
    """A tar stream that ends inside a header block, a member's data or the
    end-of-archive marker: where Go's archive/tar stops with "unexpected EOF"
    (``reader.go``: ``readHeader`` by ``io.ReadFull``, a member's data by
    ``regFileReader.Read`` and ``discard``). The message names the member."""


class _StreamEnd(Exception):
    """The stream ends where Go's reader ends the archive without an error: at a
    header block's boundary, or in the padding after a member's data (``Reader.next``
    reads the padding with ``tryReadFull``, which returns ``io.EOF`` when no byte
    of it is there, and so does ``readHeader`` where no byte of the next header is);
    an extension header (PAX ``x``, GNU ``L``/``K``) then describes nothing."""


class StrictTarInfo(ExtendedTarInfo):
    """tarfile's TarInfo, but every header block is first checked strictly, and each
    member with the extension headers that precede it (:meth:`_proc_member`, the
    hook tarfile's source names for subclasses). Where the stream ends is judged as
    Go's reader judges it (:class:`TruncatedTar`, :class:`_StreamEnd`)."""

    @classmethod
    def fromtarfile(cls, tarfile: Any) -> Self | None:  # type: ignore[override]
        """tarfile's ``TarInfo.fromtarfile``; None (the end of the archive, which
        tarfile's ``TarFile.next`` takes None for) where the stream ends where Go's
        reader ends the archive: an empty stream too, which tarfile calls an
        "empty file". Nested calls (the member after an extension header) pass the
        end on to the outermost."""
        try:
            return super().fromtarfile(tarfile)
        except _StreamEnd:
            if isinstance(tarfile.fileobj, Recorder):
                raise
            return None

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        if not buf:  # no byte of a header: Go's io.EOF, the end of the archive
            raise _StreamEnd
        if len(buf) < tarfile.BLOCKSIZE:  # tarfile's "truncated header": an end for it
            what = (
                "its end-of-archive marker"
                if buf.count(0) == len(buf)
                else f"the header of member '{header_name(bytes(buf))}'"
            )
            raise TruncatedTar(
                f"the layer ends inside {what} ({len(buf)} of {tarfile.BLOCKSIZE} bytes)"
            )
        if buf.count(0) == len(buf):  # an all-zero block: tarfile's end
            return super().frombuf(buf, encoding, errors)
        numbers = check_header(bytes(buf))
        if numbers is not None and buf[156] in _PLAIN:
            return cls._plain(bytes(buf), numbers, encoding, errors)
        try:
            info = super().frombuf(buf, encoding, errors)
        except tarfile.HeaderError as exc:
            # tarfile ends the archive quietly at a header it cannot parse after the
            # first (TarFile.next); Go's reader either reads on or fails.
            raise TarHeaderError(
                f"member '{header_name(bytes(buf))}': a header Python's tar reader cannot "
                f"parse ({exc}) and would take for the end of the layer"
            ) from None
        info.raw_type = bytes(buf[156:157])  # tarfile turns "\0" + "NAME/" into a folder
        return info

    @classmethod
    def _plain(cls, buf: bytes, numbers: list[int], encoding: str, errors: str) -> Self:
        """What tarfile's ``TarInfo.frombuf`` (CPython 3.11 to 3.13 alike) makes of a
        block :func:`check_header` passed with octal numbers only and a type of
        :data:`_PLAIN`, without parsing each field a second time: a header per entry
        is most of a layer's reading time (docs/development.md, test speed).
        tests/test_tar_headers.py holds it to tarfile's own."""
        info = cls()
        name, linkname, uname, gname, prefix = (
            field.split(b"\0", 1)[0].decode(encoding, errors) for field in _STRINGS.unpack_from(buf)
        )
        info.mode, info.uid, info.gid, info.size, info.mtime = numbers[:5]
        info.chksum, info.devmajor, info.devminor = numbers[5:]
        info.type = buf[156:157]
        info.linkname, info.uname, info.gname = linkname, uname, gname
        if info.type == tarfile.DIRTYPE:
            name = name.rstrip("/")
        info.name = f"{prefix}/{name}" if prefix else name
        info.raw_type = info.type
        return info

    def _proc_member(self, tarfile: Any) -> Any:
        if self.type not in EXTENSIONS:  # the member itself
            if self.type in REFUSED:
                refuse_alone(self)
            member = super()._proc_member(tarfile)  # type: ignore[misc]
            member.stored = (member.offset_data, member.size)
            member.header_name = member.name
            return member
        if self.size > MAX_SPECIAL:
            raise TarHeaderError(
                f"an extension header of {self.size} bytes, over Go's {MAX_SPECIAL}"
            )
        recorder = Recorder(tarfile.fileobj)
        tarfile.fileobj = recorder
        try:
            member = super()._proc_member(tarfile)  # type: ignore[misc]
        except (ValueError, UnicodeError) as exc:  # tarfile's own parse of the records
            self._check_data(recorder)
            raise TarHeaderError(f"an extension header cannot be read ({exc})") from None
        except (_StreamEnd, _HEADER_ERROR):
            self._check_data(recorder)
            raise
        finally:
            tarfile.fileobj = recorder.inner
        check_member(member, self.type, self.size, recorder.reads)
        return member

    def _check_data(self, recorder: Recorder) -> None:
        """Raise :class:`TruncatedTar` where an extension header's data was cut
        short (its first read, tarfile's ``_proc_pax`` and ``_proc_gnulong``)."""
        got = len(recorder.reads[0]) if recorder.reads else 0
        if got < self.size:
            kind = "PAX extended header" if self.type == b"x" else "GNU long name header"
            raise TruncatedTar(
                f"the layer ends inside the data of the {kind} '{self.name}' (its header "
                f"claims {self.size} bytes, {got} follow)"
            )


# Extension headers: they describe the member that follows. Go's reader reads at
# most 1 MiB of one (archive/tar/format.go, maxSpecialFileSize; readSpecialFile).
EXTENSIONS = (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
MAX_SPECIAL = 1 << 20
REFUSED = (tarfile.XGLTYPE, tarfile.CONTTYPE)  # see buildmatrix.image.paxheaders
_HEADER_ERROR = tarfile.HeaderError  # (the module, where a parameter takes its name)


class Recorder:
    """tarfile's file object while an extension header is processed: every call
    passes through; the bytes read are kept (at most ``MAX_SPECIAL`` plus a block
    more), so the records can be parsed again as Go's reader parses them."""

    def __init__(self, inner: IO[bytes]) -> None:
        self.inner = inner
        self.reads: list[bytes] = []
        self._kept = 0

    def read(self, n: int = -1) -> bytes:
        data = self.inner.read(n)
        self._kept += len(data)
        if self._kept > 2 * MAX_SPECIAL + tarfile.BLOCKSIZE:
            raise TarHeaderError(f"extension headers over {MAX_SPECIAL} bytes")
        self.reads.append(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def check_header(buf: bytes) -> list[int] | None:
    """Raise :class:`TarHeaderError` unless one 512-byte header block reads alike in
    Python's tarfile and Go's archive/tar (``reader.go``, ``Reader.readHeader``).
    Returns the numeric fields (in :data:`_NUMERIC` order) where all are octal, as
    tarfile's ``nti`` reads them; None where one is base-256."""
    if len(buf) != tarfile.BLOCKSIZE:
        raise TarHeaderError(f"a header is truncated ({len(buf)} bytes)")
    numbers: list[int] | None = []
    fields: tuple[tuple[int, int], ...] = _NUMERIC
    if (canonical := _CANONICAL.fullmatch(buf, 100, 345)) is not None:
        numbers = [int(digits or b"0", 8) for digits in canonical.groups()]
        fields = ()
    for start, end in fields:
        field = buf[start:end]
        if field[0] & 0x80 == 0:
            if (digits := _OCTAL.fullmatch(field)) is None:
                _refuse_numeric(buf, start, end)
            if numbers is not None:
                numbers.append(int(digits[1] or b"0", 8))
        elif _same_binary(field):
            numbers = None
        else:
            _refuse_numeric(buf, start, end)
    if buf[124] == 0xFF:  # Go: "negative size" is ErrHeader; tarfile seeks backwards
        raise TarHeaderError(f"member '{header_name(buf)}': a header with a negative size")
    # Go parses the checksum as octal only (format.go, getFormat: parseOctal), so a
    # base-256 one (top bit set; it passed the loop above) is no checksum: refused
    # before it is parsed, which raised ValueError (a traceback) on such a field.
    if buf[148] & 0x80:
        raise TarHeaderError("a header's checksum does not match")
    unsigned = sum(buf) - sum(buf[148:156]) + 8 * 32
    checksum = _field(buf, 148, 156)  # the signed sum only where the unsigned one fails
    if checksum != unsigned and checksum != _signed(buf):
        raise TarHeaderError("a header's checksum does not match")
    magic = buf[257:265]
    if buf[156] == 0 and magic == _USTAR and not buf[0] and buf[345]:
        # Type NUL is a folder when the name ends in "/". Go decides on the whole name,
        # prefix + "/" + name (reader.go, Reader.next: TypeRegA), which then always
        # ends in "/"; Python's tarfile on the name field alone (TarInfo.frombuf): a
        # file, whose data Go reads as the next headers.
        raise TarHeaderError(
            f"member '{header_name(buf)}': type NUL with an empty name and a ustar "
            "prefix; Go's reader reads a folder and the data as headers, Python's a file"
        )
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
    return numbers


def _refuse_numeric(buf: bytes, start: int, end: int) -> NoReturn:
    raise TarHeaderError(
        f"member '{header_name(buf)}': a header has a numeric field (bytes "
        f"{start}..{end}) of {buf[start:end]!r}, which tar readers parse differently"
    )


def header_name(buf: bytes) -> str:
    """The member name one header block gives (ustar prefix joined), for messages."""
    name = buf[:100].split(b"\0", 1)[0]
    prefix = buf[345:500].split(b"\0", 1)[0] if buf[257:265] == _USTAR else b""
    return (prefix + b"/" + name if prefix else name).decode("utf-8", "replace")


def _same_binary(field: bytes) -> bool:
    """Whether a base-256 numeric field reads alike in both readers. Go's
    ``parser.parseNumeric`` (strconv.go) takes any first byte with the top bit set
    (the next bit is the sign) and fails past 63 bits; Python's ``tarfile.nti`` takes
    only 0x80 (positive) and 0xFF (negative) and treats any other as a bad header."""
    if field[0] not in (0x80, 0xFF):
        return False
    inv = 0xFF if field[0] & 0x40 else 0
    x = 0
    for i, c in enumerate(field):
        if x >> 56:
            return False  # Go: integer overflow, ErrHeader
        x = x << 8 | ((c ^ inv) & (0x7F if i == 0 else 0xFF))
    return not x >> 63


def _field(buf: bytes, start: int, end: int) -> int:
    digits = buf[start:end].strip(b" \0")
    return int(digits, 8) if digits else 0


def _signed(buf: bytes) -> int:
    """The checksum as some old tars compute it, over signed bytes."""
    signed = [b - 256 if b > 127 else b for b in buf]
    return sum(signed[:148]) + 8 * 32 + sum(signed[156:])
