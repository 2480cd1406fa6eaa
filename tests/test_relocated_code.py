"""Device code the dynamic loader rewrites: a relocation whose target lies in the
registered fatbinary changes the bytes the CUDA runtime hands to the driver (an
entry's arch, a cubin's e_flags), so ``check`` refuses the file (exit 2, or an
unreadable file in a tree) rather than judge the bytes in the file.

The libraries are built here with gcc (an sm_80 fatbinary from the committed nvcc
fixtures in ``.nv_fatbin``, and the runtime's wrapper pointing at it); one
relocation of each kind the x86-64 loader applies is then aimed inside the
fatbinary. The oracle is glibc's own loader: a child process ``dlopen``s the
library and reads the fatbinary back from memory, and cuobjdump lists what the
loaded bytes hold."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from buildmatrix.binary.dynrel import relocation_into
from buildmatrix.binary.elf import read_layout
from buildmatrix.binary.source import FileSource
from tests.conftest import CliRunner
from tests.cuobjdump import find_cuobjdump
from tests.fixtures.build import BIN

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("readelf") is None or sys.platform != "linux",
    reason="gcc, binutils and the glibc loader needed",
)

_ABS_C = '__asm__(".globl bm_abs\\n.set bm_abs, 0\\n");\nint bm_fn(void) { return 1; }\n'
_LIB_C = """
__attribute__((section(".nv_fatbin"), aligned(8), used)) unsigned char fatbin[{n}] =
    {{{data}}};
struct W {{ int magic; int version; const void *data; void *f; }};
__attribute__((section(".nvFatBinSegment"), aligned(8), used)) static struct W wrapper =
    {{0x466243b1, 1, fatbin + 0x600, 0}};
extern char bm_abs[];
extern int bm_fn(void);
static int local;
void *slot_64 = bm_abs;            /* R_X86_64_64 against bm_abs (0, from libabs.so) */
void *slot_relative = &local;      /* R_X86_64_RELATIVE, or a DT_RELR word */
const void *get(void) {{ return &wrapper; }}
void *glob_dat(void) {{ return (void *)&bm_abs[0]; }}  /* R_X86_64_GLOB_DAT */
int jump_slot(void) {{ return bm_fn(); }}                /* R_X86_64_JUMP_SLOT */
"""
_READ_BACK = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
fatbin = ctypes.c_char.in_dll(lib, "fatbin")
sys.stdout.buffer.write(ctypes.string_at(ctypes.addressof(fatbin), int(sys.argv[2])))
"""


def _readelf(*args: str) -> str:
    return subprocess.run(["readelf", *args], check=True, capture_output=True, text=True).stdout


def _library(tmp_path: Path, *, relr: bool, compiler: str = "gcc") -> tuple[Path, bytes]:
    raw = tmp_path / "sm80.fatbin"
    subprocess.run(
        ["objcopy", "-O", "binary", "--only-section=.nv_fatbin", str(BIN / "libsass_sm80.so"), raw],
        check=True,
    )
    fatbin = raw.read_bytes()
    (tmp_path / "abs.c").write_text(_ABS_C)
    (tmp_path / "lib.c").write_text(_LIB_C.format(n=len(fatbin), data=",".join(map(str, fatbin))))
    lib = tmp_path / "img" / "libk.so"
    lib.parent.mkdir()
    cc = [compiler, "-O1", "-fPIC", "-shared", "-nostartfiles", "-Wl,-z,now"]
    if compiler != "gcc":
        cc.append("-nostdlib")  # the cross compiler has no C library to link
    subprocess.run([*cc, "-o", str(lib.parent / "libabs.so"), str(tmp_path / "abs.c")], check=True)
    packed = ["-Wl,-z,pack-relative-relocs"] if relr else []
    link = [f"-L{lib.parent}", "-labs", "-Wl,-rpath,$ORIGIN", *packed]
    subprocess.run([*cc, "-o", str(lib), str(tmp_path / "lib.c"), *link], check=True)
    return lib, fatbin


def _symbol(lib: Path, name: str) -> int:
    m = re.search(rf"^\s*\d+:\s+([0-9a-f]+)\s.*\s{name}$", _readelf("-sW", str(lib)), re.M)
    assert m, name
    return int(m[1], 16)


