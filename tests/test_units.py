"""The per-translation-unit rule (buildmatrix.units): which containers of a file count.

NVIDIA's own libraries (tests/test_nvidia_wheels.py) and nvcc-built fixtures
(tests/test_translation_units.py) hold the rule to real binaries; these cases pin
each branch of it.
"""

from __future__ import annotations

import itertools

import pytest
from packaging.version import Version

from buildmatrix.arch import CodeKind, ComputeCapability, parse_arch
from buildmatrix.binary.fatbin import EntryKind, FatbinEntry
from buildmatrix.binary.report import FileReport
from buildmatrix.binary.scan import inspect_file
from buildmatrix.compat import CodeTarget, Verdict, ptx_targets
from buildmatrix.cuda import DriverVersion, load_cuda_facts, parse_driver_version
from buildmatrix.profile_files import default_profiles_dir, load_profiles
from buildmatrix.units import judge_file, judge_units
from buildmatrix.verdict import Lacking, Unit
from tests.conftest import REPO

CC = ComputeCapability
FACTS = load_cuda_facts()
FIXTURES = REPO / "tests" / "fixtures" / "bin"


def _driver(text: str) -> DriverVersion:
    return parse_driver_version(text)


def _unit(
    *archs: str,
    index: int = 0,
    kernels: tuple[str, ...] = (),
    known: bool = True,
    embedded: bool = False,
) -> Unit:
    return Unit(
        codes=tuple(
            CodeTarget(arch=parse_arch(a), ptx_isa=Version("9.0") if a.startswith("c") else None)
            for a in archs
        ),
        index=index,
        kernels=kernels,
        kernels_known=known,
        embedded=embedded,
    )


def test_every_translation_unit_must_run() -> None:
    """libtwo: a.cu for sm_80 + sm_90, b.cu for sm_80 only: kb has nothing for 9.0."""
    units = [_unit("sm_80", "sm_90", index=1), _unit("sm_80", index=2)]
    got = judge_units(units, CC(9, 0), driver=None, facts=FACTS)
    assert got.verdict is Verdict.NONE
    assert got.reasons == (
        "container 2 (sm_80): sm_80 SASS runs only on compute capability 8.x, not 9.0",
    )
    assert judge_units(units, CC(8, 0), driver=None, facts=FACTS).verdict is Verdict.NATIVE


def test_specialised_containers_are_reported_not_failed() -> None:
    common = [_unit("sm_80", "sm_90", index=i) for i in range(3)]
    special = _unit("sm_90a", index=3)
    got = judge_units([*common, special], CC(8, 0), driver=None, facts=FACTS)
    assert got.verdict is Verdict.NATIVE
    assert got.specialised == (
        "container 3 (sm_90a) has nothing for 8.0 and is specialised code (it holds only "
        "arch- or family-specific code, launched after a check); left out of the verdict "
        "(--strict counts it)",
    )
    strict = judge_units([*common, special], CC(8, 0), driver=None, facts=FACTS, strict=True)
    assert strict.verdict is Verdict.NONE
    # a plain container whose targets the common ones serve is no specialisation:
    # sm_80, or sm_86 (sm_80 runs wherever it does), among sm_80 + sm_90 units
    for short in (_unit("sm_80", index=4), _unit("sm_86", index=4)):
        got = judge_units([*common[:2], short], CC(9, 0), driver=None, facts=FACTS)
        assert got.verdict is Verdict.NONE, short
        assert got.specialised == ()
    # one that adds a target they do not serve shows per-GPU units (cuSOLVER's
    # compute_90, compute_100, ... ones): the file dispatches
    extra = _unit("sm_100", "compute_100", index=4)
    got = judge_units([*common[:2], extra], CC(9, 0), driver=None, facts=FACTS)
    assert got.verdict is Verdict.NATIVE
    assert "targets its common ones do not serve (compute_100, sm_100)" in got.specialised[0]


