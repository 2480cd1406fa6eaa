"""One output convention: every command that can print JSON takes --format json (text,
YAML or a table stays the default), and --json, where a command had it, prints the
same as --format json. Checked over the whole command tree, and on the output itself."""

from __future__ import annotations

import json

import click
import pytest

from buildmatrix.cli import cli as root
from tests.conftest import REPO, CliRunner

LIB = str(REPO / "tests" / "fixtures" / "bin" / "libmulti.so")
NODE = str(REPO / "tests" / "fixtures" / "nodes" / "h100-535.json")


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in group.commands.items():
        path = (*prefix, name)
        found.append(path)
        if isinstance(command, click.Group):
            found += _commands(command, path)
    return found


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = root
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def _option(command: click.Command, flag: str) -> click.Option | None:
    return next((p for p in command.params if isinstance(p, click.Option) and flag in p.opts), None)


def test_every_command_that_prints_json_takes_format_json() -> None:
    speaking = 0
    for path in _commands(root):
        command = _command(path)
        fmt, flag = _option(command, "--format"), _option(command, "--json")
        if fmt is None and flag is None:
            continue
        speaking += 1
        assert fmt is not None, f"{' '.join(path)} has --json but no --format"
        assert isinstance(fmt.type, click.Choice), path
        assert "json" in fmt.type.choices, path
        if path != ("labels",):  # labels has printed JSON by default from the start
            assert fmt.default != "json", f"{' '.join(path)}: JSON must not be the default"
    assert speaking >= 8  # check, inspect, profiles (+ show), smoke, labels, affinity, ...


@pytest.mark.parametrize(
    "args",
    [
        ["profiles"],
        ["profiles", "show", "9.0"],
        ["inspect", LIB],
        ["check", LIB, "--family", "hopper", "--no-cache"],
        ["smoke", "--snapshot", NODE],
    ],
)
def test_json_is_format_json(cli: CliRunner, args: list[str]) -> None:
    flag = cli(*args, "--json")
    fmt = cli(*args, "--format", "json")
    text = cli(*args)
    assert flag.code == fmt.code == text.code
    assert json.loads(flag.out) == json.loads(fmt.out)
    assert json.loads(fmt.out)["version"] == 1
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.out)  # the default stays text
    # --json wins whatever the order, as it did alone
    assert json.loads(cli(*args, "--format", "text", "--json").out) == json.loads(fmt.out)


def test_smoke_without_nvml_has_the_documented_keys(cli: CliRunner) -> None:
    """docs/smoke.md, --json: version, verdict, node, checks, labels, load_test; here
    without NVML (none on this machine), as a node without a driver reports."""
    result = cli("smoke", "--format", "json")
    if result.code != 3:
        pytest.skip("NVML answers here: the node was read")
    doc = result.json()
    assert set(doc) == {"version", "verdict", "node", "checks", "labels", "load_test"}
    assert doc["verdict"] == "fail"
    assert doc["labels"] == {"buildmatrix.io/smoke": "failed"}
    assert doc["node"] is None and doc["load_test"] == []
    full = cli("smoke", "--snapshot", NODE, "--format", "json").json()
    assert set(doc) <= set(full)


POOLS = str(REPO / "examples" / "pools.yaml")
AFFINE = str(REPO / "tests" / "fixtures" / "bin" / "libsass_ptx.so")
# Every command that prints JSON, with arguments that make it print some, and what its
# JSON is (README, "Output"): a document of buildmatrix's own ("version": 1), or
# Kubernetes objects as kubectl reads them (one object, or a v1 List of several), or
# affinity's Pod-spec field. A new command that prints JSON must be placed here.
JSON_OUTPUTS: dict[tuple[str, ...], tuple[list[str], str]] = {
    ("profiles",): ([], "document"),
    ("profiles", "show"): (["9.0"], "document"),
    ("matrix",): ([], "document"),
    ("inspect",): ([LIB], "document"),
    ("check",): ([LIB, "--family", "hopper", "--no-cache"], "document"),
    ("smoke",): (["--snapshot", NODE], "document"),
    ("labels",): (["--snapshot", NODE], "document"),
    ("drivers",): (["--pools", POOLS], "document"),
    ("affinity",): ([AFFINE], "pod-spec field"),
    ("k8s", "manifests"): ([], "kubernetes"),
    ("k8s", "drivers"): (["--pools", POOLS, "--driver", "training-hopper=580.65.06"], "kubernetes"),
    ("k8s", "gate"): ([], "kubernetes"),
    ("k8s", "nodepools"): (
        ["--pools", POOLS, "--driver", "training-hopper=580.65.06", "--provisioner", "karpenter"],
        "kubernetes",
    ),
}


def _prints_json(path: tuple[str, ...]) -> bool:
    command = _command(path)
    fmt = _option(command, "--format")
    has_json = fmt is not None and isinstance(fmt.type, click.Choice) and "json" in fmt.type.choices
    return has_json or _option(command, "--json") is not None


def test_every_command_that_prints_json_is_placed() -> None:
    speaking = {p for p in _commands(root) if _prints_json(p)}
    assert speaking == set(JSON_OUTPUTS), "place the command in JSON_OUTPUTS"


@pytest.mark.parametrize("path", sorted(JSON_OUTPUTS), ids=" ".join)
def test_every_json_output_is_what_the_readme_says(
    cli: CliRunner, path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    args, kind = JSON_OUTPUTS[path]
    r = cli(*path, *args, "--format", "json")
    assert r.code in (0, 1), r.err  # 1: a check that failed still prints its JSON
    doc = json.loads(r.out)  # one JSON document, nothing after it
    assert isinstance(doc, dict)
    if kind == "document":
        assert doc["version"] == 1
    elif kind == "kubernetes":
        assert "version" not in doc and doc["apiVersion"] and doc["kind"]
        if doc["kind"] == "List":
            assert doc["apiVersion"] == "v1"
            assert all(item["apiVersion"] and item["kind"] for item in doc["items"])
    else:
        assert set(doc) == {"affinity"}
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"buildmatrix {' '.join(path)}" in readme
