"""Extension headers (PAX ``x``, GNU ``L`` and ``K``) held to Go's reading of them.

Go's archive/tar is what the Docker engine, containerd and ``docker load`` unpack
layers with; Python's tarfile reads several forms differently (each hid a library
from an earlier ``check``). A member passes only where both read the same name,
link, size, data and attributes; every rule cites the Go source it follows
(go/src/archive/tar, Go 1.19 to 1.23 alike). docs/security.md, "Tar headers", lists
what is accepted and what is refused.

- Records are parsed again as ``parsePAXRecord`` (strconv.go) parses them, and
  must equal what tarfile parsed.
- An empty record: ``mergePAX`` keeps the header's own value, tarfile takes the
  empty one (an empty ``path`` named no file at all): refused. So is an empty GNU
  long name or link (``L``/``K`` of no bytes, or NULs only): ``Reader.next`` applies
  one only where it is not empty.
- Two headers of one kind before a member: ``Reader.next`` keeps the last, tarfile
  the first: refused. ``path`` with an ``L`` header (or ``linkpath`` with ``K``):
  Go takes the GNU name whatever the order, tarfile the later one: refused.
- A global header (``g``): Go returns it as an entry the engine ignores
  (moby pkg/archive, ``createTarFile``); tarfile applies it to every later member:
  refused. So is type ``7``, which tarfile reads as a file and the engine refuses.
- ``GNU.sparse.*``: Go reads a sparse file only for the versions
  ``readGNUSparsePAXHeaders`` knows, and then only with a valid map
  (``readGNUSparseMap0x1``, ``readGNUSparseMap1x0``, ``validateSparseEntries``);
  tarfile applies ``GNU.sparse.name``/``size``/``realsize`` to any member.
  Accepted: format 1.0 (what GNU tar writes) and 0.1, whole and consistent; a lone
  ``GNU.sparse.size``, ``realsize`` or ``name``, format 0.0 and unknown versions are
  refused.
- Overlay xattrs (``SCHILY.xattr.trusted.overlay.*``, ``user.overlay.*``): the
  engine copies them into the layer folder, where overlayfs follows them
  (a redirect shows files the tar does not hold there): refused.
"""

from __future__ import annotations

import re
import tarfile
from typing import Any, NoReturn, cast

from buildmatrix.errors import InputError


class TarHeaderError(InputError):
    """A tar header two readers could read differently (kept apart from tarfile's own
    HeaderError, which tarfile turns into a silent end of the archive). The layer
    readers catch it and refuse the layer or archive naming it
    (buildmatrix.image.layers.read_as_layer)."""


class ExtendedTarInfo(tarfile.TarInfo):
    """tarfile's TarInfo with what the strict reader (buildmatrix.image.tarheaders.
    StrictTarInfo) records about a member for the checks here."""

    # The extension headers read before this member, outermost first; where its
    # data starts and its size as its own header gives them (before PAX records).
    extensions: tuple[bytes, ...] = ()
    stored: tuple[int, int] = (0, 0)
    header_name = ""
    raw_type = b""


_KIND = {
    tarfile.XHDTYPE: "PAX extended (x)",
    tarfile.GNUTYPE_LONGNAME: "GNU long name (L)",
    tarfile.GNUTYPE_LONGLINK: "GNU long link (K)",
}
_DIGITS = re.compile(rb"[0-9]{1,18}")
_TIME = re.compile(rb"-?[0-9]{1,18}(\.[0-9]{1,9})?")
_NUMBERS = (b"size", b"uid", b"gid", b"GNU.sparse.size", b"GNU.sparse.realsize")
_TIMES = (b"mtime", b"atime", b"ctime")
_XATTR = b"SCHILY.xattr."
_OVERLAY = (b"trusted.overlay.", b"user.overlay.")
_SPARSE = b"GNU.sparse."
_SPARSE_1_0 = {b"major", b"minor", b"name", b"realsize"}
_SPARSE_0_1 = {b"major", b"minor", b"name", b"size", b"realsize", b"map", b"numblocks"}


def _refuse(member: tarfile.TarInfo, why: str) -> NoReturn:
    own = getattr(member, "header_name", "") or member.name
    named = f"'{member.name}'" + (f" (its header names '{own}')" if own != member.name else "")
    raise TarHeaderError(f"member {named}: {why}")


