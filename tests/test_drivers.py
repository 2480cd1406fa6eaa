"""``buildmatrix drivers``: pool floors and proposed drivers, held to ``check --snapshot``.

The images are docker-archive tars of the nvcc-built fixture libraries
(tests/fixtures/bin, compiled by CUDA 13.0, so their runtime floor is R580) and one
with a cuda-compat driver (a STAND-IN library with NVIDIA's note, tests/standins, as
tests/test_forward_compat.py uses). The oracle is the real ``check REF... --snapshot
FILE --json`` command on a node snapshot of each GPU model at the drivers in question,
and ``smoke --snapshot`` for a pool without images; it reads each image once for the
module (:class:`Scans`) and judges it afresh for every snapshot.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from buildmatrix import check_refs
from buildmatrix.cuda import DriverVersion, load_cuda_facts, major_minor, parse_driver_version
from buildmatrix.image.open import scan_image
from buildmatrix.image.platform import DEFAULT_PLATFORM
from buildmatrix.image.scanned import ScannedImage
from buildmatrix.profile_files import default_profiles_dir, load_profiles
from tests.conftest import REPO, CliRunner, validate
from tests.driver_fleet import Fleet, build_fleet

FACTS = load_cuda_facts()
SCHEMA = json.loads((REPO / "buildmatrix" / "schemas" / "drivers.schema.json").read_text())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    return build_fleet(tmp_path_factory.mktemp("fleet"))


def _below(v: DriverVersion) -> DriverVersion:
    """The highest driver version below ``v`` (two-digit revisions, as NVIDIA writes)."""
    a, b, c = v.key
    key = (a, b, c - 1) if c else (a, b - 1, 99) if b else (a - 1, 999, 99)
    return parse_driver_version(f"{key[0]}.{key[1]}.{key[2]:02d}")


class Scans:
    """Each image of the fleet read once for the module: ``check``'s own reader
    (buildmatrix.image.open.scan_image) memoised on its reference and platform. The
    tars do not change once written, and reading one is a pure function of its bytes,
    so every later ``check`` judges the very image a fresh read would give; only the
    judging (buildmatrix.check.run_check) is done again for each node."""

    def __init__(self) -> None:
        self.images: dict[tuple[str, str], ScannedImage] = {}

    def scan(self, text: str, *, platform: str = DEFAULT_PLATFORM, **kw: Any) -> ScannedImage:
        key = (text, platform)
        if key not in self.images:
            self.images[key] = scan_image(text, platform=platform, **kw)
        return self.images[key]


@pytest.fixture(scope="module")
def scans() -> Scans:
    return Scans()


class Oracle:
    """``check --snapshot`` and ``smoke --snapshot`` run as commands, cached; ``check``
    reads each image once per module (:class:`Scans`)."""

    def __init__(self, cli: CliRunner, tmp: Path, scans: Scans) -> None:
        self.cli, self.tmp, self.scans = cli, tmp, scans
        self.seen: dict[Any, dict[str, bool]] = {}

    def snapshot(self, product: str, cc: str, driver: DriverVersion) -> Path:
        path = self.tmp / f"{product}-{driver}.json".replace(" ", "_")
        doc = {
            "version": 1,
            "hostname": "oracle",
            "driver_version": str(driver),
            # NVML's CUDA version of that driver: the newest CUDA whose toolkit
            # driver it meets (as cuda.yaml lists them).
            "cuda_driver_version": major_minor(FACTS.driver_cuda(driver) or Version("10.2")),
            "gpus": [
                {"index": 0, "name": product, "compute_capability": cc, "memory_total_mib": 81559}
            ],
            "errors": [],
        }
        path.write_text(json.dumps(doc))
        return path

    def check(
        self, product: str, cc: str, driver: DriverVersion, refs: list[str]
    ) -> dict[str, bool]:
        """REF -> whether ``check --snapshot`` passes it on one GPU of ``product``."""
        key = ("check", product, driver.key, tuple(refs))
        if key not in self.seen:
            snap = self.snapshot(product, cc, driver)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(check_refs, "scan_image", self.scans.scan)
                r = self.cli("check", *refs, "--snapshot", str(snap), "--json")
            assert r.code in (0, 1), r.err
            doc = r.json()
            images = doc.get("images", [doc])
            self.seen[key] = {i["image"]: i["verdict"] == "pass" for i in images}
        return dict(self.seen[key])

    def smoke_driver(self, product: str, cc: str, driver: DriverVersion) -> bool:
        """Whether ``smoke``'s driver check passes a node of one GPU of ``product``."""
        snap = self.snapshot(product, cc, driver)
        r = self.cli("smoke", "--snapshot", str(snap), "--json")
        checks = {c["name"]: c["ok"] for c in r.json()["checks"]}
        return bool(checks["driver"])


@pytest.fixture
def oracle(cli: CliRunner, tmp_path: Path, scans: Scans) -> Oracle:
    return Oracle(cli, tmp_path, scans)


