"""Device code kept as data: cubins and fatbinaries that no section or runtime wrapper
names (buildmatrix/binary/embedded.py). The libraries are built here by gcc, with
the nvcc-built fixtures put in ``.rodata`` by ``.incbin``, or renamed by objcopy."""

from __future__ import annotations

import shutil
import struct
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buildmatrix.binary.report import FileReport
from buildmatrix.binary.scan import inspect_file
from buildmatrix.binary.source import CorruptBinary
from tests.conftest import CliRunner
from tests.fixtures.build import BIN

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("objcopy") is None,
    reason="gcc and objcopy (binutils) build these libraries; .ci/run has them",
)


def _incbin(tmp_path: Path, name: str, blob: bytes, *, section: str = ".rodata") -> Path:
    """A shared library whose ``section`` holds ``blob`` (as a loader would map it)."""
    data = tmp_path / f"{name}.bin"
    data.write_bytes(blob)
    source = tmp_path / f"{name}.c"
    source.write_text(
        f'__asm__(".section {section},\\"a\\"\\n.balign 8\\n.globl blob\\nblob:\\n'
        f'.incbin \\"{data}\\"\\n.previous\\n");\n'
        "extern const char blob[];\nconst char *get(void) { return blob; }\n"
    )
    out = tmp_path / name
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(source)], check=True)
    return out


def _renamed(library: Path, out: Path) -> Path:
    """``library`` with both fatbinary sections renamed by objcopy (headers kept)."""
    subprocess.run(
        [
            "objcopy",
            "--rename-section",
            ".nv_fatbin=.kdata",
            "--rename-section",
            ".nvFatBinSegment=.kwrap",
            str(library),
            str(out),
        ],
        check=True,
    )
    return out


def _unit_codes(report: FileReport) -> list[tuple[str, ...]]:
    return [tuple(sorted(str(c.arch) for c in u.codes)) for u in report.units()]


def _archs(path: Path) -> list[str]:
    report = inspect_file(path)
    return [] if report is None else [e.arch_name for e in report.entries]


def test_a_cubin_in_rodata_is_found(tmp_path: Path) -> None:
    lib = _incbin(tmp_path, "libinc.so", (BIN / "kernels_sm80.cubin").read_bytes())
    assert _archs(lib) == ["sm_80"]
    assert inspect_file(lib, deep=False) is None  # what a section-only reader sees


def test_a_fatbinary_in_a_custom_section_is_found(tmp_path: Path) -> None:
    lib = _incbin(tmp_path, "libfb.so", (BIN / "kernels.fatbin").read_bytes(), section=".kernels")
    assert _archs(lib) == _archs(BIN / "kernels.fatbin")


def test_both_fatbin_sections_renamed(tmp_path: Path) -> None:
    """.nv_fatbin and .nvFatBinSegment renamed, headers kept: the runtime's wrappers
    still lead to the code, the rest is found by its magic, and nothing twice."""
    for name in ("libtwo.so", "libsass_ptx.so", "libmulti.so"):
        out = _renamed(BIN / name, tmp_path / name)
        original = inspect_file(BIN / name)
        renamed = inspect_file(out)
        assert original is not None
        assert renamed is not None
        assert sorted(e.arch_name for e in renamed.entries) == sorted(
            e.arch_name for e in original.entries
        ), name
        assert sorted(_unit_codes(renamed)) == sorted(_unit_codes(original)), name
        # what runs is found through the runtime's wrapper: registered code, judged as
        # such (only nvlink's stub, which defines no kernel, is found by its magic)
        assert not any(u.embedded for u in renamed.units()), name


def test_fixtures_list_nothing_twice() -> None:
    """Where the sections name the code, the data search adds nothing."""
    for path in sorted(BIN.iterdir()):
        deep, shallow = inspect_file(path), inspect_file(path, deep=False)
        assert (deep is None) == (shallow is None), path.name
        if deep is not None and shallow is not None:
            # (deep also decompresses the cubins the verdict needs: buildmatrix.binary.kernels)
            unread = [
                replace(e, kernels=None, toolkit=None) if e.compressed else e for e in deep.entries
            ]
            assert unread == list(shallow.entries), path.name


def test_magic_numbers_in_other_data_are_not_code(tmp_path: Path) -> None:
    """The fatbinary magic with an impossible header, and an ELF header for another
    machine (x86-64), are data like any other."""
    host = (BIN / "libhost_only.so").read_bytes()
    junk = b"P\xedU\xba" + b"\xff" * 60 + host[:64] + b"\x7fELF" + b"\0" * 60
    lib = _incbin(tmp_path, "libjunk.so", junk)
    assert inspect_file(lib) is None


