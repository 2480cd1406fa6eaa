"""Find CUDA device code in files and folders: which SASS and PTX each file holds."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from buildmatrix.binary.archive import is_archive, members
from buildmatrix.binary.compat_note import (
    LIBCUDA,
    NOTE_SECTION,
    CompatLibrary,
    named_compat_driver,
    read_compat_library,
)
from buildmatrix.binary.cudart import CudaRuntime, read_runtime
from buildmatrix.binary.dynamic import SearchPaths, read_dso
from buildmatrix.binary.dynrel import relocation_into
from buildmatrix.binary.elf import (
    EM_CUDA,
    ET_DYN,
    ET_EXEC,
    SHF_ALLOC,
    ElfInfo,
    Layout,
    Section,
    is_elf,
    read_elf,
    read_layout,
)
from buildmatrix.binary.embedded import data_regions, embedded_code
from buildmatrix.binary.fatbin import (
    FATBIN_MAGIC_BYTES,
    EntryKind,
    FatbinEntry,
    container_spans,
    parse_fatbin,
)
from buildmatrix.binary.kernels import cubin_entry, read_compressed
from buildmatrix.binary.ldconf_file import ConfFile, is_conf, read_conf
from buildmatrix.binary.ptx import PTX_HEAD, looks_like_ptx, ptx_target, ptx_undecided
from buildmatrix.binary.registered import wrapped_containers
from buildmatrix.binary.report import FileReport, ScanProblem
from buildmatrix.binary.source import ByteSource, CorruptBinary, FileSource
from buildmatrix.binary.walk import walk
from buildmatrix.errors import InputError

# The fatbinary the CUDA runtime registers at load time is .nv_fatbin; relocatable
# device code (-rdc=true) sits in __nv_relfatbin and is used only where there is no
# executable one (an object file). cuobjdump makes the same choice by default.
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
WRAPPER_SECTION = ".nvFatBinSegment"  # the runtime's __fatBinC_Wrapper_t records
# The bytes that tell an ELF file, fatbinary, archive or PTX text from any other file;
# a text that is only comments so far is read further (read_head).
_HEAD = 64
# Static archives inside static archives: no linker reads them, but a hostile file can
# nest them to exhaust the stack (400 deep did); 16 is far above any real build.
MAX_ARCHIVE_NESTING = 16


def might_hold_code(head: bytes, path: str) -> bool:
    """Whether a file whose first bytes are ``head`` (:func:`read_head`) may hold device
    code: an ELF file, a fatbinary, a static archive or PTX text (the kinds
    :func:`inspect_source` reads; the image readers skip every other file unread)."""
    return (
        is_elf(head) or head[:4] == FATBIN_MAGIC_BYTES or is_archive(head) or _maybe_ptx(head, path)
    )


def _maybe_ptx(head: bytes, path: str) -> bool:
    """PTX by its name or content (:func:`looks_like_ptx`), or a text still only
    comments after all :func:`read_head` reads: it may be PTX behind them, which the
    PTX reader then refuses past its head (fail closed), as a .ptx file's."""
    return looks_like_ptx(head, path) or (len(head) >= PTX_HEAD and ptx_undecided(head))


def worth_reading(head: bytes, path: str) -> bool:
    """Whether the image readers read a file: one that may hold device code, or one
    of the loader's configuration files (buildmatrix.binary.ldconf_file), whatever
    its size."""
    return is_conf(path) or (len(head) >= 4 and might_hold_code(head, path))


def read_head(read_at: Callable[[int, int], bytes]) -> bytes:
    """The first bytes of a file that :func:`worth_reading` and :func:`inspect_source`
    judge it by, ``read_at(offset, n)`` reading it: 64, and where those are only
    whitespace and comments (a licence header before a PTX text's ``.version``,
    buildmatrix.binary.ptx.ptx_undecided) 4 KiB, then up to 64 KiB (PTX_HEAD, as far as
    ptx_target reads the directives). Only texts that open with a comment are read
    further, each in one more read of one or a few pages; ELF files, archives and
    other files are judged by 64 bytes as before."""
    head, want = b"", _HEAD
    while True:
        while len(head) < want and (more := read_at(len(head), want - len(head))):
            head += more
        if len(head) < want or want >= PTX_HEAD or not ptx_undecided(head):
            return head
        want = min(want * 64, PTX_HEAD)


