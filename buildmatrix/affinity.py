"""``affinity``: the nodeAffinity a Pod needs to land only where its image runs.

Pure. It says with labels what ``check --snapshot`` decides on a node, so that for
every node ``smoke`` admitted, the affinity matches the node's labels iff ``check
--snapshot`` passes the image there (tests/test_affinity.py proves it over every
fixture image and node). It reads only keys ``smoke`` writes whatever
``--gfd-keys`` says (buildmatrix.labelkeys), so it works beside GFD or without it:

- ``buildmatrix.io/gpu.compute-capability In [...]``: the GPUs whose code ``check``
  accepts (SASS, or PTX the driver can JIT; not JIT with ``--require-sass``), that
  have every ``--require``'d feature and, where the image's ``io.buildmatrix.family``
  label names families, are of one of them (``check --snapshot`` fails the claim);
- the driver the image needs on them: ``buildmatrix.io/driver.version``, the driver
  as one sortable integer (labelkeys.driver_ordinal), so a floor is one ``Gt`` and a
  range one ``Gt`` and one ``Lt`` (``Gt``/``Lt`` compare integers only:
  buildmatrix.selector). The driver ranges are found by running ``check``
  itself at every driver version where its answer can change (:func:`breakpoints`:
  the CUDA runtime floor, each profile's hardware floor, the driver that JITs each
  PTX, the edges of the image's forward-compatibility library), so the affinity
  follows its rules (minor version compatibility, PTX JIT, forward compatibility)
  without restating them. A product's own floor (H200 beside H100) is not said:
  ``smoke`` admits no node below its GPUs' floors;
- on a node of several models (``buildmatrix.io/compute-capability.X.Y`` per model),
  every model must qualify, with the driver each one needs;
- ``buildmatrix.io/gpu.memory-mb Gt N-1`` for ``--min-memory N`` (the smallest GPU's);
- ``kubernetes.io/arch In [...]`` (the kubelet's own label: k8s.io/api
  ``core/v1/well_known_labels.go``, ``LabelArchStable``, from Go's GOARCH) for the
  platforms the image offers, when the chosen GPUs come with a host of another CPU
  architecture too (the profiles' ``hosts``): an amd64-only image is kept off Grace
  (GH200, GB200) nodes, whose runtime would find no entry to pull. Nothing is said
  when the image offers every platform the chosen GPUs come with, or names none.

It also merges the block into a workload manifest (Pod, Job, CronJob, Deployment,
StatefulSet, DaemonSet, ReplicaSet), ANDing it with any node affinity already there.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from buildmatrix.arch import HOST_ARCHES, CodeKind
from buildmatrix.check import FAMILY_LABEL, Options, run_check
from buildmatrix.compat import Verdict, ptx_toolkit
from buildmatrix.cuda import CudaFacts, DriverVersion
from buildmatrix.errors import InputError, did_you_mean
from buildmatrix.forward import driver_breakpoints
from buildmatrix.image.scanned import ScannedImage
from buildmatrix.labelkeys import (
    COMPUTE_CAPABILITY,
    DRIVER_VERSION,
    FAMILY,
    MEMORY,
    MEMORY_MB,
    driver_ordinal_at_least,
    present_key,
)
from buildmatrix.profiles import FEATURE_MIN_CC, Profile, ProfileSet
from buildmatrix.runtime_sources import runtime_sources
from buildmatrix.selector import (
    ABSENT,
    Constraint,
    Term,
    cross,
    one_of,
    render,
)
from buildmatrix.target_verdict import TargetResult

__all__ = [
    "ARCH",
    "FAMILY",
    "MEMORY",
    "Choice",
    "Needs",
    "affinity_block",
    "arch_constraint",
    "choose",
]

# The kubelet sets it on every node (runtime.GOARCH); not a key smoke writes.
ARCH = "kubernetes.io/arch"
# Every key an affinity reads: each is one smoke writes (labelkeys.owned).
READS = (COMPUTE_CAPABILITY, MEMORY_MB, DRIVER_VERSION)
_ZERO = DriverVersion((0, 0, 0), "0.0.0")
_POD_SPEC_PATHS = {
    "Pod": ("spec",),
    "Job": ("spec", "template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


@dataclass(frozen=True, kw_only=True)
class Needs:
    features: Sequence[str] = ()
    min_memory_mib: int | None = None
    require_sass: bool = False


# --min-memory units: what nvidia.com/gpu.memory counts (MiB, GFD) and what GPU
# datasheets and people say (GB, decimal; GiB, binary). A job's floor rounds up.
_MEMORY_UNITS = {"mib": 1 << 20, "mb": 10**6, "gib": 1 << 30, "gb": 10**9}


def parse_memory_mib(text: str) -> int:
    """``--min-memory``: MiB as an integer (``71680``), or with a unit (``70GiB``,
    ``80GB``, ``40960MiB``, ``40000MB``; any case, a space allowed), in MiB rounded
    up."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or (unit and unit not in _MEMORY_UNITS) or (not unit and "." in text):
        raise InputError(
            f"--min-memory '{text}': GPU memory in MiB, an integer (71680), or with a "
            "unit: 70GiB, 80GB, 40960MiB or 40000MB."
        )
    number = Decimal(match.group(1))
    mib = math.ceil(number * _MEMORY_UNITS[unit or "mib"] / (1 << 20))
    if mib < 1:
        raise InputError(f"--min-memory '{text}': must be at least 1 MiB.")
    return mib


