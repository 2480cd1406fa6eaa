"""The ValidatingAdmissionPolicy that holds the admission agent to its own node and its
own keys (``buildmatrix k8s manifests``). Pure: data in, Kubernetes objects out.

RBAC cannot say "this node only": a ClusterRole with ``patch`` on ``nodes`` lets every
admission Pod change every Node. Kubernetes holds kubelets to their own Node with the
NodeRestriction admission plugin; the same shape for a ServiceAccount is a
ValidatingAdmissionPolicy over the node name that bound service-account tokens carry
(``request.userInfo.extra["authentication.kubernetes.io/node-name"]``; Kubernetes' own
e2e suite shows the pattern in ``test/e2e/auth/per_node_update.go``).

Minimum Kubernetes version, :data:`MIN_KUBERNETES`: 1.30, where both pieces are on by
default (``admissionregistration.k8s.io/v1`` ValidatingAdmissionPolicy is GA, and the
token's node claim, feature gate ``ServiceAccountTokenPodNodeInfo``, is beta and on;
GA in 1.32 — kubernetes ``pkg/features/kube_features.go``).

For an UPDATE of a Node by the agent's ServiceAccount the policy allows only:

- the Node the requesting Pod runs on (the token's node claim; no claim, no update);
- label changes (added, changed, removed) of keys buildmatrix owns
  (:func:`buildmatrix.labelkeys.owned`); GPU Feature Discovery's keys only
  where the manifests say buildmatrix writes them and only on a node where GFD does
  not label (no ``nvidia.com/gfd.timestamp``);
- annotation changes of ``buildmatrix.io/smoke-report`` and
  ``buildmatrix.io/smoke-unavailable-since`` alone;
- adding or removing the admission taint (``buildmatrix.io/unverified:NoSchedule``, or
  ``--taint-key``'s key with that effect);
  every other taint stays exactly as it was;
- nothing else in ``spec`` or ``metadata`` (finalizers, owner references). ``status``
  cannot change through an update of the Node itself (the API server keeps the old
  status there, ``pkg/registry/core/node/strategy.go`` ``PrepareForUpdate``) and the
  agent has no rights on ``nodes/status``.

Every rule is a CEL expression over ``object``/``oldObject``, written with only
``has``, ``all``, ``exists``, ``in`` and ``startsWith`` so it type-checks against the
Node schema in the API server and evaluates the same in the tests' CEL interpreter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from buildmatrix.errors import InputError
from buildmatrix.labelkeys import (
    AGENT_ANNOTATIONS,
    GFD_KEYS,
    GFD_MIG_KEYS,
    GFD_TIMESTAMP,
    MIG_RESOURCE_PREFIX,
    OWNED_KEYS,
    OWNED_PREFIXES,
    TAINT_EFFECT,
    TAINT_KEY,
    GfdKeys,
)

MIN_KUBERNETES = (1, 30)
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"

# NodeSpec's fields besides taints (core/v1 types.go): none may change.
_SPEC_FIELDS = ("unschedulable", "podCIDR", "podCIDRs", "providerID", "configSource", "externalID")
_META_FIELDS = ("finalizers", "ownerReferences")


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One validation of the policy: a CEL expression and what a denial says."""

    name: str
    expression: str
    message: str


def _quote(text: str) -> str:
    if "'" in text or "\\" in text:
        raise ValueError(f"not a plain CEL string literal: {text!r}")
    return f"'{text}'"


def _list(items: Sequence[str]) -> str:
    return "[" + ", ".join(_quote(i) for i in items) + "]"


def _same(path: str) -> str:
    """``object.PATH`` and ``oldObject.PATH`` are both absent, or equal."""
    new, old = f"object.{path}", f"oldObject.{path}"
    return f"(has({new}) == has({old}) && (!has({new}) || {new} == {old}))"


def _map_changes_only(field: str, allowed: str) -> str:
    """Every key of ``metadata.FIELD`` added, changed or removed satisfies ``allowed``
    (an expression over ``k``)."""
    new, old = f"object.metadata.{field}", f"oldObject.metadata.{field}"
    kept_or_allowed = f"({allowed} || (has({old}) && k in {old} && {old}[k] == {new}[k]))"
    removed_allowed = f"({allowed} || (has({new}) && k in {new}))"
    return f"(!has({new}) || {new}.all(k, {kept_or_allowed})) && " + (
        f"(!has({old}) || {old}.all(k, {removed_allowed}))"
    )


def variables(*, gfd_keys: GfdKeys) -> tuple[tuple[str, str], ...]:
    """The policy's named values (``variables.NAME`` in the rules), each computed once
    per request: the keys the agent owns, and whether GFD labels this node. GFD's keys
    are the agent's as ``smoke --gfd-keys`` makes them (labelkeys.writes_gfd_keys):
    never, always, or (auto) where the node has no GFD timestamp."""
    gfd_runs = (
        f"has(oldObject.metadata.labels) && {_quote(GFD_TIMESTAMP)} in oldObject.metadata.labels"
        if gfd_keys is GfdKeys.AUTO
        else "false"
    )
    return (
        ("ownedPrefixes", _list(OWNED_PREFIXES)),
        ("ownedKeys", _list(OWNED_KEYS)),
        ("gfdKeys", _list(() if gfd_keys is GfdKeys.NEVER else (*GFD_KEYS, *GFD_MIG_KEYS))),
        # --mig-strategy mixed's nvidia.com/mig-<profile>.* keys (labelkeys.is_mig_key)
        ("gfdPrefixes", _list(() if gfd_keys is GfdKeys.NEVER else (MIG_RESOURCE_PREFIX,))),
        ("gfdRuns", gfd_runs),
    )