def _aim(lib: Path, kind: str, target: int) -> None:
    """Move the one relocation of ``kind`` onto address ``target`` (a word inside the
    fatbinary), in the file's own relocation table."""
    b = bytearray(lib.read_bytes())
    sections = _readelf("-SW", str(lib))

    def section(name: str) -> tuple[int, int]:
        m = re.search(
            rf"\s{re.escape(name)}\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", sections
        )
        assert m, (name, sections)
        return int(m[1], 16), int(m[2], 16)

    if kind == "RELR":
        at, size = section(".relr.dyn")
        words = struct.unpack_from(f"<{size // 8}Q", b, at)
        assert words and not words[0] & 1  # an address word first
        struct.pack_into("<Q", b, at, target)
        assert all(w & 1 for w in words[1:]) or len(words) > 1
    else:
        where = {
            "64": _symbol(lib, "slot_64"),
            "RELATIVE": _symbol(lib, "slot_relative"),
        }
        text = _readelf("-rW", str(lib))
        pattern = {
            "64": rf"^0*{where.get('64', 0):x}\s+\S+\s+R_X86_64_64\s",
            "RELATIVE": rf"^0*{where.get('RELATIVE', 0):x}\s+\S+\s+R_X86_64_RELATIVE\s",
            "GLOB_DAT": r"^([0-9a-f]+)\s+\S+\s+R_X86_64_GLOB_DAT\s+0+\s+bm_abs",
            "JUMP_SLOT": r"^([0-9a-f]+)\s+\S+\s+R_X86_64_JUMP_SLOT\s+0+\s+bm_fn",
        }[kind]
        m = re.search(pattern, text, re.M)
        assert m, (kind, text)
        r_offset = int(m[0].split()[0], 16)
        table = ".rela.plt" if kind == "JUMP_SLOT" else ".rela.dyn"
        at, size = section(table)
        for i in range(at, at + size, 24):
            if struct.unpack_from("<Q", b, i)[0] == r_offset:
                struct.pack_into("<Q", b, i, target)
                break
        else:
            raise AssertionError(f"no {kind} entry at {r_offset:#x}")
    lib.write_bytes(bytes(b))


def _loaded(lib: Path, size: int) -> bytes:
    """The fatbinary as glibc's loader leaves it in memory (in a child process)."""
    return subprocess.run(
        [sys.executable, "-c", _READ_BACK, str(lib), str(size)], check=True, capture_output=True
    ).stdout


KINDS = ["64", "RELATIVE", "GLOB_DAT", "JUMP_SLOT", "RELR"]


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_a_relocation_into_the_fatbinary_is_refused(
    cli: CliRunner, tmp_path: Path, kind: str
) -> None:
    lib, fatbin = _library(tmp_path, relr=kind == "RELR")
    assert _loaded(lib, len(fatbin)) == fatbin  # as built, the loader leaves it as it is
    assert cli("check", str(lib), "--sm", "8.0").code == 0
    # The registered (second) container's first entry's arch: +16 past its header, +28.
    arch = _symbol(lib, "fatbin") + 0x600 + 16 + 28
    _aim(lib, kind, arch)
    loaded = _loaded(lib, len(fatbin))
    assert loaded != fatbin, "the loader did not apply the moved relocation"
    refused = cli("check", str(lib), "--sm", "8.0")
    assert refused.code == 2, refused.out + refused.err
    assert "rewrites the device code" in refused.err and "libk.so" in refused.err
    in_tree = cli("check", f"dir:{lib.parent}", "--sm", "8.0")
    assert in_tree.code == 1 and "unreadable: libk.so" in in_tree.out


