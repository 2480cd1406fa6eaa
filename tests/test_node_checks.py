"""Node checks and labels over recorded snapshots: verdict, failing check, labels."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from buildmatrix.arch import ComputeCapability
from buildmatrix.cuda import load_cuda_facts, parse_driver_version
from buildmatrix.errors import InputError
from buildmatrix.node.checks import NodeOptions, NodeReport, evaluate
from buildmatrix.node.labels import (
    GFD_KEYS,
    SEED_KEYS,
    gfd_family_label,
    gfd_product,
    node_labels,
)
from buildmatrix.node.pools import Pools, PoolSpec, load_pools, pools_from_data
from buildmatrix.node.values import is_label_key, is_label_value, label_value
from buildmatrix.profiles import ProfileSet
from buildmatrix.snapshot import RemappedRows, Snapshot, load_snapshot
from tests.conftest import REPO

NODES = REPO / "tests" / "fixtures" / "nodes"


@pytest.fixture(scope="module")
def pools(profiles: ProfileSet) -> Pools:
    return load_pools(NODES / "pools.yaml", profiles)


def _judge(name: str, profiles: ProfileSet, **opts: object) -> tuple[Snapshot, NodeReport]:
    snap = load_snapshot(NODES / f"{name}.json")
    report = evaluate(snap, profiles, load_cuda_facts(), options=NodeOptions(**opts))  # type: ignore[arg-type]
    return snap, report


# fixture -> (verdict, failing checks, pool, product label)
TABLE = {
    "a100-40gb": ("pass", [], "training-ampere", "NVIDIA-A100-SXM4-40GB"),
    "a100-80gb": ("pass", [], "training-ampere", "NVIDIA-A100-SXM4-80GB"),
    "a40": ("pass", [], "inference-ampere", "NVIDIA-A40"),
    "l40s": ("pass", [], "inference-ada", "NVIDIA-L40S"),
    "h100-520": ("fail", ["driver"], None, None),
    "h100-535": ("pass", [], "training-hopper", "NVIDIA-H100-80GB-HBM3"),
    "h100-580": ("pass", [], "training-hopper", "NVIDIA-H100-80GB-HBM3"),
    "h200-535": ("fail", ["driver"], None, None),
    "h200-550": ("pass", [], "training-hopper", "NVIDIA-H200"),
    "b200": ("pass", [], "training-blackwell", "NVIDIA-B200"),
    "mixed-a100-h100": ("fail", ["uniform"], None, None),
    "h100-lost-gpu": ("fail", ["nvml", "gpus"], None, None),
    "h100-ecc": ("fail", ["health"], None, None),
    "a100-remap-failure": ("fail", ["health"], None, None),
    "future-gpu": ("fail", ["profiles", "driver"], None, None),
    "rtx-consumer": ("pass", [], "training-blackwell", "NVIDIA-GeForce-RTX-5090"),
    "hgx-h100-8": ("pass", [], "training-hopper", "NVIDIA-H100-80GB-HBM3"),
    "hgx-h100-7-of-8": ("fail", ["gpus"], None, None),
    "a100-mig-1g5gb": ("pass", [], "training-ampere", "NVIDIA-A100-SXM4-40GB"),
    "a100-mig-no-monitor": ("fail", ["nvml"], None, None),
    "h100-mig-mixed": ("pass", [], "training-hopper", "NVIDIA-H100-80GB-HBM3"),
}


def test_table_covers_every_fixture() -> None:
    assert set(TABLE) == {p.stem for p in NODES.glob("*.json")}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_fixture_table(name: str, profiles: ProfileSet, pools: Pools) -> None:
    verdict, failing, pool, product = TABLE[name]
    snap, report = _judge(name, profiles)
    assert ("pass" if report.passed else "fail") == verdict
    assert [c.name for c in report.checks if not c.ok] == failing
    labels = node_labels(snap, report, pools=pools)
    if verdict == "fail":
        assert labels == {"buildmatrix.io/smoke": "failed"}  # nothing that admits
        return
    assert labels["gpu-pool"] == pool
    assert labels["nvidia.com/gpu.product"] == product
    assert labels["buildmatrix.io/smoke"] == "passed"
    assert labels["nvidia.com/gpu.count"] == str(len(snap.gpus))
    gpu = snap.gpus[0]
    assert labels["buildmatrix.io/gpu.compute-capability"] == str(gpu.cc)
    assert labels["nvidia.com/gpu.compute-capability"] == str(gpu.cc)  # the seed's name
    assert labels["nvidia.com/gpu.compute.major"] == str(gpu.cc.major)
    assert labels["nvidia.com/gpu.memory"] == str(gpu.memory_total_mib)
    assert labels["buildmatrix.io/gpu.memory-mb"] == str(gpu.memory_total_mib)
    assert labels["nvidia.com/gpu.memory-mb"] == str(gpu.memory_total_mib)
    assert labels["nvidia.com/cuda.driver-version.full"] == str(snap.driver)
    for key, value in labels.items():
        assert is_label_key(key), key
        assert is_label_value(value), (key, value)


def test_messages_say_what_to_do(profiles: ProfileSet) -> None:
    messages = {
        name: {c.name: c.message for c in _judge(name, profiles)[1].checks if not c.ok}
        for name in ("h100-520", "h200-535", "future-gpu", "a100-remap-failure", "h100-ecc")
    }
    assert (
        "hardware floor for sm_90 (NVIDIA H100 80GB HBM3) needs driver >= 525.60.13"
        in (messages["h100-520"]["driver"])
    )
    assert (
        "hardware floor for NVIDIA H200 needs driver >= 550.90.07"
        in (messages["h200-535"]["driver"])
    )
    assert "NVIDIA R100 (compute capability 13.0" in messages["future-gpu"]["profiles"]
    assert "sm_130.yaml" in messages["future-gpu"]["profiles"]
    assert "GPU 6: row remapping failed" in messages["a100-remap-failure"]["health"]
    assert "GPU 2: 3 uncorrected ECC error(s)" in messages["h100-ecc"]["health"]


def test_mixed_node_with_allow_mixed_labels_the_least_capable(
    profiles: ProfileSet, pools: Pools
) -> None:
    snap, report = _judge("mixed-a100-h100", profiles, allow_mixed=True)
    assert report.passed
    uniform = next(c for c in report.checks if c.name == "uniform")
    assert uniform.warning
    assert "least capable, NVIDIA A100-SXM4-80GB" in uniform.message
    labels = node_labels(snap, report, pools=pools)
    assert labels["nvidia.com/gpu.family"] == "ampere"
    assert labels["nvidia.com/gpu.compute-capability"] == "8.0"
    assert labels["gpu-pool"] == "training-ampere"
    assert labels["buildmatrix.io/mixed"] == "true"
    # GFD counts per model name (internal/lm/mig-strategy.go, newGPULabelers: counts[name]):
    # the two A100s, not all four GPUs; memory is the smallest GPU's (the H100's 81559 MiB
    # beside the A100s' 81920), so a Gt on it holds on whichever GPU a Pod gets.
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.memory"] == labels["nvidia.com/gpu.memory-mb"] == "81559"


@pytest.mark.parametrize("name", sorted(TABLE))
def test_count_and_memory_on_every_admitted_fixture(name: str, profiles: ProfileSet) -> None:
    """Over every fixture smoke admits (--allow-mixed): ``gpu.count`` is the number of
    GPUs of the labelled product's NVML name, as GFD counts; both memory labels are the
    smallest memory of any GPU on the node, so ``Gt`` on them holds for every GPU."""
    snap, report = _judge(name, profiles, allow_mixed=True)
    labels = node_labels(snap, report)
    if not report.passed:
        assert labels == {"buildmatrix.io/smoke": "failed"}
        return
    names = {gfd_product(g.name): g.name for g in snap.gpus}
    product = names[labels["nvidia.com/gpu.product"]]
    assert labels["nvidia.com/gpu.count"] == str(sum(g.name == product for g in snap.gpus))
    smallest = min(g.memory_total_mib for g in snap.gpus if g.memory_total_mib)
    assert labels["nvidia.com/gpu.memory"] == labels["nvidia.com/gpu.memory-mb"] == str(smallest)
    assert all(
        int(labels["nvidia.com/gpu.memory-mb"]) <= (g.memory_total_mib or 0) for g in snap.gpus
    )


def test_expect_gpus(profiles: ProfileSet) -> None:
    _, report = _judge("h100-535", profiles, expect_gpus=8)
    assert report.passed
    _, report = _judge("h100-535", profiles, expect_gpus=9)
    gpus = next(c for c in report.checks if c.name == "gpus")
    assert not gpus.ok
    assert "8 GPU(s) visible, 9 expected" in gpus.message


def test_health_rules(profiles: ProfileSet) -> None:
    snap = load_snapshot(NODES / "h100-535.json")
    base = snap.gpus[0]
    cases = {
        "retired": dataclasses.replace(base, retired_pages_pending=True),
        "remap-pending": dataclasses.replace(
            base,
            remapped_rows=RemappedRows(corrected=0, uncorrected=0, pending=True, failure=False),
        ),
        "mig-reset": dataclasses.replace(base, mig_mode=False, mig_mode_pending=True),
    }
    for what, gpu in cases.items():
        bad = dataclasses.replace(snap, gpus=(gpu, *snap.gpus[1:]))
        report = evaluate(bad, profiles, load_cuda_facts(), options=NodeOptions())
        assert not report.passed, what
        assert [c.name for c in report.checks if not c.ok] == ["health"], what
    # persistence off is a warning, not a failure
    off = dataclasses.replace(
        snap, gpus=tuple(dataclasses.replace(g, persistence_mode=False) for g in snap.gpus)
    )
    report = evaluate(off, profiles, load_cuda_facts(), options=NodeOptions())
    assert report.passed
    assert next(c for c in report.checks if c.name == "persistence").warning


def test_old_snapshot_format_still_loads(tmp_path: Path, profiles: ProfileSet) -> None:
    """Snapshots written before the health fields existed load, and judge by what they have."""
    old = {
        "version": 1,
        "hostname": "gpu-node-17",
        "driver_version": "535.104.05",
        "cuda_driver_version": "12.2",
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-1",
                "compute_capability": "9.0",
                "memory_total_mib": 81559,
                "mig_mode": False,
                "ecc_uncorrected_volatile": 0,
                "retired_pages_pending": False,
            }
        ],
        "errors": [],
    }
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    snap = load_snapshot(path)
    report = evaluate(snap, profiles, load_cuda_facts(), options=NodeOptions())
    assert report.passed


def test_no_gpus_fails(profiles: ProfileSet) -> None:
    snap = dataclasses.replace(load_snapshot(NODES / "h100-535.json"), gpus=())
    report = evaluate(snap, profiles, load_cuda_facts(), options=NodeOptions())
    assert not report.passed
    assert node_labels(snap, report) == {"buildmatrix.io/smoke": "failed"}


def test_a_gpu_nvml_counts_but_could_not_read_fails(profiles: ProfileSet) -> None:
    """nvmlDeviceGetCount says 8, seven GPUs were read (no NVML error recorded, no PCI
    view): the node is not admitted as a 7-GPU node."""
    snap = load_snapshot(NODES / "h100-535.json")
    seven = dataclasses.replace(snap, gpus=snap.gpus[:7], gpu_count=8, pci_gpus=None)
    report = evaluate(seven, profiles, load_cuda_facts(), options=NodeOptions())
    (gpus,) = [c for c in report.checks if c.name == "gpus"]
    assert not gpus.ok
    assert "NVML counts 8 GPU(s) (nvmlDeviceGetCount) but 7 could be read" in gpus.message
    all_read = dataclasses.replace(snap, gpu_count=len(snap.gpus), pci_gpus=None)
    report = evaluate(all_read, profiles, load_cuda_facts(), options=NodeOptions())
    assert report.passed


def test_no_gfd_keys_leaves_gfd_alone(profiles: ProfileSet, pools: Pools) -> None:
    snap, report = _judge("h100-535", profiles)
    labels = node_labels(snap, report, pools=pools, gfd_keys=False)
    assert not set(labels) & set(GFD_KEYS)
    assert set(SEED_KEYS) <= set(labels)
    assert labels["gpu-pool"] == "training-hopper"


# ---------------------------------------------------------------- GFD's derivations


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("NVIDIA  RTX  6000 Ada Generation", "NVIDIA-RTX-6000-Ada-Generation"),
        ("NVIDIA GeForce RTX 4090 (TM)", "NVIDIA-GeForce-RTX-4090-TM"),
        ("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB"),
        ("NVIDIA GH200 480GB", "NVIDIA-GH200-480GB"),
        ("X" * 80, "X" * 63),
    ],
)
def test_gfd_product(name: str, label: str) -> None:
    assert gfd_product(name) == label
    assert is_label_value(gfd_product(name))


def test_gfd_family_for_every_compute_capability() -> None:
    """GFD v0.20 getArchFamily over the whole CC grid."""

    def gfd(major: int, minor: int) -> str:
        if major == 7:
            return "volta" if minor < 5 else "turing"
        if major == 8:
            return "ampere" if minor < 9 else "ada-lovelace"
        return {
            1: "tesla",
            2: "fermi",
            3: "kepler",
            5: "maxwell",
            6: "pascal",
            9: "hopper",
            10: "blackwell",
            12: "blackwell",
            13: "rubin",
        }.get(major, "undefined")

    for major in range(1, 20):
        for minor in range(10):
            cc = ComputeCapability(major, minor)
            assert gfd_family_label(cc) == gfd(major, minor), cc


def test_driver_labels_keep_leading_zeros_and_two_part_versions(profiles: ProfileSet) -> None:
    snap, report = _judge("h100-535", profiles)
    labels = node_labels(snap, report)
    assert labels["nvidia.com/cuda.driver-version.revision"] == "05"
    two = dataclasses.replace(snap, driver=parse_driver_version("570.26"))
    report2 = evaluate(two, profiles, load_cuda_facts(), options=NodeOptions())
    labels2 = node_labels(two, report2)
    assert labels2["nvidia.com/cuda.driver-version.minor"] == "26"
    assert labels2["nvidia.com/cuda.driver-version.revision"] == ""
    # buildmatrix's own driver labels are plain integers, for Gt/Lt (labelkeys)
    assert [labels[f"buildmatrix.io/driver.{p}"] for p in ("major", "minor", "revision")] == [
        "535",
        "104",
        "5",
    ]
    assert labels2["buildmatrix.io/driver.revision"] == "0"
    # and one ordinal, the key affinity's driver terms read (tests/test_labelkeys.py)
    assert labels["buildmatrix.io/driver.version"] == "535104005"
    assert labels2["buildmatrix.io/driver.version"] == "570026000"


def test_label_values_are_sanitised() -> None:
    assert label_value("my image:1.0/x") == "my-image-1.0-x"
    assert label_value("-a-") == "a"
    assert label_value("é") == ""
    assert is_label_value("")
    assert not is_label_value("-a")
    assert not is_label_value("a" * 64)
    assert is_label_key("nvidia.com/gpu.product")
    assert not is_label_key("Nvidia.com/gpu")
    assert not is_label_key("nvidia.com/")


# ---------------------------------------------------------------- pools files


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"families": {"hoper": "x"}}, "Did you mean 'hopper'?"),
        ({"products": {"NVIDIA H100 80GB": "x"}}, "Did you mean 'NVIDIA H100 80GB HBM3'?"),
        ({"families": {"hopper": "training hopper"}}, "not a valid Kubernetes label value"),
        ({"families": {"hopper": "x" * 64}}, "not a valid Kubernetes label value"),
        ({"pool": {"hopper": "x"}}, "unknown key 'pool'"),
        (
            {"families": {"hopper": "train"}, "pools": {"trian": {"gpus": 8}}},
            "Did you mean 'train'",
        ),
        ({"families": {"hopper": "h"}, "pools": {"x": {}}}, "no family, product or default"),
        ({"families": {"hopper": "h"}, "pools": {"h": {"gpus": 0}}}, "pools.h.gpus"),
        ({"families": {"hopper": "h"}, "pools": {"h": {"image": ["a"]}}}, "unknown key 'image'"),
        ({"families": ["hopper"]}, "expected object"),
        (None, "the pools file is empty"),
    ],
)
def test_bad_pools(data: object, message: str, profiles: ProfileSet) -> None:
    with pytest.raises(InputError, match=r"pools\.yaml") as err:
        pools_from_data(data, source="pools.yaml", profiles=profiles)
    assert message in str(err.value)


def test_product_wins_over_family_and_default_applies(profiles: ProfileSet) -> None:
    pools = pools_from_data(
        {"families": {"ampere": "train"}, "products": {"NVIDIA A40": "infer"}, "default": "misc"},
        source="p",
        profiles=profiles,
    )
    assert pools.pool_for(product="NVIDIA A40", family="ampere") == "infer"
    assert pools.pool_for(product="NVIDIA A10", family="ampere") == "train"
    assert pools.pool_for(product="NVIDIA H200", family="hopper") == "misc"


def test_pool_specs(profiles: ProfileSet) -> None:
    pools = pools_from_data(
        {
            "families": {"hopper": "train"},
            "default": "misc",
            "pools": {"train": {"images": ["r/a:1", "r/b:2"], "gpus": 8}},
        },
        source="p",
        profiles=profiles,
    )
    assert pools.spec("train").images == ("r/a:1", "r/b:2")
    assert pools.spec("train").gpus == 8
    assert pools.spec("misc") == PoolSpec()
    assert pools.spec(None) == PoolSpec()


def test_shipped_example_pools_load(profiles: ProfileSet) -> None:
    pools = load_pools(REPO / "examples" / "pools.yaml", profiles)
    assert pools.pool_for(product="NVIDIA H200", family="hopper") == "training-hopper"
