"""A cubin's arch from its ELF header, held to cuobjdump on every SM and flag.

NVIDIA has two ``e_flags`` layouts (buildmatrix/binary/cubin.py). nvcc 13's cubins
(tests/fixtures/bin: ``kernels_sm90.cubin``, and ``kernels_sm90a.cubin`` whose
``.nv.compat`` attribute 9 says ``a``) are rewritten into each: the SM, the
accelerator bit of the layout, the compat attribute (kept, or turned into another) and the
release the cubin names in ``.note.nv.cuinfo`` (cuobjdump reads the attribute for a
CUDA 13 cubin, mostly the bit for an older one). cuobjdump's ``--list-elf`` name of each is
the truth: buildmatrix names the same SM always; the same suffix wherever NVIDIA's
compilers write such a header; and, where a hand-made one sets only one of the two
signs of ``a``, never a less specific one (never a false pass).
"""

from __future__ import annotations

import struct
import subprocess
from io import BytesIO
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from buildmatrix.binary.scan import inspect_file
from tests.cuobjdump import find_cuobjdump
from tests.fixtures.build import BIN

pytestmark = pytest.mark.integration

# The SMs cuobjdump 13.x names (older ones it refuses: "Support for 'sm_35' has been
# removed"), Tegra ones included.
SMS = (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 110, 120, 121)
_OLD, _NEW = (0x33, 7), (0x41, 8)  # (EI_OSABI, EI_ABIVERSION) of each layout


@pytest.fixture(scope="module")
def tool() -> Path:
    found = find_cuobjdump()
    if found is None:
        pytest.skip("cuobjdump (pip package nvidia-cuda-cuobjdump) is the oracle here")
    return found


def _mutated(
    base: bytes, *, layout: tuple[int, int], flags: int, compat: bool = True, release: int = 0
) -> bytes:
    """``base`` with the given ELF identification and ``e_flags``; the arch-specific
    attribute (9) of its ``.nv.compat`` turned into another (1) unless ``compat``; the
    release in ``.note.nv.cuinfo`` (CUDA major * 10 + minor, as nvcc writes it: 130 is
    13.0) replaced where ``release``."""
    out = bytearray(base)
    out[7], out[8] = layout
    struct.pack_into("<I", out, 48, flags)
    elf = ELFFile(BytesIO(base))
    if not compat:
        section = elf.get_section_by_name(".nv.compat")
        assert section is not None
        at = section["sh_offset"]
        # the first attribute: format 2 (u16 value), id 9 (nvcc 13.0 writes it first)
        assert out[at : at + 2] == b"\x02\x09"
        out[at + 1] = 1
    if release:
        note = elf.get_section_by_name(".note.nv.cuinfo")
        assert note is not None
        # namesz 12, descsz 8, type; "NVIDIA Corp\0"; desc: u16 version, u16 SM, u32 release
        desc = note["sh_offset"] + 12 + 12
        assert struct.unpack_from("<I", out, desc + 4)[0] == 130  # nvcc 13.0's
        struct.pack_into("<I", out, desc + 4, release)
    return bytes(out)


def _cuobjdump_name(tool: Path, path: Path) -> str:
    proc = subprocess.run(
        [str(tool), "--list-elf", str(path)], capture_output=True, text=True, check=True
    )
    # "ELF file    1: k.sm_90a.cubin"
    return proc.stdout.strip().rsplit(".", 2)[1]


def _ours(path: Path) -> str:
    report = inspect_file(path)
    assert report is not None
    (entry,) = report.entries
    return entry.arch_name


def _both(tool: Path, tmp_path: Path, blob: bytes) -> tuple[str, str]:
    path = tmp_path / "k.cubin"
    path.write_bytes(blob)
    return _ours(path), _cuobjdump_name(tool, path)


@pytest.mark.parametrize("sm", SMS)
def test_the_old_layout_is_named_as_cuobjdump_names_it(tool: Path, tmp_path: Path, sm: int) -> None:
    """SM in the low byte, PTX SM in bits 16..23, 0x800 the ``a`` from sm_90 on: the
    hand-written sm_50 objects of cuBLAS 12.8 (e_flags 0x3c0d32) are plain sm_50."""
    base = (BIN / "kernels_sm90.cubin").read_bytes()
    for virtual in (sm, 60):
        for bits in (0x500, 0xD00, 0x100, 0x900):
            blob = _mutated(base, layout=_OLD, flags=virtual << 16 | bits | sm)
            ours, theirs = _both(tool, tmp_path, blob)
            assert ours == theirs, (hex(virtual << 16 | bits | sm), ours, theirs)
    ours, theirs = _both(tool, tmp_path, _mutated(base, layout=_OLD, flags=0x3C0D00 | sm))
    assert theirs == f"sm_{sm}" + ("a" if sm >= 90 else "")
    assert ours == theirs


@pytest.mark.parametrize("sm", SMS)
def test_the_new_layout_is_named_as_cuobjdump_names_it(tool: Path, tmp_path: Path, sm: int) -> None:
    """SM in bits 8..15; ``a`` from sm_90 on, by bit 3 or ``.nv.compat``."""
    for fixture in ("kernels_sm90.cubin", "kernels_sm90a.cubin"):
        base = (BIN / fixture).read_bytes()
        for bit in (0, 0x8):
            for compat in (True, False):
                for release in (0, 128):  # as nvcc 13.0 wrote it; CUDA 12.8
                    flags = 0x06000004 | sm << 8 | bit
                    blob = _mutated(base, layout=_NEW, flags=flags, compat=compat, release=release)
                    ours, theirs = _both(tool, tmp_path, blob)
                    case = (fixture, hex(flags), compat, release, ours, theirs)
                    assert ours.removesuffix("a") == theirs.removesuffix("a"), case
                    # never less specific than NVIDIA's reading
                    assert ours.endswith("a") or not theirs.endswith("a"), case
                    # as nvcc 13.0 writes a cubin (bit clear, attribute), and as
                    # CUDA 12.8 does (the bit, no attribute): the very same name
                    if (release == 0 and not bit and compat) or (release == 128 and not compat):
                        assert ours == theirs, case


def test_a_layout_its_abi_version_contradicts_is_refused(tmp_path: Path) -> None:
    """EI_OSABI of the new layout with the old ABI version (and the reverse): LLVM
    and cuobjdump would read the flags differently, so neither reading is trusted."""
    from buildmatrix.binary.source import CorruptBinary

    base = (BIN / "kernels_sm90.cubin").read_bytes()
    for layout, flags in (((0x41, 7), 0x06005A04), ((0x33, 8), 0x5A055A)):
        path = tmp_path / "k.cubin"
        path.write_bytes(_mutated(base, layout=layout, flags=flags))
        with pytest.raises(CorruptBinary, match="read as two different layouts"):
            inspect_file(path)
