"""On a real GPU: the NVML probe and the driver load test against the real driver.

These run only where NVML starts (a GPU node; tests/gpu/run.sh runs them with a
report) and skip elsewhere with the reason. On machines without a GPU the same
code paths are tested against the stand-in libraries (test_node_probe.py,
test_node_cli.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from buildmatrix.cli import main
from buildmatrix.node.probe import probe
from buildmatrix.snapshot import snapshot_from_doc
from tests.conftest import REPO, SHIPPED_PROFILES

pytestmark = pytest.mark.gpu


def _nvml_or_skip() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:  # any failure to start NVML means: no GPU here
        pytest.skip(f"no NVIDIA GPU here (NVML: {exc}); tests/gpu/run.sh runs these on one")


def test_probe_reads_every_gpu() -> None:
    _nvml_or_skip()
    doc = probe()
    snap = snapshot_from_doc(doc, source="NVML")
    assert snap.gpus, doc
    assert doc["gpu_count"] == len(snap.gpus) + len(
        [e for e in doc["errors"] if e["call"] == "nvmlDeviceGetHandleByIndex"]
    )
    for gpu in snap.gpus:
        assert gpu.memory_total_mib and gpu.memory_total_mib > 1024


def test_load_test_on_the_real_driver(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """libmulti.so holds SASS for sm_75..sm_120 and compute_120 PTX: loads on any GPU."""
    _nvml_or_skip()
    root = tmp_path / "rootfs"
    root.mkdir()
    shutil.copy(REPO / "tests" / "fixtures" / "bin" / "libmulti.so", root / "libmulti.so")
    snap = tmp_path / "snap.json"
    code = main(
        [
            "smoke",
            "--record",
            str(snap),
            "--profiles",
            str(SHIPPED_PROFILES),
            "--json",
            "--image",
            f"dir:{root}",
            "--load-test",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    loads = [c for c in report["checks"] if c["name"].startswith("load-test")]
    assert loads, report
    assert all(c["ok"] for c in loads), loads
    assert code in (0, 1)  # the node's driver may be below a floor; the load must work
