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
