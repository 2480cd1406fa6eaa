"""The ELF section reader: agrees with pyelftools on real files, refuses broken ones."""

from __future__ import annotations

import struct

import pytest
from elftools.elf.elffile import ELFFile

from buildmatrix.binary.elf import EM_AARCH64, EM_CUDA, read_elf
from buildmatrix.binary.source import BytesSource, CorruptBinary
from tests.binaries import container, elf_with_section, entry
from tests.fixtures.build import BIN

ELF_FIXTURES = [
    "libmulti.so",
    "librdc.so",
    "app",
    "kernels_rdc.o",
    "kernels_sm90a.cubin",
    "libhost_only.so",
    "libsass_ptx_aarch64.so",  # EM_AARCH64
]


def _machine(ref: ELFFile) -> int:
    # pyelftools names known machines ('EM_X86_64') and leaves unknown ones as numbers.
    value = ref.header.e_machine
    if isinstance(value, str):
        return {"EM_X86_64": 62, "EM_AARCH64": EM_AARCH64, "EM_CUDA": EM_CUDA}[value]
    return int(value)


@pytest.mark.parametrize("name", ELF_FIXTURES)
def test_sections_agree_with_pyelftools(name: str) -> None:
    data = (BIN / name).read_bytes()
    ours = read_elf(BytesSource(data, name=name))
    with (BIN / name).open("rb") as f:
        ref = ELFFile(f)
        expected = [(s.name, s["sh_offset"], s["sh_size"]) for s in ref.iter_sections()]
        assert ours.machine == _machine(ref)
        assert ours.flags == ref.header.e_flags
    got = [(s.name, s.offset, s.size) for s in ours.sections]
    # NOBITS sections occupy no file bytes; we report them with size 0.
    nobits = {s.name for s in ours.sections if s.type == 8}
    assert [g for g in got if g[0] not in nobits] == [e for e in expected if e[0] not in nobits]


def test_cubin_machine() -> None:
    data = (BIN / "kernels_sm80.cubin").read_bytes()
    assert read_elf(BytesSource(data, name="c")).machine == EM_CUDA


def _good() -> bytes:
    return elf_with_section(".nv_fatbin", container(entry()))


def _patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[:10], "ELF identification .* runs past the end"),
        (lambda d: d[:40], "ELF header .* runs past the end"),
        (lambda d: d[: len(d) - 100], "ELF section header table .* runs past the end"),
        (lambda d: d[:4] + b"\x07" + d[5:], "unknown ELF class 7"),
        (lambda d: _patch(d, 40, "<Q", 1 << 62), "section header table .* runs past the end"),
        (lambda d: _patch(d, 58, "<H", 16), "section header size 16 is too small"),
        (lambda d: _patch(d, 62, "<H", 9), "section-name table index 9 is out of range"),
    ],
    ids=["ident", "header", "table", "class", "shoff", "shentsize", "shstrndx"],
)
def test_corrupt_elf(mutate: object, message: str) -> None:
    data = mutate(_good())  # type: ignore[operator]
    with pytest.raises(CorruptBinary, match=message):
        read_elf(BytesSource(data, name="bad.so"))


def test_section_data_past_end() -> None:
    from buildmatrix.binary.scan import inspect_source

    data = _good()
    # Point the .nv_fatbin section (header 2) past the end of the file.
    shoff = struct.unpack_from("<Q", data, 40)[0]
    bad = _patch(data, shoff + 2 * 64 + 24, "<Q", len(data) + 4096)
    with pytest.raises(CorruptBinary, match="past the end of the file"):
        inspect_source(BytesSource(bad, name="bad.so"), path="bad.so")


def test_fixture_folder_exists() -> None:
    assert (BIN / "libmulti.so").is_file()
