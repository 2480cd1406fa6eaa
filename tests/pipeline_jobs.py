"""The build workflow's jobs as tests/pipeline.py holds them to their shape: the
stages' conditions and permissions, the build step's inputs as its expressions give
them per matrix entry, what a build pushes (in small), and what the registry must hold
for a published variant."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from tests.buildx_standin import Pushed, get_manifest
from tests.images import Image, fixture
from tests.runner import expand, step_of

PUSH_ONLY = (
    "!cancelled() && github.event_name != 'pull_request' && needs.matrix.result == 'success'"
)
BUILDS = "needs.matrix.outputs.build == 'true'"


def job_shapes(jobs: dict[str, Any]) -> None:
    """The stages' order and conditions: build and check only when something is left
    to build (an empty matrix is an error on GitHub); check and promote run whatever
    other variants' builds and checks did (not cancelled), never on pull requests;
    only sign may ask for an OIDC token; only build, promote and sign write packages;
    the matrix job reads them (it asks for content tags)."""
    assert jobs["build"]["if"] == BUILDS
    assert jobs["check"]["needs"] == ["matrix", "build"]
    assert jobs["promote"]["needs"] == ["matrix", "check"]
    assert jobs["sign"]["needs"] == "promote"
    assert jobs["check"]["if"] == f"${{{{ {PUSH_ONLY} && {BUILDS} }}}}"
    assert jobs["promote"]["if"] == f"${{{{ {PUSH_ONLY} }}}}"
    assert jobs["check"]["strategy"]["fail-fast"] is False
    assert jobs["check"]["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.merge) }}"
    assert "needs.promote.outputs.promoted != ''" in jobs["sign"]["if"]
    assert jobs["matrix"]["permissions"] == {"contents": "read", "packages": "read"}
    for name, job in jobs.items():
        perms = job.get("permissions", {})
        assert ("id-token" in perms) == (name == "sign"), name
        assert (perms.get("packages") == "write") == (name in ("build", "promote", "sign")), name
        for step in job["steps"]:
            if "uses" in step and not step["uses"].startswith("./"):
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
    assert jobs["sign"]["permissions"]["id-token"] == "write"
    step_of(jobs["sign"], uses="sigstore/cosign-installer")


def lines(text: str) -> list[str]:
    return [x for x in text.split("\n") if x]


def build_step_inputs(build: dict[str, Any], entry: dict[str, Any]) -> None:
    """The build job's inputs, as its expressions give them for ``entry``: QEMU only
    where the entry asks; both build-push-action steps build the entry's platform with
    its gha cache scope; the push goes by digest, untagged, with SBOM, provenance, the
    run's OCI labels (one per line) and manifest annotations."""
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
        assert expand(step["with"]["cache-from"], ctx) == entry["cache_from"]
        assert expand(step["with"]["cache-to"], ctx) == entry["cache_to"]
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
    assert lines(expand(push["with"]["labels"], ctx)) == entry["oci_labels"]
    assert lines(expand(push["with"]["annotations"], ctx)) == entry["annotations"]


def image_for(entry: dict[str, Any], labels: list[str], *, fails: bool) -> Image:
    """What the entry's build would push, in small: the family label the generated
    Dockerfile writes, the run's labels, and a library with device code, which differs
    with the content key (other inputs, another image). ``libmulti.so`` has SASS for
    sm_75..sm_120 (every shipped family); ``libsass_sm80.so`` only sm_80, no PTX: no
    code for a Hopper or Blackwell GPU."""
    lib = fixture("libsass_sm80.so" if fails else "libmulti.so")
    return Image(
        layers=[{"usr/lib/libk.so": lib, "etc/inputs": entry["content_key"].encode()}],
        labels={"io.buildmatrix.family": entry["family"]} | dict(x.split("=", 1) for x in labels),
        platform={"os": "linux", "architecture": entry["arch"]},
    )


def annotations_of(annotations: list[str], level: str) -> dict[str, str]:
    """``LEVEL:KEY=VALUE`` lines as the annotations they put on that level."""
    found = {}
    for note in annotations:
        where, _, pair = note.partition(":")
        assert where == level, note
        key, _, value = pair.partition("=")
        found[key] = value
    return found


def tag_of(ref: str) -> tuple[str, str, str]:
    host, _, rest = ref.partition("/")
    repository, _, tag = rest.rpartition(":")
    return host, repository, tag


def stored(ref: str) -> bytes | None:
    got = get_manifest(*tag_of(ref))
    return None if got is None else got[0]


def assert_published(
    merge: dict[str, Any],
    pushed: dict[tuple[str, str], Pushed],
    promoted: list[str],
    creates: list[list[str]],
) -> None:
    """The registry holds ``merge``'s family tags and content tag on one index of
    exactly its platforms' images and attestations, with the run's index annotations,
    made by one ``imagetools create`` and named in ``promoted``."""
    body = stored(merge["content_tag"])
    assert body is not None, f"{merge['content_tag']} was not published"
    for tag in merge["tags"]:
        assert stored(tag) == body, f"{tag} is not on the index its check passed"
    index = json.loads(body)
    done = [pushed[merge["key"], p] for p in merge["platforms"]]
    assert sorted(d["digest"] for d in index["manifests"]) == sorted(
        x for d in done for x in (d.manifest, d.attestation)
    )
    assert index["annotations"] == annotations_of(merge["annotations"], "index")
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    assert f"{merge['repository']}@{digest}" in promoted
    sources = [f"{merge['repository']}@{pushed[merge['key'], p].index}" for p in merge["platforms"]]
    tags = [*merge["tags"], merge["content_tag"]]
    notes = [x for a in merge["annotations"] for x in ("--annotation", a)]
    assert [x for t in tags for x in ("--tag", t)] + notes + sorted(sources) in creates
