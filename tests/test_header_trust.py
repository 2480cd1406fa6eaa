"""Fatbinary entry headers that disagree with the code they carry, and ELF tables too
large to read (docs/security.md, "Device code that tries not to be seen" and "Bounds").

The driver runs a cubin built for the SM its ELF ``e_flags`` name, and its JIT
compiles a PTX text for the ``.target`` the text names; a header relabelled to another
arch must fail the check, never pass it. The binaries are nvcc's, mutated the way a
hand-edited file would be; cuobjdump and ptxas say what NVIDIA's tools make of them.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator
from io import BytesIO
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from buildmatrix.binary.elf import MAX_TABLE
from tests.conftest import NVCC_CACHE, CliRunner
from tests.cuobjdump import cuobjdump_lists, find_cuobjdump
from tests.fixtures.build import BIN, Fixture, cached_build, have_nvcc

_PTX, _SASS = 1, 2
_COMPRESSED = 0x2000 | 0x8000
_ARCH_SPECIFIC = 0x100000


def _entries(blob: bytes) -> Iterator[tuple[int, int, int]]:
    """(header offset, kind, flags) of each entry of ``.nv_fatbin``, found by
    pyelftools and walked with the layout of docs/inspect.md."""
    section = ELFFile(BytesIO(blob)).get_section_by_name(".nv_fatbin")
    assert section is not None
    pos, end = section["sh_offset"], section["sh_offset"] + section["sh_size"]
    while pos < end:
        if blob[pos] == 0:
            pos += 1
            continue
        _magic, _ver, hsize, size = struct.unpack_from("<IHHQ", blob, pos)
        p = pos + hsize
        while p < pos + hsize + size:
            kind, _, ehsize, payload = struct.unpack_from("<HHIQ", blob, p)
            yield p, kind, struct.unpack_from("<Q", blob, p + 40)[0]
            p += ehsize + payload
        pos += hsize + size


def _relabel(blob: bytes, kind: int, arch: int, *, flags: int = 0) -> tuple[bytes, int]:
    """``blob`` with every ``kind`` entry header's arch (+28) set to ``arch`` and its
    arch-specific flag (+40) replaced by ``flags``'s; and how many were changed."""
    out, count = bytearray(blob), 0
    for at, entry_kind, entry_flags in _entries(blob):
        if entry_kind == kind:
            struct.pack_into("<I", out, at + 28, arch)
            struct.pack_into("<Q", out, at + 40, entry_flags & ~_ARCH_SPECIFIC | flags)
            count += 1
    return bytes(out), count


def _check(cli: CliRunner, tmp_path: Path, blob: bytes, *args: str) -> tuple[int, str]:
    root = tmp_path / "img"
    root.mkdir(exist_ok=True)
    (root / "libk.so").write_bytes(blob)
    result = cli("check", f"dir:{root}", *args, "--json")
    return result.code, "\n".join(result.json()["problems"]) if result.out else result.err


@pytest.mark.parametrize(
    ("fixture", "label", "flags", "sm"),
    [
        ("libsass_sm80.so", 90, 0, "9.0"),
        ("libsass_sm80.so", 86, 0, "8.6"),  # same major, another minor
        ("libsass_sm80.so", 80, _ARCH_SPECIFIC, "8.0"),  # more specific: not a false pass
        ("libsass_sm80_compressed.so", 90, 0, "9.0"),  # decompressed for its toolkit
        ("libhopper_a.so", 90, 0, "9.0"),  # an sm_90a cubin relabelled plain sm_90
    ],
)
def test_a_relabelled_cubin_fails_the_check(
    cli: CliRunner, tmp_path: Path, fixture: str, label: int, flags: int, sm: str
) -> None:
    original = (BIN / fixture).read_bytes()
    blob, count = _relabel(original, _SASS, label, flags=flags)
    assert count >= 1
    code, problems = _check(cli, tmp_path, blob, "--sm", sm)
    if flags & _ARCH_SPECIFIC:  # sm_80a: a header more specific than its cubin is kept
        assert code == 0, problems
        return
    assert code == 1, problems
    assert "the fatbinary entry header says sm_" in problems
    assert "cubin's ELF header" in problems


