"""``buildmatrix k8s gate``: an admission gate for GPU Pods. Pure: data in, Kubernetes
objects out.

``affinity`` prints the nodeAffinity a Pod needs and ``check`` judges the image, but
nothing stops a GPU Pod whose image was never checked, or whose affinity was dropped on
the way to the cluster. The gate is a ValidatingAdmissionPolicy
(``admissionregistration.k8s.io/v1``, GA in Kubernetes 1.30) whose parameters
(``paramKind``, ``paramRef``: kubernetes.io/docs/reference/access-authn-authz/
validating-admission-policy/#parameter-resources) are the placements CI produced: one
cluster-scoped :data:`KIND` object whose ``spec.images`` maps an image digest
(``sha256:...``) to what a Pod running it must require, the ``nodeSelectorTerms``
``affinity`` prints and/or the name of the DRA ResourceClaimTemplate its GPU claim
comes from.

Why a CRD and not a ConfigMap: a ConfigMap's data are strings, and the CEL the API
server runs has no JSON decoder, so a placement held as text could not be compared
with the Pod's affinity. A structural custom resource gives CEL the same maps and
lists the Pod has; one object holds every placement because a ``paramRef`` selector
that matches several objects evaluates the policy once per object and ANDs the results
(the VAP documentation, ``paramRef``), which would require every placement at once.

A Pod is a GPU Pod where a container or init container asks for ``nvidia.com/gpu`` in
``resources.limits`` or ``resources.requests`` (the device plugin's resource name,
NVIDIA/k8s-device-plugin), or uses (``resources.claims``) one of the Pod's
``resourceClaims`` made from a template a placement names. Its GPU containers are then
denied, each rule with its own message, where:

- the image is not pinned by digest (``NAME@sha256:...``): a tag can move after CI
  judged it;
- no placement names the digest;
- the placement has nodeSelectorTerms and the Pod's required node affinity does not
  require them: every term of the Pod must contain every expression of one of the
  placement's terms (``affinity --into`` writes exactly that: it ANDs the placement
  into each term the workload had);
- the placement names a claim template and the container does not use a claim made
  from it.

Pods without GPUs are not judged. Every rule is written with ``has``, ``all``,
``exists``, ``filter``, ``in``, ``contains`` and ``endsWith`` only (standard CEL), so
that it evaluates the same in the tests' CEL interpreter as in the API server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from buildmatrix.errors import InputError

MIN_KUBERNETES = (1, 30)
GPU_RESOURCE = "nvidia.com/gpu"
GROUP = "buildmatrix.io"
VERSION = "v1alpha1"
KIND = "GpuPlacements"
PLURAL = "gpuplacements"
PARAMS_NAME = "placements"
DIGEST_PREFIX = "sha256:"

# what CEL calls a GPU container: asks for the device plugin's resource, or uses a claim
# made from a placement's template (variables.gpuClaims)
_ASKS_GPU = (
    "(has(c.resources) && ("
    f"(has(c.resources.limits) && '{GPU_RESOURCE}' in c.resources.limits) || "
    f"(has(c.resources.requests) && '{GPU_RESOURCE}' in c.resources.requests) || "
    "(has(c.resources.claims) && c.resources.claims.exists(u, u.name in variables.gpuClaims))))"
)
_PINNED = f"c.image.contains('@{DIGEST_PREFIX}')"
_PLACEMENT = "variables.placements[d]"
_MINE = "c.image.endsWith('@' + d)"


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One validation of the policy: a CEL expression and what a denial says."""

    name: str
    expression: str
    message: str


def variables() -> tuple[tuple[str, str], ...]:
    """The policy's named values (``variables.NAME``), in the order they are computed."""
    return (
        ("placements", "has(params.spec) && has(params.spec.images) ? params.spec.images : {}"),
        (
            "gpuClaims",
            "has(object.spec.resourceClaims) ? object.spec.resourceClaims.filter(r, "
            "has(r.resourceClaimTemplateName) && variables.placements.exists(d, "
            f"has({_PLACEMENT}.claimTemplate) && "
            f"{_PLACEMENT}.claimTemplate == r.resourceClaimTemplateName)).map(r, r.name) : []",
        ),
        (
            "containers",
            "object.spec.containers + "
            "(has(object.spec.initContainers) ? object.spec.initContainers : [])",
        ),
        ("gpuContainers", f"variables.containers.filter(c, {_ASKS_GPU})"),
        (
            "terms",
            "has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && "
            "has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution)"
            " ? object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms : []",
        ),
    )


