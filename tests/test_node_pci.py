"""The PCI bus as sysfs shows it (node/pci.py) and the GPU-count check over it.

The sysfs trees are STAND-INS for /sys (tests/fixtures/sysfs/README.md), laid out as
the kernel's: folders under devices/ linked from bus/pci/devices.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from buildmatrix.cuda import load_cuda_facts
from buildmatrix.node.checks import NodeOptions, evaluate
from buildmatrix.node.pci import is_nvidia_gpu, read_gpus
from buildmatrix.node.pools import pools_from_data
from buildmatrix.profiles import ProfileSet
from buildmatrix.snapshot import bus_id_key, load_snapshot
from tests.conftest import REPO
from tests.standins import sysfs_tree

HGX = REPO / "tests" / "fixtures" / "sysfs" / "hgx-h100"
NODES = REPO / "tests" / "fixtures" / "nodes"
HGX_GPUS = [f"0000:{b}:00.0" for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]


def test_hgx_board_has_eight_gpus_not_switches_audio_or_the_bmc() -> None:
    gpus = read_gpus(HGX)
    assert gpus is not None
    assert [g.bus_id for g in gpus] == HGX_GPUS
    assert {g.pci_class for g in gpus} == {"0x030200"}
    assert {g.device for g in gpus} == {"0x2330"}
    # the tree does hold the other functions: 4 NVSwitches, audio, BMC VGA, NIC
    assert len(list((HGX / "bus" / "pci" / "devices").iterdir())) == 15


def test_no_sysfs_is_not_recorded(tmp_path: Path) -> None:
    assert read_gpus(tmp_path / "absent") is None
    assert read_gpus(sysfs_tree(tmp_path / "empty", [])) == ()


def test_unreadable_function_files_are_skipped(tmp_path: Path) -> None:
    root = sysfs_tree(
        tmp_path / "sys",
        [{"bus_id": "0000:18:00.0", "vendor": "0x10de", "device": "0x2330", "class": "0x030200"}],
    )
    bad = root / "bus" / "pci" / "devices" / "0000:19:00.0"
    bad.mkdir()
    (bad / "vendor").write_text("garbage\n")
    gpus = read_gpus(root)
    assert gpus is not None
    assert [g.bus_id for g in gpus] == ["0000:18:00.0"]


def test_gpu_classes_exhaustively() -> None:
    """Every base class and subclass under vendor 0x10de: a GPU iff base 0x03 with
    subclass 0x00 (VGA) or 0x02 (3D controller), whatever the programming interface
    (PCI Code and ID Assignment Specification, base class 03h); no class of another
    vendor is."""
    for base_sub in range(0x10000):
        base, sub = base_sub >> 8, base_sub & 0xFF
        for prog_if in (0x00, 0x01, 0x80, 0xFF):
            pci_class = base_sub << 8 | prog_if
            assert is_nvidia_gpu(0x10DE, pci_class) == (base == 0x03 and sub in (0x00, 0x02))
    for vendor in (0x1A03, 0x15B3, 0x8086, 0x1002, 0x10DF, 0x0000):
        assert not is_nvidia_gpu(vendor, 0x030200)
        assert not is_nvidia_gpu(vendor, 0x030000)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("0000:3b:00.0", "0000:3b:00.0"),  # sysfs
        ("00000000:3B:00.0", "0000:3b:00.0"),  # nvmlPciInfo_t.busId
        ("0000:3B:00.0", "0000:3b:00.0"),  # nvmlPciInfo_t.busIdLegacy
        ("3b:00.0", "0000:3b:00.0"),  # lspci without -D
        ("00000001:DB:1F.7", "0001:db:1f.7"),
        (" 0000:18:00.0\n", "0000:18:00.0"),
    ],
)
def test_bus_id_spellings_meet(text: str, key: str) -> None:
    assert bus_id_key(text) == key


@pytest.mark.parametrize("text", ["", "GPU-1234", "0000:3b:00", "0000:3b:00.8", "0000:3g:00.0"])
def test_not_a_bus_id(text: str) -> None:
    assert bus_id_key(text) is None


def test_bus_id_round_trip_over_every_address() -> None:
    """Property: NVML's and sysfs's spellings of one address always meet; two
    different addresses never do."""
    seen = set()
    for bus in range(0, 256, 7):
        for device in range(32):
            for function in range(8):
                sysfs = f"0000:{bus:02x}:{device:02x}.{function}"
                nvml = f"00000000:{bus:02X}:{device:02X}.{function}"
                assert bus_id_key(sysfs) == bus_id_key(nvml) == sysfs
                seen.add(bus_id_key(nvml))
    assert len(seen) == len(range(0, 256, 7)) * 32 * 8


def _count_check(name: str, profiles: ProfileSet, **opts: object) -> tuple[bool, str]:
    snap = load_snapshot(NODES / f"{name}.json")
    report = evaluate(snap, profiles, load_cuda_facts(), options=NodeOptions(**opts))  # type: ignore[arg-type]
    (check,) = [c for c in report.checks if c.name == "gpus"]
    return check.ok, check.message


def test_a_gpu_only_the_pci_bus_shows_fails_the_node_by_name(profiles: ProfileSet) -> None:
    ok, message = _count_check("hgx-h100-7-of-8", profiles)
    assert not ok
    assert "the PCI bus has 8 NVIDIA GPU(s), NVML shows 7: 0000:9a:00.0 not shown by NVML" in (
        message
    )
    assert _count_check("hgx-h100-8", profiles) == (
        True,
        "8 GPU(s) visible, 8 on the PCI bus",
    )


def test_every_single_lost_gpu_is_named(profiles: ProfileSet) -> None:
    """Property: whichever one of the 8 GPUs NVML lacks, the check names exactly it."""
    full = load_snapshot(NODES / "hgx-h100-8.json")
    for lost in full.gpus:
        snap = dataclasses.replace(full, gpus=tuple(g for g in full.gpus if g is not lost))
        report = evaluate(snap, profiles, load_cuda_facts(), options=NodeOptions())
        (check,) = [c for c in report.checks if c.name == "gpus"]
        named = [b for b in HGX_GPUS if b in check.message]
        assert not check.ok
        assert named == [bus_id_key(lost.pci_bus_id or "")]


def test_expected_counts_from_the_flag_and_the_pool(profiles: ProfileSet) -> None:
    pools = pools_from_data(
        {"families": {"hopper": "training-hopper"}, "pools": {"training-hopper": {"gpus": 8}}},
        source="pools.yaml",
        profiles=profiles,
    )
    ok, message = _count_check("h100-lost-gpu", profiles, pools=pools)
    assert not ok
    assert "7 GPU(s) visible, 8 expected (pools.training-hopper.gpus in pools.yaml)" in message
    ok, message = _count_check("h100-535", profiles, pools=pools, expect_gpus=8)
    assert ok
    assert message == (
        "8 GPU(s) visible (PCI bus not read), 8 expected (--expect-gpus), "
        "8 expected (pools.training-hopper.gpus in pools.yaml)"
    )
    # a GPU gone from the PCI bus too (NVML 7, PCI 7): only the expectation sees it
    snap = load_snapshot(NODES / "hgx-h100-7-of-8.json")
    gone = dataclasses.replace(
        snap, pci_gpus=tuple(p for p in snap.pci_gpus or () if p.bus_id != "0000:9a:00.0")
    )
    report = evaluate(gone, profiles, load_cuda_facts(), options=NodeOptions(pools=pools))
    (check,) = [c for c in report.checks if c.name == "gpus"]
    assert not check.ok
    assert check.message.startswith("7 GPU(s) visible, 8 expected (pools.training-hopper.gpus")
    report = evaluate(gone, profiles, load_cuda_facts(), options=NodeOptions())
    assert [c.ok for c in report.checks if c.name == "gpus"] == [True]
