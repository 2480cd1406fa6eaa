"""Releases: the version is the release tag, a clone without tags still installs, and
the release workflow's build and test steps pass on a tagged clone
(.github/workflows/release.yml; docs/development.md, "Releases")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.release import build_wheel, fresh_clone, install_env
from tests.runner import run as _run

RELEASE = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
ACTION = yaml.safe_load((REPO / "action.yml").read_text())


def _version_of(target: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **install_env(target)}
    return subprocess.run(
        ["buildmatrix", "--version"], capture_output=True, text=True, check=False, env=env
    )


def _install(wheel: Path, target: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip


def test_the_version_is_the_release_tag(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path, tag="v9.8.7")
    wheel = build_wheel(clone, tmp_path / "dist")
    assert wheel.name == "buildmatrix_gpu-9.8.7-py3-none-any.whl"
    _install(wheel, tmp_path / "site")
    proc = _version_of(tmp_path / "site")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "buildmatrix, version 9.8.7\n"


def test_a_clone_without_tags_installs_with_a_development_version(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path)
    wheel = build_wheel(clone, tmp_path / "dist")
    commit = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], cwd=clone, capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    match = re.fullmatch(r"buildmatrix_gpu-(\d+\.\d+\.\d+\.dev\d+\+g([0-9a-f]+))-py3-none-any\.whl",
                         wheel.name)  # fmt: skip
    assert match, wheel.name
    assert match.group(2).startswith(commit)
    _install(wheel, tmp_path / "site")
    assert _version_of(tmp_path / "site").stdout == f"buildmatrix, version {match.group(1)}\n"


def _steps(job: str) -> list[dict[str, str]]:
    steps: list[dict[str, str]] = RELEASE["jobs"][job]["steps"]
    return steps


@pytest.mark.integration  # python -m build fetches the build backend from the package index
@pytest.mark.index
def test_the_release_workflow_builds_and_tests_the_artifacts_of_a_tag(tmp_path: Path) -> None:
    """The dist job's run steps on a clone tagged with the version action.yml pins, then
    the test job's step that runs the sdist's tests on the installed wheel (here only
    tests/test_cli.py, through PYTEST_ADDOPTS; the wheel installed as install_env says,
    its dependencies this environment's). The build step needs the package index."""
    version = ACTION["inputs"]["version"]["default"]
    clone = fresh_clone(tmp_path, tag=f"v{version}")
    env = {"GITHUB_REF_NAME": f"v{version}"}
    for step in (s for s in _steps("dist") if "run" in s):
        proc = _run(clone, step["run"], env)
        if proc.returncode != 0 and "No matching distribution" in proc.stdout + proc.stderr:
            pytest.skip("the build backends are not reachable from here (offline)")
        assert proc.returncode == 0, step["run"] + proc.stdout + proc.stderr
    dist = sorted(p.name for p in (clone / "dist").iterdir())
    assert dist == [f"buildmatrix_gpu-{version}-py3-none-any.whl",
                    f"buildmatrix_gpu-{version}.tar.gz"]  # fmt: skip
    (install, tests) = [s["run"] for s in _steps("test") if "run" in s]
    assert "[test]" in install  # the test tools come with the wheel
    _install(clone / "dist" / dist[0], tmp_path / "site")
    runner = tmp_path / "runner"
    runner.mkdir()
    env |= install_env(tmp_path / "site") | {"RUNNER_TEMP": str(runner)}
    # the sdist's tests package, not the one an editable install of this checkout
    # exposes (the job's fresh environment has none); the wheel stays first
    env["PYTHONPATH"] += os.pathsep + str(runner / "sdist")
    env["PYTEST_ADDOPTS"] = f"tests/test_cli.py --basetemp={tmp_path / 'pt'}"
    proc = _run(clone, tests, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\d+ passed", proc.stdout), proc.stdout
    # the same step refuses to test the sdist's own buildmatrix/ instead of the wheel
    env["PYTHONPATH"] = str(runner / "sdist")
    wrong = _run(clone, tests, env)
    assert wrong.returncode == 1
    assert f"not version {version}" in wrong.stdout


def test_the_release_notes_are_the_changelog_section(tmp_path: Path) -> None:
    (step,) = [s["run"] for s in _steps("github-release") if "awk" in s.get("run", "")]
    version = ACTION["inputs"]["version"]["default"]
    (tmp_path / "CHANGELOG.md").write_text((REPO / "CHANGELOG.md").read_text())
    proc = _run(tmp_path, step, {"GITHUB_REF_NAME": f"v{version}"})
    assert proc.returncode == 0, proc.stderr
    notes = (tmp_path / "notes.md").read_text()
    assert "buildmatrix-gpu" in notes
    assert "## [" not in notes
    missing = _run(tmp_path, step, {"GITHUB_REF_NAME": "v0.0.0"})
    assert missing.returncode != 0  # no section, no release


def test_the_release_workflow_publishes_with_trusted_publishing() -> None:
    assert RELEASE[True]["push"]["tags"] == ["v[0-9]+.[0-9]+.[0-9]+*"]  # yaml reads on: as True
    publish = RELEASE["jobs"]["publish"]
    assert publish["permissions"] == {"id-token": "write"}
    assert "password" not in str(publish)  # no token: the index trusts the workflow
    (uses,) = [s["uses"] for s in publish["steps"] if "pypi-publish" in s.get("uses", "")]
    assert re.fullmatch(r"pypa/gh-action-pypi-publish@[0-9a-f]{40}", uses)
    assert publish["needs"] == "test"
    image = RELEASE["jobs"]["image"]
    runs = "\n".join(s.get("run", "") for s in image["steps"])
    assert "for platform in linux/amd64 linux/arm64" in runs
    assert "--platform linux/amd64,linux/arm64 --push" in runs
    assert RELEASE["jobs"]["github-release"]["needs"] == ["publish", "image"]


def test_the_shipped_action_installs_the_pinned_release() -> None:
    """In other repositories the action installs buildmatrix-gpu by name at the version
    its action.yml names; only its self-test (version: "") installs the checkout."""
    version = ACTION["inputs"]["version"]["default"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert f"## [{version}]" in (REPO / "CHANGELOG.md").read_text()
    steps = ACTION["runs"]["steps"]
    (install,) = [s["run"] for s in steps if s.get("name") == "Install buildmatrix"]
    assert 'pip install "buildmatrix-gpu==$VERSION"' in install
    self_test = yaml.safe_load((REPO / ".github" / "workflows" / "check-action.yml").read_text())
    (step,) = [s for s in self_test["jobs"]["self-test"]["steps"] if s.get("uses") == "./"]
    assert step["with"]["version"] == ""
