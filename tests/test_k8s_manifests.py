"""``k8s manifests``: what it prints for each flag, every object valid against the
Kubernetes schemas (kubernetes-validate, strict), and the checks on ``--node-selector``.

How these objects let a tainted node be admitted is tests/test_scheduling.py.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmatrix.k8s_daemonset import GPU_NODE_LABELS
from buildmatrix.k8s_nodes import kubelet_may_set, parse_selector
from buildmatrix.k8s_values import ADMISSION_TOLERATION
from tests.conftest import CliRunner

K8S_VERSION = "1.34.0"
FLAGS = ["--runtime-class", "--example-job", "--load-test"]

# NodeRestriction's own test (kubernetes plugin/pkg/admission/noderestriction/
# admission_test.go at commit 008ef699a50afe9b8c52df50b6d2cfc21c4f7240,
# setAllowedUpdateLabels and setForbiddenCreateLabels): the keys a kubelet may and may
# not set on its Node.
KUBELET_ALLOWED = [
    "foo",
    "example.com/foo",
    "kubernetes.io/hostname",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "kubelet.kubernetes.io/foo",
    "foo.kubelet.kubernetes.io/foo",
    "node.kubernetes.io/foo",
    "foo.node.kubernetes.io/foo",
]
KUBELET_FORBIDDEN = [
    "node-restriction.kubernetes.io/foo",
    "foo.node-restriction.kubernetes.io/foo",
    "other.kubernetes.io/foo",
    "other.k8s.io/foo",
]


def _docs(cli: CliRunner, *args: str) -> list[dict[str, Any]]:
    r = cli("k8s", "manifests", "--image", "registry.example.com/buildmatrix:1", *args)
    assert r.code == 0, r.err
    return [d for d in yaml.safe_load_all(r.out) if d]


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize(
    "flags",
    [c for n in range(len(FLAGS) + 1) for c in itertools.combinations(FLAGS, n)],
    ids=lambda c: " ".join(c) or "default",
)
def test_each_flag_adds_only_its_object_and_all_validate(
    cli: CliRunner, flags: tuple[str, ...], tmp_path: Path
) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    extra: tuple[str, ...] = ()
    if "--load-test" in flags:  # the load test needs every pool's images
        pools = tmp_path / "pools.yaml"
        pools.write_text(
            "families: {hopper: train}\npools:\n  train: {images: [registry.example.com/t:1]}\n"
        )
        extra = ("--pools", str(pools))
    docs = _docs(cli, *flags, *extra, "--node-selector", "example.com/gpu-node=true")
    kinds = ["Namespace", "ResourceQuota", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    kinds += ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ConfigMap"]
    kinds += ["RuntimeClass"] if "--runtime-class" in flags else []
    kinds += ["DaemonSet"]
    kinds += ["Job"] if "--example-job" in flags else []
    assert [d["kind"] for d in docs] == kinds
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    pod = _pod(docs)
    assert pod["runtimeClassName"] == "nvidia"
    assert ("--load-test" in pod["containers"][0]["command"][-1]) is ("--load-test" in flags)


def test_the_runtime_class(cli: CliRunner) -> None:
    (rc,) = [d for d in _docs(cli, "--runtime-class") if d["kind"] == "RuntimeClass"]
    assert rc["apiVersion"] == "node.k8s.io/v1"
    assert rc["metadata"]["name"] == "nvidia"
    assert rc["handler"] == "nvidia"
    assert "scheduling" not in rc  # it must not narrow where the DaemonSet may run


def test_node_selectors_are_ored_with_the_gpu_labels(cli: CliRunner) -> None:
    docs = _docs(
        cli,
        "--node-selector",
        "example.com/gpu-node=true",
        "--node-selector",
        "node.kubernetes.io/instance-type=p5.48xlarge,example.com/pool=h100",
    )
    required = _pod(docs)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    terms = [
        [(e["key"], e["operator"], tuple(e["values"])) for e in t["matchExpressions"]]
        for t in required["nodeSelectorTerms"]
    ]
    assert terms == [
        *([(k, "In", (v,))] for k, v in GPU_NODE_LABELS),
        [("example.com/gpu-node", "In", ("true",))],
        [
            ("node.kubernetes.io/instance-type", "In", ("p5.48xlarge",)),
            ("example.com/pool", "In", ("h100",)),
        ],
    ]


@pytest.mark.parametrize("key", KUBELET_ALLOWED)
def test_keys_a_kubelet_may_set(key: str) -> None:
    assert kubelet_may_set(key)
    assert parse_selector(f"{key}=x").labels == ((key, "x"),)


@pytest.mark.parametrize("key", KUBELET_FORBIDDEN)
def test_keys_a_kubelet_may_not_set_exit_2(cli: CliRunner, key: str) -> None:
    assert not kubelet_may_set(key)
    r = cli("k8s", "manifests", "--node-selector", f"{key}=x")
    assert r.code == 2
    assert f"a kubelet may not set '{key}'" in r.err
    assert "NodeRestriction" in r.err
    assert r.out == ""


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("gpu", "'gpu' is not KEY=VALUE"),
        ("=true", "'=true' is not KEY=VALUE"),
        ("Example.com/gpu=true", "prefix 'Example.com' is not a DNS subdomain"),
        ("example.com/-gpu=true", "name '-gpu' must be 1-63 characters"),
        ("a/b/c=true", "has more than one '/'"),
        ("example.com/gpu=not ok", "value 'not ok' of 'example.com/gpu'"),
        ("example.com/gpu=" + "x" * 64, "must be at most 63 characters"),
        ("example.com/a=1,example.com/a=2", "'example.com/a' is given twice"),
        ("gpu-pool=training", "a label smoke --apply writes and removes"),
        ("buildmatrix.io/smoke=passed", "a label smoke --apply writes and removes"),
    ],
)
def test_bad_node_selectors_exit_2(cli: CliRunner, selector: str, message: str) -> None:
    r = cli("k8s", "manifests", "--node-selector", selector)
    assert r.code == 2
    assert message in r.err
    assert "--node-selector" in r.err
    assert r.out == ""


def test_an_empty_value_is_a_label_value() -> None:
    assert parse_selector("example.com/gpu=").labels == (("example.com/gpu", ""),)


@pytest.mark.parametrize("flag", ["--gpu-operator-values", "--nfd-values"])
def test_values_overlays(cli: CliRunner, flag: str) -> None:
    r = cli("k8s", "manifests", flag)
    assert r.code == 0, r.err
    assert r.out.startswith("# Helm values for the ")
    values = yaml.safe_load(r.out)
    j = cli("k8s", "manifests", flag, "--format", "json")
    assert json.loads(j.out) == values
    lists = (
        [values["daemonsets"], values["node-feature-discovery"]["worker"]]
        if flag == "--gpu-operator-values"
        else [values["worker"]]
    )
    for holder in lists:
        assert ADMISSION_TOLERATION in holder["tolerations"]
    # the values are the whole output: no manifests after them
    assert "kind:" not in r.out


def test_one_overlay_at_a_time(cli: CliRunner) -> None:
    r = cli("k8s", "manifests", "--gpu-operator-values", "--nfd-values")
    assert r.code == 2
    assert "give one" in r.err
    assert r.out == ""


@pytest.mark.parametrize("namespace", ["a'b", "Bad_NS", "", "x" * 64, "-x"])
def test_a_namespace_the_api_server_would_refuse_is_bad_input(
    cli: CliRunner, namespace: str
) -> None:
    r = cli("k8s", "manifests", "--namespace", namespace)
    assert r.code == 2
    # an empty one is refused before, as every empty value is (tests/test_cli_input.py)
    why = "the value is empty" if not namespace else "is not a valid namespace name"
    assert why in r.err


# Capabilities the Pod Security Standards' baseline level lets a container add
# (kubernetes.io/docs/concepts/security/pod-security-standards, "Capabilities";
# k8s.io/pod-security-admission policy/check_capabilities_baseline.go).
_BASELINE_CAPS = {
    *("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD"),
    *("NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"),
}


def _baseline_refuses(pod: dict[str, Any]) -> list[str]:
    """What of a Pod spec the baseline level refuses, per the standard's controls:
    host namespaces, privileged containers, added capabilities beyond its list,
    hostPath volumes, host ports."""
    found = [f"spec.{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    found += [f"hostPath {v['name']}" for v in pod.get("volumes", []) if "hostPath" in v]
    for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
        ctx = c.get("securityContext") or {}
        if ctx.get("privileged"):
            found.append(f"{c['name']}: privileged")
        added = set((ctx.get("capabilities") or {}).get("add") or []) - _BASELINE_CAPS
        found += [f"{c['name']}: adds {cap}" for cap in sorted(added)]
        found += [f"{c['name']}: hostPort" for p in c.get("ports", []) if p.get("hostPort")]
    return found


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--mode", "nfd"),
        ("--mig-strategy", "single"),
        ("--mig-strategy", "mixed"),
        ("--containerd",),
        ("--load-test",),
        ("--runtime-class",),
        ("--registry-secret", "pull"),
        ("--mode", "nfd", "--containerd"),
        ("--device-request", "volume-mounts"),
        ("--device-request", "cdi-annotation"),
    ],
    ids=lambda a: " ".join(a) or "default",
)
def test_pod_security_label_where_the_pods_need_it(
    cli: CliRunner, tmp_path: Path, args: tuple[str, ...]
) -> None:
    """The namespace is labelled privileged exactly where its DaemonSet's Pod would be
    refused at the Pod Security Standards' baseline level (which clusters often
    enforce by default): hostPath volumes (--mode nfd, --containerd), added
    capabilities (MIG monitoring)."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "families: {hopper: train}\npools:\n  train: {images: [registry.example.com/t:1]}\n"
    )
    docs = _docs(cli, "--pools", str(pools), *args)
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    refused = _baseline_refuses(ds["spec"]["template"]["spec"])
    label = ns["metadata"]["labels"].get("pod-security.kubernetes.io/enforce")
    assert label == ("privileged" if refused else None), refused


