"""``docker-daemon:`` on a Docker Engine that uses containerd's image store.

The containerd side is real: the machine's containerd (tests/containerd_service.py)
with the images imported by ``ctr images import`` into namespace ``moby`` under the
names Docker gives them (``docker.io/library/NAME:TAG``, moby daemon/containerd/
image_tag.go ``TagImage``: ``reference.TagNameOnly`` of the normalised name). The
engine's side is a STAND-IN (tests/engine_standin.py): Docker 20.10, the engine
this machine has, cannot run that store; the stand-in answers ``/info`` and
``/images/NAME/json`` with the shapes of the Engine API documentation and serves
the image's ``docker save`` stream. Every verdict and file list is compared with
the same image read as ``docker-archive:``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.image.containerd_store import DEFAULT_ADDRESS, DEFAULT_ROOT, Store
from buildmatrix.image.enginestore import engine_store
from buildmatrix.image.open import scan_image
from tests import agent_site
from tests.conftest import CliRunner
from tests.containerd_service import Containerd, containerd  # noqa: F401
from tests.engine_standin import StandinEngine, StandinImage
from tests.images import Image, write_docker_archive, write_platform_layout
from tests.test_containerd import AGENT_USER, import_oci, portable
from tests.test_image_sources import LAYERED, MISLABELED, run_check

pytestmark = pytest.mark.integration

# What each engine answers in GET /info, as api/swagger.yaml (SystemInfo) documents
# it: the graph-driver example of the docs (overlay2) and the containerd image
# store's (moby daemon/containerd/service.go LayerStoreStatus, daemon/info.go
# fillContainerdInfo).
OVERLAY2_INFO = {
    "Driver": "overlay2",
    "DriverStatus": [
        ["Backing Filesystem", "extfs"],
        ["Supports d_type", "true"],
        ["Native Overlay Diff", "true"],
    ],
    "DockerRootDir": "/var/lib/docker",
}
C8D_INFO = {
    "Driver": "overlayfs",
    "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]],
    "DockerRootDir": "/var/lib/docker",
    "Containerd": {
        "Address": "/run/containerd/containerd.sock",
        "Namespaces": {"Containers": "moby", "Plugins": "plugins.moby"},
    },
}
MANAGED = "/var/run/docker/containerd/containerd.sock"  # dockerd's own containerd
SYSTEM_ROOT = ("/var/lib/containerd", "moby", DEFAULT_ADDRESS)
MANAGED_ROOT = ("/var/lib/docker/containerd/daemon", "moby", "")
DEFAULTS = Store(root=Path(DEFAULT_ROOT), namespace="k8s.io", address=DEFAULT_ADDRESS)


def _with(**changes: Any) -> dict[str, Any]:
    return {**json.loads(json.dumps(C8D_INFO)), **changes}


@pytest.mark.parametrize(
    ("info", "given", "host", "system", "expected"),
    [
        # not the containerd image store: the overlay2/save path as before
        (OVERLAY2_INFO, DEFAULTS, "unix://", True, None),
        (_with(DriverStatus=[]), DEFAULTS, "unix://", True, None),
        (_with(DriverStatus=None), DEFAULTS, "unix://", True, None),
        # the system containerd, the engine's default namespace
        (C8D_INFO, DEFAULTS, "unix://", True, ("/var/lib/containerd", "moby", DEFAULT_ADDRESS)),
        # the engine's own containerd: root under its data root
        (
            _with(Containerd={"Address": MANAGED, "Namespaces": {"Containers": "moby"}}),
            DEFAULTS,
            "unix:///var/run/docker.sock",
            True,
            ("/var/lib/docker/containerd/daemon", "moby", MANAGED),
        ),
        # a namespace of its own (userns-remap suffixes it) is the engine's word
        (
            _with(Containerd={"Address": DEFAULT_ADDRESS, "Namespaces": {"Containers": "m.1.1"}}),
            DEFAULTS,
            "unix://",
            False,
            ("/var/lib/containerd", "m.1.1", DEFAULT_ADDRESS),
        ),
        # API < 1.46 names no socket: the system one where it is there (moby's rule)
        (_with(Containerd=None), DEFAULTS, "unix://", True, SYSTEM_ROOT),
        (_with(Containerd=None), DEFAULTS, "unix://", False, MANAGED_ROOT),
        # --containerd-root / $CONTAINERD_ROOT wins
        (
            C8D_INFO,
            Store(root=Path("/k3s/containerd"), namespace="k8s.io", address=DEFAULT_ADDRESS),
            "unix://",
            True,
            ("/k3s/containerd", "moby", DEFAULT_ADDRESS),
        ),
        # not on this host, or nowhere said: not read here, with the reason
        (C8D_INFO, DEFAULTS, "tcp://10.0.0.2:2376", True, "not on this host"),
        (C8D_INFO, DEFAULTS, "ssh://me@gpu-host", True, "not on this host"),
        (_with(Containerd=None, DockerRootDir=""), DEFAULTS, "unix://", False, "does not say"),
    ],
)
def test_the_engines_answer_names_the_store(
    info: dict[str, Any], given: Store, host: str, system: bool, expected: Any
) -> None:
    found = engine_store(info, given=given, host=host, system_socket=system)
    if expected is None:
        assert not found.containerd and found.store is None
    elif isinstance(expected, str):
        assert found.containerd and found.store is None and expected in found.why_not
    else:
        assert found.containerd and found.store is not None, found.why_not
        assert (str(found.store.root), found.store.namespace, found.store.address) == expected


def test_the_real_engine_here_is_not_read_from_containerd(docker_host: str) -> None:
    """The tests' Docker 20.10 (a graph driver) answers /info without the containerd
    image store's driver-type: docker-daemon: keeps reading it as before."""
    import docker

    info = docker.DockerClient(base_url=docker_host).info()
    assert info["Driver"] in ("vfs", "overlay2")
    assert not engine_store(info, given=DEFAULTS, host=docker_host, system_socket=True).containerd