def test_a_file_with_arch_specific_code_chooses_its_kernels_by_capability() -> None:
    """cuDNN 9's libcudnn_cnn: sm_75-only containers beside sm_75..sm_120f ones; the
    sm_90a code shows that the library checks the GPU before launching."""
    full = [_unit("sm_75", "sm_80", "sm_90a", index=i) for i in range(3)]
    turing = _unit("sm_75", index=3, kernels=("xmma_bn_fprop_stats_kernel",))
    got = judge_units([*full, turing], CC(9, 0), driver=None, facts=FACTS)
    assert got.verdict is Verdict.NATIVE
    assert (
        len(got.specialised) == 1 and "chooses kernels by compute capability" in got.specialised[0]
    )
    strict = judge_units([*full, turing], CC(9, 0), driver=None, facts=FACTS, strict=True)
    assert strict.verdict is Verdict.NONE
    # without the arch-specific code, the same container is a short translation unit
    plain = [_unit("sm_75", "sm_80", "sm_90", index=i) for i in range(3)]
    short = judge_units([*plain, turing], CC(9, 0), driver=None, facts=FACTS)
    assert short.verdict is Verdict.NONE


@pytest.mark.parametrize(
    ("kernels", "known", "exempt"),
    [
        (
            ("_ZN7cutlass6KernelI46cutlass_70_simt_dgemm_grouped_64x64_8x2_align1EEvNT_6ParamsE",),
            True,
            True,
        ),
        (("Volta_hmma_implicit_gemm_fprop", "gemm_sm75_kernel", "k_for_sm89"), True, True),
        (("Volta_hmma_implicit_gemm_fprop", "_Z2kbPfPKfi"), True, False),  # one is not
        (("_Z2kbPfPKfi",), True, False),
        (("smem128_kernel",), True, False),  # "sm" then digits inside a word is no tag
        ((), False, False),  # kernels not read: never exempt on names
        (("gemm_sm75_kernel",), False, False),
    ],
)
def test_kernels_named_for_an_architecture(
    kernels: tuple[str, ...], known: bool, exempt: bool
) -> None:
    """cuBLAS 13: an sm_75-only container of cutlass_70_* kernels beside sm_75..sm_120 ones."""
    common = [_unit("sm_75", "sm_80", "sm_90", index=i) for i in range(3)]
    turing = _unit("sm_75", index=3, kernels=kernels, known=known)
    got = judge_units([*common, turing], CC(9, 0), driver=None, facts=FACTS)
    assert (got.verdict is Verdict.NATIVE) is exempt
    assert bool(got.specialised) is exempt


def test_jit_in_one_unit_makes_the_file_jit() -> None:
    units = [_unit("sm_90", "compute_90"), _unit("sm_100", "compute_90", index=1)]
    driver = _driver("580.65.06")
    got = judge_units(units, CC(10, 0), driver=driver, facts=FACTS)
    assert got.verdict is Verdict.JIT
    assert got.reasons[0].startswith("container 0 (compute_90, sm_90): compute_90 PTX")


def test_code_kept_as_data_is_chosen_per_gpu() -> None:
    blobs = [_unit("sm_80", embedded=True, index=0), _unit("sm_90", embedded=True, index=1)]
    # alone in the file: the best blob counts, none at all fails
    assert judge_units(blobs, CC(9, 0), driver=None, facts=FACTS).verdict is Verdict.NATIVE
    assert judge_units(blobs, CC(8, 6), driver=None, facts=FACTS).verdict is Verdict.NATIVE
    got = judge_units(blobs, CC(10, 0), driver=None, facts=FACTS)
    assert got.verdict is Verdict.NONE
    assert "sm_90 SASS runs only on compute capability 9.x, not 10.0" in " ".join(got.reasons)
    # beside registered code, a blob with nothing for the GPU is reported
    registered = _unit("sm_100", "sm_90", index=2)
    got = judge_units([*blobs, registered], CC(10, 0), driver=None, facts=FACTS)
    assert got.verdict is Verdict.NATIVE
    assert len(got.specialised) == 2
    assert all("kept as data" in s for s in got.specialised)
    # a registered unit with nothing for the GPU fails whatever the blobs hold: the
    # runtime loads it (a compressed sm_80 library with an sm_90 cubin kept as data)
    lone = _unit("sm_80", index=2, kernels=("_Z4axpyfPKfPfi",))
    got = judge_units([*blobs, lone], CC(9, 0), driver=None, facts=FACTS)
    assert got.verdict is Verdict.NONE
    # registered units left out as specialisations leave the blobs to decide
    special = [_unit("sm_100a", index=2), _unit("sm_120a", index=3)]
    got = judge_units([*blobs, *special], CC(9, 0), driver=None, facts=FACTS)
    assert got.verdict is Verdict.NATIVE
    strict = judge_units([*blobs, registered], CC(10, 0), driver=None, facts=FACTS, strict=True)
    assert strict.verdict is Verdict.NONE


