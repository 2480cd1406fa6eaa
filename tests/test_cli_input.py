"""Bad values on the command line (buildmatrix/cli/_common.py): an empty or blank value
is exit 2 naming the option, never its default in its place, for every option of every
command; an empty environment variable still counts as unset (click's rule)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from buildmatrix.cli import cli as root
from tests.conftest import REPO, CliRunner
from tests.fixtures.build import BIN


def _value_options() -> list[tuple[list[str], str]]:
    """(command words, option) for every option of every command that takes a value."""
    found: list[tuple[list[str], str]] = []

    def walk(command: click.Command, words: list[str]) -> None:
        for param in command.params:
            if isinstance(param, click.Option) and not (param.is_flag or param.count):
                found.append((words, param.opts[0]))
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, [*words, name])

    walk(root, [])
    return found


VALUE_OPTIONS = _value_options()


def test_the_walk_finds_the_options_of_the_report() -> None:
    """--driver "" passed check with the driver floors dropped; so did these."""
    for option in ("--driver", "--platform", "--cache", "--containerd-root", "--profiles"):
        assert (["check"], option) in VALUE_OPTIONS
    assert (["k8s", "manifests"], "--interval") in VALUE_OPTIONS
    assert len(VALUE_OPTIONS) > 80


@pytest.mark.parametrize("value", ["", " "])
@pytest.mark.parametrize(
    ("words", "option"), VALUE_OPTIONS, ids=[" ".join([*w, o]) for w, o in VALUE_OPTIONS]
)
def test_an_empty_value_is_bad_input_naming_the_option(
    cli: CliRunner, words: list[str], option: str, value: str
) -> None:
    result = cli(*words, option, value)
    assert result.code == 2, result.out
    assert f"Invalid value for '{option}'" in result.err


def test_an_empty_driver_does_not_drop_the_driver_floor(cli: CliRunner) -> None:
    """The report's case: a CI step's --driver "$NODE_DRIVER" with the variable unset
    passed an image that the node's driver cannot run."""
    library = str(BIN / "libhopper_a.so")
    assert cli("check", library, "--sm", "9.0", "--driver", "520.61.05").code == 1
    result = cli("check", library, "--sm", "9.0", "--driver", "")
    assert result.code == 2
    assert result.out == ""
    assert "Invalid value for '--driver': the value is empty" in result.err
    assert "leave out --driver" in result.err
    blank = cli("check", library, "--sm", "9.0", "--driver", "  ")
    assert blank.code == 2
    assert "Invalid value for '--driver': the value is blank" in blank.err


@pytest.mark.parametrize(
    "args",
    [["check", ""], ["inspect", ""], ["affinity", " "], ["profiles", "show", ""]],
)
def test_an_empty_argument_is_bad_input(cli: CliRunner, args: list[str]) -> None:
    """``inspect ""`` read the current folder (Path("") is ".")."""
    result = cli(*args)
    assert result.code == 2
    assert "the value is" in result.err


def test_an_empty_environment_variable_counts_as_unset(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """docs/check.md, docs/profiles.md: $BUILDMATRIX_PROFILES and $CONTAINERD_ROOT
    name a folder where set; set to empty, the default applies, as click reads it."""
    monkeypatch.setenv("BUILDMATRIX_PROFILES", "")
    monkeypatch.setenv("CONTAINERD_ROOT", "")
    result = cli("check", str(BIN / "libhopper_a.so"), "--sm", "9.0")
    assert result.code == 0, result.err
    assert cli("profiles").code == 0
    monkeypatch.setenv("CONTAINERD_ROOT", str(tmp_path))
    assert cli("check", "containerd:team/app:1", "--sm", "9.0").code == 3


def test_a_blank_environment_variable_is_named(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blank value from an option's environment variable names the variable, not an
    option that was never given."""
    monkeypatch.setenv("NODE_NAME", " ")
    r = cli("smoke", "--snapshot", str(REPO / "tests" / "fixtures" / "nodes" / "h100-535.json"))
    assert r.code == 2
    assert "the environment variable NODE_NAME is blank" in r.err
