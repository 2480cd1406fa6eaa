"""``smoke --apply --replace-after``: the Kubernetes API I/O of node/repair.py's
decision. Reads the Node, and deletes its Karpenter NodeClaim where the decision says
so, with the NodeClaim's uid as a precondition (a NodeClaim of the same name made
since is never deleted: the API server answers 409). The rights it needs, and their
bound, are k8s_repair.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from buildmatrix.errors import EnvironmentUnavailable
from buildmatrix.node.apply import NodeApi
from buildmatrix.node.repair import Action, Repair, plan_repair

# karpenter.sh/v1 NodeClaim, cluster-scoped (kubernetes-sigs/karpenter
# pkg/apis/crds/karpenter.sh_nodeclaims.yaml: scope Cluster, plural nodeclaims)
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims/{name}"
_TIMEOUT = 15


class ClaimApi(NodeApi):
    """The Node API client, and DELETE of one NodeClaim."""

    def delete_nodeclaim(self, name: str, uid: str) -> int:
        """The HTTP status of ``DELETE nodeclaims/NAME`` with ``preconditions.uid``."""
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid},
        }
        try:
            if not hasattr(self._client, "param_serialize"):  # kubernetes < 37
                from kubernetes import client

                custom: Any = client.CustomObjectsApi(self._client)
                answer = custom.delete_cluster_custom_object(
                    "karpenter.sh", "v1", "nodeclaims", name, body=body, _preload_content=False
                )
                return int(answer.status)
            request = self._client.param_serialize(
                method="DELETE",
                resource_path=NODECLAIMS,
                path_params={"name": name},
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(*request, _request_timeout=_TIMEOUT)
            response.read()  # type: ignore[no-untyped-call]
            return int(response.status)
        except self._exception as exc:  # kubernetes < 37 raises on non-2xx
            return int(exc.status or 0)
        except OSError as exc:
            raise EnvironmentUnavailable(f"DELETE nodeclaims/{name}: {exc}") from None


def replace_phantom(
    node: str,
    failed: Sequence[str],
    *,
    after: timedelta,
    kubeconfig: Path | None,
    now: datetime | None = None,
) -> Repair:
    """Decide about ``node`` after a failed round (node/repair.py) and carry it out: a
    replacement is the NodeClaim's deletion; a refused one is reported, never retried
    in this round (the next round decides again)."""
    api = ClaimApi(kubeconfig)
    doc = api.get(node)
    decision = plan_repair(doc, failed, now=now or datetime.now(UTC), after=after)
    if decision.action is not Action.REPLACE or decision.nodeclaim is None:
        return decision
    status = api.delete_nodeclaim(decision.nodeclaim, decision.uid or "")
    if status in (200, 202):
        return Repair(
            action=Action.REPLACE,
            why=f"NodeClaim {decision.nodeclaim} deleted: {decision.why}",
            nodeclaim=decision.nodeclaim,
            uid=decision.uid,
        )
    return Repair(
        action=Action.REPORT,
        why=f"the API server answered {status} to deleting NodeClaim {decision.nodeclaim} "
        "(RBAC and policy: buildmatrix k8s nodepools --replace-after)",
        nodeclaim=decision.nodeclaim,
    )