def validate_needs(needs: Needs) -> None:
    """Unknown feature names are bad input, before any image is read."""
    for feature in needs.features:
        if feature not in FEATURE_MIN_CC:
            raise InputError(
                f"--require {feature}: not a feature the profiles know."
                f"{did_you_mean(feature, FEATURE_MIN_CC)} Features: "
                f"{', '.join(FEATURE_MIN_CC)}."
            )


# A driver range [low, high): high None is unbounded.
Interval = tuple[DriverVersion, DriverVersion | None]


@dataclass(frozen=True, kw_only=True)
class Choice:
    """Which profiles the image may run on, on which drivers, and why each other one
    is out."""

    chosen: tuple[tuple[Profile, tuple[Interval, ...]], ...]
    excluded: tuple[tuple[Profile, str], ...]

    @property
    def profiles(self) -> tuple[Profile, ...]:
        return tuple(p for p, _ in self.chosen)


def _version(key: tuple[int, int, int]) -> DriverVersion:
    return DriverVersion(key, ".".join(str(x) for x in key))


def breakpoints(image: ScannedImage, profiles: ProfileSet, facts: CudaFacts) -> list[DriverVersion]:
    """Every driver version at which ``check``'s answer for this image can change;
    between two of them it is the same (each rule compares the driver with one of
    these: compat.driver_floors, jit.judge_ptx, forward.compat_use and
    forward_legacy.legacy_use)."""
    found = {_ZERO}
    # every sign's floor, not only the newest's: a target may skip the file that shows
    # the newest (buildmatrix.optional), and then an older sign's floor is its own
    for version, _source in runtime_sources(image):
        if (floor := facts.runtime_floor(version.major)) is not None:
            found.add(floor)
    for p in profiles:
        if (hw := profiles.hardware_floor(p.cc)) is not None:
            found.add(hw[0])
    for f in image.files:
        for unit in f.units():
            for code in unit.codes:
                if code.arch.kind is CodeKind.PTX and code.ptx_isa is not None:
                    tk = ptx_toolkit(code.ptx_isa, facts)
                    if tk is not None and tk.driver is not None:
                        found.add(tk.driver)
    found |= {_version(key) for key in driver_breakpoints(image.compat)}
    return sorted(found)


def _runs(target: TargetResult, require_sass: bool) -> bool:
    """``check``'s verdict on one target (check.run_check's problems, per target)."""
    if target.verdict is Verdict.NONE or not target.driver_ok:
        return False
    return not (target.verdict is Verdict.JIT and require_sass)


def _why_not(target: TargetResult | None, require_sass: bool) -> str:
    if target is None:
        return "not checked"
    if target.verdict is Verdict.NONE:
        return f"no code that runs ({'; '.join(target.code_failures[:1])})"
    if target.verdict is Verdict.JIT and require_sass:
        return "runs only by PTX JIT, and --require-sass is set"
    return f"no driver runs it ({'; '.join(target.driver_failures[:1])})"


