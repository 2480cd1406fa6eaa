"""The shipped build workflow passes on a fresh clone: its matrix job's steps, in order.

`.github/workflows/build-images.yml` starts with ``buildmatrix generate --check`` (the
generated Dockerfiles in build/ are committed and must match the profiles and specs)
and then computes the matrix; every matrix entry must name a Dockerfile and a context
that the clone holds, since the build job uses them as they are.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.fixtures.build import shared_library_command

WORKFLOW = REPO / ".github" / "workflows" / "build-images.yml"


def _clone(tmp_path: Path) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    return clone


def _run(
    clone: Path, script: str, env: dict[str, str], first: tuple[Path, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """One `run:` step of the workflow as the runner runs it (bash -e, the workflow's
    env, a GITHUB_OUTPUT file), with buildmatrix as installed here (stand-ins in
    ``first`` ahead of it)."""
    path = os.pathsep.join([*map(str, first), str(Path(sys.executable).parent), os.environ["PATH"]])
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=clone,
        env={**os.environ, **env, "PATH": path},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_matrix_job_passes_on_a_fresh_clone(tmp_path: Path) -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    clone = _clone(tmp_path)
    steps = workflow["jobs"]["matrix"]["steps"]
    runs = [s["run"] for s in steps if "run" in s and "buildmatrix" in s["run"]]
    assert runs[0] == "buildmatrix generate --check --explain"
    output = tmp_path / "github-output"
    env = {
        **workflow["env"],
        "GITHUB_OUTPUT": str(output),
        "GITHUB_REPOSITORY_OWNER": "Example-Org",  # capitals, as GitHub may give them
    }
    for script in runs:
        step = _run(clone, script, env)
        assert step.returncode == 0, script + step.stdout + step.stderr
    lines = output.read_text().splitlines()
    assert [x.split("=", 1)[0] for x in lines] == ["matrix", "merge"]
    include = json.loads(lines[0].removeprefix("matrix="))["include"]
    assert include
    merge = json.loads(lines[1].removeprefix("merge="))["include"]
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


# pre-commit builds buildmatrix into its own environment, fetching the build backend
# from the package index: an external component, so it runs with the integration tests.
@pytest.mark.integration
def test_pre_commit_hooks_with_the_real_pre_commit(tmp_path: Path) -> None:
    """.pre-commit-hooks.yaml as a user's repository runs it: pre-commit installs
    buildmatrix from this checkout into its own environment (try-repo) and runs the
    hooks on a repository that commits its image specs and generated Dockerfiles."""
    pre_commit = shutil.which("pre-commit") or str(Path(sys.executable).parent / "pre-commit")
    if not Path(pre_commit).exists() or shutil.which("git") is None:
        pytest.skip("needs pre-commit (pip install pre-commit) and git")
    if not (REPO / ".git").exists():
        pytest.skip("needs a git checkout of the repository")
    user = tmp_path / "user-repo"
    user.mkdir()
    shutil.copytree(REPO / "images", user / "images")
    shutil.copytree(REPO / "build", user / "build")
    _git(user, "init", "-q")
    _git(user, "add", "-A")
    _git(user, "commit", "-qm", "images")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}

    def hook(hook_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [pre_commit, "try-repo", str(REPO), hook_id, "--all-files"],
            cwd=user,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )

    clean = hook("buildmatrix-generate-check")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "Passed" in clean.stdout

    template = user / "images" / "infer" / "Dockerfile.j2"
    template.write_text(template.read_text() + "ENV EDITED=1\n")  # not regenerated
    stale = hook("buildmatrix-generate-check")
    assert stale.returncode == 1, stale.stdout
    assert "Failed" in stale.stdout
    assert "buildmatrix generate" in stale.stdout  # the fix is named

    rewrite = hook("buildmatrix-generate")
    assert rewrite.returncode == 1, rewrite.stdout  # files changed: pre-commit says so
    assert "files were modified by this hook" in rewrite.stdout
    assert all(
        "ENV EDITED=1" in f.read_text() for f in (user / "build" / "infer").glob("*.Dockerfile")
    )
    assert hook("buildmatrix-generate-check").returncode == 0


# downloads NVIDIA's CUDA wheels from the package index
@pytest.mark.integration
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
    step = _run(tmp_path, script.replace("python -m pip", f"{sys.executable} -m pip"), runner)
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


_EXPR = re.compile(r"\$\{\{(.*?)\}\}")


def _expand(text: str, ctx: dict[str, Any]) -> str:
    """The workflow expressions these jobs use, as GitHub evaluates them: a context
    path (``matrix.key``, ``runner.temp``, ``matrix.tags[0]``) or ``join(path, 'sep')``.
    Anything else fails the test, so the stand-in never silently evaluates what it does
    not know."""

    def value(path: str) -> Any:
        found: Any = ctx
        for part in path.strip().split("."):
            name, _, index = part.partition("[")
            found = found[name]
            if index:  # `tags[0]`: an array element
                found = found[int(index.removesuffix("]"))]
        return found

    def sub(m: re.Match[str]) -> str:
        expr = m[1].strip()
        join = re.fullmatch(r"join\(([\w.]+),\s*'([^']*)'\)", expr)
        if join:
            return join[2].join(value(join[1]))
        if not re.fullmatch(r"[\w.-]+(\[\d+\])?", expr):
            raise AssertionError(f"expression the stand-in does not know: {expr}")
        return str(value(expr))

    return _EXPR.sub(sub, text)


def _step(job: dict[str, Any], *, name: str | None = None, uses: str | None = None) -> Any:
    (found,) = [
        s
        for s in job["steps"]
        if (name is not None and s.get("name") == name)
        or (uses is not None and uses in s.get("uses", ""))
    ]
    return found


def _run_step(
    step: dict[str, Any], ctx: dict[str, Any], cwd: Path, path: list[Path]
) -> subprocess.CompletedProcess[str]:
    env = {k: _expand(str(v), ctx) for k, v in step.get("env", {}).items()}
    env["RUNNER_TEMP"] = ctx["runner"]["temp"]
    return _run(cwd, step["run"], env, tuple(path))


def _stand_in(folder: Path, name: str, *, log: Path, fail_on: str = "") -> Path:
    """A stand-in for a command that cannot run here (docker buildx: the test engine
    has no buildx, docs/development.md) or whose own tests live elsewhere
    (buildmatrix check): it appends its arguments to ``log``, and exits 1 when they
    contain ``fail_on``."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    test = f'case "$*" in *"{fail_on}"*) exit 1;; esac\n' if fail_on else ""
    script.write_text(
        f"#!/bin/sh\nprintf '%s %s\\n' {name} \"$*\" >> {shlex.quote(str(log))}\n{test}"
    )
    script.chmod(0o755)
    return folder


