"""MIG: profile names, GFD's three MIG strategies as labels, and the MIG check.

Oracles: NVIDIA's MIG User Guide ("Supported MIG Profiles": the profile names per
product) with the memory ``nvidia-smi mig -lgip`` reports per profile, and GPU
Feature Discovery v0.20.0's labelling code (NVIDIA/k8s-device-plugin
``internal/lm/mig-strategy.go`` newMigStrategySingleLabeler /
newMigStrategyMixedLabeler / migStrategyLabeler, ``internal/lm/resource.go``
NewMIGResourceLabeler / getProductName, ``internal/resource/nvml-mig-device.go``
GetName / GetAttributes).
"""

from __future__ import annotations

import dataclasses

import pytest

from buildmatrix.cuda import load_cuda_facts
from buildmatrix.node.checks import NodeOptions, NodeReport, evaluate
from buildmatrix.node.labels import node_labels
from buildmatrix.node.mig import memory_gb, profile_name
from buildmatrix.node.values import is_label_key, is_label_value
from buildmatrix.profiles import ProfileSet
from buildmatrix.snapshot import Snapshot, load_snapshot
from tests.conftest import REPO

NODES = REPO / "tests" / "fixtures" / "nodes"
MIB = 1 << 20

# (product, NVML total MiB as nvidia-smi shows it): [(NVML_GPU_INSTANCE_PROFILE_*, CI
# slices, memorySizeMB, the MIG User Guide's name)]; memorySizeMB is nvidia-smi mig
# -lgip's GiB * 1024.
GUIDE = {
    ("A100-SXM4-40GB", 40960): [
        (0x0, 1, 4864, "1g.5gb"),
        (0x7, 1, 4864, "1g.5gb+me"),
        (0x9, 1, 9984, "1g.10gb"),
        (0x1, 2, 9984, "2g.10gb"),
        (0x2, 3, 20096, "3g.20gb"),
        (0x3, 4, 20096, "4g.20gb"),
        (0x4, 7, 40192, "7g.40gb"),
        (0x2, 1, 20096, "1c.3g.20gb"),
        (0x4, 3, 40192, "3c.7g.40gb"),
    ],
    ("A100-SXM4-80GB", 81920): [
        (0x0, 1, 9728, "1g.10gb"),
        (0x7, 1, 9728, "1g.10gb+me"),
        (0x9, 1, 19968, "1g.20gb"),
        (0x1, 2, 19968, "2g.20gb"),
        (0x2, 3, 40192, "3g.40gb"),
        (0x3, 4, 40192, "4g.40gb"),
        (0x4, 7, 81152, "7g.80gb"),
    ],
    ("H100 80GB HBM3", 81559): [
        (0x0, 1, 9984, "1g.10gb"),
        (0x7, 1, 9984, "1g.10gb+me"),
        (0x9, 1, 20096, "1g.20gb"),
        (0x1, 2, 20096, "2g.20gb"),
        (0x2, 3, 40448, "3g.40gb"),
        (0x3, 4, 40448, "4g.40gb"),
        (0x4, 7, 81152, "7g.80gb"),
    ],
    ("A30", 24576): [
        (0x0, 1, 5952, "1g.6gb"),
        (0x7, 1, 5952, "1g.6gb+me"),
        (0x1, 2, 12096, "2g.12gb"),
        (0x8, 2, 12096, "2g.12gb+me"),
        (0x3, 4, 24192, "4g.24gb"),
    ],
}


@pytest.mark.parametrize(
    ("total_mib", "gi_profile", "ci_slices", "memory", "name"),
    [(total, *row) for (_, total), rows in GUIDE.items() for row in rows],
)
def test_profile_names_are_the_mig_guides(
    total_mib: int, gi_profile: int, ci_slices: int, memory: int, name: str
) -> None:
    got = profile_name(
        gpu_instance_profile=gi_profile,
        ci_slices=ci_slices,
        memory_size_mb=memory,
        parent_total_bytes=total_mib * MIB,
    )
    assert got == name


def test_profile_attributes_of_go_nvlib() -> None:
    """go-nvlib NewMigProfile: _GFX profiles +gfx, _NO_ME -me, _ALL_ME +me.all;
    unknown profile values have no name."""

    def name(p: int) -> str | None:
        return profile_name(
            gpu_instance_profile=p, ci_slices=1, memory_size_mb=4864, parent_total_bytes=40960 * MIB
        )

    assert name(0xA) == "1g.5gb+gfx"
    assert name(0xD) == "1g.5gb-me"
    assert name(0xF) == "1g.5gb+me.all"
    assert name(0x11) is None
    assert name(0x12) is None