def _intervals(passes: Sequence[tuple[DriverVersion, bool]]) -> tuple[Interval, ...]:
    out: list[Interval] = []
    low: DriverVersion | None = None
    for version, ok in passes:
        if ok and low is None:
            low = version
        elif not ok and low is not None:
            out.append((low, version))
            low = None
    if low is not None:
        out.append((low, None))
    return tuple(out)


def choose(image: ScannedImage, profiles: ProfileSet, needs: Needs, facts: CudaFacts) -> Choice:
    """The profiles whose GPUs run the image (``check`` against every profile's SM at
    each of :func:`breakpoints`), with the drivers they run it on, that have every
    required feature and a family the image's label claims (where it has one)."""
    points = breakpoints(image, profiles, facts)
    opts = Options(sms=[p.sm for p in profiles], require_sass=needs.require_sass)
    results = [
        (v, {t.sm: t for t in run_check(image, profiles, _at(opts, v), facts).targets})
        for v in points
    ]
    label = image.config.labels.get(FAMILY_LABEL)
    claimed = {x.strip() for x in (label or "").split(",") if x.strip()}
    chosen: list[tuple[Profile, tuple[Interval, ...]]] = []
    excluded: list[tuple[Profile, str]] = []
    for p in profiles:
        missing = [f for f in needs.features if f not in p.features]
        ranges = _intervals(
            [
                (v, (t := by_sm.get(p.sm)) is not None and _runs(t, needs.require_sass))
                for v, by_sm in results
            ]
        )
        if not ranges:
            excluded.append((p, _why_not(results[-1][1].get(p.sm), needs.require_sass)))
        elif label is not None and p.family.value not in claimed:
            excluded.append((p, f"the image's {FAMILY_LABEL} label '{label}' leaves it out"))
        elif missing:
            excluded.append((p, f"lacks {', '.join(missing)}"))
        else:
            chosen.append((p, ranges))
    return Choice(chosen=tuple(chosen), excluded=tuple(excluded))


def _at(opts: Options, driver: DriverVersion) -> Options:
    return Options(sms=opts.sms, require_sass=opts.require_sass, driver=driver)


def _driver_terms(ranges: Sequence[Interval]) -> list[dict[str, Constraint]]:
    """One term per driver range [low, high): the ordinal from low's, below high's."""
    terms: list[dict[str, Constraint]] = []
    for low, high in ranges:
        lo = driver_ordinal_at_least(low.key) if low != _ZERO else None
        hi = driver_ordinal_at_least(high.key) - 1 if high is not None else None
        terms.append({DRIVER_VERSION: Constraint(lo=lo, hi=hi)})
    return terms


def arch_constraint(
    choice: Choice, profiles: ProfileSet, offered: Sequence[str]
) -> Constraint | None:
    """``kubernetes.io/arch`` In the Linux CPU architectures the image offers, where
    some chosen GPU comes with a host of an architecture it does not offer; None when
    it offers all of them, or names no platform at all (nothing is known)."""
    provided = {p.split("/")[1] for p in offered if p.startswith("linux/")}
    if not offered:
        return None
    needed = {p.split("/")[1] for p in profiles.platforms(choice.profiles)}
    if needed <= provided:
        return None
    order = {a: i for i, a in enumerate(HOST_ARCHES)}
    return one_of(sorted(provided, key=lambda a: (order.get(a, len(order)), a)))


