"""check against every source kind, with real components where they exist.

Images are crafted here (layer by layer, so that whiteouts, opaque folders and
links are exactly as the test wants) and then loaded into the real Docker engine,
pushed to a real registry by skopeo, and converted by skopeo, so that every
transport reads bytes a real tool wrote.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, CliRunner, validate
from tests.images import Dir, Image, Symlink, fixture, write_docker_archive, write_oci_layout
from tests.services import Registry, refusing_port, serve_registry

pytestmark = pytest.mark.integration

CHECK_SCHEMA = json.loads((REPO / "buildmatrix/schemas/check.schema.json").read_text())

SM80, HOPPER, MULTI = fixture("libsass_sm80.so"), fixture("libhopper_a.so"), fixture("libmulti.so")

# Without whiteout, opaque and symlink handling, the sm_80-only libraries of the
# first layer would survive and the hopper check would fail.
LAYERED = Image(
    layers=[
        {
            "usr/lib/libold.so": SM80,
            "opt/cuda/lib/libstale.so": SM80,
            "opt/cuda-13/lib/": Dir(),
            "etc/os-release": b"ID=test\n",
        },
        {
            "usr/lib/.wh.libold.so": b"",
            "opt/cuda/lib/.wh..wh..opq": b"",
            "opt/cuda/lib/libhopper.so": HOPPER,
            "usr/local/cuda": Symlink("/opt/cuda-13"),
        },
        {
            "opt/cuda-13/lib/libmulti.so": MULTI,
            "usr/lib/libmulti.so.1": Symlink("../../opt/cuda-13/lib/libmulti.so"),
        },
    ],
    labels={"io.buildmatrix.family": "hopper"},
    env={"CUDA_VERSION": "13.0.0"},
)
MISLABELED = Image(
    layers=[{"usr/lib/libsass_sm80.so": SM80}], labels={"io.buildmatrix.family": "hopper"}
)
EXPECTED_FILES = ["opt/cuda-13/lib/libmulti.so", "opt/cuda/lib/libhopper.so"]


def run_check(cli: CliRunner, ref: str, *extra: str) -> tuple[int, dict[str, object]]:
    result = cli("check", ref, "--json", *extra)
    assert result.code in (0, 1), result.err
    doc = result.json()
    validate(doc, CHECK_SCHEMA)
    return result.code, doc


def assert_layered(code: int, doc: dict[str, object]) -> None:
    assert code == 0, doc["problems"]
    assert sorted(f["path"] for f in doc["files"]) == EXPECTED_FILES  # type: ignore[attr-defined]
    assert doc["declared"] == {"family": "hopper", "source": "label"}
    assert [(t["sm"], t["verdict"]) for t in doc["targets"]] == [("sm_90", "native")]  # type: ignore[attr-defined]
    assert doc["cuda_runtime"] == {"version": "13.0", "source": "CUDA_VERSION in the image config"}


def assert_mislabeled(code: int, doc: dict[str, object]) -> None:
    assert code == 1
    assert doc["verdict"] == "fail"
    assert "sm_80 SASS runs only on compute capability 8.x" in doc["problems"][0]  # type: ignore[index]


def assert_both_judged(code: int, doc: dict[str, object]) -> None:
    """Without --platform every entry a Hopper GPU can sit behind is judged (H100 PCIe
    in x86 and Arm servers, GH200): the arm64 one fails, and says so."""
    assert code == 1
    assert [(p["platform"], p["verdict"]) for p in doc["platforms"]] == [  # type: ignore[attr-defined]
        ("linux/amd64", "pass"),
        ("linux/arm64", "fail"),
    ]
    assert all(p.startswith("linux/arm64: ") for p in doc["problems"])  # type: ignore[attr-defined]


# ------------------------------------------------------------------ files on disk


def test_docker_archive(tmp_path: Path, cli: CliRunner) -> None:
    assert_layered(
        *run_check(cli, f"docker-archive:{write_docker_archive(tmp_path / 'a.tar', LAYERED)}")
    )
    assert_mislabeled(
        *run_check(cli, f"docker-archive:{write_docker_archive(tmp_path / 'b.tar', MISLABELED)}")
    )


@pytest.mark.parametrize("compress", [True, False])
def test_oci_layout(tmp_path: Path, cli: CliRunner, compress: bool) -> None:
    layout = write_oci_layout(tmp_path / "oci", LAYERED, tag="v1", compress=compress)
    assert_layered(*run_check(cli, f"oci:{layout}:v1"))
    assert_layered(*run_check(cli, f"oci:{layout}"))  # the only image needs no tag


def test_zstd_layers(tmp_path: Path, cli: CliRunner) -> None:
    zstandard = pytest.importorskip("zstandard")
    layout = write_oci_layout(tmp_path / "oci", LAYERED, compress=False)
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
    import hashlib

    for layer in manifest["layers"]:
        data = zstandard.ZstdCompressor().compress((blobs / layer["digest"][7:]).read_bytes())
        layer["digest"] = "sha256:" + hashlib.sha256(data).hexdigest()
        layer["mediaType"] = "application/vnd.oci.image.layer.v1.tar+zstd"
        (blobs / layer["digest"][7:]).write_bytes(data)
    body = json.dumps(manifest).encode()
    index["manifests"][0]["digest"] = "sha256:" + hashlib.sha256(body).hexdigest()
    (blobs / index["manifests"][0]["digest"][7:]).write_bytes(body)
    (layout / "index.json").write_text(json.dumps(index))
    assert_layered(*run_check(cli, f"oci:{layout}:latest"))


def test_directory_and_single_file(tmp_path: Path, cli: CliRunner) -> None:
    root = tmp_path / "rootfs"
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/libhopper_a.so").write_bytes(HOPPER)
    (root / "usr/lib/libsass_sm80.so").write_bytes(SM80)
    code, doc = run_check(cli, f"dir:{root}", "--family", "hopper")
    assert code == 1
    code, doc = run_check(cli, str(root), "--family", "ampere", "--ignore", "*/libhopper_a.so")
    assert code == 0
    assert doc["ignored"] == ["usr/lib/libhopper_a.so"]
    code, doc = run_check(cli, str(root / "usr/lib/libhopper_a.so"), "--sm", "sm_90")
    assert code == 0
    assert doc["declared"] == {"family": None, "source": "flags"}


def _corrupt_first_layer(layout: Path, *, truncate: bool) -> None:
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
    blob = blobs / manifest["layers"][1]["digest"][7:]
    data = bytearray(blob.read_bytes())
    if truncate:
        del data[len(data) // 2 :]
    else:
        data[-30] ^= 0xFF
    blob.write_bytes(bytes(data))


@pytest.mark.parametrize("truncate", [False, True], ids=["flipped byte", "truncated"])
def test_corrupt_blobs_exit_2(tmp_path: Path, cli: CliRunner, truncate: bool) -> None:
    layout = write_oci_layout(tmp_path / "oci", LAYERED, compress=False)
    _corrupt_first_layer(layout, truncate=truncate)
    result = cli("check", f"oci:{layout}")
    assert result.code == 2
    assert "digest" in result.err or "truncated" in result.err
    assert result.out == ""


def test_layer_escaping_the_root_is_refused(tmp_path: Path, cli: CliRunner) -> None:
    evil = Image(
        layers=[{"usr/lib/libhopper_a.so": HOPPER, "../../etc/cron.d/x": b"* * * * *"}],
        labels={"io.buildmatrix.family": "hopper"},
    )
    result = cli("check", f"docker-archive:{write_docker_archive(tmp_path / 'e.tar', evil)}")
    assert result.code == 2
    assert "escapes the image root" in result.err
    assert not (tmp_path.parent / "etc").exists()


def write_multi_platform_layout(tmp_path: Path) -> Path:
    """An OCI layout tagged ``multi`` whose index holds LAYERED for linux/amd64 and
    MISLABELED for linux/arm64 (arm64 first, so that order does not pick)."""
    amd = write_oci_layout(tmp_path / "amd", LAYERED)
    arm = write_oci_layout(tmp_path / "arm", MISLABELED)
    merged = tmp_path / "multi"
    shutil.copytree(amd, merged)
    shutil.copytree(arm / "blobs", merged / "blobs", dirs_exist_ok=True)
    amd_desc = json.loads((amd / "index.json").read_text())["manifests"][0]
    arm_desc = json.loads((arm / "index.json").read_text())["manifests"][0]
    amd_desc["platform"] = {"os": "linux", "architecture": "amd64"}
    arm_desc["platform"] = {"os": "linux", "architecture": "arm64"}
    del amd_desc["annotations"], arm_desc["annotations"]
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [arm_desc, amd_desc],
    }
    body = json.dumps(index).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    (merged / "blobs/sha256" / digest[7:]).write_bytes(body)
    (merged / "index.json").write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": index["mediaType"],
                        "digest": digest,
                        "size": len(body),
                        "annotations": {"org.opencontainers.image.ref.name": "multi"},
                    }
                ],
            }
        )
    )
    return merged


def test_multi_platform_index(tmp_path: Path, cli: CliRunner) -> None:
    merged = write_multi_platform_layout(tmp_path)
    assert_layered(*run_check(cli, f"oci:{merged}:multi", "--platform", "linux/amd64"))
    assert_mislabeled(*run_check(cli, f"oci:{merged}:multi", "--platform", "linux/arm64"))
    assert_both_judged(*run_check(cli, f"oci:{merged}:multi"))
    result = cli("check", f"oci:{merged}:multi", "--platform", "linux/s390x")
    assert result.code == 2
    assert "no image for platform linux/s390x" in result.err


ARM64 = Image(
    layers=LAYERED.layers,
    labels=LAYERED.labels,
    env=LAYERED.env,
    platform={"os": "linux", "architecture": "arm64"},
)


def assert_not_for_amd64(cli: CliRunner, ref: str) -> None:
    """A single-manifest arm64 image is no image for an amd64 node (containerd's
    unpacker unpacks only a config platform it matches: ``core/unpack/unpacker.go``),
    and is judged with ``--platform linux/arm64``."""
    result = cli("check", ref, "--sm", "9.0")
    assert result.code == 2, result.out
    assert "no image for platform linux/amd64" in result.err
    assert "is for linux/arm64" in result.err
    assert "--platform linux/arm64" in result.err
    assert result.out == ""
    assert_layered(*run_check(cli, ref, "--platform", "linux/arm64"))
    assert_layered(*run_check(cli, ref, "--platform", "linux/arm64/v8"))


def test_single_manifest_platform(tmp_path: Path, cli: CliRunner) -> None:
    assert_not_for_amd64(cli, f"docker-archive:{write_docker_archive(tmp_path / 'a.tar', ARM64)}")
    assert_not_for_amd64(cli, f"oci:{write_oci_layout(tmp_path / 'oci', ARM64)}")


# ------------------------------------------------------------ skopeo and registry


def skopeo(*args: str) -> None:
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed (Debian package skopeo)")
    subprocess.run(["skopeo", "--insecure-policy", *args], check=True, capture_output=True)


@pytest.fixture
def pushed(registry: Registry, tmp_path: Path) -> Iterator[str]:
    """LAYERED and MISLABELED pushed to the registry by skopeo."""
    for name, image in (("layered", LAYERED), ("mislabeled", MISLABELED)):
        layout = write_oci_layout(tmp_path / name, image, tag="v1")
        skopeo(
            "copy",
            "--dest-tls-verify=false",
            f"oci:{layout}:v1",
            f"docker://{registry.host}/bmtest/{name}:v1",
        )
    yield registry.host


def test_registry(pushed: str, cli: CliRunner, tmp_path: Path) -> None:
    assert_layered(*run_check(cli, f"docker://{pushed}/bmtest/layered:v1"))
    assert_mislabeled(*run_check(cli, f"docker://{pushed}/bmtest/mislabeled:v1"))
    code, doc = run_check(cli, f"{pushed}/bmtest/layered:v1")  # bare: no engine has it
    assert_layered(code, doc)
    digest = str(doc["digest"])
    assert digest.startswith("sha256:")
    assert_layered(*run_check(cli, f"docker://{pushed}/bmtest/layered@{digest}"))


def test_skopeo_conversions(pushed: str, cli: CliRunner, tmp_path: Path) -> None:
    """docker-archive and OCI layouts as skopeo writes them, from the registry image."""
    src = f"docker://{pushed}/bmtest/layered:v1"
    skopeo("copy", "--src-tls-verify=false", src, f"docker-archive:{tmp_path}/s.tar:bm/l:v1")
    skopeo("copy", "--src-tls-verify=false", src, f"oci:{tmp_path}/layout:v1")
    assert_layered(*run_check(cli, f"docker-archive:{tmp_path}/s.tar"))
    assert_layered(*run_check(cli, f"oci:{tmp_path}/layout:v1"))


def test_registry_single_manifest_platform(
    registry: Registry, cli: CliRunner, tmp_path: Path
) -> None:
    layout = write_oci_layout(tmp_path / "arm64", ARM64, tag="v1")
    ref = f"docker://{registry.host}/bmtest/arm64:v1"
    skopeo("copy", "--dest-tls-verify=false", f"oci:{layout}:v1", ref)
    assert_not_for_amd64(cli, ref)


def test_registry_errors(pushed: str, cli: CliRunner) -> None:
    missing = cli("check", f"docker://{pushed}/bmtest/layered:nope")
    assert missing.code == 2
    assert "not found" in missing.err
    with refusing_port() as port:  # held: no parallel worker can take it meanwhile
        unreachable = cli("check", f"docker://127.0.0.1:{port}/bmtest/layered:v1")
    assert unreachable.code == 3
    assert "unreachable" in unreachable.err


DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"


def served(host: str, repository: str, reference: str) -> tuple[str, bytes, str]:
    """What the registry serves for a manifest: media type, body, Docker-Content-Digest."""
    accept = f"{DOCKER_MANIFEST}, {DOCKER_LIST}, application/vnd.oci.image.manifest.v1+json"
    request = urllib.request.Request(
        f"http://{host}/v2/{repository}/manifests/{reference}", headers={"Accept": accept}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return (
            response.headers["Content-Type"],
            response.read(),
            response.headers["Docker-Content-Digest"],
        )


def test_docker_v2_manifest(registry: Registry, cli: CliRunner, tmp_path: Path) -> None:
    """Docker v2 schema 2, what most registries serve, not only OCI manifests."""
    layout = write_oci_layout(tmp_path / "layered", LAYERED, tag="v1")
    dest = f"docker://{registry.host}/bmtest/v2s2:v1"
    skopeo("copy", "--format=v2s2", "--dest-tls-verify=false", f"oci:{layout}:v1", dest)
    media_type, _, digest = served(registry.host, "bmtest/v2s2", "v1")
    assert media_type == DOCKER_MANIFEST
    code, doc = run_check(cli, dest)
    assert_layered(code, doc)
    assert doc["digest"] == digest
    assert_layered(*run_check(cli, f"docker://{registry.host}/bmtest/v2s2@{digest}"))


def test_docker_manifest_list(registry: Registry, cli: CliRunner, tmp_path: Path) -> None:
    """A Docker v2 manifest list resolves to the asked platform like an OCI index."""
    merged = write_multi_platform_layout(tmp_path)
    dest = f"docker://{registry.host}/bmtest/list:v1"
    skopeo("copy", "--all", "--format=v2s2", "--dest-tls-verify=false", f"oci:{merged}:multi", dest)
    media_type, body, _ = served(registry.host, "bmtest/list", "v1")
    assert media_type == DOCKER_LIST
    assert {m["mediaType"] for m in json.loads(body)["manifests"]} == {DOCKER_MANIFEST}
    assert_layered(*run_check(cli, dest, "--platform", "linux/amd64"))
    assert_mislabeled(*run_check(cli, dest, "--platform", "linux/arm64"))
    assert_both_judged(*run_check(cli, dest))
    result = cli("check", dest, "--platform", "linux/s390x")
    assert result.code == 2
    assert "no image for platform linux/s390x" in result.err


def _stored_blob(root: Path, digest: str) -> Path:
    """Where docker-registry's filesystem driver keeps a blob (manifests included)."""
    hexdigest = digest.removeprefix("sha256:")
    return root / f"data/docker/registry/v2/blobs/sha256/{hexdigest[:2]}/{hexdigest}/data"


