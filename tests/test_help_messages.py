"""Help texts and messages as a user meets them, through the CLI: what --into takes,
"Did you mean" punctuation, --min-memory units, a product name where an SM or a
family belongs, generate's summary, profiles show's product floors, and the top-level
command list."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from buildmatrix.affinity import _POD_SPEC_PATHS
from buildmatrix.cli import cli as root
from buildmatrix.profile_files import load_profiles
from tests.conftest import REPO, SHIPPED_PROFILES, CliRunner

LIB = str(REPO / "tests" / "fixtures" / "bin" / "libmulti.so")


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_affinity_help_names_every_kind_into_merges_into(cli: CliRunner) -> None:
    help_text = _flat(cli("affinity", "--help").out)
    for kind in _POD_SPEC_PATHS:
        assert kind in help_text, kind


def test_an_unknown_feature_gets_sentences(cli: CliRunner) -> None:
    result = cli("affinity", LIB, "--require", "fp9")
    assert result.code == 2
    err = _flat(result.err)
    assert "--require fp9: not a feature the profiles know. Did you mean 'fp8'? Features: " in err
    assert "?;" not in err


def _gt(out: str) -> str:
    lines = out.splitlines()
    at = next(i for i, x in enumerate(lines) if "buildmatrix.io/gpu.memory-mb" in x)
    return lines[at + 3].strip()


@pytest.mark.parametrize(
    ("given", "mib"),
    [
        ("71680", 71680),
        ("70GiB", 70 * 1024),
        ("70 gib", 70 * 1024),
        ("1.5GiB", 1536),
        ("40960MiB", 40960),
        ("80GB", math.ceil(80 * 10**9 / 2**20)),
        ("40000MB", math.ceil(40000 * 10**6 / 2**20)),
    ],
)
def test_min_memory_takes_units(cli: CliRunner, given: str, mib: int) -> None:
    """Each spelling gives the same affinity as the MiB integer it means."""
    with_unit = cli("affinity", LIB, "--min-memory", given)
    plain = cli("affinity", LIB, "--min-memory", str(mib))
    assert with_unit.code == plain.code == 0, with_unit.err
    assert _gt(with_unit.out) == _gt(plain.out)
    assert with_unit.out == plain.out


@pytest.mark.parametrize("given", ["70 gigs", "7.5", "GB", "-3", "0"])
def test_min_memory_says_what_it_takes(cli: CliRunner, given: str) -> None:
    result = cli("affinity", LIB, "--min-memory", given)
    assert result.code == 2
    assert "--min-memory" in result.err
    assert "MiB, an integer" in result.err or "at least 1 MiB" in result.err


@pytest.mark.parametrize("option", ["--sm", "--family"])
def test_a_product_name_says_its_family_and_sm(cli: CliRunner, option: str) -> None:
    result = cli("check", LIB, option, "H100")
    assert result.code == 2
    assert "'H100' is a GPU product" in result.err
    assert "pass --family hopper, or --sm sm_90." in _flat(result.err)


def test_every_shipped_product_model_maps_to_its_profile() -> None:
    """Exhaustive over the shipped profiles: the model word of each NVML product name
    (A100 of 'NVIDIA A100-SXM4-80GB', L40S of 'NVIDIA L40S') names its profile's SM and
    family."""
    profiles = load_profiles(SHIPPED_PROFILES)
    for profile in profiles.profiles:
        for product in profile.products:
            model = product.removeprefix("NVIDIA ").split()[0].split("-")[0]
            hint = profiles.product_hint(model)
            assert f"--sm {profile.sm}" in hint, (product, hint)
            assert f"--family {profile.family.value}" in hint, (product, hint)
    assert profiles.product_hint("hopper") == ""


def test_generate_points_to_explain_only_without_it(cli: CliRunner, tmp_path: Path) -> None:
    images = str(REPO / "images")
    plain = cli("generate", "--images", images, "--out", str(tmp_path / "a"))
    assert plain.code == 0
    assert "(--explain says why)" in plain.out
    explained = cli("generate", "--images", images, "--out", str(tmp_path / "b"), "--explain")
    assert explained.code == 0
    assert "left out" in explained.err
    assert "--explain" not in explained.out


def test_profiles_show_prints_product_floors_one_per_line(cli: CliRunner) -> None:
    floors = cli("profiles", "show", "9.0", "--json").json()["profile"]["product_floors"]
    assert floors
    out = cli("profiles", "show", "9.0").out
    assert "{'" not in out
    for product, floor in floors.items():
        line = next(x for x in out.splitlines() if f" {product}  " in x)
        assert line.rstrip().endswith(f"{product}  {floor['min_driver']}  ({floor['source']})")


def test_the_command_list_is_never_cut(cli: CliRunner) -> None:
    out = cli("--help").out.split("Commands:")[1]
    assert "..." not in out and "…" not in out
    flat = _flat(out)
    for name, command in root.commands.items():
        first = _flat((command.help or "").split("\n\n")[0])
        assert f"{name} {first}" in flat, name
