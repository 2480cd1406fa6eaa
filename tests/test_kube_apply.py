"""``smoke --apply``: the real ``kubernetes`` client against a STAND-IN API server
(tests/kube_standin.py, which says what of the kube-apiserver it reproduces)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmatrix.k8s import render
from buildmatrix.k8s_daemonset import Settings
from buildmatrix.labelkeys import REPORT_ANNOTATION, TAINT_KEY, GfdKeys
from buildmatrix.node.apply import plan
from buildmatrix.node.verdict_place import DEADLINE_THREAD
from buildmatrix.profile_files import load_profiles
from tests.admission_policy import UserInfo
from tests.conftest import REPO, SHIPPED_PROFILES, CliRunner
from tests.kube_standin import ApiStandIn, Certificate, PatchError, apply_patch, self_signed
from tests.pod_standin import PodWouldNotStart, one_round, run_once
from tests.pool_registry import FITS_HOPPER, SM80_ONLY, push, registry_secret
from tests.services import Registry
from tests.standins import nvml_scenario, run_cli

NODES = REPO / "tests" / "fixtures" / "nodes"
POOLS = str(NODES / "pools.yaml")
ADMISSION = {"key": TAINT_KEY, "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


AGENT = "system:serviceaccount:buildmatrix:buildmatrix-smoke"


def agent_policy(gfd_keys: GfdKeys = GfdKeys.AUTO) -> Any:
    """The ValidatingAdmissionPolicy exactly as ``k8s manifests`` renders it."""
    settings = Settings(image="buildmatrix", gfd_keys=gfd_keys)
    objects = render(settings, load_profiles(SHIPPED_PROFILES))
    (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    return policy


def standin_with_nodes() -> ApiStandIn:
    """The stand-in API server with the agent's policy, the agent's token bound to
    the node gpu-1 (its Pod runs there)."""
    standin = ApiStandIn(
        tokens={"smoke": {"get", "patch"}, "reader": {"get"}, "nobody": set()},
        identities={
            "smoke": UserInfo(AGENT, {"authentication.kubernetes.io/node-name": ["gpu-1"]})
        },
        policies=[agent_policy()],
    )
    standin.add_node(
        "gpu-1",
        labels={"kubernetes.io/hostname": "gpu-1", "team": "ml"},
        taints=[ADMISSION, GPU_TAINT],
    )
    standin.add_node("gpu-2", labels={"kubernetes.io/hostname": "gpu-2"}, taints=[ADMISSION])
    return standin


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[ApiStandIn, Path]]:
    """:func:`standin_with_nodes` served, and the agent's kubeconfig for it."""
    standin = standin_with_nodes()
    server, url = standin.serve()
    try:
        yield standin, standin.kubeconfig(tmp_path / "kubeconfig", url, "smoke")
    finally:
        server.shutdown()
        server.server_close()


def _smoke(
    cli: CliRunner, kubeconfig: Path, node: str, *args: str, on: str = "gpu-1"
) -> tuple[int, Any]:
    r = cli(
        "smoke",
        "--snapshot",
        str(NODES / f"{node}.json"),
        "--apply",
        "--node",
        on,
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


def test_fail_adds_the_taint_to_an_admitted_node_and_keeps_its_pool(
    cli: CliRunner, api: tuple[ApiStandIn, Path]
) -> None:
    """Re-run later, a node whose GPU degraded is tainted again and loses the labels
    smoke gave it, all but its pool: ``gpu-pool`` also selects the pool's driver
    (``k8s drivers``), which the next round needs to pass."""
    standin, kubeconfig = api
    assert _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS)[0] == 0
    code, doc = _smoke(cli, kubeconfig, "h100-ecc", "--pools", POOLS)
    assert code == 1
    node = _node(standin)
    assert node["spec"]["taints"] == [GPU_TAINT, ADMISSION]
    labels = node["metadata"]["labels"]
    assert labels["gpu-pool"] == "training-hopper"
    assert "gpu-pool" not in doc["applied"]["labels_removed"]
    assert "nvidia.com/gpu.family" not in labels
    assert "nvidia.com/gpu.compute-capability" not in labels
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


