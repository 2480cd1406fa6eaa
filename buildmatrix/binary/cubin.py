"""Standalone CUDA ELF objects (``.cubin``): the SM they were built for.

``e_flags`` has two layouts (LLVM ``llvm/include/llvm/BinaryFormat/ELF.h``,
``EF_CUDA_*``; ``llvm/lib/Object/ELFObjectFile.cpp``, ``getNVPTXCPUName``):

- the old one (``EI_OSABI`` 0x33, ``EI_ABIVERSION`` 7: every cubin of CUDA 12.x up
  to sm_90, and of older releases): SM in the low byte (``EF_CUDA_SM``), the PTX SM
  it was compiled from in bits 16..23 (``EF_CUDA_VIRTUAL_SM``), texture mode and
  addressing flags in bits 8..10, and ``EF_CUDA_ACCELERATORS_V1`` (0x800) at bit 11;
- the new one (``EI_OSABI`` 0x41, ``EI_ABIVERSION`` 8: CUDA 12.8+ for sm_100 and
  later, CUDA 13 for every SM): SM in bits 8..15 (``EF_CUDA_SM_MASK``),
  ``EF_CUDA_ACCELERATORS`` (0x8) at bit 3.

cuobjdump (13.5, tried on every SM and flag: tests/test_cubin_flags.py) picks the
layout by ``EI_OSABI`` alone and names a cubin ``a`` only from sm_90 on, the first SM
with an arch-specific variant: below it the accelerator bit means nothing (LLVM too
reads it for ``EF_CUDA_SM90`` alone in the old layout). cuBLAS 12.8's hand-written
sm_50 ``sgemm`` objects carry 0x800 (e_flags 0x3c0d32) and are plain sm_50, as
cuobjdump lists them. In the new layout nvcc 13 leaves bit 3 clear and writes the
``a`` as attribute 9 (value 1) of the ``.nv.compat`` section instead; cuobjdump
reads that attribute for a cubin of CUDA 13 or later (``.note.nv.cuinfo``) and the
bit for an older one (CUDA 12.8's sm_100a cubins have the bit and no attribute).
Both are read here and either makes the cubin ``a``: the two agree on every cubin
NVIDIA's wheels hold (tests/test_nvidia_cubins.py), and where a hand-made header
sets one alone the narrower reading is kept, never a false pass. The old layout has
no such attribute (cuobjdump ignores it there). A family-specific ``sm_100f`` cubin
is byte-identical to ``sm_100`` (the ``f`` exists only at the fatbinary level), so
it reads as ``sm_100``.

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

_EF_ACCEL_V1 = 0x800  # EF_CUDA_ACCELERATORS_V1, old layout
_EF_ACCEL_V2 = 0x8  # EF_CUDA_ACCELERATORS, new layout
# EI_OSABI of each layout (LLVM ELF.h: ELFOSABI_CUDA 51, ELFOSABI_CUDA_V2 65) and the
# ABI version that goes with it (ELFABIVERSION_CUDA_V1 7, ELFABIVERSION_CUDA_V2 8).
_OSABI_V2 = 0x41
_ABI_V2 = 8
# The first SM with an arch-specific (``a``) variant: below it cuobjdump ignores the
# accelerator bits of either layout.
_FIRST_ARCH_SPECIFIC = 90
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
    """Whether attribute 9 of ``.nv.compat`` says arch-specific (value 1)."""
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
    """The SASS arch of a standalone cubin (``info.machine == EM_CUDA``), as
    cuobjdump names it (see the module's docstring). A cubin whose ABI version is
    not its ``EI_OSABI``'s is refused: LLVM picks the layout by the one, cuobjdump by
    the other, and no CUDA release writes such a header."""
    new_layout = info.osabi == _OSABI_V2
    if new_layout != (info.abi_version >= _ABI_V2):
        raise CorruptBinary(
            f"{src.name}: CUDA ELF with EI_OSABI {info.osabi:#x} and ABI version "
            f"{info.abi_version}: its e_flags {info.flags:#x} read as two different "
            "layouts, so the cubin is refused rather than judged by either. Rebuild it "
            "with nvcc."
        )
    number = (info.flags >> 8) & 0xFF if new_layout else info.flags & 0xFF
    if number < 10:
        raise CorruptBinary(f"{src.name}: CUDA ELF with e_flags {info.flags:#x} names no SM.")
    specific = False
    if number >= _FIRST_ARCH_SPECIFIC and new_layout:
        specific = bool(info.flags & _EF_ACCEL_V2) or _compat_arch_specific(src, info)
    elif number >= _FIRST_ARCH_SPECIFIC:
        specific = bool(info.flags & _EF_ACCEL_V1)
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
    # st_name, st_info, st_other, st_shndx, the rest skipped (ELF64: name, info, other,
    # shndx, value, size; ELF32: name, value, size, info, other, shndx)
    entry, fmt = (24, "IBBH16x") if ident[4] == 2 else (16, "I8xBBH")
    table = read_exact(src, symtab.offset, symtab.size, what="symbol table")
    names = read_exact(src, strtab.offset, strtab.size, what="symbol string table")
    whole = len(table) - len(table) % entry  # a partial symbol at the end is no symbol
    # a kernel only declared (an -rdc object launching one defined elsewhere:
    # SHN_UNDEF, index 0) is no kernel of this cubin
    kernels = [
        name_off
        for name_off, st_info, st_other, shndx in struct.iter_unpack(order + fmt, table[:whole])
        if st_other & STO_CUDA_ENTRY and st_info & 0xF == STT_FUNC and shndx != 0
    ]
    found = []
    for name_off in kernels:
        if name_off < len(names):
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
