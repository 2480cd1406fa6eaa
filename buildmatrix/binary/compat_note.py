"""The forward-compatibility note of a cuda-compat ``libcuda.so``, read exactly as the
NVIDIA container toolkit reads it.

Source: NVIDIA/nvidia-container-toolkit, ``cmd/nvidia-cdi-hook/cudacompat/
cuda-elf-header.go``, ``GetCUDACompatElfHeaderFromReader`` (with ``getCUDAFwdCompat
ibilitySection``, ``trim``, ``alignUp`` and the ``compatElfHeader`` struct that Go's
``encoding/json`` fills). Each step below names the line of that function it follows:

- the section is the first one of type ``SHT_NOTE`` named
  ``.note.cuda.fwd_compatibility`` (a section of that name and another type is not
  it); its whole content is read, whatever its size (``s.Data()``: no bound but the
  file's own size; here up to ``MAX_NOTE``, and past it ``check`` fails closed);
- a 12-byte ``Elf32_Nhdr`` in the file's byte order; a name or description size of 0
  means no note;
- the name is ``NameSize`` rounded up to the section's ``sh_addralign`` bytes after the
  header, NULs trimmed at both ends, and must be ``NVIDIA Corporation``; the
  description starts after that rounded name, runs ``DescSize`` bytes (clipped to the
  section), NULs trimmed at both ends;
- the description is decoded by Go's ``encoding/json`` into ``{Format int; CUDAVersion
  string "CUDA Version"; Driver []int; Device []int}``: keys match field names without
  regard to case, unknown keys are ignored, ``null`` leaves a field as it is, and any
  value of the wrong type (or any JSON error, or nesting past Go's ``maxNestingDepth``
  of 10,000) makes the whole note unreadable — the toolkit then ignores the note
  (``m.logger.Warningf``) and falls back to comparing driver majors.

The result says which of three things the toolkit sees: a note (with its fields), no
note, or a note it could not read. Where this reader cannot follow the toolkit (the
ELF itself is unreadable here, a compressed section), ``undetermined`` says why and
``check`` fails closed.
"""

from __future__ import annotations

import json
import re
import struct
import sys
from dataclasses import dataclass
from typing import Any

from buildmatrix.binary.elf import SHT_NOTE, is_elf, read_elf
from buildmatrix.binary.report import FileReport
from buildmatrix.binary.source import ByteSource, CorruptBinary, read_exact
from buildmatrix.errors import InputError

NOTE_SECTION = ".note.cuda.fwd_compatibility"
# Names and SONAMEs the readers record as driver libraries (binary.scan): ldconfig
# takes libcuda.so.1 by SONAME whatever the file is called (buildmatrix.ldconfig).
LIBCUDA = "libcuda.so"
# A path whose name buildmatrix.forward.LIBRARY_GLOB (``libcuda.so.*.*``, where the
# container toolkit looks) matches; ``*`` may hold dots.
COMPAT_NAME = re.compile(r"(?:^|/)libcuda\.so\.[^/]*\.[^/]*$")
NOTE_OWNER = "NVIDIA Corporation"
SHF_COMPRESSED = 0x800
# The toolkit reads the section whatever its size. This reader holds it in memory, so
# past this bound it fails closed (``undetermined``) rather than read or ignore it.
MAX_NOTE = 256 << 20
# Go's encoding/json refuses JSON nested deeper than this (scanner.go, maxNestingDepth).
_GO_MAX_DEPTH = 10_000
_INT64 = (-(1 << 63), (1 << 63) - 1)  # Go's int on the 64-bit hosts the toolkit runs on
# The compatElfHeader fields, by the name Go's decoder folds each key to.
_FIELDS = {"FORMAT": "format", "CUDA VERSION": "cuda", "DRIVER": "driver", "DEVICE": "device"}


def named_compat_driver(head: bytes, path: str) -> bool:
    """Whether a file is an ELF file (``head``: its first bytes) with the name the
    container toolkit looks for in the compat folder (:data:`COMPAT_NAME`)."""
    return is_elf(head) and COMPAT_NAME.search(path) is not None


