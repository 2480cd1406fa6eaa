"""``check`` names the artifact it judged: the manifest's digest (``digest``), the
index's (``index_digest``) and ``--digest-file`` lines, over the index buildx pushes
with an SBOM and provenance (an attestation manifest, platform ``unknown/unknown``,
beside each image), in the tests' real registry (tests/buildx_standin.py writes it
as buildx does)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.buildx_standin import Pushed, combine, push_by_digest, put_manifest
from tests.conftest import CliRunner, without_frames
from tests.images import Image, fixture
from tests.services import Registry
from tests.test_platforms import validate_check_json

pytestmark = pytest.mark.integration


def _image(arch: str, lib: str) -> Image:
    return Image(
        layers=[{"usr/lib/libk.so": fixture(lib)}],
        labels={"io.buildmatrix.family": "hopper"},
        platform={"os": "linux", "architecture": arch},
    )


def _pushed(registry: Registry, repo: str) -> tuple[Pushed, Pushed, str]:
    """amd64 with Hopper SASS, arm64 with sm_80 only (no code for a GH200), each
    pushed by digest with its attestations, and the index imagetools would merge
    them into (tagged ``both``)."""
    amd = push_by_digest(registry.host, repo, _image("amd64", "libsass_ptx.so"))
    arm = push_by_digest(registry.host, repo, _image("arm64", "libsass_sm80.so"))
    body, media_type = combine([f"{registry.host}/{repo}@{d.index}" for d in (amd, arm)])
    both = put_manifest(registry.host, repo, "both", body, media_type)
    assert len(json.loads(body)["manifests"]) == 4  # two images, two attestations
    return amd, arm, both


def test_a_pushed_digest_is_judged_by_its_image_and_named(
    tmp_path: Path, cli: CliRunner, registry: Registry
) -> None:
    """One platform's push (an index of the image and its attestation manifest) judged
    by digest: the JSON names the image manifest judged and the index it came from,
    and --digest-file says the same in one line."""
    amd, arm, _ = _pushed(registry, "digest/one")
    digests = tmp_path / "judged"
    for pushed, platform, verdict in ((amd, "linux/amd64", "pass"), (arm, "linux/arm64", "fail")):
        ref = f"docker://{registry.host}/digest/one@{pushed.index}"
        args = ("check", ref, "--platform", platform, "--digest-file", str(digests))
        result = cli(*args, "--format", "json")
        assert result.code == (0 if verdict == "pass" else 1), result.err
        doc = result.json()
        validate_check_json(doc)
        assert doc["digest"] == pushed.manifest != pushed.attestation
        assert doc["index_digest"] == pushed.index
        assert [p["digest"] for p in doc["platforms"]] == [pushed.manifest]
        text = cli(*args)
        assert f"({pushed.manifest})" in text.out
        assert f"index    {pushed.index}" in text.out
    lines = digests.read_text().splitlines()
    assert lines == [
        f"{amd.manifest} linux/amd64 pass docker://{registry.host}/digest/one@{amd.index}",
        f"{amd.manifest} linux/amd64 pass docker://{registry.host}/digest/one@{amd.index}",
        f"{arm.manifest} linux/arm64 fail docker://{registry.host}/digest/one@{arm.index}",
        f"{arm.manifest} linux/arm64 fail docker://{registry.host}/digest/one@{arm.index}",
    ]


def test_attestation_manifests_are_never_judged(
    tmp_path: Path, cli: CliRunner, registry: Registry
) -> None:
    """The merged index holds four manifests, two of them attestations: without
    --platform exactly the two images are judged, each by its digest; an arm64-only
    push has no amd64 image for an amd64 node, and the message does not offer the
    attestation's unknown/unknown as a platform."""
    amd, arm, both = _pushed(registry, "digest/both")
    digests = tmp_path / "judged"
    ref = f"docker://{registry.host}/digest/both:both"
    result = cli("check", ref, "--format", "json", "--digest-file", str(digests))
    assert result.code == 1  # the arm64 entry lacks Hopper code
    doc = result.json()
    validate_check_json(doc)
    assert doc["index_digest"] == both
    judged = [(p["platform"], p["digest"], p["verdict"]) for p in doc["platforms"]]
    assert judged == [("linux/amd64", amd.manifest, "pass"), ("linux/arm64", arm.manifest, "fail")]
    assert [line.split()[:3] for line in digests.read_text().splitlines()] == [
        [amd.manifest, "linux/amd64", "pass"],
        [arm.manifest, "linux/arm64", "fail"],
    ]
    lone = cli("check", f"docker://{registry.host}/digest/both@{arm.index}")
    assert lone.code == 2
    assert "the index has linux/arm64. Pass --platform." in lone.err
    assert "unknown" not in lone.err


