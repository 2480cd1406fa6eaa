"""The NVML probe through the real nvidia-ml-py bindings, against a STAND-IN NVML.

No GPU here: ``tests/standins/nvml.c`` is built as ``libnvidia-ml.so.1`` and put on
the loader path of a new ``buildmatrix`` process (tests/standins/__init__.py, forked
from one that has imported buildmatrix: tests/forked_cli.py). The
bindings, their ctypes calls and buildmatrix's probe are the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.node.probe import host_cpu
from tests.conftest import REPO, CliRunner
from tests.standins import nvml_scenario, pci_functions, run_cli, sysfs_tree

NODES = REPO / "tests" / "fixtures" / "nodes"
FIXTURES = sorted(NODES.glob("*.json"))


def _doc(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


_HOST_CPU = {"cpu": cpu} if (cpu := host_cpu()) is not None else {}


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_record_reproduces_the_snapshot(
    cli: CliRunner, standin_libs: Path, tmp_path: Path, fixture: Path
) -> None:
    """probe(stand-in answering as snapshot S) == S, for every fixture node: NVML
    (MIG devices included) through the stand-in library, the PCI bus through a fake
    sysfs holding the snapshot's ``pci_gpus`` (none where the snapshot has none).
    The replay of a recorded snapshot reads neither NVML nor sysfs
    (node_snapshot.read_snapshot), so it runs in this process."""
    want = _doc(fixture)
    out = tmp_path / "recorded.json"
    sysfs = sysfs_tree(tmp_path / "sys", pci_functions(want)) if "pci_gpus" in want else None
    proc = run_cli(
        ["smoke", "--record", str(out), "--node", want["hostname"], "--json"],
        libs=standin_libs,
        tmp=tmp_path,
        nvml=nvml_scenario(want),
        sysfs=sysfs,
    )
    assert proc.returncode in (0, 1), proc.stderr
    assert _doc(out) == want | _HOST_CPU  # the CPU is this machine's (uname), not NVML's
    # and the live judgement equals the recorded one
    replay = cli("smoke", "--snapshot", str(out), "--json")
    live, recorded = json.loads(proc.stdout), replay.json()
    assert live["verdict"] == recorded["verdict"]
    assert live["labels"] == recorded["labels"]
    assert proc.returncode == replay.code


def test_not_supported_is_null_not_an_error(standin_libs: Path, tmp_path: Path) -> None:
    scenario = nvml_scenario(_doc(NODES / "rtx-consumer.json"))
    out = tmp_path / "r.json"
    proc = run_cli(
        ["smoke", "--record", str(out), "--json"], libs=standin_libs, tmp=tmp_path, nvml=scenario
    )
    doc = _doc(out)
    gpu = doc["gpus"][0]
    assert doc["errors"] == []
    assert gpu["ecc_uncorrected_volatile"] is None
    assert gpu["remapped_rows"] is None
    assert gpu["mig_mode"] is None
    assert json.loads(proc.stdout)["verdict"] == "pass"


def test_an_nvml_error_on_a_field_fails_the_node(standin_libs: Path, tmp_path: Path) -> None:
    scenario = nvml_scenario(_doc(NODES / "h100-535.json"))
    scenario["gpus"][3]["ecc_uncorrected_volatile"] = "NVML_ERROR_UNKNOWN"
    out = tmp_path / "r.json"
    proc = run_cli(
        ["smoke", "--record", str(out), "--json"], libs=standin_libs, tmp=tmp_path, nvml=scenario
    )
    doc = _doc(out)
    assert doc["errors"] == [
        {"call": "nvmlDeviceGetTotalEccErrors", "error": "NVML_ERROR_UNKNOWN", "index": 3}
    ]
    assert "ecc_uncorrected_volatile" not in doc["gpus"][3]
    report = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert report["verdict"] == "fail"
    assert report["labels"] == {"buildmatrix.io/smoke": "failed"}


def test_gpu_needing_reset(standin_libs: Path, tmp_path: Path) -> None:
    scenario = nvml_scenario(_doc(NODES / "h100-535.json"))
    scenario["gpus"][0] = {"handle": "NVML_ERROR_RESET_REQUIRED"}
    proc = run_cli(
        ["smoke", "--json", "--expect-gpus", "8"], libs=standin_libs, tmp=tmp_path, nvml=scenario
    )
    report = json.loads(proc.stdout)
    failed = {c["name"]: c["message"] for c in report["checks"] if not c["ok"]}
    assert proc.returncode == 1
    assert "NVML_ERROR_RESET_REQUIRED" in failed["nvml"]
    assert "7 GPU(s) visible, 8 expected" in failed["gpus"]


def test_no_nvml_library_exits_3_with_a_failing_report(tmp_path: Path) -> None:
    nfd = tmp_path / "gfd"
    nfd.write_text("buildmatrix.io/smoke=passed\ngpu-pool=training-hopper\n")
    proc = run_cli(["smoke", "--json", "--nfd-file", str(nfd)], libs=None, tmp=tmp_path)
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)
    assert report["version"] == 1
    assert report["verdict"] == "fail"
    assert report["labels"] == {"buildmatrix.io/smoke": "failed"}
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in report["checks"][0]["message"]
    # the admitting labels of an earlier run are gone from the feature file
    assert "gpu-pool" not in nfd.read_text()
    assert "buildmatrix.io/smoke=failed" in nfd.read_text()


def test_driver_not_loaded_exits_3(standin_libs: Path, tmp_path: Path) -> None:
    scenario = {"init": "NVML_ERROR_DRIVER_NOT_LOADED"}
    proc = run_cli(["smoke"], libs=standin_libs, tmp=tmp_path, nvml=scenario)
    assert proc.returncode == 3
    assert "kernel driver is not loaded" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_record_without_nvml_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "snap.json"
    proc = run_cli(["smoke", "--record", str(out)], libs=None, tmp=tmp_path)
    assert proc.returncode == 3
    assert not out.exists()


def test_labels_reads_the_live_node(standin_libs: Path, tmp_path: Path) -> None:
    scenario = nvml_scenario(_doc(NODES / "h200-550.json"))
    proc = run_cli(["labels", "--node", "h200-01"], libs=standin_libs, tmp=tmp_path, nvml=scenario)
    assert proc.returncode == 0, proc.stderr
    labels = json.loads(proc.stdout)["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/gpu.memory"] == "143771"
    assert labels["nvidia.com/cuda.runtime-version.full"] == "12.4"


HGX_SYSFS = REPO / "tests" / "fixtures" / "sysfs" / "hgx-h100"


def _failed(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["message"] for c in report["checks"] if not c["ok"]}


def test_pci_bus_shows_the_gpu_nvml_lost(
    cli: CliRunner, standin_libs: Path, tmp_path: Path
) -> None:
    """NVML (stand-in) brings up 7 of the HGX board's 8 GPUs; sysfs (fake tree) lists
    all 8 beside 4 NVSwitches, an audio function and the BMC's VGA."""
    out = tmp_path / "r.json"
    proc = run_cli(
        ["smoke", "--record", str(out), "--json", "--expect-gpus", "7"],
        libs=standin_libs,
        tmp=tmp_path,
        nvml=nvml_scenario(_doc(NODES / "hgx-h100-7-of-8.json")),
        sysfs=HGX_SYSFS,
    )
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert list(_failed(report)) == ["gpus"]
    assert "0000:9a:00.0 not shown by NVML" in _failed(report)["gpus"]
    assert len(_doc(out)["pci_gpus"]) == 8
    replay = cli("smoke", "--snapshot", str(out), "--json")
    assert replay.code == 1
    assert _failed(replay.json()) == _failed(report)


