"""One target GPU of check: what it is, and its verdict over an image's loaded files.

Pure: a target, the files' device code and the driver in, a :class:`TargetResult`
out. buildmatrix.check judges every target this way and sums them up.
"""

from __future__ import annotations

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
from buildmatrix.profiles import Profile
from buildmatrix.units import judge_file


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
) -> TargetResult:
    # Through a cuda-compat driver in use, the user-mode driver (runtime floor, PTX JIT)
    # is the compat library's; the kernel-mode driver (hardware floor) stays the node's.
    user_driver = driver
    if forward is not None and forward.in_use:
        # The node's reported CUDA version is its own libcuda's, not the compat one's.
        user_driver, driver_cuda = forward.version or driver, None
    verdicts, failures, jitted, specialised = _judge_files(
        files,
        target.cc,
        driver=user_driver,
        facts=facts,
        strict=strict,
        driver_cuda=driver_cuda,
        jit=jit,
    )
    for problem in unreadable:  # fail closed: a file we cannot read may be one that fails
        verdicts.append(Verdict.NONE)
        failures.append(f"unreadable: {problem}")
    if not files and not unreadable and not allow_empty:
        failures.append("no device code in the image")
        verdicts.append(Verdict.NONE)
    reasons = [*failures, *jitted]
    verdict = combine(verdicts)  # no files at all (allowed): nothing can fail on the GPU
    if verdict is Verdict.NATIVE:
        reasons.append(f"all {len(files)} file(s) with device code have SASS for {target.cc}")
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
    files: list[FileReport],
    cc: ComputeCapability,
    *,
    driver: DriverVersion | None,
    facts: CudaFacts,
    strict: bool,
    driver_cuda: Version | None,
    jit: JitEnv,
) -> tuple[list[Verdict], list[str], list[str], list[str]]:
    """Each file's verdict on ``cc`` (buildmatrix.units.judge_file), and the lines of
    the files without runnable code, of those that need JIT, and of the containers left
    out as specialised."""
    verdicts: list[Verdict] = []
    failures: list[str] = []
    jitted: list[str] = []
    specialised: list[str] = []
    for f in files:
        j = judge_file(
            f, cc, driver=driver, facts=facts, strict=strict, driver_cuda=driver_cuda, jit=jit
        )
        verdicts.append(j.verdict)
        specialised.extend(f"{f.path}: {s}" for s in j.specialised)
        if j.verdict is Verdict.NONE:
            failures.append(f"{f.path}: " + "; ".join(j.reasons))
        elif j.verdict is Verdict.JIT:
            jitted.append(f"{f.path}: needs JIT: " + "; ".join(j.reasons))
    return verdicts, failures, jitted, specialised
