"""``check``: does an image's device code run on the target GPUs and driver?

Pure: takes the scanned image, the profiles and the options, returns a
:class:`CheckResult`; the CLI prints it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.version import Version

from buildmatrix.arch import ComputeCapability, parse_sm
from buildmatrix.binary.report import FileReport
from buildmatrix.compat import (
    DriverCheck,
    Verdict,
    combine,
    driver_floors,
    driver_meets_floors,
)
from buildmatrix.cuda import CudaFacts, DriverVersion, major_minor
from buildmatrix.errors import InputError
from buildmatrix.forward import CompatUse, device_refusal
from buildmatrix.forward_choice import CompatChoice, compat_choice, compat_json
from buildmatrix.image.model import ScannedImage
from buildmatrix.profiles import Profile, ProfileSet
from buildmatrix.snapshot import Snapshot
from buildmatrix.units import judge_units

FAMILY_LABEL = "io.buildmatrix.family"
_CUDART = re.compile(r"(?:^|/)libcudart\.so\.(\d+)(?:\.(\d+))?")
_CUDA_ENV = re.compile(r"(\d+)\.(\d+)")


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


@dataclass(frozen=True, kw_only=True)
class Options:
    families: Sequence[str] = ()
    sms: Sequence[str] = ()
    driver: DriverVersion | None = None
    snapshot: Snapshot | None = None
    require_sass: bool = False
    ignore: Sequence[str] = ()
    allow_empty: bool = False
    strict: bool = False  # every fatbinary container counts, specialised ones too


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    image: ScannedImage
    declared: dict[str, str | None]
    targets: list[TargetResult]
    files: list[FileReport]
    ignored: list[str]
    cuda_runtime: tuple[Version, str] | None
    driver: DriverVersion | None
    problems: list[str] = field(default_factory=list)
    # The cuda-compat states a node on this driver may run the image in.
    compat: CompatChoice | None = None
    # every sign of the CUDA release the code needs (runtime_sources), not only the winner
    runtime_sources: tuple[tuple[Version, str], ...] = ()
    # What could not be checked and does not fail the image (unless --strict).
    warnings: list[str] = field(default_factory=list)

    @property
    def forward(self) -> CompatUse | None:
        """The enable-cuda-compat hook's choice (buildmatrix.forward)."""
        return self.compat.hook if self.compat is not None else None

    @property
    def forward_legacy(self) -> CompatUse | None:
        """The legacy runtime's choice, where it differs (buildmatrix.forward_legacy)."""
        return self.compat.legacy if self.compat is not None else None

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        runtime = None
        if self.cuda_runtime is not None:
            runtime = {"version": major_minor(self.cuda_runtime[0]), "source": self.cuda_runtime[1]}
        return {
            "image": self.image.ref,
            "digest": self.image.digest,
            "index_digest": self.image.index_digest,
            "declared": self.declared,
            "targets": [t.to_json() for t in self.targets],
            "verdict": "pass" if self.passed else "fail",
            "files": [f.to_json() for f in self.files],
            "problems": self.problems,
            "warnings": self.warnings,
            "cuda_runtime": runtime,
            "driver": str(self.driver) if self.driver else None,
            "ignored": self.ignored,
            "forward_compat": compat_json(self.image.compat, self.compat),
            "read_from": self.image.read_from,
            "cuda_runtime_sources": [
                {"version": major_minor(v), "source": s} for v, s in self.runtime_sources
            ],
            "cuda_runtime_note": runtime_note(list(self.runtime_sources)),
        }


def _family_targets(profiles: ProfileSet, names: Sequence[str]) -> list[Target]:
    return [_profile_target(profiles, p, name=n) for n in names for p in profiles.family(n)]


def _profile_target(profiles: ProfileSet, profile: Profile, *, name: str) -> Target:
    return Target(
        name=name,
        cc=profile.cc,
        profile=profile,
        hardware_floor=profiles.hardware_floor(profile.cc),
        products=profile.products,
    )


def _label_families(label: str | None) -> list[str]:
    return [x.strip() for x in (label or "").split(",") if x.strip()]


def validate_targets(profiles: ProfileSet, opts: Options) -> None:
    """Check --family and --sm against the profiles before any image is read."""
    for name in opts.families:
        profiles.family(name)
    for text in opts.sms:
        try:
            sm = parse_sm(text)
        except InputError as exc:
            raise InputError(f"--sm {exc}{profiles.product_hint(text)}") from None
        profiles.get(f"sm_{sm.cc.number}")