def test_a_relabelled_cubin_with_a_broken_section_table_fails_the_check(
    cli: CliRunner, tmp_path: Path
) -> None:
    """The cubin's section table pointed past its end: it is not passed unread."""
    blob, _ = _relabel((BIN / "libsass_sm80.so").read_bytes(), _SASS, 90)
    out, count = bytearray(blob), 0
    for at, kind, _flags in _entries(blob):
        if kind == _SASS:
            cubin = at + struct.unpack_from("<I", blob, at + 4)[0]
            assert out[cubin : cubin + 4] == b"\x7fELF"
            struct.pack_into("<Q", out, cubin + 40, 0xFFFFFFFF)  # e_shoff (ELF64)
            count += 1
    assert count >= 1
    code, problems = _check(cli, tmp_path, bytes(out), "--sm", "9.0")
    assert code == 1, problems
    assert "libk.so" in problems


def test_the_cubins_arch_is_the_one_cuobjdump_names(cli: CliRunner, tmp_path: Path) -> None:
    """cuobjdump names a relabelled cubin by its ELF, as the refusal does."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump (pip package nvidia-cuda-cuobjdump) is not installed")
    blob, _ = _relabel((BIN / "libsass_sm80.so").read_bytes(), _SASS, 90)
    path = tmp_path / "libk.so"
    path.write_bytes(blob)
    sass, _ptx = cuobjdump_lists(tool, path)
    assert set(sass) == {"sm_80"}
    code, problems = _check(cli, tmp_path, blob, "--sm", "9.0")
    assert code == 1
    assert "says sm_90 but the cubin's ELF header" in problems
    assert "says sm_80" in problems


def test_unmutated_fixtures_still_pass(cli: CliRunner, tmp_path: Path) -> None:
    """The control: the same files as nvcc wrote them pass where their code runs."""
    for fixture, sm in (("libsass_sm80.so", "8.0"), ("libhopper_a.so", "9.0")):
        code, problems = _check(cli, tmp_path, (BIN / fixture).read_bytes(), "--sm", sm)
        assert code == 0, (fixture, problems)


@pytest.fixture(scope="module")
def plain_ptx(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """kernels.cu as compute_80 PTX only, stored uncompressed (``-compress=false``)."""
    if not have_nvcc():
        pytest.skip("nvcc and gcc build this library; .ci/run has them")
    out = tmp_path_factory.mktemp("ptx")
    fixture = Fixture(
        name="libptx_plain.so",
        kind="shared",
        extra=("-Xfatbin", "-compress=false"),
        gencode=("arch=compute_80,code=compute_80",),
    )
    (path,) = cached_build(out, [fixture], NVCC_CACHE, jobs=1)
    blob = path.read_bytes()
    assert [k for _, k, f in _entries(blob) if not f & _COMPRESSED] == [_PTX]
    return blob


def _ptxas_accepts(tmp_path: Path, text: bytes, sm: str) -> bool:
    source = tmp_path / "k.ptx"
    source.write_bytes(text.split(b"\0", 1)[0])
    proc = subprocess.run(
        ["ptxas", f"-arch={sm}", str(source), "-o", str(tmp_path / "k.o")],
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


_Mutate = Callable[[bytes], bytes]


@pytest.mark.nvcc  # plain_ptx is built here
@pytest.mark.parametrize(
    ("mutate", "what"),
    [
        (lambda b: b.replace(b".target sm_80", b".target sm_90"), "'.target sm_90'"),
        (
            lambda b: b.replace(
                b"\n.version 9.0\n.target sm_80\n", b".version 9.0\n.target sm_80a\n"
            ),
            "Unsupported .target sm_80a",  # no such SM, as ptxas says
        ),
        (lambda b: b.replace(b".target sm_80", b"//arget sm_80"), "no '.version' then '.target"),
    ],
)
def test_a_ptx_text_for_another_target_fails_the_check(
    cli: CliRunner, tmp_path: Path, plain_ptx: bytes, mutate: _Mutate, what: str
) -> None:
    assert plain_ptx.count(b".target sm_80") == 1
    blob = mutate(plain_ptx)
    assert blob != plain_ptx and len(blob) == len(plain_ptx)
    if shutil.which("ptxas") is not None:  # NVIDIA's JIT front end refuses the text
        text = plain_ptx.index(b".version")
        assert _ptxas_accepts(tmp_path, plain_ptx[text:], "sm_86")
        assert not _ptxas_accepts(tmp_path, blob[blob.index(b".version") :], "sm_86")
    code, problems = _check(cli, tmp_path, blob, "--sm", "8.6", "--driver", "580.65.06")
    assert code == 1, problems
    assert what in problems


@pytest.mark.nvcc
def test_plain_ptx_as_nvcc_wrote_it_passes_by_jit(
    cli: CliRunner, tmp_path: Path, plain_ptx: bytes
) -> None:
    code, problems = _check(cli, tmp_path, plain_ptx, "--sm", "8.6", "--driver", "580.65.06")
    assert code == 0, problems


@pytest.mark.nvcc
def test_a_newer_ptx_version_in_the_text_is_kept(
    cli: CliRunner, tmp_path: Path, plain_ptx: bytes
) -> None:
    """The header's ISA lowered to 1.0: the text's ``.version`` still counts."""
    blob, count = bytearray(plain_ptx), 0
    for at, kind, _flags in _entries(plain_ptx):
        if kind == _PTX:
            struct.pack_into("<HH", blob, at + 24, 0, 1)
            count += 1
    assert count == 1
    root = tmp_path / "img"
    root.mkdir()
    (root / "libk.so").write_bytes(bytes(blob))
    report = cli("inspect", str(root / "libk.so"), "--json")
    assert report.code == 0, report.err
    isas = {e["ptx_isa"] for f in report.json()["files"] for e in f["entries"]}
    assert isas and "1.0" not in isas


@pytest.mark.parametrize("table", ["names", "headers"])
def test_an_elf_table_past_the_bound_is_refused_unread(
    cli: CliRunner, tmp_path: Path, table: str
) -> None:
    """A section-name table (or section header table) claimed to span a sparse
    file larger than the bound is refused, not read into memory."""
    blob = bytearray((BIN / "libsass_sm80.so").read_bytes())
    elf = ELFFile(BytesIO(bytes(blob)))
    shoff, shentsize = elf["e_shoff"], elf["e_shentsize"]
    big = MAX_TABLE + 4096
    if table == "names":
        at = shoff + elf["e_shstrndx"] * shentsize
        struct.pack_into("<QQ", blob, at + 24, 0, big)  # sh_offset, sh_size
    else:
        struct.pack_into("<HH", blob, 60, 0, elf["e_shstrndx"])  # e_shnum 0: extended
        struct.pack_into("<Q", blob, shoff + 32, big // shentsize)  # section 0's sh_size
    root = tmp_path / "img"
    root.mkdir()
    with (root / "libk.so").open("wb") as out:
        out.write(blob)
        out.truncate(len(blob) + 2 * big)  # sparse: the claim fits inside the file
    result = cli("check", f"dir:{root}", "--sm", "8.0", "--json")
    assert result.code == 1, result.out
    problems = "\n".join(result.json()["problems"])
    assert "libk.so" in problems and "buildmatrix reads at most 16 MiB" in problems


# A compressed PTX entry is held to its text as an uncompressed one is: the head of
# the text is decompressed (buildmatrix.binary.fatbin, ``_compressed_ptx``).
_MODES = ("speed", "default")  # nvcc 13: a raw LZ4 block, a Zstandard frame


@pytest.fixture(scope="module")
def compressed_ptx(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], bytes]:
    """kernels.cu as ``compute_90a`` and as ``compute_90`` PTX only, every entry
    compressed (``-Xfatbin -compress-all``) in each ``--compress-mode``."""
    if not have_nvcc():
        pytest.skip("nvcc and gcc build this library; .ci/run has them")
    out = tmp_path_factory.mktemp("cptx")
    made: dict[tuple[str, str], bytes] = {}
    keys = [(arch, mode) for arch in ("compute_90a", "compute_90") for mode in _MODES]
    fixtures = [
        Fixture(
            name=f"lib_{arch}_{mode}.so",
            kind="shared",
            extra=("-Xfatbin", "-compress-all", f"--compress-mode={mode}"),
            gencode=(f"arch={arch},code={arch}",),
        )
        for arch, mode in keys
    ]
    for key, path in zip(keys, cached_build(out, fixtures, NVCC_CACHE), strict=True):
        blob = path.read_bytes()
        assert [k for _, k, f in _entries(blob) if f & _COMPRESSED] == [_PTX]
        made[key] = blob
    return made


def _cuobjdump_ptx(tmp_path: Path, blob: bytes) -> bytes:
    """The PTX text cuobjdump extracts (and decompresses) from the library."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump (nvidia-cuda-cuobjdump) is the oracle here")
    work = tmp_path / "x"
    work.mkdir(exist_ok=True)
    (work / "lib.so").write_bytes(blob)
    subprocess.run([str(tool), "-xptx", "all", "lib.so"], cwd=work, check=True, capture_output=True)
    (text,) = work.glob("*.ptx")
    return text.read_bytes()