def test_all_eight_gpus_on_nvml_and_the_bus_pass(standin_libs: Path, tmp_path: Path) -> None:
    proc = run_cli(
        ["smoke", "--json", "--expect-gpus", "8"],
        libs=standin_libs,
        tmp=tmp_path,
        nvml=nvml_scenario(_doc(NODES / "hgx-h100-8.json")),
        sysfs=HGX_SYSFS,
    )
    assert proc.returncode == 0, proc.stdout
    (gpus,) = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "gpus"]
    assert gpus["message"] == "8 GPU(s) visible, 8 on the PCI bus, 8 expected (--expect-gpus)"


def test_mig_single_through_nvml(standin_libs: Path, tmp_path: Path) -> None:
    proc = run_cli(
        ["smoke", "--json", "--mig-strategy", "single"],
        libs=standin_libs,
        tmp=tmp_path,
        nvml=nvml_scenario(_doc(NODES / "a100-mig-1g5gb.json")),
    )
    assert proc.returncode == 0, proc.stdout
    labels = json.loads(proc.stdout)["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels["nvidia.com/gpu.count"] == "14"
    assert labels["nvidia.com/gpu.memory"] == "4864"
    assert labels["nvidia.com/mig.strategy"] == "single"


def test_mig_mixed_through_nvml(standin_libs: Path, tmp_path: Path) -> None:
    proc = run_cli(
        ["labels", "--mig-strategy", "mixed"],
        libs=standin_libs,
        tmp=tmp_path,
        nvml=nvml_scenario(_doc(NODES / "h100-mig-mixed.json")),
    )
    assert proc.returncode == 0, proc.stdout
    labels = json.loads(proc.stdout)["labels"]
    assert labels["nvidia.com/mig-3g.40gb.count"] == "1"
    assert labels["nvidia.com/mig-2g.20gb.count"] == "2"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "7"
    assert labels["nvidia.com/mig-1g.10gb.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.memory"] == "81559"  # the parent's, read with monitoring


def test_mig_without_monitoring_fails_naming_the_grant(standin_libs: Path, tmp_path: Path) -> None:
    """The stand-in refuses the parent's memory info in MIG mode (NO_PERMISSION), as
    NVML does for a caller that may not monitor MIG."""
    scenario = nvml_scenario(_doc(NODES / "a100-mig-1g5gb.json"))
    scenario["mig_monitor"] = False
    out = tmp_path / "r.json"
    proc = run_cli(
        ["smoke", "--record", str(out), "--json", "--mig-strategy", "single"],
        libs=standin_libs,
        tmp=tmp_path,
        nvml=scenario,
    )
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    nvml = _failed(report)["nvml"]
    assert "nvmlDeviceGetMemoryInfo on GPU 0: NVML_ERROR_NO_PERMISSION" in nvml
    assert "NVIDIA_MIG_MONITOR_DEVICES=all" in nvml
    assert report["labels"] == {"buildmatrix.io/smoke": "failed"}
    # what was readable is recorded: the MIG devices, without a profile name
    want = _doc(NODES / "a100-mig-no-monitor.json")
    del want["pci_gpus"]  # no sysfs in this run
    recorded = _doc(out)
    assert recorded == want | {"hostname": recorded["hostname"]} | _HOST_CPU


def test_unused_mig_indexes_are_skipped(standin_libs: Path, tmp_path: Path) -> None:
    """NOT_FOUND below nvmlDeviceGetMaxMigDeviceCount means "no MIG device at this
    index" (nvml.h), not an error: destroyed instances leave such gaps."""
    scenario = nvml_scenario(_doc(NODES / "a100-mig-1g5gb.json"))
    devices = scenario["gpus"][0]["mig_devices"]
    scenario["gpus"][0]["mig_devices"] = [devices[0], None, devices[2], None]  # 4..6 absent
    out = tmp_path / "r.json"
    proc = run_cli(
        ["smoke", "--record", str(out), "--json", "--mig-strategy", "single"],
        libs=standin_libs,
        tmp=tmp_path,
        nvml=scenario,
    )
    recorded = _doc(out)
    assert recorded["errors"] == []
    assert [m["index"] for m in recorded["gpus"][0]["mig_devices"]] == [0, 2]
    assert proc.returncode == 0, proc.stdout
    assert json.loads(proc.stdout)["labels"]["nvidia.com/gpu.count"] == "9"
