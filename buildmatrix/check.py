"""``check``: does an image's device code run on the target GPUs and driver?

Pure: takes the scanned image, the profiles and the options, returns a
:class:`CheckResult`; the CLI prints it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from packaging.version import Version

from buildmatrix.binary.report import FileReport
from buildmatrix.check_targets import (
    ALL_FAMILIES,
    EVERY_PROFILE,
    FAMILY_LABEL,
    Options,
    resolve_targets,
    validate_targets,
)
from buildmatrix.compat import (
    Verdict,
)
from buildmatrix.container_env import gate
from buildmatrix.cuda import CudaFacts, DriverVersion, major_minor
from buildmatrix.forward import CompatUse
from buildmatrix.forward_choice import CompatChoice, compat_choice, compat_json
from buildmatrix.image.scanned import ScannedImage
from buildmatrix.jit_env import jit_env
from buildmatrix.loaders import load_gates
from buildmatrix.optional import EVERY_FILE, Loading, classify
from buildmatrix.optional_choice import skipped_everywhere
from buildmatrix.profiles import ProfileSet
from buildmatrix.runtime_sources import newest_runtime, runtime_note, runtime_sources
from buildmatrix.sibling_release import by_release
from buildmatrix.target_verdict import TargetResult, judge_target, worst

# the targets and options live in buildmatrix.check_targets; named here for callers
__all__ = [
    "ALL_FAMILIES",
    "EVERY_PROFILE",
    "FAMILY_LABEL",
    "CheckResult",
    "Options",
    "resolve_targets",
    "run_check",
    "validate_targets",
]

_PROBLEM_PATH = re.compile(r":? ")
# glibc's loader maps what this file names into every process (elf/rtld.c dl_main).
_PRELOAD_FILE = re.compile(r"^etc/ld\.so\.preload$")
_MAJOR_ONLY = re.compile(r"(?:^|/)libcudart\.so\.\d+$")


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
    # The targets the image runs on (no problem of its own: code, driver, --require-sass)
    runs_on: tuple[TargetResult, ...] = ()
    # Which files always load (buildmatrix.optional), and the problems with every
    # file counted (--strict's): what the JSON's strict_verdict follows.
    loading: Loading = EVERY_FILE
    strict_problems: list[str] | None = None

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
            "strict_verdict": "fail" if self.strict_problems else "pass",
            "loading": self.loading.to_json(),
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
            "runs_on": [t.sm for t in self.runs_on],
        }


def run_check(
    image: ScannedImage, profiles: ProfileSet, opts: Options, facts: CudaFacts
) -> CheckResult:
    targets, declared, claims = resolve_targets(profiles, image, opts)
    image = _without_ignored_searches(image, opts.ignore)
    files = [f for f in image.files if not _ignored(f.path, opts.ignore)]
    # Static archives are linked into programs at build time and never loaded: their
    # code is reported, and the programs built from them are what is judged. A file
    # whose device code defines no kernel launches nothing (FileReport.kernel_less):
    # it is reported, and judged as a file without device code.
    loaded = [f for f in files if f.format != "archive" and not f.kernel_less]
    ignored = [f.path for f in image.files if _ignored(f.path, opts.ignore)]
    # A problem line starts with its path ("PATH: why" or "PATH (section …): why").
    unreadable = [
        p
        for p in image.problems
        if not _ignored(_PROBLEM_PATH.split(p, maxsplit=1)[0], opts.ignore)
    ]
    driver, driver_cuda = _driver(opts)
    ignore = partial(_ignored, patterns=opts.ignore)

    def sources_without(skipped: Collection[str] = ()) -> tuple[tuple[Version, str], ...]:
        """The runtime's signs but for ignored files and ``skipped`` optional ones."""
        return tuple(runtime_sources(image, ignored=lambda p: ignore(p) or p in skipped))

    loading = classify(
        loaded,
        image.links,
        symlinks=image.symlinks,
        preload=image.config.env.get("LD_PRELOAD", ""),
        gates=load_gates(),
        paths=image.paths,
        preload_file=bool(image.paths_found(_PRELOAD_FILE)),
    )
    # a CUDA-tagged sibling is picked by the release the rest of the image shows (a
    # libcudart.so.X, pip's name, shows no minor)
    loading = by_release(
        loading,
        lambda members: [s for s in sources_without(members) if not _MAJOR_ONLY.search(s[1])],
    )
    sources = sources_without()
    runtime = newest_runtime(sources)
    choice = compat_choice(image.compat, driver) if driver is not None else None
    problems: list[str] = list(claims)
    if choice is not None and choice.undetermined:
        problems.append(
            f"cuda-compat: {choice.undetermined}; buildmatrix cannot tell whether the NVIDIA "
            f"container toolkit's choice puts the compat driver in use on driver {driver}, "
            "so the image fails (fail closed)"
        )
    states = choice.states if choice is not None else (None,)
    jit = jit_env(image.config.env)
    judge = partial(
        judge_target,
        files=loaded,
        allow_empty=opts.allow_empty,
        unreadable=unreadable,
        driver=driver,
        runtime=runtime,
        facts=facts,
        driver_cuda=driver_cuda,
        jit=jit,
        loading=loading,
        runtime_for=lambda skipped: newest_runtime(sources_without(skipped)),
    )
    # each target under every compat state a node on this driver may be in: the worst
    strict = [worst([judge(t, forward=use, strict=True) for use in states]) for t in targets]
    results = (
        strict
        if opts.strict
        else [worst([judge(t, forward=use, strict=False) for use in states]) for t in targets]
    )
    # the image's Env, as the container toolkit and the driver read it
    by_env = partial(
        gate, env=image.config.env, driver=driver, driver_cuda=driver_cuda, facts=facts
    )
    strict, env_warnings = by_env(strict)
    results = strict if opts.strict else by_env(results)[0]
    results = [replace(r, strict_verdict=s.verdict) for r, s in zip(results, strict, strict=True)]
    if not opts.strict:  # optional files skipped on every target set no floor
        sources = sources_without(skipped_everywhere([r.skipped for r in results]))
        runtime = newest_runtime(sources)
    common = list(problems)
    every = declared["source"] == EVERY_PROFILE
    found, runs_on = _verdict_problems(results, every_profile=every, require_sass=opts.require_sass)
    problems += found
    strict_found, _ = _verdict_problems(strict, every_profile=every, require_sass=opts.require_sass)
    strict_problems = common + strict_found
    if not loaded and not opts.allow_empty:
        problems.append(_no_loaded_code(files))
        strict_problems.append(problems[-1])
    warnings: list[str] = env_warnings
    if jit.narrowed:
        warnings.append(f"{jit.describe()}; every file is judged so")
    for r in image.runtimes:
        if r.release is None and driver is not None and not _ignored(r.path, opts.ignore):
            unread = f"{r.path} holds {r.how}, so driver {driver} is not checked against its floor"
            if opts.strict:
                problems.append(f"{unread}; --strict fails it")
            else:
                warnings.append(f"{unread}; --strict fails such an image")
    if runtime is None and driver is not None and loaded:
        unknown = (
            "no CUDA runtime found: the CUDA runtime the image needs cannot be determined "
            "(no CUDA_VERSION, no libcudart.so, no cubin that records its toolkit), so "
            f"driver {driver} is not checked against a runtime's driver floor"
        )
        strict_problems.append(f"{unknown}; --strict fails it")
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
        runtime_sources=sources,
        warnings=warnings,
        runs_on=runs_on,
        loading=loading,
        strict_problems=strict_problems,
    )