def resolve_targets(
    profiles: ProfileSet, image: ScannedImage, opts: Options
) -> tuple[list[Target], dict[str, str | None], list[str]]:
    """Targets, where they came from, and problems with the image's own claim.

    With a snapshot the node's GPU models are the question and the image's family
    label is only a claim checked against them; else --family/--sm; else the label.
    """
    targets: list[Target] = []
    claims: list[str] = []
    label = image.config.labels.get(FAMILY_LABEL)
    if opts.snapshot is not None:
        models = sorted({(g.cc, g.name) for g in opts.snapshot.gpus})
        for cc, product in models:
            brands = {g.brand for g in opts.snapshot.gpus if g.name == product}
            targets.append(
                Target(
                    name=product,
                    cc=cc,
                    profile=profiles.by_cc(cc),
                    hardware_floor=profiles.hardware_floor(cc, product),
                    products=(product,),
                    brand=brands.pop() if len(brands) == 1 else None,
                )
            )
        declared: dict[str, str | None] = {"family": label, "source": "snapshot"}
        claimed = _label_families(label)
        if label is not None:
            for cc, product in models:
                profile = profiles.by_cc(cc)
                family = profile.family.value if profile else f"cc {cc}"
                if family not in claimed:
                    claims.append(
                        f"{product} ({family}): the image's {FAMILY_LABEL} label claims "
                        f"'{label}', which does not include this GPU's family"
                    )
    elif opts.families or opts.sms:
        declared = {"family": label, "source": "flags"}
    elif label is not None:
        targets = _family_targets(profiles, _label_families(label))
        declared = {"family": label, "source": "label"}
    else:
        raise InputError(
            f"'{image.ref}' has no {FAMILY_LABEL} label, so there is nothing to check against: "
            "pass --family F or --sm SM (or --snapshot with a node's GPUs)."
        )
    targets += _family_targets(profiles, opts.families)
    for text in opts.sms:
        profile = profiles.get(f"sm_{parse_sm(text).cc.number}")
        targets.append(_profile_target(profiles, profile, name=profile.sm))
    if not targets:
        where = "the snapshot lists no GPU" if opts.snapshot else f"label '{label}' names none"
        raise InputError(
            f"'{image.ref}': no target GPU to check against ({where}); a check without "
            "targets proves nothing. Pass --family F or --sm SM."
        )
    unique = list({(t.name, t.cc): t for t in targets}.values())
    return unique, declared, claims


CUDA_VERSION_SOURCE = "CUDA_VERSION in the image config"


def runtime_sources(image: ScannedImage) -> list[tuple[Version, str]]:
    """Every sign of the CUDA release the image's code needs, with where it comes from:
    CUDA_VERSION in the config, each ``libcudart.so.X[.Y]`` it ships, and the release
    whose ptxas/nvlink wrote each file's cubins (``.note.nv.tkinfo``; a driver must
    support that major, and it is the only sign of a statically linked runtime)."""
    found: list[tuple[Version, str]] = []
    m = _CUDA_ENV.match(image.config.env.get("CUDA_VERSION", ""))
    if m:
        found.append((Version(f"{m[1]}.{m[2]}"), CUDA_VERSION_SOURCE))
    for path in image.paths:
        hit = _CUDART.search(path)
        if hit:
            found.append((Version(f"{hit[1]}.{hit[2] or 0}"), path))
    for f in image.files:
        if f.toolkit is not None and f.format != "archive":
            found.append((f.toolkit, f"device code of {f.path} (built by CUDA {f.toolkit})"))
    return found


def cuda_runtime(image: ScannedImage) -> tuple[Version, str] | None:
    """The newest CUDA release any source shows (runtime_sources): the floors follow it."""
    return max(runtime_sources(image), key=lambda x: x[0], default=None)


def runtime_note(sources: list[tuple[Version, str]]) -> str | None:
    """Where the image's CUDA_VERSION names an older release than its code needs (kernels
    built by nvcc 13.5 in a CUDA_VERSION=12.8.1 image): say that the two disagree and
    which one the floors follow. None where they agree or there is no CUDA_VERSION."""
    declared = [v for v, s in sources if s == CUDA_VERSION_SOURCE]
    winner = max(sources, key=lambda x: x[0], default=None)
    if not declared or winner is None or winner[0] <= declared[0]:
        return None
    return (
        f"the image's CUDA_VERSION says CUDA {major_minor(declared[0])}, but "
        f"{winner[1]} needs CUDA {major_minor(winner[0])}: the driver floors follow "
        f"{major_minor(winner[0])}"
    )


