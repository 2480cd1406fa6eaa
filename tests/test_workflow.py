"""The shipped build workflow passes on a fresh clone: its matrix job's steps, in order.

`.github/workflows/build-images.yml` starts with ``buildmatrix generate --check`` (the
generated Dockerfiles in build/ are committed and must match the profiles and specs)
and then computes the matrix; every matrix entry must name a Dockerfile and a context
that the clone holds, since the build job uses them as they are.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

WORKFLOW = REPO / ".github" / "workflows" / "build-images.yml"


def _clone(tmp_path: Path) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    return clone


def _run(clone: Path, command: str) -> subprocess.CompletedProcess[str]:
    """One `run:` line of the workflow, with buildmatrix as installed here."""
    args = command.split()
    assert args[0] == "buildmatrix", command
    return subprocess.run(
        [sys.executable, "-m", "buildmatrix", *args[1:]],
        cwd=clone,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_matrix_job_passes_on_a_fresh_clone(tmp_path: Path) -> None:
    clone = _clone(tmp_path)
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["matrix"]["steps"]
    runs = [s["run"] for s in steps if "run" in s and "buildmatrix" in s["run"]]
    assert runs[0] == "buildmatrix generate --check --explain"
    check = _run(clone, runs[0])
    assert check.returncode == 0, check.stdout + check.stderr
    matrix_line = runs[1]  # echo "matrix=$(buildmatrix matrix --format github)" >> …
    command = matrix_line.split("$(", 1)[1].split(")", 1)[0]
    matrix = _run(clone, command)
    assert matrix.returncode == 0, matrix.stderr
    include = json.loads(matrix.stdout)["include"]
    assert include
    for entry in include:
        assert (clone / entry["dockerfile"]).is_file(), entry["dockerfile"]
        assert (clone / entry["context"]).is_dir(), entry["context"]
