"""The value the dynamic loader stores in one pointer slot of a shared library.

The CUDA runtime's wrapper (``__fatBinC_Wrapper_t``) holds a pointer to the
fatbinary it registers. In a position-independent file the loader writes that
pointer at load time from a dynamic relocation: ``R_*_RELATIVE`` (load base +
addend) or, when the fatbinary symbol is exported, an absolute relocation
(``R_X86_64_64`` / ``R_AARCH64_ABS64`` / ``GLOB_DAT``: symbol value + addend), and
the bytes in the file are then 0 (ld.bfd on aarch64, lld on any architecture).
What is read here, from the program headers alone (section headers may be
stripped): ``PT_DYNAMIC`` → ``DT_RELA``/``DT_RELASZ``/``DT_RELAENT`` and
``DT_JMPREL``/``DT_PLTRELSZ`` (``DT_PLTREL`` = ``DT_RELA``), ``DT_SYMTAB`` for
symbol values (System V gABI, "Dynamic Section" and "Relocation"; relocation
numbers from the x86-64 and AArch64 psABIs and glibc ``elf/elf.h``).

Relocations packed as ``DT_RELR`` add the load base to the value in place, which is
what a base-0 reading of the file already gives. Addresses are load-base 0, as
:class:`buildmatrix.binary.elf.Layout` maps them.

:func:`relocation_into` answers a second question: does any relocation the loader
applies land on given bytes of the file (the device code ``check`` judges)? Whatever
its type, the bytes the driver is handed are then not the file's
(docs/security.md, "Device code that tries not to be seen").
"""

from __future__ import annotations

import bisect
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from buildmatrix.binary.elf import Layout
from buildmatrix.binary.source import ByteSource, CorruptBinary, read_exact

EM_PPC64 = 21
EM_X86_64 = 62
EM_AARCH64 = 183
# machine -> (RELATIVE, {absolute types: symbol + addend})
_TYPES = {
    EM_X86_64: (8, {1, 6}),  # R_X86_64_RELATIVE; R_X86_64_64, R_X86_64_GLOB_DAT
    EM_AARCH64: (1027, {257, 1025}),  # R_AARCH64_RELATIVE; _ABS64, _GLOB_DAT
    EM_PPC64: (22, {38, 20}),  # R_PPC64_RELATIVE; R_PPC64_ADDR64, R_PPC64_GLOB_DAT
}
DT_NULL, DT_PLTRELSZ, DT_SYMTAB, DT_RELA, DT_RELASZ, DT_RELAENT = 0, 2, 6, 7, 8, 9
DT_SYMENT, DT_REL, DT_RELSZ, DT_RELENT, DT_PLTREL, DT_JMPREL = 11, 17, 18, 19, 20, 23
DT_RELRSZ, DT_RELR, DT_RELRENT = 35, 36, 37  # gABI 2022 (glibc elf/elf.h)
STT_GNU_IFUNC = 10
_RELA = struct.Struct("<QQq")  # r_offset, r_info, r_addend (ELF64)
_MAX_DYNAMIC = 1 << 16  # linkers write a few dozen entries
_CHUNK = _RELA.size << 15  # relocation tables are read a window at a time: memory stays bounded


@dataclass(frozen=True, kw_only=True)
class Relocations:
    """The ELF64 RELA tables of a file: (file offset, size) of each."""

    machine: int
    tables: tuple[tuple[int, int], ...]
    symtab: int | None  # file offset of DT_SYMTAB
    syment: int


def read_relocations(src: ByteSource, layout: Layout, machine: int) -> Relocations | None:
    """The dynamic relocation tables; None when the file has no ``PT_DYNAMIC`` (a
    static executable: its pointers are in the file as they are)."""
    if layout.dynamic is None:
        return None
    if layout.bits != 64 or layout.order != "<" or machine not in _TYPES:
        raise CorruptBinary(
            f"{src.name}: a CUDA runtime wrapper in a {layout.bits}-bit file for machine "
            f"{machine}, whose relocations buildmatrix does not read; the fatbinary it "
            "registers cannot be told, so the file is refused (docs/security.md)."
        )
    tags = _dynamic_tags(src, layout, layout.dynamic)
    if DT_REL in tags or tags.get(DT_PLTREL, DT_RELA) != DT_RELA:
        raise CorruptBinary(f"{src.name}: REL relocations in a file that should use RELA.")
    if tags.get(DT_RELAENT, _RELA.size) != _RELA.size:
        raise CorruptBinary(f"{src.name}: DT_RELAENT {tags[DT_RELAENT]} is not {_RELA.size}.")
    tables = []
    for where, length in ((DT_RELA, DT_RELASZ), (DT_JMPREL, DT_PLTRELSZ)):
        if where in tags and tags.get(length, 0) > 0:
            tables.append((_mapped(src, layout, tags[where], tags[length]), tags[length]))
    symtab = _mapped(src, layout, tags[DT_SYMTAB], 1) if DT_SYMTAB in tags else None
    return Relocations(
        machine=machine, tables=tuple(tables), symtab=symtab, syment=tags.get(DT_SYMENT, 24)
    )


