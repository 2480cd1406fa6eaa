"""Compatibility rules (docs/compatibility.md): can this code run on that GPU and driver?

Pure functions over data; every answer carries reasons a human can read, which
``check`` and ``smoke`` print as they are.

Sources: CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility";
CUDA 12.9 blog "family-specific architecture features" (``f`` suffix); CUDA
Compatibility guide, "Minor Version Compatibility" (PTX JIT is not covered by it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from packaging.version import Version

from buildmatrix.arch import Arch, CodeKind, ComputeCapability, Suffix
from buildmatrix.cuda import CudaFacts, DriverVersion, major_minor
from buildmatrix.jit import jit_floor, judge_ptx, ptx_targets, ptx_toolkit
from buildmatrix.verdict import RANK as _RANK
from buildmatrix.verdict import CodeTarget, Judgement, Verdict

__all__ = [
    "CodeTarget",
    "Judgement",
    "Verdict",
    "jit_floor",
    "ptx_targets",
    "ptx_toolkit",
]


def sass_runs_on(arch: Arch, cc: ComputeCapability) -> bool:
    """Binary compatibility of SASS.

    ``sm_XY`` and ``sm_XYf`` run on X.Z for Z >= Y (same major only); ``sm_XYa``
    runs on exactly X.Y.
    """
    if arch.suffix is Suffix.ARCH:
        return cc == arch.cc
    return cc.major == arch.cc.major and cc.minor >= arch.cc.minor


def _judge_sass(arch: Arch, cc: ComputeCapability) -> Judgement:
    if sass_runs_on(arch, cc):
        return Judgement(verdict=Verdict.NATIVE, reasons=(f"{arch} SASS runs natively on {cc}",))
    if arch.suffix is Suffix.ARCH:
        why = f"{arch} is arch-specific SASS and runs only on {arch.cc}"
    elif cc.major != arch.cc.major:
        why = f"{arch} SASS runs only on compute capability {arch.cc.major}.x"
    else:
        why = f"{arch} SASS needs compute capability {arch.cc} or a later {arch.cc.major}.x"
    return Judgement(verdict=Verdict.NONE, reasons=(f"{why}, not {cc}",))


def judge_code(
    code: CodeTarget,
    cc: ComputeCapability,
    *,
    driver: DriverVersion | None,
    facts: CudaFacts,
    driver_cuda: Version | None = None,
) -> Judgement:
    """Verdict for one SASS or PTX entry on a GPU of ``cc`` with ``driver`` (None:
    unknown); ``driver_cuda``, the CUDA version that driver reports where it is known
    (a node snapshot), decides which PTX it can JIT."""
    if code.arch.kind is CodeKind.SASS:
        return _judge_sass(code.arch, cc)
    return judge_ptx(
        code.arch, code.ptx_isa, cc, driver=driver, facts=facts, driver_cuda=driver_cuda
    )


def judge_codes(
    codes: Iterable[CodeTarget],
    cc: ComputeCapability,
    *,
    driver: DriverVersion | None,
    facts: CudaFacts,
    driver_cuda: Version | None = None,
) -> Judgement:
    """Verdict for one file holding several entries: the best entry wins.

    The CUDA runtime loads matching SASS when there is any and falls back to JIT
    of the PTX otherwise, so ``native`` beats ``jit`` beats ``none``. The reasons of
    a ``none`` list why each entry was refused.
    """
    judgements = [
        judge_code(c, cc, driver=driver, facts=facts, driver_cuda=driver_cuda) for c in codes
    ]
    if not judgements:
        return Judgement(verdict=Verdict.NONE, reasons=("no device code",))
    best = max(_RANK[j.verdict] for j in judgements)
    verdict = next(v for v, r in _RANK.items() if r == best)
    if verdict is Verdict.NONE:  # every refusal once (a library often repeats an arch)
        reasons = tuple(dict.fromkeys(r for j in judgements for r in j.reasons))
    else:
        reasons = next(j.reasons for j in judgements if j.verdict is verdict)
    return Judgement(verdict=verdict, reasons=reasons)


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One translation unit's loadable code (a fatbinary container) and the kernels
    its cubins define (compressed ones decompressed: buildmatrix.binary.kernels)."""

    codes: tuple[CodeTarget, ...]
    kernels: tuple[str, ...] = ()
    index: int = 0  # the container's place in the file
    # Whether its kernels were read: False where no cubin of it was (PTX only, or a
    # compressed cubin the scan did not decompress); the rule never exempts on names
    # it has not read.
    kernels_known: bool = True
    # Kept as data and loaded by the program itself (cuModuleLoadData), which picks
    # one per GPU: found by content (buildmatrix.binary.embedded).
    embedded: bool = False

    @property
    def specific(self) -> bool:
        """Only arch- or family-specific code (``sm_90a``, ``sm_100f``, ...)."""
        return all(c.arch.suffix is not Suffix.NONE for c in self.codes)

    def describe(self) -> str:
        archs = ", ".join(sorted({str(c.arch) for c in self.codes}))
        if not self.kernels:
            return archs
        more = f" and {len(self.kernels) - 3} more" if len(self.kernels) > 3 else ""
        return f"{archs}; kernels {', '.join(self.kernels[:3])}{more}"