def inspect_source(
    src: ByteSource, *, path: str, head: bytes | None = None, deep: bool = True, nesting: int = 0
) -> FileReport | None:
    """The device code in one file, or None when it has none.

    ``deep``: also search an ELF file's data for fatbinaries and cubins that no
    section or wrapper names (buildmatrix.binary.embedded), and decompress the
    compressed cubins the verdict needs (buildmatrix.binary.kernels). ``nesting``: how
    many static archives hold this file (at most ``MAX_ARCHIVE_NESTING``).
    """
    if head is None:
        head = read_head(src.read_at)
    if is_archive(head):
        if nesting >= MAX_ARCHIVE_NESTING:
            raise InputError(
                f"{path}: static archives nested more than {MAX_ARCHIVE_NESTING} deep; no "
                "linker or loader reads archives inside archives, so the file is refused "
                "(docs/security.md, Bounds). Nothing was checked."
            )
        return _archive(src, path, nesting=nesting)
    if is_elf(head):
        info = read_elf(src)
        if info.machine == EM_CUDA:
            return FileReport(path=path, format="cubin", entries=(cubin_entry(src, info),))
        fatbins, rdc = _fatbin_sections(info)
        wrappers = [s for s in info.sections if s.name == WRAPPER_SECTION]
        spans, layout = _registered(src, info, wrappers, rdc, deep=deep)
        held = _held(src, layout, fatbins) if spans and layout is not None else None
        entries: list[FatbinEntry] = []
        from_sections = bool(fatbins) and (
            not spans or (held is not None and held.issuperset(spans))
        )
        if from_sections:
            for s in fatbins:
                base = 1 + max((e.container for e in entries), default=-1)
                where = f"section {s.name}"
                entries += parse_fatbin(src, s.offset, s.size, where=where, first_container=base)
            covered = [(s.offset, s.size) for s in (*fatbins, *rdc, *wrappers)]
        else:
            # The runtime registers what the wrappers point at; a section that does not
            # hold those bytes is no account of the code (docs/security.md).
            entries = _wrapped_entries(src, spans)
            covered = [*spans, *((s.offset, s.size) for s in (*rdc, *wrappers))]
        if deep:
            regions = data_regions(src, info, skip=covered)
            base = 1 + max((e.container for e in entries), default=-1)
            entries += embedded_code(src, regions, first_container=base)
            entries = read_compressed(src, entries)
        if not fatbins and not entries:
            return None
        if layout is not None:
            judged = [(s.offset, s.size) for s in fatbins] if from_sections else list(spans)
            _unrelocated(src, layout, judged + [(e.offset, e.size) for e in entries if e.embedded])
        return FileReport(path=path, format="elf", entries=tuple(entries))
    if head[:4] == FATBIN_MAGIC_BYTES:
        entries = parse_fatbin(src, 0, src.size, where="fatbin file")
        if deep:
            entries = read_compressed(src, entries)
        return FileReport(path=path, format="fatbin", entries=tuple(entries))
    if _maybe_ptx(head, path):
        arch, isa = ptx_target(src)
        entry = FatbinEntry(
            kind=EntryKind.PTX, arch=arch, ptx_isa=isa, compressed=False, size=src.size, offset=0
        )
        return FileReport(path=path, format="ptx", entries=(entry,))
    return None


def inspect_image_file(
    src: ByteSource, *, path: str, head: bytes, deep: bool = True
) -> FileReport | CompatLibrary | ConfFile | SearchPaths | CudaRuntime | None:
    """A file of an image's filesystem, for its device code. A file the container
    toolkit may take for a CUDA forward-compatibility driver (an ELF file named
    ``libcuda.so.*.*``, or one with the driver's note section, which a hard link may
    put in the compat folder under that name) is also read for its note
    (buildmatrix.forward: which one the toolkit uses is known on the final view).
    A loader configuration file is kept as text (buildmatrix.binary.ldconf_file), and
    an ELF file's ``DT_RPATH``/``DT_RUNPATH`` and how it is loaded: its SONAME,
    DT_NEEDED names, whether it is a program or a Python extension module
    (buildmatrix.binary.dynamic.Links). An ELF file that is or holds a CUDA runtime
    (buildmatrix.binary.cudart) is a :class:`CudaRuntime` around what is found
    otherwise."""
    if is_conf(path):
        return read_conf(src, path)
    if len(head) < 4:
        return None
    code = inspect_source(src, path=path, head=head, deep=deep)
    if not is_elf(head):
        return code
    # ldconfig takes libcuda.so.1 by SONAME (buildmatrix.ldconfig): a file named
    # libcuda.so* or whose DT_SONAME is one is recorded whatever else its name is.
    dso = read_dso(src, name=path)
    if (
        named_compat_driver(head, path)
        or path.rpartition("/")[2].startswith(LIBCUDA)
        or (dso.soname or "").startswith(LIBCUDA)
        or read_elf(src).section(NOTE_SECTION) is not None
    ):
        lib = read_compat_library(src, path=path, code=code)
        return replace(
            lib, soname=dso.soname, ld_skip=dso.skip, ld_unknown=dso.unknown, machine=dso.machine
        )
    # How it is loaded matters where it holds device code or loads other files
    # (buildmatrix.optional: which files always load).
    links = dso.links
    if code is not None:
        code = replace(code, links=links)
    found: FileReport | SearchPaths | None = code
    if code is None and (links.needed or links.program or links.python_module or links.unread):
        found = SearchPaths(path=path, search=dso.libcuda_search, links=links)
    elif dso.libcuda_search:
        found = SearchPaths(path=path, search=dso.libcuda_search, code=code)
    # The CUDA runtime the file is or links in, whatever its name (binary.cudart).
    # The fatbinary sections are device code, not the runtime's data: not searched.
    info = read_elf(src)
    skip = [(s.offset, s.size) for s in info.sections if s.name in FATBIN_SECTIONS]
    runtime = read_runtime(src, path=path, info=info, skip=skip, inner=found)
    return runtime if runtime is not None else found