@pytest.mark.nvcc
@pytest.mark.parametrize("mode", _MODES)
def test_a_relabelled_compressed_ptx_entry_fails_the_check(
    cli: CliRunner, tmp_path: Path, compressed_ptx: dict[tuple[str, str], bytes], mode: str
) -> None:
    """``compute_90a`` PTX under a header relabelled plain ``compute_80``: judged by
    the header it passed on 8.6 and 10.0; ptxas compiles the text for 9.0 alone."""
    blob, count = _relabel(compressed_ptx["compute_90a", mode], _PTX, 80)
    assert count == 1
    if shutil.which("ptxas") is not None:
        text = _cuobjdump_ptx(tmp_path, blob)
        assert not _ptxas_accepts(tmp_path, text, "sm_86")
        assert _ptxas_accepts(tmp_path, text, "sm_90a")
    for sm in ("8.6", "10.0"):
        code, problems = _check(cli, tmp_path, blob, "--sm", sm, "--driver", "580.65.06")
        assert code == 1, (sm, problems)
        assert "'.target sm_90a'" in problems
    code, problems = _check(
        cli, tmp_path, compressed_ptx["compute_90a", mode], "--sm", "9.0", "--driver", "580.65.06"
    )
    assert code == 0, problems


@pytest.mark.nvcc
@pytest.mark.parametrize("mode", _MODES)
def test_a_compressed_ptx_texts_newer_version_counts(
    cli: CliRunner, tmp_path: Path, compressed_ptx: dict[tuple[str, str], bytes], mode: str
) -> None:
    """The header's PTX ISA lowered to 7.8 (CUDA 11.8's, which R535 JITs): the text's
    ``.version 9.0`` still needs R580, as the driver's JIT reads the text."""
    blob = bytearray(compressed_ptx["compute_90", mode])
    (at,) = [at for at, kind, _ in _entries(bytes(blob)) if kind == _PTX]
    struct.pack_into("<HH", blob, at + 24, 8, 7)
    if shutil.which("ptxas") is not None:
        assert b".version 9.0" in _cuobjdump_ptx(tmp_path, bytes(blob))
    code, problems = _check(cli, tmp_path, bytes(blob), "--sm", "9.0", "--driver", "535.104.05")
    assert code == 1, problems
    assert "PTX ISA 9.0" in problems
    code, problems = _check(cli, tmp_path, bytes(blob), "--sm", "9.0", "--driver", "580.65.06")
    assert code == 0, problems