# What GPU Feature Discovery writes on an 8 x H100 node whose GPUs are shared by
# time-slicing (4 replicas), key by key as NVIDIA/k8s-device-plugin labels it:
# internal/lm/resource.go baseLabeler (product with the -SHARED suffix, count,
# replicas, sharing-strategy), NewGPUResourceLabeler (memory), newArchitectureLabels
# (family, compute.*), internal/lm/nvml.go newVersionLabeler (cuda.driver.*,
# cuda.driver-version.*, cuda.runtime-version.*), mig.capable, mps.capable, gpu.mode,
# internal/lm/machine-type.go (gpu.machine), internal/lm/timestamp.go
# NewTimestampLabeler (gfd.timestamp).
GFD_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/cuda.driver.major": "535",
    "nvidia.com/cuda.driver.minor": "104",
    "nvidia.com/cuda.driver.rev": "05",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "2",
    "nvidia.com/cuda.driver-version.major": "535",
    "nvidia.com/cuda.driver-version.minor": "104",
    "nvidia.com/cuda.driver-version.revision": "05",
    "nvidia.com/cuda.driver-version.full": "535.104.05",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "2",
    "nvidia.com/cuda.runtime-version.full": "12.2",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mps.capable": "false",
    "nvidia.com/gpu.mode": "compute",
    "nvidia.com/gpu.machine": "PowerEdge-XE9680",
    "nvidia.com/gfd.timestamp": "1764590400",
}
# The keys buildmatrix writes beside GFD's (docs/smoke.md, the label table).
BUILDMATRIX_KEYS = {
    "buildmatrix.io/gpu.compute-capability",
    "buildmatrix.io/gpu.memory-mb",
    "nvidia.com/gpu.compute-capability",  # the seed's names, written for the transition
    "nvidia.com/gpu.memory-mb",
    "buildmatrix.io/smoke",
    "buildmatrix.io/driver-floor",
    "buildmatrix.io/driver.major",
    "buildmatrix.io/driver.minor",
    "buildmatrix.io/driver.revision",
    "buildmatrix.io/driver.version",
    "gpu-pool",
}


def _gfd_node(standin: ApiStandIn) -> None:
    standin.write("gpu-1", lambda n: n["metadata"]["labels"].update(GFD_LABELS))


@pytest.mark.parametrize("flags", [(), ("--gfd-keys", "auto")], ids=["default", "auto"])
def test_gfds_keys_are_untouched_on_pass_and_fail_where_gfd_labels(
    cli: CliRunner, api: tuple[ApiStandIn, Path], flags: tuple[str, ...]
) -> None:
    """A node GFD labels (its timestamp label is there): a pass, a fail, and a pass
    again leave every key GFD wrote exactly as it was, -SHARED product included;
    buildmatrix sets and removes only its own keys."""
    standin, kubeconfig = api
    _gfd_node(standin)
    for fixture, code_wanted in (("h100-535", 0), ("h100-ecc", 1), ("h100-535", 0)):
        before = dict(_node(standin)["metadata"]["labels"])
        code, doc = _smoke(cli, kubeconfig, fixture, "--pools", POOLS, *flags)
        assert code == code_wanted, doc
        labels = _node(standin)["metadata"]["labels"]
        assert {k: labels.get(k) for k in GFD_LABELS} == GFD_LABELS
        assert labels["team"] == "ml"
        changed = {k for k in {*before, *labels} if before.get(k) != labels.get(k)}
        assert changed <= BUILDMATRIX_KEYS, changed
        assert doc["applied"]["gfd_keys"] == "left to GPU Feature Discovery"
        assert not set(doc["labels"]) & set(GFD_LABELS)  # the report says what was written
    assert labels["buildmatrix.io/smoke"] == "passed"
    assert labels["buildmatrix.io/gpu.compute-capability"] == "9.0"
    assert labels["nvidia.com/gpu.compute-capability"] == "9.0"


