"""The admission agent's ValidatingAdmissionPolicy, evaluated as rendered.

``k8s manifests`` output is parsed, and its policy's CEL is evaluated by cel-python (a
CEL implementation buildmatrix did not write) over AdmissionReview-shaped requests
(tests/admission_policy.py, a stand-in for the API server's policy plugin). The
patches the agent really sends (node/apply.py ``plan``, applied by the stand-in API
server's patch code) are held to the same policy.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import yaml

from buildmatrix.labelkeys import GFD_KEYS, GFD_TIMESTAMP, TAINT_EFFECT, TAINT_KEY, GfdKeys
from buildmatrix.node.apply import plan
from tests.admission_policy import UserInfo, denials, request
from tests.conftest import CliRunner
from tests.kube_standin import apply_patch

AGENT = "system:serviceaccount:buildmatrix:buildmatrix-smoke"
CLAIM = "authentication.kubernetes.io/node-name"
OURS = {"key": TAINT_KEY, "effect": TAINT_EFFECT}
CONTROL_PLANE = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


def agent_on(node: str) -> UserInfo:
    return UserInfo(AGENT, {CLAIM: [node], "authentication.kubernetes.io/pod-name": ["p"]})


def rendered(cli: CliRunner, *args: str) -> list[Any]:
    result = cli("k8s", "manifests", *args)
    assert result.code == 0, result.err
    return [d for d in yaml.safe_load_all(result.out) if d]


@pytest.fixture
def policy(cli: CliRunner) -> Any:
    docs = rendered(cli)
    (found,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == found["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    return found


def node(name: str, *, labels: dict[str, str] | None = None, taints: Any = None) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "resourceVersion": "7",
        },
        "spec": {"taints": list(taints or []), "podCIDR": "10.0.0.0/24"},
        "status": {},
    }


def changed(old: Any, change: Any) -> Any:
    new = copy.deepcopy(old)
    change(new)
    return new


def verdict(policy: Any, user: UserInfo, old: Any, new: Any) -> list[str]:
    return denials(policy, request(user, old, new))


A = node("gpu-a", labels={"nvidia.com/gpu.present": "true"}, taints=[OURS, CONTROL_PLANE])


def test_the_agent_may_admit_its_own_node(policy: Any) -> None:
    def admit(n: Any) -> None:
        n["metadata"]["labels"] |= {"gpu-pool": "train", "buildmatrix.io/smoke": "passed"}
        n["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
        n["spec"]["taints"] = [CONTROL_PLANE]
        n["metadata"]["annotations"]["buildmatrix.io/smoke-report"] = "x"

    assert verdict(policy, agent_on("gpu-a"), A, changed(A, admit)) == []


@pytest.mark.parametrize(
    ("what", "change", "rule"),
    [
        (
            "another node",
            lambda n: n["metadata"]["labels"].update({"gpu-pool": "x"}),
            "only change the Node its Pod runs on",
        ),
    ],
)
def test_another_node_is_refused(what: str, change: Any, rule: str, policy: Any) -> None:
    assert any(rule in m for m in verdict(policy, agent_on("gpu-b"), A, changed(A, change))), what


def _set_label(key: str, value: str | None) -> Any:
    def change(n: Any) -> None:
        if value is None:
            n["metadata"]["labels"].pop(key, None)
        else:
            n["metadata"]["labels"][key] = value

    return change


DENIED = [
    ("remove the control-plane taint", lambda n: n["spec"].update(taints=[OURS]), "taint"),
    (
        "add a NoExecute taint",
        lambda n: n["spec"]["taints"].append({"key": "x", "effect": "NoExecute"}),
        "taint",
    ),
    (
        "our key with another effect",
        lambda n: n["spec"]["taints"].append({"key": TAINT_KEY, "effect": "NoExecute"}),
        "taint",
    ),
    ("cordon", lambda n: n["spec"].update(unschedulable=True), "spec"),
    ("podCIDR", lambda n: n["spec"].update(podCIDR="10.9.0.0/24"), "spec"),
    ("providerID", lambda n: n["spec"].update(providerID="aws:///x"), "spec"),
    ("finalizers", lambda n: n["metadata"].update(finalizers=["x"]), "spec"),
    ("control-plane role", _set_label("node-role.kubernetes.io/control-plane", ""), "labels"),
    ("hostname", _set_label("kubernetes.io/hostname", "other"), "labels"),
    ("remove another's label", _set_label("nvidia.com/gpu.present", None), "labels"),
    ("a label near ours", _set_label("buildmatrix.iox/smoke", "passed"), "labels"),
    (
        "another annotation",
        lambda n: n["metadata"]["annotations"].update({"x": "y"}),
        "annotation",
    ),
]


@pytest.mark.parametrize(("what", "change", "rule"), DENIED, ids=[d[0] for d in DENIED])
def test_the_agent_may_not_touch_anything_else(
    what: str, change: Any, rule: str, policy: Any
) -> None:
    messages = verdict(policy, agent_on("gpu-a"), A, changed(A, change))
    assert len(messages) == 1, (what, messages)
    assert rule in messages[0], (what, messages)


@pytest.mark.parametrize(("what", "change", "rule"), DENIED, ids=[d[0] for d in DENIED])
def test_other_users_are_not_affected(what: str, change: Any, rule: str, policy: Any) -> None:
    admin = UserInfo("kubernetes-admin", {})
    other_sa = UserInfo("system:serviceaccount:kube-system:node-controller", {CLAIM: ["gpu-b"]})
    for user in (admin, other_sa):
        assert verdict(policy, user, A, changed(A, change)) == [], (what, user)


def test_a_token_without_the_node_claim_is_refused(policy: Any) -> None:
    unbound = UserInfo(AGENT, {})
    new = changed(A, _set_label("gpu-pool", "x"))
    assert verdict(policy, unbound, A, new)
    two = UserInfo(AGENT, {CLAIM: ["gpu-a", "gpu-b"]})
    assert verdict(policy, two, A, new)


def test_gfd_keys_only_where_gfd_does_not_label(cli: CliRunner, policy: Any) -> None:
    for key in GFD_KEYS:
        new = changed(A, _set_label(key, "1"))
        assert verdict(policy, agent_on("gpu-a"), A, new) == [], key
        with_gfd = changed(A, _set_label("nvidia.com/gfd.timestamp", "1764590000"))
        assert verdict(policy, agent_on("gpu-a"), with_gfd, changed(with_gfd, _set_label(key, "1")))
        # Removing a GFD key where GFD runs is refused too.
        present = changed(with_gfd, _set_label(key, "0"))
        assert verdict(policy, agent_on("gpu-a"), present, changed(present, _set_label(key, None)))


def _states() -> list[Any]:
    """Nodes as the agent may find them: fresh and tainted, admitted, failed, with GFD."""
    fresh = A
    admitted = changed(
        A,
        lambda n: (
            n["metadata"]["labels"].update({"gpu-pool": "old", "buildmatrix.io/smoke": "passed"}),
            n["spec"].update(taints=[CONTROL_PLANE]),
        ),
    )
    failed = changed(
        A,
        lambda n: (
            n["metadata"]["labels"].update({"buildmatrix.io/smoke": "failed"}),
            n["metadata"]["annotations"].update({"buildmatrix.io/smoke-report": "r"}),
        ),
    )
    gfd = changed(admitted, _set_label("nvidia.com/gfd.timestamp", "1764590000"))
    gfd = changed(gfd, _set_label("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"))
    return [fresh, admitted, failed, gfd]


VERDICT_LABELS = [
    {"buildmatrix.io/smoke": "failed"},
    {
        "buildmatrix.io/smoke": "passed",
        "gpu-pool": "train",
        "nvidia.com/gpu.compute-capability": "9.0",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "verified.buildmatrix.io/train": "true",
    },
]


def test_every_patch_the_agent_sends_is_allowed(policy: Any) -> None:
    """Property over node states x verdicts x the GFD modes the manifests deploy: what
    ``smoke --apply`` sends (plan, applied as the API server applies a strategic merge
    patch) passes. ``--gfd-keys always`` beside a running GFD is the one write the
    policy refuses: the agent would be fighting GFD over its keys."""
    for old, labels, mode in itertools.product(
        _states(), VERDICT_LABELS, (GfdKeys.AUTO, GfdKeys.NEVER, GfdKeys.ALWAYS)
    ):
        passed = labels["buildmatrix.io/smoke"] == "passed"
        body, _ = plan(old, labels=labels, passed=passed, report="r", gfd_keys=mode)
        new = apply_patch(old, body, "application/strategic-merge-patch+json")
        refused = verdict(policy, agent_on("gpu-a"), old, new)
        gfd_runs = GFD_TIMESTAMP in old["metadata"]["labels"]
        fights_gfd = mode is GfdKeys.ALWAYS and gfd_runs and new != old
        assert bool(refused) == fights_gfd, (old, labels, mode, refused)


def test_no_policy_below_1_30(cli: CliRunner) -> None:
    result = cli("k8s", "manifests", "--kubernetes-version", "1.29")
    assert result.code == 2
    assert "needs Kubernetes 1.30 or newer" in result.err
    assert "--no-node-policy" in result.err
    bad = cli("k8s", "manifests", "--kubernetes-version", "latest")
    assert bad.code == 2
    assert "MAJOR.MINOR" in bad.err
    kinds = [d["kind"] for d in rendered(cli, "--no-node-policy")]
    assert "ValidatingAdmissionPolicy" not in kinds
    assert "ClusterRole" in kinds
