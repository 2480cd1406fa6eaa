"""Day 2, busy GPUs: ``smoke --load-test`` on a node whose GPUs run others' work.

A GPU in exclusive-process mode that another process holds refuses every other
context (cuda.h, CUDA_ERROR_DEVICE_UNAVAILABLE = 46: "Devices are often unavailable due
to use of CU_COMPUTEMODE_EXCLUSIVE_PROCESS or CU_COMPUTEMODE_PROHIBITED"; the runtime's
cudaErrorDevicesUnavailable, 46 in driver_types.h, also for "memory constraints on a
device that already has active CUDA work"); one whose memory others' jobs fill answers
CUDA_ERROR_OUT_OF_MEMORY. NVML tells such a GPU from a broken one: its compute mode
(nvmlDeviceGetComputeMode) and the processes holding a context there
(nvmlDeviceGetComputeRunningProcesses).

Run for real in a fresh process: the probe through nvidia-ml-py against the STAND-IN
NVML (tests/standins/nvml.c, which answers both calls as nvml.h documents them), the
load test through the STAND-IN libcuda (tests/standins/cuda.c, whose contexts a
device's scenario may refuse), the verdict through the STAND-IN API server
(tests/kube_standin.py, with the rendered admission policy).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.labelkeys import REPORT_ANNOTATION, SMOKE
from tests.conftest import REPO, CliRunner
from tests.kube_standin import ApiStandIn
from tests.standins import nvml_scenario, run_cli
from tests.test_kube_apply import ADMISSION, standin_with_nodes

NODES = REPO / "tests" / "fixtures" / "nodes"
BIN = REPO / "tests" / "fixtures" / "bin"
H100 = {"name": "NVIDIA H100 80GB HBM3", "cc": [9, 0], "load": "CUDA_SUCCESS"}
UNAVAILABLE = {**H100, "retain": "CUDA_ERROR_DEVICE_UNAVAILABLE"}
FULL = {**H100, "load": "CUDA_ERROR_OUT_OF_MEMORY"}


def _node(mode: str, processes: list[int]) -> dict[str, Any]:
    """The recorded 8-GPU H100 node on R580, each GPU in ``mode`` with processes[i]
    processes of others' work, as the stand-in NVML answers it."""
    snapshot = json.loads((NODES / "h100-580.json").read_text())
    for g, count in zip(snapshot["gpus"], processes, strict=True):
        g["compute_mode"] = mode
        g["compute_processes"] = count
    return nvml_scenario(snapshot)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ApiStandIn, Path]]:
    standin = standin_with_nodes()
    server, url = standin.serve()
    try:
        yield standin, standin.kubeconfig(tmp_path / "kubeconfig", url, "smoke")
    finally:
        server.shutdown()
        server.server_close()


def _image(tmp_path: Path) -> str:
    root = tmp_path / "rootfs"
    (root / "usr" / "lib").mkdir(parents=True, exist_ok=True)
    shutil.copy(BIN / "libsass_ptx.so", root / "usr" / "lib")  # sm_90 SASS, CUDA 13.0
    return f"dir:{root}"


