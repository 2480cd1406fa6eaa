"""What the CUDA runtime registers is what each ``.nvFatBinSegment`` wrapper points
at (``__cudaRegisterFatBinary`` takes the wrapper), with the pointer the dynamic
loader writes: the section headers and the bytes in place may say otherwise.

The mutated libraries are made here from the committed nvcc-built fixtures with
binutils (objcopy, gcc) or by patching bytes; the oracle for the pointers is
``readelf -r`` (binutils), which prints each dynamic relocation."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from buildmatrix.binary.elf import read_layout
from buildmatrix.binary.registered import wrapped_containers
from buildmatrix.binary.source import FileSource
from tests.conftest import CliRunner
from tests.fixtures.build import BIN

needs_binutils = pytest.mark.skipif(
    shutil.which("objcopy") is None or shutil.which("readelf") is None, reason="binutils needed"
)


def _fatbin_bytes(lib: Path, out: Path) -> bytes:
    subprocess.run(
        ["objcopy", "-O", "binary", "--only-section=.nv_fatbin", str(lib), str(out)], check=True
    )
    return out.read_bytes()


def _loads(lib: Path) -> list[tuple[int, int]]:
    """(file offset, file size) of each PT_LOAD, as readelf prints them."""
    text = subprocess.run(
        ["readelf", "-lW", str(lib)], check=True, capture_output=True, text=True
    ).stdout
    return [
        (int(o, 16), int(n, 16)) for o, n in re.findall(r"LOAD\s+(\S+)\s+\S+\s+\S+\s+(\S+)", text)
    ]


@needs_binutils
def test_a_renamed_fatbin_and_an_unloaded_decoy_section_fail(
    cli: CliRunner, tmp_path: Path
) -> None:
    """objcopy renames the real (sm_80) .nv_fatbin and adds a decoy .nv_fatbin holding
    sm_90a code, which is not allocated: nothing loads it."""
    decoy = tmp_path / "hopper.fatbin"
    _fatbin_bytes(BIN / "libhopper_a.so", decoy)
    lib = tmp_path / "libsass_sm80.so"
    subprocess.run(
        [
            "objcopy",
            "--rename-section",
            ".nv_fatbin=.rodata.x",
            "--add-section",
            f".nv_fatbin={decoy}",
            str(BIN / "libsass_sm80.so"),
            str(lib),
        ],
        check=True,
    )
    result = cli("check", str(lib), "--sm", "9.0")
    assert result.code == 1, result.out + result.err
    assert "sm_80" in result.out
    assert cli("check", str(lib), "--sm", "8.0").code == 0  # the registered code is judged


def _with_decoy_header(src: Path, decoy: bytes, out: Path, *, index: int | None = None) -> None:
    """Append ``decoy`` after every segment and point a section header named
    .nv_fatbin at it: the .nv_fatbin one (``index`` None) or header ``index``, renamed."""
    b = bytearray(src.read_bytes())
    (shoff,) = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    (stroff,) = struct.unpack_from("<Q", b, shoff + shstrndx * shentsize + 24)

    def name(i: int) -> bytes:
        (n,) = struct.unpack_from("<I", b, shoff + i * shentsize)
        return bytes(b[stroff + n : b.index(0, stroff + n)])

    real = next(i for i in range(shnum) if name(i) == b".nv_fatbin")
    target = real if index is None else index
    header = shoff + target * shentsize
    struct.pack_into("<I", b, header, struct.unpack_from("<I", b, shoff + real * shentsize)[0])
    at = len(b)
    b += decoy
    struct.pack_into("<IIQ", b, header + 4, 1, 2, 0)  # PROGBITS, SHF_ALLOC
    struct.pack_into("<QQ", b, header + 24, at, len(decoy))
    out.write_bytes(bytes(b))


@needs_binutils
@pytest.mark.parametrize("index", [None, 1], ids=["moved", "second-section"])
def test_a_section_header_pointing_at_bytes_nothing_loads_fails(
    cli: CliRunner, tmp_path: Path, index: int | None
) -> None:
    """Only the section header table changes (every loaded byte stays the sm_80-only
    original): the .nv_fatbin header moved to an sm_90a fatbinary appended to the
    file, or a second header named .nv_fatbin, placed first, pointing there."""
    decoy = _fatbin_bytes(BIN / "libhopper_a.so", tmp_path / "hopper.fatbin")
    (tmp_path / "lib").mkdir()
    lib = tmp_path / "lib" / "libsass_sm80.so"
    _with_decoy_header(BIN / "libsass_sm80.so", decoy, lib, index=index)
    original, mutated = (BIN / "libsass_sm80.so").read_bytes(), lib.read_bytes()
    loads = _loads(lib)
    assert loads and all(original[o : o + n] == mutated[o : o + n] for o, n in loads)
    result = cli("check", f"dir:{lib.parent}", "--sm", "9.0")
    assert result.code == 1, result.out + result.err
    assert cli("check", f"dir:{lib.parent}", "--sm", "8.0").code == 0


_LIB_C = """
{decl}
struct W {{ int magic; int version; const void *data; void *f; }};
__attribute__((section(".nvFatBinSegment"), aligned(8), used)) static struct W wrapper =
    {{0x466243b1, 1, fatbin + 0x600, 0}};
