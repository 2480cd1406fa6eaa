"""The per-translation-unit rule: does a file of several fatbinary containers run?

Pure: units (one per container, buildmatrix.binary.report.FileReport.units) in, a
verdict with its reasons and the containers left out of it (docs/check.md, "Per
translation unit"). One code entry is judged by buildmatrix.compat.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import Version

from buildmatrix.arch import Arch, CodeKind, ComputeCapability, Suffix, serves_wherever
from buildmatrix.binary.archnames import named_for_architecture
from buildmatrix.compat import combine, judge_codes, sass_runs_on
from buildmatrix.cuda import CudaFacts, DriverVersion
from buildmatrix.verdict import RANK, CodeTarget, Judgement, Unit, Verdict


@dataclass(frozen=True, kw_only=True)
class FileJudgement:
    verdict: Verdict
    reasons: tuple[str, ...]
    specialised: tuple[str, ...] = ()  # containers left out of the verdict, and why


def _named(unit: Unit) -> bool:
    """Every kernel of the unit, read, is named for a GPU architecture."""
    return (
        unit.kernels_known
        and bool(unit.kernels)
        and all(named_for_architecture(k) for k in unit.kernels)
    )


def dispatch_signs(units: Sequence[Unit]) -> str | None:
    """What shows that a file chooses its kernels by the GPU's compute capability, or
    None. Read from its registered containers: arch- or family-specific code (it runs
    on one GPU or family alone, so whatever launches it checks first); a container
    that adds targets the file's most frequent target set (several tied: their union)
    does not serve (cuSOLVER 12's per-arch ``compute_90``, ``compute_100``, ... units);
    a container whose every kernel is named for an architecture (cuBLAS 13's
    ``cutlass_70_*``)."""
    registered = [u for u in units if not u.embedded]
    if any(c.arch.suffix is not Suffix.NONE for u in registered for c in u.codes):
        return "the file holds arch- or family-specific code"
    sets = [frozenset(c.arch for c in u.codes) for u in registered]
    counts = Counter(sets)
    top = max(counts.values(), default=0)
    common: frozenset[Arch] = frozenset().union(*(s for s, n in counts.items() if n == top))
    for s in sets:
        added = sorted(str(a) for a in s if not serves_wherever(common, frozenset({a})))
        if added:
            targets = ", ".join(added)
            return f"the file holds units for targets its common ones do not serve ({targets})"
    named = next((u for u in registered if _named(u)), None)
    if named is not None:
        return f"the kernels of its container {named.index} are named for a GPU architecture"
    return None


def _registered(
    units: Sequence[Unit], results: Sequence[Judgement], cc: ComputeCapability, *, strict: bool
) -> tuple[list[tuple[int, Judgement]], list[str]]:
    """The registered containers that count (by index), and a line for each left out
    as specialised code (judge_units' docstring)."""
    signs = dispatch_signs(units)
    several = sum(not u.embedded for u in units) > 1
    judged: list[tuple[int, Judgement]] = []
    specialised: list[str] = []
    for i, unit in enumerate(units):
        j = results[i]
        if unit.embedded and not strict:
            continue  # judged below, once the registered code is
        # A file's one registered container is judged as it is, whatever it holds.
        left_out = None
        if j.verdict is Verdict.NONE and several and not strict:
            if unit.specific:
                left_out = "it holds only arch- or family-specific code, launched after a check"
            elif signs is not None:
                left_out = f"{signs}, so it chooses kernels by compute capability"
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


def _with_kernels_lacking(unit: Unit, cc: ComputeCapability, j: Judgement) -> Judgement:
    """``j``, or none where the cubin ``cc`` loads lacks kernels the container's other
    cubins define: the CUDA runtime loads the cubin of the highest SM that runs on
    the GPU (CUDA C++ Programming Guide, "Binary Compatibility"), and a kernel it does
    not define cannot be launched ("invalid device function"), whatever the other
    cubins hold. Where two cubins tie (``sm_90``, ``sm_90a``), either may be loaded."""
    if j.verdict is not Verdict.NATIVE or not unit.lacking:
        return j
    runs = [c.arch for c in unit.codes if c.arch.kind is CodeKind.SASS and sass_runs_on(c.arch, cc)]
    top = max((a.cc for a in runs), default=None)
    for arch, missing in unit.lacking:
        if arch.cc == top and arch in runs:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            why = (
                f"its {arch} cubin, the one {cc} loads, lacks kernels its other cubins "
                f"define ({', '.join(missing[:3])}{more}); launching them fails there"
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
    """
    if not units:
        return FileJudgement(verdict=Verdict.NONE, reasons=("no device code",))
    # Libraries repeat a few target sets over thousands of containers: judge each once.
    judged_sets: dict[tuple[CodeTarget, ...], Judgement] = {}
    results = [
        judged_sets.get(u.codes)
        or judged_sets.setdefault(
            u.codes,
            judge_codes(u.codes, cc, driver=driver, facts=facts, driver_cuda=driver_cuda),
        )
        for u in units
    ]
    results = [_with_kernels_lacking(u, cc, j) for u, j in zip(units, results, strict=True)]
    judged, specialised = _registered(units, results, cc, strict=strict)
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
