"""Standalone CUDA ELF objects (``.cubin``): the SM they were built for.

``e_flags`` layouts (LLVM ``llvm/include/llvm/BinaryFormat/ELF.h``, ``EF_CUDA_*``):

- ABI version < 8: SM in the low byte, arch-specific ``a`` at bit 11 (0x800);
- ABI version 8 (CUDA 12.8+ ptxas): SM in bits 8..15, ``a`` at bit 3 (0x8).

nvcc 13.0 leaves bit 3 clear for ``sm_90a``/``sm_100a`` cubins and records the
``a`` instead as attribute 9 (value 1) in ``.nv.compat``, which is what cuobjdump
reports; both are read. A family-specific ``sm_100f`` cubin is byte-identical to
``sm_100`` (the ``f`` exists only at the fatbinary level), so it reads as ``sm_100``.
"""

from __future__ import annotations

import struct

from buildmatrix.arch import Arch, CodeKind, ComputeCapability, Suffix
from buildmatrix.binary.elf import ElfInfo
from buildmatrix.binary.source import ByteSource, CorruptBinary, read_exact

_EF_ACCEL_V1 = 0x800
_EF_ACCEL_V2 = 0x8
_COMPAT_ARCH_SPECIFIC = 9  # .nv.compat attribute observed for sm_XYa cubins
_MAX_COMPAT = 1 << 16
SHT_SYMTAB = 2
STT_FUNC = 2
# st_other bit of a kernel (``__global__``) symbol: cuobjdump -elf prints it as
# ENTRY, nvdisasm as STO_CUDA_ENTRY; cuda-gdb ``gdb/cuda/cuda-tdep.c``,
# ``cuda_elf_make_msymbol_special`` (``#define STO_CUDA_ENTRY 0x10``).
STO_CUDA_ENTRY = 0x10
_MAX_SYMTAB = 64 << 20


def _compat_arch_specific(src: ByteSource, info: ElfInfo) -> bool:
    section = info.section(".nv.compat")
    if section is None or section.size == 0 or section.size > _MAX_COMPAT:
        return False
    data = read_exact(src, section.offset, section.size, what="section .nv.compat")
    pos = 0
    while pos + 4 <= len(data):
        fmt, attr, value = struct.unpack_from("<BBH", data, pos)
        if fmt == 4:  # sized value: u16 length, then the bytes
            pos += 4 + value
            continue
        if attr == _COMPAT_ARCH_SPECIFIC and fmt == 2:
            return bool(value & 0xFF == 1)
        pos += 4
    return False


def cubin_arch(src: ByteSource, info: ElfInfo) -> Arch:
    """The SASS arch of a standalone cubin (``info.machine == EM_CUDA``)."""
    if info.abi_version >= 8:
        number = (info.flags >> 8) & 0xFF
        specific = bool(info.flags & _EF_ACCEL_V2)
    else:
        number = info.flags & 0xFF
        specific = bool(info.flags & _EF_ACCEL_V1)
    if number < 10:
        raise CorruptBinary(f"{src.name}: CUDA ELF with e_flags {info.flags:#x} names no SM.")
    specific = specific or _compat_arch_specific(src, info)
    suffix = Suffix.ARCH if specific else Suffix.NONE
    return Arch(ComputeCapability.from_number(number), CodeKind.SASS, suffix)


def entry_symbols(src: ByteSource, info: ElfInfo) -> tuple[str, ...] | None:
    """Names of a cubin's kernels by its symbol table: ``STT_FUNC`` symbols marked
    ``STO_CUDA_ENTRY``, whatever their sections are called. None where the cubin has
    no symbol table to read (or one past :data:`_MAX_SYMTAB`)."""
    symtab = next((s for s in info.sections if s.type == SHT_SYMTAB), None)
    if symtab is None or symtab.size > _MAX_SYMTAB or symtab.link >= len(info.sections):
        return None
    strtab = info.sections[symtab.link]
    if strtab.size > _MAX_SYMTAB:
        return None
    ident = read_exact(src, 0, 16, what="ELF identification")
    order = "<" if ident[5] == 1 else ">"
    # st_name, st_info, st_other (ELF64: name, info, other, shndx, value, size;
    # ELF32: name, value, size, info, other, shndx)
    entry, fmt = (24, "IBBHQQ") if ident[4] == 2 else (16, "IIIBBH")
    table = read_exact(src, symtab.offset, symtab.size, what="symbol table")
    names = read_exact(src, strtab.offset, strtab.size, what="symbol string table")
    found = []
    for pos in range(0, len(table) - entry + 1, entry):
        fields = struct.unpack_from(order + fmt, table, pos)
        name_off, st_info, st_other = (
            fields[:3] if ident[4] == 2 else (fields[0], fields[3], fields[4])
        )
        if st_info & 0xF == STT_FUNC and st_other & STO_CUDA_ENTRY and name_off < len(names):
            end = names.find(b"\0", name_off)
            found.append(names[name_off : end if end >= 0 else None].decode("latin-1"))
    return tuple(dict.fromkeys(found))
