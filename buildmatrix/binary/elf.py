"""A minimal ELF section-header reader (ELF32/ELF64, either byte order).

Reads the file header, the section header table and the section-name string
table: three bounded reads, whatever the size of the file. pyelftools does the
same job but builds Python objects for every header on the way; this reader is
about 20x faster per file, which matters when an image holds thousands of
libraries (benchmarks/elf_reader.py; numbers in docs/inspect.md).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from buildmatrix.binary.source import ByteSource, CorruptBinary, read_exact

ELF_MAGIC = b"\x7fELF"
# e_machine values (the ELF specification's machine numbers; glibc elf.h): host code
# of an x86-64 node, of an Arm node (Grace: GH200, GB200, GB10), and a CUDA cubin.
# The reader takes any machine: a fatbinary is found by its sections, whatever the host.
EM_X86_64 = 62
EM_AARCH64 = 183
EM_CUDA = 190
SHT_NOBITS = 8
ET_EXEC, ET_DYN = 2, 3
SHN_XINDEX = 0xFFFF
# Linkers emit a few dozen sections, -ffunction-sections objects up to some 100,000;
# a claim far beyond that is a crafted header (it would drive a huge table read).
MAX_SECTIONS = 1 << 20
# The section header table and the section-name table are each read in one piece; a
# linker's are kilobytes (a few dozen names), so a claim beyond 16 MiB
# is refused rather than read (docs/security.md, "Bounds").
MAX_TABLE = 16 << 20

# e_type, e_machine, e_version, e_entry, e_phoff, e_shoff, e_flags, e_ehsize,
# e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
_EHDR = {32: "HHIIIIIHHHHHH", 64: "HHIQQQIHHHHHH"}
# sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info,
# sh_addralign, sh_entsize
_SHDR = {32: "IIIIIIIIII", 64: "IIQQQQIIQQ"}
_SHDR_SIZE = {32: 40, 64: 64}


SHT_PROGBITS = 1
SHT_NOTE = 7
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4


class Section(NamedTuple):
    """A section header, named. A tuple rather than a frozen dataclass: a CUDA
    library's compressed cubins hold about a million sections between them, each
    read when its kernels are listed (binary/kernels.py), and a frozen dataclass
    takes five times as long to make (2.9 against 0.5 microseconds here)."""

    name: str
    type: int
    offset: int
    size: int
    flags: int = 0
    addralign: int = 0
    link: int = 0  # sh_link: for a symbol table, the index of its string table


@dataclass(frozen=True, kw_only=True)
class ElfInfo:
    elf_type: int
    machine: int
    abi_version: int
    osabi: int
    flags: int
    sections: tuple[Section, ...]

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)


def is_elf(head: bytes) -> bool:
    return head[:4] == ELF_MAGIC


def _check_table(src: ByteSource, what: str, size: int) -> None:
    if size > MAX_TABLE:
        raise CorruptBinary(
            f"{src.name}: its ELF {what} claims {size} bytes; buildmatrix reads at most "
            f"{MAX_TABLE >> 20} MiB of it (a linker writes kilobytes), so the file is "
            "refused as malformed. Rebuild it with a standard toolchain."
        )


def read_elf(src: ByteSource) -> ElfInfo:
    """Read the section table of an ELF file; :class:`CorruptBinary` if it is broken."""
    ident = read_exact(src, 0, 16, what="ELF identification")
    if ident[:4] != ELF_MAGIC:
        raise CorruptBinary(f"{src.name}: not an ELF file (bad magic).")
    bits = {1: 32, 2: 64}.get(ident[4])
    order = {1: "<", 2: ">"}.get(ident[5])
    if bits is None or order is None:
        raise CorruptBinary(f"{src.name}: unknown ELF class {ident[4]} or byte order {ident[5]}.")
    ehdr = struct.Struct(order + _EHDR[bits])
    (
        e_type,
        machine,
        _ver,
        _entry,
        _phoff,
        shoff,
        flags,
        _ehsize,
        _phentsize,
        _phnum,
        shentsize,
        shnum,
        shstrndx,
    ) = ehdr.unpack(read_exact(src, 16, ehdr.size, what="ELF header"))
    if shoff == 0:
        return ElfInfo(
            elf_type=e_type,
            machine=machine,
            abi_version=ident[8],
            osabi=ident[7],
            flags=flags,
            sections=(),
        )
    raw, shstrndx = _section_headers(
        src,
        order=order,
        bits=bits,
        shoff=shoff,
        shentsize=shentsize,
        shnum=shnum,
        shstrndx=shstrndx,
    )
    return ElfInfo(
        elf_type=e_type,
        machine=machine,
        abi_version=ident[8],
        osabi=ident[7],
        flags=flags,
        sections=_named_sections(src, raw, shstrndx),
    )


def _section_headers(
    src: ByteSource, *, order: str, bits: int, shoff: int, shentsize: int, shnum: int, shstrndx: int
) -> tuple[list[tuple[int, ...]], int]:
    """The raw section headers (``Elf_Shdr`` fields) at ``shoff``, their count checked,
    and the section-name table's index (both from section header 0 where extended)."""
    shdr = struct.Struct(order + _SHDR[bits])
    if shentsize < _SHDR_SIZE[bits]:
        raise CorruptBinary(f"{src.name}: ELF section header size {shentsize} is too small.")
    if shnum == 0 or shstrndx == SHN_XINDEX:
        # Extended numbering: the real values live in section header 0.
        first = shdr.unpack(read_exact(src, shoff, shdr.size, what="ELF section header 0"))
        shnum = shnum or first[5]
        shstrndx = first[6] if shstrndx == SHN_XINDEX else shstrndx
    if shnum > MAX_SECTIONS:
        raise CorruptBinary(
            f"{src.name}: claims {shnum} ELF sections; no real binary has over {MAX_SECTIONS}."
        )
    _check_table(src, "section header table", shnum * shentsize)
    table = read_exact(src, shoff, shnum * shentsize, what="ELF section header table")
    if shentsize == shdr.size:  # every linker's: one pass in C (a cubin has ~150)
        return list(shdr.iter_unpack(table)), shstrndx
    return [shdr.unpack_from(table, i * shentsize) for i in range(shnum)], shstrndx


