"""Real services for the integration tests: a Docker engine and OCI registries.

Each fixture uses what is there (``BUILDMATRIX_TEST_DOCKER_HOST``, else a running
engine on ``DOCKER_HOST``) or starts its own from the installed binaries
(``dockerd`` with the vfs driver, ``docker-registry``) in a temporary folder on
loopback, and stops it afterwards. Where the binaries are missing the tests that
need them skip and say why.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


@contextmanager
def serve_registry(root: Path, extra: str = "") -> Iterator[str]:
    """A registry for the duration of a fixture (skips where none is installed)."""
    if shutil.which("docker-registry") is None:
        pytest.skip("no registry: install docker-registry (Debian package)")
    proc, host = start_registry(root, extra)
    try:
        yield host
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections for as long as the block runs.

    The socket is bound and never listens: Linux answers a SYN to it with a reset
    (net/ipv4/tcp_ipv4.c, ``tcp_v4_rcv``: no listening socket, ``tcp_v4_send_reset``),
    so a client sees "connection refused", and no other process, test worker
    included, can take the port while it is held (unlike a port from ``free_port``,
    which is free again once returned)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def _wait(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # any failure means "not up yet"
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not come up within {timeout:.0f} s")


def _engine_answers(host: str) -> bool:
    import docker

    try:
        docker.DockerClient(base_url=host, timeout=5).ping()
    except docker.errors.DockerException:
        return False
    return True


def start_dockerd(
    root: Path, *extra: str, storage_driver: str = "vfs"
) -> tuple[subprocess.Popen[bytes], str]:
    """Start dockerd (vfs driver unless told, no networking setup) with its state under
    ``root``; returns the process and its ``unix://`` address once it answers."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise FileNotFoundError("dockerd is not installed (Debian package docker.io)")
    host = f"unix://{root}/docker.sock"
    log = (root / "dockerd.log").open("ab")
    proc = subprocess.Popen(
        [
            dockerd,
            f"--storage-driver={storage_driver}",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            f"--host={host}",
            f"--data-root={root}/data",
            f"--exec-root={root}/exec",
            f"--pidfile={root}/docker.pid",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        _wait(lambda: _engine_answers(host), "dockerd")
    except RuntimeError:
        proc.terminate()
        raise
    return proc, host


def engine_export(host: str, archive: Path, tag: str) -> bytes | str:
    """What the engine unpacks from the docker save ``archive`` tagged ``tag``: it is
    loaded (``docker load``) and a container's filesystem exported as ``docker export``
    writes it (a tar), then the container and the image are removed; or, where
    ``docker load`` refuses the archive, its message."""
    docker = ["docker", "-H", host]
    loaded = subprocess.run(
        [*docker, "load", "-i", str(archive)], capture_output=True, text=True, check=False
    )
    if loaded.returncode:
        return loaded.stderr.strip()
    try:
        cid = subprocess.run(
            [*docker, "create", tag, "x"], capture_output=True, text=True, check=True
        ).stdout.strip()
        exported = subprocess.run([*docker, "export", cid], capture_output=True, check=True)
        subprocess.run([*docker, "rm", cid], capture_output=True, check=True)
    finally:
        subprocess.run([*docker, "rmi", "-f", tag], capture_output=True, check=False)
    return exported.stdout


def stop_dockerd(proc: subprocess.Popen[bytes], root: Path) -> None:
    """Stop an engine started by :func:`start_dockerd` and unmount the network
    namespace it leaves under its exec root (else the folder cannot be removed)."""
    proc.terminate()
    proc.wait(timeout=30)
    netns = root / "exec" / "netns" / "default"
    if os.path.ismount(netns):
        subprocess.run(["umount", str(netns)], check=False, capture_output=True)


@pytest.fixture(scope="session")
def docker_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Docker engine's address: an existing one, or one started here."""
    for candidate in (
        os.environ.get("BUILDMATRIX_TEST_DOCKER_HOST"),
        os.environ.get("DOCKER_HOST"),
    ):
        if candidate and _engine_answers(candidate):
            yield candidate
            return
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.skip(
            "no Docker engine: install docker.io (dockerd) and run as root, "
            "or set BUILDMATRIX_TEST_DOCKER_HOST"
        )
    root = tmp_path_factory.mktemp("dockerd")
    proc, host = start_dockerd(root)
    try:
        yield host
    finally:
        stop_dockerd(proc, root)


@pytest.fixture(scope="session")
def overlay2_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second engine with the overlay2 driver: the oracle for layer semantics."""
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.skip("no Docker engine: install docker.io (dockerd) and run as root")
    root = tmp_path_factory.mktemp("overlay2")
    try:
        proc, host = start_dockerd(root, storage_driver="overlay2")
    except RuntimeError as exc:
        pytest.skip(f"dockerd with the overlay2 driver does not start here ({exc})")
    try:
        yield host
    finally:
        stop_dockerd(proc, root)


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:PORT
    user: str = ""
    password: str = ""

    def docker_config(self, folder: Path, *, password: str | None = None) -> Path:
        """A Docker config folder holding credentials for this registry."""
        folder.mkdir(parents=True, exist_ok=True)
        secret = base64.b64encode(f"{self.user}:{password or self.password}".encode()).decode()
        (folder / "config.json").write_text(json.dumps({"auths": {self.host: {"auth": secret}}}))
        return folder


def start_registry(root: Path, extra: str = "") -> tuple[subprocess.Popen[bytes], str]:
    """Start docker-registry on a free loopback port with its storage under ``root``;
    ``extra`` is appended to its YAML config (auth). Returns the process and host:port.

    Safe beside other test processes (pytest-xdist workers, other checkouts): the port
    is the kernel's pick, and the registry counts as up only once the answer on that
    port carries this instance's own response header (the registry adds its
    ``http.headers`` to every response before it checks authorization, so 401s carry
    them too: distribution's registry/handlers/app.go, ``App.dispatcher``). A registry
    that lost its port to another process exits, and is started again on a new one."""
    binary = shutil.which("docker-registry")
    if binary is None:
        raise FileNotFoundError("docker-registry is not installed (Debian package)")
    for _attempt in range(3):
        proc, host = _registry_once(binary, root, extra)
        if proc.poll() is None:
            return proc, host
    raise RuntimeError(f"docker-registry did not start; see {root}/registry.log")


def _registry_once(binary: str, root: Path, extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    instance = secrets.token_hex(8)
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root}/data\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  headers:\n    {_INSTANCE}: [{instance}]\n{extra}"
    )
    log = (root / "registry.log").open("ab")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    host = f"127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            return True  # exited (port taken): the caller starts another
        return _answering_instance(host) == instance

    try:
        _wait(up, "docker-registry")
    except RuntimeError:
        proc.terminate()
        proc.wait(timeout=30)
        raise
    return proc, host


_INSTANCE = "X-Buildmatrix-Test-Instance"


def _answering_instance(host: str) -> str | None:
    """The instance header of whatever answers ``GET /v2/`` on ``host``."""
    try:
        with urllib.request.urlopen(f"http://{host}/v2/", timeout=2) as response:
            return response.headers.get(_INSTANCE)  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:  # 401 from a registry with auth
        return exc.headers.get(_INSTANCE)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A plain-HTTP registry on loopback, anonymous access."""
    with serve_registry(tmp_path_factory.mktemp("registry")) as host:
        yield Registry(host)


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry that demands basic auth (htpasswd, bcrypt) for everything."""
    bcrypt = pytest.importorskip("bcrypt")
    root = tmp_path_factory.mktemp("auth-registry")
    user, password = "ci", "s3cret-pass"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    (root / "htpasswd").write_text(f"{user}:{hashed}\n")
    extra = f"auth:\n  htpasswd:\n    realm: buildmatrix-test\n    path: {root}/htpasswd\n"
    with serve_registry(root, extra) as host:
        yield Registry(host, user, password)


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry with bearer-token auth; tokens come from tests/token_server.py."""
    pytest.importorskip("cryptography")
    from tests.token_server import ISSUER, SERVICE, token_server

    root = tmp_path_factory.mktemp("token-registry")
    user, password = "ci-token", "t0ken-pass"
    with token_server(root, user, password) as (realm, issuer):
        extra = (
            f"auth:\n  token:\n    realm: {realm}\n    service: {SERVICE}\n"
            f"    issuer: {ISSUER}\n    rootcertbundle: {issuer.bundle}\n"
        )
        with serve_registry(root, extra) as host:
            yield Registry(host, user, password)


@pytest.fixture(scope="session")
def containerd_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A containerd of its own (the machine's binary, the CRI plugin off), its state
    under a temporary folder: the oracle for what containerd pulls. Returns the
    socket path for ``ctr -a``."""
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        pytest.skip("no containerd: install containerd (a dependency of docker.io)")
    if os.geteuid() != 0:
        pytest.skip("containerd needs root")
    root = tmp_path_factory.mktemp("containerd")
    socket_path = f"{root}/containerd.sock"
    (root / "config.toml").write_text(
        f'version = 2\nroot = "{root}/root"\nstate = "{root}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{socket_path}"\n[ttrpc]\n  address = "{socket_path}.ttrpc"\n'
    )
    log = (root / "containerd.log").open("wb")
    proc = subprocess.Popen(
        ["containerd", "--config", str(root / "config.toml")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()

    def up() -> bool:
        r = subprocess.run(["ctr", "-a", socket_path, "version"], capture_output=True, check=False)
        return r.returncode == 0

    try:
        _wait(up, "containerd")
        yield socket_path
    finally:
        proc.terminate()
        proc.wait(timeout=30)
