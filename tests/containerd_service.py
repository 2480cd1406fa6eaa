"""A real containerd for the tests: the machine's ``containerd`` binary (Debian's
package, the one docker.io depends on) with its own config, root, state and socket
under a temporary folder, driven by its own ``ctr``.

The CRI plugin is disabled (it needs CNI and would start image-pull machinery the
tests do not use); the content and metadata plugins, which ``containerd:`` reads,
are the ones every containerd loads.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.services import _wait


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

    def env(self, namespace: str = "k8s.io") -> dict[str, str]:
        return {
            "CONTAINERD_ROOT": str(self.root),
            "CONTAINERD_ADDRESS": self.address,
            "CONTAINERD_NAMESPACE": namespace,
        }


def _config(base: Path) -> Path:
    config = base / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{base}/root"\n'
        f'state = "{base}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{base}/c.sock"\n'
        f'[ttrpc]\n  address = "{base}/c.sock.ttrpc"\n'
        '[debug]\n  address = ""\n'
        '[metrics]\n  address = ""\n'
    )
    return config


def start_containerd(base: Path) -> tuple[subprocess.Popen[bytes], Containerd]:
    """containerd with its config, root, state and socket under ``base`` (keep the
    path short: a unix socket's path is limited to 107 bytes); RuntimeError with
    the end of its log where it does not come up."""
    binary = shutil.which("containerd")
    if binary is None or shutil.which("ctr") is None:
        raise FileNotFoundError("containerd is not installed (Debian package containerd)")
    base.chmod(0o755)  # as /var/lib: only containerd's own root folder (0700) is closed
    log = (base / "containerd.log").open("wb")
    proc = subprocess.Popen(
        [binary, "--config", str(_config(base))], stdout=log, stderr=subprocess.STDOUT
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
