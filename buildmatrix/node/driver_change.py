"""``smoke --driver-file FILE``: the driver this container's NVIDIA libraries belong to.

The NVIDIA container runtime puts the driver's libraries (``libnvidia-ml.so.<version>``,
``libcuda.so.<version>``) into a container when it creates it, and only then
(nvidia-container-toolkit ``internal/oci/runtime_modifier.go``,
``modifyingRuntimeWrapper.Exec``: the spec is modified on ``create``). After a driver
upgrade (the GPU Operator's driver DaemonSet, or a host driver reloaded without a
reboot) the admission agent's container keeps the old ones: NVML answers
``NVML_ERROR_LIB_RM_VERSION_MISMATCH`` to every round, and the GPU Operator's upgrade
controller restarts only Pods that request ``nvidia.com/gpu*``/``nvidia.com/mig-*``
or hold a DRA claim (gpu-operator ``cmd/gpu-operator/main.go``, ``gpuPodSpecFilter``),
which the agent does not. So the agent restarts itself: the first round that reads
the driver writes its version to FILE; a round that finds another version, or the
mismatch, marks the node failed and writes ``changed`` to FILE, and the DaemonSet's
loop then ends its container, which the kubelet starts anew with the new driver's
libraries (k8s_daemonset.py). The loop removes FILE when its container starts.
"""

from __future__ import annotations

from pathlib import Path

from buildmatrix.errors import InputError
from buildmatrix.node.results import NodeCheck

CHANGED = "changed"
CHECK = "driver-change"


def recorded(path: Path) -> str | None:
    """The driver version FILE holds (None: no round has read one yet)."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"--driver-file {path}: cannot read: {exc.strerror}.") from None
    return text.splitlines()[0] if text else None


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--driver-file {path}: cannot write: {exc.strerror}.") from None


def changed(path: Path, why: str) -> NodeCheck:
    """The driver changed under this container: FILE says so (the loop ends the
    container), and the round fails with ``why``."""
    _write(path, f"{CHANGED} {why}")
    return NodeCheck(
        name=CHECK,
        ok=False,
        message=f"{why}: this container's NVIDIA libraries are the old driver's; it "
        "ends so that the kubelet starts it with the new driver's libraries, and the "
        "node is checked again then",
    )


def compare(path: Path, driver: str) -> NodeCheck | None:
    """The round read ``driver``: recorded where FILE holds none yet; a failed check
    (:func:`changed`) where FILE holds another version; else None."""
    seen = recorded(path)
    if seen is None:
        _write(path, driver)
        return None
    if seen.startswith(CHANGED):
        return changed(path, seen.removeprefix(CHANGED).strip())
    if seen != driver:
        return changed(path, f"the node's driver changed from {seen} to {driver}")
    return None


MISMATCH = (
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH: the kernel driver is not the version of this "
    "container's libnvidia-ml (the node's driver was upgraded or reloaded)"
)