def _oci_blob(layout: Path, digest: str) -> Path:
    return layout / "blobs/sha256" / digest.removeprefix("sha256:")


@pytest.mark.parametrize("what", ["manifest", "config", "layer"])
def test_tampered_registry_content_exits_2(what: str, cli: CliRunner, tmp_path: Path) -> None:
    """A registry whose store was altered after the push (the registry does not
    re-hash on serving): every manifest, config and layer is checked against its
    digest, by tag (the Docker-Content-Digest header) and by digest."""
    root = tmp_path / "registry"
    root.mkdir()
    with serve_registry(root) as host:
        layout = write_oci_layout(tmp_path / "layered", LAYERED, tag="v1")
        dest = f"docker://{host}/bmtest/tampered:v1"
        skopeo("copy", "--format=v2s2", "--dest-tls-verify=false", f"oci:{layout}:v1", dest)
        _, body, digest = served(host, "bmtest/tampered", "v1")
        assert_layered(*run_check(cli, dest))  # untouched, it passes
        manifest = json.loads(body)
        target = {
            "manifest": digest,
            "config": manifest["config"]["digest"],
            "layer": manifest["layers"][-1]["digest"],
        }[what]
        stored = _stored_blob(root, target)
        data = bytearray(stored.read_bytes())
        if what == "layer":  # another valid layer in its place, one that would pass
            other = write_oci_layout(tmp_path / "other", Image(layers=[{"usr/lib/x.so": HOPPER}]))
            index = json.loads((other / "index.json").read_text())
            other_manifest = json.loads(
                _oci_blob(other, index["manifests"][0]["digest"]).read_bytes()
            )
            data = bytearray(_oci_blob(other, other_manifest["layers"][0]["digest"]).read_bytes())
        else:  # still valid JSON, other bytes
            data = bytearray(b" ") + data
        assert bytes(data) != stored.read_bytes()
        stored.write_bytes(bytes(data))
        for ref in (dest, f"docker://{host}/bmtest/tampered@{digest}"):
            # --no-cache: the untouched check above cached the layer by its digest, and
            # a cached layer is not fetched again (docs/check.md)
            result = cli("check", ref, "--family", "hopper", "--no-cache")
            assert result.code == 2, (ref, result.out)
            assert "digest" in result.err, result.err
            assert "PASS" not in result.out


