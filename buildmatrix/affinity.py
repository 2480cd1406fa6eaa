"""``affinity``: the nodeAffinity a Pod needs to land only where its image runs.

Pure. From an image's real contents (``check`` against every profile) and the needs
a user declares (features, GPU memory, SASS only), it builds the
``requiredDuringSchedulingIgnoredDuringExecution`` block over the labels GPU Feature
Discovery and ``smoke`` write:

- ``nvidia.com/gpu.family In [...]`` when every SM of each family qualifies;
- else ``nvidia.com/gpu.compute-capability In [...]`` (smoke's label) naming the SMs
  that do: an image with sm_100 code but none for sm_120 must not reach an RTX PRO
  6000 of the same family;
- ``nvidia.com/gpu.memory Gt N`` for ``--min-memory`` (GFD's label, MiB).

It also merges the block into a workload manifest (Pod, Job, CronJob, Deployment,
StatefulSet, DaemonSet, ReplicaSet), ANDing it with any node affinity already there.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from buildmatrix.check import CheckResult
from buildmatrix.compat import Verdict
from buildmatrix.errors import InputError, did_you_mean
from buildmatrix.profiles import FEATURE_MIN_CC, Profile, ProfileSet

FAMILY = "nvidia.com/gpu.family"
COMPUTE = "nvidia.com/gpu.compute-capability"
MEMORY = "nvidia.com/gpu.memory"
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


def validate_needs(needs: Needs) -> None:
    """Unknown feature names are bad input, before any image is read."""
    for feature in needs.features:
        if feature not in FEATURE_MIN_CC:
            raise InputError(
                f"--require {feature}: not a feature the profiles know"
                f"{did_you_mean(feature, FEATURE_MIN_CC)}; one of "
                f"{', '.join(FEATURE_MIN_CC)}."
            )


@dataclass(frozen=True, kw_only=True)
class Choice:
    """Which profiles the image may run on, and why each other one is out."""

    chosen: tuple[Profile, ...]
    excluded: tuple[tuple[Profile, str], ...]


def choose(result: CheckResult, profiles: ProfileSet, needs: Needs) -> Choice:
    """The profiles whose GPUs run the image (per ``result``, a check against every
    profile's SM) and have every required feature."""
    by_sm = {t.sm: t for t in result.targets}
    chosen: list[Profile] = []
    excluded: list[tuple[Profile, str]] = []
    for p in profiles:
        target = by_sm.get(p.sm)
        missing = [f for f in needs.features if f not in p.features]
        if target is None or target.verdict is Verdict.NONE:
            why = "; ".join(target.code_failures[:1]) if target else "not checked"
            excluded.append((p, f"no code that runs ({why})"))
        elif target.verdict is Verdict.JIT and needs.require_sass:
            excluded.append((p, "runs only by PTX JIT, and --require-sass is set"))
        elif missing:
            excluded.append((p, f"lacks {', '.join(missing)}"))
        else:
            chosen.append(p)
    return Choice(chosen=tuple(chosen), excluded=tuple(excluded))


def expressions(choice: Choice, profiles: ProfileSet, needs: Needs) -> list[dict[str, Any]]:
    """The matchExpressions of the one nodeSelectorTerm."""
    families = sorted({p.family.value for p in choice.chosen})
    whole = all(
        {q.sm for q in profiles.family(f)} <= {p.sm for p in choice.chosen} for f in families
    )
    exprs: list[dict[str, Any]]
    if whole:
        exprs = [{"key": FAMILY, "operator": "In", "values": families}]
    else:
        ccs = sorted(
            {str(p.cc) for p in choice.chosen}, key=lambda c: tuple(map(int, c.split(".")))
        )
        exprs = [{"key": COMPUTE, "operator": "In", "values": ccs}]
    if needs.min_memory_mib is not None:
        exprs.append({"key": MEMORY, "operator": "Gt", "values": [str(needs.min_memory_mib - 1)]})
    return exprs


def affinity_block(exprs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": exprs}]
                }
            }
        }
    }


def merge_into(doc: Any, exprs: list[dict[str, Any]], *, source: str) -> Any:
    """``doc`` (one workload object) with the expressions ANDed into its pod spec's
    required node affinity: added to every existing term, or one new term."""
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
    node = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        kept = [e for e in term.get("matchExpressions") or [] if e.get("key") not in _keys(exprs)]
        term["matchExpressions"] = kept + copy.deepcopy(exprs)
    required["nodeSelectorTerms"] = terms
    return out


def _keys(exprs: list[dict[str, Any]]) -> set[str]:
    return {e["key"] for e in exprs}


def matches(affinity: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies the required node affinity, by the
    scheduler's documented rules: terms are ORed, expressions ANDed; In, NotIn,
    Exists, DoesNotExist, Gt and Lt (integers)."""
    required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return any(
        all(_match(e, labels) for e in term.get("matchExpressions", []))
        for term in required["nodeSelectorTerms"]
    )


def _match(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    value = labels.get(key)
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        try:
            have, want = int(value or ""), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    raise ValueError(f"unknown operator {op}")