@pytest.mark.integration
def test_an_absolute_relocation_hands_the_driver_another_arch(
    cli: CliRunner, tmp_path: Path
) -> None:
    """The file holds sm_80; the loader writes sm_90 into the registered cubin's
    ``e_flags`` (R_X86_64_64 against an absolute 0, its addend the new word), and
    cuobjdump names the loaded cubin sm_90."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump needed (tests/cuobjdump.py)")
    lib, fatbin = _library(tmp_path, relr=False)
    entry = 0x600 + 16
    (hsize,) = struct.unpack_from("<I", fatbin, entry + 4)
    flags_at = entry + hsize + 48  # e_flags of the ELF64 cubin the entry holds
    flags, after = struct.unpack_from("<II", fatbin, flags_at)
    assert flags & 0xFF00 == 80 << 8 or flags & 0xFF == 80, hex(flags)
    new_flags = flags ^ (80 ^ 90) << (8 if flags & 0xFF00 == 80 << 8 else 0)
    target = _symbol(lib, "fatbin") + flags_at
    _aim(lib, "64", target)
    b = bytearray(lib.read_bytes())
    rela = next(i for i in range(0, len(b) - 24, 8) if struct.unpack_from("<Q", b, i)[0] == target)
    assert struct.unpack_from("<Q", b, rela + 8)[0] & 0xFFFFFFFF == 1  # R_X86_64_64
    struct.pack_into("<q", b, rela + 16, new_flags | after << 32)
    lib.write_bytes(bytes(b))
    loaded = tmp_path / "loaded.fatbin"
    loaded.write_bytes(_loaded(lib, len(fatbin)))
    (tmp_path / "file.fatbin").write_bytes(fatbin)
    listed = {
        name: subprocess.run(
            [str(tool), "-lelf", str(tmp_path / name)], check=True, capture_output=True, text=True
        ).stdout
        for name in ("file.fatbin", "loaded.fatbin")
    }
    assert "sm_80" in listed["file.fatbin"] and "sm_90" in listed["loaded.fatbin"], listed
    refused = cli("check", str(lib), "--sm", "8.0")
    assert refused.code == 2 and "rewrites the device code" in refused.err, refused.err


def _readelf_targets(lib: Path) -> set[int]:
    """Every address a dynamic relocation of ``lib`` writes, as readelf -r prints them
    (RELA entries with their type, DT_RELR entries decoded to addresses)."""
    text = _readelf("-rW", str(lib))
    found = set()
    for line in text.splitlines():
        m = re.match(r"^([0-9a-f]{8,16})(?:\s+[0-9a-f]+\s+R_\w+)?\s*(?:\S.*)?$", line)
        if m and not line.startswith("Relocation"):
            found.add(int(m[1], 16))
    return found


@pytest.mark.integration
@pytest.mark.parametrize("relr", [False, True], ids=["rela", "relr"])
@pytest.mark.parametrize("compiler", ["gcc", "aarch64-linux-gnu-gcc"])
def test_every_relocation_target_is_the_one_readelf_prints(
    tmp_path: Path, relr: bool, compiler: str
) -> None:
    """Exhaustive over the library: a one-byte span at each address of its writable
    segment is hit by a relocation exactly where readelf -r lists one (a word written
    at A also covers A+1..A+7, so each byte's answer is compared with the words). On
    aarch64 too (R_AARCH64_RELATIVE, ABS64, GLOB_DAT, JUMP_SLOT; DT_RELR), where no
    loader runs here: readelf is the oracle."""
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} needed (scripts/test installs it)")
    lib, _fatbin = _library(tmp_path, relr=relr, compiler=compiler)
    kinds = set(re.findall(r"R_(?:X86_64|AARCH64)_(\w+)", _readelf("-rW", str(lib))))
    listed = {"GLOB_DAT", "JUMP_SLOT"} | (set() if relr else {"RELATIVE"})
    assert listed <= kinds, kinds  # RELATIVE ones are packed in DT_RELR with relr
    targets = _readelf_targets(lib)
    assert targets, _readelf("-rW", str(lib))
    with lib.open("rb") as f:
        src = FileSource(f.fileno(), name=lib.name)
        layout = read_layout(src)
        for g in (g for g in layout.segments if g.writable):
            for addr in range(g.vaddr, g.vaddr + g.filesz):
                expected = any(t <= addr < t + 8 for t in targets)
                found = relocation_into(src, layout, [(g.offset + addr - g.vaddr, 1)])
                assert (found is not None) == expected, (hex(addr), found)
