"""Registered device code: the fatbinary containers the CUDA runtime's wrapper
records point at (docs/check.md; docs/security.md, "Device code that tries
not to be seen").

The container format itself is buildmatrix.binary.fatbin's; this module finds which
containers the host code hands to ``__cudaRegisterFatBinary`` (clang
``CGCUDANV.cpp``, ``makeModuleCtorFunction``; ZLUDA ``dark_api/src/fatbin.rs``),
reading the wrapper's data pointer through the dynamic relocations
(buildmatrix.binary.dynrel).
"""

from __future__ import annotations

import struct

from buildmatrix.binary.dynrel import pointer_values, read_relocations
from buildmatrix.binary.elf import Layout
from buildmatrix.binary.fatbin import CONTAINER, FATBIN_MAGIC
from buildmatrix.binary.source import ByteSource, CorruptBinary, find_each_read

WRAPPER_MAGIC = 0x466243B1  # __fatBinC_Wrapper_t.magic (clang CGCUDANV.cpp; ZLUDA fatbin.rs)


def wrapped_containers(
    src: ByteSource, layout: Layout, regions: list[tuple[int, int]], *, machine: int
) -> list[tuple[int, int, int]]:
    """(offset, size, wrapper version) of each container a runtime wrapper in
    ``regions`` points at.

    The CUDA runtime registers a fatbinary through ``__fatBinC_Wrapper_t {int magic;
    int version; const void *data; void *filename_or_fatbins}`` (``__cudaRegisterFatBinary``
    receives the wrapper), which the host code points at whatever the sections are
    called. The pointer is the value the loader stores, read through the dynamic
    relocations (buildmatrix.binary.dynrel): in the file it may be 0. A wrapper in no
    loadable segment is never registered and is passed over; one whose pointer leads
    to no container in a loadable segment is :class:`CorruptBinary` (docs/security.md).
    """
    width = 8 if layout.bits == 64 else 4
    wrapper = struct.Struct(layout.order + ("IIQQ" if layout.bits == 64 else "IIII"))
    magic = struct.pack(layout.order + "I", WRAPPER_MAGIC)
    slots: dict[int, int] = {}
    versions: dict[int, int] = {}
    for offset, size in regions:
        for at, record in find_each_read(src, offset, offset + size, magic, read=wrapper.size):
            if (at - offset) % width or len(record) < wrapper.size:
                continue
            _magic, version, pointer, _name = wrapper.unpack(record)
            slot = layout.address(at + width)
            if version in (1, 2) and slot is not None:
                slots.setdefault(slot, pointer)
                versions.setdefault(slot, version)
    if not slots:
        return []
    relocs = read_relocations(src, layout, machine)
    values = pointer_values(src, relocs, slots) if relocs is not None else dict(slots)
    spans: dict[tuple[int, int, int], None] = {}  # in order, each once
    for slot, value in values.items():
        span = _wrapped(src, layout, value) if value is not None else None
        if span is None:
            target = (
                "an address this file does not set (a symbol of another object, an IFUNC, "
                "or several relocations)"
                if value is None
                else f"address {value:#x}, where no fatbinary is loaded"
            )
            raise CorruptBinary(
                f"{src.name}: the CUDA runtime wrapper at address {slot - width:#x} points at "
                f"{target}; what the runtime registers cannot be read, so the file is refused "
                "(docs/security.md, Device code that tries not to be seen)."
            )
        spans[(*span, versions[slot])] = None
    return list(spans)


def _wrapped(src: ByteSource, layout: Layout, pointer: int) -> tuple[int, int] | None:
    """The container a wrapper's data pointer leads to, if one is there."""
    start = layout.file_offset(pointer, CONTAINER.size)
    if start is None:
        return None
    head = src.read_at(start, CONTAINER.size)
    if len(head) != CONTAINER.size:
        return None
    c_magic, _v, hsize, fat_size = CONTAINER.unpack(head)
    if c_magic != FATBIN_MAGIC or start + hsize + fat_size > src.size:
        return None
    return start, hsize + fat_size