def _matrix_outputs(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    clone = _clone(tmp_path)
    output = tmp_path / "github-output"
    env = {**workflow["env"], "GITHUB_OUTPUT": str(output), "GITHUB_REPOSITORY_OWNER": "org"}
    (script,) = [
        s["run"]
        for s in workflow["jobs"]["matrix"]["steps"]
        if "--format merge" in s.get("run", "")
    ]
    step = _run(clone, script, env)
    assert step.returncode == 0, step.stderr
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    return outputs, clone


def test_build_merge_and_check_jobs_as_the_runner_runs_them(tmp_path: Path) -> None:
    """The shipped workflow's push path (run_push_path) over this repository's own
    matrices."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    outputs, clone = _matrix_outputs(tmp_path)
    run_push_path(workflow["jobs"], outputs, clone, tmp_path)


def _build_step_inputs(jobs: dict[str, Any], entry: dict[str, Any]) -> None:
    """The build job's platform handling, as its expressions give it for ``entry``:
    QEMU set up only where the entry asks, and both build-push-action steps (pull
    requests load, pushes go by digest) build the entry's one platform."""
    build = jobs["build"]
    assert build["runs-on"] == "${{ matrix.runner }}"
    assert _step(build, uses="docker/setup-qemu-action")["if"] == "matrix.qemu"
    ctx = {"matrix": entry}
    load = _step(build, name="Build and load (pull requests)")
    push = _step(build, name="Build and push by digest")
    assert load["if"] == "github.event_name == 'pull_request'"
    assert push["if"] == "github.event_name != 'pull_request'"
    for step in (load, push):
        assert _expand(step["with"]["platforms"], ctx) == entry["platform"]
        assert _expand(step["with"]["file"], ctx) == entry["dockerfile"]
    assert "tags" not in push["with"]  # the merge job tags the index
    assert _expand(push["with"]["outputs"], ctx).split(",") == [
        "type=image",
        f"name={entry['repository']}",
        "push-by-digest=true",
        "name-canonical=true",
        "push=true",
    ]


def run_push_path(jobs: dict[str, Any], outputs: dict[str, str], cwd: Path, tmp_path: Path) -> None:
    """The push path from build to check of a workflow of this shape (the shipped one,
    docs/adopt.md's), job by job, with the artifact hand-off done as
    actions/upload-artifact and download-artifact do it (names, glob pattern,
    merge-multiple): each platform's build records its digest, each family tag's merge
    job publishes exactly its platforms' digests as one index, and the check job judges
    every tag once per platform it has. ``outputs`` are the matrix job's."""
    include = json.loads(outputs["matrix"])["include"]
    merges = json.loads(outputs["merge"])["include"]
    assert {e["runner"] for e in include} == {"ubuntu-24.04", "ubuntu-24.04-arm"}
    assert jobs["merge"]["needs"] == ["matrix", "build"]
    artifacts = tmp_path / "artifacts"
    digests: dict[tuple[str, str], str] = {}
    record = _step(jobs["build"], name="Record the digest for the merge job")
    upload = _step(jobs["build"], uses="actions/upload-artifact")
    log = tmp_path / "stand-in.log"
    pr_check = _step(jobs["build"], name="Check the image from its binaries")
    fake_check = _stand_in(tmp_path / "bin-pr", "buildmatrix", log=log)
    for n, entry in enumerate(include):
        _build_step_inputs(jobs, entry)
        log.write_text("")  # pull requests: the loaded image, for its platform
        pr_ctx = {"matrix": entry, "runner": {"temp": str(tmp_path)}}
        step = _run_step(pr_check, pr_ctx, cwd, [fake_check])
        assert step.returncode == 0, step.stderr
        (call,) = log.read_text().splitlines()
        image = f"docker-daemon:{entry['tags'][0]}"
        assert call.split()[:5] == ["buildmatrix", "check", image, "--platform", entry["platform"]]
        temp = tmp_path / "build" / str(n)
        temp.mkdir(parents=True)
        digest = hashlib.sha256(f"{entry['key']} {entry['platform']}".encode()).hexdigest()
        digests[entry["tags"][0], entry["platform"]] = digest
        ctx = {
            "matrix": entry,
            "runner": {"temp": str(temp)},
            "steps": {"push": {"outputs": {"digest": f"sha256:{digest}"}}},
        }
        step = _run_step(record, ctx, cwd, [])
        assert step.returncode == 0, step.stderr
        name = _expand(upload["with"]["name"], ctx)
        files = sorted(Path("/").glob(_expand(upload["with"]["path"], ctx).lstrip("/")))
        assert [f.name for f in files] == [digest]
        assert not (artifacts / name).exists(), f"two build jobs upload {name}"
        (artifacts / name).mkdir(parents=True)
        shutil.copy(files[0], artifacts / name)
    download = _step(jobs["merge"], uses="actions/download-artifact")
    publish = _step(jobs["merge"], name="Publish the multi-platform index")
    bin_dir = _stand_in(tmp_path / "bin", "docker", log=log)
    for n, merge in enumerate(merges):
        temp = tmp_path / "merge" / str(n)
        ctx = {"matrix": merge, "runner": {"temp": str(temp)}}
        into = Path(_expand(download["with"]["path"], ctx))
        into.mkdir(parents=True)
        pattern = _expand(download["with"]["pattern"], ctx)
        for art in artifacts.iterdir():
            if fnmatch.fnmatchcase(art.name, pattern):  # merge-multiple: one folder
                for f in art.iterdir():
                    shutil.copy(f, into)
        log.write_text("")
        step = _run_step(publish, ctx, cwd, [bin_dir])
        assert step.returncode == 0, step.stdout + step.stderr
        tag = merge["tags"][0]
        refs = sorted(f"{merge['repository']}@sha256:{digests[tag, p]}" for p in merge["platforms"])
        create, inspect = log.read_text().splitlines()
        assert create.split() == [
            "docker",
            "buildx",
            "imagetools",
            "create",
            "--tag",
            tag,
            *refs,
        ]
        assert inspect.split() == ["docker", "buildx", "imagetools", "inspect", tag]
    # one platform's digest missing: the merge fails, naming the tag
    next(into.iterdir()).unlink()
    step = _run_step(publish, ctx, cwd, [bin_dir])
    assert step.returncode == 1
    assert f"::error::{merges[-1]['tags'][0]}: 1 digests for the platforms" in step.stdout
    # the check job: every tag once per platform it has, and one platform's failure
    # fails the job only after the other platform was checked too
    assert jobs["check"]["needs"] == ["matrix", "merge"]
    check = _step(jobs["check"], name="Check every platform of every tag from its binaries")
    ctx = {"needs": {"matrix": {"outputs": outputs}}, "runner": {"temp": str(tmp_path)}}
    log.write_text("")
    fake = _stand_in(tmp_path / "bin-check", "buildmatrix", log=log, fail_on="linux/amd64")
    step = _run_step(check, ctx, cwd, [fake])
    assert step.returncode == 1
    calls = log.read_text().splitlines()
    assert len(calls) == 2
    for call, platform in zip(calls, ("linux/amd64", "linux/arm64"), strict=True):
        words = call.split()
        assert words[words.index("--platform") + 1] == platform
        want = {f"docker://{m['tags'][0]}" for m in merges if platform in m["platforms"]}
        assert {w for w in words if w.startswith("docker://")} == want