def terms(
    choice: Choice, profiles: ProfileSet, needs: Needs, offered: Sequence[str] = ()
) -> list[list[dict[str, Any]]]:
    """The nodeSelectorTerms (each a list of matchExpressions), ORed.

    The node's least capable GPU (``gpu.compute-capability``) is one the image runs
    on; no GPU of a model it does not run on is there (mixed nodes); and for each
    group of GPUs that need the same drivers: none of them is there, or the driver
    is one they run it on.
    """
    ccs = {str(p.cc) for p in choice.profiles}
    lowest = min(p.cc for p in choice.profiles)
    base: dict[str, Constraint] = {COMPUTE_CAPABILITY: one_of(ccs)}
    for p in profiles:
        if str(p.cc) not in ccs and p.cc > lowest:
            base[present_key(p.cc)] = ABSENT
    if needs.min_memory_mib is not None:
        base[MEMORY_MB] = Constraint(lo=needs.min_memory_mib)
    if (arch := arch_constraint(choice, profiles, offered)) is not None:
        base[ARCH] = arch
    groups: dict[tuple[Interval, ...], list[str]] = {}
    for p, ranges in choice.chosen:
        if ranges != ((_ZERO, None),):  # any driver: nothing to say
            groups.setdefault(ranges, []).append(str(p.cc))
    alternatives: list[Sequence[Term]] = [[base]]
    for ranges, members in groups.items():
        none_here: dict[str, Constraint] = {COMPUTE_CAPABILITY: one_of(ccs - set(members))}
        none_here |= {present_key(cc): ABSENT for cc in members}
        alternatives.append([none_here, *_driver_terms(ranges)])
    return [render(t) for t in cross(*alternatives)]


def per_arch_terms(
    by_arch: dict[str, list[list[dict[str, Any]]]], judged: Sequence[str]
) -> list[list[dict[str, Any]]]:
    """The terms of an image whose entries for the CPU architectures ``judged``
    were each judged (``by_arch``: those whose entry runs on some GPU): where every
    judged architecture gives the same terms, those; else each one's terms pinned to
    ``kubernetes.io/arch In [ARCH]``, ORed, so that a node runs what its own
    architecture's entry runs (an arm64 entry without Hopper code keeps GH200 nodes
    out although the amd64 entry has it)."""
    if set(by_arch) == set(judged) and len({repr(t) for t in by_arch.values()}) == 1:
        return next(iter(by_arch.values()))
    pinned = []
    for arch, arch_terms in by_arch.items():
        for term in arch_terms:
            kept = [e for e in term if e.get("key") != ARCH]
            pinned.append([*kept, {"key": ARCH, "operator": "In", "values": [arch]}])
    return pinned


def nodes_block(node_terms: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """``affinity:`` with the required node affinity of these terms (ORed)."""
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": t} for t in node_terms]
                }
            }
        }
    }


def affinity_block(exprs: list[dict[str, Any]]) -> dict[str, Any]:
    """``affinity:`` with one term of these matchExpressions."""
    return nodes_block([exprs])


def merge_into(doc: Any, node_terms: list[list[dict[str, Any]]], *, source: str) -> Any:
    """``doc`` (one workload object) with the terms ANDed into its pod spec's
    required node affinity: each existing term combined with each new one (an
    expression on a key the new terms set is replaced), or the new terms alone."""
    if not isinstance(doc, dict) or doc.get("kind") not in _POD_SPEC_PATHS:
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise InputError(
            f"{source}: a {kind!r} has no pod template; --into takes a "
            f"{', '.join(_POD_SPEC_PATHS)}."
        )
    out = copy.deepcopy(doc)
    spec: Any = out
    for key in _POD_SPEC_PATHS[out["kind"]]:
        if not isinstance(spec, dict):
            raise InputError(
                f"{source}: {out['kind']} has no '{key}' mapping where a pod spec goes."
            )
        spec = spec.setdefault(key, {})
    if not isinstance(spec, dict):
        raise InputError(f"{source}: the pod spec of the {out['kind']} is not a mapping.")
    # null is absent for the API server (an affinity: or nodeAffinity: left empty)
    affinity = spec["affinity"] = spec.get("affinity") or {}
    node = affinity["nodeAffinity"] = affinity.get("nodeAffinity") or {}
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    required = node[key] = node.get(key) or {}
    if not all(isinstance(x, dict) for x in (affinity, node, required)):
        raise InputError(f"{source}: the {out['kind']}'s affinity is not a mapping.")
    existing = required.get("nodeSelectorTerms") or [{}]
    keys = {e["key"] for t in node_terms for e in t}
    merged = []
    for term in existing:
        kept = [e for e in term.get("matchExpressions") or [] if e.get("key") not in keys]
        for new in node_terms:
            merged.append({**term, "matchExpressions": kept + copy.deepcopy(new)})
    required["nodeSelectorTerms"] = merged
    return out
