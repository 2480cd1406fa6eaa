"""The rights ``smoke --replace-after`` needs, and their bound (docs/kubernetes.md,
"A failing new node"). Pure: objects out.

A ClusterRole with ``delete`` on ``nodeclaims.karpenter.sh`` for the admission agent's
ServiceAccount (RBAC cannot name the one NodeClaim a Pod's node has: resourceNames are
fixed when the role is written), narrowed by a ValidatingAdmissionPolicy that the API
server evaluates on every such DELETE by the agent: the NodeClaim's
``status.nodeName`` must be the node its Pod runs on (the service-account token's
node-name claim, as the node policy of k8s_policy.py reads it), and Karpenter must not
have initialized it (its ``Initialized`` condition is not True: kubernetes-sigs/karpenter
``nodeclaim/lifecycle/initialization.go``). So a stolen agent token can remove at
most the one node it runs on, and only while that node has never been admitted.
"""

from __future__ import annotations

from typing import Any

from buildmatrix.k8s_daemonset import APP
from buildmatrix.k8s_policy import NODE_NAME_CLAIM

NAME = f"{APP}-replace"


def _q(text: str) -> str:
    return f"'{text}'"


def repair_objects(*, namespace: str) -> list[dict[str, Any]]:
    """ClusterRole, ClusterRoleBinding, ValidatingAdmissionPolicy and its binding."""
    labels = {"app.kubernetes.io/name": APP}
    user = f"system:serviceaccount:{namespace}:{APP}"
    claim = _q(NODE_NAME_CLAIM)
    own = (
        f"has(request.userInfo.extra) && {claim} in request.userInfo.extra && "
        f"size(request.userInfo.extra[{claim}]) == 1 && has(oldObject.status) && "
        f"has(oldObject.status.nodeName) && "
        f"oldObject.status.nodeName == request.userInfo.extra[{claim}][0]"
    )
    uninitialized = (
        "!(has(oldObject.status) && has(oldObject.status.conditions) && "
        "oldObject.status.conditions.exists(c, c.type == 'Initialized' && c.status == 'True'))"
    )
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NAME, "labels": labels},
        "rules": [
            {"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["delete"]}
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": NAME, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [{"kind": "ServiceAccount", "name": APP, "namespace": namespace}],
    }
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": NAME, "labels": labels},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["karpenter.sh"],
                        "apiVersions": ["*"],
                        "operations": ["DELETE"],
                        "resources": ["nodeclaims"],
                    }
                ]
            },
            "matchConditions": [
                {
                    "name": "the-admission-agent",
                    "expression": f"request.userInfo.username == {_q(user)}",
                }
            ],
            "validations": [
                {
                    "expression": own,
                    "message": "the buildmatrix admission agent may only delete the NodeClaim "
                    "of the node its Pod runs on",
                    "reason": "Forbidden",
                },
                {
                    "expression": uninitialized,
                    "message": "the buildmatrix admission agent may only delete a NodeClaim "
                    "Karpenter has not initialized (a node never admitted)",
                    "reason": "Forbidden",
                },
            ],
        },
    }
    policy_binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": NAME, "labels": labels},
        "spec": {"policyName": NAME, "validationActions": ["Deny"]},
    }
    return [role, binding, policy, policy_binding]