def _archive(src: ByteSource, path: str, *, nesting: int) -> FileReport | None:
    """A static archive: the device code of every member object, as cuobjdump lists
    it. The containers of each member keep their own numbers after the previous
    member's, so each translation unit stays one unit."""
    entries: list[FatbinEntry] = []
    for member in members(src):
        report = inspect_source(member.source, path=f"{path}({member.name})", nesting=nesting + 1)
        if report is None:
            continue
        base = 1 + max((e.container for e in entries), default=-1)
        entries += [replace(e, container=base + e.container) for e in report.entries]
    return FileReport(path=path, format="archive", entries=tuple(entries)) if entries else None


def _fatbin_sections(info: ElfInfo) -> tuple[list[Section], list[Section]]:
    """Every section named .nv_fatbin (a second one too), else every __nv_relfatbin;
    and the __nv_relfatbin sections beside .nv_fatbin ones."""
    found = [
        [s for s in info.sections if s.name == name and s.size > 0] for name in FATBIN_SECTIONS
    ]
    return (found[0], found[1]) if found[0] else (found[1], [])


def _registered(
    src: ByteSource, info: ElfInfo, wrappers: list[Section], rdc: list[Section], *, deep: bool
) -> tuple[list[tuple[int, int]], Layout | None]:
    """(offset, size) of each container the runtime registers through a wrapper, in
    a linked file (an object file's pointers are set at link time). Wrappers are
    searched in the wrapper sections, and with the section headers stripped or
    (``deep``) in any case in the writable loadable segments (the loader maps those
    whatever the headers say). With -rdc, nvcc's device-link wrapper (version 2,
    crt/link.stub) registers the linked .nv_fatbin, and the wrappers of the units
    point at their relocatable code in __nv_relfatbin, which is left out, as
    cuobjdump leaves it out."""
    if info.elf_type not in (ET_EXEC, ET_DYN):
        return [], None
    layout = read_layout(src)
    regions = [(s.offset, s.size) for s in wrappers]
    if not info.sections or deep:
        regions += [(s.offset, s.filesz) for s in layout.segments if s.writable]
    found = wrapped_containers(src, layout, sorted(set(regions)), machine=info.machine)
    relocatable: set[tuple[int, int]] = set()
    if any(version == 2 for *_, version in found):
        relocatable = _held(src, layout, rdc) or set()
    spans = [(at, size) for at, size, _v in found if (at, size) not in relocatable]
    return list(dict.fromkeys(spans)), layout


def _held(src: ByteSource, layout: Layout, sections: list[Section]) -> set[tuple[int, int]] | None:
    """The containers of the sections, or None when one is not loaded (allocated and
    inside a loadable segment)."""
    held: set[tuple[int, int]] = set()
    for s in sections:
        inside = any(
            g.offset <= s.offset and s.offset + s.size <= g.offset + g.filesz
            for g in layout.segments
        )
        if not s.flags & SHF_ALLOC or not inside:
            return None
        held.update(container_spans(src, s.offset, s.size, where=f"section {s.name}"))
    return held


