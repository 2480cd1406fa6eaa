"""A node that joins tainted for admission gets admitted, on a GPU Operator cluster and on
an NFD-only cluster, exactly when the values overlay (or a provisioner label) is used.

The scheduling rules (tests/scheduling.py, a stand-in for the DaemonSet controller and
the scheduler's filters) are first checked against Kubernetes' own test tables. Then a
node joins a stand-in cluster (tests/cluster_sim.py) whose DaemonSets are the real
objects: buildmatrix's from ``k8s manifests``, the GPU Operator's operands and NFD's
worker from the charts' defaults (tests/fixtures/charts/, cited there) with the overlay
that ``k8s manifests --gpu-operator-values`` / ``--nfd-values`` prints applied as Helm
applies values. The walk must get stuck without the overlay and reach admission with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmatrix.labelkeys import GfdKeys
from buildmatrix.node.apply import plan
from tests.cluster_sim import H100_PCI, Component, Node, Walk, joining_node, walk
from tests.conftest import CliRunner
from tests.scheduling import (
    daemon_tolerations,
    required_affinity_matches,
    should_run,
    tolerates,
    untolerated,
)

FIXTURES = Path(__file__).parent / "fixtures"
UPSTREAM = yaml.safe_load((FIXTURES / "k8s" / "upstream-cases.yaml").read_text())
GPU_OPERATOR = yaml.safe_load((FIXTURES / "charts" / "gpu-operator-v26.7.0.yaml").read_text())
NFD = yaml.safe_load((FIXTURES / "charts" / "node-feature-discovery-v0.19.0.yaml").read_text())
NODES = FIXTURES / "nodes"
SELECTOR = "example.com/gpu-node=true"


# --- the rules, against Kubernetes' own tables -------------------------------------


@pytest.mark.parametrize("case", UPSTREAM["node_affinity"], ids=lambda c: c["name"])
def test_required_affinity_as_upstream(case: dict[str, Any]) -> None:
    node = {"metadata": {"name": case.get("node_name", ""), "labels": case.get("labels") or {}}}
    assert required_affinity_matches(case["pod"], node) is case["want"]


@pytest.mark.parametrize("case", UPSTREAM["tolerations"], ids=str)
def test_toleration_as_upstream(case: dict[str, Any]) -> None:
    got = tolerates(
        case["toleration"],
        case["taint"],
        comparison_operators=case.get("comparison_operators", False),
    )
    assert got is case["want"]


@pytest.mark.parametrize("case", UPSTREAM["untolerated"], ids=str)
def test_untolerated_as_upstream(case: dict[str, Any]) -> None:
    found = untolerated(case["taints"], case["tolerations"], case["effects"])
    assert (found is None) is case["want_tolerated"]


def test_comparison_operators_need_the_feature_gate() -> None:
    toleration = {"key": "sla", "operator": "Gt", "value": "750", "effect": "NoSchedule"}
    taint = {"key": "sla", "value": "950", "effect": "NoSchedule"}
    assert tolerates(toleration, taint, comparison_operators=True)
    assert not tolerates(toleration, taint)


@pytest.mark.parametrize("host_network", [False, True])
def test_daemon_pods_get_the_controllers_tolerations(host_network: bool) -> None:
    """daemonset_util.go AddOrUpdateDaemonPodTolerations: a cordoned, not-ready or
    pressured node does not stop a DaemonSet; network-unavailable only for hostNetwork."""
    spec: dict[str, Any] = {"hostNetwork": host_network, "tolerations": []}
    ds = {"spec": {"template": {"spec": spec}}}
    for key, effect in [
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ]:
        node = {"metadata": {"name": "n"}, "spec": {"taints": [{"key": key, "effect": effect}]}}
        assert should_run(ds, node)[0], key
    unavailable = {"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}
    node = {"metadata": {"name": "n"}, "spec": {"taints": [unavailable]}}
    assert should_run(ds, node)[0] is host_network
    # an equal toleration already in the spec is replaced, not repeated
    spec["tolerations"] = [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    ]
    keys = [t["key"] for t in daemon_tolerations(spec)]
    assert keys.count("node.kubernetes.io/unschedulable") == 1


# --- the charts, with and without the overlay --------------------------------------


def helm_values(defaults: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of a values file over the chart's values: maps merge key by
    key, anything else (a list included) replaces the chart's."""
    out = dict(defaults)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = helm_values(out[key], value)
        else:
            out[key] = value
    return out


