"""Which compressed cubins a scan decompresses (buildmatrix.binary.kernels)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from buildmatrix.arch import parse_arch
from buildmatrix.binary.fatbin import EntryKind, FatbinEntry
from buildmatrix.binary.kernels import units_needing_kernels
from buildmatrix.binary.scan import inspect_file

BIN = Path(__file__).parent / "fixtures" / "bin"


def _entries(*containers: tuple[str, ...], embedded: int = -1) -> list[FatbinEntry]:
    return [
        FatbinEntry(
            kind=EntryKind.SASS,
            arch=parse_arch(arch),
            ptx_isa=None,
            compressed=True,
            size=100,
            offset=0,
            container=index,
            embedded=index == embedded,
        )
        for index, archs in enumerate(containers)
        for arch in archs
    ]


def test_units_that_may_lack_code_where_the_rest_runs_are_read() -> None:
    common = ("sm_75", "sm_80", "sm_86", "sm_90")
    # cuBLAS 13: an sm_75-only unit and one without sm_75 among full ones
    entries = _entries(common, common, common, ("sm_75",), ("sm_80", "sm_90"), ("sm_75", *common))
    assert units_needing_kernels(entries) == {3, 4}
    # sm_80 serves wherever sm_86 does: a unit without sm_86 lacks nothing (cuBLAS 13's
    # 77 containers built without it)
    entries = _entries(common, common, ("sm_75", "sm_80", "sm_90"), ("sm_75", "sm_86", "sm_90"))
    assert units_needing_kernels(entries) == {3}
    # PTX is matched exactly (JIT depends on the driver): a unit without compute_90
    # lacks it; one with compute_80 adds a target, which shows dispatch by itself
    ptx = ("sm_80", "compute_90")
    assert units_needing_kernels(_entries(ptx, ptx, ("sm_80",))) == {2}
    assert units_needing_kernels(_entries(ptx, ptx, ("sm_80", "compute_80"))) == set()
    # all alike: no unit lacks code alone
    assert units_needing_kernels(_entries(common, common)) == set()
    # tied target sets: their union is the common set; the sm_80 + sm_90 unit serves
    # all of it, the sm_86 one lacks 8.0 and 9.0
    assert units_needing_kernels(_entries(("sm_80", "sm_90"), ("sm_86",))) == {1}
    assert units_needing_kernels(_entries(("sm_80",), ("sm_90",))) == {0, 1}
    # arch-specific code anywhere registered: the file dispatches, names are not needed
    assert units_needing_kernels(_entries(common, common, ("sm_75",), ("sm_90a",))) == set()
    # code kept as data is neither read for the rule nor a sign of dispatch
    kept = _entries(common, common, ("sm_75",), ("sm_90a",), embedded=3)
    assert units_needing_kernels(kept) == {2}


def test_a_scan_reads_the_compressed_cubins_the_rule_needs_and_no_more() -> None:
    report = inspect_file(BIN / "libtwo_compressed.so")
    assert report is not None
    read = [e for e in report.entries if e.compressed and e.kernels is not None]
    # the stub (uncompressed), the full unit (sm_80 + sm_90) and the short one (sm_80):
    # no sign of dispatch, so every cubin of the full unit (the runtime loads one of
    # its two per GPU, each must define the kernels of the other) and the short one's
    assert [(e.container, e.arch_name) for e in read] == [(1, "sm_80"), (1, "sm_90"), (2, "sm_80")]
    assert all(u.kernels_known for u in report.units())
    assert {u.index: u.kernels for u in report.units()} == {
        1: ("_Z5scaleIdEvPT_S0_i", "_Z4axpyfPKfPfi"),
        2: ("_Z2kbPfPKfi",),
    }
    assert all(u.lacking == () for u in report.units())
    # two units of sm_80 + sm_90 cubins (and compute_90 PTX): every cubin
    one = inspect_file(BIN / "libcompressed_speed.so")
    assert one is not None
    sass = [e for e in one.entries if e.kind is EntryKind.SASS]
    assert all(e.compressed and e.kernels is not None for e in sass) and len(sass) == 4
    # and its PTX, which 10.0 JIT-compiles: it must define what the cubins do
    (ptx,) = [e for e in one.entries if e.kind is EntryKind.PTX]
    assert ptx.compressed and set(ptx.kernels or ()) == {"_Z4axpyfPKfPfi", "_Z5scaleIdEvPT_S0_i"}
    # a PTX text alone is compared with nothing: not read
    alone = inspect_file(BIN / "libptx_only.so")
    assert alone is not None and all(e.kernels is None for e in alone.entries)
    assert str(one.toolkit) == "13.0"
    # inspect without --deep reads none
    shallow = inspect_file(BIN / "libtwo_compressed.so", deep=False)
    assert shallow is not None
    assert all(e.kernels is None for e in shallow.entries if e.compressed)


_SMALL = "__global__ void small(float *x) { x[threadIdx.x] += 1.0f; }\n"
_LARGE = "".join(
    f"__global__ void large{i}(float *x, const float *y, int n) {{"
    f" for (int j = threadIdx.x; j < n; j += blockDim.x) x[j] = x[j] * y[j] + {i}.0f; }}\n"
    for i in range(40)
)


def _compressed_fatbin(tmp: Path, name: str, source: str, *, release: bytes) -> bytes:
    """A one-container fatbinary (``fatbinary --compress-all``) of ``source``'s sm_90a
    cubin, built by nvcc 13.0, whose toolkit note is made to read ``release``."""
    (tmp / f"{name}.cu").write_text(source)
    subprocess.run(
        ["nvcc", "-cubin", "-arch=sm_90a", f"{name}.cu", "-o", f"{name}.cubin"], cwd=tmp, check=True
    )
    cubin = (tmp / f"{name}.cubin").read_bytes()
    assert cubin.count(b"Cuda compilation tools, release 13.0") == 1
    (tmp / f"{name}.cubin").write_bytes(
        cubin.replace(b"tools, release 13.0", b"tools, release " + release)
    )
    image = f"kind=elf,sm=90a,file={name}.cubin"
    fatbin = ["fatbinary", "-64", "--compress-all", f"--create={name}.fatbin"]
    subprocess.run([*fatbin, f"--image3={image}"], cwd=tmp, check=True)
    return (tmp / f"{name}.fatbin").read_bytes()


@pytest.mark.nvcc
def test_the_toolkit_is_the_newest_of_every_compressed_cubin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CUDA 12.x and 13.x objects linked into one file (cuBLAS 13.1.1.3 holds one cubin
    whose note says 12.7 among 13.0 ones, tests/test_nvidia_wheels.py): the runtime
    floor is the newest major's. Stand-in: the CUDA 12 cubin is an nvcc 13.0 cubin
    whose ``.note.nv.tkinfo`` text is edited to read 12.8 (only nvcc 13.0 is here).
    Both containers are arch-specific, so no cubin is read for its kernels; the old
    one is the smaller, which was the only one read: the file was CUDA 12.8's, and a
    12.4 driver (550) passed it."""
    if shutil.which("nvcc") is None or shutil.which("fatbinary") is None:
        pytest.skip("nvcc and fatbinary build the file")
    old = _compressed_fatbin(tmp_path, "old", _SMALL, release=b"12.8")
    new = _compressed_fatbin(tmp_path, "new", _LARGE, release=b"13.0")
    mixed = tmp_path / "img" / "mixed.fatbin"
    mixed.parent.mkdir()
    mixed.write_bytes(old + new)
    report = inspect_file(mixed)
    assert report is not None
    sizes = [e.size for e in report.entries]
    assert len(sizes) == 2 and sizes[0] < sizes[1] and all(e.compressed for e in report.entries)
    assert [str(e.toolkit) for e in report.entries] == ["12.8", "13.0"]
    assert str(report.toolkit) == "13.0"
    from buildmatrix.cli import main

    args = ["check", str(mixed.parent), "--sm", "9.0", "--no-cache", "--json"]
    assert main([*args, "--driver", "550.54.15"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert any("CUDA 13.0 runtime" in p for p in doc["problems"]), doc["problems"]
    assert main([*args, "--driver", "580.65.06"]) == 0, capsys.readouterr().out
    # one note of the newest major known: no other cubin is read for its toolkit
    plain = tmp_path / "img" / "new.fatbin"
    plain.write_bytes(new + new)
    again = inspect_file(plain)
    assert again is not None
    assert [e.toolkit is not None for e in again.entries] == [True, False]
