"""Day 2, a hardened container toolkit (``k8s manifests --device-request``).

NVIDIA's hardening guidance sets the toolkit's
``accept-nvidia-visible-devices-envvar-when-unprivileged = false``: an unprivileged
container's ``NVIDIA_VISIBLE_DEVICES`` is then ignored, the agent's container gets no
driver, NVML is missing and no node is ever admitted. What the toolkit accepts then:
a ``/dev/null`` mount under ``/var/run/nvidia-container-devices`` (with
``accept-nvidia-visible-devices-as-volume-mounts = true``) or, in CDI mode, a CDI
device named in an annotation under ``cdi.k8s.io/``.

:func:`visible_devices` is a STAND-IN for the toolkit's own decision (no container
runtime with the toolkit can run here), restated from nvidia-container-toolkit
``internal/config/image/cuda_image.go`` (``CUDA.VisibleDevices``,
``cdiDeviceRequestsFromAnnotations``, ``requestsFromMounts``, ``visibleDevicesFromEnvVar``)
and ``internal/runtime/runtime_factory.go`` (``initRuntimeModeAndImage``: outside CDI
mode the annotation prefixes are cleared); the defaults are ``api/config/v1/toml.go``'s
(envvar accepted, mounts not). The rendered Pod becomes the OCI spec the runtime sees
as the kubelet and containerd make it: a hostPath volume a mount whose source is the
host path, ``env`` the process environment, the Pod's annotations the spec's (containerd
passes the ones its runtime's ``pod_annotations`` allow; the toolkit's installer adds
``cdi.k8s.io/*``: nvidia-container-toolkit CHANGELOG).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tests.conftest import CliRunner

ROOT = "/var/run/nvidia-container-devices"  # DeviceListAsVolumeMountsRoot
CDI_PREFIXES = ("cdi.k8s.io/",)  # the runtime's default annotation-prefixes


@dataclass(frozen=True)
class Toolkit:
    envvar_unprivileged: bool = True  # accept-nvidia-visible-devices-envvar-when-unprivileged
    volume_mounts: bool = False  # accept-nvidia-visible-devices-as-volume-mounts
    cdi_mode: bool = False  # nvidia-container-runtime.mode = "cdi"


DEFAULT = Toolkit()
HARDENED = Toolkit(envvar_unprivileged=False, volume_mounts=True)
HARDENED_CDI = Toolkit(envvar_unprivileged=False, cdi_mode=True)


def visible_devices(
    toolkit: Toolkit,
    *,
    env: dict[str, str],
    mounts: list[tuple[str, str]],
    annotations: dict[str, str],
    privileged: bool = False,
) -> list[str]:
    """CUDA.VisibleDevices of a container (``mounts``: (source, destination))."""
    prefixes = CDI_PREFIXES if toolkit.cdi_mode else ()
    from_annotations = [
        device
        for key in sorted(annotations)
        if any(key.startswith(p) for p in prefixes)
        for device in annotations[key].split(",")
    ]
    if from_annotations:
        return from_annotations
    if toolkit.volume_mounts:
        seen: set[str] = set()
        from_mounts = []
        for source, destination in mounts:
            if source != "/dev/null" or destination in seen:
                continue
            seen.add(destination)
            if destination.startswith(ROOT):
                device = destination.removeprefix(ROOT).strip("/")
                if device:
                    from_mounts.append(device)
        if from_mounts:
            return from_mounts
    value = env.get("NVIDIA_VISIBLE_DEVICES")
    from_env = [] if value in (None, "", "void") else value.split(",")
    if not from_env:
        return []
    return from_env if privileged or toolkit.envvar_unprivileged else []


def _container(cli: CliRunner, request: str) -> dict[str, Any]:
    r = cli("k8s", "manifests", "--device-request", request)
    assert r.code == 0, r.err
    (ds,) = [d for d in yaml.safe_load_all(r.out) if d["kind"] == "DaemonSet"]
    template = ds["spec"]["template"]
    pod = template["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = [
        (volumes[m["name"]]["hostPath"]["path"], m["mountPath"])
        for m in container["volumeMounts"]
        if "hostPath" in volumes[m["name"]]
    ]
    return {
        "env": {e["name"]: e["value"] for e in container["env"] if "value" in e},
        "mounts": mounts,
        "annotations": template["metadata"].get("annotations", {}),
        "privileged": bool(container["securityContext"].get("privileged")),
    }


# (request, toolkit) -> the devices the toolkit gives the agent's container
EXPECTED = {
    ("envvar", DEFAULT): ["all"],
    ("envvar", HARDENED): [],  # the bug: the request is ignored, NVML is missing
    ("envvar", HARDENED_CDI): [],
    ("volume-mounts", DEFAULT): ["all"],  # mounts not accepted: the variable still is
    ("volume-mounts", HARDENED): ["all"],
    ("volume-mounts", HARDENED_CDI): [],
    ("cdi-annotation", DEFAULT): ["all"],  # legacy mode: no annotations, the variable
    ("cdi-annotation", HARDENED): [],
    ("cdi-annotation", HARDENED_CDI): ["nvidia.com/gpu=all"],
}


@pytest.mark.parametrize(("request_", "toolkit"), list(EXPECTED), ids=str)
def test_what_the_toolkit_gives_the_agent(cli: CliRunner, request_: str, toolkit: Toolkit) -> None:
    found = visible_devices(toolkit, **_container(cli, request_))
    assert found == EXPECTED[request_, toolkit]


def test_every_toolkit_has_a_request_it_accepts(cli: CliRunner) -> None:
    for toolkit in (DEFAULT, HARDENED, HARDENED_CDI):
        works = [
            r
            for r in ("envvar", "volume-mounts", "cdi-annotation")
            if visible_devices(toolkit, **_container(cli, r))
        ]
        assert works, toolkit
    assert not _container(cli, "envvar")["privileged"]  # no privilege to get around it


# nvidia-container-toolkit internal/config/image/cuda_image_test.go: the cases of
# TestGetVisibleDevicesFromMounts (mounts alone, accepted) and TestVisibleDevices (mounts
# GPU0,GPU1 and NVIDIA_VISIBLE_DEVICES=GPU2,GPU3 or GPU0,GPU1) that the stand-in covers.
_TWO = [("/dev/null", f"{ROOT}/GPU0"), ("/dev/null", f"{ROOT}/GPU1")]
UPSTREAM_MOUNTS = [
    ([("/not/dev/null", f"{ROOT}/GPU0")], []),
    ([("/dev/null", "/other/prefix/GPU0")], []),
    ([("/dev/null", ROOT)], []),
    (_TWO, ["GPU0", "GPU1"]),
    (
        [("/dev/null", f"{ROOT}/GPU0-MIG0/0/1"), ("/dev/null", f"{ROOT}/GPU1-MIG0/0/1")],
        ["GPU0-MIG0/0/1", "GPU1-MIG0/0/1"],
    ),
]
UPSTREAM_VISIBLE = [  # mounts, variable, privileged, accept unprivileged, accept mounts
    (_TWO, "GPU2,GPU3", False, False, True, ["GPU0", "GPU1"]),
    ([], "GPU0,GPU1", False, False, True, []),
    ([], "GPU0,GPU1", True, False, True, ["GPU0", "GPU1"]),
    ([], "GPU0,GPU1", False, True, True, ["GPU0", "GPU1"]),
    (_TWO, "GPU2,GPU3", False, True, False, ["GPU2", "GPU3"]),
    (_TWO, "GPU2,GPU3", False, False, False, []),
]


@pytest.mark.parametrize(("mounts", "expected"), UPSTREAM_MOUNTS)
def test_the_stand_in_reads_mounts_as_the_toolkit(
    mounts: list[tuple[str, str]], expected: list[str]
) -> None:
    toolkit = Toolkit(envvar_unprivileged=True, volume_mounts=True)
    assert visible_devices(toolkit, env={}, mounts=mounts, annotations={}) == expected


@pytest.mark.parametrize(
    ("mounts", "variable", "privileged", "unprivileged", "accept_mounts", "expected"),
    UPSTREAM_VISIBLE,
)
def test_the_stand_in_decides_as_the_toolkit(
    mounts: list[tuple[str, str]],
    variable: str,
    privileged: bool,
    unprivileged: bool,
    accept_mounts: bool,
    expected: list[str],
) -> None:
    toolkit = Toolkit(envvar_unprivileged=unprivileged, volume_mounts=accept_mounts)
    env = {"NVIDIA_VISIBLE_DEVICES": variable}
    found = visible_devices(toolkit, env=env, mounts=mounts, annotations={}, privileged=privileged)
    assert found == expected


@pytest.mark.parametrize("request_", ["volume-mounts", "cdi-annotation"])
def test_the_requests_validate(cli: CliRunner, request_: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    r = cli("k8s", "manifests", "--device-request", request_)
    assert r.code == 0, r.err
    for doc in yaml.safe_load_all(r.out):
        kubernetes_validate.validate(doc, "1.34", strict=True)