def _daemonset(name: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {"template": {"spec": pod_spec}},
    }


def nfd_worker(worker: Mapping[str, Any], pci: Mapping[str, Any]) -> Component:
    """templates/worker.yaml's pod spec from worker.* values, and the label the PCI
    source gives the node's NVIDIA device (pci.go GetLabels)."""
    spec: dict[str, Any] = {"hostNetwork": worker.get("hostNetwork", False)}
    for key in ("nodeSelector", "affinity", "tolerations"):
        if worker.get(key):
            spec[key] = worker[key]
    fields = [f for f in NFD["pci_attribute_order"] if f in pci["deviceLabelFields"]]
    listed = any(H100_PCI["class"].startswith(w) for w in pci["deviceClassWhitelist"])
    label = NFD["label_prefix"] + "_".join(H100_PCI[f] for f in fields) + ".present"

    def act(node: Node) -> None:
        if listed:
            node.labels[label] = "true"

    return Component(name="nfd-worker", daemonset=_daemonset(NFD["worker_name"], spec), act=act)


def _operator_labels(node: Node) -> None:
    """nodelabeling_controller.go labelGPUNodes: gpu.present from the PCI labels, then
    the container workload's deploy labels."""
    if any(node.labels.get(k) == v for k, v in GPU_OPERATOR["gpu_node_labels"].items()):
        node.labels[GPU_OPERATOR["common_gpu_label"]] = "true"
    if node.labels.get(GPU_OPERATOR["common_gpu_label"]) == "true":
        node.labels.update(GPU_OPERATOR["deploy_labels"])


_OPERAND_ACTS = {  # what each operand's Pod brings to the node
    "nvidia-driver-daemonset": (frozenset(), "driver"),
    "nvidia-container-toolkit-daemonset": (frozenset({"driver"}), "runtime:nvidia"),
}


def gpu_operator(overlay: Mapping[str, Any]) -> list[Component]:
    values = helm_values(GPU_OPERATOR["values"], overlay)
    worker = values["node-feature-discovery"]["worker"]
    components = [
        nfd_worker(worker, worker["config"]["sources"]["pci"]),
        Component(name="gpu-operator node labels", daemonset=None, act=_operator_labels),
    ]
    common = values["daemonsets"]["tolerations"]
    for operand in GPU_OPERATOR["operands"]:
        spec = {k: v for k, v in operand.items() if k != "name"}
        if common:  # applyCommonDaemonsetConfig
            spec["tolerations"] = common
        waits, gives = _OPERAND_ACTS.get(operand["name"], (frozenset(), ""))

        def act(node: Node, gives: str = gives) -> None:
            if gives:
                node.facts.add(gives)

        ds = _daemonset(operand["name"], spec)
        components.append(Component(name=operand["name"], daemonset=ds, waits_for=waits, act=act))
    return components


def standalone_nfd(overlay: Mapping[str, Any]) -> list[Component]:
    values = helm_values(NFD["values"], overlay)
    return [nfd_worker(values["worker"], NFD["pci_defaults"])]


