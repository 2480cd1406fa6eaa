"""One target GPU of check: what it is, and its verdict over an image's loaded files.

Pure: a target, the files' device code and the driver in, a :class:`TargetResult`
out. buildmatrix.check judges every target this way and sums them up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from packaging.version import Version

from buildmatrix.arch import ComputeCapability
from buildmatrix.binary.report import FileReport
from buildmatrix.compat import (
    DriverCheck,
    Verdict,
    combine,
    driver_floors,
    driver_meets_floors,
)
from buildmatrix.cuda import CudaFacts, DriverVersion
from buildmatrix.forward import CompatUse
from buildmatrix.forward_devices import device_refusal
from buildmatrix.jit_env import DEFAULT, JitEnv
from buildmatrix.optional import EVERY_FILE, Loading
from buildmatrix.optional_choice import Choice, Skipped, choose
from buildmatrix.profiles import Profile
from buildmatrix.units import judge_file
from buildmatrix.verdict import FileJudgement

# The CUDA runtime the image's code needs, but for the files given (skipped here).
RuntimeFor = Callable[[frozenset[str]], "tuple[Version, str] | None"]


@dataclass(frozen=True, kw_only=True)
class Target:
    name: str
    cc: ComputeCapability
    profile: Profile | None
    # The GPU's driver floor and what sets it (ProfileSet.hardware_floor): its
    # profile's, its product's, or for an unknown CC its family's nearest older one.
    hardware_floor: tuple[DriverVersion, str] | None = None
    # The products the target stands for and, from a node snapshot, their NVML brand:
    # CUDA forward compatibility accepts some boards only (buildmatrix.forward).
    products: tuple[str, ...] = ()
    brand: int | None = None


@dataclass(frozen=True, kw_only=True)
class TargetResult:
    target: Target
    verdict: Verdict
    driver_ok: bool
    reasons: tuple[str, ...]
    code_failures: tuple[str, ...] = ()
    jit_files: tuple[str, ...] = ()
    driver_failures: tuple[str, ...] = ()
    specialised: tuple[str, ...] = ()  # containers left out of the verdict (judge_units)
    # optional files left out on this GPU (buildmatrix.optional), and the verdict
    # with every file counted (--strict's; None where not judged so)
    skipped: tuple[Skipped, ...] = ()
    strict_verdict: Verdict | None = None
    # every file counted, each by the per-container rule (the verdict before files
    # that load only where they run were told apart)
    every_file_verdict: Verdict | None = None

    @property
    def sm(self) -> str:
        return self.target.profile.sm if self.target.profile else f"sm_{self.target.cc.number}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.target.name,
            "sm": self.sm,
            "compute_capability": str(self.target.cc),
            "verdict": self.verdict.value,
            "driver_ok": self.driver_ok,
            "reasons": list(self.reasons),
            "specialised": list(self.specialised),
            "strict_verdict": (self.strict_verdict or self.verdict).value,
            "every_file_verdict": (self.every_file_verdict or self.verdict).value,
            "skipped": [s.to_json() for s in self.skipped],
        }


def worst(variants: list[TargetResult]) -> TargetResult:
    """One target judged under each compat state a node may be in: the worst counts."""
    if len(variants) == 1:
        return variants[0]

    def joined(attr: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(x for v in variants for x in getattr(v, attr)))

    return replace(
        variants[0],
        verdict=combine(v.verdict for v in variants),
        driver_ok=all(v.driver_ok for v in variants),
        reasons=joined("reasons"),
        code_failures=joined("code_failures"),
        jit_files=joined("jit_files"),
        driver_failures=joined("driver_failures"),
        specialised=joined("specialised"),
        skipped=tuple(dict.fromkeys(s for v in variants for s in v.skipped)),
        every_file_verdict=combine(v.every_file_verdict or v.verdict for v in variants),
    )


def judge_target(
    target: Target,
    files: list[FileReport],
    *,
    allow_empty: bool,
    unreadable: list[str],
    driver: DriverVersion | None,
    runtime: tuple[Version, str] | None,
    facts: CudaFacts,
    strict: bool,
    forward: CompatUse | None = None,
    driver_cuda: Version | None = None,
    jit: JitEnv = DEFAULT,
    loading: Loading = EVERY_FILE,
    runtime_for: RuntimeFor | None = None,
) -> TargetResult:
    """The target's verdict over ``files`` (every file that may be loaded: static
    archives left out) and the driver. Without ``strict``, the files ``loading``
    names optional count as buildmatrix.optional_choice.choose says: the files that always
    load decide, and an optional file without code for the GPU is skipped there
    (and sets no runtime floor: ``runtime_for`` gives the runtime without them)."""
    # Through a cuda-compat driver in use, the user-mode driver (runtime floor, PTX JIT)
    # is the compat library's; the kernel-mode driver (hardware floor) stays the node's.
    user_driver = driver
    if forward is not None and forward.in_use:
        # The node's reported CUDA version is its own libcuda's, not the compat one's.
        user_driver, driver_cuda = forward.version or driver, None
    judged = {
        f.path: judge_file(
            f,
            target.cc,
            driver=user_driver,
            facts=facts,
            strict=strict,
            driver_cuda=driver_cuda,
            jit=jit,
        )
        for f in files
    }
    choice = (
        Choice(counted=tuple(judged))
        if strict or loading is EVERY_FILE
        else choose(loading, judged, target.cc)
    )
    verdicts, failures, jitted, specialised = _judge_files(files, judged, choice)
    if choice.skipped and runtime_for is not None:
        runtime = runtime_for(frozenset(s.path for s in choice.skipped))
    image_wide: list[Verdict] = []  # what fails the target whatever file counts
    for problem in unreadable:  # fail closed: a file we cannot read may be one that fails
        image_wide.append(Verdict.NONE)
        failures.append(f"unreadable: {problem}")
    if not files and not unreadable and not allow_empty:
        failures.append("no device code in the image")
        image_wide.append(Verdict.NONE)
    reasons = [*failures, *jitted]
    # no files at all (allowed): nothing can fail on the GPU
    verdict = combine([*verdicts, *image_wide])
    every_file = combine([*(j.verdict for j in judged.values()), *image_wide])
    if verdict is Verdict.NATIVE and choice.fallback is None:
        n = len(choice.counted) + len(choice.groups)
        reasons.append(f"all {n} file(s) with device code have SASS for {target.cc}")
    if choice.skipped:
        reasons.append(
            f"{len(choice.skipped)} optional file(s) without code for {target.cc} skipped "
            "(listed under skipped; --strict counts them)"
        )
    driver_ok = True
    driver_failures: tuple[str, ...] = ()
    if driver is not None and user_driver is not None:
        checks = _driver_checks(
            target, driver, user_driver, runtime=runtime, facts=facts, forward=forward
        )
        if forward is not None:
            use = "" if forward.in_use else " not used"
            reasons.append(f"CUDA forward compatibility{use}: {forward.why}")
        driver_ok = all(c.ok for c in checks)
        driver_failures = tuple(x for c in checks for x in c.failures)
        reasons.extend(x for c in checks for x in c.reasons)
    else:
        reasons.append("no driver given (--driver or --snapshot): driver floors not checked")
    return TargetResult(
        target=target,
        verdict=verdict,
        driver_ok=driver_ok,
        reasons=tuple(reasons),
        code_failures=tuple(failures),
        jit_files=tuple(jitted),
        driver_failures=driver_failures,
        specialised=tuple(specialised),
        skipped=choice.skipped,
        every_file_verdict=every_file,
    )


def _driver_checks(
    target: Target,
    driver: DriverVersion,
    user_driver: DriverVersion,
    *,
    runtime: tuple[Version, str] | None,
    facts: CudaFacts,
    forward: CompatUse | None,
) -> list[DriverCheck]:
    """The driver floors the target's GPU and the image's runtime set, met by the node's
    driver, or with a compat driver in use by the user-mode (``user_driver``: runtime)
    and kernel-mode (``driver``: hardware) drivers apart, and the compat library's
    device list (buildmatrix.forward_devices.device_refusal)."""
    hw = target.hardware_floor
    runtime_floors = driver_floors(
        cuda_runtime=runtime[0] if runtime else None, hardware_floor=None, facts=facts
    )
    hardware_floors = driver_floors(
        cuda_runtime=None,
        hardware_floor=hw[0] if hw else None,
        hardware=hw[1] if hw else "",
        facts=facts,
    )
    if forward is None or not forward.in_use:
        return [driver_meets_floors(driver, (*runtime_floors, *hardware_floors))]
    checks = [
        driver_meets_floors(user_driver, runtime_floors),
        driver_meets_floors(driver, hardware_floors),
    ]
    refused = device_refusal(forward.library, products=target.products, brand=target.brand)
    if refused is not None:
        text = (
            f"the compat driver {forward.library.describe()} is put in use on "
            f"driver {driver}, and forward compatibility does not cover {refused}: "
            "CUDA fails to start (cudaErrorCompatNotSupportedOnDevice)"
        )
        checks.append(DriverCheck(ok=False, reasons=(text,), failures=(text,)))
    return checks


def _judge_files(
    files: list[FileReport], judged: dict[str, FileJudgement], choice: Choice
) -> tuple[list[Verdict], list[str], list[str], list[str]]:
    """The verdicts that count (``choice``: the files that always load, each sibling
    group's, the optional files' where nothing else holds code; each file judged by
    buildmatrix.units.judge_file), and the lines of the files without runnable code,
    of those that need JIT, and of the containers left out as specialised."""
    verdicts: list[Verdict] = []
    failures: list[str] = []
    jitted: list[str] = []
    specialised: list[str] = []
    counted = set(choice.counted)
    for f in files:
        j = judged[f.path]
        if f.path not in counted:
            continue
        specialised.extend(f"{f.path}: {s}" for s in j.specialised)
        verdicts.append(j.verdict)
        if j.verdict is Verdict.NONE:
            failures.append(f"{f.path}: " + "; ".join(j.reasons))
        elif j.verdict is Verdict.JIT:
            jitted.append(f"{f.path}: needs JIT: " + "; ".join(j.reasons))
    for pattern, verdict, why in choice.groups:
        verdicts.append(verdict)
        if verdict is Verdict.NONE:
            failures.append(f"{pattern}: {why}")
        elif verdict is Verdict.JIT:
            jitted.append(f"{pattern}: needs JIT: {why}")
    if choice.fallback is not None:
        verdict, lines = choice.fallback
        verdicts.append(verdict)
        if verdict is Verdict.NONE:
            failures.extend(lines)
        elif verdict is Verdict.JIT:
            jitted.extend(lines)
    return verdicts, failures, jitted, specialised
