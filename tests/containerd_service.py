"""A real containerd for the tests: the machine's ``containerd`` binary (Debian's
package, the one docker.io depends on) with its own config, root, state and socket
under a temporary folder, driven by its own ``ctr``.

The CRI plugin is disabled (it needs CNI and would start image-pull machinery the
tests do not use); the content and metadata plugins, which ``containerd:`` reads,
are the ones every containerd loads.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.services import Registry, _wait


@dataclass(frozen=True)
class Containerd:
    root: Path
    address: str

    def ctr(self, *args: str, namespace: str = "k8s.io") -> str:
        done = subprocess.run(
            ["ctr", "-a", self.address, "-n", namespace, *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)[:200]}: {done.stderr.strip()[-400:]}")
        return done.stdout

    def cri_pull(self, image: str) -> str:
        """What the kubelet asks for: the CRI ``ImageService/PullImage`` of ``image``
        (fetched and unpacked by containerd's pull unpacker), a gRPC call made with
        curl over HTTP/2 (the request hand-encoded: ``PullImageRequest{image:
        ImageSpec{image}}``, k8s.io/cri-api api.proto). Returns "" where it pulled,
        else containerd's message; needs the CRI plugin (:func:`cri_containerd`)."""
        spec = _field(1, _field(1, image.encode()))
        done = subprocess.run(
            [
                "curl", "-sS", "-v", "--http2-prior-knowledge", "--unix-socket", self.address,
                "-X", "POST", "http://localhost/runtime.v1.ImageService/PullImage",
                "-H", "content-type: application/grpc", "-H", "te: trailers",
                "--data-binary", "@-", "-o", "/dev/null",
            ],
            input=b"\0" + len(spec).to_bytes(4, "big") + spec,
            capture_output=True,
            check=False,
            timeout=300,
        )  # fmt: skip
        said = dict(
            line[2:].split(": ", 1)
            for line in done.stderr.decode(errors="replace").splitlines()
            if line.startswith("< grpc-") and ": " in line
        )
        if "grpc-status" not in said:
            raise AssertionError(f"no gRPC answer from containerd: {done.stderr[-400:]!r}")
        return "" if said["grpc-status"] == "0" else said.get("grpc-message", "?")

    def files(self, chain_id: str) -> set[str]:
        """The regular files and symlinks of the committed snapshot ``chain_id``: an
        unpacked one-layer image, read in the folder a read-only view of it binds
        (``ctr snapshots view --mounts``; the view is removed, or collected already)."""
        key = f"bm-view-{os.getpid()}"
        mounts = json.loads(self.ctr("snapshots", "view", "--mounts", key, chain_id))
        try:
            (mount,) = mounts
            assert mount["Type"] == "bind", mounts  # one layer: its own folder
            folder = Path(mount["Source"])
            return {
                str(p.relative_to(folder))
                for p in folder.rglob("*")
                if p.is_symlink() or p.is_file()
            }
        finally:
            with contextlib.suppress(AssertionError):  # no lease holds a view: GC may
                self.ctr("snapshots", "rm", key)

    def env(self, namespace: str = "k8s.io") -> dict[str, str]:
        return {
            "CONTAINERD_ROOT": str(self.root),
            "CONTAINERD_ADDRESS": self.address,
            "CONTAINERD_NAMESPACE": namespace,
        }


def _field(number: int, data: bytes) -> bytes:
    """A protobuf length-delimited field (wire type 2)."""
    size, length = bytearray(), len(data)
    while length >= 0x80:
        size.append(length & 0x7F | 0x80)
        length >>= 7
    size.append(length)
    return bytes([number << 3 | 2]) + bytes(size) + data


def _config(base: Path, mirror: str | None = None) -> Path:
    """The config; with ``mirror`` (a plain-HTTP registry's host:port) the CRI plugin
    runs too, pulling from that registry over HTTP (its ``registry.mirrors``)."""
    cri = (
        f'[plugins."io.containerd.grpc.v1.cri".registry.mirrors."{mirror}"]\n'
        f'  endpoint = ["http://{mirror}"]\n'
        if mirror
        else ""
    )
    config = base / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{base}/root"\n'
        f'state = "{base}/state"\n'
        + ("" if mirror else 'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n')
        + f'[grpc]\n  address = "{base}/c.sock"\n'
        f'[ttrpc]\n  address = "{base}/c.sock.ttrpc"\n'
        '[debug]\n  address = ""\n'
        '[metrics]\n  address = ""\n' + cri
    )
    return config


def start_containerd(
    base: Path, mirror: str | None = None
) -> tuple[subprocess.Popen[bytes], Containerd]:
    """containerd with its config, root, state and socket under ``base`` (keep the
    path short: a unix socket's path is limited to 107 bytes); RuntimeError with
    the end of its log where it does not come up."""
    binary = shutil.which("containerd")
    if binary is None or shutil.which("ctr") is None:
        raise FileNotFoundError("containerd is not installed (Debian package containerd)")
    base.chmod(0o755)  # as /var/lib: only containerd's own root folder (0700) is closed
    log = (base / "containerd.log").open("wb")
    proc = subprocess.Popen(
        [binary, "--config", str(_config(base, mirror))], stdout=log, stderr=subprocess.STDOUT
    )
    log.close()
    service = Containerd(root=base / "root", address=str(base / "c.sock"))

    def up() -> bool:
        return (
            proc.poll() is None
            and subprocess.run(
                ["ctr", "-a", service.address, "version"],
                check=False,
                capture_output=True,
                timeout=10,
            ).returncode
            == 0
        )

    try:
        _wait(up, "containerd")
    except RuntimeError as exc:
        stop_containerd(proc)
        tail = (base / "containerd.log").read_text(errors="replace")[-400:]
        raise RuntimeError(f"{exc}: {tail}") from None
    return proc, service


def stop_containerd(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def containerd() -> Iterator[Containerd]:
    """containerd started for the session (skips with the reason where it cannot)."""
    if os.geteuid() != 0:
        pytest.skip("containerd needs root to start")
    base = Path(tempfile.mkdtemp(prefix="bm-ctd-", dir="/tmp"))
    try:
        proc, service = start_containerd(base)
    except (FileNotFoundError, RuntimeError) as exc:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"containerd does not start here ({exc})")
    try:
        yield service
    finally:
        stop_containerd(proc)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def cri_containerd(registry: Registry) -> Iterator[Containerd]:
    """containerd with its CRI plugin, pulling from the session's registry as a
    kubelet's pull does (:meth:`Containerd.cri_pull`)."""
    if os.geteuid() != 0 or shutil.which("curl") is None:
        pytest.skip("a CRI pull needs root (containerd) and curl")
    base = Path(tempfile.mkdtemp(prefix="bm-cri-", dir="/tmp"))
    try:
        proc, service = start_containerd(base, mirror=registry.host)
    except (FileNotFoundError, RuntimeError) as exc:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"containerd does not start here ({exc})")
    try:
        yield service
    finally:
        stop_containerd(proc)
        shutil.rmtree(base, ignore_errors=True)
