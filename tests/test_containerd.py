"""``containerd:NAME`` against a real containerd (tests/containerd_service.py).

Images get into containerd the ways they get there on a node: ``ctr images import``
of ``docker save`` and OCI archives, and ``ctr images pull`` from the tests' registry.
Every verdict and file list is compared with the same image read from the file it
was imported from (``docker-archive:``, ``oci:``) or the registry it was pulled from.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest

from buildmatrix.image.bolt import BRANCH_PAGE, PAGE_HEADER, BoltError, BoltFile, read_consistent
from buildmatrix.image.containerd import METADATA, candidate_names
from buildmatrix.image.open import scan_image
from buildmatrix.image.ref import Transport, parse_ref
from tests import agent_site
from tests.conftest import REPO, CliRunner
from tests.containerd_service import Containerd, containerd  # noqa: F401
from tests.images import Image, fixture, write_docker_archive, write_oci_layout
from tests.services import Registry
from tests.test_image_sources import (
    LAYERED,
    MISLABELED,
    run_check,
    skopeo,
    write_multi_platform_layout,
)

pytestmark = pytest.mark.integration

# Shares LAYERED's first two layers (one blob in the store, read for both).
SIBLING = Image(
    layers=[*LAYERED.layers[:2], {"usr/lib/libsass_sm80.so": fixture("libsass_sm80.so")}],
    labels={"io.buildmatrix.family": "hopper"},
)
SOURCE_ONLY = ("image", "digest", "read_from")


@pytest.fixture
def store(containerd: Containerd, monkeypatch: pytest.MonkeyPatch) -> Containerd:  # noqa: F811
    for key, value in containerd.env().items():
        monkeypatch.setenv(key, value)
    return containerd


def oci_archive(layout: Path, out: Path) -> Path:
    """An OCI layout as a tar, the form ``ctr images import`` takes."""
    with tarfile.open(out, "w") as tar:
        for path in sorted(layout.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(layout)), recursive=False)
    return out


def import_oci(
    ctd: Containerd, layout: Path, name: str, *extra: str, namespace: str = "k8s.io"
) -> None:
    archive = oci_archive(layout, layout.with_suffix(".tar"))
    args = ("images", "import", "--no-unpack", "--base-name", name, *extra, str(archive))
    ctd.ctr(*args, namespace=namespace)


def verdicts(cli: CliRunner, ref: str, *extra: str) -> tuple[int, dict[str, Any]]:
    code, doc = run_check(cli, ref, *extra)
    return code, portable(doc)


def portable(doc: dict[str, Any]) -> dict[str, Any]:
    """A check report without what only some sources know: the reference, digests
    (each judged platform's entry names its own too) and how layers were read."""
    out = {k: v for k, v in doc.items() if k not in SOURCE_ONLY}
    out["platforms"] = [{k: v for k, v in p.items() if k != "digest"} for p in doc["platforms"]]
    return out


def assert_same(cli: CliRunner, ours: str, theirs: str, *extra: str, digest: bool) -> None:
    """The same verdict, report and final view as ``theirs``, and the same manifest
    digest where both name one."""
    assert verdicts(cli, ours, *extra) == verdicts(cli, theirs, *extra)
    platform = extra[1] if extra else "linux/amd64"
    a, b = scan_image(ours, platform=platform), scan_image(theirs, platform=platform)
    assert (a.paths, a.symlinks, a.files, a.problems) == (b.paths, b.symlinks, b.files, b.problems)
    assert a.paths, "an image with no files proves nothing"
    if digest:
        assert a.digest == b.digest


@pytest.mark.parametrize("image", ["layered", "mislabeled", "sibling"])
def test_docker_archive_imported(
    store: Containerd, cli: CliRunner, tmp_path: Path, image: str
) -> None:
    crafted = {"layered": LAYERED, "mislabeled": MISLABELED, "sibling": SIBLING}[image]
    archive = write_docker_archive(tmp_path / "a.tar", crafted, tag=f"bmtest/da-{image}:v1")
    store.ctr("images", "import", "--no-unpack", str(archive))
    # ctr names it docker.io/bmtest/...; the short name finds it as the CRI's would.
    for name in (f"bmtest/da-{image}:v1", f"docker.io/bmtest/da-{image}:v1"):
        assert_same(cli, f"containerd:{name}", f"docker-archive:{archive}", digest=False)


@pytest.mark.parametrize("compress", ["gzip", "none", "zstd"])
def test_oci_imported(store: Containerd, cli: CliRunner, tmp_path: Path, compress: str) -> None:
    layout = write_oci_layout(tmp_path / "oci", LAYERED, tag="v1", compress=compress == "gzip")
    if compress == "zstd":
        _to_zstd(layout)
    import_oci(store, layout, f"bmtest/oci-{compress}")
    assert_same(cli, f"containerd:bmtest/oci-{compress}:v1", f"oci:{layout}:v1", digest=True)


def _to_zstd(layout: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    blobs = layout / "blobs" / "sha256"
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
    for layer in manifest["layers"]:
        data = zstandard.ZstdCompressor().compress((blobs / layer["digest"][7:]).read_bytes())
        layer.update(
            digest="sha256:" + hashlib.sha256(data).hexdigest(),
            size=len(data),
            mediaType="application/vnd.oci.image.layer.v1.tar+zstd",
        )
        (blobs / layer["digest"][7:]).write_bytes(data)
    body = json.dumps(manifest).encode()
    index["manifests"][0].update(
        digest="sha256:" + hashlib.sha256(body).hexdigest(), size=len(body)
    )
    (blobs / index["manifests"][0]["digest"][7:]).write_bytes(body)
    (layout / "index.json").write_text(json.dumps(index))


def test_multi_platform_index(store: Containerd, cli: CliRunner, tmp_path: Path) -> None:
    layout = write_multi_platform_layout(tmp_path)
    import_oci(store, layout, "bmtest/multi", "--all-platforms")
    ours, theirs = "containerd:bmtest/multi:multi", f"oci:{layout}:multi"
    for platform in ("linux/amd64", "linux/arm64"):
        assert_same(cli, ours, theirs, "--platform", platform, digest=True)
    # no --platform: every platform the index offers, as from the layout (the arm64
    # entry, MISLABELED, has no Hopper code: a GH200 node fails)
    assert_same(cli, ours, theirs, digest=True)
    code, doc = run_check(cli, ours)
    judged = cast(list[dict[str, str]], doc["platforms"])
    assert code == 1 and [p["platform"] for p in judged] == ["linux/amd64", "linux/arm64"]
    result = cli("check", ours, "--platform", "linux/s390x")
    assert result.code == 2
    assert "no image for platform linux/s390x" in result.err


def test_platform_not_fetched_exits_2(
    store: Containerd, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ctr images import --platform`` references only its platform's manifest (its
    GC labels); the other platform's blobs leave the namespace at containerd's next
    garbage collection, run here at once by a synchronous delete (``ctr images rm
    --sync``). The index still names the other manifest, which is then not found. (A
    namespace of its own: other tests' images hold both platforms in k8s.io.)"""
    layout = write_multi_platform_layout(tmp_path)
    ns = "amd-only"
    import_oci(store, layout, "bmtest/amd-only", "--platform", "linux/amd64", namespace=ns)
    (name,) = store.ctr("images", "ls", "-q", namespace=ns).split()
    store.ctr("images", "tag", name, "bmtest/gc-now:v1", namespace=ns)
    store.ctr("images", "rm", "--sync", "bmtest/gc-now:v1", namespace=ns)
    monkeypatch.setenv("CONTAINERD_NAMESPACE", ns)
    ours = "containerd:bmtest/amd-only:multi"
    # the amd64 entry alone: the layout's arm64 one would be judged too without it
    assert_same(cli, ours, f"oci:{layout}:multi", "--platform", "linux/amd64", digest=True)
    result = cli("check", ours, "--platform", "linux/arm64")
    assert result.code == 2, result.err
    # without --platform the arm64 entry is judged too, and cannot be: refused alike
    assert cli("check", ours).err == result.err
    assert "the linux/arm64 manifest sha256:" in result.err
    assert f"namespace '{ns}'" in result.err and "pull the image again" in result.err


def test_shared_layers_use_the_cache(store: Containerd, cli: CliRunner, tmp_path: Path) -> None:
    """Two images sharing two layers: the second reads them from the layer cache,
    as two registry or OCI images sharing them do."""
    refs = []
    for name, image in (("first", LAYERED), ("second", SIBLING)):
        layout = write_oci_layout(tmp_path / name, image, tag="v1")
        import_oci(store, layout, f"bmtest/share-{name}")
        refs.append((f"containerd:bmtest/share-{name}:v1", f"oci:{layout}:v1"))
    ours = cli("check", "--json", *(r[0] for r in refs), "--cache", str(tmp_path / "c1"))
    theirs = cli("check", "--json", *(r[1] for r in refs), "--cache", str(tmp_path / "c2"))
    assert ours.code == theirs.code == 1, ours.err  # SIBLING carries sm_80 only
    a, b = ours.json()["cache"], theirs.json()["cache"]
    assert (a["hits"], a["misses"]) == (b["hits"], b["misses"]) == (2, 4)


def test_pulled_from_registry(
    store: Containerd, registry: Registry, cli: CliRunner, tmp_path: Path
) -> None:
    for name, image in (("layered", LAYERED), ("mislabeled", MISLABELED)):
        layout = write_oci_layout(tmp_path / name, image, tag="v1")
        remote = f"{registry.host}/bmtest/ctd-{name}:v1"
        skopeo("copy", "--dest-tls-verify=false", f"oci:{layout}:v1", f"docker://{remote}")
        store.ctr("images", "pull", "--plain-http", remote)
        assert_same(cli, f"containerd:{remote}", f"docker://{remote}", digest=True)
        digest = scan_image(f"docker://{remote}").digest
        by_digest = f"containerd:{registry.host}/bmtest/ctd-{name}@{digest}"
        assert_same(cli, by_digest, f"docker://{remote}", digest=True)


# ------------------------------------------------------------------ refusals


def test_unknown_name_and_wrong_namespace(
    store: Containerd, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = write_docker_archive(tmp_path / "a.tar", LAYERED, tag="bmtest/known:v1")
    store.ctr("images", "import", "--no-unpack", str(archive), namespace="team-a")
    monkeypatch.setenv("CONTAINERD_NAMESPACE", "team-a")
    missing = cli("check", "containerd:bmtest/known:v2")
    assert missing.code == 2
    assert "namespace 'team-a'" in missing.err and "docker.io/bmtest/known:v1" in missing.err
    monkeypatch.setenv("CONTAINERD_NAMESPACE", "no-such-ns")
    wrong = cli("check", "containerd:bmtest/known:v1")
    assert wrong.code == 2
    assert "no namespace 'no-such-ns'" in wrong.err and "team-a" in wrong.err
    assert "Traceback" not in missing.err + wrong.err


def test_missing_store_exits_3(
    store: Containerd, cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CONTAINERD_ROOT", str(tmp_path / "nothing"))
    result = cli("check", "containerd:bmtest/any:v1")
    assert result.code == 3
    assert str(tmp_path / "nothing" / METADATA) in result.err
    assert f"a containerd socket is at {store.address}" in result.err  # it answers there
    monkeypatch.setenv("CONTAINERD_ADDRESS", str(tmp_path / "no.sock"))
    result = cli("check", "containerd:bmtest/any:v1")
    assert result.code == 3 and f"no containerd socket is at {tmp_path / 'no.sock'}" in result.err
    assert "(--containerd-address, $CONTAINERD_ADDRESS)" in result.err  # both ways to set it


def test_the_options_name_the_stores_defaults(cli: CliRunner) -> None:
    """--help states image/containerd_store.py's defaults (the CLI keeps its own text:
    it starts without the image package)."""
    from buildmatrix.image.containerd_store import DEFAULT_ADDRESS, DEFAULT_NAMESPACE, DEFAULT_ROOT

    text = " ".join(cli("check", "--help").out.split())
    for flag, env, default in (
        ("--containerd-address PATH", "CONTAINERD_ADDRESS", DEFAULT_ADDRESS),
        ("--containerd-namespace NAME", "CONTAINERD_NAMESPACE", DEFAULT_NAMESPACE),
        ("--containerd-root PATH", "CONTAINERD_ROOT", DEFAULT_ROOT),
    ):
        _, after = text.split(flag)  # the option is listed once
        help_text = after.split(" --")[0]  # up to the next option
        assert f"(default {default}" in help_text and f"${env}" in help_text, (flag, help_text)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_blob_exits_2(
    store: Containerd, cli: CliRunner, tmp_path: Path, damage: str
) -> None:
    unique = Image(layers=[{"etc/marker": damage.encode() + str(tmp_path).encode()}])
    layout = write_oci_layout(tmp_path / "oci", unique, tag="v1", compress=False)
    import_oci(store, layout, f"bmtest/damaged-{damage}")
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
    digest = manifest["layers"][0]["digest"]
    stored = store.root / "io.containerd.content.v1.content/blobs/sha256" / digest[7:]
    data = bytearray(stored.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        stored.write_bytes(bytes(data))
    elif damage == "truncate":
        stored.write_bytes(bytes(data[: len(data) // 2]))
    else:
        stored.unlink()
    result = cli("check", f"containerd:bmtest/damaged-{damage}:v1", "--allow-empty")
    assert result.code == 2, result.err
    expected = "not in the content store" if damage == "delete" else digest[:19]
    assert expected in result.err and "Traceback" not in result.err


# ------------------------------------------------------------ the metadata reader


def test_reader_lists_what_ctr_lists(
    store: Containerd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of names (branch pages) and a label over a page (overflow pages):
    the bbolt reader's listing equals ``ctr images ls``, the daemon's own answer."""
    archive = write_docker_archive(tmp_path / "a.tar", MISLABELED, tag="bmtest/many:base")
    store.ctr("images", "import", "--no-unpack", str(archive), namespace="many")
    # One `ctr images tag SOURCE TARGET...` call makes all 300 (containerd's
    # cmd/ctr/commands/images/tag.go, tagCommand: one image Create per target).
    targets = [f"docker.io/bmtest/many:t{i:03}-{'x' * 40}" for i in range(300)]
    store.ctr("images", "tag", "docker.io/bmtest/many:base", *targets, namespace="many")
    # Labels are at most 4096 bytes (containerd's labels.Validate), and a page holds
    # at least two keys (bbolt's minKeysPerPage): two such labels overflow a page.
    big = {f"big{i}": str(i) * 4000 for i in range(4)}
    pairs = [f"{k}={v}" for k, v in big.items()]
    store.ctr("images", "label", "docker.io/bmtest/many:base", *pairs, namespace="many")

    def walk(root: Any) -> tuple[list[str], dict[str, str]]:
        images = root.bucket(b"v1", b"many", b"images")
        names = [k.decode() for k, _, is_bucket in images.items() if is_bucket]
        labels = images.bucket(b"docker.io/bmtest/many:base", b"labels")
        return names, {k.decode(): v.decode() for k, v, _ in labels.items()}

    seen: list[tuple[int, int]] = []  # (flags, overflow) of every page read
    page = BoltFile.page

    def recording(self: BoltFile, pgid: int) -> bytes:
        data = page(self, pgid)
        _, flags, _, overflow = PAGE_HEADER.unpack_from(data)
        seen.append((flags, overflow))
        return data

    monkeypatch.setattr(BoltFile, "page", recording)
    names, labels = read_consistent(store.root / METADATA, walk)
    assert any(f == BRANCH_PAGE for f, _ in seen), "no branch page: the test is too small"
    assert any(o > 0 for _, o in seen), "no overflow page: the labels are too small"
    assert names == sorted(store.ctr("images", "ls", "-q", namespace="many").split())
    assert len(names) == 301 and labels == big


def test_damaged_metadata_is_exit_2_never_a_crash(
    store: Containerd, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy of the live meta.db, damaged in the bytes a lookup reads (both meta
    pages and every tree page on the way): each damaged copy is refused with exit 2
    (or 3: no store), or, where the damage missed what matters, gives the intact
    copy's report; the content is verified by digest, so it cannot pass otherwise."""
    archive = write_docker_archive(tmp_path / "a.tar", LAYERED, tag="bmtest/fuzz:v1")
    store.ctr("images", "import", "--no-unpack", str(archive), namespace="fuzz")
    root = tmp_path / "root"
    (root / METADATA).parent.mkdir(parents=True)
    content = "io.containerd.content.v1.content"
    (root / content).symlink_to(store.root / content)
    original = (store.root / METADATA).read_bytes()
    (root / METADATA).write_bytes(original)
    monkeypatch.setenv("CONTAINERD_ROOT", str(root))
    monkeypatch.setenv("CONTAINERD_NAMESPACE", "fuzz")
    ref = "containerd:bmtest/fuzz:v1"
    code, intact = verdicts(cli, ref)
    assert code == 0

    offsets = set(range(2 * 4096))  # the two meta pages
    page = BoltFile.page

    def recording(self: BoltFile, pgid: int) -> bytes:
        data = page(self, pgid)
        offsets.update(range(pgid * self.meta.page_size, pgid * self.meta.page_size + len(data)))
        return data

    with monkeypatch.context() as m:
        m.setattr(BoltFile, "page", recording)
        scan_image(ref)
    read = sorted(offsets)
    rng = random.Random(21)
    outcomes = {0: 0, 2: 0}
    for _ in range(150):
        data = bytearray(original)
        for _ in range(rng.randint(1, 4)):
            data[rng.choice(read)] = rng.randrange(256)
        (root / METADATA).write_bytes(bytes(data))
        result = cli("check", ref, "--json")
        assert result.code in (0, 2), result.err
        assert "Traceback" not in result.err
        if result.code == 0:
            assert portable(result.json()) == intact
        outcomes[result.code] += 1
    assert outcomes[2] > 0, "no damage was noticed: the damage missed the lookup"
    # empty; cut inside the last page the lookup reads (half the file is not enough:
    # a store with few images keeps every page it uses in the first half, and is read
    # whole from it); zeros
    for damaged in (b"", original[: read[-1]], bytes(len(original))):
        (root / METADATA).write_bytes(damaged)
        result = cli("check", ref)
        assert result.code == 2 and "metadata store cannot be read" in result.err, result.err


def test_reads_while_containerd_writes_see_committed_states(
    store: Containerd, tmp_path: Path
) -> None:
    """ctr tags t000, t001, ... one after the other while the reader lists the names
    again and again: every listing is a state containerd committed (the base name and
    a prefix of the tags), whatever the interleaving. A walk that kept meeting new
    commits may give up (BoltError); it never answers with a mixed state."""
    archive = write_docker_archive(tmp_path / "a.tar", MISLABELED, tag="bmtest/busy:base")
    store.ctr("images", "import", "--no-unpack", str(archive), namespace="busy")
    tags = [f"docker.io/bmtest/busy:t{i:03}" for i in range(60)]
    done = threading.Event()

    def writer() -> None:
        try:
            for tag in tags:
                store.ctr("images", "tag", "docker.io/bmtest/busy:base", tag, namespace="busy")
        finally:
            done.set()

    def names(root: Any) -> list[str]:
        images = root.bucket(b"v1", b"busy", b"images")
        return [k.decode() for k, _, is_bucket in images.items() if is_bucket]

    thread = threading.Thread(target=writer)
    thread.start()
    seen = set()
    while not done.is_set():
        try:
            listed = read_consistent(store.root / METADATA, names)
        except BoltError as exc:
            assert "changed during each" in str(exc)
            continue
        finally:
            time.sleep(0.005)  # leave the daemon some of the machine's CPU
        k = len(listed) - 1
        assert listed == sorted(["docker.io/bmtest/busy:base", *tags[:k]]), listed
        seen.add(k)
    thread.join()
    final = read_consistent(store.root / METADATA, names)
    assert final == sorted(["docker.io/bmtest/busy:base", *tags])


def test_smoke_affinity_and_options(
    containerd: Containerd,  # noqa: F811
    cli: CliRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``smoke --image`` and ``affinity`` take containerd: REFs as check does, and the
    --containerd-* options win over the environment (as ctr's -a/-n over theirs)."""
    archive = write_docker_archive(tmp_path / "a.tar", LAYERED, tag="bmtest/cmds:v1")
    containerd.ctr("images", "import", "--no-unpack", str(archive), namespace="cmds")
    for key, value in containerd.env("cmds").items():
        monkeypatch.setenv(key, value)
    ours, theirs = "containerd:bmtest/cmds:v1", f"docker-archive:{archive}"
    snapshot = str(REPO / "tests" / "fixtures" / "nodes" / "h100-580.json")

    def smoke(ref: str, *extra: str) -> tuple[int, Any]:
        r = cli("smoke", "--snapshot", snapshot, "--json", "--image", ref, *extra)
        doc = r.json()
        checks = json.dumps(doc["checks"]).replace(ref, "REF")  # messages name the image
        return r.code, json.loads(checks)

    assert smoke(ours) == smoke(theirs)
    assert smoke(ours)[0] == 0
    a = cli("affinity", ours, "--format", "json")
    b = cli("affinity", theirs, "--format", "json")
    assert a.code == b.code == 0 and a.out == b.out
    # The environment points elsewhere; the options say where the image is.
    monkeypatch.setenv("CONTAINERD_NAMESPACE", "nowhere")
    monkeypatch.setenv("CONTAINERD_ROOT", str(tmp_path / "nothing"))
    assert cli("check", ours).code == 3
    given = ("--containerd-root", str(containerd.root), "--containerd-namespace", "cmds")
    assert verdicts(cli, ours, *given) == verdicts(cli, theirs)
    assert cli("affinity", ours, "--format", "json", *given).out == b.out
    assert smoke(ours, *given) == smoke(theirs)


@pytest.mark.parametrize("mode", ["apply", "nfd"])
def test_manifests_mount_the_stores_read_only(cli: CliRunner, mode: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from tests.test_k8s_manifests import K8S_VERSION, _docs, _pod

    docs = _docs(cli, "--containerd", "--mode", mode)
    for d in docs:
        if d["apiVersion"].startswith("apps/"):  # NFD's CRDs have no schema there
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    pod = _pod(docs)
    (container,) = pod["containers"]
    host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    for name, folder in (
        ("containerd-content", "io.containerd.content.v1.content"),
        ("containerd-metadata", "io.containerd.metadata.v1.bolt"),
    ):
        path = f"/var/lib/containerd/{folder}"
        assert host[name] == {"path": path, "type": "Directory"}
        assert mounts[name] == {"name": name, "mountPath": path, "readOnly": True}
    assert {"name": "CONTAINERD_ROOT", "value": "/var/lib/containerd"} in container["env"]
    plain = _pod(_docs(cli, "--mode", mode))
    assert not any(v["name"].startswith("containerd") for v in plain["volumes"])


@pytest.mark.parametrize(
    ("text", "names", "cri"),
    [
        ("train", ["train", "train:latest", "docker.io/library/train:latest"], 2),
        ("team/train:1", ["team/train:1", "docker.io/team/train:1"], 1),
        ("index.docker.io/t:1", ["index.docker.io/t:1", "docker.io/library/t:1"], 1),
        ("docker.io/library/train:1", ["docker.io/library/train:1"], 0),
        ("127.0.0.1:5000/t@sha256:" + "a" * 64, ["127.0.0.1:5000/t@sha256:" + "a" * 64], 0),
        (
            "ghcr.io/o/t:1@sha256:" + "b" * 64,
            ["ghcr.io/o/t:1@sha256:" + "b" * 64, "ghcr.io/o/t@sha256:" + "b" * 64],
            1,
        ),
    ],
)
def test_names_looked_up(text: str, names: list[str], cri: int) -> None:
    """As given first, then as ctr and nerdctl name what they pull and import; in
    the CRI's namespace (k8s.io) the name ``docker.ParseDockerRef`` gives (``names[cri]``)
    first, the one the CRI's ``LocalResolve`` looks up."""
    ref = parse_ref(f"containerd:{text}")
    assert ref.transport is Transport.CONTAINERD
    assert candidate_names(ref, "default") == names
    assert candidate_names(ref, "k8s.io") == [names[cri], *(n for n in names if n != names[cri])]


def test_the_cri_name_wins(store: Containerd, cli: CliRunner, tmp_path: Path) -> None:
    """Two records for one name in k8s.io: ``bmtest/two:v1`` as ``ctr images import
    --base-name`` writes it (sm_90, passes) and ``docker.io/bmtest/two:v1`` as a
    ``docker save`` import writes it (sm_80 only, fails on 9.0). The CRI runs the
    second (``LocalResolve``), and so ``containerd:bmtest/two:v1`` judges it; the
    ``default`` namespace, as ctr, takes the name as given."""
    bad = write_docker_archive(tmp_path / "bad.tar", MISLABELED, tag="bmtest/two:v1")
    good = write_oci_layout(tmp_path / "good", LAYERED, tag="v1")
    for ns in ("k8s.io", "default"):
        store.ctr("images", "import", "--no-unpack", str(bad), namespace=ns)
        import_oci(store, good, "bmtest/two", namespace=ns)
        names = set(store.ctr("images", "ls", "-q", namespace=ns).split())
        assert {"docker.io/bmtest/two:v1", "bmtest/two:v1"} <= names
    cri = verdicts(cli, "containerd:bmtest/two:v1")
    full = verdicts(cli, "containerd:docker.io/bmtest/two:v1")
    assert cri == full and cri[0] == 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONTAINERD_NAMESPACE", "default")
        assert verdicts(cli, "containerd:bmtest/two:v1")[0] == 0


def test_a_malformed_name_is_exit_2(cli: CliRunner) -> None:
    result = cli("check", "containerd:Team/Train")
    assert result.code == 2 and "not a valid image reference" in result.err


AGENT_USER = "65532"  # the tool image's USER (Dockerfile), the DaemonSet's agent


def _as_agent(python: str, *args: str, mounts: tuple[tuple[Path, Path], ...] = ()) -> Any:
    """``python -m buildmatrix ARGS`` as the agent's non-root user, every capability
    dropped, in a mount namespace holding ``mounts`` (read-only bind mounts): what the
    DaemonSet's container sees with the hostPath volumes of ``k8s manifests
    --containerd``."""
    binds = "".join(f"mount --bind -o ro {a} {b} && " for a, b in mounts)
    user = f"--reuid {AGENT_USER} --regid {AGENT_USER} --clear-groups --inh-caps=-all"
    script = f'{binds}exec setpriv {user} "$@"'
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", python, "-m", "buildmatrix", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.other_user
def test_the_agent_reads_the_mounted_folders_as_non_root(
    containerd: Containerd,  # noqa: F811
    cli: CliRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the two folders mounted read-only the agent's non-root user reads the
    image, with the verdict root gets; through containerd's root folder (0700) it is
    refused with exit 3, naming the folder."""
    if not all(shutil.which(t) for t in ("unshare", "setpriv", "mount")):
        pytest.skip("unshare, setpriv and mount (util-linux) are needed")
    archive = write_docker_archive(tmp_path / "a.tar", LAYERED, tag="bmtest/agent:v1")
    containerd.ctr("images", "import", "--no-unpack", str(archive), namespace="agent")
    base = Path(tempfile.mkdtemp(prefix="bm-agent-", dir="/tmp"))  # open to the agent
    try:
        base.chmod(0o755)
        root = base / "root"
        folders = ("io.containerd.content.v1.content", "io.containerd.metadata.v1.bolt")
        for folder in folders:
            (root / folder).mkdir(parents=True)
        cache = base / "cache"
        cache.mkdir(mode=0o777)
        cache.chmod(0o777)
        env = {
            "CONTAINERD_NAMESPACE": "agent",
            "XDG_CACHE_HOME": str(cache),
            "HOME": str(cache),
            # a copy open to the agent, wherever the checkout and its .venv lie
            "PYTHONPATH": agent_site.stage(base / "py"),
        }
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        python = next(
            (p for p in agent_site.interpreters() if _as_agent(p, "--version").returncode == 0),
            None,
        )
        if python is None:
            pytest.skip(f"no Python interpreter here that user {AGENT_USER} may run")
        mounts = tuple((containerd.root / f, root / f) for f in folders)
        args = ("check", "containerd:bmtest/agent:v1", "--json")
        monkeypatch.setenv("CONTAINERD_ROOT", str(root))
        agent = _as_agent(python, *args, mounts=mounts)
        assert agent.returncode == 0, agent.stderr
        monkeypatch.setenv("CONTAINERD_ROOT", str(containerd.root))
        ours = cli(*args)
        assert ours.code == 0
        assert json.loads(agent.stdout) == ours.json()
        refused = _as_agent(python, *args)  # the root folder itself, not mounted
        assert refused.returncode == 3, refused.stderr
        assert "not readable by this user" in refused.stderr
        assert str(containerd.root / METADATA) in refused.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_smoke_prefers_the_image_the_node_holds(
    store: Containerd, registry: Registry, cli: CliRunner, tmp_path: Path
) -> None:
    """``smoke --prefer-containerd`` (the DaemonSet's with ``k8s manifests
    --containerd``): a registry name the node's containerd holds is judged as the node
    holds it (here an sm_80-only build under the name whose registry copy runs on
    Hopper), a name it does not hold is read from the registry, and a store that is
    not there fails the node (exit 3), not a silent switch to the registry."""
    name = f"{registry.host}/bmtest/nodefirst:v1"
    layout = write_oci_layout(tmp_path / "good", LAYERED, tag="v1")
    skopeo("copy", "--dest-tls-verify=false", f"oci:{layout}:v1", f"docker://{name}")
    old = Image(layers=[{"usr/lib/libsass_sm80.so": fixture("libsass_sm80.so")}])
    archive = write_docker_archive(tmp_path / "old.tar", old, tag=name)
    store.ctr("images", "import", "--no-unpack", str(archive))
    snapshot = str(REPO / "tests" / "fixtures" / "nodes" / "h100-580.json")

    def smoke(ref: str, *extra: str) -> tuple[int, dict[str, Any]]:
        r = cli("smoke", "--snapshot", snapshot, "--json", "--image", ref, *extra)
        return r.code, {c["name"]: c for c in r.json()["checks"]}

    assert smoke(f"docker://{name}")[0] == 0  # the registry's copy runs on Hopper
    code, checks = smoke(f"docker://{name}", "--prefer-containerd")
    assert code == 1
    (image,) = [c for n, c in checks.items() if n.startswith("image ")]
    assert image["name"] == f"image containerd:{name}"  # says where it was read
    assert not image["ok"]
    other = f"{registry.host}/bmtest/nodefirst-registry-only:v1"
    skopeo("copy", "--dest-tls-verify=false", f"oci:{layout}:v1", f"docker://{other}")
    assert smoke(f"docker://{other}", "--prefer-containerd")[0] == 0
    missing = ("--containerd-root", str(tmp_path / "no-store"))
    code, checks = smoke(f"docker://{name}", "--prefer-containerd", *missing)
    assert code == 3  # a source that is not there, as for an unreachable registry
    assert any("cannot be checked" in c["message"] for c in checks.values() if not c["ok"])
