"""What ``ldconfig`` reads from a library: its ELF type, class and machine, and its
``DT_SONAME``, the way glibc's ``elf/readlib.c`` ``process_file`` and
``elf/readelflib.c`` ``process_elf_file`` (glibc 2.36) read them:

- files under the size of an ELF header, not ELF, or not ``ET_DYN`` are skipped;
- the dynamic segment is the **last** ``PT_DYNAMIC`` program header's (each one
  overwrites the last); a file with none, or with ``p_filesz`` 0, is skipped;
- ``DT_STRTAB`` (the first) is turned into a file offset by the first ``PT_LOAD``
  segment that holds its address (else taken as an offset); without it the file
  is skipped;
- ``DT_SONAME`` is a string in that table. ldconfig stops at the first entry after
  which it knows both the SONAME and the libc flavour (from ``PT_INTERP`` or a
  known ``DT_NEEDED``), so with several ``DT_SONAME`` entries which one it keeps
  depends on its table of known libraries: such a file is marked unknown.

It also reads what the dynamic loader searches for the object's own dependencies
and ``dlopen`` calls before its cache: the ``DT_RPATH`` and ``DT_RUNPATH`` strings
(glibc ``elf/dl-load.c`` ``_dl_map_object``, ``decompose_rpath``), for
buildmatrix.ldshadow, of programs too (``ET_EXEC`` as well as ``ET_DYN``: a program
linked ``-no-pie`` is searched by its own ``DT_RPATH``/``DT_RUNPATH``, though ldconfig
skips it). ``DsoInfo.libcuda_search`` keeps those that may be searched for
``libcuda.so.1``: a ``DT_RPATH`` always (it also serves the objects loaded below the
file, and a program's serves the whole process), a ``DT_RUNPATH`` only where the file
may ask for a library itself by a name it does not hold: ``_dl_map_object`` searches
the ``DT_RUNPATH`` of the requesting object only (``loader``: the object whose
``DT_NEEDED`` names the library, or that calls ``dlopen``), so it counts where the
file's dynamic string table names a libcuda (a ``DT_NEEDED``) or a ``dl*`` entry point
that loads or finds one (``dlopen``, ``dlmopen``, ``dlsym``, ``dlvsym``), or cannot be
read whole (over ``_MAX_STRTAB`` bytes, or past the end of the file).

Where this reader cannot follow (a table past the end of the file, a big-endian
file, which an x86-64 or Arm host's ldconfig reads in its own byte order), the file
is marked ``unknown`` and buildmatrix.ldconfig fails closed.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass, field, replace

from buildmatrix.binary.elf import EM_CUDA, ET_DYN, ET_EXEC
from buildmatrix.binary.report import FileReport, Links
from buildmatrix.binary.source import ByteSource, CorruptBinary, read_exact

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME = 0, 1, 5, 10, 14
DT_RPATH, DT_RUNPATH = 15, 29
DT_DEPAUDIT, DT_AUDIT = 0x6FFFFEFB, 0x6FFFFEFC
# A position-independent program, static-pie ones too (elf.h): such a program has
# no PT_INTERP (it relocates itself, glibc csu/static-reloc.c _dl_relocate_static_pie),
# and only this flag tells it from a library; file(1)'s "static-pie linked" reads it.
DT_FLAGS_1, DF_1_PIE = 0x6FFFFFFB, 0x08000000
# Kept among the search paths for libcuda where the file names an audit module
# (DT_AUDIT, DT_DEPAUDIT): glibc's loader (2.32 and later, elf/rtld.c) loads it before
# the program, and its la_objsearch may have the loader map any file for libcuda.so.1.
AUDIT = "$AUDIT"
UNREAD = "$UNREAD"  # a search path string that does not end in the file
_MAX_SONAME = 4096
_MAX_PHNUM = 1 << 16
_MAX_DYNAMIC = 1 << 16
_MAX_STRTAB = 1 << 22
# What a dynamic string table names where its object may ask the loader for
# libcuda.so.1 itself: a DT_NEEDED of it, or an entry point that loads by name (the
# substring also finds __libc_dlopen_mode and versioned names).
_ASKS = (b"libcuda", b"dlopen", b"dlmopen", b"dlsym", b"dlvsym")
# A dynamic string table is searched for an extension module's init function in
# pieces of this size (a C++ library's runs to tens of megabytes).
_PIECE = 1 << 20
_MAX_NEEDED = 4096  # DT_NEEDED entries kept per file; a linker writes a few dozen


@dataclass(frozen=True, kw_only=True)
class DsoInfo:
    """``soname``: DT_SONAME (None: none); ``skip``: why ldconfig skips the file;
    ``unknown``: why what ldconfig reads cannot be told; ``machine``: class, byte
    order and e_machine, for telling files of different hosts apart."""

    soname: str | None = None
    skip: str | None = None
    unknown: str | None = None
    machine: str = ""
    search: tuple[str, ...] = ()  # DT_RPATH and DT_RUNPATH strings (UNREAD: unended)
    libcuda_search: tuple[str, ...] = ()  # those the loader may search for libcuda.so.1
    # How the file is loaded (Links); empty for a file the loader does not load.
    links: Links = field(default_factory=Links)


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchPaths:
    """An ELF file of an image with ``DT_RPATH`` or ``DT_RUNPATH`` (``search``: the
    strings as written, ``$ORIGIN`` unexpanded, () where it has none), or one without
    device code that loads others (``links``: how it is loaded, for
    buildmatrix.optional), and its device code, if any (which carries its links)."""

    path: str
    search: tuple[str, ...]
    code: FileReport | None = None
    links: Links | None = None


def read_dso(src: ByteSource, *, name: str = "") -> DsoInfo:
    """What ldconfig reads from ``src`` (an ELF file), and how it is loaded
    (:class:`Links`; ``name``: the file's name, for the extension module's
    init function)."""
    try:
        info = _read(src, name=name)
    except CorruptBinary as exc:
        return DsoInfo(unknown=str(exc), links=Links(unread=str(exc)))
    if info.unknown is not None and info.links.unread is None:
        return replace(info, links=replace(info.links, unread=info.unknown))
    return info


def _read(src: ByteSource, *, name: str) -> DsoInfo:
    ident = read_exact(src, 0, 16, what="ELF identification")
    bits = {1: 32, 2: 64}.get(ident[4])
    if bits is None or ident[5] not in (1, 2):
        return DsoInfo(skip="its ELF class or byte order is unknown")
    order = "<" if ident[5] == 1 else ">"
    hdr = struct.Struct(order + ("HHIIIIIHHHHHH" if bits == 32 else "HHIQQQIHHHHHH"))
    if src.size < 16 + hdr.size:
        return DsoInfo(skip="it is smaller than an ELF header")
    e_type, e_machine, _v, _entry, phoff, *_rest = hdr.unpack(
        read_exact(src, 16, hdr.size, what="ELF header")
    )
    phnum = _rest[4]
    machine = f"ELF{bits} {'LSB' if order == '<' else 'MSB'} machine {e_machine}"
    if order == ">":
        return DsoInfo(unknown="a big-endian ELF file", machine=machine)
    if e_machine == EM_CUDA:  # a cubin: device code the driver loads, no host program
        return DsoInfo(skip="it is a cubin (device code, EM_CUDA)", machine=machine)
    if e_type not in (ET_DYN, ET_EXEC):
        return DsoInfo(skip=f"it is not a shared object (ELF type {e_type})", machine=machine)
    try:
        info = _dynamic(
            src, order=order, bits=bits, phoff=phoff, phnum=phnum, machine=machine, name=name
        )
    except CorruptBinary as exc:
        if e_type != ET_EXEC:
            raise
        info = DsoInfo(links=Links(program=True, unread=str(exc)))
    if e_type == ET_EXEC:  # ldconfig skips a program; its loader reads its search paths
        why = f"it is not a shared object (ELF type {e_type})"
        return DsoInfo(
            skip=why,
            machine=machine,
            search=info.search,
            libcuda_search=info.libcuda_search,
            links=replace(info.links, program=True),
        )
    return info


def _dynamic(
    src: ByteSource, *, order: str, bits: int, phoff: int, phnum: int, machine: str, name: str
) -> DsoInfo:
    phdr = struct.Struct(order + ("IIIIIIII" if bits == 32 else "IIQQQQQQ"))
    if phnum > _MAX_PHNUM:  # ldconfig steps by sizeof(Phdr), whatever e_phentsize says
        why = "its program header table is malformed"
        return DsoInfo(unknown=why, machine=machine, links=Links(unread=why))
    table = read_exact(src, phoff, phnum * phdr.size, what="ELF program header table")
    loads, dynamic, interp = _segments(table, phdr, bits=bits, phnum=phnum)
    if dynamic[1] == 0:  # linked statically: it loads no other file
        return DsoInfo(
            skip="it has no dynamic segment", machine=machine, links=Links(program=interp)
        )
    dyn = struct.Struct(order + ("iI" if bits == 32 else "qQ"))
    entries = _dynamic_entries(src, dynamic[0], dyn)
    if entries is None:
        why = "its dynamic section has no end in reach"
        return DsoInfo(unknown=why, machine=machine, links=Links(program=interp, unread=why))
    program = interp or any(tag == DT_FLAGS_1 and val & DF_1_PIE for tag, val in entries)
    strtab = next((val for tag, val in entries if tag == DT_STRTAB), None)
    if strtab is None:  # then no DT_NEEDED either: its names are offsets into that table
        why = "its dynamic section has no DT_STRTAB"
        return DsoInfo(skip=why, machine=machine, links=Links(program=program))
    base = next((vaddr - off for off, vaddr, size in loads if 0 <= strtab - vaddr < size), 0)
    links = _links(src, entries, strtab - base, program=program, name=name)
    # Interned: the many files of an image that share a search path share its string.
    tagged = [
        (tag, sys.intern(_string(src, strtab - base + val) or UNREAD))
        for tag, val in entries
        if tag in (DT_RPATH, DT_RUNPATH)
    ]
    search = tuple(s for _tag, s in tagged)
    asks = any(tag == DT_RUNPATH for tag, _s in tagged) and _asks(src, entries, strtab - base)
    kept = tuple(s for tag, s in tagged if tag == DT_RPATH or asks)
    if any(tag in (DT_AUDIT, DT_DEPAUDIT) for tag, _val in entries):
        kept = (*kept, AUDIT)
    found = DsoInfo(machine=machine, search=search, libcuda_search=kept, links=links)
    sonames = [val for tag, val in entries if tag == DT_SONAME]
    if len(sonames) > 1:
        return replace(found, unknown="it has several DT_SONAME entries")
    if not sonames:
        return found
    soname = _string(src, strtab - base + sonames[0])
    if soname is None:
        return replace(found, unknown="its DT_SONAME string does not end in the file")
    return replace(found, soname=soname, links=replace(links, soname=soname))


def _links(
    src: ByteSource, entries: list[tuple[int, int]], at: int, *, program: bool, name: str
) -> Links:
    """The file's :class:`Links` but its SONAME: its DT_NEEDED strings (table at file
    offset ``at``) and whether it exports the init function of the extension module
    ``name`` would be (``PyInit_`` and the name up to its first dot, Python's
    ``importlib.machinery.EXTENSION_SUFFIXES`` all end in ``.so``)."""
    needed: list[str] = []
    unread = None
    for tag, val in entries:
        if tag != DT_NEEDED:
            continue
        if len(needed) >= _MAX_NEEDED:
            unread = f"it has over {_MAX_NEEDED} DT_NEEDED entries"
            break
        text = _string(src, at + val)
        if text is None:
            unread = "a DT_NEEDED string does not end in the file"
            continue
        needed.append(sys.intern(text.rpartition("/")[2]))
    base = name.rpartition("/")[2]
    module = False
    if base.endswith(".so") and base.partition(".")[0]:
        size = next((val for tag, val in entries if tag == DT_STRSZ), None)
        symbol = b"PyInit_" + base.partition(".")[0].encode("utf-8", "surrogateescape") + b"\0"
        # A table that cannot be read whole may hold the symbol: taken as a module
        # (judged, never left out).
        module = size is None or not 0 <= at <= src.size - size or _holds(src, at, size, symbol)
    return Links(
        needed=tuple(dict.fromkeys(needed)), program=program, python_module=module, unread=unread
    )


def _holds(src: ByteSource, at: int, size: int, word: bytes) -> bool:
    """Whether the ``size`` bytes at ``at`` hold ``word`` (read in pieces)."""
    end, overlap = at + size, len(word) - 1
    while at < end:
        piece = read_exact(src, at, min(_PIECE, end - at), what="dynamic string table")
        if word in piece:
            return True
        at += max(len(piece) - overlap, 1)
        if at + overlap >= end:
            return False
    return False


def _asks(src: ByteSource, entries: list[tuple[int, int]], at: int) -> bool:
    """Whether the object may ask the loader for ``libcuda.so.1`` itself (its own
    ``DT_RUNPATH`` then searched): its dynamic string table (``DT_STRSZ`` bytes at
    ``at``) names one of :data:`_ASKS`, or cannot be read whole."""
    size = next((val for tag, val in entries if tag == DT_STRSZ), None)
    if size is None or size > _MAX_STRTAB or not 0 <= at <= src.size - size:
        return True
    table = read_exact(src, at, size, what="dynamic string table")
    return any(word in table for word in _ASKS)


def _string(src: ByteSource, start: int) -> str | None:
    """The NUL-ended string at ``start`` (None: none ends within reach)."""
    if not 0 <= start < src.size:
        return None
    raw = read_exact(src, start, min(_MAX_SONAME, src.size - start), what="dynamic string")
    if b"\0" not in raw:
        return None
    return raw[: raw.index(b"\0")].decode("utf-8", "surrogateescape")


def _segments(
    table: bytes, phdr: struct.Struct, *, bits: int, phnum: int
) -> tuple[list[tuple[int, int, int]], tuple[int, int], bool]:
    """(offset, vaddr, filesz) of each PT_LOAD and (offset, filesz) of the last
    PT_DYNAMIC ((0, 0) if none) in the program header table ``table``, and whether
    it has a PT_INTERP."""
    loads: list[tuple[int, int, int]] = []
    dynamic = (0, 0)
    interp = False
    for i in range(phnum):
        v = phdr.unpack_from(table, i * phdr.size)
        p_type, p_offset, p_vaddr, p_filesz = (
            (v[0], v[1], v[2], v[4]) if bits == 32 else (v[0], v[2], v[3], v[5])
        )
        if p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
        elif p_type == PT_LOAD:
            loads.append((p_offset, p_vaddr, p_filesz))
        interp = interp or p_type == PT_INTERP
    return loads, dynamic, interp


def _dynamic_entries(src: ByteSource, at: int, dyn: struct.Struct) -> list[tuple[int, int]] | None:
    """(tag, value) of each dynamic entry from ``at`` up to DT_NULL; None where no
    DT_NULL comes within :data:`_MAX_DYNAMIC` entries."""
    entries: list[tuple[int, int]] = []
    while len(entries) < _MAX_DYNAMIC:
        tag, val = dyn.unpack(read_exact(src, at, dyn.size, what="dynamic section"))
        if tag == DT_NULL:
            return entries
        entries.append((tag, val))
        at += dyn.size
    return None
