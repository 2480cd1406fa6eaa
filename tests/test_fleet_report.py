"""The shipped fleet (examples/fleet/pools.yaml): `drivers` has something to show, and
"What the proposed drivers change" compares each pool with its current driver
(docs/drivers.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from buildmatrix.cuda import parse_driver_version
from tests.conftest import REPO, CliRunner

FLEET = REPO / "examples" / "fleet" / "pools.yaml"


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the images are dir: folders relative to the repository


def _pools() -> dict[str, dict[str, object]]:
    pools: dict[str, dict[str, object]] = yaml.safe_load(FLEET.read_text())["pools"]
    return pools


def test_every_pool_has_images_and_a_current_driver() -> None:
    for name, pool in _pools().items():
        assert pool["images"], name
        for ref in pool["images"]:  # type: ignore[attr-defined]
            assert (REPO / str(ref).removeprefix("dir:")).is_dir(), ref
        assert pool["driver"], name


def test_each_pool_is_judged_at_its_current_driver_against_its_floor(cli: CliRunner) -> None:
    r = cli("drivers", "--pools", str(FLEET), "--format", "json")
    doc = r.json()
    assert r.code == (0 if doc["verdict"] == "pass" else 1)
    failing = []
    for pool in doc["pools"]:
        current = _pools()[pool["name"]]["driver"]
        assert pool["current"] == current == pool["judged_at"]
        below = parse_driver_version(str(current)) < parse_driver_version(pool["floor"]["driver"])
        assert (pool["verdict"] == "fail") is below, pool["name"]
        failing += [pool["name"]] if below else []
    assert failing  # the example shows a pool to fix
    html = cli("drivers", "--pools", str(FLEET), "--format", "html").out
    assert "current driver where the pools file states it (pools.&lt;name&gt;.driver)" in html
    assert f"no verdict changes; still failing: {', '.join(failing)}" in html


def test_a_proposal_is_compared_with_the_current_driver(cli: CliRunner, tmp_path: Path) -> None:
    doc = cli("drivers", "--pools", str(FLEET), "--format", "json").json()
    fixes = [f"{p['name']}={p['floor']['driver']}" for p in doc["pools"] if p["verdict"] == "fail"]
    args = [a for fix in fixes for a in ("--driver", fix)]
    r = cli("drivers", "--pools", str(FLEET), *args)
    assert r.code == 0, r.out
    for fix in fixes:
        pool, driver = fix.split("=")
        current = _pools()[pool]["driver"]
        assert f"fails at {current} (current) -> native at {driver}" in r.out
    md = cli("drivers", "--pools", str(FLEET), *args, "--format", "markdown").out
    assert "### What the proposed drivers change" in md and "(current) → **native**" in md
