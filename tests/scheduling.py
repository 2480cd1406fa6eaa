"""Stand-in for the Kubernetes rules that decide whether a DaemonSet's Pod runs on a node.

No kube-apiserver, scheduler or DaemonSet controller can run here; these functions
restate their rules over plain objects (dicts as the API serves them), each after the
upstream function named in its docstring:

- ``k8s.io/api`` core/v1 toleration.go ``Toleration.ToleratesTaint`` (and
  ``compareNumericValues`` for the alpha ``Gt``/``Lt`` toleration operators);
- ``k8s.io/component-helpers`` scheduling/corev1/helpers.go
  ``FindMatchingUntoleratedTaint``, and nodeaffinity/nodeaffinity.go
  ``GetRequiredNodeAffinity``/``LazyErrorNodeSelector.Match``;
- ``k8s.io/apimachinery`` pkg/labels/selector.go ``NewRequirement`` (the checks that
  make a term a parse error, which then matches nothing) and ``Requirement.Matches``;
- kubernetes pkg/controller/daemon/util/daemonset_util.go
  ``AddOrUpdateDaemonPodTolerations`` and pkg/controller/daemon/daemon_controller.go
  ``NodeShouldRunDaemonPod``/``predicates``.

They are checked against the upstream projects' own test tables
(tests/fixtures/k8s/upstream-cases.yaml) in tests/test_scheduling.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from buildmatrix.k8s_nodes import label_key_problem, label_value_problem

Obj = Mapping[str, Any]
_INT64 = (-(2**63), 2**63 - 1)
_PARSE_INT = re.compile(r"^[+-]?[0-9]+$")  # strconv.ParseInt(s, 10, 64) syntax
_DECIMAL = re.compile(r"^(0|-?[1-9][0-9]*)$")  # content.IsDecimalInteger


class ParseError(ValueError):
    """A term the API would parse with an error: it matches no node."""


def _parse_int(text: str) -> int | None:
    if not _PARSE_INT.match(text):
        return None
    value = int(text)
    return value if _INT64[0] <= value <= _INT64[1] else None


def tolerates(toleration: Obj, taint: Obj, *, comparison_operators: bool = False) -> bool:
    """toleration.go ToleratesTaint: an empty effect matches every effect, an empty
    key every key; operator "" or Equal compares values, Exists matches any value."""
    effect = toleration.get("effect", "")
    if effect and effect != taint.get("effect", ""):
        return False
    key = toleration.get("key", "")
    if key and key != taint.get("key", ""):
        return False
    op = toleration.get("operator", "")
    if op in ("", "Equal"):
        return bool(toleration.get("value", "") == taint.get("value", ""))
    if op == "Exists":
        return True
    if op in ("Lt", "Gt") and comparison_operators:
        mine, theirs = toleration.get("value", ""), taint.get("value", "")
        if not (_DECIMAL.match(mine) and _DECIMAL.match(theirs)):
            return False
        want, have = _parse_int(mine), _parse_int(theirs)
        if want is None or have is None:
            return False
        return have < want if op == "Lt" else have > want
    return False


def untolerated(
    taints: Iterable[Obj], tolerations: Iterable[Obj], effects: Iterable[str] | None = None
) -> Obj | None:
    """helpers.go FindMatchingUntoleratedTaint: the first taint (of the given effects;
    None: every taint) that no toleration tolerates."""
    wanted = None if effects is None else set(effects)
    tolerations = list(tolerations)
    for taint in taints:
        if wanted is not None and taint.get("effect") not in wanted:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


# daemonset_util.go AddOrUpdateDaemonPodTolerations, in its order; the last one only for
# Pods with hostNetwork.
DAEMON_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION = {
    "key": "node.kubernetes.io/network-unavailable",
    "operator": "Exists",
    "effect": "NoSchedule",
}


def daemon_tolerations(pod_spec: Obj) -> list[dict[str, Any]]:
    """The Pod's tolerations after AddOrUpdateDaemonPodTolerations: each added one
    replaces an equal one (same key, effect, operator, value: MatchToleration) or is
    appended."""
    out = [dict(t) for t in pod_spec.get("tolerations") or []]
    added = [
        *DAEMON_TOLERATIONS,
        *([HOST_NETWORK_TOLERATION] if pod_spec.get("hostNetwork") else []),
    ]
    fields = ("key", "effect", "operator", "value")
    for new in added:
        same = [i for i, t in enumerate(out) if all(t.get(f, "") == new.get(f, "") for f in fields)]
        if same:
            out[same[0]] = dict(new)
        else:
            out.append(dict(new))
    return out


def _requirement(expr: Obj) -> tuple[str, str, list[str]]:
    """selector.go NewRequirement's checks; ParseError where it returns an error."""
    key, op, values = expr.get("key", ""), expr.get("operator", ""), list(expr.get("values") or [])
    if label_key_problem(key):
        raise ParseError(f"key {key!r}")
    if op in ("In", "NotIn") and not values:
        raise ParseError("In/NotIn need values")
    if op in ("Exists", "DoesNotExist") and values:
        raise ParseError("Exists/DoesNotExist take no values")
    if op in ("Gt", "Lt") and (len(values) != 1 or any(_parse_int(v) is None for v in values)):
        raise ParseError("Gt/Lt need one integer")
    if op not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
        raise ParseError(f"operator {op!r}")
    if any(label_value_problem(v) for v in values):
        raise ParseError(f"values {values!r}")
    return key, op, values