def _dynamic_tags(src: ByteSource, layout: Layout, vaddr: int) -> dict[int, int]:
    """The dynamic entries from ``vaddr`` to DT_NULL, the last of each tag winning,
    as glibc reads them (elf/get-dynamic-info.h, ``elf_get_dynamic_info``); bytes past
    a segment's file part are zeros in memory, so they end the table."""
    start = _mapped(src, layout, vaddr, 16)
    end = next(
        g.offset + g.filesz for g in layout.segments if g.vaddr <= vaddr < g.vaddr + g.filesz
    )
    raw = read_exact(src, start, min(end - start, _MAX_DYNAMIC), what="dynamic section")
    tags: dict[int, int] = {}
    for tag, value in struct.iter_unpack("<qQ", raw[: len(raw) // 16 * 16]):
        if tag == DT_NULL:
            return tags
        tags[tag] = value
    if end - start <= _MAX_DYNAMIC:
        return tags  # the zeros after the segment's file bytes end it
    raise CorruptBinary(f"{src.name}: the dynamic section has no end in {_MAX_DYNAMIC} bytes.")


def _dynamic_tags_any(src: ByteSource, layout: Layout, vaddr: int) -> dict[int, int]:
    """:func:`_dynamic_tags` for either ELF class and byte order."""
    if layout.bits == 64 and layout.order == "<":
        return _dynamic_tags(src, layout, vaddr)
    entry = struct.Struct(layout.order + ("qQ" if layout.bits == 64 else "iI"))
    start = _mapped(src, layout, vaddr, entry.size)
    end = next(
        g.offset + g.filesz for g in layout.segments if g.vaddr <= vaddr < g.vaddr + g.filesz
    )
    raw = read_exact(src, start, min(end - start, _MAX_DYNAMIC), what="dynamic section")
    tags: dict[int, int] = {}
    for tag, value in entry.iter_unpack(raw[: len(raw) // entry.size * entry.size]):
        if tag == DT_NULL:
            return tags
        tags[tag] = value
    if end - start <= _MAX_DYNAMIC:
        return tags
    raise CorruptBinary(f"{src.name}: the dynamic section has no end in {_MAX_DYNAMIC} bytes.")


def dynamic_tags(src: ByteSource, layout: Layout) -> dict[int, int]:
    """The file's dynamic entries (``PT_DYNAMIC`` to ``DT_NULL``, the last of each tag),
    of either ELF class and byte order; {} where it has no ``PT_DYNAMIC``."""
    return {} if layout.dynamic is None else _dynamic_tags_any(src, layout, layout.dynamic)


def relocation_into(
    src: ByteSource, layout: Layout, spans: list[tuple[int, int]]
) -> tuple[int, str] | None:
    """(address, table) of a dynamic relocation the loader applies whose target
    overlaps one of ``spans`` (file offset, size), or None where none does.

    Every table glibc applies is read (elf/dynamic-link.h ``ELF_DYNAMIC_RELOCATE``):
    ``DT_REL``/``DT_RELA`` (with their sizes; a table of the other kind than the
    class's usual one too), ``DT_JMPREL`` (``DT_PLTREL`` says which kind) and
    ``DT_RELR`` (``ELF_DYNAMIC_DO_RELR``: an even word is an address, an odd one a
    bitmap of the 63 (31) words after the last). The type does not matter: every type
    but NONE (0 on each machine) writes a word at ``r_offset``, so a word there is
    taken as written. An address is compared with the spans through each segment
    that maps it (a file's bytes may be mapped twice)."""
    if layout.dynamic is None or not spans:
        return None
    word = layout.bits // 8
    windows: list[tuple[int, int]] = []  # address ranges whose bytes are in a span
    for g in layout.segments:
        for at, size in spans:
            lo, hi = max(at, g.offset), min(at + size, g.offset + g.filesz)
            if lo < hi:
                windows.append((g.vaddr + lo - g.offset, g.vaddr + hi - g.offset))
    if not windows:
        return None
    tags = _dynamic_tags_any(src, layout, layout.dynamic)
    windows.sort()
    starts = [lo - word for lo, _hi in windows]  # a word written at lo - word + 1 overlaps
    bottom, top = starts[0], max(hi for _lo, hi in windows)

    def hit(addr: int) -> bool:
        if not bottom < addr < top:
            return False
        # the last window that starts before addr, and the one before it (they are
        # disjoint: one word may reach back over the gap between two)
        i = bisect.bisect_left(starts, addr) - 1
        return any(addr < windows[j][1] for j in (i, i - 1) if j >= 0)

    rel = struct.Struct(layout.order + ("QQ" if word == 8 else "II"))
    rela = struct.Struct(layout.order + ("QQq" if word == 8 else "IIi"))
    type_mask = 0xFFFFFFFF if word == 8 else 0xFF
    tables = [(DT_REL, DT_RELSZ, rel, "DT_REL"), (DT_RELA, DT_RELASZ, rela, "DT_RELA")]
    plt = rela if tags.get(DT_PLTREL, DT_RELA if word == 8 else DT_REL) == DT_RELA else rel
    tables.append((DT_JMPREL, DT_PLTRELSZ, plt, "DT_JMPREL"))
    for where, length, entry, name in tables:
        if where not in tags or tags.get(length, 0) <= 0:
            continue
        offset, size = _mapped(src, layout, tags[where], tags[length]), tags[length]
        for start in range(offset, offset + size, _CHUNK):
            window = read_exact(src, start, min(_CHUNK, offset + size - start), what=name)
            whole = window[: len(window) // entry.size * entry.size]
            if entry is rela and word == 8 and layout.order == "<":  # the common case, fast
                near = [i for i, r in enumerate(_r_offsets(whole)) if bottom < r < top]
                found: Iterator[tuple[Any, ...]] = (
                    entry.unpack_from(whole, i * entry.size) for i in near
                )
            else:
                found = entry.iter_unpack(whole)
            for fields in found:
                if fields[1] & type_mask and hit(fields[0]):
                    return fields[0], name
    if DT_RELR in tags and tags.get(DT_RELRSZ, 0) > 0:
        offset, size = _mapped(src, layout, tags[DT_RELR], tags[DT_RELRSZ]), tags[DT_RELRSZ]
        raw = read_exact(src, offset, size // word * word, what="DT_RELR")
        where = 0
        for (value,) in struct.iter_unpack(layout.order + ("Q" if word == 8 else "I"), raw):
            if not value & 1:
                if hit(value):
                    return value, "DT_RELR"
                where = value + word
                continue
            for bit in range(1, word * 8):
                if value >> bit & 1 and hit(where + (bit - 1) * word):
                    return where + (bit - 1) * word, "DT_RELR"
            where += (word * 8 - 1) * word
    return None


def _mapped(src: ByteSource, layout: Layout, vaddr: int, size: int) -> int:
    at = layout.file_offset(vaddr, size)
    if at is None:
        raise CorruptBinary(
            f"{src.name}: a dynamic table at address {vaddr:#x} ({size} bytes) lies in no "
            "loadable segment; the file is corrupt."
        )
    return at


def pointer_values(
    src: ByteSource, relocs: Relocations, slots: dict[int, int]
) -> dict[int, int | None]:
    """What the loader stores at each address of ``slots`` (8 bytes each, mapped to
    the value in the file): the relocation that targets it, or the value in place
    when none does. None where that cannot be told (several relocations, one that
    overlaps the slot, an unknown type, an undefined or IFUNC symbol: the value then
    comes from elsewhere). One pass over the tables, whatever the number of slots."""
    near = {slot + d: slot for slot in slots for d in range(-7, 8)}
    # keyed by where each relocation is: DT_RELASZ may cover DT_JMPREL too, and glibc
    # applies such a relocation once (elf/dynamic-link.h, _ELF_DYNAMIC_DO_RELOC)
    found: dict[int, dict[int, tuple[int, int, int]]] = {}
    for offset, size in relocs.tables:
        for start in range(offset, offset + size - _RELA.size + 1, _CHUNK):
            window = read_exact(src, start, min(_CHUNK, offset + size - start), what="relocations")
            whole = window[: len(window) // _RELA.size * _RELA.size]
            # Only the r_offset of each entry (its first u64) is compared in Python; the
            # few entries that hit a slot are unpacked whole.
            for i in [i for i, r_offset in enumerate(_r_offsets(whole)) if r_offset in near]:
                r_offset, info, addend = _RELA.unpack_from(whole, i * _RELA.size)
                at = start + i * _RELA.size
                found.setdefault(near[r_offset], {})[at] = (r_offset, info, addend)
    return {
        slot: _value(src, relocs, slot, list(found[slot].values())) if slot in found else in_place
        for slot, in_place in slots.items()
    }


def _r_offsets(table: bytes) -> list[int]:
    """The ``r_offset`` (first of three little-endian u64) of each RELA entry."""
    if sys.byteorder == "little":
        return memoryview(table).cast("Q")[0::3].tolist()
    return list(struct.unpack(f"<{len(table) // 8}Q", table)[0::3])


def _value(
    src: ByteSource, relocs: Relocations, slot: int, found: list[tuple[int, int, int]]
) -> int | None:
    relative, absolute = _TYPES[relocs.machine]
    if len(found) > 1 or found[0][0] != slot:
        return None
    _r, info, addend = found[0]
    kind, sym = info & 0xFFFFFFFF, info >> 32
    if kind == relative:
        return addend & 0xFFFFFFFFFFFFFFFF
    if kind not in absolute or relocs.symtab is None or sym == 0:
        return None
    entry = read_exact(src, relocs.symtab + sym * relocs.syment, 24, what="dynamic symbol")
    _name, st_info, _other, shndx, value, _size = struct.unpack("<IBBHQQ", entry)
    if shndx == 0 or st_info & 0xF == STT_GNU_IFUNC:
        return None  # defined in another object, or chosen by a resolver at load time
    return int(value + addend) & 0xFFFFFFFFFFFFFFFF
