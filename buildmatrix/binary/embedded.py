"""Device code kept as plain data: fatbinary containers and CUDA cubins that no
fatbinary section or runtime wrapper names.

A library can carry device code the CUDA runtime never registers: a cubin put in
``.rodata`` with ``.incbin`` (or bin2c) and loaded with ``cuModuleLoadData``, or a
fatbinary whose ``.nv_fatbin`` and ``.nvFatBinSegment`` sections were both renamed.
Such code is found by content: the data of the file (allocated, non-executable
sections; without section headers, the non-executable loadable segments) is searched
for the fatbinary container magic (0xBA55ED50) and for ELF headers whose machine is
EM_CUDA. A hit that reads as a whole container or cubin is device code; a magic
number inside other data, which cannot be read as either, is skipped.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import replace

from buildmatrix.binary.elf import (
    ELF_MAGIC,
    EM_CUDA,
    SHF_ALLOC,
    SHF_EXECINSTR,
    SHT_PROGBITS,
    ElfInfo,
    read_elf,
    read_layout,
)
from buildmatrix.binary.fatbin import (
    FATBIN_MAGIC_BYTES,
    FatbinEntry,
    container_entries,
    container_header,
)
from buildmatrix.binary.kernels import cubin_entry
from buildmatrix.binary.source import ByteSource, CorruptBinary, Searcher, SliceSource

_EHDR = {1: struct.Struct("<16xHHIIIIIHHHHHH"), 2: struct.Struct("<16xHHIQQQIHHHHHH")}


def data_regions(
    src: ByteSource, info: ElfInfo, *, skip: Iterable[tuple[int, int]] = ()
) -> list[tuple[int, int]]:
    """(offset, size) of the file's data: allocated, non-executable PROGBITS sections,
    or with no section headers the non-executable loadable segments. ``skip``: ranges
    already read as device code."""
    if info.sections:
        regions = [
            (s.offset, s.size)
            for s in info.sections
            if s.type == SHT_PROGBITS
            and s.flags & SHF_ALLOC
            and not s.flags & SHF_EXECINSTR
            and s.size > 0
        ]
    else:
        regions = [(g.offset, g.filesz) for g in read_layout(src).segments if not g.executable]
    return _minus(sorted(regions), sorted(skip))


def _minus(regions: list[tuple[int, int]], skip: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for start, size in regions:
        pieces = [(start, start + size)]
        for s_start, s_size in skip:
            s_end = s_start + s_size
            pieces = [
                piece
                for a, b in pieces
                for piece in ((a, min(b, s_start)), (max(a, s_end), b))
                if piece[0] < piece[1]
            ]
        out += [(a, b - a) for a, b in pieces]
    return out


def embedded_code(
    src: ByteSource, regions: Iterable[tuple[int, int]], *, first_container: int = 0
) -> list[FatbinEntry]:
    """Every fatbinary container and cubin found in ``regions``, each a container
    (translation unit) of its own, numbered from ``first_container``."""
    entries: list[FatbinEntry] = []
    container = first_container
    for start, size in regions:
        end = start + size
        hits = _Hits(src, end)
        found_at = hits.next(start)
        while found_at is not None:
            hit, kind = found_at
            found, length = _read_blob(hits.source(kind), hit, end, kind, container)
            entries += found
            if found:
                container = 1 + max(e.container for e in found)
            # the bytes of a blob just read are not searched again
            found_at = hits.next(hit + length if found else hit + 1)
    return entries


def _read_blob(
    src: ByteSource, hit: int, end: int, kind: str, container: int
) -> tuple[list[FatbinEntry], int]:
    """The entries of the container or cubin at ``hit``, numbered from ``container``,
    and its length; none when the bytes there are not one."""
    if kind == "fatbin":
        header = container_header(src, hit, end)
        if header is None:
            return [], 0
        hsize, span = header
        name = f"{src.name} (fatbinary at {hit:#x}, found by its magic)"
        found = container_entries(
            src, hit, hsize, span, container=container, name=name, embedded=True
        )
        return found, span
    length = _cubin_size(src, hit, end)
    if length is None:
        return [], 0
    where = f"{src.name} (cubin at {hit:#x}, found by its ELF header)"
    cubin = SliceSource(src, hit, length, name=where)
    entry = cubin_entry(cubin, read_elf(cubin))
    return [replace(entry, container=container, offset=hit, embedded=True)], length


class _Hits:
    """Either magic, found in order from positions that only move forward."""

    def __init__(self, src: ByteSource, end: int) -> None:
        self._containers = Searcher(src, end)
        self._cubins = Searcher(src, end)
        self._end = end
        self._fatbin = -1  # the next container magic at or after the last position

    def source(self, kind: str) -> ByteSource:
        """The file, read through the window where that kind's hit was found."""
        return self._containers if kind == "fatbin" else self._cubins

    def next(self, pos: int) -> tuple[int, str] | None:
        """(offset, kind) of the first magic at or after ``pos``, or None."""
        if self._fatbin < pos:
            found = self._containers.find(FATBIN_MAGIC_BYTES, pos, self._end)
            self._fatbin = self._end if found < 0 else found
        # An ELF header is looked for only before the next container, so no search
        # runs through the containers the caller then skips.
        cubin = self._cubins.find(ELF_MAGIC, pos, self._fatbin + len(ELF_MAGIC) - 1)
        if cubin >= 0:
            return cubin, "cubin"
        return (self._fatbin, "fatbin") if self._fatbin < self._end else None


def _cubin_size(src: ByteSource, at: int, end: int) -> int | None:
    """The size of a CUDA ELF whose header is at ``at`` (it ends with its last table),
    or None when the bytes there are no CUDA ELF that fits before ``end``."""
    head = src.read_at(at, 64)
    if len(head) < 52 or head[4] not in (1, 2) or head[5] != 1:
        return None  # cubins are little-endian ELF32/ELF64
    layout = _EHDR[head[4]]
    if len(head) < layout.size:
        return None
    fields: tuple[int, ...] = layout.unpack_from(head)
    machine, phoff, shoff = fields[1], fields[4], fields[5]
    phentsize, phnum, shentsize, shnum = fields[8], fields[9], fields[10], fields[11]
    if machine != EM_CUDA:
        return None
    size = max(shoff + shnum * shentsize, phoff + phnum * phentsize)
    if size <= 64:
        return None
    if at + size > end:
        raise CorruptBinary(
            f"{src.name}: a CUDA cubin at {at:#x} claims {size} bytes, past the end of the "
            "data that holds it."
        )
    return size
