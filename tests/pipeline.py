"""The build workflow run as the GitHub runner runs it, job by job, for
tests/test_workflow.py (the shipped workflow) and tests/test_adopt.py (docs/adopt.md's):
the matrix job (the real ``skopeo`` asks the tests' registry which content tags it has),
build, check, promote and sign (tests/runner.py runs the steps), into the registry the
matrix's repositories name (the tests' own, tests/services.py). Stand-ins only for what
cannot run here: tests/buildx_standin.py for docker buildx, recording ones for cosign
and the pull-request check.

:class:`Pipeline` keeps the registry between runs, as a repository's successive
workflow runs share theirs; tests/pipeline_scenario.py runs it around edits."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildmatrix.attest import PREDICATE_TYPE
from tests.buildx_standin import Pushed, push_by_digest
from tests.pipeline_jobs import (
    annotations_of,
    assert_published,
    build_step_inputs,
    image_for,
    job_shapes,
    lines,
    stored,
)
from tests.runner import (
    artifact_download,
    artifact_upload,
    cosign_stand_in,
    docker_stand_in,
    expand,
    run_step,
    runner_temp,
    skopeo_plain_http,
    stand_in,
    step_of,
)


@dataclass(frozen=True, kw_only=True)
class Run:
    """What one workflow run did."""

    outputs: dict[str, str]  # the matrix job's
    variants: list[dict[str, Any]]  # every merge entry, skipped or not
    built: set[tuple[str, str]]  # (key, platform) pushed by the build job
    checked: list[str]  # keys of the check job's legs
    creates: list[list[str]]  # `docker buildx imagetools create` arguments
    promoted: list[str]
    signed: list[str]


@dataclass(kw_only=True)
class Pipeline:
    """A repository's workflow runs into one registry. ``env`` is added to every step
    (where buildmatrix is installed). The first run picks the failing variant: the
    first Hopper one with an arm64 platform; the image of its arm64 entry's content key
    lacks its family's SASS, and so does every rebuild from the same inputs."""

    workflow: dict[str, Any]
    cwd: Path
    tmp: Path
    registry: str
    env: dict[str, str] = field(default_factory=dict)
    owner: str = field(default_factory=lambda: f"org{uuid.uuid4().hex[:8]}")
    bad: set[str] = field(default_factory=set)  # content keys whose image fails
    failing: str = ""  # that variant's key
    runs: int = 0

    def run(self) -> Run:
        self.runs += 1
        temp = self.tmp / f"run{self.runs}"
        temp.mkdir(parents=True)
        jobs = self.workflow["jobs"]
        job_shapes(jobs)
        env = {
            **self.env,
            "XDG_CACHE_HOME": str(self.tmp / "cache"),
            "GITHUB_STEP_SUMMARY": str(temp / "summary.md"),
        }
        outputs = self._matrix_job(temp, env)
        present = json.loads(outputs["present"])["include"]
        todo = json.loads(outputs["merge"])["include"]
        variants = todo + present
        # the skip step's oracle: the registry as its own client reads it
        assert {m["key"] for m in present} == {
            m["key"] for m in variants if stored(m["content_tag"]) is not None
        }
        if not self.failing:
            failing = next(
                m for m in todo if m["family"] == "hopper" and "linux/arm64" in m["platforms"]
            )
            self.failing = failing["key"]
            include = json.loads(outputs["matrix"])["include"]
            self.bad = {
                e["content_key"]
                for e in include
                if e["key"] == self.failing and e["platform"] == "linux/arm64"
            }
        artifacts = temp / "artifacts"
        artifacts.mkdir()
        pushed, fails = self._build(outputs, temp, env, artifacts)
        checked = self._check(todo, pushed, fails, temp, env, artifacts) if todo else []
        before = {t: stored(t) for m in variants for t in [*m["tags"], m["content_tag"]]}
        creates, promoted = self._promote(outputs, pushed, fails, before, temp, env, artifacts)
        signed = self._sign(promoted, temp, env)
        return Run(
            outputs=outputs,
            variants=variants,
            built=set(pushed),
            checked=checked,
            creates=creates,
            promoted=promoted,
            signed=signed,
        )

    def _matrix_job(self, temp: Path, env: dict[str, str]) -> dict[str, str]:
        """The matrix job's ``run:`` steps in order (buildmatrix is installed
        already), each with its own GITHUB_OUTPUT; its outputs as its ``outputs:``
        expressions give them."""
        job = self.workflow["jobs"]["matrix"]
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=self.cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        env = {
            **env,
            **self.workflow["env"],
            "REGISTRY": self.registry,
            "GITHUB_REPOSITORY_OWNER": self.owner,
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": f"{self.owner}/images",
            "GITHUB_SHA": sha,
        }
        login = step_of(job, uses="docker/login-action")
        assert "if" not in login and login["with"]["registry"] == "${{ env.REGISTRY }}"
        skopeo = skopeo_plain_http(temp / "bin-skopeo", temp / "skopeo.log")
        ctx: dict[str, Any] = {"runner": runner_temp(temp, "matrix"), "steps": {}}
        for n, step in enumerate(s for s in job["steps"] if "run" in s):
            if step["run"].startswith("pip install"):
                continue
            output = temp / f"matrix-output-{n}"
            done = run_step(step, ctx, self.cwd, [skopeo], {**env, "GITHUB_OUTPUT": str(output)})
            assert done.returncode == 0, step["run"] + done.stdout + done.stderr
            assert "::warning::" not in done.stdout, done.stdout  # the registry answered
            if "id" in step:
                written = output.read_text().splitlines()
                ctx["steps"][step["id"]] = {"outputs": dict(x.split("=", 1) for x in written)}
        outputs = {k: expand(v, ctx) for k, v in job["outputs"].items()}
        entries = [json.loads(outputs[k])["include"] for k in ("matrix", "merge", "present")]
        created = set()
        for m in [e for group in entries for e in group]:  # as metadata-action gives them
            level = "manifest" if "platform" in m else "index"
            got = annotations_of(m["annotations"], level)
            created.add(got.pop("org.opencontainers.image.created"))
            assert got == {
                "org.opencontainers.image.revision": sha,
                "org.opencontainers.image.source": f"https://github.com/{self.owner}/images",
            }
            if level == "manifest":
                assert m["oci_labels"] == [x.partition(":")[2] for x in m["annotations"]]
        (when,) = created  # one time for the whole run
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.000Z", when), when
        return outputs

    def _build(
        self, outputs: dict[str, str], temp: Path, env: dict[str, str], artifacts: Path
    ) -> tuple[dict[tuple[str, str], Pushed], set[tuple[str, str]]]:
        """Per entry left to build: the pull-request check (a stand-in that records
        its arguments), the push by digest (tests/buildx_standin.py writes what
        build-push-action would, labels and annotations from the step's inputs), the
        digest record and its upload."""
        include = json.loads(outputs["matrix"])["include"]
        assert (outputs["build"] == "true") == bool(include)
        build = self.workflow["jobs"]["build"]
        record = step_of(build, name="Record the digest and its platform for the check job")
        pr_check = step_of(build, name="Check the image from its binaries")
        push = step_of(build, name="Build and push by digest")
        log = temp / "pr-check.log"
        fake_check = stand_in(temp / "bin-pr", "buildmatrix", log=log)
        pushed: dict[tuple[str, str], Pushed] = {}
        fails = set()
        for n, entry in enumerate(include):
            build_step_inputs(build, entry)
            log.write_text("")  # pull requests: the loaded image, for its platform
            step = run_step(
                pr_check,
                {"matrix": entry, "runner": {"temp": str(temp)}},
                self.cwd,
                [fake_check],
                env,
            )
            assert step.returncode == 0, step.stderr
            (call,) = log.read_text().splitlines()
            image = f"docker-daemon:{entry['tags'][0]}"
            assert call.split()[:5] == [
                "buildmatrix",
                "check",
                image,
                "--platform",
                entry["platform"],
            ]
            ctx = {"matrix": entry}
            labels = lines(expand(push["with"]["labels"], ctx))
            notes = annotations_of(lines(expand(push["with"]["annotations"], ctx)), "manifest")
            if entry["content_key"] in self.bad:
                fails.add((entry["key"], entry["platform"]))
            img = image_for(entry, labels, fails=entry["content_key"] in self.bad)
            host, _, repository = entry["repository"].partition("/")
            done = push_by_digest(host, repository, img, notes)
            pushed[entry["key"], entry["platform"]] = done
            ctx = {
                "matrix": entry,
                "runner": runner_temp(temp, f"build{n}"),
                "steps": {"push": {"outputs": {"digest": done.index}}},
            }
            step = run_step(record, ctx, self.cwd, [], env)
            assert step.returncode == 0, step.stderr
            artifact_upload(step_of(build, uses="actions/upload-artifact"), ctx, artifacts)
        return pushed, fails

    def _check(
        self,
        merges: list[dict[str, Any]],
        pushed: dict[tuple[str, str], Pushed],
        fails: set[tuple[str, str]],
        temp: Path,
        env: dict[str, str],
        artifacts: Path,
    ) -> list[str]:
        """Each leg of the check job: download, judge each platform by digest with the
        real ``buildmatrix check``, upload the checked digests only when the step passed
        (upload-artifact's default ``if: success()``). On the first run, one more leg
        whose platform pushed nothing must fail naming tag and platform."""
        check = self.workflow["jobs"]["check"]
        download = step_of(check, uses="actions/download-artifact")
        judge = step_of(check, name="Check every platform's digest from its binaries")
        upload = step_of(check, uses="actions/upload-artifact")
        assert "if" not in upload

        def leg(n: int, merge: dict[str, Any]) -> tuple[dict[str, Any], Any]:
            ctx = {"matrix": merge, "runner": runner_temp(temp, f"check{n}")}
            artifact_download(download, ctx, artifacts)
            return ctx, run_step(judge, ctx, self.cwd, [], env)

        with ThreadPoolExecutor(max_workers=4) as pool:  # the legs run side by side
            legs = list(pool.map(leg, range(len(merges)), merges))
        for merge, (ctx, step) in zip(merges, legs, strict=True):
            judged = Path(ctx["runner"]["temp"], "checked", "judged").read_text().splitlines()
            bad = {p for p in merge["platforms"] if (merge["key"], p) in fails}
            want = {
                (pushed[merge["key"], p].manifest, p, "fail" if p in bad else "pass")
                for p in merge["platforms"]
            }
            assert {tuple(line.split()[:3]) for line in judged} == want, step.stdout + step.stderr
            for line in judged:
                _digest, platform, _, ref = line.split(" ", 3)
                assert (
                    ref == f"docker://{merge['repository']}@{pushed[merge['key'], platform].index}"
                )
            if bad:
                assert step.returncode == 1, step.stdout + step.stderr
                assert "no runnable code" in step.stdout, step.stdout
                continue
            assert step.returncode == 0, merge["tags"][0] + step.stdout + step.stderr
            artifact_upload(upload, ctx, artifacts)
        if self.runs == 1:
            merge = merges[0]
            ctx = {"matrix": merge, "runner": runner_temp(temp, "check-missing")}
            into = artifact_download(download, ctx, artifacts)
            last = merge["platforms"][-1]
            next(f for f in into.iterdir() if f.read_text().strip() == last).unlink()
            step = run_step(judge, ctx, self.cwd, [], env)
            assert step.returncode == 1
            assert f"::error::{merge['tags'][0]}: 0 digests pushed for {last}" in step.stdout
        return [m["key"] for m in merges]

    def _promote(
        self,
        outputs: dict[str, str],
        pushed: dict[tuple[str, str], Pushed],
        fails: set[tuple[str, str]],
        before: dict[str, bytes | None],
        temp: Path,
        env: dict[str, str],
        artifacts: Path,
    ) -> tuple[list[list[str]], list[str]]:
        """The promote job, with the registry as the oracle afterwards: an unchanged
        variant's family tags hold its content tag's index (re-pointed only where they
        did not); a built variant that passed has its family tags and content tag on
        one index of exactly its platforms' images and attestations, with the run's
        index annotations; one that failed has neither changed. Returns the
        ``imagetools create`` calls and the job's ``promoted`` output."""
        promote = self.workflow["jobs"]["promote"]
        ctx: dict[str, Any] = {
            "needs": {"matrix": {"outputs": outputs}},
            "runner": runner_temp(temp, "promote"),
        }
        artifact_download(step_of(promote, uses="actions/download-artifact"), ctx, artifacts)
        log = temp / "docker.log"
        log.write_text("")
        with docker_stand_in(temp / "bin-docker", log) as docker:
            keep = step_of(
                promote, name="Point the unchanged variants' family tags at their content tag"
            )
            step = run_step(keep, ctx, self.cwd, [docker], env)
            assert step.returncode == 0, step.stdout + step.stderr
            publish = step_of(promote, name="Publish the family tags of the variants that passed")
            assert publish["if"] == "${{ !cancelled() }}"
            output = temp / "promote-output"
            step = run_step(publish, ctx, self.cwd, [docker], {**env, "GITHUB_OUTPUT": str(output)})
            assert step.returncode == 0, step.stdout + step.stderr
        assert promote["outputs"]["promoted"] == "${{ steps.promote.outputs.promoted }}"
        (line,) = output.read_text().splitlines()
        promoted = line.removeprefix("promoted=").split()
        creates = [c.split()[3:] for c in log.read_text().splitlines() if "imagetools create" in c]
        present = json.loads(outputs["present"])["include"]
        for merge in present:
            fixed = stored(merge["content_tag"])
            assert fixed is not None
            for tag in merge["tags"]:
                assert stored(tag) == fixed, f"{tag} is not on {merge['content_tag']}"
            moved = [t for t in merge["tags"] if before[t] != fixed]
            if moved:
                assert [x for t in moved for x in ("--tag", t)] + [merge["content_tag"]] in creates
        built = json.loads(outputs["merge"])["include"]
        passed = [m for m in built if not any((m["key"], p) in fails for p in m["platforms"])]
        for merge in built:
            if merge not in passed:
                assert (
                    f"::error::{merge['tags'][0]} is not published: its check did not pass"
                    in step.stdout
                )
                for tag in [*merge["tags"], merge["content_tag"]]:
                    assert stored(tag) == before[tag], f"{tag} moved though its check failed"
                continue
            assert_published(merge, pushed, promoted, creates)
        assert len(promoted) == len(passed)
        assert len(creates) == len(passed) + sum(
            any(before[t] != stored(m["content_tag"]) for t in m["tags"]) for m in present
        )
        return creates, promoted

    def _sign(self, promoted: list[str], temp: Path, env: dict[str, str]) -> list[str]:
        """The sign job, when the promote job's output is not empty, against a
        recording cosign (tests/runner.py, cosign_stand_in): each published index by
        digest, nothing else; then the real ``buildmatrix check --attest`` on each, and
        ``cosign attest`` of its predicate, which must say the index passed."""
        if not promoted:
            return []
        job = self.workflow["jobs"]["sign"]
        sign = step_of(job, name="Sign every published index by digest")
        attest = step_of(job, name="Attest every published index's check verdict")
        log = temp / "cosign.log"
        log.write_text("")
        cosign = cosign_stand_in(temp / "bin-cosign", log=log, keep=temp / "predicates")
        ctx = {
            "needs": {"promote": {"outputs": {"promoted": " ".join(promoted)}}},
            "runner": runner_temp(temp, "sign"),
        }
        step = run_step(sign, ctx, self.cwd, [cosign], env)
        assert step.returncode == 0, step.stderr
        calls = log.read_text().splitlines()
        assert calls == [f"cosign sign --yes --recursive {ref}" for ref in promoted]
        step = run_step(attest, ctx, self.cwd, [cosign], env)
        assert step.returncode == 0, step.stdout + step.stderr
        predicate = Path(ctx["runner"]["temp"], "predicate.json")
        attested = log.read_text().splitlines()[len(calls) :]
        assert attested == [
            f"cosign attest --yes --predicate {predicate} --type {PREDICATE_TYPE} {ref}"
            for ref in promoted
        ]
        for n, ref in enumerate(promoted, start=len(calls) + 1):
            kept = json.loads((temp / "predicates" / f"predicate-{n}.json").read_text())
            assert kept["verdict"] == "pass", (ref, kept)
            assert kept["index_digest"] == ref.split("@", 1)[1]
        return [c.rsplit(" ", 1)[1] for c in calls]
