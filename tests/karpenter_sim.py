"""Stand-in for Karpenter's provisioning decision: which NodePool would launch a node
for a pending Pod. No Karpenter can run here (it needs a cloud and a kube-apiserver);
these functions restate its rules over plain objects, each after the upstream function
named in its docstring (kubernetes-sigs/karpenter at commit 22664681, v1.14.0-20):

- ``pkg/scheduling/requirement.go``: ``NewRequirementWithFlexibility`` (In/NotIn as a
  value set or its complement, Exists/DoesNotExist, Gt N as >= N+1 and Lt N as <= N-1)
  and ``HasIntersection``/``withinBounds`` (a bounded requirement holds only integer
  values within its bounds);
- ``pkg/scheduling/requirements.go``: ``newPodRequirements`` (the Pod's nodeSelector and
  the *first* term of its required node affinity), ``Compatible`` (a custom label the
  template does not define is refused unless the Pod's operator is NotIn or
  DoesNotExist; well-known labels may be undefined) and ``Intersects``;
- ``pkg/controllers/provisioning/scheduling/preferences.go``: ``Relax`` /
  ``removeRequiredNodeAffinityTerm`` (an unschedulable Pod's first required term is
  dropped and the next one tried, while more than one is left);
- ``pkg/controllers/provisioning/scheduling/nodeclaimtemplate.go``
  ``NewNodeClaimTemplate`` (the NodePool's requirements, and each template label as
  ``In [value]``) and ``nodeclaim.go`` ``CanAdd`` (taints: ``spec.taints`` only, never
  the startup taints; requirements; then an instance type that meets them all:
  ``filterInstanceTypesByRequirements``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# v1.WellKnownLabels (pkg/apis/v1/labels.go) and those the AWS provider adds
# (aws/karpenter-provider-aws pkg/apis/v1/labels.go init: LabelInstanceGPUName among them).
WELL_KNOWN = frozenset(
    {
        "karpenter.sh/nodepool",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "karpenter.sh/capacity-type",
        "node.kubernetes.io/windows-build",
        "karpenter.k8s.aws/instance-gpu-name",
    }
)


@dataclass(frozen=True)
class Requirement:
    """requirement.go's Requirement: ``values`` or (complement) every value but them,
    with optional integer bounds."""

    complement: bool
    values: frozenset[str]
    gte: int | None = None
    lte: int | None = None


def requirement(operator: str, values: Sequence[str] = ()) -> Requirement:
    """NewRequirementWithFlexibility."""
    if operator == "In":
        return Requirement(False, frozenset(values))
    if operator == "NotIn":
        return Requirement(True, frozenset(values))
    if operator == "Exists":
        return Requirement(True, frozenset())
    if operator == "DoesNotExist":
        return Requirement(False, frozenset())
    if operator == "Gt":
        return Requirement(True, frozenset(), gte=int(values[0]) + 1)
    if operator == "Lt":
        return Requirement(True, frozenset(), lte=int(values[0]) - 1)
    raise ValueError(operator)


def _within(value: str, gte: int | None, lte: int | None) -> bool:
    """withinBounds: with bounds, a value that is no integer is out."""
    if gte is None and lte is None:
        return True
    try:
        v = int(value)
    except ValueError:
        return False
    return (gte is None or v >= gte) and (lte is None or v <= lte)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def intersection(a: Requirement, b: Requirement) -> Requirement:
    """Requirement.Intersection."""
    gte, lte = _max(a.gte, b.gte), _min(a.lte, b.lte)
    if gte is not None and lte is not None and gte > lte:
        return Requirement(False, frozenset())
    if a.complement and b.complement:
        values = a.values | b.values
    elif a.complement:
        values = b.values - a.values
    elif b.complement:
        values = a.values - b.values
    else:
        values = a.values & b.values
    values = frozenset(v for v in values if _within(v, gte, lte))
    complement = a.complement and b.complement
    if not complement:
        gte, lte = None, None
    return Requirement(complement, values, gte, lte)


def has_intersection(a: Requirement, b: Requirement) -> bool:
    """Requirement.HasIntersection."""
    gte, lte = _max(a.gte, b.gte), _min(a.lte, b.lte)
    if gte is not None and lte is not None and gte > lte:
        return False
    if a.complement and b.complement:
        return True
    if a.complement:
        return any(v not in a.values and _within(v, gte, lte) for v in b.values)
    if b.complement:
        return any(v not in b.values and _within(v, gte, lte) for v in a.values)
    return any(v in b.values and _within(v, gte, lte) for v in a.values)


def _negative(r: Requirement) -> bool:
    """Operator() is NotIn or DoesNotExist."""
    return (r.complement and bool(r.values)) or (
        not r.complement and not r.values and r.gte is None and r.lte is None
    )


Requirements = dict[str, Requirement]


def add(reqs: Requirements, key: str, r: Requirement) -> None:
    """Requirements.Add: a key given twice is the intersection."""
    reqs[key] = intersection(reqs[key], r) if key in reqs else r


def from_expressions(exprs: Iterable[Mapping[str, Any]]) -> Requirements:
    reqs: Requirements = {}
    for e in exprs:
        add(reqs, e["key"], requirement(e["operator"], e.get("values") or ()))
    return reqs


def compatible(template: Requirements, pod: Requirements) -> str | None:
    """Requirements.Compatible with AllowUndefinedWellKnownLabels: None, or the error."""
    for key, r in pod.items():
        if key in WELL_KNOWN or key in template or _negative(r):
            continue
        return f'label "{key}" does not have known values'
    for key in template.keys() & pod.keys():
        a, b = template[key], pod[key]
        if not has_intersection(a, b) and not (_negative(b) and _negative(a)):
            return f"key {key}: no value meets both"
    return None


def intersects(a: Requirements, b: Requirements) -> bool:
    """Requirements.Intersects: every key both define has a common value (undefined
    keys allowed), as filterInstanceTypesByRequirements asks of an instance type."""
    for key in a.keys() & b.keys():
        if not has_intersection(a[key], b[key]) and not (_negative(b[key]) and _negative(a[key])):
            return False
    return True


def template_requirements(nodepool: Mapping[str, Any]) -> Requirements:
    """NewNodeClaimTemplate: spec.template.spec.requirements, then each template label
    as In [value], then karpenter.sh/nodepool = the NodePool's name."""
    spec = nodepool["spec"]["template"]
    reqs = from_expressions(spec["spec"].get("requirements") or ())
    labels = dict(spec.get("metadata", {}).get("labels") or {})
    labels["karpenter.sh/nodepool"] = nodepool["metadata"]["name"]
    for key, value in labels.items():
        add(reqs, key, requirement("In", [value]))
    return reqs


