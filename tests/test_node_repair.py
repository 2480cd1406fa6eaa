"""A new node that never passes: replaced in bounded time (node/repair.py,
node/nodeclaims.py, k8s_repair.py).

- The timeline: Karpenter's handling of a node with a startup taint, restated from its
  source (cited in node/repair.py: an uninitialized node keeps the Pods nominated to
  it and is never disrupted; initialization once the startup taints are gone), and the
  DaemonSet's rounds every 600 s; over every sequence of six round outcomes (pass, a
  failure of the node's own, one every node of the NodePool shares, both) and three
  ``--replace-after`` bounds: a node is deleted only while never initialized, only
  after the bound, and then at the first round past it, so no Pod waits on it longer
  than the bound and one interval (a Pod carrying ``affinity``'s terms stops waiting at
  the first failed round, since smoke removes the labels it requires); a failure every
  node shares is replaced too, saying so (left alone, each try leaves one more node).
- The bound the API server holds the agent to: the rendered ValidatingAdmissionPolicy,
  evaluated by cel-python (tests/admission_policy.py), lets the agent delete only its
  own node's NodeClaim, and only before Karpenter initialized it.
- smoke --apply --replace-after against the stand-in API server (a STAND-IN: no
  kube-apiserver or Karpenter can run here), with both policies installed.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.k8s_repair import repair_objects
from buildmatrix.node.repair import INITIALIZED_LABEL, NODEPOOL_LABEL, Action, plan_repair
from tests import karpenter_sim
from tests.admission_policy import UserInfo, denials, request
from tests.conftest import REPO, CliRunner
from tests.kube_standin import ApiStandIn
from tests.standins import run_cli
from tests.test_kube_apply import ADMISSION, AGENT, agent_policy
from tests.test_kube_client_versions import legacy_client  # noqa: F401 - a fixture

NODES = REPO / "tests" / "fixtures" / "nodes"
INTERVAL = 600  # k8s_daemonset.Settings.interval: the DaemonSet's rounds
T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
OUTCOMES = {
    "pass": (),
    "own": ("health",),
    "shared": ("driver",),
    "both": ("nvml", "image registry.example.com/ml/train:1"),
}
CLAIM = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": "nc-1", "uid": "u-1"}


def _node(*, initialized: bool, created: datetime = T0) -> dict[str, Any]:
    labels = {NODEPOOL_LABEL: "training-hopper-h100"}
    if initialized:
        labels[INITIALIZED_LABEL] = "true"
    return {
        "metadata": {
            "name": "gpu-1",
            "labels": labels,
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "ownerReferences": [CLAIM],
        }
    }


# What the node carries: the NodePool's template labels from registration (k8s
# nodepools), smoke's on a pass; on a fail smoke's owned labels are removed but
# gpu-pool (node/apply.py plan). Karpenter's own labels stay.
TEMPLATE = {
    "gpu-pool": "training-hopper",
    "buildmatrix.io/gpu.compute-capability": "9.0",
    "buildmatrix.io/driver.version": "580065006",
}
FAILED_LABELS = {"buildmatrix.io/smoke": "failed", "gpu-pool": "training-hopper"}
# Two pending Pods: one carrying affinity's terms (a CUDA 13 Hopper image), one that
# selects the pool alone.
PODS = {
    "affinity": karpenter_sim.from_expressions(
        [
            {"key": "buildmatrix.io/gpu.compute-capability", "operator": "In", "values": ["9.0"]},
            {"key": "buildmatrix.io/driver.version", "operator": "Gt", "values": ["580065005"]},
        ]
    ),
    "pool": karpenter_sim.from_expressions(
        [{"key": "gpu-pool", "operator": "In", "values": ["training-hopper"]}]
    ),
}


def _nominated(labels: dict[str, str], pod: str) -> bool:
    """Karpenter places a pending Pod on a registered, uninitialized node it has
    (scheduling/existingnode.go CanAdd: the node's own labels as In requirements,
    statenode.go Labels; its startup taints left out, statenode.go Taints)."""
    node = karpenter_sim.from_expressions(
        [{"key": k, "operator": "In", "values": [v]} for k, v in labels.items()]
    )
    return karpenter_sim.compatible(node, PODS[pod]) is None


@dataclass
class Timeline:
    deleted: float | None  # seconds after the node joined
    initialized_at: float | None
    decisions: list[Action]
    held: dict[str, float]  # pod -> seconds it waited on the uninitialized node


def _timeline(outcomes: tuple[str, ...], after: int) -> Timeline:
    """A node joining at T0 whose DaemonSet runs a round at join and every INTERVAL
    after; Karpenter initializes it once smoke removed the startup taint (a pass)."""
    initialized_at: float | None = None
    labels = dict(TEMPLATE)
    held = dict.fromkeys(PODS, 0.0)
    decisions = []
    for i, outcome in enumerate(outcomes):
        at = i * INTERVAL
        failed = OUTCOMES[outcome]
        labels = {**TEMPLATE, "buildmatrix.io/smoke": "passed"} if not failed else FAILED_LABELS
        if not failed and initialized_at is None:
            initialized_at = at
        decision = plan_repair(
            _node(initialized=initialized_at is not None),
            failed,
            now=T0 + timedelta(seconds=at),
            after=timedelta(seconds=after),
        )
        decisions.append(decision.action)
        if decision.action is Action.REPLACE:
            return Timeline(deleted=at, initialized_at=None, decisions=decisions, held=held)
        if initialized_at is None:  # until the next round, Pods it fits wait on it
            for pod in PODS:
                held[pod] += INTERVAL if _nominated(labels, pod) else 0
    return Timeline(deleted=None, initialized_at=initialized_at, decisions=decisions, held=held)


@pytest.mark.parametrize("after", [600, 1200, 1800])
def test_a_node_that_never_passes_is_replaced_in_bounded_time(after: int) -> None:
    """Over every sequence of six rounds (a horizon past every bound)."""
    replaced = 0
    for outcomes in itertools.product(OUTCOMES, repeat=6):
        t = _timeline(outcomes, after)
        due = after // INTERVAL  # the first round at or past the bound
        if t.deleted is not None:
            # never a node that passed, never before the bound, at the first failed
            # round past it
            assert "pass" not in outcomes[: len(t.decisions)], outcomes
            assert t.deleted >= after
            assert len(t.decisions) - 1 == due
            replaced += 1
        elif "pass" not in outcomes[: due + 1]:
            raise AssertionError(f"{outcomes}: never passed by the bound, not replaced")
        # no Pod waits on an uninitialized node longer than the bound and one round
        assert all(v <= after + INTERVAL for v in t.held.values()), (outcomes, t.held)
        # one that requires affinity's labels stops waiting at the first failed round:
        # smoke removed them, and Karpenter launches another node for it
        if outcomes[0] != "pass":
            assert t.held["affinity"] == 0, outcomes
    assert replaced


def test_a_shared_failure_is_replaced_too_and_says_so() -> None:
    """Left alone, each try would leave one more failed node behind (the affinity Pod
    is launched a new node for): replacing bounds it to one; the reason names it."""
    late = T0 + timedelta(hours=1)
    for outcome in ("shared", "both"):
        repair = plan_repair(
            _node(initialized=False), OUTCOMES[outcome], now=late, after=timedelta(minutes=20)
        )
        assert repair.action is Action.REPLACE
        assert "every node of the NodePool alike" in repair.why
    repair = plan_repair(
        _node(initialized=False), ["health"], now=late, after=timedelta(minutes=20)
    )
    assert "another instance may pass" in repair.why
    assert not _nominated(FAILED_LABELS, "affinity") and _nominated(FAILED_LABELS, "pool")


def test_a_node_outside_karpenter_or_without_owner_is_only_reported() -> None:
    node = _node(initialized=False)
    late = T0 + timedelta(hours=2)
    assert plan_repair(node, ["health"], now=late, after=timedelta(minutes=10)).action is (
        Action.REPLACE
    )
    bare = json.loads(json.dumps(node))
    del bare["metadata"]["ownerReferences"]
    assert plan_repair(bare, ["health"], now=late, after=timedelta(minutes=10)).action is (
        Action.REPORT
    )
    assert plan_repair(node, [], now=late, after=timedelta(minutes=10)).action is Action.NONE


def _policy() -> Any:
    (policy,) = [
        o
        for o in repair_objects(namespace="buildmatrix")
        if o["kind"] == ("ValidatingAdmissionPolicy")
    ]
    return policy


def _claim(node: str, *, initialized: bool) -> dict[str, Any]:
    status = "True" if initialized else "Unknown"
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": f"nc-{node}", "uid": f"u-{node}"},
        "status": {"nodeName": node, "conditions": [{"type": "Initialized", "status": status}]},
    }


def test_the_policy_lets_the_agent_delete_only_its_own_uninitialized_nodeclaim() -> None:
    agent = UserInfo(
        "system:serviceaccount:buildmatrix:buildmatrix-smoke",
        {"authentication.kubernetes.io/node-name": ["gpu-1"]},
    )
    policy = _policy()

    def denied(user: UserInfo, claim: dict[str, Any]) -> list[str]:
        return denials(
            policy, request(user, claim, None, resource="nodeclaims", operation="DELETE")
        )

    assert denied(agent, _claim("gpu-1", initialized=False)) == []
    assert (
        "only delete the NodeClaim of the node its Pod runs on"
        in denied(agent, _claim("gpu-2", initialized=False))[0]
    )
    assert "has not initialized" in denied(agent, _claim("gpu-1", initialized=True))[0]
    tokenless = UserInfo(agent.username, {})
    assert denied(tokenless, _claim("gpu-1", initialized=False))
    someone = UserInfo("system:serviceaccount:karpenter:karpenter", {})
    assert denied(someone, _claim("gpu-2", initialized=True)) == []  # not the agent's


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[ApiStandIn, Path]]:
    """The stand-in with both policies; gpu-1 a Karpenter node an hour old whose
    NodeClaim is nc-gpu-1, gpu-2 another one."""
    standin = ApiStandIn(
        tokens={"smoke": {"get", "patch", "delete"}},
        identities={
            "smoke": UserInfo(AGENT, {"authentication.kubernetes.io/node-name": ["gpu-1"]})
        },
        policies=[agent_policy(), _policy()],
    )
    created = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name in ("gpu-1", "gpu-2"):
        standin.add_node(name, labels={NODEPOOL_LABEL: "training-hopper-h100"}, taints=[ADMISSION])
        meta = standin.nodes[name]["metadata"]
        meta["creationTimestamp"] = created
        meta["ownerReferences"] = [
            {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": f"nc-{name}",
             "uid": f"u-{name}"}
        ]  # fmt: skip
        standin.nodeclaims[f"nc-{name}"] = _claim(name, initialized=False)
    server, url = standin.serve()
    try:
        yield standin, standin.kubeconfig(tmp_path / "kubeconfig", url, "smoke")
    finally:
        server.shutdown()
        server.server_close()


def _smoke(cli: CliRunner, kubeconfig: Path, fixture: str, *args: str) -> tuple[int, Any]:
    r = cli(
        "smoke", "--snapshot", str(NODES / f"{fixture}.json"), "--apply", "--node", "gpu-1",
        "--kubeconfig", str(kubeconfig), "--json", *args,
    )  # fmt: skip
    return r.code, json.loads(r.out) if r.out.strip() else r.err


def test_smoke_deletes_the_nodeclaim_of_a_new_node_failing_by_its_own_gpus(
    cli: CliRunner, api: tuple[ApiStandIn, Path]
) -> None:
    standin, kubeconfig = api
    code, doc = _smoke(cli, kubeconfig, "h100-ecc", "--replace-after", "600")
    assert code == 1, doc
    assert doc["repair"]["action"] == "replace", doc["repair"]
    assert set(standin.nodeclaims) == {"nc-gpu-2"}  # its own, and no other
    assert standin.nodes["gpu-1"]["spec"]["taints"] == [ADMISSION]  # the verdict stays


def test_the_daemonsets_environment_turns_it_on(
    cli: CliRunner, api: tuple[ApiStandIn, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """BUILDMATRIX_REPLACE_AFTER, as ``kubectl set env`` gives it to the DaemonSet."""
    standin, kubeconfig = api
    monkeypatch.setenv("BUILDMATRIX_REPLACE_AFTER", "600")
    code, doc = _smoke(cli, kubeconfig, "h100-ecc")
    assert code == 1 and doc["repair"]["action"] == "replace"
    assert set(standin.nodeclaims) == {"nc-gpu-2"}


def test_smoke_waits_reports_or_is_refused_otherwise(
    cli: CliRunner, api: tuple[ApiStandIn, Path]
) -> None:
    standin, kubeconfig = api
    code, doc = _smoke(cli, kubeconfig, "h100-ecc", "--replace-after", "7200")
    assert code == 1 and doc["repair"]["action"] == "wait"
    code, doc = _smoke(cli, kubeconfig, "h100-535", "--replace-after", "600")
    assert code == 0 and "repair" not in doc
    # Karpenter initialized it after that pass: a later failure is a day-2 one
    standin.nodes["gpu-1"]["metadata"]["labels"][INITIALIZED_LABEL] = "true"
    code, doc = _smoke(cli, kubeconfig, "h100-ecc", "--replace-after", "600")
    assert code == 1 and doc["repair"]["action"] == "report"
    assert "initialized" in doc["repair"]["why"]
    # the node's owner named as another node's NodeClaim: the policy refuses the delete
    standin.nodes["gpu-1"]["metadata"]["ownerReferences"][0].update(name="nc-gpu-2", uid="u-gpu-2")
    standin.nodes["gpu-1"]["metadata"]["labels"].pop(INITIALIZED_LABEL, None)
    code, doc = _smoke(cli, kubeconfig, "h100-ecc", "--replace-after", "600")
    assert code == 1 and doc["repair"]["action"] == "report"
    assert "answered 403" in doc["repair"]["why"]
    assert set(standin.nodeclaims) == {"nc-gpu-1", "nc-gpu-2"}
    r = cli("smoke", "--snapshot", str(NODES / "h100-ecc.json"), "--replace-after", "600")
    assert r.code == 2 and "--apply" in r.err


def test_a_node_without_a_driver_is_replaced_saying_why(
    api: tuple[ApiStandIn, Path], tmp_path: Path
) -> None:
    """NVML that cannot be loaded (the probe in a new process with no GPU library, as
    tests/test_kube_apply.py's no-nvml scenario; as on a node whose driver container
    is still installing): exit 3, the failure mark written, and replaced with the
    reason that every node of the NodePool may share it."""
    standin, kubeconfig = api
    proc = run_cli(
        [
            "smoke", "--apply", "--node", "gpu-1", "--kubeconfig", str(kubeconfig), "--json",
            "--replace-after", "600",
        ],
        libs=None,
        tmp=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["repair"]["action"] == "replace"
    assert "nvml-unavailable" in doc["repair"]["why"]
    assert "every node of the NodePool alike" in doc["repair"]["why"]
    assert standin.nodes["gpu-1"]["metadata"]["labels"]["buildmatrix.io/smoke"] == "failed"
    assert set(standin.nodeclaims) == {"nc-gpu-2"}


@pytest.mark.integration
@pytest.mark.index
def test_the_legacy_client_deletes_the_nodeclaim_too(
    legacy_client: Path,  # noqa: F811
    api: tuple[ApiStandIn, Path],
) -> None:
    """kubernetes before 37 has no ApiClient.param_serialize: CustomObjectsApi sends
    the same DELETE (tests/test_kube_client_versions.py runs the child the same way)."""
    standin, kubeconfig = api
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "buildmatrix", "smoke", "--json", "--apply"),
            *("--snapshot", str(NODES / "h100-ecc.json"), "--node", "gpu-1"),
            *("--kubeconfig", str(kubeconfig), "--replace-after", "600"),
        ],
        env={**os.environ, "PYTHONPATH": f"{legacy_client}{os.pathsep}{REPO}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["repair"]["action"] == "replace"
    assert set(standin.nodeclaims) == {"nc-gpu-2"}
    assert [m for m, _, _ in standin.requests if m == "DELETE"] == ["DELETE"]