def smoke(cli: CliRunner, *args: str) -> tuple[Component, dict[str, str]]:
    """buildmatrix's DaemonSet as ``k8s manifests`` prints it, and the runtime classes
    those manifests create. Its Pod's run: the labels of a recorded H100 node, applied
    by the patch smoke --apply computes (strategic merge: labels per key, taints whole)."""
    r = cli("k8s", "manifests", "--pools", str(NODES / "pools.yaml"), *args)
    assert r.code == 0, r.err
    docs = list(yaml.safe_load_all(r.out))
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    classes = {d["metadata"]["name"]: d["handler"] for d in docs if d["kind"] == "RuntimeClass"}
    r = cli(
        "labels",
        "--snapshot",
        str(NODES / "h100-535.json"),
        "--pools",
        str(NODES / "pools.yaml"),
        "--format",
        "json",
    )
    assert r.code == 0, r.err
    labels = r.json()["labels"]

    def act(node: Node) -> None:
        patch, _ = plan(node.obj, passed=True, labels=labels, report="", gfd_keys=GfdKeys.AUTO)
        for key, value in (patch.get("metadata", {}).get("labels") or {}).items():
            if value is None:
                node.labels.pop(key, None)
            else:
                node.labels[key] = value
        if "spec" in patch:
            node.obj["spec"]["taints"] = patch["spec"]["taints"]

    return Component(
        name="buildmatrix-smoke", daemonset=ds, waits_for=frozenset({"driver"}), act=act
    ), classes


def _values(cli: CliRunner, flag: str) -> dict[str, Any]:
    r = cli("k8s", "manifests", flag)
    assert r.code == 0, r.err
    values: dict[str, Any] = yaml.safe_load(r.out)
    return values


def _before(walked: Walk, *names: str) -> None:
    positions = [walked.steps.index(n) for n in names]
    assert positions == sorted(positions), walked.steps


TAINTED = "taint buildmatrix.io/unverified:NoSchedule is not tolerated"


# --- GPU Operator cluster ----------------------------------------------------------


@pytest.mark.parametrize("cordoned", [False, True], ids=["ready", "cordoned"])
def test_gpu_operator_cluster(cli: CliRunner, cordoned: bool) -> None:
    ds, _ = smoke(cli)
    operator_classes = {"nvidia": "nvidia"}  # the operator creates RuntimeClass nvidia
    # without the overlay: nothing of the GPU stack can start, so nothing ever labels
    # the node and smoke's DaemonSet never selects it
    stuck = walk(
        [*gpu_operator({}), ds], joining_node({}, facts=set(), cordoned=cordoned), operator_classes
    )
    assert not stuck.admitted
    assert stuck.steps == []
    assert stuck.blocked["nfd-worker"] == TAINTED
    assert "does not match" in stuck.blocked["buildmatrix-smoke"]
    assert "does not match" in stuck.blocked["nvidia-driver-daemonset"]
    # with it: join -> NFD labels -> deploy labels -> driver -> toolkit -> smoke
    overlay = _values(cli, "--gpu-operator-values")
    done = walk(
        [*gpu_operator(overlay), ds],
        joining_node({}, facts=set(), cordoned=cordoned),
        operator_classes,
    )
    assert done.admitted, done.blocked
    _before(
        done,
        "nfd-worker",
        "gpu-operator node labels",
        "nvidia-driver-daemonset",
        "nvidia-container-toolkit-daemonset",
        "buildmatrix-smoke",
    )
    assert done.node.labels["nvidia.com/gpu.present"] == "true"
    assert done.node.labels["gpu-pool"] == "training-hopper"
    assert done.blocked == {}
    # cordoning is not undone by admission; only the admission taint goes
    assert [t["key"] for t in done.node.taints] == (
        ["node.kubernetes.io/unschedulable"] if cordoned else []
    )


def test_gpu_operator_overlay_keeps_the_chart_defaults(cli: CliRunner) -> None:
    """A values list replaces the chart's: the overlay must still hold the defaults,
    else a GPU node tainted nvidia.com/gpu (and NFD on control planes) loses them."""
    overlay = _values(cli, "--gpu-operator-values")
    values = helm_values(GPU_OPERATOR["values"], overlay)
    chart = GPU_OPERATOR["values"]
    for path in (("daemonsets",), ("node-feature-discovery", "worker")):
        mine, theirs = values, chart
        for key in path:
            mine, theirs = mine[key], theirs[key]
        for toleration in theirs["tolerations"]:
            assert toleration in mine["tolerations"], (path, toleration)
    gpu_tainted = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    node = joining_node({}, facts=set())
    node.taints.append(gpu_tainted)
    assert walk([*gpu_operator(overlay), smoke(cli)[0]], node, {"nvidia": "nvidia"}).admitted


