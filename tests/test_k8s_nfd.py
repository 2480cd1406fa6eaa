"""``k8s manifests --mode nfd``: admission with no Kubernetes API rights in the agent.

The rendered objects are validated offline (kubernetes-validate for the core kinds,
NFD's own NodeFeatureRule CRD schema for the rule), and the admission is walked
through with the real ``smoke --nfd-file`` writing the feature file and a stand-in
of NFD's worker and master (tests/nfd_standin.py, each step citing NFD's source)
deciding labels and taints.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from buildmatrix.labelkeys import TAINT_EFFECT, TAINT_KEY
from tests.conftest import REPO, CliRunner, validate
from tests.nfd_standin import (
    TAINTS_ANNOTATION,
    parse_feature_file,
    published_labels,
    rule_matches,
    set_taints,
)
from tests.standins import run_cli

NODES = REPO / "tests" / "fixtures" / "nodes"
CRD = REPO / "tests" / "fixtures" / "crds" / "nfd-nodefeaturerule.yaml"
K8S_VERSION = "1.34.0"
OURS = {"key": TAINT_KEY, "effect": TAINT_EFFECT}
H100 = {"vendor": "10de", "class": "0302", "device": "2330"}
NVSWITCH = {"vendor": "10de", "class": "0680", "device": "22a3"}
NIC = {"vendor": "15b3", "class": "0207", "device": "1021"}


def rendered(cli: CliRunner, *args: str) -> list[Any]:
    result = cli("k8s", "manifests", "--mode", "nfd", *args)
    assert result.code == 0, result.err
    return [d for d in yaml.safe_load_all(result.out) if d]


def test_the_agent_has_no_api_rights(cli: CliRunner) -> None:
    docs = rendered(cli)
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Namespace", "ResourceQuota", "NodeFeatureRule", "ConfigMap", "DaemonSet"]
    for d in docs:  # no role of any kind, no binding, no token: no verb on nodes
        assert "Role" not in d["kind"] and "Binding" not in d["kind"]
    pod = docs[-1]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod
    script = pod["containers"][0]["command"][-1]
    assert "--apply" not in script
    assert "--nfd-file /etc/kubernetes/node-feature-discovery/features.d/buildmatrix" in script
    (mount,) = [v for v in pod["volumes"] if v["name"] == "features-d"]
    assert mount["hostPath"]["path"] == "/etc/kubernetes/node-feature-discovery/features.d"


def test_objects_validate_offline(cli: CliRunner) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = rendered(cli)
    for d in docs:
        if d["kind"] != "NodeFeatureRule":
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    (rule,) = [d for d in docs if d["kind"] == "NodeFeatureRule"]
    assert rule["apiVersion"] == f"{crd['spec']['group']}/{version['name']}"
    validate(rule, version["schema"]["openAPIV3Schema"])
    broken = copy.deepcopy(rule)
    broken["spec"]["rules"][0]["taints"][0]["effect"] = 7
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, version["schema"]["openAPIV3Schema"])


class Cluster:
    """One node, NFD's master and worker (stand-ins) and the real smoke agent."""

    def __init__(self, rule: Any, features_d: Path, devices: list[dict[str, str]]) -> None:
        self.rule = rule
        self.features_d = features_d
        self.devices = devices
        self.node: Any = {"metadata": {"labels": {}, "annotations": {}}, "spec": {"taints": []}}

    def nfd_pass(self) -> None:
        """The worker publishes the node's features; the master applies the rules."""
        local: dict[str, str] = {}
        now = datetime.now(UTC)
        for f in sorted(self.features_d.iterdir()):
            if not f.name.startswith("."):
                local |= parse_feature_file(f.read_text(), now=now)
        features = {"pci.device": self.devices, "local.label": local}
        taints: list[dict[str, str]] = []
        for r in self.rule["spec"]["rules"]:
            if rule_matches(r, features):
                taints += r["taints"]
        self.node["metadata"]["labels"] = published_labels(local)
        set_taints(self.node, taints)

    @property
    def tainted(self) -> bool:
        return OURS in self.node["spec"]["taints"]


def _smoke(cli: CliRunner, features_d: Path, fixture: str) -> int:
    return cli(
        "smoke",
        "--snapshot",
        str(NODES / f"{fixture}.json"),
        "--pools",
        str(NODES / "pools.yaml"),
        "--nfd-file",
        str(features_d / "buildmatrix"),
    ).code


@pytest.fixture
def rule(cli: CliRunner) -> Any:
    return next(d for d in rendered(cli) if d["kind"] == "NodeFeatureRule")


def test_a_gpu_node_is_tainted_until_smoke_passes_and_again_when_it_fails(
    cli: CliRunner, rule: Any, tmp_path: Path
) -> None:
    cluster = Cluster(rule, tmp_path, [H100, NVSWITCH, NIC])
    cluster.node["spec"]["taints"] = [OURS]  # registered with the taint (kubelet)
    cluster.nfd_pass()  # NFD sees it unverified: the taint becomes NFD's
    assert cluster.tainted
    assert TAINTS_ANNOTATION in cluster.node["metadata"]["annotations"]
    assert _smoke(cli, tmp_path, "h100-535") == 0
    cluster.nfd_pass()
    assert not cluster.tainted
    labels = cluster.node["metadata"]["labels"]
    assert labels["buildmatrix.io/smoke"] == "passed"
    assert labels["feature.node.kubernetes.io/gpu-pool"] == "training-hopper"  # NFD's prefix
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert _smoke(cli, tmp_path, "h100-520") == 1  # a driver below Hopper's floor
    cluster.nfd_pass()
    assert cluster.tainted
    assert cluster.node["metadata"]["labels"] == {"buildmatrix.io/smoke": "failed"}