def pod_terms(pod_spec: Mapping[str, Any]) -> list[Requirements]:
    """newPodRequirements for the first term, then each next term as Relax drops the
    first (removeRequiredNodeAffinityTerm), each with the nodeSelector."""
    selector = {k: requirement("In", [v]) for k, v in (pod_spec.get("nodeSelector") or {}).items()}
    affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or [{}]
    out = []
    for term in terms:
        reqs = dict(selector)
        for key, r in from_expressions(term.get("matchExpressions") or ()).items():
            add(reqs, key, r)
        out.append(reqs)
    return out


def launches(
    nodepool: Mapping[str, Any], pod_spec: Mapping[str, Any], instance_types: Sequence[Requirements]
) -> bool:
    """Whether Karpenter would launch a node of this NodePool for the pending Pod: some
    term (first, then relaxed) is compatible with the template (CanAdd), and some
    instance type meets the combined requirements (filterInstanceTypesByRequirements)."""
    taints = nodepool["spec"]["template"]["spec"].get("taints") or []
    tolerations = pod_spec.get("tolerations") or []
    for taint in taints:  # spec.taints only: startupTaints are not checked (CanAdd)
        if not any(t.get("key") == taint["key"] for t in tolerations):
            return False
    base = template_requirements(nodepool)
    for pod in pod_terms(pod_spec):
        if compatible(base, pod) is not None:
            continue
        combined = dict(base)
        for key, r in pod.items():
            add(combined, key, r)
        if any(intersects(it, combined) for it in instance_types):
            return True
    return False
