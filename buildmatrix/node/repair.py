"""A new node that never passes smoke: replaced in bounded time
(docs/kubernetes.md, "A failing new node"). Pure: the Node as the API serves it and
the failed checks in, the decision out.

Why it is needed. With the admission taint as a Karpenter startup taint, a node whose
smoke fails is never initialized: Karpenter initializes a NodeClaim only once its
startup taints are gone (kubernetes-sigs/karpenter
``pkg/controllers/nodeclaim/lifecycle/initialization.go``, ``StartupTaintsRemoved``),
and until then it plans as if the taint will go (``pkg/controllers/state/statenode.go``
``Taints``: an uninitialized managed node's startup taints are left out), so it keeps
nominating pending Pods to the node instead of launching another; it never disrupts it
(``ValidateNodeDisruptable``: "node is not initialized"); and its only time-out,
``nodeclaim/lifecycle/liveness.go``, covers registration (15 minutes), which the node
passed. Node repair (``pkg/controllers/node/health/controller.go``) acts only on the
conditions the cloud provider lists (AWS: ``Ready``, and the node monitoring agent's
``AcceleratedHardwareReady``, ``StorageReady``, ...: aws/karpenter-provider-aws
``pkg/cloudprovider/cloudprovider.go`` ``RepairPolicies``), behind the ``NodeRepair``
feature gate (off by default: ``pkg/operator/options/options.go``), and those conditions
belong to the kubelet and that agent, not to buildmatrix.

A failed round also removes the labels smoke owns but ``gpu-pool`` (node/apply.py), and
Karpenter plans with a registered node's own labels (``StateNode.Labels``): a Pod that
requires ``affinity``'s labels is no longer nominated to the failed node, so Karpenter
launches another for it, and the failed one stays, never disrupted. Left alone, a
failure every node of the NodePool shares (a driver, an image) so leaves one more
never-initialized node behind at each try, up to the NodePool's ``limits``; a Pod that
selects only ``gpu-pool`` stays nominated to the failed node instead.

The remedy uses Karpenter's own way to remove a node: deleting its NodeClaim
(Karpenter then drains and terminates the instance, and provisions again for the Pods
that still wait). The agent deletes only its own node's NodeClaim (the Node's owner
reference, which Karpenter sets at registration: ``registration.go`` ``syncNode``,
``UpdateNodeOwnerReferences``), only before Karpenter initialized it, and only after
``--replace-after`` since the Node was created, whatever failed: a failure of the
node's own (its GPUs, NVML, health, a round that died) may pass on another instance;
one every node of the NodePool shares would not, and the report says so, but deleting
still bounds what it costs to one node per try instead of one more per try. The API
server holds the agent to that (k8s_repair.py: RBAC ``delete`` on nodeclaims,
narrowed by a ValidatingAdmissionPolicy to the requester's node and to a NodeClaim
not yet initialized).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

# Karpenter's keys (kubernetes-sigs/karpenter pkg/apis/v1/labels.go: NodePoolLabelKey,
# NodeInitializedLabelKey; the NodeClaim kind of group karpenter.sh).
NODEPOOL_LABEL = "karpenter.sh/nodepool"
INITIALIZED_LABEL = "karpenter.sh/initialized"
NODECLAIM_GROUP = "karpenter.sh"
# The checks whose failure is the node's own: another instance of the same template
# may pass (node/checks.py, hardware_checks.py; "round": a round killed or past its
# deadline, admit.py). Every other check (driver, profiles, uniform, mig, pool,
# image ..., load ...) judges what the template gives every node alike.
NODE_OWN = frozenset({"nvml", "gpus", "health", "persistence", "round"})
# A round in which NVML could not be loaded at all (exit 3): no driver on the node, which
# the node's image or a driver container still installing gives every node alike.
NVML_UNAVAILABLE = "nvml-unavailable"


class Action(StrEnum):
    NONE = "none"  # the node passed
    WAIT = "wait"  # failed, younger than --replace-after: smoke runs again
    REPLACE = "replace"  # delete its NodeClaim
    REPORT = "report"  # failed, and not the agent's to replace: the report stays


@dataclass(frozen=True, kw_only=True)
class Repair:
    action: Action
    why: str
    nodeclaim: str | None = None
    uid: str | None = None  # the NodeClaim's, a precondition of the delete


def _nodeclaim(node: Mapping[str, Any]) -> tuple[str, str] | None:
    for ref in node.get("metadata", {}).get("ownerReferences") or ():
        group = str(ref.get("apiVersion", "")).split("/")[0]
        if group == NODECLAIM_GROUP and ref.get("kind") == "NodeClaim":
            return str(ref["name"]), str(ref.get("uid", ""))
    return None


def _created(node: Mapping[str, Any]) -> datetime | None:
    text = node.get("metadata", {}).get("creationTimestamp")
    if not text:
        return None
    return datetime.fromisoformat(str(text).replace("Z", "+00:00"))


def plan_repair(
    node: Mapping[str, Any], failed: Sequence[str], *, now: datetime, after: timedelta
) -> Repair:
    """What to do about a node after a round whose failed checks are ``failed`` (check
    names; empty: it passed)."""
    if not failed:
        return Repair(action=Action.NONE, why="passed")
    labels = node.get("metadata", {}).get("labels") or {}
    claim = _nodeclaim(node)
    if claim is None or NODEPOOL_LABEL not in labels:
        return Repair(action=Action.REPORT, why="not a Karpenter node: nothing to replace it")
    if labels.get(INITIALIZED_LABEL) == "true":
        return Repair(
            action=Action.REPORT,
            why="Karpenter initialized it (it passed before): a later failure is reported, "
            "never replaced",
        )
    created = _created(node)
    if created is None:
        return Repair(action=Action.REPORT, why="the Node has no creationTimestamp")
    due = created + after
    if now < due:
        return Repair(action=Action.WAIT, why=f"replaced from {due.isoformat()} if still failing")
    name, uid = claim
    shared = sorted(check for check in failed if check not in NODE_OWN)
    outlook = (
        f"{', '.join(shared)} would fail every node of the NodePool alike: fix the "
        "NodePool or the pools file (its check 'pool' names a drift)"
        if shared
        else "another instance may pass"
    )
    return Repair(
        action=Action.REPLACE,
        why=f"failed ({', '.join(failed)}) since it joined, {after} ago or more; {outlook}",
        nodeclaim=name,
        uid=uid,
    )
