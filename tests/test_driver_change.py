"""Day 2, driver upgrades (node/driver_change.py, node/hold.py): the admission
DaemonSet's own command, as ``k8s manifests`` renders it, run whole by the kubelet
stand-in (tests/pod_standin.py, ``run_loop``) against the STAND-IN NVML library
(tests/standins/nvml.c; no GPU or driver can run here) and the STAND-IN API server
(tests/kube_standin.py, which runs the rendered admission policy on every PATCH).

What a real driver upgrade does to the agent's container, and what the stand-ins
reproduce of it: the NVIDIA container runtime mounts the driver's libraries when it
creates a container (nvidia-container-toolkit ``internal/oci/runtime_modifier.go``,
``modifyingRuntimeWrapper.Exec``: only on ``create``), so after the kernel module
changed, ``nvmlInit`` in that container answers NVML_ERROR_LIB_RM_VERSION_MISMATCH
(18 in nvidia-ml-py's ``pynvml.py``; the stand-in's scenario ``init`` answers it).
The GPU Operator's upgrade controller restarts only Pods that request
``nvidia.com/gpu*``/``nvidia.com/mig-*`` or hold a DRA claim (gpu-operator
``cmd/gpu-operator/main.go``, ``gpuPodSpecFilter``), not this one. A new container
(the loop ending: the kubelet creates it again in the same Pod, whose ``emptyDir``
stays) reads the new driver: the scenario after the restart is the new driver's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmatrix.labelkeys import REPORT_ANNOTATION, SMOKE
from buildmatrix.node.hold import UPGRADE_STATE
from tests.conftest import REPO, CliRunner
from tests.kube_standin import ApiStandIn
from tests.pod_standin import Loop, run_loop
from tests.standins import nvml_scenario
from tests.test_kube_apply import ADMISSION, GPU_TAINT, standin_with_nodes

NODES = REPO / "tests" / "fixtures" / "nodes"
MISMATCH = {"init": "NVML_ERROR_LIB_RM_VERSION_MISMATCH"}
ENDED = "the driver of the node changed: ending the container"


def _h100(driver: str, cuda: str) -> dict[str, Any]:
    """The recorded H100 node on another driver, as the stand-in NVML answers it."""
    snapshot = json.loads((NODES / "h100-580.json").read_text())
    return nvml_scenario(snapshot | {"driver_version": driver, "cuda_driver_version": cuda})


R580 = _h100("580.65.06", "13.0")
R590 = _h100("590.44.01", "13.1")
R520 = _h100("520.61.05", "11.8")  # below Hopper's floor, R525 (arch-profiles/sm_90.yaml)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ApiStandIn, Path]]:
    standin = standin_with_nodes()
    server, url = standin.serve()
    try:
        yield standin, standin.kubeconfig(tmp_path / "kubeconfig", url, "smoke")
    finally:
        server.shutdown()
        server.server_close()


def _daemonset(cli: CliRunner) -> tuple[dict[str, Any], dict[str, Any]]:
    r = cli("k8s", "manifests", "--pools", str(NODES / "pools.yaml"))
    assert r.code == 0, r.err
    objects = {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(r.out)}
    return objects["DaemonSet/buildmatrix-smoke"], objects


class Container:
    """Containers of one Pod of the rendered DaemonSet on gpu-1, each started anew
    (the same Pod folder, so the same emptyDir), with an NVML scenario per round."""

    def __init__(self, cli: CliRunner, cluster: tuple[ApiStandIn, Path], libs: Path, pod: Path):
        self.standin, self.kubeconfig = cluster
        self.daemonset, self.objects = _daemonset(cli)
        self.libs, self.pod, self.starts = libs, pod, 0

    def start(self, *rounds: dict[str, Any]) -> Loop:
        """One container's life: round i reads ``rounds[i]``; after the last one the
        kubelet stops it (unless it ended by itself before)."""
        self.starts += 1
        scenarios = self.pod / f"scenarios-{self.starts}"
        scenarios.mkdir(parents=True)
        for i, scenario in enumerate(rounds, start=1):
            (scenarios / f"{i}.json").write_text(json.dumps(scenario))
        current = self.pod / "nvml.json"
        current.write_text(json.dumps(rounds[0]))
        steps = [f'cp "{scenarios}/{i + 1}.json" "{current}"' for i in range(1, len(rounds))]
        return run_loop(
            self.daemonset,
            objects=self.objects,
            node="gpu-1",
            root=self.pod,
            kubeconfig=self.kubeconfig,
            between=steps,
            host_env={"LD_LIBRARY_PATH": str(self.libs), "NVML_STANDIN_SCENARIO": str(current)},
        )

    @property
    def node(self) -> Any:
        return self.standin.nodes["gpu-1"]

    def admitted(self) -> bool:
        node = self.node
        return (
            ADMISSION not in node["spec"]["taints"]
            and node["metadata"]["labels"].get(SMOKE) == "passed"
        )

    def report(self) -> str:
        return str(self.node["metadata"]["annotations"].get(REPORT_ANNOTATION, ""))


@pytest.fixture
def pod(
    cli: CliRunner, cluster: tuple[ApiStandIn, Path], standin_libs: Path, tmp_path: Path
) -> Container:
    return Container(cli, cluster, standin_libs, tmp_path / "pod")


def test_an_upgrade_restarts_the_container_and_readmits_the_node(pod: Container) -> None:
    """R580 admitted; the driver is upgraded under the container (NVML's mismatch): the
    node is tainted with the reason and the loop ends by itself after that round; the
    container started again reads R590 and the node is admitted again."""
    first = pod.start(R580, MISMATCH, MISMATCH, MISMATCH)
    assert first.ended_by_itself, first.proc.stdout + first.proc.stderr
    assert first.rounds == 2  # it did not wait for a third round
    assert ENDED in first.proc.stdout
    assert not pod.admitted()
    assert "NVML_ERROR_LIB_RM_VERSION_MISMATCH" in pod.report()
    assert "starts it with the new driver's libraries" in pod.report()
    again = pod.start(R590, R590)
    assert not again.ended_by_itself  # the kubelet stopped it: no restart loop
    assert again.rounds == 2
    assert pod.admitted(), pod.report()
    assert pod.node["metadata"]["labels"]["nvidia.com/cuda.driver-version.full"] == "590.44.01"


def test_a_changed_driver_version_restarts_the_container_too(pod: Container) -> None:
    """Another version without the mismatch (the container's libraries may still be the
    old driver's, libcuda among them): tainted, the loop ends, readmitted after."""
    first = pod.start(R580, R590, R590)
    assert first.ended_by_itself
    assert first.rounds == 2
    assert "the node's driver changed from 580.65.06 to 590.44.01" in pod.report()
    assert not pod.admitted()
    pod.start(R590)
    assert pod.admitted(), pod.report()


def test_a_driver_below_the_floor_is_not_readmitted(pod: Container) -> None:
    """After the restart the new driver is checked like any: R520 is below Hopper's
    floor, so the node stays tainted, and the loop goes on (no restart loop)."""
    assert pod.start(R580, MISMATCH).ended_by_itself
    again = pod.start(R520, R520, R520)
    assert not again.ended_by_itself
    assert again.rounds == 3
    assert not pod.admitted()
    assert "driver 520.61.05 is too old" in pod.report()


def test_no_admission_while_the_gpu_operator_upgrades(pod: Container) -> None:
    """The upgrade controller's label on the node (k8s-operator-libs pkg/upgrade/
    consts.go): while it holds a state other than upgrade-done, a passing round does
    not remove the taint; the agent never touches the cordon; once upgrade-done, the
    next round admits. A node admitted before the upgrade began and still passing is
    left as it is (the controller cordons it)."""
    assert pod.start(R580).rounds == 1
    assert pod.admitted()

    def cordon(state: str) -> None:
        def change(node: Any) -> None:
            node["metadata"]["labels"][UPGRADE_STATE] = state
            node["spec"]["unschedulable"] = state != "upgrade-done"

        pod.standin.write("gpu-1", change)

    cordon("upgrade-required")
    pod.start(R580)
    assert pod.admitted()  # not yet upgraded: nothing changes
    cordon("pod-restart-required")
    assert pod.start(R580, MISMATCH).ended_by_itself  # the driver Pod restarted
    for state in ("pod-restart-required", "validation-required", "uncordon-required"):
        cordon(state)
        pod.start(R590)
        assert not pod.admitted(), state
        assert f"{UPGRADE_STATE}={state}" in pod.report()
        assert pod.node["spec"]["unschedulable"] is True  # the controller's, untouched
    cordon("upgrade-done")
    pod.start(R590)
    assert pod.admitted(), pod.report()
    assert pod.node["spec"]["unschedulable"] is False
    assert GPU_TAINT in pod.node["spec"]["taints"]
