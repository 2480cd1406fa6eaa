"""The shipped build workflow passes on a fresh clone: its matrix job's steps, in order.

`.github/workflows/build-images.yml` starts with ``buildmatrix generate --check`` (the
generated Dockerfiles in build/ are committed and must match the profiles and specs)
and then computes the matrix; every matrix entry must name a Dockerfile and a context
that the clone holds, since the build job uses them as they are. The jobs after it
(build, check, promote, sign) run as tests/pipeline.py runs them, into the tests'
registry, six times around edits of one variant's template (tests/pipeline_scenario.py:
change detection by content key).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.fixtures.build import shared_library_command
from tests.pipeline import Pipeline
from tests.pipeline_scenario import run_scenario
from tests.runner import run
from tests.services import Registry

WORKFLOW = REPO / ".github" / "workflows" / "build-images.yml"


def _clone(tmp_path: Path) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    return clone


def test_the_matrix_job_passes_on_a_fresh_clone(tmp_path: Path) -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    clone = _clone(tmp_path)
    steps = workflow["jobs"]["matrix"]["steps"]
    runs = [s["run"] for s in steps if "run" in s and "buildmatrix" in s["run"]]
    assert runs[0] == "buildmatrix generate --check --explain"
    env = {
        **workflow["env"],
        "RUNNER_TEMP": str(tmp_path),
        "GITHUB_REPOSITORY_OWNER": "Example-Org",  # capitals, as GitHub may give them
    }
    for script in runs:
        step = run(clone, script, env)
        assert step.returncode == 0, script + step.stdout + step.stderr
    include = json.loads((tmp_path / "github.json").read_text())["include"]
    assert include
    merge = json.loads((tmp_path / "merge.json").read_text())["include"]
    assert {m["tags"][0] for m in merge} == {e["tags"][0] for e in include}
    # the tags and the login share one setting: REGISTRY
    login = next(
        s for s in workflow["jobs"]["build"]["steps"] if "docker/login-action" in s.get("uses", "")
    )
    assert login["with"]["registry"] == "${{ env.REGISTRY }}"
    for entry in include:
        assert (clone / entry["dockerfile"]).is_file(), entry["dockerfile"]
        assert (clone / entry["context"]).is_dir(), entry["context"]
        for tag in entry["tags"]:
            assert tag.startswith(f"{workflow['env']['REGISTRY']}/example-org/"), tag


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def _hooks_commit(tmp_path: Path) -> tuple[Path, str]:
    """The repository and commit pre-commit installs the hooks from: this checkout at
    HEAD or, where its tracked files differ from HEAD, a clone with those changes
    committed, as ``pre-commit try-repo`` does (pre_commit/commands/try_repo.py,
    ``_repo_ref``), so the hooks tested are the working tree's."""

    def rev_parse(repo: Path) -> str:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()

    head = rev_parse(REPO)
    diff = subprocess.run(
        ["git", "diff", "HEAD", "--binary"], cwd=REPO, capture_output=True, check=True
    ).stdout
    if not diff:
        return REPO, head
    shadow = tmp_path / "hooks-repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(shadow)], check=True)
    _git(shadow, "checkout", "-q", "-b", "working-tree", head)
    (tmp_path / "working-tree.diff").write_bytes(diff)
    _git(shadow, "apply", "--index", str(tmp_path / "working-tree.diff"))
    _git(shadow, "commit", "-qm", "working tree")
    return shadow, rev_parse(shadow)


def _user_config(repo: Path, rev: str) -> str:
    """docs/adopt.md's ``.pre-commit-config.yaml`` (its block that names the hook), with
    this repository at ``rev`` for the release URL, and the rewriting hook added as
    .pre-commit-hooks.yaml's header shows it."""
    page = (REPO / "docs" / "adopt.md").read_text()
    (block,) = [
        b
        for b in re.findall(r"```yaml\n(.*?)```", page, re.DOTALL)
        if "buildmatrix-generate-check" in b
    ]
    config = yaml.safe_load(block)
    (entry,) = config["repos"]
    assert entry["repo"] == "https://github.com/OWNER/buildmatrix", entry
    assert entry["hooks"] == [{"id": "buildmatrix-generate-check"}], entry
    entry.update(repo=str(repo), rev=rev)
    entry["hooks"].append({"id": "buildmatrix-generate"})
    return yaml.safe_dump(config, sort_keys=False)