def test_memory_rounds_half_away_from_zero_as_go() -> None:
    # 1/8 of 20 GiB is 2.5 GB: Go's math.Round gives 3 (Python's round() would give 2)
    assert memory_gb(memory_size_mb=2560, parent_total_bytes=20 << 30) == 3


def _judge(
    snap: Snapshot, profiles: ProfileSet, strategy: str, *, gfd_keys: bool = True
) -> tuple[NodeReport, dict[str, str]]:
    opts = NodeOptions(mig_strategy=strategy)
    report = evaluate(snap, profiles, load_cuda_facts(), options=opts)
    return report, node_labels(snap, report, mig_strategy=strategy, gfd_keys=gfd_keys)


def _mig_keys(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig")}


def test_single_labels_the_slice(profiles: ProfileSet) -> None:
    snap = load_snapshot(NODES / "a100-mig-1g5gb.json")
    report, labels = _judge(snap, profiles, "single")
    assert report.passed
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels["nvidia.com/gpu.count"] == "14"  # every MIG device on the node
    assert labels["nvidia.com/gpu.memory"] == "4864"  # the slice's memorySizeMB
    assert labels["nvidia.com/gpu.memory-mb"] == "4864"
    assert labels["nvidia.com/gpu.multiprocessors"] == "14"
    assert labels["nvidia.com/gpu.slices.gi"] == "1"
    assert labels["nvidia.com/gpu.slices.ci"] == "1"
    assert labels["nvidia.com/gpu.engines.copy"] == "1"
    assert labels["nvidia.com/gpu.family"] == "ampere"  # the parent's, as GFD keeps it
    assert labels["nvidia.com/gpu.compute-capability"] == "8.0"
    assert _mig_keys(labels) == {"nvidia.com/mig.strategy": "single"}


def test_mixed_labels_each_profile(profiles: ProfileSet) -> None:
    snap = load_snapshot(NODES / "h100-mig-mixed.json")
    report, labels = _judge(snap, profiles, "mixed")
    assert report.passed
    # whole-GPU labels stay (newGPULabelers runs for MIG-enabled GPUs too)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.memory"] == "81559"
    mig = _mig_keys(labels)
    assert mig.pop("nvidia.com/mig.strategy") == "mixed"
    counts = {k: v for k, v in mig.items() if k.endswith(".count")}
    assert counts == {
        "nvidia.com/mig-1g.10gb.count": "7",
        "nvidia.com/mig-2g.20gb.count": "2",
        "nvidia.com/mig-3g.40gb.count": "1",
    }
    assert mig["nvidia.com/mig-3g.40gb.product"] == "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"
    assert mig["nvidia.com/mig-2g.20gb.memory"] == "20096"
    assert mig["nvidia.com/mig-1g.10gb.multiprocessors"] == "16"
    prefix = "nvidia.com/mig-1g.10gb."
    suffixes = {k.removeprefix(prefix) for k in mig if k.startswith(prefix)}
    assert suffixes == {
        "product",
        "count",
        "memory",
        "multiprocessors",
        "slices.gi",
        "slices.ci",
        "engines.copy",
        "engines.decoder",
        "engines.encoder",
        "engines.jpeg",
        "engines.ofa",
    }


def test_none_labels_whole_gpus_and_warns(profiles: ProfileSet) -> None:
    snap = load_snapshot(NODES / "h100-mig-mixed.json")
    report, labels = _judge(snap, profiles, "none")
    assert report.passed
    assert _mig_keys(labels) == {}
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    (check,) = [c for c in report.checks if c.name == "mig"]
    assert check.warning
    assert "--mig-strategy none labels whole GPUs" in check.message


def test_media_extension_profile_is_named_with_a_dot(profiles: ProfileSet) -> None:
    """GFD's GetName replaces '+' by '.': 1g.10gb+me is resource mig-1g.10gb.me."""
    snap = load_snapshot(NODES / "h100-mig-mixed.json")
    gpu = snap.gpus[1]
    devices = list(gpu.mig_devices or ())
    devices[0] = dataclasses.replace(devices[0], profile="1g.10gb+me")
    me = dataclasses.replace(
        snap, gpus=(snap.gpus[0], dataclasses.replace(gpu, mig_devices=tuple(devices)))
    )
    _, labels = _judge(me, profiles, "mixed")
    assert labels["nvidia.com/mig-1g.10gb.me.count"] == "1"
    assert labels["nvidia.com/mig-1g.10gb.me.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "6"


def test_single_refuses_what_gfd_labels_invalid(profiles: ProfileSet) -> None:
    """GFD's three reasons for <product>-MIG-INVALID each fail the node."""
    mixed = load_snapshot(NODES / "h100-mig-mixed.json")
    one = load_snapshot(NODES / "a100-mig-1g5gb.json")
    empty = dataclasses.replace(
        one, gpus=(one.gpus[0], dataclasses.replace(one.gpus[1], mig_devices=()))
    )
    half = dataclasses.replace(
        one,
        gpus=(
            one.gpus[0],
            dataclasses.replace(
                one.gpus[1], mig_mode=False, mig_mode_pending=False, mig_devices=None
            ),
        ),
    )
    for snap, reason in (
        (mixed, "more than one MIG profile on the node (1g.10gb, 2g.20gb, 3g.40gb)"),
        (empty, "a MIG-enabled GPU has no MIG devices"),
        (half, "GPUs with MIG enabled and disabled on one node"),
    ):
        report, labels = _judge(snap, profiles, "single")
        failed = {c.name: c.message for c in report.checks if not c.ok}
        assert list(failed) == ["mig"]
        assert reason in failed["mig"]
        assert "MIG-INVALID" in failed["mig"]
        assert labels == {"buildmatrix.io/smoke": "failed"}
        # mixed labels any layout (newMigStrategyMixedLabeler has no invalid case)
        assert _judge(snap, profiles, "mixed")[0].passed


def test_without_mig_monitoring_the_node_fails_saying_how_to_grant_it(
    profiles: ProfileSet,
) -> None:
    snap = load_snapshot(NODES / "a100-mig-no-monitor.json")
    for strategy in ("none", "single", "mixed"):
        report, labels = _judge(snap, profiles, strategy)
        failed = {c.name: c.message for c in report.checks if not c.ok}
        assert "nvmlDeviceGetMemoryInfo on GPU 0: NVML_ERROR_NO_PERMISSION" in failed["nvml"]
        assert "NVIDIA_MIG_MONITOR_DEVICES=all" in failed["nvml"]
        assert "CAP_SYS_ADMIN" in failed["nvml"]
        assert labels == {"buildmatrix.io/smoke": "failed"}


def test_mig_node_checks_judge_the_parent(profiles: ProfileSet) -> None:
    """Driver floor and health on MIG nodes are the parent GPU's (CC 8.0 / 9.0)."""
    for name, sm in (("a100-mig-1g5gb", "sm_80"), ("h100-mig-mixed", "sm_90")):
        report, _ = _judge(load_snapshot(NODES / f"{name}.json"), profiles, "mixed")
        checks = {c.name: c for c in report.checks}
        assert checks["profiles"].ok
        assert sm in checks["profiles"].message
        assert checks["health"].ok
        assert checks["driver"].ok


@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
@pytest.mark.parametrize("gfd_keys", [True, False])
def test_every_label_is_valid_on_every_fixture(
    strategy: str, gfd_keys: bool, profiles: ProfileSet
) -> None:
    for path in sorted(NODES.glob("*.json")):
        _, labels = _judge(load_snapshot(path), profiles, strategy, gfd_keys=gfd_keys)
        for key, value in labels.items():
            assert is_label_key(key), (path.name, key)
            assert is_label_value(value), (path.name, key, value)
        if not gfd_keys:
            assert _mig_keys(labels) == {}
            assert "nvidia.com/gpu.product" not in labels


def test_every_mig_key_written_is_one_apply_may_remove(profiles: ProfileSet) -> None:
    """On a later failure, --apply removes the labels buildmatrix owns: every MIG key
    it writes must be among them (else a failed node would keep admitting labels),
    and GFD's own mig.capable, which buildmatrix never writes, must not."""
    from buildmatrix.labelkeys import is_mig_key, owned

    written: set[str] = set()
    for name in ("a100-mig-1g5gb", "h100-mig-mixed"):
        for strategy in ("single", "mixed"):
            _, labels = _judge(load_snapshot(NODES / f"{name}.json"), profiles, strategy)
            written |= set(labels)
    mig = {k for k in written if is_mig_key(k)}
    assert "nvidia.com/mig.strategy" in mig
    assert "nvidia.com/mig-2g.20gb.engines.ofa" in mig
    assert "nvidia.com/gpu.multiprocessors" in mig
    assert all(owned(k, gfd_keys=True) for k in written)
    assert not any(owned(k, gfd_keys=False) for k in mig)
    assert not is_mig_key("nvidia.com/mig.capable")
    assert not owned("nvidia.com/mig.capable", gfd_keys=True)