@pytest.mark.parametrize("kind", ["basic", "token"])
def test_registry_with_auth(
    kind: str,
    request: pytest.FixtureRequest,
    cli: CliRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """htpasswd basic auth, and bearer tokens from a token server (registry token spec)."""
    auth_registry: Registry = request.getfixturevalue(
        "auth_registry" if kind == "basic" else "token_registry"
    )
    layout = write_oci_layout(tmp_path / "l", LAYERED, tag="v1")
    ref = f"docker://{auth_registry.host}/bmtest/private:v1"
    skopeo(
        "copy",
        "--dest-tls-verify=false",
        f"--dest-creds={auth_registry.user}:{auth_registry.password}",
        f"oci:{layout}:v1",
        ref,
    )
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "nobody"))
    anonymous = cli("check", ref)
    assert anonymous.code == 3
    assert "refused access" in anonymous.err
    monkeypatch.setenv(
        "DOCKER_CONFIG", str(auth_registry.docker_config(tmp_path / "wrong", password="nope"))
    )
    wrong = cli("check", ref)
    assert wrong.code == 3
    monkeypatch.setenv("DOCKER_CONFIG", str(auth_registry.docker_config(tmp_path / "good")))
    assert_layered(*run_check(cli, ref))


# ------------------------------------------------------------------ Docker engine