const void *get(void) {{ return &wrapper; }}
"""


def _strip_section_headers(lib: Path) -> None:
    b = bytearray(lib.read_bytes())
    struct.pack_into("<Q", b, 0x28, 0)  # e_shoff
    struct.pack_into("<HHH", b, 0x3A, 0, 0, 0)  # e_shentsize, e_shnum, e_shstrndx
    lib.write_bytes(bytes(b))


def _exported_fatbin_library(tmp_path: Path, cc: list[str], *, defined: bool = True) -> Path:
    """A library whose wrapper points at an exported sm_80 fatbinary: the pointer is
    a symbol relocation (R_X86_64_64 / R_AARCH64_ABS64) and the bytes in place are 0."""
    data = _fatbin_bytes(BIN / "libsass_sm80.so", tmp_path / "sm80.fatbin")
    decl = (
        '__attribute__((section(".nv_fatbin"), aligned(8), used)) const unsigned char '
        f"fatbin[{len(data)}] = {{{','.join(map(str, data))}}};"
        if defined
        else "extern const unsigned char fatbin[];"
    )
    (tmp_path / "lib.c").write_text(_LIB_C.format(decl=decl))
    (tmp_path / "img").mkdir()
    lib = tmp_path / "img" / "libk.so"
    subprocess.run(
        [*cc, "-O2", "-fPIC", "-shared", "-o", str(lib), str(tmp_path / "lib.c")], check=True
    )
    return lib


COMPILERS = [
    pytest.param(["gcc", "-Wl,-z,noseparate-code"], id="x86_64"),
    pytest.param(["aarch64-linux-gnu-gcc", "-nostdlib"], id="aarch64"),
]


@needs_binutils
@pytest.mark.parametrize("cc", COMPILERS)
def test_a_wrapper_pointer_set_by_a_symbol_relocation_is_followed(
    cli: CliRunner, tmp_path: Path, cc: list[str]
) -> None:
    if shutil.which(cc[0]) is None:
        pytest.skip(f"{cc[0]} needed (scripts/test installs it)")
    lib = _exported_fatbin_library(tmp_path, cc)
    relocs = subprocess.run(
        ["readelf", "-rW", str(lib)], check=True, capture_output=True, text=True
    ).stdout
    assert re.search(r"R_(X86_64_64|AARCH64_ABS64)\s+\S+\s+fatbin \+ 600", relocs), relocs
    _strip_section_headers(lib)
    shutil.copy(BIN / "libhopper_a.so", lib.parent)  # real sm_90a code beside it
    result = cli("check", f"dir:{lib.parent}", "--sm", "9.0")
    assert result.code == 1, result.out + result.err
    assert "libk.so: sm_80 SASS" in result.out


@needs_binutils
def test_a_wrapper_pointing_into_another_object_is_refused(cli: CliRunner, tmp_path: Path) -> None:
    """The fatbinary symbol is undefined here: the loader takes it from another
    object, so what is registered cannot be read from this file."""
    lib = _exported_fatbin_library(tmp_path, ["gcc"], defined=False)
    refused = cli("check", str(lib), "--sm", "9.0")
    assert refused.code == 2, refused.out + refused.err
    assert "libk.so" in refused.err and "runtime wrapper" in refused.err
    in_tree = cli("check", f"dir:{lib.parent}", "--sm", "9.0")  # an unreadable file fails
    assert in_tree.code == 1 and "unreadable: libk.so" in in_tree.out


def _readelf_pointers(lib: Path) -> dict[int, int]:
    """address -> addend of every R_X86_64_RELATIVE / R_AARCH64_RELATIVE relocation,
    as readelf prints it."""
    text = subprocess.run(
        ["readelf", "-rW", str(lib)], check=True, capture_output=True, text=True
    ).stdout
    return {
        int(at, 16): int(addend, 16)
        for at, addend in re.findall(
            r"^([0-9a-f]+)\s+\S+\s+R_(?:X86_64|AARCH64)_RELATIVE\s+([0-9a-f]+)", text, re.M
        )
    }


@needs_binutils
@pytest.mark.parametrize(
    "name", sorted(p.name for p in BIN.iterdir() if p.suffix == ".so" or p.name == "app")
)
def test_each_wrapper_pointer_is_the_loaders(name: str) -> None:
    """Every committed linked fixture: each container a wrapper leads to starts where
    readelf's relocation for that wrapper's pointer says (vaddr mapped to the file)."""
    lib = BIN / name
    fd = os.open(lib, os.O_RDONLY)
    try:
        src = FileSource(fd, name=name)
        layout = read_layout(src)
        regions = [(g.offset, g.filesz) for g in layout.segments if g.writable]
        (machine,) = struct.unpack_from("<H", src.read_at(18, 2))  # e_machine
        spans = wrapped_containers(src, layout, regions, machine=machine)
    finally:
        os.close(fd)
    pointers = _readelf_pointers(lib)
    text = subprocess.run(
        ["readelf", "-SW", str(lib)], check=True, capture_output=True, text=True
    ).stdout
    seg = re.search(r"\.nvFatBinSegment\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", text)
    if seg is None:
        assert spans == []
        return
    addr, size = int(seg[1], 16), int(seg[3], 16)
    expected = [
        layout.file_offset(pointers[a + 8], 16)
        for a in range(addr, addr + size, 24)
        if a + 8 in pointers
    ]
    assert expected and [at for at, _size, _v in spans] == expected


def _patched_sm80(tmp_path: Path, patch: str) -> Path:
    """libsass_sm80.so with one change to how its wrapper pointer (at 0x5088, set by an
    R_X86_64_RELATIVE relocation to 0x2630, readelf -r) is loaded:
    ``hidden-dynamic``: PT_DYNAMIC's sizes zeroed (glibc reads from its address to
    DT_NULL whatever they say) and the bytes in place aimed at the file's other
    container; ``two-relocations``: a second relocation, to 0x2030, on the pointer."""
    lib = BIN / "libsass_sm80.so"
    b = bytearray(lib.read_bytes())
    text = subprocess.run(["readelf", "-rW", str(lib)], check=True, capture_output=True, text=True)
    assert re.search(r"^0+5088\s+0+8\s+R_X86_64_RELATIVE\s+2630$", text.stdout, re.M)
    (phoff,) = struct.unpack_from("<Q", b, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", b, 0x36)
    if patch == "hidden-dynamic":
        dynamic = next(
            phoff + i * phentsize
            for i in range(phnum)
            if struct.unpack_from("<I", b, phoff + i * phentsize)[0] == 2
        )
        struct.pack_into("<QQ", b, dynamic + 32, 0, 0)  # p_filesz, p_memsz
        struct.pack_into("<Q", b, 0x4088, 0x2030)  # file offset of address 0x5088
    else:
        rela = int(re.search(r"'\.rela\.dyn' at offset (0x[0-9a-f]+)", text.stdout)[1], 16)  # type: ignore[index]
        first = struct.unpack_from("<QQq", b, rela)
        assert first[1] == 8  # R_X86_64_RELATIVE
        struct.pack_into("<QQq", b, rela, 0x5088, 8, 0x2030)
    (tmp_path / "lib").mkdir()
    out = tmp_path / "lib" / "libsass_sm80.so"
    out.write_bytes(bytes(b))
    return out


@needs_binutils
def test_pt_dynamic_sizes_do_not_hide_the_relocation(tmp_path: Path) -> None:
    lib = _patched_sm80(tmp_path, "hidden-dynamic")
    fd = os.open(lib, os.O_RDONLY)
    try:
        src = FileSource(fd, name=lib.name)
        layout = read_layout(src)
        spans = wrapped_containers(src, layout, [(0x4080, 0x18)], machine=62)
    finally:
        os.close(fd)
    assert [at for at, _size, _version in spans] == [layout.file_offset(0x2630, 16)]


@needs_binutils
def test_two_relocations_on_one_wrapper_pointer_are_refused(cli: CliRunner, tmp_path: Path) -> None:
    lib = _patched_sm80(tmp_path, "two-relocations")
    result = cli("check", str(lib), "--sm", "8.0")
    assert result.code == 2, result.out + result.err
    assert "several relocations" in result.err
