"""Which platforms an image offers, and which entry each node runs, held to containerd.

The oracle is the machine's containerd (1.6, ``tests/containerd_service.py``):
``ctr images import --platform P`` unpacks the manifest its ``images.Manifest``
picks for a node of P, and the snapshot it commits is keyed by that image's chain ID
(every image here has one layer: its diff_id). ``ctr images export`` writes the
archives containerd hands out. buildmatrix must judge, without ``--platform``, every
image a node of a platform a target GPU sits behind would run, and offer only those.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any, cast

import pytest

from buildmatrix.image.open import scan_image
from tests.conftest import REPO, CliRunner
from tests.containerd_service import Containerd, containerd  # noqa: F401
from tests.images import Entry, Image, fixture, layer_tar, write_oci_layout
from tests.test_containerd import import_oci, oci_archive, store  # noqa: F401
from tests.test_image_sources import run_check as _run_check

pytestmark = pytest.mark.integration

INDEX = "application/vnd.oci.image.index.v1+json"
PLATFORMS = ("linux/amd64", "linux/arm64")


def run_check(cli: CliRunner, ref: str, *extra: str) -> tuple[int, dict[str, Any]]:
    """``check --json`` (exit 0 or 1, the document valid against its schema)."""
    code, doc = _run_check(cli, ref, *extra)
    return code, cast(dict[str, Any], doc)


def _image(arch: str, library: str, tag: str) -> tuple[Image, str]:
    """A one-layer image for ``arch`` holding ``library`` (a fixture), and its chain ID."""
    layer: dict[str, Entry] = {"usr/lib/libk.so": fixture(library), "etc/which": tag.encode()}
    doc = {"os": "linux", "architecture": arch}
    image = Image(layers=[layer], labels={"io.buildmatrix.family": "hopper"}, platform=doc)
    return image, "sha256:" + hashlib.sha256(layer_tar(layer)).hexdigest()


def _put(blobs: Path, doc: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps(doc).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    (blobs / digest[7:]).write_bytes(body)
    return {"mediaType": doc["mediaType"], "digest": digest, "size": len(body)}


def _layout(tmp: Path, name: str, tree: list[Any]) -> tuple[Path, dict[str, str]]:
    """An OCI layout tagged ``t`` whose index is ``tree``: each element an image
    ``(platform descriptor or None, arch of its config, library[, annotations])``
    or a list (a nested index, its descriptor without a platform). Returns the layout and each
    image's chain ID -> manifest digest."""
    root = tmp / name
    (root / "blobs/sha256").mkdir(parents=True)
    chains: dict[str, str] = {}

    def build(items: list[Any]) -> dict[str, Any]:
        descs = []
        for item in items:
            if isinstance(item, list):
                descs.append(build(item))
                continue
            platform, arch, library, *annotations = item
            image, chain = _image(arch, library, f"{name}-{len(chains)}")
            one = write_oci_layout(tmp / f"{name}-{len(chains)}", image, compress=False)
            shutil.copytree(one / "blobs", root / "blobs", dirs_exist_ok=True)
            desc = json.loads((one / "index.json").read_text())["manifests"][0]
            del desc["annotations"]
            if platform is not None:
                desc["platform"] = platform
            if annotations:
                desc["annotations"] = annotations[0]
            descs.append(desc)
            chains[chain] = desc["digest"]
        return _put(
            root / "blobs/sha256", {"schemaVersion": 2, "mediaType": INDEX, "manifests": descs}
        )

    top = build(tree) | {"annotations": {"org.opencontainers.image.ref.name": "t"}}
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    return root, chains


def _containerd_runs(ctd: Containerd, layout: Path, platform: str, ns: str) -> str | None:
    """The chain ID of the image containerd unpacks for a ``platform`` node (None:
    none), from ``ctr images import --platform`` into a namespace of its own."""
    archive = oci_archive(layout, layout.with_suffix(f".{ns}.tar"))
    args = ("images", "import", "--platform", platform, "--base-name", "bmtest/o", str(archive))
    try:
        ctd.ctr(*args, namespace=ns)
    except AssertionError as exc:  # containerd_service.Containerd.ctr: ctr failed
        assert "no match for platform in manifest" in str(exc), exc
        return None
    keys = {line.split()[0] for line in ctd.ctr("snapshots", "ls", namespace=ns).splitlines()[1:]}
    assert len(keys) <= 1, keys
    return next(iter(keys), None)