def test_provisioner_label_alone_does_not_bring_the_driver(cli: CliRunner) -> None:
    """On a GPU Operator cluster, selecting by the provisioner's label starts smoke's Pod
    at once, but it cannot run before the toolkit gave the node the nvidia handler:
    the overlay is still needed."""
    ds, _ = smoke(cli, "--node-selector", SELECTOR)
    join = {"example.com/gpu-node": "true"}
    stuck = walk([*gpu_operator({}), ds], joining_node(join, facts=set()), {"nvidia": "nvidia"})
    assert not stuck.admitted
    assert "no runtime handler nvidia" in stuck.blocked["buildmatrix-smoke"]
    overlay = _values(cli, "--gpu-operator-values")
    done = walk([*gpu_operator(overlay), ds], joining_node(join, facts=set()), {"nvidia": "nvidia"})
    assert done.admitted, done.blocked


# --- GPU Operator cluster with a driver per pool (k8s drivers) ------------------------


def pool_driver(obj: Mapping[str, Any]) -> Component:
    """The driver DaemonSet the GPU Operator runs for one ``NVIDIADriver`` object: it
    selects the nodes of the object's ``nodeSelector`` that have a GPU and are to get
    a driver (internal/state/nodepool.go getNodePools adds ``nvidia.com/gpu.present``;
    manifests/state-driver/0500_daemonset.yaml its ``nodeSelector``), and tolerates
    ``nvidia.com/gpu`` and the object's ``spec.tolerations``, nothing else (the same
    template: the chart's ``daemonsets.tolerations`` do not reach it)."""
    spec = obj["spec"]
    pod = {
        "nodeSelector": {
            **spec["nodeSelector"],
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.deploy.driver": "true",
        },
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            *spec.get("tolerations", []),
        ],
    }

    def act(node: Node) -> None:
        node.facts.add("driver")

    name = f"nvidia-gpu-driver-{obj['metadata']['name']}"
    return Component(name=name, daemonset=_daemonset(name, pod), act=act)


def _driver_objects(cli: CliRunner) -> list[dict[str, Any]]:
    pools = str(NODES / "pools.yaml")
    r = cli("k8s", "drivers", "--pools", pools, "--driver", "training-hopper=580.82.07")
    assert r.code == 0, r.err
    return [d for d in yaml.safe_load_all(r.out) if d is not None]


def test_a_pools_driver_reaches_a_node_that_joins_tainted(cli: CliRunner) -> None:
    """With per-pool drivers the provisioner sets ``gpu-pool`` at join (docs/drivers.md)
    and the pool's driver must install on the tainted node before smoke can run; a
    failed round later leaves the node in its pool, so the driver stays."""
    (obj,) = _driver_objects(cli)
    ds, _ = smoke(cli)
    overlay = _values(cli, "--gpu-operator-values")
    operator = [c for c in gpu_operator(overlay) if c.name != "nvidia-driver-daemonset"]
    join = {"gpu-pool": "training-hopper"}
    driver = pool_driver(obj)
    done = walk([*operator, driver, ds], joining_node(join, facts=set()), {"nvidia": "nvidia"})
    assert done.admitted, done.blocked
    _before(done, driver.name, "nvidia-container-toolkit-daemonset", "buildmatrix-smoke")
    # the same object without its toleration: the driver never comes, nor admission
    bare = {**obj, "spec": {k: v for k, v in obj["spec"].items() if k != "tolerations"}}
    stuck = walk(
        [*operator, pool_driver(bare), ds], joining_node(join, facts=set()), {"nvidia": "nvidia"}
    )
    assert not stuck.admitted
    assert stuck.blocked[driver.name] == TAINTED
    # a failed round (a registry outage fails every node of the pool at once): the
    # node is tainted again, and the driver's DaemonSet still selects it
    patch, _ = plan(
        done.node.obj,
        passed=False,
        labels={"buildmatrix.io/smoke": "failed"},
        report="",
        gfd_keys=GfdKeys.AUTO,
    )
    for key, value in patch["metadata"]["labels"].items():
        if value is None:
            done.node.labels.pop(key, None)
        else:
            done.node.labels[key] = value
    done.node.obj["spec"]["taints"] = patch["spec"]["taints"]
    assert done.node.labels["gpu-pool"] == "training-hopper"
    assert driver.daemonset is not None
    assert should_run(driver.daemonset, done.node.obj) == (True, "fits")