def test_a_truncated_embedded_cubin_is_an_error(tmp_path: Path) -> None:
    cubin = (BIN / "kernels_sm80.cubin").read_bytes()
    lib = _incbin(tmp_path, "libcut.so", cubin[: len(cubin) // 2])
    with pytest.raises(CorruptBinary, match="past the end"):
        inspect_file(lib)


def test_check_fails_a_cubin_in_rodata_that_cannot_run(cli: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "rootfs" / "usr" / "lib"
    root.mkdir(parents=True)
    shutil.copy(_incbin(tmp_path, "libinc.so", (BIN / "kernels_sm80.cubin").read_bytes()), root)
    shutil.copy(BIN / "libsass_ptx.so", root)
    r = cli("check", f"dir:{tmp_path / 'rootfs'}", "--sm", "9.0", "--json")
    assert r.code == 1
    assert "usr/lib/libinc.so" in " ".join(r.json()["problems"])
    assert cli("check", f"dir:{tmp_path / 'rootfs'}", "--sm", "8.0").code == 0


def test_renaming_both_sections_hides_no_short_translation_unit(
    cli: CliRunner, tmp_path: Path
) -> None:
    out = tmp_path / "rootfs" / "usr" / "lib" / "libtwo.so"
    out.parent.mkdir(parents=True)
    _renamed(BIN / "libtwo.so", out)
    r = cli("check", f"dir:{tmp_path / 'rootfs'}", "--sm", "9.0", "--json")
    assert r.code == 1
    assert "_Z2kbPfPKfi" in " ".join(r.json()["problems"])


def test_the_search_finds_magics_cut_by_a_window_end(monkeypatch: pytest.MonkeyPatch) -> None:
    from buildmatrix.binary import source
    from buildmatrix.binary.source import BytesSource, Searcher, find_each

    monkeypatch.setattr(source, "SEARCH_CHUNK", 8)
    data = b"......\x7fELF" + b"P\xedU\xba" + b".." + b"\x7fELF" + b"..."
    src = BytesSource(data, name="x")
    # at 6 the needle crosses the first window's end; at 16 it starts a window
    assert list(find_each(src, 0, len(data), b"\x7fELF")) == [6, 16]
    assert list(find_each(src, 0, len(data), b"P\xedU\xba")) == [10]
    # the end of the range is a hard stop: a needle running past it is not there
    assert list(find_each(src, 0, 18, b"\x7fELF")) == [6]
    searcher = Searcher(src, len(data))
    assert searcher.find(b"\x7fELF", 0, 9) == -1  # must end by the stop
    assert searcher.find(b"\x7fELF", 0, 10) == 6
    assert searcher.find(b"\x7fELF", 7, len(data)) == 16


def test_the_search_does_not_read_what_it_skips() -> None:
    """Bytes the caller jumps over (a blob already read) are never read."""
    from buildmatrix.binary.source import BytesSource, Searcher

    class Counting(BytesSource):
        def __init__(self, data: bytes) -> None:
            super().__init__(data, name="x")
            self.reads: list[tuple[int, int]] = []

        def read_at(self, offset: int, size: int) -> bytes:
            self.reads.append((offset, size))
            return super().read_at(offset, size)

    data = b"\x7fELF" + b"\0" * (64 << 20) + b"\x7fELF"
    src = Counting(data)
    searcher = Searcher(src, len(data))
    assert searcher.find(b"\x7fELF", 0, len(data)) == 0
    assert searcher.find(b"\x7fELF", len(data) - 100, len(data)) == len(data) - 4
    assert sum(size for _, size in src.reads) < 16 << 20, src.reads


@given(
    data=st.binary(max_size=200),
    plant=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
    chunk=st.integers(min_value=4, max_value=64),
    start=st.integers(min_value=0, max_value=40),
    length=st.integers(min_value=0, max_value=240),
    read=st.integers(min_value=1, max_value=40),
)
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_each_hit_is_read_as_the_file_holds_it(
    monkeypatch: pytest.MonkeyPatch,
    data: bytes,
    plant: list[int],
    chunk: int,
    start: int,
    length: int,
    read: int,
) -> None:
    """find_each_read (what the wrapper search uses) gives every needle in the range
    and, for each, the very bytes a plain read of the file gives there, whatever the
    window size: the oracle is slicing the bytes themselves."""
    from buildmatrix.binary import source
    from buildmatrix.binary.source import BytesSource, find_each_read

    monkeypatch.setattr(source, "SEARCH_CHUNK", chunk)
    needle = b"\xb1CbF"
    buf = bytearray(data)
    for at in plant:
        buf[at : at + 4] = needle
    raw = bytes(buf)
    end = min(start + length, len(raw))
    want = [(i, raw[i : i + read]) for i in range(start, end - 3) if raw[i : i + 4] == needle]
    assert list(find_each_read(BytesSource(raw, name="x"), start, end, needle, read=read)) == want


@given(st.binary(max_size=24 * 40).map(lambda b: b[: len(b) // 24 * 24]))
def test_relocation_offsets_are_the_first_field_of_each_entry(table: bytes) -> None:
    """The r_offset list pointer_values compares is struct's reading of Elf64_Rela."""
    from buildmatrix.binary.dynrel import _r_offsets

    assert _r_offsets(table) == [r for r, _i, _a in struct.iter_unpack("<QQq", table)]
