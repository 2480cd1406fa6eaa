"""docs/adopt.md as another repository follows it: the workflow it gives, taken from the
page, passes actionlint and its steps run, in order, in a fresh git repository that holds
only image specs, with the pinned release installed by name (here: a wheel built at that
version's tag, offered to pip as the only index)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.pipeline import Pipeline
from tests.pipeline_scenario import run_scenario
from tests.release import build_wheel, fresh_clone, git, install_env
from tests.runner import run
from tests.services import Registry
from tests.test_generate import _tool

PAGE = (REPO / "docs" / "adopt.md").read_text()
BLOCKS = re.findall(r"```yaml\n(.*?)```", PAGE, re.DOTALL)
WORKFLOW_TEXT = next(b for b in BLOCKS if b.startswith("name: build-images"))
WORKFLOW: dict[Any, Any] = yaml.safe_load(WORKFLOW_TEXT)
PINNED: str = WORKFLOW["env"]["BUILDMATRIX"]


def _pinned_version() -> str:
    name, _, version = PINNED.partition("==")
    assert name == "buildmatrix-gpu"
    return version


def test_the_page_pins_one_release_everywhere() -> None:
    version = _pinned_version()
    action = yaml.safe_load((REPO / "action.yml").read_text())
    assert action["inputs"]["version"]["default"] == version
    assert f"uses: OWNER/buildmatrix@v{version}" in PAGE
    assert f"rev: v{version}" in PAGE
    assert f'pip install "buildmatrix-gpu=={version}"' in PAGE
    assert "pip install ." not in WORKFLOW_TEXT
    for name, job in WORKFLOW["jobs"].items():
        runs = [s["run"] for s in job["steps"] if "run" in s]
        installs = [r for r in runs if "pip install" in r]
        # a job that runs buildmatrix installs the pinned release, once, first
        uses_it = any("buildmatrix " in r for r in runs)
        assert installs == (['pip install "$BUILDMATRIX"'] if uses_it else []), name
        if uses_it:
            assert runs[0] == installs[0], name


@pytest.mark.integration
def test_the_page_workflow_passes_actionlint(tmp_path: Path) -> None:
    actionlint = _tool("actionlint")
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "build-images.yml").write_text(WORKFLOW_TEXT)
    git(tmp_path, "init", "-q")
    proc = subprocess.run([str(actionlint)], cwd=tmp_path, capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _specs_repo(path: Path) -> Path:
    """A repository as docs/adopt.md describes it: image specs, nothing else."""
    shutil.copytree(REPO / "images", path / "images")
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "image specs")
    return path


def test_the_workflow_steps_run_in_a_repository_of_image_specs(tmp_path: Path) -> None:
    version = _pinned_version()
    wheels = tmp_path / "index"
    build_wheel(fresh_clone(tmp_path, tag=f"v{version}"), wheels)
    user = _specs_repo(tmp_path / "user")
    env = {
        **WORKFLOW["env"],
        **install_env(tmp_path / "site"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "RUNNER_TEMP": str(tmp_path),
        "GITHUB_REPOSITORY_OWNER": "Example-Org",
    }
    steps = WORKFLOW["jobs"]["matrix"]["steps"]
    # up to the matrices; the step after them asks ghcr.io (the test below: the tests'
    # registry)
    last = next(n for n, s in enumerate(steps) if s.get("name") == "Compute the build matrix")
    runs = [s["run"] for s in steps[: last + 1] if "run" in s]
    for script in runs:
        step = run(user, script, env)
        assert step.returncode == 0, script + step.stdout + step.stderr
        if script.startswith("pip install"):
            said = run(user, "buildmatrix --version", env).stdout
            assert said == f"buildmatrix, version {version}\n"
    include = json.loads((tmp_path / "github.json").read_text())["include"]
    merges = json.loads((tmp_path / "merge.json").read_text())["include"]
    assert {m["tags"][0] for m in merges} == {e["tags"][0] for e in include}
    # each build job starts from its own checkout: its steps must leave in place the
    # Dockerfile and the context its matrix entry names
    checkout = tmp_path / "build-job"
    subprocess.run(["git", "clone", "-q", str(user), str(checkout)], check=True)
    build_runs = [s["run"] for s in WORKFLOW["jobs"]["build"]["steps"] if "run" in s]
    for script in build_runs[:2]:  # install, generate; the rest: the test below
        assert "check" not in script and "digest" not in script
        step = run(checkout, script, env)
        assert step.returncode == 0, script + step.stdout + step.stderr
    for entry in include:
        assert (checkout / entry["dockerfile"]).is_file(), entry["dockerfile"]
        assert (checkout / entry["context"]).is_dir(), entry["context"]
        for tag in entry["tags"]:
            assert tag.startswith(f"{WORKFLOW['env']['REGISTRY']}/example-org/"), tag


@pytest.mark.integration
def test_the_pipeline_publishes_only_what_passed_and_builds_only_what_changed(
    tmp_path: Path, registry: Registry
) -> None:
    """The page's workflow, every job as the runner runs it with the pinned release's
    own ``buildmatrix``, into the tests' registry (tests/pipeline.py, run_scenario),
    in a repository of one image spec narrowed to one CUDA release (three variants,
    a Hopper one with arm64 among them): the check gates publishing, and each run builds
    only what its content key says changed. The edit is committed as is: the workflow
    generates the Dockerfiles."""
    version = _pinned_version()
    wheels = tmp_path / "index"
    build_wheel(fresh_clone(tmp_path, tag=f"v{version}"), wheels)
    user = tmp_path / "user"
    shutil.copytree(REPO / "images" / "train-fp8", user / "images" / "train-fp8")
    spec = user / "images" / "train-fp8" / "image.yaml"
    spec.write_text(re.sub(r"(?m)^cuda: .*$", 'cuda: ["13.3.1"]', spec.read_text()))
    git(user, "init", "-q")
    git(user, "add", "-A")
    git(user, "commit", "-qm", "image specs")
    env = {**install_env(tmp_path / "site"), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    install = run(user, 'pip install "$BUILDMATRIX"', {**WORKFLOW["env"], **env})
    assert install.returncode == 0, install.stdout + install.stderr
    pipe = Pipeline(
        workflow=WORKFLOW, cwd=user, tmp=tmp_path / "runs", registry=registry.host, env=env
    )
    run_scenario(pipe, lambda: git(user, "commit", "-qam", "edit one variant"))
