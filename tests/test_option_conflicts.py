"""Options that make no sense together are refused with exit 2, naming both, never
one of them silently ignored (docs/kubernetes.md, "Helm values").

Walked over every option of ``k8s manifests``: a new option must be placed here, as
shaping the manifests only or the Helm values too, or this test fails.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from buildmatrix.cli import cli as root
from tests.conftest import REPO, CliRunner

# One valid example value per option of `k8s manifests` (a flag: no value).
EXAMPLES: dict[str, list[str]] = {
    "tool_image": ["--image", "registry.example/buildmatrix:1.0"],
    "pools": ["--pools", str(REPO / "examples" / "pools.yaml")],
    "namespace": ["--namespace", "gpu-admission"],
    "interval": ["--interval", "900"],
    "deadline": ["--deadline", "1800"],
    "load_test": ["--load-test"],
    "registry_secret": ["--registry-secret", "pull"],
    "node_selectors": ["--node-selector", "pool=gpu"],
    "runtime_class": ["--runtime-class"],
    "example_job": ["--example-job"],
    "containerd": ["--containerd"],
    "gfd_keys": ["--gfd-keys", "always"],
    "kubernetes_version": ["--kubernetes-version", "1.31"],
    "no_node_policy": ["--no-node-policy"],
    "mig_strategy": ["--mig-strategy", "single"],
    "source_grace": ["--source-grace", "3600"],
    "device_request": ["--device-request", "cdi-annotation"],
}
# What the Helm values depend on, so that --gpu-operator-values/--nfd-values take them.
VALUES = {"operator_values", "nfd_values", "mode", "fmt", "profiles_dir", "taint_key"}


def _manifests() -> click.Command:
    group = root.commands["k8s"]
    assert isinstance(group, click.Group)
    return group.commands["manifests"]


def test_every_option_is_placed() -> None:
    names = {p.name for p in _manifests().params if p.name}
    assert names == set(EXAMPLES) | VALUES, "place the new option in EXAMPLES or VALUES"


@pytest.mark.parametrize("chart", ["--gpu-operator-values", "--nfd-values"])
@pytest.mark.parametrize("option", sorted(EXAMPLES))
def test_values_refuse_what_only_shapes_the_manifests(
    cli: CliRunner, chart: str, option: str, tmp_path: Path
) -> None:
    args = EXAMPLES[option]
    extra: list[str] = []
    if option == "load_test":  # the load test needs every pool's images
        pools = tmp_path / "pools.yaml"
        pools.write_text("families: {hopper: train}\npools:\n  train: {images: [r.example/t:1]}\n")
        extra = ["--pools", str(pools)]
    alone = cli("k8s", "manifests", *args, *extra)
    assert alone.code == 0, alone.err  # the example is valid on its own
    r = cli("k8s", "manifests", chart, *args)
    assert r.code == 2, r.out
    assert f"{chart} and {args[0]} cannot be used together" in r.err
    assert r.out == ""


@pytest.mark.parametrize("chart", ["--gpu-operator-values", "--nfd-values"])
@pytest.mark.parametrize("mode", ["apply", "nfd"])
def test_values_take_the_mode_and_format(cli: CliRunner, chart: str, mode: str) -> None:
    r = cli("k8s", "manifests", chart, "--mode", mode, "--format", "json")
    assert r.code == 0, r.err


@pytest.mark.parametrize("option", ["no_node_policy", "kubernetes_version"])
def test_nfd_mode_refuses_node_policy_options(cli: CliRunner, option: str) -> None:
    """--mode nfd gives the agent no API rights, hence renders no node policy: the
    options about that policy mean nothing there. In apply mode they are taken."""
    args = EXAMPLES[option]
    assert cli("k8s", "manifests", "--mode", "apply", *args).code == 0
    r = cli("k8s", "manifests", "--mode", "nfd", *args)
    assert r.code == 2
    assert f"--mode nfd and {args[0]} cannot be used together" in r.err


def test_an_old_cluster_leaves_the_policy_out(cli: CliRunner) -> None:
    """--kubernetes-version 1.29 with --no-node-policy is the documented way for a
    cluster older than 1.30: both are taken."""
    r = cli("k8s", "manifests", "--kubernetes-version", "1.29", "--no-node-policy")
    assert r.code == 0, r.err
    assert "ValidatingAdmissionPolicy" not in r.out