# pre-commit builds buildmatrix into its own environment, fetching the build backend
# from the package index: an external component, so it runs with the integration tests.
@pytest.mark.integration
@pytest.mark.index
def test_pre_commit_hooks_with_the_real_pre_commit(tmp_path: Path) -> None:
    """.pre-commit-hooks.yaml as a user's repository runs it: a .pre-commit-config.yaml
    as docs/adopt.md writes it, pointing at this checkout at a commit; pre-commit
    installs buildmatrix into its own environment once (one PRE_COMMIT_HOME for every
    call) and runs the hooks on a repository that commits its image specs and
    generated Dockerfiles."""
    pre_commit = shutil.which("pre-commit") or str(Path(sys.executable).parent / "pre-commit")
    if not Path(pre_commit).exists() or shutil.which("git") is None:
        pytest.skip("needs pre-commit (pip install pre-commit) and git")
    if not (REPO / ".git").exists():
        pytest.skip("needs a git checkout of the repository")
    hooks_repo, rev = _hooks_commit(tmp_path)
    user = tmp_path / "user-repo"
    user.mkdir()
    shutil.copytree(REPO / "images", user / "images")
    shutil.copytree(REPO / "build", user / "build")
    (user / "README.md").write_text("not a file the hooks look at\n")
    (user / ".pre-commit-config.yaml").write_text(_user_config(hooks_repo, rev))
    _git(user, "init", "-q")
    _git(user, "add", "-A")
    _git(user, "commit", "-qm", "images")
    home = tmp_path / "pre-commit-home"
    env = {**os.environ, "PRE_COMMIT_HOME": str(home)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [pre_commit, "run", "--verbose", *args],
            cwd=user,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )

    clean = run("--all-files")  # both hooks: nothing stale, nothing rewritten
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.count("Passed") == 2, clean.stdout
    for hook_id in ("buildmatrix-generate-check", "buildmatrix-generate"):
        assert f"- hook id: {hook_id}\n" in clean.stdout, clean.stdout
    assert "Installing environment" in clean.stdout + clean.stderr

    untouched = run("buildmatrix-generate-check", "--files", "README.md")  # outside `files:`
    assert untouched.returncode == 0, untouched.stdout
    assert "Skipped" in untouched.stdout and "Passed" not in untouched.stdout

    template = user / "images" / "infer" / "Dockerfile.j2"
    template.write_text(template.read_text() + "ENV EDITED=1\n")  # not regenerated
    stale = run("buildmatrix-generate-check", "--files", "images/infer/Dockerfile.j2")
    assert stale.returncode == 1, stale.stdout
    assert "Failed" in stale.stdout
    assert "buildmatrix generate" in stale.stdout  # the fix is named

    rewrite = run("buildmatrix-generate", "--all-files")
    assert rewrite.returncode == 1, rewrite.stdout  # files changed: pre-commit says so
    assert "files were modified by this hook" in rewrite.stdout
    assert all(
        "ENV EDITED=1" in f.read_text() for f in (user / "build" / "infer").glob("*.Dockerfile")
    )
    after = run("buildmatrix-generate-check", "--all-files")
    assert after.returncode == 0, after.stdout
    # the environment was built on the first call and reused by the others
    for later in (untouched, stale, rewrite, after):
        assert "Installing environment" not in later.stdout + later.stderr, later.stdout
    assert len(list(home.glob("repo*/py_env-*"))) == 1


# downloads NVIDIA's CUDA wheels from the package index
@pytest.mark.integration
@pytest.mark.index
def test_ci_installs_nvcc_from_the_pip_wheels(tmp_path: Path) -> None:
    """ci.yml's toolkit step, run as the runner would (RUNNER_TEMP, GITHUB_PATH,
    GITHUB_ENV): the nvcc it puts first on PATH builds a fixture as the suite does
    (-cudart shared), and cuobjdump reads the result."""
    ci = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    (script,) = [
        s["run"] for s in ci["jobs"]["test"]["steps"] if "nvidia-cuda-nvcc" in s.get("run", "")
    ]
    runner = {
        "RUNNER_TEMP": str(tmp_path / "runner"),
        "GITHUB_PATH": str(tmp_path / "github-path"),
        "GITHUB_ENV": str(tmp_path / "github-env"),
    }
    Path(runner["RUNNER_TEMP"]).mkdir()
    step = run(tmp_path, script.replace("python -m pip", f"{sys.executable} -m pip"), runner)
    if step.returncode != 0 and "No matching distribution" in step.stderr:
        pytest.skip("NVIDIA's CUDA wheels are not reachable from here (offline)")
    assert step.returncode == 0, step.stderr
    (bin_dir,) = Path(runner["GITHUB_PATH"]).read_text().split()
    (env_line,) = Path(runner["GITHUB_ENV"]).read_text().splitlines()
    library_path = env_line.removeprefix("LIBRARY_PATH=")
    assert Path(bin_dir, "nvcc").is_file()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin",
        "LIBRARY_PATH": library_path,
    }
    out = tmp_path / "libk.so"
    build = subprocess.run(
        shared_library_command(["-gencode=arch=compute_90,code=sm_90"], out),
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0 and shutil.which("gcc") is None:
        pytest.skip("nvcc needs gcc as its host compiler")
    assert build.returncode == 0, build.stderr
    listed = subprocess.run(
        ["cuobjdump", "--list-elf", str(out)], env=env, capture_output=True, text=True, check=False
    )
    assert listed.returncode == 0, listed.stderr
    assert "sm_90" in listed.stdout


@pytest.mark.integration  # the tests' registry
def test_the_pipeline_jobs_as_the_runner_runs_them(tmp_path: Path, registry: Registry) -> None:
    """The shipped workflow's jobs over this repository's own matrices, into the tests'
    registry (tests/pipeline.py, run_scenario): the check gates publishing, and a second
    run builds only what its content key says changed. The edit is committed with its
    regenerated Dockerfiles, as the matrix job's ``generate --check`` wants."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    clone = _clone(tmp_path)

    def commit() -> None:
        step = run(clone, "buildmatrix generate", {})
        assert step.returncode == 0, step.stderr
        _git(clone, "commit", "-qam", "edit one variant")

    run_scenario(
        Pipeline(workflow=workflow, cwd=clone, tmp=tmp_path / "runs", registry=registry.host),
        commit,
    )