def _dynamic(path: Path) -> bool:
    from buildmatrix.binary.elf import read_elf
    from buildmatrix.binary.source import BytesSource

    info = read_elf(BytesSource(path.read_bytes(), name=str(path)))
    return info.section(".interp") is not None


@pytest.fixture
def engine(docker_host: str, monkeypatch: pytest.MonkeyPatch) -> object:
    import docker

    monkeypatch.setenv("DOCKER_HOST", docker_host)
    return docker.DockerClient(base_url=docker_host)


def test_engine(engine: object, cli: CliRunner, tmp_path: Path) -> None:
    client = engine
    for name, image in (("layered", LAYERED), ("mislabeled", MISLABELED)):
        archive = write_docker_archive(tmp_path / f"{name}.tar", image, tag=f"bmtest/{name}:v1")
        client.images.load(archive.read_bytes())  # type: ignore[attr-defined]
    try:
        assert_layered(*run_check(cli, "docker-daemon:bmtest/layered:v1"))
        assert_layered(*run_check(cli, "bmtest/layered:v1"))  # bare: the engine has it
        assert_mislabeled(*run_check(cli, "docker-daemon:bmtest/mislabeled:v1"))
        missing = cli("check", "docker-daemon:bmtest/absent:v1")
        assert missing.code == 2
        assert "has no image" in missing.err
    finally:
        for name in ("layered", "mislabeled"):
            client.images.remove(f"bmtest/{name}:v1", force=True)  # type: ignore[attr-defined]


