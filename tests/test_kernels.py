"""Which compressed cubins a scan decompresses (buildmatrix.binary.kernels)."""

from __future__ import annotations

from pathlib import Path

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
    # tied target sets, so the smallest cubin of both
    assert [e.container for e in read] == [1, 2]
    assert all(u.kernels_known for u in report.units())
    assert {u.index: u.kernels for u in report.units()} == {
        1: ("_Z5scaleIdEvPT_S0_i", "_Z4axpyfPKfPfi"),
        2: ("_Z2kbPfPKfi",),
    }
    # one translation unit: only the smallest cubin, for the toolkit
    one = inspect_file(BIN / "libcompressed_speed.so")
    assert one is not None
    read = [e for e in one.entries if e.compressed and e.kernels is not None]
    assert len(read) == 1
    smallest = min(
        (e for e in one.entries if e.compressed and e.kind is EntryKind.SASS),
        key=lambda e: e.size,
    )
    assert read == [read[0]] and read[0].offset == smallest.offset
    assert str(one.toolkit) == "13.0"
    # inspect without --deep reads none
    shallow = inspect_file(BIN / "libtwo_compressed.so", deep=False)
    assert shallow is not None
    assert all(e.kernels is None for e in shallow.entries if e.compressed)