def test_without_nvml_gfds_keys_stay_and_the_taint_stays(
    api: tuple[ApiStandIn, Path], tmp_path: Path
) -> None:
    """A new process with no NVML library at all (a node whose driver is not there
    yet): exit 3, the node marked failed and tainted, GFD's keys as GFD wrote them."""
    from tests.standins import run_cli

    standin, kubeconfig = api
    _gfd_node(standin)
    args = ["smoke", "--apply", "--node", "gpu-1", "--kubeconfig", str(kubeconfig), "--json"]
    done = run_cli(args, libs=None, tmp=tmp_path)
    assert done.returncode == 3, done.stderr
    node = _node(standin)
    labels = node["metadata"]["labels"]
    assert {k: labels.get(k) for k in GFD_LABELS} == GFD_LABELS
    assert labels["buildmatrix.io/smoke"] == "failed"
    assert ADMISSION in node["spec"]["taints"]


def test_fail_removes_only_what_buildmatrix_wrote(
    cli: CliRunner, api: tuple[ApiStandIn, Path]
) -> None:
    """Without GFD (no timestamp) auto writes GFD's keys, so a failed node loses them;
    keys of GFD's that buildmatrix never writes (replicas, gpu.mode) stay all the same."""
    standin, kubeconfig = api
    others = {"nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.mode": "compute"}
    standin.write("gpu-1", lambda n: n["metadata"]["labels"].update(others))
    code, doc = _smoke(cli, kubeconfig, "h100-535")
    assert code == 0, doc
    assert doc["applied"]["gfd_keys"] == "written"
    assert _node(standin)["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert _smoke(cli, kubeconfig, "h100-ecc")[0] == 1
    labels = _node(standin)["metadata"]["labels"]
    assert "nvidia.com/gpu.product" not in labels
    assert labels == {"kubernetes.io/hostname": "gpu-1", "team": "ml", **others} | {
        "buildmatrix.io/smoke": "failed"
    }


def test_always_writes_gfds_keys_even_beside_gfd(
    cli: CliRunner, api: tuple[ApiStandIn, Path]
) -> None:
    standin, kubeconfig = api
    _gfd_node(standin)
    # Deployed with the default (auto), the policy refuses the agent GFD's keys here.
    code, doc = _smoke(cli, kubeconfig, "h100-535", "--gfd-keys", "always")
    assert code == 3
    assert "may only change the labels buildmatrix owns" in doc
    standin.policies = [agent_policy(GfdKeys.ALWAYS)]  # k8s manifests --gfd-keys always
    code, doc = _smoke(cli, kubeconfig, "h100-535", "--gfd-keys", "always")
    assert code == 0, doc
    labels = _node(standin)["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # -SHARED overwritten
    assert labels["nvidia.com/gpu.replicas"] == "4"  # never buildmatrix's
    assert labels["nvidia.com/gfd.timestamp"] == GFD_LABELS["nvidia.com/gfd.timestamp"]


def test_no_gfd_keys_contradicting_gfd_keys_is_bad_input(cli: CliRunner) -> None:
    snapshot = str(NODES / "h100-535.json")
    r = cli("labels", "--snapshot", snapshot, "--no-gfd-keys", "--gfd-keys", "always")
    assert r.code == 2
    assert "contradict" in r.err
    r = cli("labels", "--snapshot", snapshot, "--gfd-keys", "never")
    assert r.code == 0
    assert "nvidia.com/gpu.product" not in json.loads(r.out)["labels"]


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


def test_over_tls_the_kubeconfigs_ca_is_trusted_and_no_other(
    cli: CliRunner, tls_api: tuple[ApiStandIn, str, Certificate], tmp_path: Path
) -> None:
    """A real API server speaks only HTTPS: the server is trusted through the CA the
    kubeconfig carries; without it the client refuses the server, exit 3, and the
    node is not touched."""
    standin, url, cert = tls_api
    untrusted = standin.kubeconfig(tmp_path / "untrusted", url, "smoke")
    before = json.dumps(_node(standin))
    code, err = _smoke(cli, untrusted, "h100-535")
    assert code == 3
    assert "cannot be reached" in str(err) and "CERTIFICATE_VERIFY_FAILED" in str(err)
    assert "not signed by a CA the client trusts (the system's trust store)" in str(err)
    assert json.dumps(_node(standin)) == before
    other = self_signed(tmp_path / "other-ca")  # a CA, but not the server's
    wrong = standin.kubeconfig(tmp_path / "wrong", url, "smoke", ca=other.cert)
    code, err = _smoke(cli, wrong, "h100-535")
    assert code == 3
    assert "not signed by a CA the client trusts (the CA in " in str(err)
    # the right CA, the wrong name: the certificate names 127.0.0.1, not localhost
    by_name = url.replace("127.0.0.1", "localhost")
    mismatch = standin.kubeconfig(tmp_path / "mismatch", by_name, "smoke", ca=cert.cert)
    code, err = _smoke(cli, mismatch, "h100-535")
    assert code == 3
    assert "cannot be reached" in str(err) and "not signed" not in str(err)
    assert json.dumps(_node(standin)) == before
    trusted = standin.kubeconfig(tmp_path / "trusted", url, "smoke", ca=cert.cert)
    code, doc = _smoke(cli, trusted, "h100-535", "--pools", POOLS)
    assert code == 0, doc
    assert _node(standin)["spec"]["taints"] == [GPU_TAINT]
    assert _node(standin)["metadata"]["labels"]["gpu-pool"] == "training-hopper"


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
        node,
        passed=True,
        labels={"buildmatrix.io/smoke": "passed"},
        report="",
        gfd_keys=GfdKeys.AUTO,
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


# ------------------------------------------------------- fail closed, live (fast)
#
# The three ways a live node fails, each through the real probe in a new process
# (tests/standins): no libnvidia-ml at all, NVML's init answering
# NVML_ERROR_DRIVER_NOT_LOADED, and a check that fails (uncorrected ECC errors).
# Each must leave the admission taint on a node that joined with it, put it back on
# a node admitted before, and mark the node failed with the reason.


def _live_scenarios() -> dict[str, tuple[dict[str, Any] | None, bool, int, str]]:
    ecc = json.loads((NODES / "h100-ecc.json").read_text())
    return {  # name: (NVML scenario, stand-in libraries on the path, exit code, reason)
        "no-nvml": (None, False, 3, "NVML_ERROR_LIBRARY_NOT_FOUND"),
        "driver-not-loaded": (
            {"init": "NVML_ERROR_DRIVER_NOT_LOADED"},
            True,
            3,
            "the NVIDIA kernel driver is not loaded",
        ),
        "failing-check": (nvml_scenario(ecc), True, 1, "uncorrected ECC error(s)"),
    }


@pytest.mark.parametrize("admitted", [False, True], ids=["joined-tainted", "admitted-before"])
@pytest.mark.parametrize("scenario", list(_live_scenarios()))
def test_a_live_node_that_fails_is_tainted_and_marked_failed(
    cli: CliRunner,
    api: tuple[ApiStandIn, Path],
    standin_libs: Path,
    tmp_path: Path,
    scenario: str,
    admitted: bool,
) -> None:
    standin, kubeconfig = api
    nvml, with_libs, want, reason = _live_scenarios()[scenario]
    if admitted:
        assert _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS)[0] == 0
        assert _node(standin)["spec"]["taints"] == [GPU_TAINT]
    proc = run_cli(
        [
            *("smoke", "--apply", "--node", "gpu-1", "--kubeconfig", str(kubeconfig)),
            *("--pools", POOLS, "--json"),
        ],
        libs=standin_libs if with_libs else None,
        tmp=tmp_path,
        nvml=nvml,
    )
    assert proc.returncode == want, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "fail"
    assert doc["applied"]["taint"] == ("added" if admitted else "kept")
    node = _node(standin)
    assert ADMISSION in node["spec"]["taints"]
    assert GPU_TAINT in node["spec"]["taints"]
    labels = node["metadata"]["labels"]
    assert labels["buildmatrix.io/smoke"] == "failed"
    # the pool stays as it was (it selects the pool's driver: a failed round, with
    # the driver not loaded among them, must not take that away); nothing adds it
    assert labels.get("gpu-pool") == ("training-hopper" if admitted else None)
    assert "nvidia.com/gpu.family" not in labels
    assert labels["team"] == "ml"
    assert reason in node["metadata"]["annotations"][REPORT_ANNOTATION]


@pytest.mark.parametrize("admitted", [False, True], ids=["joined-tainted", "admitted-before"])
def test_a_round_that_hangs_marks_the_node_failed_at_its_deadline(
    cli: CliRunner,
    api: tuple[ApiStandIn, Path],
    standin_libs: Path,
    tmp_path: Path,
    admitted: bool,
) -> None:
    """NVML that never answers (a wedged GPU; the stand-in's init "hang"): when
    --deadline passes, the node is tainted and marked failed with the reason, and smoke
    exits 1, so a node admitted by an earlier round does not stay admitted; the NFD
    feature file gets the same mark."""
    standin, kubeconfig = api
    if admitted:
        assert _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS)[0] == 0
        assert ADMISSION not in _node(standin)["spec"]["taints"]
    features = tmp_path / "features.d" / "buildmatrix"
    features.parent.mkdir()
    proc = run_cli(
        [
            *("smoke", "--apply", "--node", "gpu-1", "--kubeconfig", str(kubeconfig)),
            *("--pools", POOLS, "--nfd-file", str(features), "--deadline", "1", "--json"),
        ],
        libs=standin_libs,
        tmp=tmp_path,
        nvml={"init": "hang"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert "the round did not finish within 1 s (--deadline)" in proc.stderr
    assert "node gpu-1 marked failed and tainted" in proc.stderr
    node = _node(standin)
    assert ADMISSION in node["spec"]["taints"]
    labels = node["metadata"]["labels"]
    assert labels["buildmatrix.io/smoke"] == "failed"
    assert labels.get("gpu-pool") == ("training-hopper" if admitted else None)
    assert "nvidia.com/gpu.family" not in labels
    assert "deadline" in node["metadata"]["annotations"][REPORT_ANNOTATION]
    assert "buildmatrix.io/smoke=failed" in features.read_text()


def test_a_round_within_its_deadline_is_unchanged(
    cli: CliRunner, api: tuple[ApiStandIn, Path]
) -> None:
    """The deadline's timer stops when the round concludes: the run in this process
    passes, and no timer is left to end the process later."""
    standin, kubeconfig = api
    code, doc = _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS, "--deadline", "600")
    assert code == 0, doc
    assert doc["verdict"] == "pass"
    assert ADMISSION not in _node(standin)["spec"]["taints"]
    for thread in threading.enumerate():
        if thread.name == DEADLINE_THREAD:
            thread.join(timeout=30)  # cancelled: it ends at once
            assert not thread.is_alive()


def test_a_deadline_whose_mark_fails_in_any_way_still_ends_the_process(tmp_path: Path) -> None:
    """The deadline's thread holds the lock the main thread waits for: whatever goes
    wrong while it writes the mark (here an error no reader raises), and even where
    what should end the process returns, the process ends (exit 3), not hangs."""
    script = f"""
import threading, time
from pathlib import Path
from buildmatrix.labelkeys import GfdKeys
from buildmatrix.node import verdict_place
def broken(path, labels):
    raise RuntimeError("no such luck")
verdict_place.write_nfd = broken
place = verdict_place.Place(
    api=None, node=None, nfd_file=Path({str(tmp_path / "f")!r}), gfd_keys=GfdKeys.AUTO
)
seen = []
deadline = verdict_place.Deadline(0.1, place, lambda message, code: seen.append(code))
while not deadline._lock.locked():  # the timer has fired and holds the lock
    time.sleep(0.01)
deadline.claim()  # the timer holds the lock: only its exit ends this
print("claimed", seen)
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "claimed" not in proc.stdout


def test_mark_failed_writes_only_the_failure_mark(
    cli: CliRunner, api: tuple[ApiStandIn, Path], tmp_path: Path
) -> None:
    """--mark-failed reads no GPU and writes the failure mark with its reason: an
    admitted node is tainted again; without a place to write, or with something to
    read, it is bad input."""
    standin, kubeconfig = api
    assert _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS)[0] == 0
    r = cli(
        *("smoke", "--apply", "--node", "gpu-1", "--kubeconfig", str(kubeconfig)),
        *("--mark-failed", "the round was killed by signal 9", "--json"),
    )
    assert r.code == 1, r.err
    doc = r.json()
    assert doc["verdict"] == "fail"
    assert [(c["name"], c["ok"], c["message"]) for c in doc["checks"]] == [
        ("round", False, "the round was killed by signal 9")
    ]
    node = _node(standin)
    assert ADMISSION in node["spec"]["taints"]
    assert node["metadata"]["labels"]["buildmatrix.io/smoke"] == "failed"
    assert node["metadata"]["labels"]["gpu-pool"] == "training-hopper"  # kept on fail
    assert "killed by signal 9" in node["metadata"]["annotations"][REPORT_ANNOTATION]
    r = cli("smoke", "--mark-failed", "x")
    assert r.code == 2
    assert "give --apply (the Node) or --nfd-file PATH" in r.err
    snapshot = str(NODES / "h100-535.json")
    r = cli(
        "smoke", "--snapshot", snapshot, "--nfd-file", str(tmp_path / "f"), "--mark-failed", "x"
    )
    assert r.code == 2
    assert "leave out --snapshot" in r.err
    assert not (tmp_path / "f").exists()


def test_a_round_the_oom_killer_ends_is_marked_failed_by_the_loop(
    cli: CliRunner, api: tuple[ApiStandIn, Path], tmp_path: Path
) -> None:
    """The DaemonSet's own loop, one round of it as rendered: smoke killed by SIGKILL
    (what the OOM killer sends; the shell sees 128 + 9) wrote nothing, so the loop
    runs smoke --mark-failed, which taints the admitted node and says why."""
    standin, kubeconfig = api
    assert _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS)[0] == 0
    r = cli("k8s", "manifests")
    assert r.code == 0, r.err
    (ds,) = [d for d in yaml.safe_load_all(r.out) if d and d["kind"] == "DaemonSet"]
    shell, flag, script = ds["spec"]["template"]["spec"]["containers"][0]["command"]
    round_ = one_round(script)
    shim = tmp_path / "bin" / "buildmatrix"
    shim.parent.mkdir()
    shim.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--mark-failed*) ;; *) kill -9 $$ ;; esac\n'
        f'PYTHONPATH="{REPO}" exec "{sys.executable}" -m buildmatrix "$@"\n'
    )
    shim.chmod(0o755)
    env = {
        "PATH": f"{shim.parent}:{os.environ['PATH']}",
        "NODE_NAME": "gpu-1",
        "KUBECONFIG": str(kubeconfig),
        "HOME": str(tmp_path),
    }
    proc = subprocess.run(
        [shell, flag, round_], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 128 + 9, proc.stdout + proc.stderr  # the round's smoke
    node = _node(standin)
    assert ADMISSION in node["spec"]["taints"]
    assert node["metadata"]["labels"]["buildmatrix.io/smoke"] == "failed"
    assert "the round was killed by signal 9" in node["metadata"]["annotations"][REPORT_ANNOTATION]


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5", "1e300"])
def test_a_deadline_that_is_no_time_is_bad_input(cli: CliRunner, value: str) -> None:
    r = cli("smoke", "--snapshot", str(NODES / "h100-535.json"), "--deadline", value)
    assert r.code == 2, r.out
    assert "Invalid value for '--deadline'" in r.err
    assert "Traceback" not in r.err


def test_a_pool_image_that_cannot_be_read_keeps_the_node_tainted(
    cli: CliRunner, api: tuple[ApiStandIn, Path], tmp_path: Path
) -> None:
    """Fail closed on an unreadable pool image too: exit 2, taint back on."""
    standin, kubeconfig = api
    assert _smoke(cli, kubeconfig, "h100-580", "--pools", POOLS)[0] == 0
    missing = f"oci:{tmp_path / 'gone'}"
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        (NODES / "pools.yaml").read_text()
        + f"pools:\n  training-hopper:\n    images: ['{missing}']\n"
    )
    code, doc = _smoke(cli, kubeconfig, "h100-580", "--pools", str(pools))
    assert code == 2
    assert doc["applied"]["taint"] == "added"
    node = _node(standin)
    assert ADMISSION in node["spec"]["taints"]
    assert node["metadata"]["labels"]["buildmatrix.io/smoke"] == "failed"
    assert (
        f"image {missing}: cannot be checked" in node["metadata"]["annotations"][REPORT_ANNOTATION]
    )


# ------------------------------- the DaemonSet's own command, pool images, credentials


@pytest.fixture
def pool_images(auth_registry: Registry, tmp_path: Path) -> dict[str, str]:
    return {
        "fits": push(auth_registry, FITS_HOPPER, "bmtest/pool:hopper", tmp_path),
        "sm80": push(auth_registry, SM80_ONLY, "bmtest/pool:sm80", tmp_path),
    }


def _render(cli: CliRunner, tmp_path: Path, images: list[str], *args: str) -> dict[str, Any]:
    """``k8s manifests`` for a pools file whose hopper pool names ``images``."""
    pools = tmp_path / "ds-pools.yaml"
    pools.write_text(
        yaml.safe_dump(
            {
                "families": {"hopper": "training-hopper"},
                "pools": {"training-hopper": {"images": images}},
            }
        )
    )
    r = cli("k8s", "manifests", "--pools", str(pools), "--registry-secret", "regcred", *args)
    assert r.code == 0, r.err
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(r.out)}


@pytest.mark.integration
def test_the_daemonsets_command_checks_the_pools_images_with_the_secret(
    cli: CliRunner,
    api: tuple[ApiStandIn, Path],
    auth_registry: Registry,
    pool_images: dict[str, str],
    standin_libs: Path,
    tmp_path: Path,
) -> None:
    """End to end: the rendered DaemonSet's command, volumes and env, run by the kubelet
    stand-in with the Secret kubectl makes: the node's pool image is read from the
    registry with the Secret's credentials, loaded (--load-test) through the stand-in
    libcuda, and the node admitted; with refused credentials it is tainted again."""
    standin, kubeconfig = api
    objects = _render(cli, tmp_path, [pool_images["fits"]], "--load-test")
    ds = objects["DaemonSet/buildmatrix-smoke"]
    objects["Secret/regcred"] = registry_secret(auth_registry, name="regcred")
    cuda = tmp_path / "cuda.json"
    cuda.write_text(
        json.dumps(
            {"devices": [{"name": "NVIDIA H100 80GB HBM3", "cc": [9, 0], "load": "CUDA_SUCCESS"}]}
        )
    )
    toolkit = {  # what the NVIDIA container toolkit would mount: the stand-in libcuda
        "LD_LIBRARY_PATH": str(standin_libs),
        "CUDA_STANDIN_SCENARIO": str(cuda),
        "CUDA_STANDIN_LOG": str(tmp_path / "cuda.log"),
    }
    snapshot = f"--snapshot {NODES / 'h100-580.json'}"

    def round_(root: str) -> subprocess.CompletedProcess[str]:
        return run_once(
            ds,
            objects=objects,
            node="gpu-1",
            root=tmp_path / root,
            kubeconfig=kubeconfig,
            append=snapshot,
            host_env=toolkit,
        )

    proc = round_("pass")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    node = _node(standin)
    assert node["spec"]["taints"] == [GPU_TAINT]
    assert node["metadata"]["labels"]["gpu-pool"] == "training-hopper"
    assert node["metadata"]["labels"]["verified.buildmatrix.io/train"] == "true"
    assert f"load-test {pool_images['fits']} on NVIDIA H100 80GB HBM3 (9.0)" in proc.stdout
    assert any(ln.startswith("load ") for ln in (tmp_path / "cuda.log").read_text().splitlines())
    # the Secret now holds a wrong password (credentials expired): the image cannot be
    # read (exit 3: the registry refused), a source outage that keeps the admitted node
    # admitted within --source-grace, the report saying so (tests/test_day2.py)
    objects["Secret/regcred"] = registry_secret(auth_registry, name="regcred", password="nope")
    proc = round_("refused")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    node = _node(standin)
    assert node["spec"]["taints"] == [GPU_TAINT]
    assert node["metadata"]["labels"]["buildmatrix.io/smoke"] == "passed"
    report = node["metadata"]["annotations"][REPORT_ANNOTATION]
    assert report.startswith("kept admitted until ")
    assert f"registry {auth_registry.host} refused access" in report
    # an sm_80-only image in the pool: read with good credentials, it fails the node
    objects = _render(cli, tmp_path, [pool_images["sm80"]]) | {
        "Secret/regcred": registry_secret(auth_registry, name="regcred")
    }
    ds = objects["DaemonSet/buildmatrix-smoke"]
    proc = round_("sm80")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        "sm_80 SASS runs only on compute capability 8.x"
        in _node(standin)["metadata"]["annotations"][REPORT_ANNOTATION]
    )
    # without its Secret the Pod would not start at all: the node stays tainted
    del objects["Secret/regcred"]
    with pytest.raises(PodWouldNotStart, match='secret "regcred" not found'):
        round_("no-secret")
    # nor with a Secret of the legacy type kubernetes.io/dockercfg (key .dockercfg)
    objects["Secret/regcred"] = {"type": "kubernetes.io/dockercfg", "data": {".dockercfg": ""}}
    with pytest.raises(PodWouldNotStart, match=r"non-existent secret key: \.dockerconfigjson"):
        round_("dockercfg")


def test_the_policy_keeps_the_agent_off_other_nodes(
    cli: CliRunner, api: tuple[ApiStandIn, Path]
) -> None:
    """The agent's token is bound to gpu-1: admitting gpu-2 with it is refused by the
    admission policy (exit 3, nothing written), while its own node is admitted."""
    standin, kubeconfig = api
    before = json.dumps(standin.nodes["gpu-2"], sort_keys=True)
    code, out = _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS, on="gpu-2")
    assert code == 3
    assert "admission policy refused to patch node 'gpu-2'" in out
    assert "may only change the Node its Pod runs on" in out
    assert json.dumps(standin.nodes["gpu-2"], sort_keys=True) == before
    code, out = _smoke(cli, kubeconfig, "h100-535", "--pools", POOLS)
    assert code == 0, out
    assert out["applied"]["taint"] == "removed"


@pytest.mark.parametrize("text", ["garbage: [", "[]", "clusters: 7\n"])
def test_a_broken_kubeconfig_is_bad_input(cli: CliRunner, tmp_path: Path, text: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)
    code, out = _smoke(cli, kubeconfig, "h100-535")
    assert code in (2, 3), out
    assert "kubeconfig" in out


_NODE = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": "gpu-1"}, "spec": {}}


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"<html>login required</html>", "with b'<html>login required</html>', not a JSON object"),
        (json.dumps({"kind": "Status", "status": "Success"}).encode(), "(kind 'Status')"),
        (json.dumps({**_NODE, "metadata": "x"}).encode(), "(metadata.name None)"),
        (json.dumps({**_NODE, "metadata": {"name": "gpu-2"}}).encode(), "(metadata.name 'gpu-2')"),
        (
            json.dumps({**_NODE, "metadata": {"name": "gpu-1", "labels": {"a": 1}}}).encode(),
            "(metadata.labels is not a map of strings)",
        ),
        (
            json.dumps({**_NODE, "spec": {"taints": "all"}}).encode(),
            "(spec.taints is not a list of taints)",
        ),
    ],
    ids=["html", "status", "metadata-not-an-object", "another-node", "labels", "taints"],
)
def test_an_answer_that_is_not_the_node_is_exit_3_and_nothing_is_sent(
    cli: CliRunner, tmp_path: Path, body: bytes, said: str
) -> None:
    """A proxy's page, or a server answering 200 with anything but the Node (a Status
    object, another node, a malformed one): exit 3 naming the request, never a
    traceback, never a verdict applied to it (no PATCH follows)."""
    seen: list[str] = []

    class Page(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(self.command)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PATCH = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        kubeconfig = ApiStandIn().kubeconfig(tmp_path / "kubeconfig", url, "smoke")
        code, err = _smoke(cli, kubeconfig, "h100-535")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 3, err
    assert "answered get node 'gpu-1' with" in str(err)
    assert said in str(err)
    assert seen == ["GET"]
