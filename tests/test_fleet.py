"""IMAGES/fleet.yaml: a repository states its fleet's CPUs once, for every spec, and
``--explain`` says why each platform of each variant is built (docs/generate.md,
"Platforms")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.profiles import ProfileSet
from tests.conftest import REPO, CliRunner


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """The shipped example specs, copied."""
    shutil.copytree(REPO / "images", tmp_path / "images")
    return tmp_path / "images"


def _entries(cli: CliRunner, images: Path) -> list[dict[str, Any]]:
    r = cli("matrix", "--images", str(images), "--format", "json")
    assert r.code == 0, r.err
    entries: list[dict[str, Any]] = r.json()["entries"]
    return entries


def test_without_a_fleet_file_every_platform_names_the_products_that_need_it(
    cli: CliRunner, images: Path, profiles: ProfileSet
) -> None:
    """Exhaustive over the shipped matrix: one line per built (variant, platform), naming
    only products of the variant's SMs that the profiles say come with that CPU."""
    entries = _entries(cli, images)
    assert {e["platform"] for e in entries} == {"linux/amd64", "linux/arm64"}
    r = cli("generate", "--images", str(images), "--out", str(images.parent / "b"), "--explain")
    lines = [x.removeprefix("platform  ") for x in r.err.splitlines() if x.startswith("platform")]
    assert len(lines) == len(entries)

    def group(image: str, family: str, cuda: str, platform: str) -> list[str]:
        return [x for x in lines if x.startswith(f"{image}: {family} cuda {cuda}")
                and f" {platform}: " in x]  # fmt: skip

    for e in entries:
        same = [
            f for f in entries if all(f[k] == e[k] for k in ("image", "family", "cuda", "platform"))
        ]
        found = group(e["image"], e["family"], e["cuda"], e["platform"])
        assert len(found) == len(same), (e["tag"], found)
        arch = e["platform"].split("/")[1]
        for line in found:
            why = line.split(f" {e['platform']}: ", 1)[1]
            assert f"come with {arch} hosts" in why or f"comes with {arch} hosts" in why
            shown = why.split(" come")[0].split(" and ")[0].split(", ")
            for product in (n.split(" (")[0] for n in shown):
                profile = profiles.by_product(product)
                assert profile is not None and profile.sm in e["sm"], (product, e["tag"])
                assert arch in profile.hosts(product)


def test_a_fleet_file_states_the_platforms_once(cli: CliRunner, images: Path) -> None:
    before = _entries(cli, images)
    (images / "fleet.yaml").write_text("platforms: [linux/amd64]\n")
    after = _entries(cli, images)
    assert {e["platform"] for e in after} == {"linux/amd64"}
    assert [e["tag"] for e in after] == [e["tag"] for e in before if e["platform"] == "linux/amd64"]
    r = cli("generate", "--images", str(images), "--out", str(images.parent / "b"), "--explain")
    assert r.code == 0, r.err
    lines = [x for x in r.err.splitlines() if x.startswith("platform")]
    assert lines and all(f"listed in {images / 'fleet.yaml'}, key 'platforms'" in x for x in lines)


def test_a_specs_own_platforms_win(cli: CliRunner, images: Path) -> None:
    (images / "fleet.yaml").write_text("platforms: [linux/amd64]\n")
    spec = images / "infer" / "image.yaml"
    spec.write_text(spec.read_text() + "platforms: [linux/arm64]\n")
    by_image = {(e["image"], e["platform"]) for e in _entries(cli, images)}
    assert {p for i, p in by_image if i == "infer"} == {"linux/arm64"}
    assert {p for i, p in by_image if i == "train-fp8"} == {"linux/amd64"}


@pytest.mark.parametrize(
    ("fleet", "key"),
    [
        ("platforms: [linux/riscv64]\n", "platforms[0]"),
        ("platforms: []\n", "platforms"),
        ("cpus: [amd64]\n", "unknown key 'cpus'"),
    ],
)
def test_a_bad_fleet_file_is_exit_2_naming_it(
    cli: CliRunner, images: Path, fleet: str, key: str
) -> None:
    (images / "fleet.yaml").write_text(fleet)
    r = cli("matrix", "--images", str(images), "--format", "json")
    assert r.code == 2
    assert str(images / "fleet.yaml") in r.err and key in r.err


def test_emulating_a_platform_the_fleet_lacks_is_exit_2(cli: CliRunner, images: Path) -> None:
    (images / "fleet.yaml").write_text("platforms: [linux/amd64]\n")
    spec = images / "train-fp8" / "image.yaml"
    spec.write_text(spec.read_text() + "emulate: [linux/arm64]\n")
    r = cli("matrix", "--images", str(images), "--format", "json")
    assert r.code == 2
    assert "key 'emulate' names linux/arm64" in r.err and "fleet.yaml" in r.err
    assert json.dumps(r.out) == '""'