def _report(cli: CliRunner, fleet: Fleet, *args: str) -> tuple[int, dict[str, Any]]:
    r = cli("drivers", "--pools", str(fleet.pools), "--format", "json", *args)
    assert r.code in (0, 1), r.err
    doc = r.json()
    validate(doc, SCHEMA)
    return r.code, {p["name"]: p for p in doc["pools"]}


def _models(pool: dict[str, Any]) -> Iterator[tuple[str, str]]:
    profiles = load_profiles(default_profiles_dir())
    for m in pool["models"]:
        yield m["product"], str(profiles.get(m["sm"]).cc)


def test_each_pool_floor_is_the_highest_floor_check_snapshot_needs(
    cli: CliRunner, fleet: Fleet, oracle: Oracle
) -> None:
    """For every pool x model x image: ``check --snapshot`` passes at the pair's floor
    and fails just below it, and the pool's floor is the highest of these and of the
    models' hardware floors, which ``smoke`` holds the node to at and just below."""
    _, pools = _report(cli, fleet)
    for name, pool in pools.items():
        pair_floors = {(f["set_by"]): f["driver"] for f in pool["floors"]}
        needed: list[DriverVersion] = []
        for product, cc in _models(pool):
            hw = parse_driver_version(pair_floors[product])
            assert oracle.smoke_driver(product, cc, hw), (name, product, hw)
            assert not oracle.smoke_driver(product, cc, _below(hw)), (name, product, hw)
            needed.append(hw)
            for ref in fleet.own[name]:
                floor = parse_driver_version(pair_floors[f"{ref} on {product}"])
                assert oracle.check(product, cc, floor, fleet.own[name])[ref], (ref, product)
                assert not oracle.check(product, cc, _below(floor), fleet.own[name])[ref]
                needed.append(floor)
        assert pool["floor"]["driver"] == str(max(needed)), name
        # At the pool's floor every image passes on every model of the pool.
        top = parse_driver_version(pool["floor"]["driver"])
        for product, cc in _models(pool) if fleet.own[name] else ():
            assert all(oracle.check(product, cc, top, fleet.own[name]).values()), (name, product)


def test_the_floors_and_their_reasons(cli: CliRunner, fleet: Fleet) -> None:
    """What sets each floor, from the profiles and CUDA facts (docs/compatibility.md):
    the CUDA 13 runtime of the fixtures (R580, 580.65.06) beats the H200's 550.90.07;
    the B300's own floor (580.82.07) beats both; the default pool, without images, is
    held to its newest GPU's hardware floor (sm_89's 520.61.05 for the Ada products)."""
    code, pools = _report(cli, fleet)
    assert code == 0
    assert pools["training-hopper"]["floor"]["driver"] == "580.65.06"
    assert "CUDA 13.0 runtime" in " ".join(pools["training-hopper"]["floor"]["why"])
    assert pools["training-blackwell"]["floor"]["driver"] == "580.82.07"
    assert pools["training-blackwell"]["floor"]["set_by"] == "NVIDIA B300 SXM6 AC"
    assert [m["product"] for m in pools["training-blackwell"]["models"]] == [
        "NVIDIA B200",
        "NVIDIA B300 SXM6 AC",
        "NVIDIA GeForce RTX 5090",
    ]
    assert "NVIDIA A40" not in [m["product"] for m in pools["training-ampere"]["models"]]
    assert pools["general"]["images"] == []
    assert pools["general"]["floor"]["driver"] == "520.61.05"


PROPOSALS = (
    "525.60.13",
    "535.104.05",
    "550.90.07",
    "570.133.20",
    "576.0.0",
    "580.65.06",
    "590.44.01",
)


@pytest.mark.parametrize("driver", PROPOSALS)
def test_a_proposed_driver_breaks_exactly_what_check_fails(
    cli: CliRunner, fleet: Fleet, oracle: Oracle, driver: str
) -> None:
    """Every pool moved to ``driver``: the cells that fail are those ``check --snapshot``
    fails there (own images and the others), and exit 1 iff one of a pool's own fails."""
    args = [f"--driver={name}={driver}" for name in fleet.own]
    code, pools = _report(cli, fleet, *args)
    version = parse_driver_version(driver)
    every = list(fleet.refs.values())
    any_own_fails = False
    for name, pool in pools.items():
        got = {(c["image"], c["model"]): c["state"] == "fails" for c in pool["cells"]}
        for product, cc in _models(pool):
            expected = oracle.check(product, cc, version, every)
            for ref in every:
                assert got[(ref, product)] == (not expected[ref]), (name, ref, product)
                any_own_fails |= ref in fleet.own[name] and not expected[ref]
            hardware = oracle.smoke_driver(product, cc, version) if not fleet.own[name] else True
            any_own_fails |= not hardware
    assert code == (1 if any_own_fails else 0)