AMD = {"os": "linux", "architecture": "amd64"}
ARM = {"os": "linux", "architecture": "arm64"}
UNKNOWN = {"os": "unknown", "architecture": "unknown"}
# buildx's annotation on an attestation manifest (buildx docs/reference/
# buildx_history_inspect_attachment.md); containerd's images.Manifest never reads it
ATTESTATION = {"vnd.docker.reference.type": "attestation-manifest"}
SHAPES: dict[str, list[Any]] = {
    # an arm64 image whose entry has no platform: its config says arm64
    "unplaced-arm64": [(AMD, "amd64", "libhopper_a.so"), (None, "arm64", "libsass_sm80.so")],
    # both platforms in an index nested in the tag's index
    "nested": [[(AMD, "amd64", "libhopper_a.so"), (ARM, "arm64", "libsass_sm80.so")]],
    # two entries without a platform: only the first is ever followed, so an arm64
    # node finds the amd64 image, does not run it, and nothing is offered for arm64
    "unplaced-behind": [
        (AMD, "amd64", "libhopper_a.so"),
        (None, "amd64", "libhopper_a.so"),
        (None, "arm64", "libsass_sm80.so"),
    ],
    # an arm64/v9 entry (Hopper code) before the plain arm64 one (sm_80 only): an
    # arm64 node's CPU reports 8 (containerd/platforms getCPUVariant), and pulls the
    # plain one
    "arm64-v9-first": [
        (ARM | {"variant": "v9"}, "arm64", "libhopper_a.so"),
        (ARM, "arm64", "libsass_sm80.so"),
        (AMD, "amd64", "libhopper_a.so"),
    ],
    # a nested index without a platform behind a platform-less arm64 image
    "nested-behind": [(None, "arm64", "libsass_sm80.so"), [(AMD, "amd64", "libhopper_a.so")]],
    # an amd64 entry annotated as an attestation (sm_80 only) before a plain one:
    # containerd filters by platform alone and runs the annotated, first one
    "annotated-amd64-first": [
        (AMD, "amd64", "libsass_sm80.so", ATTESTATION),
        (AMD, "amd64", "libhopper_a.so"),
    ],
    # an arm64 entry with the annotation, any value: an arm64 node runs it
    "annotated-arm64": [
        (ARM, "arm64", "libsass_sm80.so", {"vnd.docker.reference.type": "not-an-attestation"}),
        (AMD, "amd64", "libhopper_a.so"),
    ],
    # an annotated entry without a platform: its config (amd64) decides, as for any
    "annotated-unplaced": [
        (None, "amd64", "libsass_sm80.so", ATTESTATION),
        (ARM, "arm64", "libhopper_a.so"),
    ],
    # buildx's shape: the attestation's platform is unknown/unknown, which no node
    # matches, so its (sm_80) code never runs whatever its config says
    "buildx-attestation": [
        (UNKNOWN, "amd64", "libsass_sm80.so", ATTESTATION),
        (AMD, "amd64", "libhopper_a.so"),
        (UNKNOWN, "arm64", "libsass_sm80.so", ATTESTATION),
        (ARM, "arm64", "libhopper_a.so"),
    ],
}
NEVER_SM80 = {"unplaced-behind", "buildx-attestation"}  # no sm_80-only image runs


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_offered_and_judged_is_what_containerd_runs(
    shape: str,
    store: Containerd,  # noqa: F811
    cli: CliRunner,
    tmp_path: Path,
) -> None:
    """For each platform: containerd unpacks an image for it exactly when the image
    offers it, and the entry ``check`` judges for it (by manifest digest) is the one
    containerd unpacked; ``check`` without --platform judges every such entry and
    fails where one of them (sm_80 only) cannot run on 9.0."""
    layout, chains = _layout(tmp_path, shape, SHAPES[shape])
    ref = f"oci:{layout}:t"
    runs = {}
    for platform in PLATFORMS:
        chain = _containerd_runs(store, layout, platform, f"off-{shape}-{platform[6:]}")
        runs[platform] = chains[chain] if chain else None
    some = next(p for p, digest in runs.items() if digest)
    offered = scan_image(ref, platform=some).offered
    assert {p for p in PLATFORMS if p in offered} == {p for p, d in runs.items() if d}
    extra = () if runs["linux/amd64"] else ("--platform", some)  # else exit 2, as documented
    code, doc = run_check(cli, ref, "--sm", "9.0", *extra)
    judged = {p["platform"]: p for p in doc["platforms"]}
    assert set(judged) == ({p for p, d in runs.items() if d} if not extra else {some})
    for platform, entry in judged.items():
        assert entry["digest"] == runs[platform]
    sm80 = any(f["sass"] == ["sm_80"] for p in judged.values() for f in p["files"])
    assert code == (1 if sm80 else 0)
    assert sm80 == (shape not in NEVER_SM80)  # the shapes must test something
    if extra:
        refused = cli("check", ref, "--sm", "9.0")
        assert refused.code == 2 and "Pass --platform" in refused.err, refused.err


