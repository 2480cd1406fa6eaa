"""Standalone CUDA ELF objects (``.cubin``): the SM they were built for.

``e_flags`` layouts (LLVM ``llvm/include/llvm/BinaryFormat/ELF.h``, ``EF_CUDA_*``):

- ABI version < 8: SM in the low byte, arch-specific ``a`` at bit 11 (0x800);
- ABI version 8 (CUDA 12.8+ ptxas): SM in bits 8..15, ``a`` at bit 3 (0x8).

nvcc 13.0 leaves bit 3 clear for ``sm_90a``/``sm_100a`` cubins and records the
``a`` instead as attribute 9 (value 1) in ``.nv.compat``, which is what cuobjdump
reports; both are read. A family-specific ``sm_100f`` cubin is byte-identical to
``sm_100`` (the ``f`` exists only at the fatbinary level), so it reads as ``sm_100``.

What a fatbinary's SASS entry holds is read here too (:func:`cubin_facts`): its
kernels and the release that wrote it, and its arch held to the entry header's.
"""

from __future__ import annotations

import re
import struct

from packaging.version import Version

from buildmatrix.arch import Arch, CodeKind, ComputeCapability, Suffix
from buildmatrix.binary.elf import SHF_EXECINSTR, ElfInfo, is_elf, read_elf
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
        name_off, st_info, st_other, shndx = (
            fields[:4] if ident[4] == 2 else (fields[0], fields[3], fields[4], fields[5])
        )
        # a kernel only declared (an -rdc object launching one defined elsewhere:
        # SHN_UNDEF, index 0) is no kernel of this cubin
        defined = shndx != 0
        if (
            st_info & 0xF == STT_FUNC
            and st_other & STO_CUDA_ENTRY
            and defined
            and name_off < len(names)
        ):
            end = names.find(b"\0", name_off)
            found.append(names[name_off : end if end >= 0 else None].decode("latin-1"))
    return tuple(dict.fromkeys(found))


_RELEASE = re.compile(rb"Cuda compilation tools, release (\d+)\.(\d+)")
_MAX_NOTE = 4096


def _kernels(cubin: ByteSource, info: ElfInfo) -> tuple[str, ...] | None:
    """A cubin's kernels: its symbol table's entry functions (:func:`entry_symbols`,
    what cuobjdump lists as ENTRY), where it has any. A ``.text.NAME`` section is not
    always a kernel's: with ``-G`` (and with relocatable device code) nvcc gives a
    ``__device__`` function kept out of line a section of its own, which no PTX
    ``.entry`` matches. Without entry symbols, its ``.text.NAME`` sections, as nvcc
    names them, and where it has none, or executable code (``SHF_EXECINSTR``) in a
    section named otherwise, the entry functions too. Executable code whose kernels
    cannot be named so is None (unknown): such a cubin is never taken for a
    device-link stub."""
    entries = entry_symbols(cubin, info)
    if entries:
        return entries
    named = tuple(s.name[6:] for s in info.sections if s.name.startswith(".text."))
    other_code = any(
        s.flags & SHF_EXECINSTR and s.size and not s.name.startswith(".text.")
        for s in info.sections
    )
    if named and not other_code:
        return named
    if other_code and not entries:
        return None
    return tuple(dict.fromkeys(named + (entries or ())))


def cubin_facts(
    cubin: ByteSource, *, header: Arch | None = None
) -> tuple[tuple[str, ...] | None, Version | None]:
    """(kernels, toolkit) of a cubin, read in place from its section table: nvcc puts
    each kernel in a ``.text.NAME`` section (a device-link stub has none;
    :func:`_kernels`), and
    ptxas/nvlink record their release in ``.note.nv.tkinfo`` ("Cuda compilation tools,
    release 13.0"). (None, None) when it is not a readable ELF.

    ``header``: the arch the fatbinary entry header claims for this cubin, checked
    against the cubin's own (:func:`check_cubin_arch`); an ELF cubin whose section
    table cannot be read is then refused too, not passed on its header's word."""
    try:
        if not is_elf(cubin.read_at(0, 16)):
            return None, None
        info = read_elf(cubin)
        sections = info.sections
        kernels = _kernels(cubin, info)
        note = next((s for s in sections if s.name == ".note.nv.tkinfo"), None)
        found = (
            _RELEASE.search(cubin.read_at(note.offset, min(note.size, _MAX_NOTE))) if note else None
        )
    except CorruptBinary:
        if header is not None:
            raise  # an ELF whose arch cannot be held to its header's (check_cubin_arch)
        return None, None
    if header is not None:
        check_cubin_arch(cubin, info, header)
    return kernels, Version(f"{int(found[1])}.{int(found[2])}") if found else None


def check_cubin_arch(cubin: ByteSource, info: ElfInfo, header: Arch) -> None:
    """Refuse a cubin whose own arch (ELF ``e_flags``, buildmatrix.binary.cubin) is not
    the one its fatbinary entry header claims. The CUDA driver runs the cubin, whose
    code is built for its own SM (cuobjdump names it by ``e_flags`` too), so judging by
    a relabelled header would pass code that cannot run (docs/security.md, "Device
    code that tries not to be seen"). The cubin may be *less* specific than the header
    (nvcc writes ``sm_100f`` cubins identical to ``sm_100``), never more."""
    own = cubin_arch(cubin, info)
    if own.cc != header.cc or (own.suffix is Suffix.ARCH and header.suffix is not Suffix.ARCH):
        raise CorruptBinary(
            f"{cubin.name}: the fatbinary entry header says {header} but the cubin's ELF "
            f"header (e_flags {info.flags:#x}) says {own}; the driver runs the cubin, so "
            "the file is refused rather than judged by either. Rebuild it with nvcc."
        )