def test_an_annotated_entry_without_a_platform_is_judged_by_its_config(
    tmp_path: Path, cli: CliRunner
) -> None:
    """An index entry without a platform annotated as an attestation manifest is a
    candidate like any entry without one: containerd ``images.Manifest`` filters by
    platform only (the config's here, ``ConfigPlatform``) and never reads
    annotations, so an amd64 node runs it and ``check`` judges it (by its digest);
    tests/test_offered.py holds the same shape to containerd itself."""
    from tests.images import write_platform_layout

    arm = {"os": "linux", "architecture": "arm64"}
    layout = write_platform_layout(
        tmp_path / "att",
        [(arm, _image("arm64", "libsass_ptx.so")), (None, _image("amd64", "libsass_sm80.so"))],
    )
    index_path = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    blob = layout / "blobs" / "sha256" / index_path.split(":")[1]
    index = json.loads(blob.read_text())
    index["manifests"][1]["annotations"] = {
        "vnd.docker.reference.type": "attestation-manifest",
        "vnd.docker.reference.digest": index["manifests"][0]["digest"],
    }
    blob.write_text(json.dumps(index))
    top = json.loads((layout / "index.json").read_text())
    body = blob.read_bytes()
    new = "sha256:" + hashlib.sha256(body).hexdigest()
    (layout / "blobs" / "sha256" / new.split(":")[1]).write_bytes(body)
    top["manifests"][0].update(digest=new, size=len(body))
    (layout / "index.json").write_text(json.dumps(top))
    result = cli("check", f"oci:{layout}:multi", "--platform", "linux/amd64", "--json")
    assert result.code == 1, result.err  # the annotated entry's sm_80 code, judged
    doc = result.json()
    assert doc["index_digest"] == new
    assert doc["digest"] == index["manifests"][1]["digest"]
    judged = cli("check", f"oci:{layout}:multi", "--json")
    assert judged.code == 1, judged.err
    assert {p["platform"] for p in judged.json()["platforms"]} == {"linux/arm64", "linux/amd64"}


def test_the_action_outputs_the_digests_it_judged(tmp_path: Path, registry: Registry) -> None:
    """action.yml's Check step as the runner runs it: ``verdict`` and ``digests`` (the
    manifest judged) as outputs, for a platform's push by digest."""
    import yaml

    from tests.conftest import REPO
    from tests.runner import run

    action = yaml.safe_load((REPO / "action.yml").read_text())
    (check,) = [s for s in action["runs"]["steps"] if s.get("id") == "check"]
    amd = push_by_digest(registry.host, "digest/action", _image("amd64", "libsass_ptx.so"))
    output = tmp_path / "output"
    env = {
        "IMAGE": f"docker://{registry.host}/digest/action@{amd.index}",
        "FAMILIES": "",
        "SMS": "",
        "DRIVER": "",
        "REQUIRE_SASS": "false",
        "RUNNER_TEMP": str(tmp_path),
        "GITHUB_OUTPUT": str(output),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
    }
    step = run(tmp_path, check["run"], env)
    assert step.returncode == 0, step.stdout + step.stderr
    assert output.read_text().splitlines() == [f"digests={amd.manifest}", "verdict=pass"]
    assert action["outputs"]["digests"]["value"] == "${{ steps.check.outputs.digests }}"


def test_the_served_docker_answers_as_the_process_does(registry: Registry, tmp_path: Path) -> None:
    """tests/runner.py's ``docker`` hands each call to the stand-in in a thread of the
    test process: every call the promote job makes, and its refusals, print the same
    bytes and exit with the same status as ``python -m tests.buildx_standin``."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.runner import docker_stand_in

    host = registry.host
    first = push_by_digest(
        host, "team/app", _image("amd64", "libsass_sm80.so"), {"org.example.note": "a b"}
    )
    calls = [
        ["buildx", "imagetools", "inspect", "--raw", f"{host}/team/app@{first.index}"],
        ["buildx", "imagetools", "inspect", "--raw", f"{host}/team/app:absent"],
        ["buildx", "imagetools", "inspect", "--raw", "no-tag-or-digest"],
        [
            "buildx",
            "imagetools",
            "create",
            "--tag",
            f"{host}/team/app:1",
            f"{host}/team/app@{first.index}",
        ],
        ["buildx", "imagetools", "inspect", "--raw", f"{host}/team/app:1"],
        [
            *("buildx", "imagetools", "create", "-t", f"{host}/team/app:2"),
            *("--annotation", "index:org.opencontainers.image.title=über app"),
            f"{host}/team/app:1",
        ],
        ["buildx", "imagetools", "inspect", "--raw", f"{host}/team/app:2"],
        ["buildx", "imagetools", "create", f"{host}/team/app:1"],
        ["buildx", "imagetools", "create", "--annotation", "manifest:a=b", "-t", f"{host}/x:1"],
        ["buildx", "imagetools", "create", "-t", f"{host}/team/app:3", f"{host}/team/app:gone"],
        ["buildx", "imagetools", "inspect", "--raw", "127.0.0.1:9/team/app:1"],  # nobody there
        ["version", "--format", "{{.Server.Version}}"],
        [],
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with docker_stand_in(tmp_path / "bin", tmp_path / "docker.log") as folder:
        for call in calls:
            process = subprocess.run(
                [sys.executable, "-m", "tests.buildx_standin", *call],
                env=env,
                capture_output=True,
                check=False,
            )
            served = subprocess.run(
                [str(folder / "docker"), *call], capture_output=True, check=False
            )
            got = (served.returncode, served.stdout, without_frames(served.stderr.decode()))
            want = (process.returncode, process.stdout, without_frames(process.stderr.decode()))
            assert got == want, call
    logged = (tmp_path / "docker.log").read_text().splitlines()
    assert logged == [" ".join(call) for call in calls]