def refuse_alone(header: tarfile.TarInfo) -> None:
    """Header types refused on sight (see the module's docstring)."""
    if header.type == tarfile.XGLTYPE:
        _refuse(
            header,
            "a PAX global header; Go's reader hands it to the engine, which ignores it, "
            "while Python's applies its records to every later member",
        )
    if header.type == tarfile.CONTTYPE:
        _refuse(header, "type 7 (contiguous file), which the engine refuses to unpack")


def parse_records(data: bytes, member: tarfile.TarInfo) -> dict[bytes, bytes]:
    """PAX records as Go's ``parsePAX``/``parsePAXRecord`` read them (a later record
    of one key replaces an earlier one); anything Go's reader refuses is refused."""
    records: dict[bytes, bytes] = {}
    rest = data
    while rest:
        size, space, _ = rest.partition(b" ")
        if not space or not _DIGITS.fullmatch(size):
            _refuse(member, "a PAX record without a decimal length")
        n = int(size)
        if n < 5 or n > len(rest) or n <= len(size) + 1:
            _refuse(member, f"a PAX record length ({n}) outside its header")
        record, rest = rest[:n], rest[n:]
        if record[-1:] != b"\n":
            _refuse(member, "a PAX record that does not end with a newline")
        key, equals, value = record[len(size) + 1 : -1].partition(b"=")
        if not equals or not key or b"\0" in key:
            _refuse(member, "a PAX record without a key")
        if key in (b"path", b"linkpath", b"uname", b"gname") and b"\0" in value:
            _refuse(member, f"a PAX '{key.decode(errors='replace')}' with a NUL byte")
        if key in (b"GNU.sparse.offset", b"GNU.sparse.numbytes"):
            _refuse(member, "GNU sparse format 0.0, which Go's reader reads unlike Python's")
        records[key] = value
    return records


def check_member(member: ExtendedTarInfo, kind: bytes, size: int, reads: list[bytes]) -> None:
    """Refuse ``member`` unless, with the extension header of ``kind`` (``size``
    bytes, read as ``reads``) and those after it, Go's reader reads it as tarfile
    did; records what came before it in ``member.extensions``."""
    if kind in member.extensions:
        _refuse(member, f"two {_KIND[kind]} headers precede it; Go's reader uses the last")
    member.extensions = (kind, *member.extensions)
    pax = {
        k.encode("utf-8", "surrogateescape"): v.encode("utf-8", "surrogateescape")
        for k, v in member.pax_headers.items()
    }
    if kind != tarfile.XHDTYPE and not reads[0][:size].split(b"\0", 1)[0]:
        # Go's Reader.next applies a GNU long name or link only where it is not empty
        # (after parseString cuts it at the first NUL); tarfile takes the empty one.
        _refuse(
            member,
            f"an empty {_KIND[kind]} header; Go's reader keeps the header's own "
            "name or link, Python's takes the empty one",
        )
    if kind == tarfile.XHDTYPE:
        records = parse_records(reads[0][:size], member)
        if records != pax:
            _refuse(member, "its PAX records read differently in Go's reader")
        _check_values(member, records)
        _check_sparse(member, records, reads)
    if member.raw_type == tarfile.AREGTYPE:  # Go decides file or folder on the long name
        _refuse(
            member,
            "type NUL with an extension header; Go and Python decide apart whether it is a folder",
        )
    if tarfile.GNUTYPE_LONGNAME in member.extensions and b"path" in pax:
        _refuse(member, "both a PAX path and a GNU long name; Go's reader takes the GNU one")
    if tarfile.GNUTYPE_LONGLINK in member.extensions and b"linkpath" in pax:
        _refuse(member, "both a PAX linkpath and a GNU long link; Go's reader takes the GNU one")
    if len(member.extensions) > 1 and any(k.startswith(_SPARSE) for k in pax):
        _refuse(member, "GNU sparse records with a GNU long name or link")


def _check_values(member: tarfile.TarInfo, records: dict[bytes, bytes]) -> None:
    for key, value in records.items():
        name = key.decode(errors="replace")
        if not value:
            _refuse(
                member,
                f"an empty PAX '{name}' record; Go's reader keeps the header's own value, "
                "Python's takes the empty one",
            )
        if key in _NUMBERS and not _DIGITS.fullmatch(value):
            _refuse(member, f"PAX '{name}' is not a plain decimal number")
        if key in _TIMES and not _TIME.fullmatch(value):
            _refuse(member, f"PAX '{name}' is not a plain decimal time")
        if key.startswith(_XATTR) and key[len(_XATTR) :].startswith(_OVERLAY):
            _refuse(
                member,
                f"it sets the overlay xattr '{key[len(_XATTR) :].decode(errors='replace')}'; "
                "the engine copies it into the layer folder, where overlayfs follows it "
                "and the container sees other files than the layer holds",
            )


