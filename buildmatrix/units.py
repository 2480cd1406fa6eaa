"""The per-translation-unit rule: does a file of several fatbinary containers run?

Pure: units (one per container, buildmatrix.binary.report.FileReport.units) in, a
verdict with its reasons and the containers left out of it (docs/check.md, "Per
translation unit"). One code entry is judged by buildmatrix.compat.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache

from packaging.version import Version

from buildmatrix.arch import CodeKind, ComputeCapability
from buildmatrix.binary.report import FileReport, dispatch_signs
from buildmatrix.compat import combine, judge_code, judge_codes, ptx_targets, sass_runs_on
from buildmatrix.cuda import CudaFacts, DriverVersion
from buildmatrix.jit_env import DEFAULT, JitEnv, loadable_units
from buildmatrix.verdict import RANK, CodeTarget, FileJudgement, Judgement, Unit, Verdict

__all__ = ["FileJudgement", "Signs", "dispatch_signs", "judge_file", "judge_units"]

# A file's dispatch signs (buildmatrix.binary.report.dispatch_signs), asked for on need.
Signs = Callable[[], "str | None"]


def _registered(
    units: Sequence[Unit],
    results: Sequence[Judgement],
    cc: ComputeCapability,
    *,
    strict: bool,
    signs: Signs,
    counted: frozenset[int] = frozenset(),
) -> tuple[list[tuple[int, Judgement]], list[str]]:
    """The registered containers that count (by index), and a line for each left out
    as specialised code (judge_units' docstring). ``signs``: the file's
    :func:`dispatch_signs`, asked only where a container may be left out. ``counted``:
    units never left out (those that run on ``cc`` but for the image's Env)."""
    several = sum(not u.embedded for u in units) > 1
    judged: list[tuple[int, Judgement]] = []
    specialised: list[str] = []
    for i, unit in enumerate(units):
        j = results[i]
        if unit.embedded and not strict:
            continue  # judged below, once the registered code is
        # A file's one registered container is judged as it is, whatever it holds.
        left_out = None
        if j.verdict is Verdict.NONE and several and not strict and i not in counted:
            if unit.specific:
                left_out = "it holds only arch- or family-specific code, launched after a check"
            elif (sign := signs()) is not None:
                left_out = f"{sign}, so it chooses kernels by compute capability"
        if left_out is not None:
            what = f" has nothing for {cc} and is"
            if unit.lacking and j.reasons:  # none because its cubin lacks kernels: say so
                what = f": {j.reasons[0]}; it is"
            specialised.append(
                f"container {unit.index} ({unit.describe()}){what} specialised code "
                f"({left_out}); left out of the verdict (--strict counts it)"
            )
            continue
        judged.append((i, j))
    return judged, specialised


def _kept_as_data(
    units: Sequence[Unit],
    results: Sequence[Judgement],
    cc: ComputeCapability,
    *,
    strict: bool,
    alone: bool,
) -> tuple[list[tuple[int, Judgement]], list[str]]:
    """The code the program loads itself (kept as data) that counts, and a line for each
    blob left out. It is chosen per GPU: beside registered code that counts (``alone``
    false) it is a specialisation (cuBLASLt keeps Blackwell-only kernels so); otherwise
    its best blob for this GPU counts (cuFFT registers only a link stub), and with no
    blob for it every one fails the file."""
    judged: list[tuple[int, Judgement]] = []
    specialised: list[str] = []
    kept = [] if strict else [i for i, u in enumerate(units) if u.embedded]
    chosen = max(kept, key=lambda i: RANK[results[i].verdict], default=None)
    none_kept = chosen is None or results[chosen].verdict is Verdict.NONE
    for i in kept:
        unit, j = units[i], results[i]
        if alone and (i == chosen or none_kept):
            judged.append((i, j))
        elif j.verdict is Verdict.NONE:
            specialised.append(
                f"container {unit.index} ({unit.describe()}), kept as data, has nothing "
                f"for {cc}; the program loads another (--strict counts it)"
            )
    return judged, specialised


def _with_kernels_lacking(
    unit: Unit, cc: ComputeCapability, j: Judgement, jits: Callable[[CodeTarget], bool]
) -> Judgement:
    """``j``, or none where the image ``cc`` loads lacks kernels the container's other
    images define. The driver builds the module from one image of the container: the
    cubin of the highest SM that runs on the GPU, else the PTX it JIT-compiles (CUDA
    C++ Programming Guide, "Binary Compatibility" and "Application Compatibility"),
    here the PTX of the highest compute capability that JITs there (``jits``: its
    verdict is jit). A kernel that image does not define cannot be launched
    ("invalid device function"), whatever the other images hold. Where two tie
    (``sm_90`` and ``sm_90a``, ``compute_90`` and ``compute_90a``), either may be
    loaded."""
    if j.verdict is Verdict.NONE or not unit.lacking:
        return j
    if j.verdict is Verdict.NATIVE:
        kind, verb = CodeKind.SASS, "loads"
        runs = [c.arch for c in unit.codes if c.arch.kind is kind and sass_runs_on(c.arch, cc)]
    else:
        kind, verb = CodeKind.PTX, "JIT-compiles"
        runs = [c.arch for c in unit.codes if c.arch.kind is kind and jits(c)]
    top = max((a.cc for a in runs), default=None)
    for lack in unit.lacking:
        if lack.image.cc == top and lack.image in runs:
            missing = lack.kernels
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            why = (
                f"its {lack.describe()}, the one {cc} {verb}, lacks kernels its "
                f"{lack.definers()} define{'s' if len(lack.defined_by) == 1 else ''} "
                f"({', '.join(missing[:3])}{more}); launching them fails there"
            )
            return Judgement(verdict=Verdict.NONE, reasons=(why,))
    return j


# Over 60 lines only by its docstring, which states the per-unit rule it applies.
def judge_units(
    units: Sequence[Unit],
    cc: ComputeCapability,
    *,
    driver: DriverVersion | None,
    facts: CudaFacts,
    strict: bool = False,
    driver_cuda: Version | None = None,
    signs: Signs | None = None,
    counted: frozenset[int] = frozenset(),
) -> FileJudgement:
    """Verdict for one file of several fatbinary containers (translation units).

    Each container is loaded as its own module, so each must run: a file whose
    second translation unit has only sm_80 code fails on 9.0 even when the first has
    sm_90. A registered container with nothing for the GPU is left out (reported as
    specialised) only where the file shows that it picks its kernels by the GPU's
    compute capability (docs/check.md, "Per translation unit"): the container holds
    only arch- or family-specific code (``sm_90a`` runs on 9.0 alone, so whatever
    launches it checks the capability first), or the file carries one of the signs
    of :func:`dispatch_signs` (NVIDIA's cuDNN, cuBLAS, cuBLASLt and cuSOLVER, torch).
    Anything else is a
    short translation unit and fails the file; so does a file where no registered
    container runs. Code kept as data (found by content) is loaded by the program
    itself, one blob per GPU: beside registered code that counts it is reported,
    not judged; else the best blob for the GPU counts and the file fails when none
    has code for it. ``strict`` counts every container. ``driver_cuda``: the CUDA
    version the driver reports, where known (buildmatrix.compat.judge_code).
    ``signs``: the file's dispatch signs where the caller keeps them
    (buildmatrix.binary.report.FileReport.dispatch_signs); else read from ``units``.
    """
    if not units:
        return FileJudgement(verdict=Verdict.NONE, reasons=("no device code",))
    # Libraries repeat a few target sets over thousands of containers: judge each once.
    judged_sets: dict[tuple[CodeTarget, ...], Judgement] = {}
    results = []
    for u in units:
        j = judged_sets.get(u.codes) if len(units) > 1 else None
        if j is None:
            j = judge_codes(u.codes, cc, driver=driver, facts=facts, driver_cuda=driver_cuda)
            judged_sets[u.codes] = j
        results.append(j)

    def jits(code: CodeTarget) -> bool:
        got = judge_code(code, cc, driver=driver, facts=facts, driver_cuda=driver_cuda)
        return got.verdict is Verdict.JIT

    results = [_with_kernels_lacking(u, cc, j, jits) for u, j in zip(units, results, strict=True)]
    judged, specialised = _registered(
        units,
        results,
        cc,
        strict=strict,
        signs=signs or cache(lambda: dispatch_signs(units)),
        counted=counted,
    )
    more, kept_out = _kept_as_data(units, results, cc, strict=strict, alone=not judged)
    judged += more
    specialised += kept_out
    judged.sort()
    if not judged:  # only specialisations: none of them runs here
        archs = ", ".join(sorted({str(c.arch) for u in units for c in u.codes}))
        what = (
            "its container has no code"
            if len(units) == 1
            else f"none of its {len(units)} containers has code"
        )
        return FileJudgement(
            verdict=Verdict.NONE,
            reasons=(f"{what} for {cc} (it holds {archs})",),
            specialised=tuple(specialised),
        )
    verdict = combine(j.verdict for _, j in judged)
    single = len(units) == 1

    def why(i: int, j: Judgement) -> list[str]:
        unit = units[i]
        where = "" if single else f"container {unit.index} ({unit.describe()}): "
        return [f"{where}{r}" for r in j.reasons]

    if verdict is Verdict.NATIVE:
        reasons = why(*judged[0])
    else:
        reasons = [r for i, j in judged if j.verdict is verdict for r in why(i, j)]
    return FileJudgement(
        verdict=verdict,
        reasons=tuple(dict.fromkeys(reasons)),
        specialised=tuple(specialised),
    )


def judge_file(
    report: FileReport,
    cc: ComputeCapability,
    *,
    driver: DriverVersion | None,
    facts: CudaFacts,
    strict: bool = False,
    driver_cuda: Version | None = None,
    jit: JitEnv = DEFAULT,
) -> FileJudgement:
    """:func:`judge_units` of one file's units, of the code ``jit`` (the image's Env)
    lets the driver load. Where no PTX of the file with a known
    ISA JIT-compiles for ``cc``, the driver, the CUDA version it reports and the
    facts enter no rule the verdict takes (SASS: compat._judge_sass; PTX that does
    not target ``cc`` or of unknown ISA: jit.judge_ptx), so the verdict is kept on
    the report per (``cc``, ``strict``) and judging the file on the next driver
    costs a look-up."""
    key = (cc, strict)
    if not jit.narrowed and (known := report.verdicts.get(key)) is not None:
        return known
    units, counted = report.code_units, frozenset[int]()
    if jit.narrowed:
        units = loadable_units(report.code_units, jit)
        # A unit with code for cc that the Env takes away is launched there all the
        # same (the file's dispatch, if any, chose it): it is never left out.
        counted = frozenset(
            i
            for i, (u, n) in enumerate(zip(report.code_units, units, strict=True))
            if n.codes != u.codes
            and judge_codes(
                u.codes, cc, driver=driver, facts=facts, driver_cuda=driver_cuda
            ).verdict
            is not Verdict.NONE
        )
    j = judge_units(
        units,
        cc,
        driver=driver,
        facts=facts,
        strict=strict,
        driver_cuda=driver_cuda,
        signs=lambda: report.dispatch_signs,
        counted=counted,
    )
    if jit.narrowed:  # rare: judged each time, never kept
        if j.verdict is Verdict.NONE:
            return replace(j, reasons=(*j.reasons, jit.describe()))
        return j
    if key not in report.verdicts:
        report.verdicts[key] = None if _jit_on(report.code_units, cc) else j
    return j


def _jit_on(units: Sequence[Unit], cc: ComputeCapability) -> bool:
    """Whether PTX of a known ISA among ``units`` JIT-compiles for ``cc``: its verdict
    then depends on the driver (jit.judge_ptx)."""
    return any(
        c.arch.kind is CodeKind.PTX and c.ptx_isa is not None and ptx_targets(c.arch, cc)
        for u in units
        for c in u.codes
    )
