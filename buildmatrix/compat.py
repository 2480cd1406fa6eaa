"""Compatibility rules (docs/compatibility.md): can this code run on that GPU and driver?

Pure functions over data; every answer carries reasons a human can read, which
``check`` and ``smoke`` print as they are.

Sources: CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility";
CUDA 12.9 blog "family-specific architecture features" (``f`` suffix); CUDA
Compatibility guide, "Minor Version Compatibility" (PTX JIT is not covered by it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from packaging.version import Version

from buildmatrix.arch import Arch, CodeKind, ComputeCapability, Suffix, integrated, sass_runs_on
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
    "sass_runs_on",
]


@lru_cache(maxsize=4096)  # a pure rule of two values, asked for each target of every node
def _judge_sass(arch: Arch, cc: ComputeCapability) -> Judgement:
    if sass_runs_on(arch, cc):
        return Judgement(verdict=Verdict.NATIVE, reasons=(f"{arch} SASS runs natively on {cc}",))
    if integrated(arch.cc):
        why = (
            f"{arch} is an integrated (Tegra) GPU's SASS, which runs only on {arch.cc} "
            "(NVIDIA gives Tegra no binary compatibility)"
        )
    elif integrated(cc):
        why = (
            f"{arch} is desktop SASS, which runs on no integrated (Tegra) GPU (NVIDIA gives "
            "no binary compatibility between desktop and Tegra)"
        )
    elif arch.suffix is Suffix.ARCH:
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


def combine(verdicts: Iterable[Verdict]) -> Verdict:
    """The verdict of many files on one target: the worst file decides."""
    return min(verdicts, key=_RANK.__getitem__, default=Verdict.NATIVE)


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
    floor = facts.runtime_floor(cuda_runtime.major) if cuda_runtime is not None else None
    # DriverVersion compares by number only; its text is part of what the floors say.
    return _floors(
        cuda_runtime,
        (floor, floor.text) if floor is not None else None,
        (hardware_floor, hardware_floor.text) if hardware_floor is not None else None,
        hardware,
    )


@lru_cache(maxsize=4096)  # pure, of values: asked for each target of every node judged
def _floors(
    cuda_runtime: Version | None,
    runtime_floor: tuple[DriverVersion, str] | None,
    hardware: tuple[DriverVersion, str] | None,
    label: str,
) -> tuple[Floor, ...]:
    """:func:`driver_floors` once the runtime's floor is looked up in the facts."""
    floors: list[Floor] = []
    if cuda_runtime is not None:
        rt = major_minor(cuda_runtime)
        floor = runtime_floor[0] if runtime_floor is not None else None
        why = f"CUDA {rt} runtime (CUDA {cuda_runtime.major}.x minor version compatibility)"
        if floor is None:
            why = (
                f"CUDA {rt} runtime: buildmatrix knows no driver floor for CUDA "
                f"{cuda_runtime.major}.x; update its CUDA table"
            )
        floors.append(Floor(driver=floor, why=why))
    if hardware is not None:
        named = f" for {label}" if label else ""
        floors.append(Floor(driver=hardware[0], why=f"hardware floor{named}"))
    return tuple(floors)


@dataclass(frozen=True, kw_only=True)
class DriverCheck:
    ok: bool
    reasons: tuple[str, ...]
    failures: tuple[str, ...] = ()


def driver_meets_floors(driver: DriverVersion, floors: Iterable[Floor]) -> DriverCheck:
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