def run_check(
    image: ScannedImage, profiles: ProfileSet, opts: Options, facts: CudaFacts
) -> CheckResult:
    targets, declared, claims = resolve_targets(profiles, image, opts)
    files = [f for f in image.files if not _ignored(f.path, opts.ignore)]
    # Static archives are linked into programs at build time and never loaded: their
    # code is reported, and the programs built from them are what is judged.
    loaded = [f for f in files if f.format != "archive"]
    ignored = [f.path for f in image.files if _ignored(f.path, opts.ignore)]
    # A problem line starts with its path ("PATH: why" or "PATH (section …): why").
    unreadable = [
        p for p in image.problems if not _ignored(re.split(r":? ", p, maxsplit=1)[0], opts.ignore)
    ]
    driver = opts.driver or (opts.snapshot.driver if opts.snapshot else None)
    # The CUDA version the node's driver reports (NVML nvmlSystemGetCudaDriverVersion)
    # decides which PTX it JITs; it belongs to the snapshot's driver only.
    reported = opts.snapshot.cuda_driver_version if opts.snapshot and not opts.driver else None
    driver_cuda = Version(reported) if reported else None
    runtime = cuda_runtime(image)
    choice = compat_choice(image.compat, driver) if driver is not None else None
    problems: list[str] = list(claims)
    if choice is not None and choice.undetermined:
        problems.append(
            f"cuda-compat: {choice.undetermined}; buildmatrix cannot tell whether the NVIDIA "
            f"container toolkit's choice puts the compat driver in use on driver {driver}, "
            "so the image fails (fail closed)"
        )
    results: list[TargetResult] = []
    for target in targets:
        variants = [
            _judge_target(
                target,
                loaded,
                allow_empty=opts.allow_empty,
                unreadable=unreadable,
                driver=driver,
                runtime=runtime,
                facts=facts,
                strict=opts.strict,
                forward=use,
                driver_cuda=driver_cuda,
            )
            for use in (choice.states if choice is not None else (None,))
        ]
        results.append(_worst(variants))
    for r in results:
        label = f"{r.target.name} ({r.sm})"
        if r.verdict is Verdict.NONE:
            problems.append(f"{label}: no runnable code: " + "; ".join(r.code_failures))
        elif r.verdict is Verdict.JIT and opts.require_sass:
            problems.append(
                f"{label}: runs only by PTX JIT, and --require-sass is set: "
                + "; ".join(r.jit_files)
            )
        if not r.driver_ok:
            problems.append(f"{label}: driver: " + "; ".join(r.driver_failures))
    if not loaded and not opts.allow_empty:
        problems.append(
            (
                "the image's CUDA device code is only in static archives, which are "
                "linked at build time and never loaded"
                if files
                else "the image holds no CUDA device code at all (a CPU-only framework build?)"
            )
            + "; pass --allow-empty if that is intended"
        )
    warnings: list[str] = []
    if runtime is None and driver is not None and loaded:
        unknown = (
            "no CUDA runtime found: the CUDA runtime the image needs cannot be determined "
            "(no CUDA_VERSION, no libcudart.so, no cubin that records its toolkit), so "
            f"driver {driver} is not checked against a runtime's driver floor"
        )
        if opts.strict:
            problems.append(f"{unknown}; --strict fails it")
        else:
            warnings.append(f"{unknown}; --strict fails such an image")
    return CheckResult(
        image=image,
        declared=declared,
        targets=results,
        files=files,
        ignored=ignored,
        cuda_runtime=runtime,
        driver=driver,
        problems=problems,
        compat=choice,
        runtime_sources=tuple(runtime_sources(image)),
        warnings=warnings,
    )


def _worst(variants: list[TargetResult]) -> TargetResult:
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


def _ignored(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch("/" + path, p) for p in patterns)


def _judge_target(
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
) -> TargetResult:
    verdicts: list[Verdict] = []
    failures: list[str] = []
    jit: list[str] = []
    specialised: list[str] = []
    # Through a cuda-compat driver in use, the user-mode driver (runtime floor, PTX JIT)
    # is the compat library's; the kernel-mode driver (hardware floor) stays the node's.
    user_driver = driver
    if forward is not None and forward.in_use:
        # The node's reported CUDA version is its own libcuda's, not the compat one's.
        user_driver, driver_cuda = forward.version or driver, None
    for f in files:
        j = judge_units(
            f.units(),
            target.cc,
            driver=user_driver,
            facts=facts,
            strict=strict,
            driver_cuda=driver_cuda,
        )
        verdicts.append(j.verdict)
        specialised.extend(f"{f.path}: {s}" for s in j.specialised)
        if j.verdict is Verdict.NONE:
            failures.append(f"{f.path}: " + "; ".join(j.reasons))
        elif j.verdict is Verdict.JIT:
            jit.append(f"{f.path}: needs JIT: " + "; ".join(j.reasons))
    for problem in unreadable:  # fail closed: a file we cannot read may be one that fails
        verdicts.append(Verdict.NONE)
        failures.append(f"unreadable: {problem}")
    if not files and not unreadable and not allow_empty:
        failures.append("no device code in the image")
        verdicts.append(Verdict.NONE)
    reasons = [*failures, *jit]
    verdict = combine(verdicts)  # no files at all (allowed): nothing can fail on the GPU
    if verdict is Verdict.NATIVE:
        reasons.append(f"all {len(files)} file(s) with device code have SASS for {target.cc}")
    driver_ok = True
    driver_failures: tuple[str, ...] = ()
    if driver is not None and user_driver is not None:
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
        if forward is not None and forward.in_use:
            reasons.append(f"CUDA forward compatibility: {forward.why}")
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
        else:
            checks = [driver_meets_floors(driver, (*runtime_floors, *hardware_floors))]
            if forward is not None:
                reasons.append(f"CUDA forward compatibility not used: {forward.why}")
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
        jit_files=tuple(jit),
        driver_failures=driver_failures,
        specialised=tuple(specialised),
    )