def test_engine_push(engine: object, registry: Registry, cli: CliRunner, tmp_path: Path) -> None:
    """What ``docker push`` writes (the engine's own manifest, Docker v2 schema 2)."""
    client = engine
    repository = f"{registry.host}/bmtest/engine-pushed"
    archive = write_docker_archive(tmp_path / "l.tar", LAYERED, tag=f"{repository}:v1")
    client.images.load(archive.read_bytes())  # type: ignore[attr-defined]
    try:
        for line in client.images.push(repository, tag="v1", stream=True, decode=True):  # type: ignore[attr-defined]
            assert "error" not in line, line
    finally:
        client.images.remove(f"{repository}:v1", force=True)  # type: ignore[attr-defined]
    media_type, _, digest = served(registry.host, "bmtest/engine-pushed", "v1")
    assert media_type == DOCKER_MANIFEST
    code, doc = run_check(cli, f"docker://{repository}:v1")
    assert_layered(code, doc)
    assert doc["digest"] == digest


def test_engine_build_with_real_whiteout(engine: object, cli: CliRunner, tmp_path: Path) -> None:
    """docker build writes the whiteout itself when a RUN step deletes a library."""
    busybox = shutil.which("busybox")
    if busybox is None or _dynamic(Path(busybox)):
        pytest.skip("busybox-static is needed for a RUN step in a FROM scratch image")
    context = tmp_path / "ctx"
    context.mkdir()
    shutil.copy(busybox, context / "busybox")
    (context / "libsass_sm80.so").write_bytes(SM80)
    (context / "libhopper_a.so").write_bytes(HOPPER)
    (context / "Dockerfile").write_text(
        "FROM scratch\nCOPY busybox /bin/busybox\n"
        "COPY libsass_sm80.so libhopper_a.so /usr/lib/\n"
        'RUN ["/bin/busybox", "rm", "/usr/lib/libsass_sm80.so"]\n'
        "LABEL io.buildmatrix.family=hopper\n"
    )
    client = engine
    client.images.build(path=str(context), tag="bmtest/built:v1", rm=True)  # type: ignore[attr-defined]
    try:
        code, doc = run_check(cli, "docker-daemon:bmtest/built:v1")
        assert code == 0, doc["problems"]
        assert [f["path"] for f in doc["files"]] == ["usr/lib/libhopper_a.so"]  # type: ignore[attr-defined]
    finally:
        client.images.remove("bmtest/built:v1", force=True)  # type: ignore[attr-defined]


def test_no_engine_exits_3(cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    result = cli("check", "docker-daemon:bmtest/layered:v1")
    assert result.code == 3
    assert "no Docker engine answers" in result.err