# ---------------------------------------------------------------- a real store


def _import(ctd: Containerd, archive: Path, tag: str) -> StandinImage:
    """``docker save`` archive → namespace moby, as the engine holds it; the target
    digest as ``ctr images ls`` reports it (the engine's image ID)."""
    ctd.ctr("images", "import", "--no-unpack", str(archive), namespace="moby")
    full = tag if "/" in tag else f"docker.io/library/{tag}"
    full = full if full.startswith("docker.io/") else f"docker.io/{full}"
    listed = [line.split() for line in ctd.ctr("images", "ls", namespace="moby").splitlines()]
    (row,) = [r for r in listed[1:] if r[0] == full]
    media_type, digest = row[1], row[2]
    import tarfile

    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
    target = {"mediaType": media_type, "digest": digest, "size": 0}
    return StandinImage(names=[tag], target=target, config=config, save=archive)


@pytest.fixture
def engine(
    containerd: Containerd,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[StandinEngine]:
    """The stand-in engine in front of the real containerd, whose root sits where
    the engine's own containerd keeps it (``<DockerRootDir>/containerd/daemon``)."""
    base = Path(tempfile.mkdtemp(prefix="bm-eng-", dir="/tmp"))  # open to the agent
    base.chmod(0o755)
    docker_root = base / "docker"
    (docker_root / "containerd").mkdir(parents=True)
    (docker_root / "containerd" / "daemon").symlink_to(containerd.root)
    standin = StandinEngine(
        socket=base / "docker.sock", docker_root=docker_root, containerd_address=containerd.address
    )
    for key in ("CONTAINERD_ROOT", "CONTAINERD_NAMESPACE", "CONTAINERD_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{standin.socket}")
    try:
        with standin:
            yield standin
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _same(cli: CliRunner, ours: str, archive: Path) -> dict[str, Any]:
    """``ours`` judged as the archive is (report, final view); its report."""
    code, doc = run_check(cli, ours)
    theirs = run_check(cli, f"docker-archive:{archive}")
    assert (code, portable(doc)) == (theirs[0], portable(theirs[1]))
    a, b = scan_image(ours), scan_image(f"docker-archive:{archive}")
    assert (a.paths, a.symlinks, a.files, a.problems) == (b.paths, b.symlinks, b.files, b.problems)
    assert a.paths, "an image with no files proves nothing"
    return doc


@pytest.mark.parametrize(
    ("image", "tag"), [(LAYERED, "ddlayered:v1"), (MISLABELED, "bmtest/dd-mis:v1")]
)
def test_read_from_the_content_store(
    engine: StandinEngine, cli: CliRunner, tmp_path: Path, image: Image, tag: str
) -> None:
    archive = write_docker_archive(tmp_path / "a.tar", image, tag=tag)
    held = _import(containerd_of(engine), archive, tag)
    engine.images.append(held)
    short = held.target["digest"][7:19]
    for ref in (f"docker-daemon:{tag}", tag, f"docker-daemon:{short}"):
        doc = _same(cli, ref, archive)
        assert doc["read_from"].startswith("containerd image store (namespace 'moby' at "), doc
        assert str(engine.docker_root / "containerd" / "daemon") in doc["read_from"]
    assert engine.saves == 0  # the save stream was never asked for


def containerd_of(engine: StandinEngine) -> Containerd:
    return Containerd(
        root=(engine.docker_root / "containerd" / "daemon").resolve(),
        address=engine.containerd_address,
    )


@pytest.mark.other_user
def test_unreadable_store_falls_back_to_the_save_stream(
    engine: StandinEngine, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No store where the engine's answer points (exit 3 for containerd:) and the
    agent's non-root user before containerd's 0700 root: docker-daemon: reads the
    save stream as before and says why, with the same verdict."""
    tag = "bmtest/dd-fallback:v1"
    archive = write_docker_archive(tmp_path / "a.tar", LAYERED, tag=tag)
    engine.images.append(_import(containerd_of(engine), archive, tag))
    monkeypatch.setenv("CONTAINERD_ROOT", str(tmp_path / "nothing"))
    doc = _same(cli, f"docker-daemon:{tag}", archive)
    assert doc["read_from"].startswith("docker save stream (containerd's image store could not")
    assert str(tmp_path / "nothing") in doc["read_from"]
    text = cli("check", f"docker-daemon:{tag}", "--verbose")
    assert "read     docker save stream (containerd's image store could not" in text.out
    monkeypatch.delenv("CONTAINERD_ROOT")
    if not all(shutil.which(t) for t in ("unshare", "setpriv")):
        pytest.skip("unshare and setpriv (util-linux) are needed for the non-root run")
    # open to the agent user wherever the checkout, its .venv and the basetemp lie
    base = Path(tempfile.mkdtemp(prefix="bm-agent-", dir="/tmp"))
    try:
        base.chmod(0o755)
        cache = base / "cache"
        cache.mkdir(mode=0o777)
        cache.chmod(0o777)
        env = {
            **os.environ,
            "XDG_CACHE_HOME": str(cache),
            "HOME": str(cache),
            "PYTHONPATH": agent_site.stage(base / "py"),
        }
        user = ["setpriv", "--reuid", AGENT_USER, "--regid", AGENT_USER, "--clear-groups"]
        args = (f"docker-daemon:{tag}", "--json")
        for python in agent_site.interpreters():
            agent = subprocess.run(
                [*user, "--inh-caps=-all", python, "-m", "buildmatrix", "check", *args],
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=120,
            )
            if "Permission denied" not in agent.stderr or "python" not in agent.stderr:
                break
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert agent.returncode == 0, agent.stderr
    said = json.loads(agent.stdout)
    assert portable(said) == portable(doc)
    assert said["read_from"].startswith("docker save stream (containerd's image store could not")
    assert "not readable by this user" in said["read_from"]


def test_damaged_blob_is_refused_not_switched(
    engine: StandinEngine, cli: CliRunner, tmp_path: Path
) -> None:
    """A blob that does not match its digest is exit 2, as for containerd:, never a
    silent switch to the save stream (which would judge other bytes)."""
    tag = "bmtest/dd-damaged:v1"
    unique = Image(layers=[{"etc/marker": str(tmp_path).encode()}])
    archive = write_docker_archive(tmp_path / "a.tar", unique, tag=tag)
    ctd = containerd_of(engine)
    engine.images.append(_import(ctd, archive, tag))
    layer = json.loads(subprocess.check_output(["tar", "-xOf", str(archive), "manifest.json"]))
    digest = layer[0]["Layers"][0].split("/")[0]
    stored = ctd.root / "io.containerd.content.v1.content/blobs/sha256" / digest
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x01
    stored.write_bytes(bytes(data))
    result = cli("check", f"docker-daemon:{tag}", "--allow-empty")
    assert result.code == 2, result.err
    assert digest[:12] in result.err and engine.saves == 0


def _import_index(
    engine: StandinEngine, tmp_path: Path, entries: list[tuple[dict[str, str] | None, Image]]
) -> tuple[str, list[str]]:
    """An index of ``entries`` imported into namespace moby as ``ddpick:multi``;
    (the name, each entry's manifest digest in index order)."""
    layout = write_platform_layout(tmp_path / "layout", entries, tag="multi")
    ctd = containerd_of(engine)
    import_oci(ctd, layout, "docker.io/library/ddpick", "--all-platforms", namespace="moby")
    top = json.loads((layout / "index.json").read_text())["manifests"][0]
    index = json.loads((layout / "blobs" / "sha256" / top["digest"][7:]).read_text())
    digests = [d["digest"] for d in index["manifests"]]
    first = entries[0][1]
    archive = write_docker_archive(tmp_path / "first.tar", first, tag="ddpick:multi")
    config = json.loads(subprocess.check_output(["tar", "-xOf", str(archive), "manifest.json"]))
    config = json.loads(subprocess.check_output(["tar", "-xOf", str(archive), config[0]["Config"]]))
    target = {"mediaType": top["mediaType"], "digest": top["digest"], "size": top["size"]}
    engine.images.append(
        StandinImage(names=["ddpick:multi"], target=target, config=config, save=archive)
    )
    return "ddpick:multi", digests


AMD64 = {"os": "linux", "architecture": "amd64"}


def test_the_entry_docker_runs_is_judged_not_containerds(
    engine: StandinEngine, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry without a platform whose config is linux/amd64 (no Hopper code), then
    a linux/amd64 entry (Hopper code): containerd's ``images.Manifest`` puts the
    platform-less entry last and runs the second (the real containerd pulls it,
    ``containerd:`` passes); moby's ``getBestPresentImageManifest`` keeps index
    order and reads the config, so Docker runs the first: it is the one judged."""
    tag, (moby_runs, containerd_runs) = _import_index(
        engine, tmp_path, [(None, MISLABELED), (AMD64, LAYERED)]
    )
    code, doc = run_check(cli, f"docker-daemon:{tag}", "--platform", "linux/amd64")
    assert code == 1 and doc["digest"] == moby_runs, doc
    assert str(doc["read_from"]).startswith("containerd image store (namespace 'moby' at ")
    alone = write_docker_archive(tmp_path / "mis.tar", MISLABELED, tag="mis:1")
    theirs = run_check(cli, f"docker-archive:{alone}", "--platform", "linux/amd64")
    assert portable(doc)["targets"] == portable(theirs[1])["targets"]
    ctd = containerd_of(engine)
    for key, value in ctd.env(namespace="moby").items():
        monkeypatch.setenv(key, value)
    code, doc = run_check(
        cli, "containerd:docker.io/library/ddpick:multi", "--platform", "linux/amd64"
    )
    assert code == 0 and doc["digest"] == containerd_runs, doc
    assert engine.saves == 0


def test_only_manifests_the_store_holds_are_candidates(
    engine: StandinEngine, cli: CliRunner, tmp_path: Path
) -> None:
    """Two linux/amd64 entries: Docker runs the first while its manifest is in the
    namespace, the second once it is gone (moby ``walkPresentChildren`` skips what
    ``content.Info`` does not find), never the missing one."""
    tag, (first, second) = _import_index(engine, tmp_path, [(AMD64, MISLABELED), (AMD64, LAYERED)])
    code, doc = run_check(cli, f"docker-daemon:{tag}", "--platform", "linux/amd64")
    assert code == 1 and doc["digest"] == first, doc
    containerd_of(engine).ctr("content", "rm", first, namespace="moby")
    code, doc = run_check(cli, f"docker-daemon:{tag}", "--platform", "linux/amd64")
    assert code == 0 and doc["digest"] == second, doc


def test_what_a_newer_amd64_host_runs_is_judged_too(
    engine: StandinEngine, cli: CliRunner, tmp_path: Path
) -> None:
    """``docker run`` without ``--platform`` on an x86-64-v3 host runs the v3 entry
    (moby ``hostPlatformSpec``, ``platforms.Only``): it is judged beside the plain
    linux/amd64 one, and its failure fails the image."""
    v3 = {**AMD64, "variant": "v3"}
    tag, (plain, newer) = _import_index(engine, tmp_path, [(AMD64, LAYERED), (v3, MISLABELED)])
    code, doc = run_check(cli, f"docker-daemon:{tag}", "--platform", "linux/amd64")
    judged = [(p["platform"], p["digest"], p["verdict"]) for p in doc["platforms"]]  # type: ignore[attr-defined]
    assert code == 1 and judged == [
        ("linux/amd64", plain, "pass"),
        ("linux/amd64/v3", newer, "fail"),
    ], judged


def test_where_no_manifest_is_the_nodes_docker_falls_back(
    engine: StandinEngine, cli: CliRunner, tmp_path: Path
) -> None:
    """An index [linux/amd64, linux/arm/v6]: no arm/v7 manifest, so ``docker run``
    on an arm/v7 node runs the arm/v6 one (``platforms.Only(host)``'s order, moby
    ``matchRequestedOrDefault``); it is judged for ``--platform linux/arm/v7`` (this
    was exit 2), and an arm/v5 node, which runs neither, is still refused."""
    arm_v6 = {"os": "linux", "architecture": "arm", "variant": "v6"}
    v6_image = Image(layers=MISLABELED.layers, labels=MISLABELED.labels, platform=arm_v6)
    tag, (_, v6) = _import_index(engine, tmp_path, [(AMD64, LAYERED), (arm_v6, v6_image)])
    code, doc = run_check(cli, f"docker-daemon:{tag}", "--platform", "linux/arm/v7")
    assert code == 1 and doc["digest"] == v6, doc
    refused = cli("check", f"docker-daemon:{tag}", "--platform", "linux/arm/v5")
    assert refused.code == 2 and "does not run it natively" in refused.err, refused.err
    assert engine.saves == 0
