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
from tests.pipeline import matrix_outputs, run, run_push_path
from tests.release import build_wheel, fresh_clone, git, install_env
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
    output = tmp_path / "github-output"
    env = {
        **WORKFLOW["env"],
        **install_env(tmp_path / "site"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "GITHUB_OUTPUT": str(output),
        "GITHUB_REPOSITORY_OWNER": "Example-Org",
    }
    runs = [s["run"] for s in WORKFLOW["jobs"]["matrix"]["steps"] if "run" in s]
    for script in runs:
        step = run(user, script, env)
        assert step.returncode == 0, script + step.stdout + step.stderr
        if script.startswith("pip install"):
            said = run(user, "buildmatrix --version", env).stdout
            assert said == f"buildmatrix, version {version}\n"
    lines = output.read_text().splitlines()
    assert [x.split("=", 1)[0] for x in lines] == ["matrix", "merge"]
    outputs = dict(x.split("=", 1) for x in lines)
    include = json.loads(outputs["matrix"])["include"]
    merges = json.loads(outputs["merge"])["include"]
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
def test_the_pipeline_publishes_only_what_passed_its_check(
    tmp_path: Path, registry: Registry
) -> None:
    """build (per platform), check (per variant, by digest, with the pinned release's
    own ``buildmatrix check``), promote and sign, as the runner runs them, into the
    tests' registry (tests/test_workflow.py, run_push_path), over two variants: a
    Hopper one, whose arm64 image the push path makes fail its check, and another."""
    version = _pinned_version()
    wheels = tmp_path / "index"
    build_wheel(fresh_clone(tmp_path, tag=f"v{version}"), wheels)
    user = _specs_repo(tmp_path / "user")
    env = {**install_env(tmp_path / "site"), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    for script in [s["run"] for s in WORKFLOW["jobs"]["build"]["steps"] if "run" in s][:2]:
        step = run(user, script, {**WORKFLOW["env"], **env})  # install, generate
        assert step.returncode == 0, script + step.stdout + step.stderr
    outputs = matrix_outputs(WORKFLOW, user, tmp_path, registry.host, env)
    merges = json.loads(outputs["merge"])["include"]
    hopper = next(m for m in merges if m["family"] == "hopper" and "linux/arm64" in m["platforms"])
    other = next(m for m in merges if m["family"] != "hopper")
    keys = {hopper["key"], other["key"]}
    for name in ("matrix", "merge"):
        include = [e for e in json.loads(outputs[name])["include"] if e["key"] in keys]
        outputs[name] = json.dumps({"include": include})
    run_push_path(WORKFLOW["jobs"], outputs, user, tmp_path / "push", env)