@dataclass(frozen=True, kw_only=True)
class CompatLibrary:
    """A file the container toolkit may take for the compat ``libcuda.so.*.*``.

    ``note``: True when the toolkit reads a note from it (then ``branches`` is the
    note's ``driver`` list, empty where the note has none), False when it sees none.
    ``problem``: why the toolkit reads no note from the file's note section (it is
    not SHT_NOTE, holds no NVIDIA note, or its JSON does not decode).
    ``undetermined``: this reader cannot tell what the toolkit reads (fail closed).
    ``code``: device code in the file itself, judged like any other file's unless the
    file is the compat driver the toolkit finds. ``elf``: False for a file that was
    not read as an ELF library (the loader may not be able to use it).
    ``soname``, ``ld_skip``, ``ld_unknown``, ``machine``: what ldconfig reads from
    the file (buildmatrix.binary.dynamic), for which file it loads as libcuda.so.1
    (buildmatrix.ldconfig).
    """

    path: str
    elf: bool = True
    note: bool = False
    cuda: str = ""  # the note's "CUDA Version", as written
    branches: tuple[int, ...] = ()
    devices: tuple[int, ...] | None = None
    problem: str | None = None
    undetermined: str | None = None
    code: FileReport | None = None
    soname: str | None = None
    ld_skip: str | None = None
    ld_unknown: str | None = None
    machine: str = ""

    def describe(self) -> str:
        parts = []
        if self.cuda:
            parts.append(f"CUDA {self.cuda}")
        if self.note:
            listed = ", ".join(f"R{b}" for b in self.branches) or "none"
            parts.append(f"kernel driver branches {listed}")
        return f"/{self.path}" + (f" ({'; '.join(parts)})" if parts else "")


def read_compat_library(
    src: ByteSource, *, path: str, code: FileReport | None = None
) -> CompatLibrary:
    """What the toolkit's ``GetCUDACompatElfHeaderFromReader`` reads from ``src``."""
    try:
        info = read_elf(src)
    except CorruptBinary as exc:
        return CompatLibrary(
            path=path, elf=False, undetermined=f"not a readable ELF file: {exc}", code=code
        )
    section = next(
        (s for s in info.sections if s.type == SHT_NOTE and s.name == NOTE_SECTION), None
    )
    if section is None:
        other = info.section(NOTE_SECTION)
        why = None if other is None else f"it is of type {other.type}, not SHT_NOTE"
        return CompatLibrary(path=path, problem=why, code=code)
    if section.flags & SHF_COMPRESSED:  # s.Data() would decompress it; this reader does not
        return CompatLibrary(
            path=path, undetermined=f"{NOTE_SECTION} is a compressed section", code=code
        )
    if section.size > MAX_NOTE:
        why = f"{NOTE_SECTION} is {section.size} bytes, over the {MAX_NOTE >> 20} MiB read"
        return CompatLibrary(path=path, undetermined=why, code=code)
    try:
        data = read_exact(src, section.offset, section.size, what=NOTE_SECTION)
        order = "<" if read_exact(src, 5, 1, what="ELF byte order") == b"\x01" else ">"
    except CorruptBinary as exc:
        return CompatLibrary(path=path, undetermined=str(exc), code=code)
    desc = note_description(data, order=order, align=section.addralign)
    if desc is None:
        why = "it holds no NVIDIA Corporation note with a description"
        return CompatLibrary(path=path, problem=why, code=code)
    try:
        fields = decode_note(desc)
    except UndecodableNote as exc:
        return CompatLibrary(path=path, problem=f"its JSON does not decode ({exc})", code=code)
    return CompatLibrary(
        path=path,
        note=True,
        cuda=fields["cuda"],
        branches=tuple(fields["driver"] or ()),
        devices=tuple(fields["device"]) if fields["device"] is not None else None,
        code=code,
    )


def note_description(data: bytes, *, order: str, align: int) -> bytes | None:
    """The note's description as ``GetCUDACompatElfHeaderFromReader`` cuts it out of
    the section's bytes; None where it finds no NVIDIA note."""
    if len(data) < 12:  # binary.Read of the Elf32_Nhdr fails: the toolkit reads no note
        return None
    namesz, descsz, _type = struct.unpack(order + "III", data[:12])
    if namesz == 0 or descsz == 0:
        return None
    name_len = _align_up(namesz, align)
    if _trim(data, 12, name_len) != NOTE_OWNER.encode():
        return None
    return _trim(data, 12 + name_len, descsz)


def _align_up(size: int, to: int) -> int:
    """``alignUp``: ``(size + to - 1) &^ (to - 1)`` in uint32 arithmetic (``to`` is
    converted to the size's type, so 0 gives 0)."""
    mask = 0xFFFFFFFF
    t = to & mask
    return ((size + t - 1) & mask) & ~((t - 1) & mask) & mask


def _trim(data: bytes, start: int, n: int) -> bytes:
    """``trim``: ``data[min(len-1, from):min(len, from+n)]`` with NULs cut at both ends."""
    if not data:
        return b""
    start = min(len(data) - 1, start)
    return data[start : min(len(data), start + n)].strip(b"\0")


