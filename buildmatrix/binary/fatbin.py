"""The CUDA fatbinary container: entries listed from their headers alone.

Layout (docs/inspect.md; ZLUDA ``dark_api/src/fatbin.rs``, clang
``CGCUDANV.cpp``, n-eiling/cuda-fatbin-decompression; checked against cuobjdump
by the tests):

- container header, 16 bytes ``<IHHQ``: magic 0xBA55ED50, version, header size,
  size of the entries that follow. Several containers may follow one another.
- entry header, at least 64 bytes: ``+0 u16 kind`` (1 PTX, 2 ELF, 8 LTO IR),
  ``+4 u32 header size``, ``+8 u64 payload size``, ``+16 u32 compressed size``,
  ``+24 u16 minor``, ``+26 u16 major`` (the PTX ISA version for PTX), ``+28 u32
  arch``, ``+40 u64 flags``, ``+56 u64 uncompressed size``. The next entry starts
  after header and payload. Compressed cubins are decompressed
  (buildmatrix.binary.decompress) for their kernels and toolkit note.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import Any

from packaging.version import Version

from buildmatrix.arch import Arch, CodeKind, ComputeCapability, Suffix
from buildmatrix.binary.cubin import cubin_facts
from buildmatrix.binary.decompress import (
    COMPRESSION_FLAGS,
    decompress_head,
    decompress_payload,
    decompressed_source,
)
from buildmatrix.binary.ptx import (
    PTX_HEAD,
    checked_directives,
    checked_ptx_entry,
    settled_directives,
)
from buildmatrix.binary.source import (
    ByteSource,
    BytesSource,
    CorruptBinary,
    SliceSource,
    read_exact,
)

FATBIN_MAGIC = 0xBA55ED50
FATBIN_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct(
    "<HHIQI4xHHI8xQ8xQ"
)  # kind, _, hsize, payload, compressed size, minor, major, arch, flags, uncompressed size

# Flags seen with nvcc 12.x/13.0 (verified against cuobjdump in the tests); the
# compression flags (0x2000 LZ4, 0x8000 Zstandard) are buildmatrix.binary.decompress's.
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000

# Sanity bounds: real headers are 16 and 64-120 bytes.
_MAX_HEADER = 4096
_MIN_ENTRY_HEADER = 64
_PAD_CHUNK = 1 << 16
# How much of a compressed PTX text is decoded first for its directives.
_PTX_GLANCE = 512


class EntryKind(StrEnum):
    SASS = "sass"
    PTX = "ptx"
    LTOIR = "ltoir"


_KINDS = {1: EntryKind.PTX, 2: EntryKind.SASS, 8: EntryKind.LTOIR}


@dataclass(frozen=True, kw_only=True, slots=True)
class FatbinEntry:
    kind: EntryKind
    arch: Arch
    ptx_isa: Version | None
    compressed: bool
    size: int
    offset: int
    # Which fatbinary container (one translation unit) of the file holds the entry.
    container: int = 0
    # Kernel names of a SASS cubin (its .text.NAME sections) or a PTX text (its
    # .entry directives); None for a payload that is no readable ELF, and for an
    # entry not read (buildmatrix.binary.kernels says which are).
    kernels: tuple[str, ...] | None = None
    # The CUDA release whose ptxas/nvlink wrote the cubin (.note.nv.tkinfo), if read.
    toolkit: Version | None = None
    # Found by content in the file's data (buildmatrix.binary.embedded): code the
    # program loads itself (cuModuleLoadData), not registered by the CUDA runtime.
    embedded: bool = False

    @property
    def arch_name(self) -> str:
        """``sm_90a``, ``compute_90``, or ``lto_90`` for LTO IR (nvcc's ``code=lto_90``)."""
        return _arch_name(self.kind, self.arch)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": _KIND_TEXT[self.kind], "arch": self.arch_name}
        if self.ptx_isa is not None:
            doc["ptx_isa"] = _isa_text(self.ptx_isa)
        doc["compressed"] = self.compressed
        doc["size"] = self.size
        doc["container"] = self.container
        if self.embedded:
            doc["embedded"] = True
        return doc


# Cached: a large library repeats a dozen archs in tens of thousands of entries.
_KIND_TEXT = {k: k.value for k in EntryKind}


@cache
def _arch_name(kind: EntryKind, arch: Arch) -> str:
    if kind is EntryKind.LTOIR:
        return f"lto_{arch.cc.number}{arch.suffix.value}"
    return str(arch)


@cache
def _isa_text(isa: Version) -> str:
    return f"{isa.major}.{isa.minor}"


@cache
def _entry_arch(kind: EntryKind, number: int, suffix_flags: int) -> Arch:
    # Cached: a large library repeats a dozen archs thousands of times.
    suffix = Suffix.NONE
    if suffix_flags & FLAG_ARCH_SPECIFIC:
        suffix = Suffix.ARCH
    elif suffix_flags & FLAG_FAMILY_SPECIFIC:
        suffix = Suffix.FAMILY
    code_kind = CodeKind.SASS if kind is EntryKind.SASS else CodeKind.PTX
    return Arch(ComputeCapability.from_number(number), code_kind, suffix)


@cache
def _isa(major: int, minor: int) -> Version:
    return Version(f"{major}.{minor}")


def _skip_zeros(src: ByteSource, pos: int, end: int) -> int:
    """Skip zero padding between containers; return the first non-zero offset or ``end``.

    Padding is a few bytes, so the first read is small; it grows only for long runs.
    """
    chunk_size = 64
    while pos < end:
        chunk = read_exact(src, pos, min(chunk_size, end - pos), what="fatbin padding")
        stripped = chunk.lstrip(b"\0")
        if stripped:
            return pos + len(chunk) - len(stripped)
        pos += len(chunk)
        chunk_size = min(chunk_size * 4, _PAD_CHUNK)
    return end


def container_spans(
    src: ByteSource, start: int, length: int, *, where: str
) -> Iterator[tuple[int, int]]:
    """(offset, size) of each fatbinary container in ``[start, start + length)``.

    One container is one translation unit's fatbinary: what the CUDA runtime
    registers, and what ``cuModuleLoadFatBinary`` loads as one module. Sizes are
    checked against the region before use, and each step moves forward.
    """
    for pos, _hsize, size in _containers(src, start, length, f"{src.name} ({where})"):
        yield pos, size


def _containers(
    src: ByteSource, start: int, length: int, name: str
) -> Iterator[tuple[int, int, int]]:
    """(offset, header size, size) of each container; see :func:`container_spans`."""
    if length <= 0:
        raise CorruptBinary(f"{name}: the fatbinary is empty (0 bytes).")
    end = start + length
    if end > src.size:
        raise CorruptBinary(
            f"{name}: claims {length} bytes at {start:#x}, past the end of the "
            f"file ({src.size} bytes); the file is truncated."
        )
    pos = start
    while pos < end:
        if pos != start:
            pos = _skip_zeros(src, pos, end)
            if pos >= end:
                break
        head = read_exact(src, pos, CONTAINER.size, what="fatbin container header")
        magic, _version, hsize, fat_size = CONTAINER.unpack(head)
        if magic != FATBIN_MAGIC:
            raise CorruptBinary(
                f"{name}: no fatbinary magic at offset {pos:#x} "
                f"(found {magic:#010x}, expected {FATBIN_MAGIC:#010x})."
            )
        if not CONTAINER.size <= hsize <= _MAX_HEADER:
            raise CorruptBinary(f"{name}: fatbin container at {pos:#x} has header size {hsize}.")
        if pos + hsize + fat_size > end:
            raise CorruptBinary(
                f"{name}: fatbin container at {pos:#x} claims {fat_size} bytes "
                f"of entries but only {end - pos - hsize} remain."
            )
        yield pos, hsize, hsize + fat_size
        pos += hsize + fat_size


def container_header(src: ByteSource, at: int, end: int) -> tuple[int, int] | None:
    """(header size, size) of a fatbinary container whose header is at ``at``, or
    None when the bytes there cannot be one that ends by ``end`` (a magic number in
    other data)."""
    head = src.read_at(at, CONTAINER.size)
    if len(head) != CONTAINER.size:
        return None
    magic, _version, hsize, fat_size = CONTAINER.unpack(head)
    if magic != FATBIN_MAGIC or not CONTAINER.size <= hsize <= _MAX_HEADER or fat_size == 0:
        return None
    return (hsize, hsize + fat_size) if at + hsize + fat_size <= end else None


def parse_fatbin(
    src: ByteSource, start: int, length: int, *, where: str, first_container: int = 0
) -> list[FatbinEntry]:
    """List every entry of the fatbinary containers in ``[start, start + length)``,
    numbered from ``first_container``.

    ``where`` names the region in messages (``section .nv_fatbin``). Every size is
    checked against the region before use, and every step moves forward by at least
    one header, so corrupt input ends in :class:`CorruptBinary`, never a loop.
    """
    name = f"{src.name} ({where})"
    entries: list[FatbinEntry] = []
    for index, (pos, hsize, size) in enumerate(_containers(src, start, length, name)):
        entries += container_entries(
            src, pos, hsize, size, container=first_container + index, name=name
        )
    return entries


def container_entries(
    src: ByteSource,
    pos: int,
    hsize: int,
    size: int,
    *,
    container: int,
    name: str,
    embedded: bool = False,
) -> list[FatbinEntry]:
    """The entries of the container at ``pos``, whose header (``hsize`` bytes of its
    ``size``) was already checked; ``name`` names it in messages, ``embedded`` marks
    code found in the file's data."""
    entries: list[FatbinEntry] = []
    body_end = pos + size
    p = pos + hsize
    while p < body_end:
        kind, ehsize, payload, flags, arch, isa = _entry_header(src, p, body_end, name=name)
        compressed = bool(flags & COMPRESSION_FLAGS)
        facts: tuple[tuple[str, ...] | None, Version | None] = (None, None)
        if not compressed:
            arch, isa, facts = _payload_facts(
                src, p + ehsize, payload, kind=kind, arch=arch, isa=isa, name=name
            )
        elif kind is EntryKind.PTX and isa is not None:
            arch, isa = _compressed_ptx(src, p, arch=arch, isa=isa, name=name)
        entries.append(
            FatbinEntry(
                kind=kind,
                arch=arch,
                ptx_isa=isa,
                compressed=compressed,
                size=payload,
                offset=p,
                container=container,
                kernels=facts[0],
                toolkit=facts[1],
                embedded=embedded,
            )
        )
        p += ehsize + payload
    return entries


def _entry_header(
    src: ByteSource, p: int, body_end: int, *, name: str
) -> tuple[EntryKind, int, int, int, Arch, Version | None]:
    """(kind, header size, payload size, flags, arch, PTX ISA) of the entry header at
    ``p``, each field checked against the container that ends at ``body_end``."""
    if body_end - p < _MIN_ENTRY_HEADER:
        raise CorruptBinary(
            f"{name}: {body_end - p} stray bytes at {p:#x} inside a fatbin container."
        )
    raw = read_exact(src, p, _ENTRY.size, what="fatbin entry header")
    kind_id, _, ehsize, payload, _packed, minor, major, number, flags, _unc = _ENTRY.unpack(raw)
    if not _MIN_ENTRY_HEADER <= ehsize <= _MAX_HEADER:
        raise CorruptBinary(f"{name}: fatbin entry at {p:#x} has header size {ehsize}.")
    if p + ehsize + payload > body_end:
        raise CorruptBinary(
            f"{name}: fatbin entry at {p:#x} claims a {payload}-byte "
            f"payload that runs past its container."
        )
    kind = _KINDS.get(kind_id)
    if kind is None:
        raise CorruptBinary(f"{name}: fatbin entry at {p:#x} has unknown kind {kind_id}.")
    if not 10 <= number <= 999:
        raise CorruptBinary(f"{name}: fatbin entry at {p:#x} has arch {number}.")
    isa = _isa(major, minor) if kind is EntryKind.PTX else None
    return kind, ehsize, payload, flags, _entry_arch(kind, number, flags), isa


def _payload_facts(
    src: ByteSource,
    at: int,
    payload: int,
    *,
    kind: EntryKind,
    arch: Arch,
    isa: Version | None,
    name: str,
) -> tuple[Arch, Version | None, tuple[tuple[str, ...] | None, Version | None]]:
    """(arch, PTX ISA, (kernels, toolkit)) of the uncompressed payload at ``at``: a
    PTX text's directives (buildmatrix.binary.ptx) and a cubin's own facts
    (buildmatrix.binary.cubin), each held to what the entry header says."""
    facts: tuple[tuple[str, ...] | None, Version | None] = (None, None)
    if kind is EntryKind.PTX and isa is not None:
        where_ptx = f"{name} PTX at {at:#x}"
        arch, isa = checked_ptx_entry(
            SliceSource(src, at, payload, name=where_ptx),
            header=arch,
            isa=isa,
            name=where_ptx,
        )
    if kind is EntryKind.SASS:
        where_cubin = f"{name} cubin at {at:#x}"
        facts = cubin_facts(SliceSource(src, at, payload, name=where_cubin), header=arch)
    return arch, isa, facts


def _compressed_ptx(
    src: ByteSource, at: int, *, arch: Arch, isa: Version, name: str
) -> tuple[Arch, Version]:
    """(arch, PTX ISA) of the compressed PTX entry whose header is at ``at``: the
    head of its text decompressed (only that far where it is a Zstandard frame) and
    held to the header as an uncompressed entry's is (checked_ptx_entry)."""
    raw = read_exact(src, at, _ENTRY.size, what="fatbin entry header")
    _, _, ehsize, payload, packed, _, _, _, flags, unc = _ENTRY.unpack(raw)
    where = f"{name} (compressed {_arch_name(EntryKind.PTX, arch)} PTX at {at + ehsize:#x})"
    if not 0 < packed <= payload:
        raise CorruptBinary(
            f"{where}: compressed entry claims {packed} compressed bytes in a "
            f"{payload}-byte payload."
        )
    for limit in (_PTX_GLANCE, PTX_HEAD):  # nvcc's directives end within a few hundred bytes
        head = decompress_head(
            src, at + ehsize, packed, flags=flags, size=unc, limit=limit, name=where
        )
        # the directives of the head, read once: whether they are settled, and what
        # checked_ptx_entry would read in them (the same bytes: len(head) <= PTX_HEAD)
        found, settled = settled_directives(head)
        if len(head) < limit or settled:
            break
    return checked_directives(found, header=arch, isa=isa, name=where)


def decompressed_cubin(src: ByteSource, entry: FatbinEntry, *, name: str) -> ByteSource:
    """The cubin of the compressed SASS entry ``entry`` of ``src``: its header read
    again for the compressed size (+16) and the uncompressed size (+56), the payload
    decompressed (buildmatrix.binary.decompress) within those bounds: held in memory,
    or past the memory budget read from the Zstandard frame as it is asked for."""
    raw = read_exact(src, entry.offset, _ENTRY.size, what="fatbin entry header")
    _, _, ehsize, payload, packed, _, _, _, flags, unc = _ENTRY.unpack(raw)
    at = entry.offset + ehsize
    where = f"{name} ({entry.arch_name} cubin at {at:#x})"
    if not entry.compressed:
        return BytesSource(read_exact(src, at, payload, what="fatbin cubin entry"), name=where)
    if not 0 < packed <= payload:
        raise CorruptBinary(
            f"{where}: compressed entry claims {packed} compressed bytes in a "
            f"{payload}-byte payload."
        )
    return decompressed_source(src, at, packed, flags=flags, size=unc, name=where)


def ptx_text(src: ByteSource, entry: FatbinEntry, *, name: str) -> bytes:
    """The whole text of the PTX entry ``entry`` of ``src``, decompressed where it is
    compressed (as :func:`decompressed_cubin`)."""
    return _payload(src, entry, name=name, what="PTX")[1]


def _payload(src: ByteSource, entry: FatbinEntry, *, name: str, what: str) -> tuple[str, bytes]:
    """(where, bytes) of ``entry``'s payload, decompressed where it is compressed."""
    raw = read_exact(src, entry.offset, _ENTRY.size, what="fatbin entry header")
    _, _, ehsize, payload, packed, _, _, _, flags, unc = _ENTRY.unpack(raw)
    at = entry.offset + ehsize
    packed_ptx = "compressed " if entry.compressed and what == "PTX" else ""
    where = f"{name} ({packed_ptx}{entry.arch_name} {what} at {at:#x})"
    if not entry.compressed:
        return where, read_exact(src, at, payload, what=f"fatbin {what} entry")
    if not 0 < packed <= payload:
        raise CorruptBinary(
            f"{where}: compressed entry claims {packed} compressed bytes in a "
            f"{payload}-byte payload."
        )
    data = read_exact(src, at, packed, what="compressed fatbin entry")
    return where, decompress_payload(data, flags=flags, size=unc, name=where)