# CEL over ``k``: a label key the agent may set or remove on this node.
OWNED = (
    "(variables.ownedPrefixes.exists(p, k.startsWith(p)) || k in variables.ownedKeys || "
    "((k in variables.gfdKeys || variables.gfdPrefixes.exists(p, k.startsWith(p))) && "
    "!variables.gfdRuns))"
)


def rules(taint_key: str = TAINT_KEY) -> tuple[Rule, ...]:
    """The policy's validations, in the order the API server reports them; the
    admission taint's key is ``taint_key`` (``--taint-key``)."""
    taint = f"(t.key == {_quote(taint_key)} && t.effect == {_quote(TAINT_EFFECT)})"
    new_t, old_t = "object.spec.taints", "oldObject.spec.taints"
    taints = (
        f"(!has({new_t}) || {new_t}.all(t, {taint} || (has({old_t}) && "
        f"{old_t}.exists(o, o == t)))) && "
        f"(!has({old_t}) || {old_t}.all(t, {taint} || (has({new_t}) && "
        f"{new_t}.exists(n, n == t))))"
    )
    claim = _quote(NODE_NAME_CLAIM)
    return (
        Rule(
            name="own-node",
            expression=(
                f"has(request.userInfo.extra) && {claim} in request.userInfo.extra && "
                f"size(request.userInfo.extra[{claim}]) == 1 && "
                f"request.userInfo.extra[{claim}][0] == object.metadata.name"
            ),
            message="the buildmatrix admission agent may only change the Node its Pod runs "
            "on (service-account token claim " + NODE_NAME_CLAIM + ")",
        ),
        Rule(
            name="labels",
            expression=_map_changes_only("labels", OWNED),
            message="the buildmatrix admission agent may only change the labels buildmatrix "
            "owns (docs/kubernetes.md, 'Who owns which label')",
        ),
        Rule(
            name="annotations",
            expression=_map_changes_only("annotations", f"k in {_list(AGENT_ANNOTATIONS)}"),
            message="the buildmatrix admission agent may only change the annotations "
            + " and ".join(AGENT_ANNOTATIONS),
        ),
        Rule(
            name="taints",
            expression=taints,
            message=f"the buildmatrix admission agent may only add or remove the taint "
            f"{taint_key}:{TAINT_EFFECT}; every other taint must stay as it is",
        ),
        Rule(
            name="spec-and-metadata",
            expression=" && ".join(
                [_same(f"spec.{f}") for f in _SPEC_FIELDS]
                + [_same(f"metadata.{f}") for f in _META_FIELDS]
            ),
            message="the buildmatrix admission agent may not change the Node's spec "
            "(other than its own taint), finalizers or owner references",
        ),
    )


def policy_objects(
    *,
    name: str,
    namespace: str,
    service_account: str,
    gfd_keys: GfdKeys,
    labels: dict[str, str],
    taint_key: str = TAINT_KEY,
) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding (admissionregistration.k8s.io/v1)."""
    user = f"system:serviceaccount:{namespace}:{service_account}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            # A rule that cannot be evaluated denies: fail closed.
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": ["nodes", "nodes/status"],
                    }
                ]
            },
            # Only the agent's requests: other users and controllers are not affected.
            "matchConditions": [
                {
                    "name": "the-admission-agent",
                    "expression": f"request.userInfo.username == {_quote(user)}",
                }
            ],
            "variables": [{"name": n, "expression": e} for n, e in variables(gfd_keys=gfd_keys)],
            "validations": [
                {"expression": r.expression, "message": r.message, "reason": "Forbidden"}
                for r in rules(taint_key)
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def require_node_policy(version: str) -> None:
    """Refuse a cluster version too old for the policy, saying what to do instead."""
    try:
        major, minor = (int(x) for x in version.removeprefix("v").split(".")[:2])
    except ValueError:
        raise InputError(
            f"--kubernetes-version {version}: not a version; write MAJOR.MINOR, e.g. 1.31."
        ) from None
    if (major, minor) < MIN_KUBERNETES:
        need = ".".join(str(x) for x in MIN_KUBERNETES)
        raise InputError(
            f"--kubernetes-version {version}: the ValidatingAdmissionPolicy that holds the "
            f"admission agent to its own node needs Kubernetes {need} or newer "
            "(admissionregistration.k8s.io/v1, and the node-name claim in service-account "
            f"tokens). Upgrade the cluster to {need}; or use --mode nfd, where the agent has no "
            "Kubernetes API rights at all and NFD labels and untaints the node; or pass "
            "--no-node-policy to deploy without the policy, knowing that the agent can then "
            "relabel and untaint every node (docs/kubernetes.md, Security)."
        )