def rules() -> tuple[Rule, ...]:
    """The policy's validations, in the order the API server reports them; each denies
    one fault only (a later rule passes a container an earlier rule denies)."""
    placed = f"variables.placements.exists(d, {_MINE})"
    # field by field: the Pod's requirement and the placement's are objects of two
    # schemas (core/v1 and the CRD), which CEL's == does not compare across types
    same = (
        "e.key == r.key && e.operator == r.operator && "
        "(has(r.values) ? has(e.values) && e.values == r.values : !has(e.values))"
    )
    covers = (
        # every term of the Pod holds every expression of one of the placement's terms
        "size(variables.terms) > 0 && variables.terms.all(p, "
        f"{_PLACEMENT}.nodeSelectorTerms.exists(t, t.matchExpressions.all(r, "
        f"has(p.matchExpressions) && p.matchExpressions.exists(e, {same}))))"
    )
    claims = (
        "has(object.spec.resourceClaims) && object.spec.resourceClaims.exists(r, "
        f"has(r.resourceClaimTemplateName) && r.resourceClaimTemplateName == "
        f"{_PLACEMENT}.claimTemplate && has(c.resources) && has(c.resources.claims) && "
        "c.resources.claims.exists(u, u.name == r.name))"
    )
    return (
        Rule(
            name="pinned",
            expression=f"variables.gpuContainers.all(c, {_PINNED})",
            message="a GPU container's image must be pinned by digest (NAME@sha256:...), the "
            "digest buildmatrix check judged: a tag can move after the check",
        ),
        Rule(
            name="placed",
            expression=f"variables.gpuContainers.all(c, !{_PINNED} || {placed})",
            message="a GPU container's image digest has no placement: run buildmatrix check "
            "and buildmatrix k8s gate --image on it in CI and apply the placements",
        ),
        Rule(
            name="affinity",
            expression=f"variables.gpuContainers.all(c, variables.placements.all(d, !{_MINE} || "
            f"!has({_PLACEMENT}.nodeSelectorTerms) || ({covers})))",
            message="the Pod's required node affinity does not require what the image's "
            "placement says (buildmatrix affinity REF --into MANIFEST adds it)",
        ),
        Rule(
            name="claim",
            expression=f"variables.gpuContainers.all(c, variables.placements.all(d, !{_MINE} || "
            f"!has({_PLACEMENT}.claimTemplate) || ({claims})))",
            message="a GPU container does not use a claim made from the ResourceClaimTemplate "
            "its image's placement names (buildmatrix affinity REF --format dra)",
        ),
    )


def _schema_terms() -> dict[str, Any]:
    expression = {
        "type": "object",
        "required": ["key", "operator"],
        "properties": {
            "key": {"type": "string"},
            "operator": {
                "type": "string",
                "enum": ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"],
            },
            "values": {"type": "array", "items": {"type": "string"}},
        },
    }
    return {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "required": ["matchExpressions"],
            "properties": {
                "matchExpressions": {"type": "array", "minItems": 1, "items": expression}
            },
        },
    }


def crd(labels: Mapping[str, str]) -> dict[str, Any]:
    """The CustomResourceDefinition of the policy's parameters (``paramKind``)."""
    placement = {
        "type": "object",
        "properties": {"nodeSelectorTerms": _schema_terms(), "claimTemplate": {"type": "string"}},
    }
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "images": {
                        "type": "object",
                        "description": "image digest (sha256:HEX) -> what a Pod running it "
                        "must require",
                        "additionalProperties": placement,
                    }
                },
            }
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": dict(labels)},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"kind": KIND, "plural": PLURAL, "singular": KIND.lower()},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def placements(
    entries: Mapping[str, Mapping[str, Any]], labels: Mapping[str, str]
) -> dict[str, Any]:
    """The parameter object: ``entries`` maps each ``sha256:HEX`` digest to its placement
    (``nodeSelectorTerms`` and/or ``claimTemplate``)."""
    for digest, placement in entries.items():
        hexa = digest.removeprefix(DIGEST_PREFIX)
        if (
            not digest.startswith(DIGEST_PREFIX)
            or len(hexa) != 64
            or hexa.strip("0123456789abcdef")
        ):
            raise InputError(
                f"placement {digest!r}: not an image digest (sha256: and 64 hex digits)."
            )
        if not placement.get("nodeSelectorTerms") and not placement.get("claimTemplate"):
            raise InputError(f"placement {digest}: says nothing a Pod must require.")
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": PARAMS_NAME, "labels": dict(labels)},
        "spec": {"images": {d: dict(p) for d, p in sorted(entries.items())}},
    }


def placement_of(node_terms: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """A placement from ``affinity``'s terms (each a list of matchExpressions)."""
    return {"nodeSelectorTerms": [{"matchExpressions": [dict(e) for e in t]} for t in node_terms]}


def policy_objects(*, name: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding (admissionregistration.k8s.io/v1)."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "failurePolicy": "Fail",  # a rule that cannot be evaluated denies: fail closed
            "paramKind": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "variables": [{"name": n, "expression": e} for n, e in variables()],
            "validations": [
                {"expression": r.expression, "message": r.message, "reason": "Forbidden"}
                for r in rules()
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            # no placements object: every Pod is denied, not let through unjudged
            "paramRef": {"name": PARAMS_NAME, "parameterNotFoundAction": "Deny"},
        },
    }
    return [policy, binding]