def test_a_specialised_container_whose_cubin_lacks_kernels_says_so() -> None:
    """In a file that dispatches (arch-specific code elsewhere), a container judged none
    because the cubin 8.0 loads lacks a kernel its sm_90 cubin defines is left out as
    specialised code; the line names that cause, not "has nothing for 8.0"."""
    full = [_unit("sm_80", "sm_90a", index=i) for i in range(2)]
    guarded = Unit(
        codes=tuple(CodeTarget(arch=parse_arch(a), ptx_isa=None) for a in ("sm_80", "sm_90")),
        index=2,
        kernels=("_Z6only90v", "_Z4bothv"),
        kernels_known=True,
        lacking=(
            Lacking(
                image=parse_arch("sm_80"),
                kernels=("_Z6only90v",),
                defined_by=(parse_arch("sm_90"),),
            ),
        ),
    )
    got = judge_units([*full, guarded], CC(8, 0), driver=None, facts=FACTS)
    assert got.verdict is Verdict.NATIVE
    (line,) = got.specialised
    assert line.startswith("container 2 (sm_80, sm_90; kernels _Z6only90v, _Z4bothv): its sm_80 ")
    assert "lacks kernels its sm_90 cubin defines (_Z6only90v)" in line
    assert "has nothing for" not in line and "; it is specialised code" in line
    # where the cubin it loads is complete, it counts as usual
    assert judge_units([*full, guarded], CC(9, 0), driver=None, facts=FACTS).specialised == ()


def _reports() -> list[FileReport]:
    """The nvcc-built fixture files with device code (one of each set of code targets
    and kernels), and files of PTX whose ISA is unknown, one the table knows and one
    newer than every toolkit it knows."""
    found = [inspect_file(p) for p in sorted(FIXTURES.iterdir())]
    reports = {r.code_units: r for r in found if r is not None and r.code_units}
    newest = FACTS.newest.ptx_isa
    for isa in (None, Version("8.0"), Version(f"{newest.major}.{newest.minor + 1}")):
        entries = tuple(
            FatbinEntry(kind=kind, arch=parse_arch(a), ptx_isa=isa if kind is EntryKind.PTX
                        else None, compressed=False, size=1, offset=0)
            for kind, a in ((EntryKind.SASS, "sm_80"), (EntryKind.PTX, "compute_90"))
        )  # fmt: skip
        report = FileReport(path=f"ptx-{isa}", format="elf", entries=entries)
        reports[report.code_units] = report
    return list(reports.values())


def test_a_verdict_kept_on_a_report_is_its_verdict_on_every_driver() -> None:
    """units.judge_file keeps a file's verdict on a GPU on its report where no driver
    enters it. On every GPU (the profiles' and unknown ones), with no driver, one
    older than every driver the CUDA table names and each it names (every PTX JIT
    floor, so every interval between them), with and without the CUDA version the
    driver reports, what it answers is judge_units' answer from the units afresh, and
    what it keeps is the same on all of them; where PTX of a known ISA JIT-compiles for
    the GPU it keeps nothing (jit.judge_ptx depends on the driver there)."""
    ccs = sorted({p.cc for p in load_profiles(default_profiles_dir())} | {CC(8, 7), CC(11, 0)})
    table = sorted({tk.driver for tk in FACTS.toolkits if tk.driver is not None})
    drivers = [None, _driver("400.0.0"), *table]
    kept = {True: 0, False: 0}
    for report, cc, strict in itertools.product(_reports(), ccs, (False, True)):
        answers = set()
        for driver in drivers if not strict else drivers[:3]:
            reported = FACTS.driver_cuda(driver) if driver is not None else None
            for cuda in {None, reported}:
                got = judge_file(
                    report, cc, driver=driver, facts=FACTS, strict=strict, driver_cuda=cuda
                )
                fresh = judge_units(
                    report.units(), cc, driver=driver, facts=FACTS, strict=strict,
                    driver_cuda=cuda,
                )  # fmt: skip
                assert got == fresh, (report.path, cc, driver, cuda, strict)
                answers.add(fresh)
        held = report.verdicts[(cc, strict)]
        assert held is None or answers == {held}, (report.path, cc, strict)
        jit = any(
            c.arch.kind is CodeKind.PTX and c.ptx_isa is not None and ptx_targets(c.arch, cc)
            for u in report.code_units
            for c in u.codes
        )
        assert (held is None) is jit, (report.path, cc, strict)
        kept[jit] += 1
    assert kept[True] and kept[False]  # both kinds of GPU were judged