def test_a_compat_image_passes_on_a_listed_older_branch_but_the_floor_is_monotone(
    cli: CliRunner, fleet: Fleet
) -> None:
    """The compat image runs on R535 through its 590.44.01 compat driver (a branch its
    note lists), but not on R545 (not listed, and below the CUDA 13 runtime floor):
    its floor is the first driver from which every newer one admits it, R580's first
    (listed, older than 590.44.01), and what fails below it is named."""
    _, at535 = _report(cli, fleet, "--driver", "training-hopper=535.104.05")
    compat = fleet.refs["compat"]
    cells = [c for c in at535["training-hopper"]["cells"] if c["image"] == compat]
    assert cells and all(c["state"] != "fails" for c in cells if "H100" in c["model"])
    _, at545 = _report(cli, fleet, "--driver", "training-hopper=545.23.06")
    cells = [c for c in at545["training-hopper"]["cells"] if c["image"] == compat]
    assert all(c["state"] == "fails" for c in cells)
    floors = {f["set_by"]: f["driver"] for f in at545["training-hopper"]["floors"]}
    assert floors[f"{compat} on NVIDIA H100 80GB HBM3"] == "580.0.0"
    why = {f["set_by"]: f["why"] for f in at545["training-hopper"]["floors"]}
    assert any("580.65.06" in w for w in why[f"{compat} on NVIDIA H100 80GB HBM3"])


def test_bad_input_and_unreadable_images(cli: CliRunner, fleet: Fleet, tmp_path: Path) -> None:
    pools = str(fleet.pools)
    r = cli("drivers", "--pools", pools, "--driver", "training-hoper=580.65.06")
    assert r.code == 2 and "Did you mean 'training-hopper'?" in r.err
    r = cli("drivers", "--pools", pools, "--driver", "training-hopper=r580")
    assert r.code == 2 and "not a driver version" in r.err
    r = cli("drivers", "--pools", pools, "--driver", "training-hopper")
    assert r.code == 2 and "POOL=VERSION" in r.err
    bad = tmp_path / "pools.yaml"
    bad.write_text(json.dumps({"families": {"hopper": "h"}, "pools": {"h": {"prodcts": []}}}))
    r = cli("drivers", "--pools", str(bad))
    assert r.code == 2 and "Did you mean 'products'?" in r.err
    bad.write_text(
        json.dumps({"families": {"hopper": "h"}, "pools": {"h": {"products": ["NVIDIA H2000"]}}})
    )
    r = cli("drivers", "--pools", str(bad))
    assert r.code == 2 and "pools.h.products[0]" in r.err and "Did you mean" in r.err
    bad.write_text(
        json.dumps({"families": {"hopper": "h"}, "pools": {"h": {"products": ["NVIDIA A40"]}}})
    )
    r = cli("drivers", "--pools", str(bad))
    assert r.code == 2 and "mapped to no pool" in r.err
    # Nothing listens on port 1: the registry is unreachable, an environment failure.
    unreachable = "docker://127.0.0.1:1/ml/train:1.0"
    bad.write_text(
        json.dumps({"families": {"hopper": "h"}, "pools": {"h": {"images": [unreachable]}}})
    )
    r = cli("drivers", "--pools", str(bad))
    assert r.code == 3 and "127.0.0.1:1" in r.err


def test_text_and_markdown_name_the_floor_and_the_changes(cli: CliRunner, fleet: Fleet) -> None:
    r = cli("drivers", "--pools", str(fleet.pools), "--driver", "training-hopper=570.172.08")
    assert r.code == 1
    assert "floor:  580.65.06" in r.out and "fails at 570.172.08" in r.out
    r = cli(
        "drivers",
        "--pools",
        str(fleet.pools),
        "--driver",
        "training-hopper=570.172.08",
        "--format",
        "markdown",
    )
    assert r.code == 1
    rows = [line for line in r.out.splitlines() if line.startswith("| **")]
    assert [row.split("|")[1].strip() for row in rows] == [f"**{p}**" for p in fleet.own]
    assert "### What the proposed drivers change" in r.out and "→ **fails** at 570.172.08" in r.out


def test_a_drivers_file_proposes_as_driver_options_do(
    cli: CliRunner, fleet: Fleet, tmp_path: Path
) -> None:
    plan = tmp_path / "rollout.yaml"
    plan.write_text('training-hopper: "570.172.08"\ngeneral: "580.82.07"\n')
    by_file = _report(cli, fleet, "--drivers-file", str(plan))
    by_flag = _report(
        cli, fleet, "--driver", "training-hopper=570.172.08", "--driver", "general=580.82.07"
    )
    assert by_file == by_flag
    assert by_file[1]["training-hopper"]["proposed"] == "570.172.08"
    plan.write_text("training-hopper: 580.60\n")  # YAML's number 580.6
    r = cli("drivers", "--pools", str(fleet.pools), "--drivers-file", str(plan))
    assert r.code == 2 and "key 'training-hopper'" in r.err and "quoted" in r.err
    plan.write_text('training-hopper: "580.65.06"\n')
    r = cli(
        "drivers", "--pools", str(fleet.pools), "--drivers-file", str(plan),
        "--driver", "training-hopper=580.82.07",
    )  # fmt: skip
    assert r.code == 2 and "already given" in r.err