def _check_sparse(member: ExtendedTarInfo, records: dict[bytes, bytes], reads: list[bytes]) -> None:
    """GNU sparse records: only whole 1.0 and 0.1 forms, read alike by both."""
    sparse = {k[len(_SPARSE) :]: v for k, v in records.items() if k.startswith(_SPARSE)}
    if not sparse:
        return
    version = (sparse.get(b"major"), sparse.get(b"minor"))
    if version == (b"1", b"0") and b"realsize" in sparse:
        allowed, size = _SPARSE_1_0, sparse[b"realsize"]
    elif b"map" in sparse and version in ((None, None), (b"0", b"0"), (b"0", b"1")):
        allowed = _SPARSE_0_1
        sizes = {sparse[k] for k in (b"size", b"realsize") if k in sparse}
        if len(sizes) != 1 or b"numblocks" not in sparse:
            _refuse(member, "GNU sparse 0.1 records without one size and a block count")
        (size,) = sizes
    else:
        found = ", ".join(sorted(f"GNU.sparse.{k.decode(errors='replace')}" for k in sparse))
        _refuse(
            member,
            f"GNU sparse records ({found}) that make no sparse file Go's reader knows; "
            "it reads the member as a plain file, Python's as a sparse one",
        )
    if extra := set(sparse) - allowed:
        _refuse(member, f"unexpected GNU sparse records {sorted(extra)}")
    if b"size" in records:
        _refuse(member, "both a PAX size and GNU sparse records")
    if b"name" in sparse and records.get(b"path", sparse[b"name"]) != sparse[b"name"]:
        _refuse(member, "a PAX path and a GNU sparse name that differ")
    if member.type != tarfile.REGTYPE or not member.issparse() or member.size != int(size):
        _refuse(member, "GNU sparse records Python's reader does not read as Go's")
    wanted = _sparse_map(member, sparse, reads)
    read: list[tuple[int, int]] = [tuple(e) for e in cast(list[Any], member.sparse or [])]
    if read != wanted:
        _refuse(member, "a GNU sparse map Python's reader reads differently")
    _check_map(member, wanted)


def _sparse_map(
    member: tarfile.TarInfo, sparse: dict[bytes, bytes], reads: list[bytes]
) -> list[tuple[int, int]]:
    """The map as ``readGNUSparseMap0x1`` (from the records) or ``readGNUSparseMap1x0``
    (from the data's first blocks: here, the reads after the member's header) reads it."""
    if b"map" in sparse:
        count, tokens = sparse[b"numblocks"], sparse[b"map"].split(b",")
    else:
        lines = b"".join(reads[2:]).split(b"\n")
        count, tokens = lines[0], lines[1:]
    if not _DIGITS.fullmatch(count):
        _refuse(member, "a GNU sparse block count that is not a number")
    n = int(count)
    numbers = tokens[: 2 * n]
    if len(numbers) != 2 * n or not all(_DIGITS.fullmatch(t) for t in numbers):
        _refuse(member, "a GNU sparse map that is not 2 x its block count numbers")
    if b"map" in sparse and len(tokens) != 2 * n:
        _refuse(member, "a GNU sparse map longer than its block count")
    values = [int(t) for t in numbers]
    return list(zip(values[::2], values[1::2], strict=True))


def _check_map(member: ExtendedTarInfo, entries: list[tuple[int, int]]) -> None:
    """``validateSparseEntries`` (reader.go), and the data the map names must be the
    data stored (Go's sparse reader fails with errMissData or errUnrefData)."""
    end = 0
    for offset, length in entries:
        if offset < end or offset + length > member.size:
            _refuse(member, "a GNU sparse map with regions out of order or past the file")
        end = offset + length
    start, stored = member.stored
    physical = stored - (member.offset_data - start)
    if sum(length for _, length in entries) != physical:
        _refuse(member, "a GNU sparse map that names other than the bytes stored")