@dataclass(frozen=True, kw_only=True)
class FileJudgement:
    verdict: Verdict
    reasons: tuple[str, ...]
    specialised: tuple[str, ...] = ()  # containers left out of the verdict, and why


# A kernel named for a GPU architecture: an SM number (sm80, sm_90a, _sm100), a
# CUTLASS arch tag (cutlass_70_...), or a generation's name. Kernel names of NVIDIA's
# libraries carry them where a kernel is one GPU's variant (cuBLAS 13's sm_75-only
# container holds cutlass_70_simt_*, its sm_120-only one *_forwardCompat_*
# kernels tagged cutlass_80; cuDNN 9's Volta_*).
_ARCH_NAMED = re.compile(
    r"(?i)(?:sm_?\d{2,3}[af]?(?!\d)|cutlass_\d{2,3}_|volta|turing|ampere|hopper|blackwell)"
)


def _specialisation(unit: Unit, dispatches: bool) -> str | None:
    """Why a container with nothing for the GPU is left out, or None: it counts."""
    if unit.specific:
        return "holds only arch- or family-specific code, launched after a capability check"
    if dispatches:
        return "the file holds arch-specific code, so it chooses kernels by compute capability"
    if unit.kernels_known and unit.kernels and all(_ARCH_NAMED.search(k) for k in unit.kernels):
        return "each of its kernels is named for a GPU architecture"
    return None


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
    launches it checks the capability first), or the file holds such code in any
    container (NVIDIA's cuDNN and cuBLASLt, torch), or every kernel of the container
    is named for an architecture (cuBLAS's ``cutlass_70_*``). Anything else is a
    short translation unit and fails the file; so does a file where no registered
    container runs. Code kept as data (found by content) is loaded by the program
    itself, one blob per GPU: beside registered code that counts it is reported,
    not judged; else the best blob for the GPU counts and the file fails when none
    has code for it. ``strict`` counts every container.
    """
    if not units:
        return FileJudgement(verdict=Verdict.NONE, reasons=("no device code",))
    dispatches = any(
        c.arch.suffix is not Suffix.NONE for u in units if not u.embedded for c in u.codes
    )
    judged: list[tuple[int, Judgement]] = []
    specialised: list[str] = []
    # Libraries repeat a few target sets over thousands of containers: judge each once.
    judged_sets: dict[tuple[CodeTarget, ...], Judgement] = {}
    results = [
        judged_sets.get(u.codes)
        or judged_sets.setdefault(
            u.codes, judge_codes(u.codes, cc, driver=driver, facts=facts, driver_cuda=driver_cuda)
        )
        for u in units
    ]
    for i, unit in enumerate(units):
        j = results[i]
        if unit.embedded and not strict:
            continue  # judged below, once the registered code is
        why = _specialisation(unit, dispatches) if j.verdict is Verdict.NONE else None
        if why is not None and not strict:
            specialised.append(
                f"container {unit.index} ({unit.describe()}) has nothing for {cc} and is "
                f"specialised code: {why}; left out of the verdict (--strict counts it)"
            )
            continue
        judged.append((i, j))
    # Code the program loads itself (kept as data) is chosen per GPU. Beside registered
    # code that counts, it is a specialisation (cuBLASLt keeps Blackwell-only kernels
    # so); otherwise its best blob for this GPU counts (cuFFT registers only a link
    # stub), and with no blob for it every one fails the file.
    kept = [] if strict else [i for i, u in enumerate(units) if u.embedded]
    chosen = max(kept, key=lambda i: _RANK[results[i].verdict], default=None)
    none_kept = chosen is None or results[chosen].verdict is Verdict.NONE
    alone = not judged
    for i in kept:
        unit, j = units[i], results[i]
        if alone and (i == chosen or none_kept):
            judged.append((i, j))
        elif j.verdict is Verdict.NONE:
            specialised.append(
                f"container {unit.index} ({unit.describe()}), kept as data, has nothing "
                f"for {cc}; the program loads another (--strict counts it)"
            )
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


def combine(verdicts: Iterable[Verdict]) -> Verdict:
    """The verdict of many files on one target: the worst file decides."""
    worst = min((_RANK[v] for v in verdicts), default=_RANK[Verdict.NATIVE])
    return next(v for v, r in _RANK.items() if r == worst)


@dataclass(frozen=True, kw_only=True)
class Floor:
    """One driver floor and what sets it; ``driver`` None: unknown, so nothing passes."""

    driver: DriverVersion | None
    why: str


def driver_floors(
    *,
    cuda_runtime: Version | None,
    hardware_floor: DriverVersion | None,
    hardware: str = "",
    facts: CudaFacts,
) -> tuple[Floor, ...]:
    """Every floor a driver must meet to run code of this CUDA runtime on this hardware.

    The one derivation of "the driver this needs": the runtime major's floor (minor
    version compatibility; CUDA Compatibility guide) and the hardware floor of the
    GPU's profile or product. ``check``, ``smoke`` and ``generate`` all use it. A CUDA
    major the table does not know gives an unknown floor (fail closed).
    """
    floors: list[Floor] = []
    if cuda_runtime is not None:
        rt = major_minor(cuda_runtime)
        floor = facts.runtime_floor(cuda_runtime.major)
        why = f"CUDA {rt} runtime (CUDA {cuda_runtime.major}.x minor version compatibility)"
        if floor is None:
            why = (
                f"CUDA {rt} runtime: buildmatrix knows no driver floor for CUDA "
                f"{cuda_runtime.major}.x; update its CUDA table"
            )
        floors.append(Floor(driver=floor, why=why))
    if hardware_floor is not None:
        label = f" for {hardware}" if hardware else ""
        floors.append(Floor(driver=hardware_floor, why=f"hardware floor{label}"))
    return tuple(floors)


@dataclass(frozen=True, kw_only=True)
class DriverCheck:
    ok: bool
    reasons: tuple[str, ...]
    failures: tuple[str, ...] = ()


def check_driver(driver: DriverVersion, floors: Iterable[Floor]) -> DriverCheck:
    """Whether ``driver`` meets every floor; an unknown floor fails."""
    reasons: list[str] = []
    failures: list[str] = []
    for floor in floors:
        if floor.driver is None:
            reasons.append(floor.why)
            failures.append(floor.why)
        elif driver < floor.driver:
            text = f"{floor.why} needs driver >= {floor.driver}; node has {driver}"
            reasons.append(text)
            failures.append(text)
        else:
            reasons.append(f"driver {driver} >= {floor.driver}: {floor.why}")
    return DriverCheck(ok=not failures, reasons=tuple(reasons), failures=tuple(failures))
