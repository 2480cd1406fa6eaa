"""``k8s manifests --mig-strategy``: the admission DaemonSet on a cluster with MIG GPUs.

Facts checked, with their sources:
- the NVIDIA container toolkit grants MIG monitoring with NVIDIA_MIG_MONITOR_DEVICES
  and refuses that variable in a container without CAP_SYS_ADMIN in its bounding set
  (nvidia-container-toolkit cmd/nvidia-container-runtime-hook/container_config.go,
  getNvidiaConfig: "cannot set MIG_MONITOR_DEVICES in non privileged container";
  internal/config/image/privileged.go, IsPrivileged);
- Kubernetes refuses allowPrivilegeEscalation false beside privileged or an added
  CAP_SYS_ADMIN (pkg/apis/core/validation/validation.go, ValidateSecurityContext).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.conftest import CliRunner

K8S_VERSION = "1.34.0"


def _container(cli: CliRunner, *args: str) -> dict[str, Any]:
    r = cli("k8s", "manifests", *args)
    assert r.code == 0, r.err
    (ds,) = [d for d in yaml.safe_load_all(r.out) if d["kind"] == "DaemonSet"]
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(ds, K8S_VERSION, strict=True)
    container: dict[str, Any] = ds["spec"]["template"]["spec"]["containers"][0]
    return container


def _toolkit_accepts(container: dict[str, Any]) -> bool:
    """getNvidiaConfig's rule: MIG monitoring only with CAP_SYS_ADMIN in the bounding set
    (the container runtime prefixes CAP_ to the names Kubernetes passes)."""
    env = {e["name"]: e.get("value") for e in container["env"]}
    caps = container["securityContext"].get("capabilities", {})
    bounding = {f"CAP_{c}" for c in caps.get("add", [])}
    privileged = container["securityContext"].get("privileged", False)
    return not env.get("NVIDIA_MIG_MONITOR_DEVICES") or privileged or "CAP_SYS_ADMIN" in bounding


def _kubernetes_accepts(container: dict[str, Any]) -> bool:
    """ValidateSecurityContext's rule on allowPrivilegeEscalation: false."""
    sc = container["securityContext"]
    if sc.get("allowPrivilegeEscalation") is not False:
        return True
    added = sc.get("capabilities", {}).get("add", [])
    return not sc.get("privileged") and "CAP_SYS_ADMIN" not in added and "SYS_ADMIN" not in added


@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
def test_mig_cluster_daemonset_may_monitor_mig(cli: CliRunner, strategy: str) -> None:
    c = _container(cli, "--mig-strategy", strategy)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert f"--mig-strategy {strategy}" in c["command"][-1]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert c["securityContext"]["runAsUser"] == 0
    assert _toolkit_accepts(c)
    assert _kubernetes_accepts(c)


def test_without_mig_nothing_is_granted(cli: CliRunner) -> None:
    c = _container(cli)
    assert "NVIDIA_MIG_MONITOR_DEVICES" not in {e["name"] for e in c["env"]}
    assert "--mig-strategy" not in c["command"][-1]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert _toolkit_accepts(c)
    assert _kubernetes_accepts(c)


def test_the_rules_catch_what_they_name() -> None:
    """The two rules above can fail: each refuses the container it describes."""
    monitor_unprivileged = {
        "env": [{"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}],
        "securityContext": {"capabilities": {"drop": ["ALL"]}},
    }
    assert not _toolkit_accepts(monitor_unprivileged)
    no_escalation = {
        "env": [],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"add": ["CAP_SYS_ADMIN"]},
        },
    }
    assert not _kubernetes_accepts(no_escalation)