def _named_sections(
    src: ByteSource, raw: list[tuple[int, ...]], shstrndx: int
) -> tuple[Section, ...]:
    """The sections of ``raw``, named from the section-name table ``raw[shstrndx]``."""
    if shstrndx >= len(raw):
        raise CorruptBinary(f"{src.name}: section-name table index {shstrndx} is out of range.")
    str_off, str_size = raw[shstrndx][4], raw[shstrndx][5]
    _check_table(src, "section-name table", str_size)
    # decoded once (latin-1 maps each byte to one character, so offsets stay byte
    # offsets): the table of a cubin read for its kernels names ~150 sections
    names = read_exact(src, str_off, str_size, what="ELF section-name table").decode("latin-1")
    known = len(names)
    make = tuple.__new__  # Section(...) without NamedTuple's keyword handling
    sections = []
    for name_off, sh_type, sh_flags, _a, offset, size, link, _info, align, _entsize in raw:
        end = names.find("\0", name_off) if name_off < known else -1
        name = names[name_off:end] if end >= 0 else ""
        stored = 0 if sh_type == SHT_NOBITS else size
        # name, type, offset, size, flags, addralign, link (positional: the fast way)
        sections.append(make(Section, (name, sh_type, offset, stored, sh_flags, align, link)))
    return tuple(sections)


PT_LOAD = 1
PT_DYNAMIC = 2
PF_X = 1
PF_W = 2
# p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align (ELF64);
# p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align (ELF32)
_PHDR = {32: "IIIIIIII", 64: "IIQQQQQQ"}
MAX_SEGMENTS = 1 << 16  # e_phnum is 16 bits (PN_XNUM aside, which loaders reject)


@dataclass(frozen=True, kw_only=True)
class Segment:
    """A loadable segment: where its bytes are in the file and where they are mapped."""

    offset: int
    vaddr: int
    filesz: int
    writable: bool
    executable: bool = False


@dataclass(frozen=True, kw_only=True)
class Layout:
    bits: int
    order: str
    segments: tuple[Segment, ...]
    # The address of PT_DYNAMIC, where the loader finds the relocations; its sizes are
    # no bound to the loader (glibc elf/dl-load.c reads from p_vaddr to DT_NULL)
    dynamic: int | None = None

    def address(self, offset: int) -> int | None:
        """The address ``offset`` of the file is mapped at, if a segment maps it."""
        for s in self.segments:
            if s.offset <= offset < s.offset + s.filesz:
                return s.vaddr + (offset - s.offset)
        return None

    def file_offset(self, vaddr: int, size: int) -> int | None:
        """The file offset of ``size`` bytes mapped at ``vaddr``, if a segment holds them."""
        for s in self.segments:
            if s.vaddr <= vaddr and vaddr + size <= s.vaddr + s.filesz:
                return s.offset + (vaddr - s.vaddr)
        return None


def read_layout(src: ByteSource) -> Layout:
    """The loadable segments (program headers) of an ELF file: what the dynamic loader
    maps, with or without section headers. Read only when section names do not say
    where the device code is."""
    ident = read_exact(src, 0, 16, what="ELF identification")
    bits = {1: 32, 2: 64}.get(ident[4])
    order = {1: "<", 2: ">"}.get(ident[5])
    if ident[:4] != ELF_MAGIC or bits is None or order is None:
        raise CorruptBinary(f"{src.name}: not an ELF file.")
    ehdr = struct.Struct(order + _EHDR[bits])
    fields = ehdr.unpack(read_exact(src, 16, ehdr.size, what="ELF header"))
    phoff, phentsize, phnum = fields[4], fields[8], fields[9]
    phdr = struct.Struct(order + _PHDR[bits])
    if phnum == 0:
        return Layout(bits=bits, order=order, segments=())
    if phentsize < phdr.size or phnum > MAX_SEGMENTS:
        raise CorruptBinary(f"{src.name}: ELF program header table is malformed.")
    table = read_exact(src, phoff, phnum * phentsize, what="ELF program header table")
    segments = []
    dynamic = None
    for i in range(phnum):
        values = phdr.unpack_from(table, i * phentsize)
        if bits == 64:
            p_type, p_flags, p_offset, p_vaddr, _pa, p_filesz, *_ = values
        else:
            p_type, p_offset, p_vaddr, _pa, p_filesz, _memsz, p_flags, _al = values
        if p_type == PT_DYNAMIC and dynamic is None:
            dynamic = p_vaddr
        if p_type == PT_LOAD:
            segments.append(
                Segment(
                    offset=p_offset,
                    vaddr=p_vaddr,
                    filesz=min(p_filesz, max(0, src.size - p_offset)),
                    writable=bool(p_flags & PF_W),
                    executable=bool(p_flags & PF_X),
                )
            )
    return Layout(bits=bits, order=order, segments=tuple(segments), dynamic=dynamic)
