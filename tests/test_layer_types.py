"""A manifest's entries that are not layers (the OCI empty descriptor, an artifact's
blob), held to what a real containerd does with them on the kubelet's path: a CRI
pull (``ImageService/PullImage``), whose unpacker applies only the entries
containerd's ``images.IsLayerType`` calls layers and wants one ``rootfs.diff_ids``
entry per layer applied (1.6 ``unpacker.go`` ``handlerWrapper``, 2.x
``core/unpack/unpacker.go``). The registry, OCI layout and containerd sources must
see the files containerd unpacked (read back from its snapshot), or refuse the image
where containerd refuses it.

The Docker engine (20.10, the one here) refuses to pull such an image at all
("unsupported media type"); ``ctr images pull`` (``Image.Unpack``) counts every
entry and refuses the first two cases ("mismatched image rootfs and manifest
layers"): neither is what a node's kubelet runs.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.buildx_standin import OCI_CONFIG, OCI_MANIFEST, push_blob, put_manifest
from tests.conftest import CliRunner
from tests.containerd_service import Containerd, cri_containerd  # noqa: F401
from tests.images import Image, fixture, layer_tar
from tests.services import Registry

pytestmark = pytest.mark.integration

LAYER = "application/vnd.oci.image.layer.v1.tar"
# OCI image-spec manifest.md, "Guidance for an Empty Descriptor"
EMPTY = "application/vnd.oci.empty.v1+json"
ARTIFACT = "application/vnd.example.sbom.v1"
HOPPER = layer_tar({"usr/lib/libhopper_a.so": fixture("libhopper_a.so")})
# An artifact's blob that is a tar too: applied as a layer, its sm_80-only library
# would fail 9.0 (and an image made to pass could hide one the same way).
SM80 = layer_tar({"usr/lib/libbad.so": fixture("libsass_sm80.so")})


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# entries (blob, media type) and the config's diff_ids; "" where containerd pulls it
CASES: dict[str, tuple[list[tuple[bytes, str]], list[bytes], str]] = {
    "empty-descriptor": ([(HOPPER, LAYER), (b"{}", EMPTY)], [HOPPER], ""),
    "artifact-first": ([(SM80, ARTIFACT), (HOPPER, LAYER)], [HOPPER], ""),
    "artifact-counted": (
        [(HOPPER, LAYER), (SM80, ARTIFACT)],
        [HOPPER, SM80],
        "number of layers and diffIDs don't match: 1 != 2",
    ),
}


def _layout(path: Path, config: bytes, entries: list[tuple[bytes, str]], tag: str) -> Path:
    """An OCI layout of one image: ``config`` and the manifest's entries as given."""
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> dict[str, object]:
        (blobs / _sha(data)[7:]).write_bytes(data)
        return {"digest": _sha(data), "size": len(data)}

    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, **put(config)},
            "layers": [{"mediaType": kind, **put(data)} for data, kind in entries],
        }
    ).encode()
    desc = {"mediaType": OCI_MANIFEST, **put(manifest)}
    desc["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_entries_that_are_not_layers_are_left_out_as_a_cri_pull_leaves_them(
    case: str,
    registry: Registry,
    cri_containerd: Containerd,  # noqa: F811
    cli: CliRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries, diff_ids, refusal = CASES[case]
    config = Image(layers=[]).config([_sha(d) for d in diff_ids])
    descs = [{"mediaType": kind, **push_blob(registry.host, "bm/types", d)} for d, kind in entries]
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, **push_blob(registry.host, "bm/types", config)},
        "layers": descs,
    }
    put_manifest(registry.host, "bm/types", case, json.dumps(manifest).encode(), OCI_MANIFEST)
    image = f"{registry.host}/bm/types:{case}"
    said = cri_containerd.cri_pull(image)
    assert refusal in said if refusal else said == "", said
    refs = [
        f"docker://{image}",
        f"oci:{_layout(tmp_path / 'layout', config, entries, case)}:{case}",
    ]
    if not refusal:
        refs.append(f"containerd:{image}")
        # what containerd unpacked: the snapshot of the image's one layer
        unpacked = cri_containerd.files(_sha(HOPPER))
        assert unpacked == {"usr/lib/libhopper_a.so"}, unpacked
    for ref in refs:
        for key, value in cri_containerd.env().items():
            monkeypatch.setenv(key, value)
        r = cli("check", ref, "--sm", "9.0", "--json", "--no-cache")
        if refusal:
            assert r.code == 2, (ref, r.out, r.err)
            assert "rootfs.diff_ids names 2 layers, the manifest 1" in r.err, r.err
            assert "left out" in r.err, r.err
        else:
            assert r.code == 0, (ref, r.out, r.err)
            files = {f["path"] for f in r.json()["files"]}
            assert files == unpacked, (ref, files)


def test_the_docker_engine_refuses_to_pull_them(registry: Registry, docker_host: str) -> None:
    """The engine's own pull (Docker 20.10 here) refuses an image with an entry of
    another media type, whatever its config says: no source reads it for Docker."""
    config = Image(layers=[]).config([_sha(HOPPER)])
    descs = [
        {"mediaType": LAYER, **push_blob(registry.host, "bm/types-docker", HOPPER)},
        {"mediaType": EMPTY, **push_blob(registry.host, "bm/types-docker", b"{}")},
    ]
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, **push_blob(registry.host, "bm/types-docker", config)},
        "layers": descs,
    }
    put_manifest(
        registry.host, "bm/types-docker", "v1", json.dumps(manifest).encode(), OCI_MANIFEST
    )
    pulled = subprocess.run(
        ["docker", "-H", docker_host, "pull", f"{registry.host}/bm/types-docker:v1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert pulled.returncode != 0 and f"unsupported media type {EMPTY}" in pulled.stderr
