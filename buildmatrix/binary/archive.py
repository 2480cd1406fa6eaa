"""Static archives (``ar``, ``.a``): the members, read in place.

The common ``ar`` format (System V / GNU as binutils writes it, BSD names as macOS
``ar`` writes them): an 8-byte magic, then per member a 60-byte text header (name,
mtime, uid, gid, mode, decimal size, the two bytes "`\\n") and its data, padded to an
even offset. GNU archives keep long names in a ``//`` member and refer to them as
``/OFFSET``; ``/`` and ``/SYM64/`` are symbol tables. BSD archives write ``#1/LEN``
and put the name before the data. Thin archives (``!<thin>``) hold no member data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from buildmatrix.binary.source import ByteSource, CorruptBinary, SliceSource, read_exact

AR_MAGIC = b"!<arch>\n"
THIN_MAGIC = b"!<thin>\n"
_HEADER = 60
# Archives of real toolkits hold thousands of objects (libcudart_static.a: ~500);
# far more is a crafted header sequence.
MAX_MEMBERS = 1 << 20
MAX_NAME_TABLE = 64 << 20


@dataclass(frozen=True, kw_only=True)
class Member:
    name: str
    source: ByteSource


def is_archive(head: bytes) -> bool:
    return head[:8] in (AR_MAGIC, THIN_MAGIC)


def members(src: ByteSource) -> Iterator[Member]:
    """Each data member of the archive (symbol and name tables left out), in order."""
    magic = read_exact(src, 0, 8, what="archive magic")
    if magic == THIN_MAGIC:
        raise CorruptBinary(
            f"{src.name}: a thin archive, whose members are files elsewhere; inspect those."
        )
    if magic != AR_MAGIC:
        raise CorruptBinary(f"{src.name}: not an ar archive (bad magic).")
    offset = 8
    names = b""
    count = 0
    while offset < src.size:
        if src.size - offset == 1 and src.read_at(offset, 1) == b"\n":
            break  # the padding of an odd last member
        header = read_exact(src, offset, _HEADER, what="archive member header")
        if header[58:60] != b"`\n":
            raise CorruptBinary(f"{src.name}: archive member header at {offset:#x} is corrupt.")
        try:
            size = int(header[48:58].decode("ascii").strip() or "x")
        except (UnicodeDecodeError, ValueError):
            raise CorruptBinary(
                f"{src.name}: archive member at {offset:#x} has no valid size."
            ) from None
        data = offset + _HEADER
        if size < 0 or data + size > src.size:
            raise CorruptBinary(
                f"{src.name}: archive member at {offset:#x} runs past the end of the file."
            )
        count += 1
        if count > MAX_MEMBERS:
            raise CorruptBinary(f"{src.name}: more than {MAX_MEMBERS} archive members.")
        raw = header[:16].decode("latin-1").rstrip(" ")
        name, skip = _name(src, raw, names, data, size)
        if raw == "//":
            if size > MAX_NAME_TABLE:
                raise CorruptBinary(f"{src.name}: archive name table of {size} bytes; refused.")
            names = read_exact(src, data, size, what="archive name table")
        elif raw not in ("/", "/SYM64/", "__.SYMDEF", "__.SYMDEF SORTED") and not (
            raw.startswith("#1/") and name.startswith("__.SYMDEF")
        ):
            yield Member(
                name=name,
                source=SliceSource(src, data + skip, size - skip, name=f"{src.name}({name})"),
            )
        offset = data + size + (size & 1)


def _name(src: ByteSource, raw: str, names: bytes, data: int, size: int) -> tuple[str, int]:
    """The member's name and how many bytes of its data the name takes (BSD)."""
    if raw.startswith("#1/"):
        try:
            length = int(raw[3:])
        except ValueError:
            raise CorruptBinary(f"{src.name}: archive member name '{raw}' is corrupt.") from None
        if not 0 <= length <= size:
            raise CorruptBinary(f"{src.name}: archive member name '{raw}' is corrupt.")
        text = read_exact(src, data, length, what="archive member name")
        return text.rstrip(b"\0").decode("utf-8", "replace"), length
    if raw.startswith("/") and raw[1:].isdigit():
        at = int(raw[1:])
        if at >= len(names):
            raise CorruptBinary(f"{src.name}: archive member name '{raw}' is not in the table.")
        end = names.find(b"\n", at)
        text = names[at : end if end >= 0 else len(names)]
        return text.decode("utf-8", "replace").rstrip("/"), 0
    return raw.rstrip("/") if raw not in ("/", "//") else raw, 0