def _scope_matches(expression: dict[str, Any], priority_class: str | None) -> bool:
    """A PriorityClass scope selector expression against a Pod's class, as the quota
    evaluator matches it (kubernetes pkg/quota/v1/evaluator/core/pods.go,
    podMatchesScopeFunc and podMatchesSelector)."""
    op, values = expression["operator"], expression.get("values", [])
    if op == "In":
        return priority_class in values
    if op == "NotIn":
        return priority_class is not None and priority_class not in values
    if op == "Exists":
        return priority_class is not None
    return op == "DoesNotExist" and priority_class is None


@pytest.mark.parametrize("args", [(), ("--mode", "nfd"), ("--namespace", "gpu-admission")])
def test_a_quota_admits_the_critical_pods_where_the_cluster_limits_them(
    cli: CliRunner, args: tuple[str, ...]
) -> None:
    """Where the ResourceQuota admission plugin limits the system-*-critical classes
    (``limitedResources``, as GKE Standard configures it), a Pod of such a class is
    created only in a namespace holding a quota whose scope selector matches it and
    that limits pods (kubernetes plugin/pkg/admission/resourcequota, "insufficient
    quota to match these scopes"). The DaemonSet's Pod must find one, of a ceiling no
    cluster's node count reaches."""
    docs = _docs(cli, *args)
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    covering = [
        d
        for d in docs
        if d["kind"] == "ResourceQuota"
        and d["metadata"]["namespace"] == ds["metadata"]["namespace"]
        and "pods" in d["spec"]["hard"]
        and all(
            _scope_matches(e, pod["priorityClassName"])
            for e in d["spec"]["scopeSelector"]["matchExpressions"]
        )
    ]
    assert len(covering) == 1
    assert int(covering[0]["spec"]["hard"]["pods"]) > 65000


def test_the_deadline_rendered_is_one_smoke_takes(cli: CliRunner) -> None:
    """smoke --deadline takes at most a day; a longer one rendered would make every
    round exit 2 and write nothing (an admitted node never checked again)."""
    r = cli("k8s", "manifests", "--deadline", "100000")
    assert r.code == 2
    assert "--deadline" in r.err
    assert cli("k8s", "manifests", "--deadline", "86400").code == 0