def test_the_admission_policy_lets_the_agent_write_its_mig_keys(cli: CliRunner) -> None:
    """The policy that holds the agent to the keys it owns (k8s_policy.py) allows the
    MIG keys smoke writes, as it allows GFD's other keys: on a node where GFD does not
    label; and refuses them where GFD does (nvidia.com/gfd.timestamp). The patches are
    the agent's own (node/apply.py plan), applied as the API server applies them;
    the policy is evaluated by cel-python (tests/admission_policy.py)."""
    import copy

    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.labelkeys import TAINT_EFFECT, TAINT_KEY, GfdKeys, is_mig_key
    from buildmatrix.node.apply import plan
    from buildmatrix.node.checks import NodeOptions, evaluate
    from buildmatrix.node.labels import node_labels
    from buildmatrix.profile_files import load_profiles
    from buildmatrix.snapshot import load_snapshot
    from tests.admission_policy import UserInfo, denials, request
    from tests.conftest import REPO, SHIPPED_PROFILES
    from tests.kube_standin import apply_patch

    pytest.importorskip("celpy")
    r = cli("k8s", "manifests", "--mig-strategy", "mixed")
    assert r.code == 0, r.err
    (policy,) = [
        d for d in yaml.safe_load_all(r.out) if d and d["kind"] == "ValidatingAdmissionPolicy"
    ]
    agent = UserInfo(
        "system:serviceaccount:buildmatrix:buildmatrix-smoke",
        {"authentication.kubernetes.io/node-name": ["gpu-a"]},
    )
    fresh: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-a",
            "labels": {"kubernetes.io/hostname": "gpu-a"},
            "annotations": {},
            "resourceVersion": "7",
        },
        "spec": {"taints": [{"key": TAINT_KEY, "effect": TAINT_EFFECT}]},
        "status": {},
    }
    profiles = load_profiles(SHIPPED_PROFILES)
    nodes = REPO / "tests" / "fixtures" / "nodes"
    for name, strategy in (("a100-mig-1g5gb", "single"), ("h100-mig-mixed", "mixed")):
        snap = load_snapshot(nodes / f"{name}.json")
        opts = NodeOptions(mig_strategy=strategy)
        report = evaluate(snap, profiles, load_cuda_facts(), options=opts)
        labels = node_labels(snap, report, mig_strategy=strategy)
        assert any(is_mig_key(k) for k in labels)
        body, _ = plan(fresh, labels=labels, passed=True, report="r", gfd_keys=GfdKeys.AUTO)
        admitted = apply_patch(fresh, body, "application/strategic-merge-patch+json")
        assert {k for k in labels if is_mig_key(k)} <= set(admitted["metadata"]["labels"])
        assert denials(policy, request(agent, fresh, admitted)) == []
        # where GFD labels the node, a MIG key written by the agent is refused
        gfd = copy.deepcopy(fresh)
        gfd["metadata"]["labels"]["nvidia.com/gfd.timestamp"] = "1764590000"
        key = next(k for k in labels if is_mig_key(k))
        written = copy.deepcopy(gfd)
        written["metadata"]["labels"][key] = labels[key]
        assert denials(policy, request(agent, gfd, written))


def test_the_agent_owns_its_mig_keys_and_not_gfds_sharing_keys() -> None:
    """Every MIG key smoke writes is one it owns (so a failed round removes it), and
    the ``.replicas`` and ``.sharing-strategy`` GFD writes beside each MIG resource
    (internal/lm/resource.go, baseLabeler: the device plugin's sharing settings) are
    never touched, on pass or on fail, even where buildmatrix writes GFD's keys."""
    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.labelkeys import SMOKE, GfdKeys, is_mig_key
    from buildmatrix.node.apply import plan
    from buildmatrix.node.checks import NodeOptions, evaluate
    from buildmatrix.node.labels import node_labels
    from buildmatrix.profile_files import load_profiles
    from buildmatrix.snapshot import load_snapshot
    from tests.conftest import REPO, SHIPPED_PROFILES

    snap = load_snapshot(REPO / "tests" / "fixtures" / "nodes" / "h100-mig-mixed.json")
    profiles = load_profiles(SHIPPED_PROFILES)
    report = evaluate(snap, profiles, load_cuda_facts(), options=NodeOptions(mig_strategy="mixed"))
    labels = node_labels(snap, report, mig_strategy="mixed")
    mig = {k for k in labels if k.startswith("nvidia.com/mig")}
    assert mig and all(is_mig_key(k) for k in mig)
    resources = {k.rsplit(".", 1)[0] for k in mig if k.endswith(".count")}
    sharing = {
        f"{r}.{s}": v
        for r in resources
        for s, v in (("replicas", "2"), ("sharing-strategy", "time-slicing"))
    }
    node = {"metadata": {"name": "gpu-a", "labels": {**labels, **sharing}}, "spec": {"taints": []}}
    for passed, wanted in ((True, labels), (False, {SMOKE: "failed"})):
        for mode in GfdKeys:
            body, applied = plan(node, passed=passed, labels=wanted, report="r", gfd_keys=mode)
            touched = set(body.get("metadata", {}).get("labels", {}))
            assert not touched & set(sharing), (passed, mode)
            if not passed and mode is GfdKeys.ALWAYS:
                assert mig <= set(applied.labels_removed)
