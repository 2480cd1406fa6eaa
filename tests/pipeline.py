"""The build workflow's push path run as the GitHub runner runs it, job by job, for
tests/test_workflow.py (the shipped workflow) and tests/test_adopt.py (docs/adopt.md's):
``run:`` steps in bash with the workflow's expressions expanded, artifacts handed over
as actions/upload-artifact and download-artifact do it, the registry the tests' own
(tests/services.py), stand-ins only for what cannot run here (tests/buildx_standin.py
for docker buildx, recording ones for cosign and the pull-request check)."""

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.buildx_standin import Pushed, get_manifest, push_by_digest
from tests.conftest import REPO
from tests.images import Image, fixture


def run(
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


_EXPR = re.compile(r"\$\{\{(.*?)\}\}")


def expand(text: str, ctx: dict[str, Any]) -> str:
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


def step_of(job: dict[str, Any], *, name: str | None = None, uses: str | None = None) -> Any:
    (found,) = [
        s
        for s in job["steps"]
        if (name is not None and s.get("name") == name)
        or (uses is not None and uses in s.get("uses", ""))
    ]
    return found


def run_step(
    step: dict[str, Any],
    ctx: dict[str, Any],
    cwd: Path,
    path: list[Path],
    runner_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {
        **(runner_env or {}),
        **{k: expand(str(v), ctx) for k, v in step.get("env", {}).items()},
    }
    env["RUNNER_TEMP"] = ctx["runner"]["temp"]
    return run(cwd, step["run"], env, tuple(path))


def stand_in(folder: Path, name: str, *, log: Path, fail_on: str = "") -> Path:
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


def matrix_outputs(
    workflow: dict[str, Any],
    cwd: Path,
    tmp_path: Path,
    registry: str,
    env: dict[str, str] | None = None,
) -> dict[str, str]:
    """The matrix job's "Compute the build matrix" step run in ``cwd`` with REGISTRY
    set to ``registry``; its outputs."""
    output = tmp_path / "matrix-output"
    env = {**(env or {}), **workflow["env"], "REGISTRY": registry, "GITHUB_OUTPUT": str(output)}
    env["GITHUB_REPOSITORY_OWNER"] = "org"
    script = step_of(workflow["jobs"]["matrix"], name="Compute the build matrix")["run"]
    step = run(cwd, script, env)
    assert step.returncode == 0, step.stderr
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


def _build_step_inputs(jobs: dict[str, Any], entry: dict[str, Any]) -> None:
    """The build job's platform handling, as its expressions give it for ``entry``:
    QEMU set up only where the entry asks, and both build-push-action steps (pull
    requests load, pushes go by digest) build the entry's one platform; the push
    attaches an SBOM and provenance."""
    build = jobs["build"]
    assert build["runs-on"] == "${{ matrix.runner }}"
    assert step_of(build, uses="docker/setup-qemu-action")["if"] == "matrix.qemu"
    ctx = {"matrix": entry}
    load = step_of(build, name="Build and load (pull requests)")
    push = step_of(build, name="Build and push by digest")
    assert load["if"] == "github.event_name == 'pull_request'"
    assert push["if"] == "github.event_name != 'pull_request'"
    for step in (load, push):
        assert expand(step["with"]["platforms"], ctx) == entry["platform"]
        assert expand(step["with"]["file"], ctx) == entry["dockerfile"]
    assert "tags" not in push["with"]  # only the promote job tags
    assert expand(push["with"]["outputs"], ctx).split(",") == [
        "type=image",
        f"name={entry['repository']}",
        "push-by-digest=true",
        "name-canonical=true",
        "push=true",
    ]
    assert push["with"]["sbom"] is True
    assert push["with"]["provenance"] == "mode=max"


PUSH_ONLY = (
    "${{ !cancelled() && github.event_name != 'pull_request' && needs.matrix.result == 'success' }}"
)


def _job_shapes(jobs: dict[str, Any]) -> None:
    """The stages' order and conditions: check and promote run whatever other variants'
    builds and checks did (not cancelled), never on pull requests; only sign may ask
    for an OIDC token; only build, promote and sign write packages."""
    assert jobs["check"]["needs"] == ["matrix", "build"]
    assert jobs["promote"]["needs"] == ["matrix", "check"]
    assert jobs["sign"]["needs"] == "promote"
    assert jobs["check"]["if"] == jobs["promote"]["if"] == PUSH_ONLY
    assert jobs["check"]["strategy"]["fail-fast"] is False
    assert jobs["check"]["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.merge) }}"
    assert "needs.promote.outputs.promoted != ''" in jobs["sign"]["if"]
    for name, job in jobs.items():
        perms = job.get("permissions", {})
        assert ("id-token" in perms) == (name == "sign"), name
        assert (perms.get("packages") == "write") == (name in ("build", "promote", "sign")), name
        for step in job["steps"]:
            if "uses" in step and not step["uses"].startswith("./"):
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
    assert jobs["sign"]["permissions"]["id-token"] == "write"
    step_of(jobs["sign"], uses="sigstore/cosign-installer")


def _image_for(entry: dict[str, Any], *, fails: bool) -> Image:
    """What the entry's build would push, in small: the family label the generated
    Dockerfile writes and a library with device code. ``libmulti.so`` has SASS for
    sm_75..sm_120 (every shipped family); ``libsass_sm80.so`` only sm_80, no PTX: no
    code for a Hopper or Blackwell GPU."""
    lib = fixture("libsass_sm80.so" if fails else "libmulti.so")
    return Image(
        layers=[{"usr/lib/libk.so": lib}],
        labels={"io.buildmatrix.family": entry["family"]},
        platform={"os": "linux", "architecture": entry["arch"]},
    )


def _artifact_upload(upload: dict[str, Any], ctx: dict[str, Any], store: Path) -> None:
    """actions/upload-artifact: the files ``path`` matches, under ``name``; a name
    uploaded twice fails (artifacts are immutable in v4)."""
    name = expand(upload["with"]["name"], ctx)
    files = sorted(Path("/").glob(expand(upload["with"]["path"], ctx).lstrip("/")))
    assert files or upload["with"].get("if-no-files-found") != "error"
    assert not (store / name).exists(), f"two jobs upload {name}"
    (store / name).mkdir(parents=True)
    for f in files:
        shutil.copy(f, store / name)


def _artifact_download(download: dict[str, Any], ctx: dict[str, Any], store: Path) -> Path:
    """actions/download-artifact with ``pattern`` (``src/download-artifact.ts`` at
    v4.3.0): into ``path``, each artifact in a folder of its name, or all in one with
    ``merge-multiple``; a pattern that matches nothing downloads nothing, no error."""
    into = Path(expand(download["with"]["path"], ctx))
    into.mkdir(parents=True, exist_ok=True)
    pattern = expand(download["with"]["pattern"], ctx)
    for art in sorted(store.iterdir()):
        if fnmatch.fnmatchcase(art.name, pattern):
            target = into if download["with"].get("merge-multiple") else into / art.name
            target.mkdir(exist_ok=True)
            for f in art.iterdir():
                shutil.copy(f, target)
    return into


def _runner(tmp_path: Path, name: str) -> dict[str, Any]:
    temp = tmp_path / "runner" / name
    temp.mkdir(parents=True)
    return {"temp": str(temp)}


def run_push_path(
    jobs: dict[str, Any],
    outputs: dict[str, str],
    cwd: Path,
    tmp_path: Path,
    runner_env: dict[str, str] | None = None,
) -> None:
    """The push path of a workflow of this shape (the shipped one, docs/adopt.md's),
    job by job, into the registry the matrix's repositories name (the tests'):

    - build: per entry, the pull-request check (a stand-in that records its
      arguments), the push by digest with SBOM and provenance (tests/buildx_standin.py
      writes the index buildx would), the digest record and its upload;
    - check: per variant, its digests downloaded and judged by the real
      ``buildmatrix check``, one platform at a time. One variant's arm64 image lacks
      its family's SASS: that variant fails, every other passes;
    - promote: the variants that passed, and only they, get their family tag (the
      ``docker buildx imagetools`` stand-in writes the index to the registry, which is
      the oracle for what was published); the failed one is named;
    - sign: ``cosign sign`` (a stand-in that records) once per published index, by the
      digest the registry gives its tag.

    The artifact hand-offs are done as actions/upload-artifact and download-artifact
    do them. ``outputs`` are the matrix job's; ``runner_env`` is added to every
    step's environment (where buildmatrix is installed)."""
    _job_shapes(jobs)
    include = json.loads(outputs["matrix"])["include"]
    merges = json.loads(outputs["merge"])["include"]
    assert {e["runner"] for e in include} == {"ubuntu-24.04", "ubuntu-24.04-arm"}
    failing = next(m for m in merges if m["family"] == "hopper" and "linux/arm64" in m["platforms"])
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir(parents=True)
    log = tmp_path / "stand-in.log"
    env = {
        **(runner_env or {}),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
    }
    pushed: dict[tuple[str, str], Pushed] = {}
    build = jobs["build"]
    record = step_of(build, name="Record the digest and its platform for the check job")
    pr_check = step_of(build, name="Check the image from its binaries")
    fake_check = stand_in(tmp_path / "bin-pr", "buildmatrix", log=log)
    for n, entry in enumerate(include):
        _build_step_inputs(jobs, entry)
        log.write_text("")  # pull requests: the loaded image, for its platform
        pr_ctx = {"matrix": entry, "runner": {"temp": str(tmp_path)}}
        step = run_step(pr_check, pr_ctx, cwd, [fake_check], env)
        assert step.returncode == 0, step.stderr
        (call,) = log.read_text().splitlines()
        image = f"docker-daemon:{entry['tags'][0]}"
        assert call.split()[:5] == ["buildmatrix", "check", image, "--platform", entry["platform"]]
        fails = entry["key"] == failing["key"] and entry["platform"] == "linux/arm64"
        host, _, repository = entry["repository"].partition("/")
        done = push_by_digest(host, repository, _image_for(entry, fails=fails))
        pushed[entry["key"], entry["platform"]] = done
        ctx = {
            "matrix": entry,
            "runner": _runner(tmp_path, f"build{n}"),
            "steps": {"push": {"outputs": {"digest": done.index}}},
        }
        step = run_step(record, ctx, cwd, [], env)
        assert step.returncode == 0, step.stderr
        _artifact_upload(step_of(build, uses="actions/upload-artifact"), ctx, artifacts)
    _check_variants(jobs, merges, failing, pushed, cwd, tmp_path, env, artifacts)
    promoted = _promote(jobs, outputs, merges, failing, pushed, cwd, tmp_path, env, artifacts)
    _sign(jobs, promoted, cwd, tmp_path, env)


def _check_variants(
    jobs: dict[str, Any],
    merges: list[dict[str, Any]],
    failing: dict[str, Any],
    pushed: dict[tuple[str, str], Pushed],
    cwd: Path,
    tmp_path: Path,
    env: dict[str, str],
    artifacts: Path,
) -> None:
    """Each leg of the check job: download, judge each platform by digest, upload the
    checked digests only when the step passed (upload-artifact's default ``if:
    success()``)."""
    check = jobs["check"]
    download = step_of(check, uses="actions/download-artifact")
    judge = step_of(check, name="Check every platform's digest from its binaries")
    upload = step_of(check, uses="actions/upload-artifact")
    assert "if" not in upload

    def leg(n: int, merge: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        ctx = {"matrix": merge, "runner": _runner(tmp_path, f"check{n}")}
        _artifact_download(download, ctx, artifacts)
        return ctx, run_step(judge, ctx, cwd, [], env)

    # the legs of a matrix job run side by side, each on its own runner
    with ThreadPoolExecutor(max_workers=4) as pool:
        legs = list(pool.map(leg, range(len(merges)), merges))
    for merge, (ctx, step) in zip(merges, legs, strict=True):
        tag = merge["tags"][0]
        judged = Path(ctx["runner"]["temp"], "checked", "judged").read_text().splitlines()
        # one line per platform, naming the image manifest judged (not the index, not
        # the attestation manifest beside it), by digest
        want = {
            (
                pushed[merge["key"], p].manifest,
                p,
                "fail" if merge is failing and p == "linux/arm64" else "pass",
            )
            for p in merge["platforms"]
        }
        assert {tuple(line.split()[:3]) for line in judged} == want, step.stdout + step.stderr
        for line in judged:
            _digest, platform, _, ref = line.split(" ", 3)
            assert ref == f"docker://{merge['repository']}@{pushed[merge['key'], platform].index}"
        if merge is failing:
            assert step.returncode == 1, step.stdout + step.stderr
            assert "no runnable code" in step.stdout, step.stdout
            continue
        assert step.returncode == 0, tag + step.stdout + step.stderr
        _artifact_upload(upload, ctx, artifacts)
    # a platform whose build pushed nothing: the leg fails, naming tag and platform
    merge = merges[0]
    ctx = {"matrix": merge, "runner": _runner(tmp_path, "check-missing")}
    into = _artifact_download(download, ctx, artifacts)
    lost = next(f for f in into.iterdir() if f.read_text().strip() == merge["platforms"][-1])
    lost.unlink()
    step = run_step(judge, ctx, cwd, [], env)
    assert step.returncode == 1
    assert (
        f"::error::{merge['tags'][0]}: 0 digests pushed for {merge['platforms'][-1]}" in step.stdout
    )


def _promote(
    jobs: dict[str, Any],
    outputs: dict[str, str],
    merges: list[dict[str, Any]],
    failing: dict[str, Any],
    pushed: dict[tuple[str, str], Pushed],
    cwd: Path,
    tmp_path: Path,
    env: dict[str, str],
    artifacts: Path,
) -> list[str]:
    """The promote job: the registry holds the family tag of every variant that passed,
    as an index of exactly its checked platforms' images and their attestations, and
    no tag for the one that failed. Returns the job's ``promoted`` output."""
    promote = jobs["promote"]
    ctx: dict[str, Any] = {
        "needs": {"matrix": {"outputs": outputs}},
        "runner": _runner(tmp_path, "promote"),
    }
    _artifact_download(step_of(promote, uses="actions/download-artifact"), ctx, artifacts)
    log = tmp_path / "docker.log"
    docker = tmp_path / "bin-docker"
    docker.mkdir()
    python = f"PYTHONPATH={shlex.quote(str(REPO))} exec {shlex.quote(sys.executable)}"
    (docker / "docker").write_text(
        f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {shlex.quote(str(log))}\n"
        f'{python} -m tests.buildx_standin "$@"\n'
    )
    (docker / "docker").chmod(0o755)
    output = tmp_path / "promote-output"
    step = run_step(
        step_of(promote, name="Publish the family tags of the variants that passed"),
        ctx,
        cwd,
        [docker],
        {**env, "GITHUB_OUTPUT": str(output)},
    )
    assert step.returncode == 0, step.stdout + step.stderr
    assert promote["outputs"]["promoted"] == "${{ steps.promote.outputs.promoted }}"
    (line,) = output.read_text().splitlines()
    promoted = line.removeprefix("promoted=").split()
    assert f"::error::{failing['tags'][0]} is not published: its check did not pass" in step.stdout
    for merge in merges:
        host, _, repository = merge["repository"].partition("/")
        for tag in merge["tags"]:
            got = get_manifest(host, repository, tag.rsplit(":", 1)[1])
            if merge is failing:
                assert got is None, f"{tag} was published though its check failed"
                continue
            assert got is not None, f"{tag} was not published"
            body, media_type = got
            index = json.loads(body)
            assert media_type == "application/vnd.oci.image.index.v1+json"
            done = [pushed[merge["key"], p] for p in merge["platforms"]]
            assert sorted(d["digest"] for d in index["manifests"]) == sorted(
                x for d in done for x in (d.manifest, d.attestation)
            )
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
            assert f"{merge['repository']}@{digest}" in promoted
    assert len(promoted) == len(merges) - 1
    # each passing variant's index made once, from its platforms' pushed digests
    creates = [c.split() for c in log.read_text().splitlines() if "imagetools create" in c]
    assert len(creates) == len(merges) - 1
    for merge, words in zip([m for m in merges if m is not failing], creates, strict=True):
        sources = [
            f"{merge['repository']}@{pushed[merge['key'], p].index}" for p in merge["platforms"]
        ]
        assert words[:3] == ["buildx", "imagetools", "create"]
        assert words[3:] == [x for t in merge["tags"] for x in ("--tag", t)] + sorted(sources)
    return promoted


def _sign(
    jobs: dict[str, Any], promoted: list[str], cwd: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    sign = step_of(jobs["sign"], name="Sign every published index by digest")
    log = tmp_path / "cosign.log"
    cosign = stand_in(tmp_path / "bin-cosign", "cosign", log=log)
    ctx = {
        "needs": {"promote": {"outputs": {"promoted": " ".join(promoted)}}},
        "runner": _runner(tmp_path, "sign"),
    }
    step = run_step(sign, ctx, cwd, [cosign], env)
    assert step.returncode == 0, step.stderr
    calls = log.read_text().splitlines()
    assert calls == [f"cosign sign --yes --recursive {ref}" for ref in promoted]