def _round(
    kubeconfig: Path,
    libs: Path,
    tmp_path: Path,
    nvml: dict[str, Any],
    devices: list[dict[str, Any]],
) -> tuple[int, dict[str, Any]]:
    """One smoke --apply --load-test round on gpu-1, live (no snapshot)."""
    run = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    run.mkdir()
    proc = run_cli(
        [
            *("smoke", "--apply", "--node", "gpu-1", "--kubeconfig", str(kubeconfig)),
            *("--image", _image(tmp_path), "--load-test", "--json"),
        ],
        libs=libs,
        tmp=run,
        nvml=nvml,
        cuda={"devices": devices},
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _admitted(standin: ApiStandIn) -> bool:
    node = standin.nodes["gpu-1"]
    return (
        ADMISSION not in node["spec"]["taints"]
        and node["metadata"]["labels"].get(SMOKE) == "passed"
    )


IDLE = _node("default", [0] * 8)
EXCLUSIVE = _node("exclusive_process", [1] * 8)
MEMORY = _node("default", [2] * 8)


@pytest.mark.parametrize(
    ("nvml", "device"),
    [
        (EXCLUSIVE, UNAVAILABLE),
        (MEMORY, FULL),
        (MEMORY, {**H100, "retain": "CUDA_ERROR_OUT_OF_MEMORY"}),
    ],
    ids=["exclusive-process", "memory-full-at-load", "memory-full-at-context"],
)
def test_an_admitted_node_busy_with_work_stays_admitted(
    cluster: tuple[ApiStandIn, Path],
    standin_libs: Path,
    tmp_path: Path,
    nvml: dict[str, Any],
    device: dict[str, Any],
) -> None:
    standin, kubeconfig = cluster
    code, _ = _round(kubeconfig, standin_libs, tmp_path, IDLE, [H100] * 8)
    assert code == 0
    assert _admitted(standin)
    code, doc = _round(kubeconfig, standin_libs, tmp_path, nvml, [device] * 8)
    assert code == 1  # the round could not verify the images: said, not hidden
    assert doc["verdict"] == "fail"
    assert _admitted(standin)
    assert doc["applied"]["held"].startswith("kept admitted: load-test")
    report = standin.nodes["gpu-1"]["metadata"]["annotations"][REPORT_ANNOTATION]
    assert "runs others' CUDA work" in report
    assert "every GPU of this model busy" in report


def test_a_free_gpu_of_the_model_is_tested_instead(
    cluster: tuple[ApiStandIn, Path], standin_libs: Path, tmp_path: Path
) -> None:
    """Seven GPUs held in exclusive-process mode, the eighth free: the load test runs
    there, and the round passes as any other."""
    standin, kubeconfig = cluster
    nvml = _node("exclusive_process", [1] * 7 + [0])
    code, doc = _round(kubeconfig, standin_libs, tmp_path, nvml, [UNAVAILABLE] * 7 + [H100])
    assert code == 0, doc
    assert _admitted(standin)
    log = (tmp_path / "run-0" / "cuda.log").read_text().splitlines()
    assert [ln.split()[1] for ln in log if ln.startswith("refused")] == list("0123456")
    assert {ln.split()[1] for ln in log if ln.startswith("load ")} == {"7"}


@pytest.mark.parametrize(
    ("nvml", "device", "why"),
    [
        (IDLE, UNAVAILABLE, "no process: the refusal is the node's"),
        (_node("prohibited", [0] * 8), UNAVAILABLE, "prohibited: no load test can run"),
        (IDLE, FULL, "out of memory with nothing running"),
        (_node("exclusive_process", [1] * 7 + [0]), UNAVAILABLE, "GPU 7 idle yet refusing"),
    ],
)
def test_a_refusal_nvml_does_not_explain_fails(
    cluster: tuple[ApiStandIn, Path],
    standin_libs: Path,
    tmp_path: Path,
    nvml: dict[str, Any],
    device: dict[str, Any],
    why: str,
) -> None:
    standin, kubeconfig = cluster
    assert _round(kubeconfig, standin_libs, tmp_path, IDLE, [H100] * 8)[0] == 0
    code, _ = _round(kubeconfig, standin_libs, tmp_path, nvml, [device] * 8)
    assert code == 1, why
    assert not _admitted(standin), why


def test_a_node_that_never_passed_stays_tainted(
    cluster: tuple[ApiStandIn, Path], standin_libs: Path, tmp_path: Path
) -> None:
    standin, kubeconfig = cluster
    code, doc = _round(kubeconfig, standin_libs, tmp_path, EXCLUSIVE, [UNAVAILABLE] * 8)
    assert code == 1
    assert "held" not in doc["applied"]
    assert not _admitted(standin)


def test_the_probe_records_who_computes(standin_libs: Path, tmp_path: Path) -> None:
    """nvmlDeviceGetComputeMode and the running processes, as recorded by --record
    (the probe's inverse of the stand-in's scenario)."""
    record = tmp_path / "node.json"
    proc = run_cli(
        ["smoke", "--record", str(record), "--json"],
        libs=standin_libs,
        tmp=tmp_path,
        nvml=_node("exclusive_process", [3, 0, 1, 0, 0, 0, 0, 2]),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gpus = json.loads(record.read_text())["gpus"]
    assert [g["compute_mode"] for g in gpus] == ["exclusive_process"] * 8
    assert [g["compute_processes"] for g in gpus] == [3, 0, 1, 0, 0, 0, 0, 2]


def test_a_recording_without_the_new_keys_is_judged_as_before(cli: CliRunner) -> None:
    """A recorded snapshot without the new keys (older recordings) is judged as before."""
    r = cli("smoke", "--snapshot", str(NODES / "h100-580.json"), "--json")
    assert r.code == 0, r.err
