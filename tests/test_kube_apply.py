"""``smoke --apply``: the real ``kubernetes`` client against a STAND-IN API server
(tests/kube_standin.py, which says what of the kube-apiserver it reproduces)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.node.apply import REPORT_ANNOTATION, TAINT_KEY, plan
from tests.conftest import REPO, CliRunner
from tests.kube_standin import ApiStandIn, PatchError, apply_patch

NODES = REPO / "tests" / "fixtures" / "nodes"
POOLS = str(NODES / "pools.yaml")
ADMISSION = {"key": TAINT_KEY, "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[ApiStandIn, Path]]:
    standin = ApiStandIn(tokens={"smoke": {"get", "patch"}, "reader": {"get"}, "nobody": set()})
    standin.add_node(
        "gpu-1",
        labels={"kubernetes.io/hostname": "gpu-1", "team": "ml"},
        taints=[ADMISSION, GPU_TAINT],
    )
    server, url = standin.serve()
    try:
        yield standin, standin.kubeconfig(tmp_path / "kubeconfig", url, "smoke")
    finally:
        server.shutdown()


def _smoke(cli: CliRunner, kubeconfig: Path, node: str, *args: str) -> tuple[int, Any]:
    r = cli(
        "smoke",
        "--snapshot",
        str(NODES / f"{node}.json"),
        "--apply",
        "--node",
        "gpu-1",
        "--kubeconfig",
        str(kubeconfig),
        "--json",
        *args,
    )
    return r.code, json.loads(r.out) if r.out.strip() else r.err


def _node(standin: ApiStandIn) -> Any:
    return standin.nodes["gpu-1"]


def test_pass_labels_the_node_and_removes_only_the_admission_taint(
    cli: CliRunner, api: tuple[ApiStandIn, Path]
) -> None:
    standin, kubeconfig = api
    code, doc = _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS)
    assert code == 0, doc
    node = _node(standin)
    assert node["spec"]["taints"] == [GPU_TAINT]
    labels = node["metadata"]["labels"]
    assert labels["gpu-pool"] == "training-hopper"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert labels["buildmatrix.io/smoke"] == "passed"
    assert labels["team"] == "ml"  # another controller's label stays
    assert doc["applied"]["taint"] == "removed"
    # one GET and one strategic merge patch, with the resourceVersion precondition
    assert [(m, t) for m, _, t in standin.requests] == [
        ("GET", ""),
        ("PATCH", "application/strategic-merge-patch+json"),
    ]


def test_fail_keeps_the_taint_and_says_why(cli: CliRunner, api: tuple[ApiStandIn, Path]) -> None:
    standin, kubeconfig = api
    code, doc = _smoke(cli, kubeconfig, "h100-520")  # driver below Hopper's R525
    assert code == 1
    node = _node(standin)
    assert node["spec"]["taints"] == [ADMISSION, GPU_TAINT]
    assert node["metadata"]["labels"]["buildmatrix.io/smoke"] == "failed"
    assert "driver 520.61.05 is too old" in node["metadata"]["annotations"][REPORT_ANNOTATION]
    assert doc["applied"]["taint"] == "kept"


def test_fail_adds_the_taint_to_an_admitted_node_and_drops_its_pool(
    cli: CliRunner, api: tuple[ApiStandIn, Path]
) -> None:
    """Re-run later, a node whose GPU degraded is tainted again and loses the labels
    that selected it."""
    standin, kubeconfig = api
    assert _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS)[0] == 0
    code, doc = _smoke(cli, kubeconfig, "h100-ecc", "--pools", POOLS)
    assert code == 1
    node = _node(standin)
    assert node["spec"]["taints"] == [GPU_TAINT, ADMISSION]
    labels = node["metadata"]["labels"]
    assert "gpu-pool" not in labels
    assert "nvidia.com/gpu.family" not in labels
    assert labels["buildmatrix.io/smoke"] == "failed"
    assert labels["team"] == "ml"
    assert doc["applied"]["taint"] == "added"
    # and passing again clears the report
    assert _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS)[0] == 0
    assert REPORT_ANNOTATION not in _node(standin)["metadata"]["annotations"]


def test_a_pool_change_removes_the_old_pool_and_family_labels(
    cli: CliRunner, api: tuple[ApiStandIn, Path]
) -> None:
    standin, kubeconfig = api
    assert _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS)[0] == 0
    code, doc = _smoke(cli, kubeconfig, "a100-80gb", "--pools", POOLS)
    assert code == 0, doc
    labels = _node(standin)["metadata"]["labels"]
    assert labels["nvidia.com/gpu.family"] == "ampere"
    assert labels["gpu-pool"] != "training-hopper"
    # a buildmatrix label the new verdict does not have is removed, not left stale
    assert _smoke(cli, kubeconfig, "a100-80gb")[0] == 0
    assert "gpu-pool" not in _node(standin)["metadata"]["labels"]


def test_a_taint_added_between_get_and_patch_survives(
    cli: CliRunner, api: tuple[ApiStandIn, Path]
) -> None:
    """Another controller taints the node after smoke read it: the first patch is
    refused (409), smoke reads again, and both taints end up right."""
    standin, kubeconfig = api
    maintenance = {"key": "example.com/maintenance", "effect": "NoExecute"}

    def other_controller(s: ApiStandIn, name: str) -> None:
        s.write(name, lambda n: n["spec"]["taints"].append(maintenance))

    standin.between_get_and_patch = other_controller
    code, doc = _smoke(cli, kubeconfig, "h100-535")
    assert code == 0, doc
    assert _node(standin)["spec"]["taints"] == [GPU_TAINT, maintenance]
    assert standin.conflicts == 1
    assert doc["applied"]["attempts"] == 2


def test_no_gfd_keys_leaves_gfds_labels_alone(cli: CliRunner, api: tuple[ApiStandIn, Path]) -> None:
    standin, kubeconfig = api
    standin.write("gpu-1", lambda n: n["metadata"]["labels"].update({"nvidia.com/gpu.family": "x"}))
    code, _ = _smoke(cli, kubeconfig, "h100-520", "--no-gfd-keys")
    assert code == 1
    assert _node(standin)["metadata"]["labels"]["nvidia.com/gpu.family"] == "x"
    # without the flag, buildmatrix owns the key and a failed node loses it
    _smoke(cli, kubeconfig, "h100-520")
    assert "nvidia.com/gpu.family" not in _node(standin)["metadata"]["labels"]


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("reader", "not allowed to patch nodes (403)"),
        ("nobody", "not allowed to get nodes (403)"),
        ("stranger", "refused the credentials (401)"),
    ],
)
def test_refused_credentials_exit_3_and_change_nothing(
    cli: CliRunner, api: tuple[ApiStandIn, Path], tmp_path: Path, token: str, message: str
) -> None:
    standin, kubeconfig = api
    server = json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    other = standin.kubeconfig(tmp_path / f"{token}.kubeconfig", server, token)
    before = json.dumps(_node(standin))
    code, err = _smoke(cli, other, "h100-535")
    assert code == 3
    assert message in str(err)
    assert json.dumps(_node(standin)) == before  # still tainted, unlabelled


def test_unknown_node_and_unreachable_server_exit_3(
    cli: CliRunner, api: tuple[ApiStandIn, Path], tmp_path: Path
) -> None:
    standin, kubeconfig = api
    r = cli(
        "smoke",
        "--snapshot",
        str(NODES / "h100-535.json"),
        "--apply",
        "--node",
        "nope",
        "--kubeconfig",
        str(kubeconfig),
    )
    assert r.code == 3
    assert "node 'nope' does not exist (404)" in r.err
    down = standin.kubeconfig(tmp_path / "down", "http://127.0.0.1:9", "smoke")
    r = cli(
        "smoke",
        "--snapshot",
        str(NODES / "h100-535.json"),
        "--apply",
        "--node",
        "gpu-1",
        "--kubeconfig",
        str(down),
    )
    assert r.code == 3
    assert "cannot be reached" in r.err


def test_apply_needs_a_node_name(cli: CliRunner, tmp_path: Path) -> None:
    r = cli("smoke", "--snapshot", str(NODES / "h100-535.json"), "--apply")
    assert r.code == 2
    assert "--apply needs the Node's name" in r.err


def test_plan_is_idempotent() -> None:
    """A node already in the passed state needs no write at all."""
    node = {
        "metadata": {
            "name": "n",
            "resourceVersion": "7",
            "labels": {"buildmatrix.io/smoke": "passed"},
        },
        "spec": {"taints": [GPU_TAINT]},
    }
    body, applied = plan(
        node, passed=True, labels={"buildmatrix.io/smoke": "passed"}, report="", gfd_keys=True
    )
    assert body == {}
    assert applied.taint == "absent"


def test_the_standin_patches_as_the_api_server_does() -> None:
    node = {"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"taints": [ADMISSION]}}
    smp = apply_patch(
        node,
        {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"taints": [GPU_TAINT]}},
        "application/strategic-merge-patch+json",
    )
    assert smp["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert smp["spec"]["taints"] == [GPU_TAINT]  # no merge key: the list is replaced
    jp = apply_patch(
        node,
        [
            {"op": "test", "path": "/spec/taints/0/key", "value": TAINT_KEY},
            {"op": "remove", "path": "/spec/taints/0"},
            {"op": "add", "path": "/metadata/labels/x~1y", "value": "z"},
        ],
        "application/json-patch+json",
    )
    assert jp["spec"]["taints"] == []
    assert jp["metadata"]["labels"]["x/y"] == "z"
    with pytest.raises(PatchError):
        apply_patch(
            node,
            [{"op": "test", "path": "/spec/taints/0/key", "value": "other"}],
            "application/json-patch+json",
        )
    mp = apply_patch(node, {"metadata": {"labels": None}}, "application/merge-patch+json")
    assert "labels" not in mp["metadata"]