def decode_note(desc: bytes) -> dict[str, Any]:
    """The note's JSON as Go's ``json.Unmarshal`` fills ``compatElfHeader``;
    :class:`UndecodableNote` where Go's decoder returns an error (the whole note is
    then ignored)."""

    def no_constant(name: str) -> Any:
        raise UndecodableNote(f"{name} is not JSON")

    # Go reads invalid UTF-8 inside strings as U+FFFD, and fails on it outside them.
    text = desc.decode("utf-8", errors="replace")
    try:
        doc = _loads(text, no_constant, depth=0)
    except RecursionError:  # Python's decoder recurses once per level; Go's reads 10,000
        depth = _nesting(text)
        if depth > _GO_MAX_DEPTH:  # Go's scanner: "exceeded max depth"
            raise UndecodableNote(f"it nests {depth} deep, past Go's {_GO_MAX_DEPTH}") from None
        doc = _loads(text, no_constant, depth=depth)
    fields: dict[str, Any] = {"format": 0, "cuda": "", "driver": None, "device": None}
    if doc is None:
        return fields  # `null` into a struct: nothing is set, no error
    if not isinstance(doc, _Object):
        raise UndecodableNote("the note is not a JSON object")
    for key, value in doc:
        field = _FIELDS.get(_fold(key))
        if field is None:
            continue  # unknown keys are ignored
        if value is None:
            # null sets a slice to nil and leaves a string or an int as it is (Go
            # encoding/json, "Unmarshal": null into a slice sets it to nil)
            if field in ("driver", "device"):
                fields[field] = None
            continue
        if field == "cuda":
            if not isinstance(value, str) or isinstance(value, _Overflow):
                raise UndecodableNote(f"'{key}' is not a string")
            fields[field] = value
        elif field == "format":
            fields[field] = _go_int(value, key)
        else:
            if not isinstance(value, list) or isinstance(value, _Object):
                raise UndecodableNote(f"'{key}' is not a list of integers")
            fields[field] = [0 if v is None else _go_int(v, key) for v in value]
    return fields


def _loads(text: str, no_constant: Any, *, depth: int) -> Any:
    """``json.loads`` with the recursion limit raised for ``depth`` levels."""
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(limit, depth + 200))
        return json.loads(
            text, object_pairs_hook=_Object, parse_constant=no_constant, parse_int=_int
        )
    except json.JSONDecodeError as exc:
        raise UndecodableNote(str(exc)) from None
    finally:
        sys.setrecursionlimit(limit)


class _Overflow(str):
    """An integer literal too long for Go's int (and past Python's default limit on
    digits converted): Go skips it under an unknown key, and refuses it in a field."""


def _int(literal: str) -> int | _Overflow:
    return int(literal) if len(literal) <= 20 else _Overflow(literal)


def _nesting(text: str) -> int:
    """How deep the arrays and objects of JSON ``text`` nest (the top object is 1),
    counted outside strings as Go's scanner counts them (``maxNestingDepth``)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


class UndecodableNote(InputError, ValueError):
    """The note's JSON is one Go's decoder refuses (a ValueError, as Python's JSON
    decoder's own errors are); read_compat_library records it as the library's
    problem."""


class _Object(list[tuple[str, Any]]):
    """A JSON object's (key, value) pairs in order (Go assigns them in turn)."""


def _go_int(value: object, key: str) -> int:
    # Go parses the number's literal with strconv.ParseInt: 1.0 and 1e3 are not ints.
    if isinstance(value, _Overflow):
        raise UndecodableNote(f"'{key}' holds a {len(value)}-character integer, past Go's int")
    if isinstance(value, bool) or not isinstance(value, int):
        what = repr(value) if isinstance(value, str | float | bool) else "a list or object"
        raise UndecodableNote(f"'{key}' holds {what[:40]}, not an integer")
    if not _INT64[0] <= value <= _INT64[1]:
        raise UndecodableNote(f"'{key}' holds {value}, which overflows Go's int")
    return value


def _fold(key: str) -> str:
    """Go's ``foldName`` (encoding/json/fold.go): ASCII letters upper-cased, other runes
    to the smallest of their simple case-fold orbit. Of those, only U+017F (long s)
    and U+212A (Kelvin sign) fold onto a letter of the field names."""
    out = []
    for ch in key:
        if ch.isascii():
            out.append(ch.upper())
        else:
            out.append({"\u017f": "S", "\u212a": "K"}.get(ch, ch))
    return "".join(out)