# --- NFD-only cluster, driver and toolkit on the host ---------------------------------

HOST = {"driver", "runtime:nvidia"}


def test_nfd_only_cluster(cli: CliRunner) -> None:
    ds, classes = smoke(cli, "--runtime-class")
    assert classes == {"nvidia": "nvidia"}
    stuck = walk([*standalone_nfd({}), ds], joining_node({}, facts=HOST), classes)
    assert not stuck.admitted
    assert stuck.blocked["nfd-worker"] == TAINTED
    assert "does not match" in stuck.blocked["buildmatrix-smoke"]
    overlay = _values(cli, "--nfd-values")
    done = walk([*standalone_nfd(overlay), ds], joining_node({}, facts=HOST), classes)
    assert done.admitted, done.blocked
    assert done.steps == ["nfd-worker", "buildmatrix-smoke"]
    # NFD's default deviceLabelFields name the label after class and vendor: the
    # DaemonSet must select that one too, not only the GPU Operator's pci-10de
    assert done.node.labels["feature.node.kubernetes.io/pci-0302_10de.present"] == "true"
    assert "feature.node.kubernetes.io/pci-10de.present" not in done.node.labels


def test_nfd_only_cluster_needs_the_runtime_class(cli: CliRunner) -> None:
    ds, classes = smoke(cli)  # no --runtime-class: nobody creates RuntimeClass nvidia
    assert classes == {}
    overlay = _values(cli, "--nfd-values")
    stuck = walk([*standalone_nfd(overlay), ds], joining_node({}, facts=HOST), classes)
    assert not stuck.admitted
    assert (
        stuck.blocked["buildmatrix-smoke"]
        == "RuntimeClass nvidia does not exist: the Pod is rejected"
    )


def test_provisioner_label_admits_without_nfd(cli: CliRunner) -> None:
    """kubelet --node-labels beside --register-with-taints (or a Karpenter NodePool's
    labels beside startupTaints): smoke's DaemonSet selects the node from the start,
    whatever NFD does."""
    ds, classes = smoke(cli, "--runtime-class", "--node-selector", SELECTOR)
    join = {"example.com/gpu-node": "true"}
    done = walk([*standalone_nfd({}), ds], joining_node(join, facts=HOST), classes)
    assert done.admitted, done.blocked
    # smoke first; NFD's worker, which does not tolerate the taint, only once it is gone
    assert done.steps == ["buildmatrix-smoke", "nfd-worker"]
    # a node without the label (and no NFD label) is not selected
    stuck = walk([*standalone_nfd({}), ds], joining_node({}, facts=HOST), classes)
    assert not stuck.admitted


def test_the_daemonset_skips_nodes_without_a_gpu(cli: CliRunner) -> None:
    ds, _ = smoke(cli, "--node-selector", SELECTOR)
    cpu = {
        "metadata": {"name": "cpu-1", "labels": {"kubernetes.io/os": "linux"}},
        "spec": {"taints": []},
    }
    assert not should_run(ds.daemonset or {}, cpu)[0]