def _matches(key: str, op: str, values: list[str], labels: Mapping[str, str]) -> bool:
    """selector.go Requirement.Matches."""
    value = labels.get(key)
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    have = None if value is None else _parse_int(value)
    want = _parse_int(values[0])
    if have is None or want is None:
        return False
    return have > want if op == "Gt" else have < want


def _field_matches(expr: Obj, fields: Mapping[str, str]) -> bool:
    """nodeaffinity.go nodeSelectorRequirementsAsFieldSelector: In/NotIn, one value."""
    op, values = expr.get("operator"), list(expr.get("values") or [])
    if op not in ("In", "NotIn") or len(values) != 1:
        raise ParseError(f"matchFields {expr!r}")
    have = fields.get(str(expr.get("key", "")))
    want = str(values[0])
    return have == want if op == "In" else have != want


def _term_matches(term: Obj, node: Obj) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    name = node.get("metadata", {}).get("name") or ""
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    parsed = [_requirement(e) for e in exprs]
    checks = [_field_matches(f, {"metadata.name": name}) for f in fields]
    if not all(_matches(*p, labels) for p in parsed):
        return False
    # a node without a name has no fields, and matchFields is then not consulted
    return not name or all(checks)


def node_selector_matches(selector: Obj, node: Obj) -> bool:
    """nodeaffinity.go LazyErrorNodeSelector.Match: terms ORed, empty terms skipped, a
    term with a parse error matches nothing."""
    for term in selector.get("nodeSelectorTerms") or []:
        if not (term.get("matchExpressions") or term.get("matchFields")):
            continue
        try:
            if _term_matches(term, node):
                return True
        except ParseError:
            continue
    return False


def required_affinity_matches(pod_spec: Obj, node: Obj) -> bool:
    """nodeaffinity.go GetRequiredNodeAffinity(pod).Match(node): the nodeSelector map
    (every key equal) and the required node affinity, if any."""
    labels = node.get("metadata", {}).get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    return required is None or node_selector_matches(required, node)


def affinity_matches(affinity: Obj, labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies ``affinity`` (a Pod's ``affinity:``
    value): :func:`required_affinity_matches` on a node that has only these labels."""
    node = {"metadata": {"labels": dict(labels)}}
    return required_affinity_matches({"affinity": affinity}, node)


def should_run(daemonset: Obj, node: Obj) -> tuple[bool, str]:
    """daemon_controller.go NodeShouldRunDaemonPod's shouldRun, with the reason when not:
    the Pod (template plus the daemon tolerations) must fit the node's name, required
    affinity and NoSchedule/NoExecute taints."""
    spec = daemonset["spec"]["template"]["spec"]
    name = node.get("metadata", {}).get("name", "")
    if spec.get("nodeName") not in (None, "", name):
        return False, f"spec.nodeName is {spec['nodeName']}"
    if not required_affinity_matches(spec, node):
        return False, "node selector or required node affinity does not match the node's labels"
    taint = untolerated(
        node.get("spec", {}).get("taints") or [],
        daemon_tolerations(spec),
        ("NoSchedule", "NoExecute"),
    )
    if taint is not None:
        return False, f"taint {taint['key']}:{taint['effect']} is not tolerated"
    return True, "fits"
