"""A STAND-IN for the parts of Node Feature Discovery that node admission in NFD mode
relies on, for tests (NFD cannot run here). Each function follows the cited source
of kubernetes-sigs/node-feature-discovery v0.20:

- :func:`parse_feature_file`: ``source/local/local.go`` ``parseFeatureFile``
  (``#`` lines are comments or ``# +`` directives; ``# +expiry-time=`` drops the lines
  after it once passed; ``key`` alone means ``true``);
- :func:`rule_matches`: ``pkg/apis/nfd/nodefeaturerule/rule.go`` ``Execute`` and
  ``expression.go`` ``evaluateMatchExpression`` (``matchFeatures`` all, ``matchAny``
  any; an instance feature matches when one instance matches every expression;
  ``NotIn`` and ``In`` are false for an absent key);
- :func:`set_taints`: ``pkg/nfd-master/nfd-master.go`` ``setTaints`` (removes only the
  taints listed in its ``nfd.node.kubernetes.io/taints`` annotation, adds or updates
  the rule's taints, then lists exactly those in the annotation);
- :func:`published_labels`: unprefixed keys get ``feature.node.kubernetes.io/``
  (``addNsToMapKeys``), ``kubernetes.io`` namespaces other than NFD's are refused
  (``pkg/apis/nfd/validate`` ``Label``).

Looser than NFD: only the operators the rendered rule uses, no templates, no
extended resources, no label whitelist.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

TAINTS_ANNOTATION = "nfd.node.kubernetes.io/taints"
FEATURE_NS = "feature.node.kubernetes.io"


def parse_feature_file(text: str, *, now: datetime) -> dict[str, str]:
    labels: dict[str, str] = {}
    expiry = now
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("# +expiry-time="):
                expiry = datetime.fromisoformat(line.split("=", 1)[1].replace("Z", "+00:00"))
            continue
        if expiry < now:
            continue
        key, sep, value = line.partition("=")
        labels[key] = value if sep else "true"
    return labels


def _expression(op: str, values: list[str], present: bool, value: str | None) -> bool:
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if not present or value is None:
        return False
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    raise ValueError(f"operator {op} is not modelled by the stand-in")


def _matches(exprs: dict[str, Any], attrs: dict[str, str]) -> bool:
    return all(
        _expression(e["op"], e.get("value", []), key in attrs, attrs.get(key))
        for key, e in exprs.items()
    )


def _feature_matches(matcher: dict[str, Any], features: dict[str, Any]) -> bool:
    found = features.get(matcher["feature"])
    if found is None:
        return False
    exprs = matcher["matchExpressions"]
    if isinstance(found, list):  # instance feature: one instance must match all
        return any(_matches(exprs, inst) for inst in found)
    return _matches(exprs, found)


def rule_matches(rule: dict[str, Any], features: dict[str, Any]) -> bool:
    all_of = all(_feature_matches(m, features) for m in rule.get("matchFeatures", []))
    any_of = rule.get("matchAny")
    if any_of:
        return all_of and any(
            all(_feature_matches(m, features) for m in term["matchFeatures"]) for term in any_of
        )
    return all_of


def _taint_text(t: dict[str, str]) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t['key']}{value}:{t['effect']}"


def _parse_taint(text: str) -> dict[str, str]:
    key_value, _, effect = text.rpartition(":")
    key, _, value = key_value.partition("=")
    taint = {"key": key, "effect": effect}
    if value:
        taint["value"] = value
    return taint


def set_taints(node: dict[str, Any], taints: list[dict[str, str]]) -> None:
    meta = node["metadata"]
    annotations = meta.setdefault("annotations", {})
    listed = annotations.get(TAINTS_ANNOTATION, "")
    old = [_parse_taint(t) for t in listed.split(",") if t]
    current = node["spec"].setdefault("taints", [])

    def same(a: dict[str, str], b: dict[str, str]) -> bool:  # TaintExists: key and effect
        return a["key"] == b["key"] and a["effect"] == b["effect"]

    for gone in old:
        if not any(same(gone, t) for t in taints):
            current[:] = [t for t in current if not same(t, gone)]
    for taint in taints:
        kept = [t for t in current if not same(t, taint)]
        current[:] = (
            [*kept, taint]
            if len(kept) == len(current)
            else [taint if same(t, taint) else t for t in current]
        )
    if taints:
        annotations[TAINTS_ANNOTATION] = ",".join(_taint_text(t) for t in taints)
    else:
        annotations.pop(TAINTS_ANNOTATION, None)


def _denied(ns: str) -> bool:
    kubernetes = ns == "kubernetes.io" or ns.endswith(".kubernetes.io")
    nfd_own = ns.endswith(FEATURE_NS) or ns.endswith("profile.node.kubernetes.io")
    return kubernetes and not nfd_own


def published_labels(local: dict[str, str]) -> dict[str, str]:
    out = {}
    for key, value in local.items():
        ns, sep, _ = key.rpartition("/")
        if sep and _denied(ns):
            continue
        out[key if sep else f"{FEATURE_NS}/{key}"] = value
    return out
