"""Helpers for the release and adoption tests: a fresh clone, its wheel built at a tag,
and that wheel installed where a command run from a test finds it first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def fresh_clone(tmp_path: Path, tag: str | None = None) -> Path:
    """A clone of the committed repository without its tags, tagged ``tag`` if given."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-tags", str(REPO), str(clone)], check=True)
    if tag:
        git(clone, "tag", "-a", tag, "-m", tag)
    return clone


def build_wheel(source: Path, out: Path) -> Path:
    """The wheel pip builds from ``source`` (hatchling and hatch-vcs as installed here)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = out.glob("buildmatrix_gpu-*.whl")
    return wheel


def install_env(target: Path) -> dict[str, str]:
    """Environment for a command run from a test in which ``pip install`` puts the
    package (alone: its dependencies are this environment's) into ``target``, found
    before the checkout's own buildmatrix, with its ``buildmatrix`` command on PATH."""
    return {
        "PIP_TARGET": str(target),
        "PIP_NO_DEPS": "1",
        "PYTHONPATH": str(target),
        "PATH": os.pathsep.join([str(target / "bin"), str(Path(sys.executable).parent),
                                 os.environ["PATH"]]),
    }  # fmt: skip