def _features_layout(tmp: Path, first_has_features: bool) -> tuple[Path, dict[str, str]]:
    with_features = (AMD | {"os.features": ["sse4"]}, "amd64", "libsass_sm80.so")
    plain = (AMD, "amd64", "libhopper_a.so")
    tree = [with_features, plain] if first_has_features else [plain, with_features]
    return _layout(tmp, f"features-{first_has_features}", tree)


@pytest.mark.parametrize("first_has_features", [True, False])
def test_os_features_judges_what_either_generation_runs(
    first_has_features: bool,
    store: Containerd,  # noqa: F811
    cli: CliRunner,
    tmp_path: Path,
) -> None:
    """An index with a ``linux/amd64`` entry carrying ``os.features`` (sm_80 only)
    and a plain one (Hopper code). containerd 1.6 (here) ignores the features and
    unpacks the first amd64 entry; containerd 2.3 on (containerd/platforms
    v1.0.0-rc.3, ``matcher.Match``: features a subset of the request's) the plain
    one for a plain request. ``check`` judges both where they differ, under the
    request containerd's syntax gives the other (``linux(+sse4)/amd64``), with
    --platform too, and one where they agree."""
    layout, chains = _features_layout(tmp_path, first_has_features)
    ref = f"oci:{layout}:t"
    ns = f"feat-{first_has_features}"
    theirs = chains[_containerd_runs(store, layout, "linux/amd64", ns) or ""]
    plain = json.loads((layout / "blobs/sha256" / _top(layout)[7:]).read_text())["manifests"]
    newer = next(d["digest"] for d in plain if "os.features" not in d["platform"])
    for extra in ((), ("--platform", "linux/amd64")):
        code, doc = run_check(cli, ref, "--sm", "9.0", *extra)
        judged = {p["platform"]: p["digest"] for p in doc["platforms"]}
        assert set(judged.values()) == {theirs, newer}, judged
        assert code == (1 if theirs != newer else 0)
        if theirs != newer:
            assert judged["linux(+sse4)/amd64"] == theirs
    # smoke on an H100 node (a recorded snapshot): proven only if both entries run
    snapshot = str(REPO / "tests" / "fixtures" / "nodes" / "h100-580.json")
    smoke = cli("smoke", "--snapshot", snapshot, "--json", "--image", ref)
    assert smoke.code == (1 if theirs != newer else 0), smoke.out + smoke.err


def _top(layout: Path) -> str:
    return str(json.loads((layout / "index.json").read_text())["manifests"][0]["digest"])


def test_ctr_export_is_judged_for_every_platform_it_holds(
    store: Containerd,  # noqa: F811
    cli: CliRunner,
    tmp_path: Path,
) -> None:
    """``ctr images export --all-platforms`` writes index.json (both platforms) and
    manifest.json (the default platform's image): containerd imports every platform
    from it, so ``check docker-archive:`` judges each, with the verdicts and report
    of the layout it came from. Exported for one platform (``--platform``), the
    archive's index.json still names the other, whose blobs it lacks: containerd
    cannot load that image from it, and ``check`` refuses to judge it (exit 2), but
    judges the platform the archive holds when asked for it."""
    layout, _ = _layout(
        tmp_path, "exp", [(ARM, "arm64", "libsass_sm80.so"), (AMD, "amd64", "libhopper_a.so")]
    )
    import_oci(store, layout, "bmtest/exp", "--all-platforms")
    full, one = tmp_path / "all.tar", tmp_path / "one.tar"
    store.ctr("images", "export", "--all-platforms", str(full), "bmtest/exp:t")
    store.ctr("images", "export", "--platform", "linux/amd64", str(one), "bmtest/exp:t")
    with tarfile.open(full) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert "index.json" in names and len(manifest) == 1  # the shape this test is about
    code, doc = run_check(cli, f"docker-archive:{full}", "--sm", "9.0")
    ocode, odoc = run_check(cli, f"oci:{layout}:t", "--sm", "9.0")
    assert code == ocode == 1
    strip = ("image", "digest", "read_from")
    assert [{k: v for k, v in p.items() if k not in strip} for p in doc["platforms"]] == [
        {k: v for k, v in p.items() if k not in strip} for p in odoc["platforms"]
    ]
    assert [p["platform"] for p in doc["platforms"]] == ["linux/amd64", "linux/arm64"]
    refused = cli("check", f"docker-archive:{one}", "--sm", "9.0")
    assert refused.code == 2 and "does not hold" in refused.err, refused.err
    assert "Traceback" not in refused.err
    held = cli("check", f"docker-archive:{one}", "--sm", "9.0", "--platform", "linux/amd64")
    assert held.code == 0, held.out + held.err