def test_a_node_joining_untainted_is_tainted_at_its_first_nfd_pass(
    cli: CliRunner, rule: Any, tmp_path: Path
) -> None:
    cluster = Cluster(rule, tmp_path, [H100])
    cluster.nfd_pass()
    assert cluster.tainted
    other = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    cluster.node["spec"]["taints"].append(other)  # someone else's taint
    assert _smoke(cli, tmp_path, "h100-535") == 0
    cluster.nfd_pass()
    assert cluster.node["spec"]["taints"] == [other]


def test_nodes_without_an_nvidia_gpu_are_never_tainted(rule: Any, tmp_path: Path) -> None:
    for devices in ([NIC], [NVSWITCH, NIC], []):
        cluster = Cluster(rule, tmp_path, devices)
        cluster.nfd_pass()
        assert not cluster.tainted, devices


def test_smoke_that_cannot_read_nvml_keeps_the_taint(
    cli: CliRunner, rule: Any, tmp_path: Path
) -> None:
    """No libnvidia-ml on the node (a fresh process without it): the agent writes
    ``failed`` over an earlier ``passed``, and NFD taints the node again."""
    features_d = tmp_path / "features.d"
    features_d.mkdir()
    cluster = Cluster(rule, features_d, [H100])
    assert _smoke(cli, features_d, "h100-535") == 0
    cluster.nfd_pass()
    assert not cluster.tainted
    proc = run_cli(
        ["smoke", "--nfd-file", str(features_d / "buildmatrix")], libs=None, tmp=tmp_path
    )
    assert proc.returncode == 3, proc.stderr
    cluster.nfd_pass()
    assert cluster.tainted
    assert cluster.node["metadata"]["labels"] == {"buildmatrix.io/smoke": "failed"}


def test_a_stale_verdict_expires(cli: CliRunner, rule: Any, tmp_path: Path) -> None:
    """An agent that stopped: its file's expiry passes, the labels go, the taint returns."""
    assert _smoke(cli, tmp_path, "h100-535") == 0
    text = (tmp_path / "buildmatrix").read_text()
    assert "# +expiry-time=" in text
    later = datetime(2999, 1, 1, tzinfo=UTC)
    assert parse_feature_file(text, now=later) == {}
    cluster = Cluster(rule, tmp_path, [H100])
    cluster.nfd_pass()
    assert not cluster.tainted
    features = {"pci.device": [H100], "local.label": parse_feature_file(text, now=later)}
    assert all(rule_matches(r, features) for r in rule["spec"]["rules"])


@pytest.mark.parametrize(
    ("flag", "path"),
    [("--nfd-values", ()), ("--gpu-operator-values", ("node-feature-discovery",))],
)
def test_the_values_overlays_turn_on_nfd_taints(
    cli: CliRunner, flag: str, path: tuple[str, ...]
) -> None:
    """nfd-master sets taints only with -enable-taints (chart value master.enableTaints,
    default false in NFD's values.yaml); the worker tolerations stay in the overlay."""
    for mode, want in (("nfd", True), ("apply", None)):
        result = cli("k8s", "manifests", "--mode", mode, flag, "--format", "json")
        assert result.code == 0, result.err
        values = result.json()
        for key in path:
            values = values[key]
        assert values.get("master", {}).get("enableTaints") == want, mode
        assert {"key": TAINT_KEY, "operator": "Exists", "effect": TAINT_EFFECT} in values["worker"][
            "tolerations"
        ]


@pytest.mark.parametrize(
    ("given", "rendered_mode"), [((), "never"), (("--gfd-keys", "always"), "always")]
)
def test_gfds_keys_stay_gfds_unless_asked(
    cli: CliRunner, tmp_path: Path, given: tuple[str, ...], rendered_mode: str
) -> None:
    """With no Node to read, smoke's auto cannot see GFD, and a feature file with GFD's
    keys would be a second source of them for nfd-master: NFD mode renders
    --gfd-keys never unless always is asked for, and the real smoke with the rendered
    flag writes GFD's keys only then."""
    r = cli("k8s", "manifests", "--mode", "nfd", *given)
    assert r.code == 0, r.err
    (ds,) = [d for d in yaml.safe_load_all(r.out) if d and d["kind"] == "DaemonSet"]
    script = ds["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert f"--gfd-keys {rendered_mode}" in script
    features = tmp_path / "buildmatrix"
    snapshot = str(NODES / "h100-535.json")
    args = (
        "--snapshot",
        snapshot,
        "--pools",
        str(NODES / "pools.yaml"),
        "--nfd-file",
        str(features),
    )
    assert cli("smoke", *args, "--gfd-keys", rendered_mode).code == 0
    labels = parse_feature_file(features.read_text(), now=datetime.now(UTC))
    assert labels["buildmatrix.io/smoke"] == "passed"
    assert ("nvidia.com/gpu.product" in labels) is (rendered_mode == "always")