def _unrelocated(src: ByteSource, layout: Layout, code: list[tuple[int, int]]) -> None:
    """Refuse a file in which the dynamic loader rewrites device code: a relocation
    whose target lies in the bytes judged here (a fatbinary section, a container a
    wrapper points at, embedded code) changes them before the runtime hands them to
    the driver (an entry's arch, a cubin's e_flags), so the file's bytes are no
    account of what runs (docs/security.md, Device code that tries not to be seen)."""
    found = relocation_into(src, layout, code)
    if found is not None:
        raise CorruptBinary(
            f"{src.name}: a dynamic relocation ({found[1]}) rewrites the device code at "
            f"address {found[0]:#x} when the file is loaded; the code the driver is given "
            "is not the code in the file, so the file is refused (docs/security.md, "
            "Device code that tries not to be seen)."
        )


def _wrapped_entries(src: ByteSource, spans: list[tuple[int, int]]) -> list[FatbinEntry]:
    entries: list[FatbinEntry] = []
    for index, (offset, size) in enumerate(spans):
        where = f"fatbinary at {offset:#x}, found through the runtime's wrapper"
        for e in parse_fatbin(src, offset, size, where=where):
            entries.append(replace(e, container=index))
    return entries


def inspect_file(path: Path, *, display: str | None = None, deep: bool = True) -> FileReport | None:
    """Open and inspect one file; a missing or unreadable file is an input error."""
    shown = display if display is not None else str(path)
    try:
        # O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever; the
        # file is refused below as not regular, and reads of regular files ignore it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{shown}: cannot open: {exc.strerror}.") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{shown}: not a regular file.")
        return inspect_source(FileSource(fd, name=shown), path=shown, deep=deep)
    finally:
        os.close(fd)


def scan_tree(
    root: Path,
    *,
    on_file: Callable[[str, bool], None] | None = None,
    on_link: Callable[[str, str | None], None] | None = None,
    on_folder: Callable[[str], None] | None = None,
    compat: bool = False,
    deep: bool = True,
) -> Iterator[FileReport | CompatLibrary | ConfFile | SearchPaths | CudaRuntime | ScanProblem]:
    """Every file with device code under ``root``, plus a problem for each corrupt one
    and each folder that cannot be listed (it may hold device code, so it is never
    skipped); with ``compat`` (an image root), each CUDA forward-compatibility driver
    (``…/compat/libcuda.so.X.Y``) is read for its note instead of its code.

    ``on_file(path, has_code)`` is called for every regular file (for progress),
    ``on_link(path, target)`` for every symbolic link (target None where it cannot be
    read), ``on_folder(path)`` for every folder. Links are never followed: a link
    inside the tree points at a file the walk reaches anyway, and a link out of the
    tree must not be read.
    """
    for full, rel, entry in walk(root):
        if isinstance(entry, OSError):
            yield ScanProblem(path=rel or ".", message=f"cannot list folder: {entry.strerror}")
            continue
        if entry.is_symlink():
            if on_link is not None:
                on_link(rel, _link_target(full))
            continue
        if entry.is_dir(follow_symlinks=False):
            if on_folder is not None:
                on_folder(rel)
            continue
        if not entry.is_file(follow_symlinks=False):
            continue
        result = _scan_file(full, rel, compat=compat, deep=deep)
        if on_file is not None:
            on_file(rel, isinstance(result, FileReport))
        if result is not None:
            yield result


def _scan_file(
    full: str, rel: str, *, compat: bool, deep: bool
) -> FileReport | CompatLibrary | ConfFile | SearchPaths | CudaRuntime | ScanProblem | None:
    """What the regular file ``full`` (``rel`` in reports) holds, for
    :func:`scan_tree`: None where it holds no device code, a problem where it cannot
    be opened or read, or is corrupt. Opened without following a link."""
    result: FileReport | CompatLibrary | ConfFile | SearchPaths | CudaRuntime | ScanProblem | None
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        result = ScanProblem(path=rel, message=f"cannot open: {exc.strerror}")
    else:
        try:
            src = FileSource(fd, name=rel)
            head = read_head(src.read_at)
            if compat:
                result = inspect_image_file(src, path=rel, head=head, deep=deep)
            else:
                result = (
                    inspect_source(src, path=rel, head=head, deep=deep) if len(head) >= 4 else None
                )
        except CorruptBinary as exc:
            result = ScanProblem(path=rel, message=str(exc))
        except OSError as exc:
            result = ScanProblem(path=rel, message=f"cannot read: {exc.strerror}")
        finally:
            os.close(fd)
    return result


def _link_target(full: str) -> str | None:
    try:
        return str(Path(full).readlink())
    except OSError:
        return None