def _without_ignored_searches(image: ScannedImage, patterns: Sequence[str]) -> ScannedImage:
    """The image with its compat lookup made again without the DT_RPATH/DT_RUNPATH of
    ignored files: glibc searches the DT_RUNPATH of the object that asks for
    libcuda.so.1 (elf/dl-load.c, _dl_map_object), and an ignored file, never loaded,
    asks for nothing. The compat driver itself is judged whatever --ignore says: the
    container toolkit puts it in use at container start, not the program."""
    kept = {p: s for p, s in image.searches.items() if not _ignored(p, patterns)}
    if len(kept) == len(image.searches) or image.compat_lookup is None:
        return image
    return replace(image, compat=image.compat_lookup(searches=kept))


def _ignored(path: str, patterns: Sequence[str]) -> bool:
    return bool(patterns) and any(
        fnmatch.fnmatch(path, p) or fnmatch.fnmatch("/" + path, p) for p in patterns
    )


def _verdict_problems(
    results: list[TargetResult], *, every_profile: bool, require_sass: bool
) -> tuple[list[str], tuple[TargetResult, ...]]:
    """The targets' problems as the question reads them, and the targets the image runs
    on. Targets asked for (flags, label, snapshot) must each pass; with every profile
    judged (no target given) the image passes where it runs on one profile's GPU."""
    failed = {id(r): _target_problems([r], require_sass=require_sass) for r in results}
    runs_on = tuple(r for r in results if not failed[id(r)])
    problems = [p for r in results for p in failed[id(r)]]
    if every_profile and runs_on:
        return [], runs_on
    if every_profile:
        problems.insert(0, "the image runs on no profile's GPU")
    return problems, runs_on


def _target_problems(results: list[TargetResult], *, require_sass: bool) -> list[str]:
    """One problem per target without runnable code (or, with --require-sass, running
    only by JIT), and one per target whose driver floors are not met."""
    problems = []
    for r in results:
        label = f"{r.target.name} ({r.sm})"
        if r.verdict is Verdict.NONE:
            problems.append(f"{label}: no runnable code: " + "; ".join(r.code_failures))
        elif r.verdict is Verdict.JIT and require_sass:
            problems.append(
                f"{label}: runs only by PTX JIT, and --require-sass is set: "
                + "; ".join(r.jit_files)
            )
        if not r.driver_ok:
            problems.append(f"{label}: driver: " + "; ".join(r.driver_failures))
    return problems


def _driver(opts: Options) -> tuple[DriverVersion | None, Version | None]:
    """The node's driver (--driver, else the snapshot's) and the CUDA version it reports."""
    driver = opts.driver or (opts.snapshot.driver if opts.snapshot else None)
    # The CUDA version the node's driver reports (NVML nvmlSystemGetCudaDriverVersion)
    # decides which PTX it JITs; it belongs to the snapshot's driver only.
    reported = opts.snapshot.cuda_driver_version if opts.snapshot and not opts.driver else None
    return driver, Version(reported) if reported else None


def _no_loaded_code(files: Sequence[FileReport]) -> str:
    """The problem of an image with no device code that a program loads and launches
    (``files``: those with device code, none of them loaded or launching any)."""
    kernel_less = [f.path for f in files if f.kernel_less]
    if kernel_less:
        more = f" and {len(kernel_less) - 3} more" if len(kernel_less) > 3 else ""
        what = (
            "the image's CUDA device code defines no kernel, so nothing in it can be "
            f"launched ({', '.join(kernel_less[:3])}{more}: cubins without an entry "
            "function, PTX without .entry)"
        )
    elif files:
        what = (
            "the image's CUDA device code is only in static archives, which are "
            "linked at build time and never loaded"
        )
    else:
        what = "the image holds no CUDA device code at all (a CPU-only framework build?)"
    return what + "; pass --allow-empty if that is intended"
