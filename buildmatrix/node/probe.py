"""Read the node's GPUs with NVML (``nvidia-ml-py``): the only NVML I/O in buildmatrix.

The probe only reads and records. It returns a snapshot document (the format
``smoke --record`` writes), so a live node and a recorded one are judged by the same
code. Every NVML error is data: NOT_SUPPORTED becomes ``null`` in the field (normal
for ECC on GPUs without ECC, remapped rows before Ampere or with MIG on, MIG mode on
GPUs without MIG), any other error an entry of ``errors``. Only a missing library or
driver, when nothing can be read at all, raises :class:`EnvironmentUnavailable`.

Calls and their meaning: NVML API reference (docs.nvidia.com/deploy/nvml-api),
"Device Queries" and "System Queries".
"""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from buildmatrix.errors import EnvironmentUnavailable
from buildmatrix.node import mig, pci


class DriverMismatch(EnvironmentUnavailable):
    """``nvmlInit`` answered NVML_ERROR_LIB_RM_VERSION_MISMATCH (18 in nvidia-ml-py's
    ``pynvml.py``): the libnvidia-ml this process loaded is not the loaded kernel
    module's version. In a container it means the node's driver changed after the
    container was created: the NVIDIA container runtime edits a container's spec
    (the driver's libraries among its mounts) only on ``create``
    (nvidia-container-toolkit ``internal/oci/runtime_modifier.go``,
    ``modifyingRuntimeWrapper.Exec``), so only a new container gets the new ones
    (node/driver_change.py)."""


class _Unsupported:
    """NVML answered NOT_SUPPORTED for this field."""


UNSUPPORTED = _Unsupported()


def error_name(nvml: Any, exc: BaseException) -> str:
    """``NVML_ERROR_GPU_IS_LOST`` for an NVMLError (the constant's name, not its text)."""
    value = getattr(exc, "value", None)
    for name in dir(nvml):
        if name.startswith("NVML_ERROR_") and getattr(nvml, name) == value:
            return name
    return f"NVML_ERROR_{value}"


def cuda_version_text(value: int) -> str:
    """``nvmlSystemGetCudaDriverVersion`` 12020 -> ``12.2`` (major v/1000, minor v%1000/10)."""
    return f"{value // 1000}.{value % 1000 // 10}"


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class _Reader:
    """Calls NVML, turning each failure into data."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.errors: list[dict[str, Any]] = []

    def call(
        self,
        name: str,
        fn: Callable[[], Any],
        index: int | None = None,
        *,
        skip: tuple[str, ...] = (),
    ) -> Any:
        """The call's value, UNSUPPORTED, or None after recording the error (or
        without recording it, for an error in ``skip``: an answer, not a fault)."""
        try:
            return fn()
        except self.nvml.NVMLError as exc:
            code = error_name(self.nvml, exc)
            if code == "NVML_ERROR_NOT_SUPPORTED":
                return UNSUPPORTED
            if code in skip:
                return None
            entry: dict[str, Any] = {"call": name, "error": code}
            if index is not None:
                entry["index"] = index
            self.errors.append(entry)
            return None


def _put(gpu: dict[str, Any], key: str, value: Any, convert: Callable[[Any], Any]) -> None:
    """Store a field: converted, ``null`` when unsupported, left out after an error."""
    if value is UNSUPPORTED:
        gpu[key] = None
    elif value is not None:
        gpu[key] = convert(value)


def _gpu(r: _Reader, i: int) -> dict[str, Any] | None:
    n = r.nvml
    handle = r.call("nvmlDeviceGetHandleByIndex", lambda: n.nvmlDeviceGetHandleByIndex(i), i)
    if handle is None or handle is UNSUPPORTED:
        return None
    name = r.call("nvmlDeviceGetName", lambda: n.nvmlDeviceGetName(handle), i)
    cc = r.call(
        "nvmlDeviceGetCudaComputeCapability",
        lambda: n.nvmlDeviceGetCudaComputeCapability(handle),
        i,
    )
    if name in (None, UNSUPPORTED) or cc in (None, UNSUPPORTED):
        return None  # the error is recorded; a GPU without name or CC cannot be judged
    gpu: dict[str, Any] = {"index": i, "name": _text(name)}
    _put(gpu, "uuid", r.call("nvmlDeviceGetUUID", lambda: n.nvmlDeviceGetUUID(handle), i), _text)
    pci = r.call("nvmlDeviceGetPciInfo", lambda: n.nvmlDeviceGetPciInfo(handle), i)
    _put(gpu, "pci_bus_id", pci, lambda p: _text(p.busId))
    gpu["compute_capability"] = f"{cc[0]}.{cc[1]}"
    # In MIG mode this aggregate query answers NO_PERMISSION unless the caller may
    # monitor MIG (nvml.h, nvmlDeviceGetMemoryInfo: "In MIG mode, if device handle is
    # provided, the API returns aggregate information, only if the caller has
    # appropriate privileges"): the error is recorded, and check_nvml says what grants it.
    memory = r.call("nvmlDeviceGetMemoryInfo", lambda: n.nvmlDeviceGetMemoryInfo(handle), i)
    total = int(memory.total) if memory is not None and memory is not UNSUPPORTED else 0
    if total:
        gpu["memory_total_mib"] = total // (1 << 20)  # as GFD: total / 1 MiB
    mig_mode = r.call("nvmlDeviceGetMigMode", lambda: n.nvmlDeviceGetMigMode(handle), i)
    _put(gpu, "mig_mode", mig_mode, lambda m: bool(m[0]))
    _put(gpu, "mig_mode_pending", mig_mode, lambda m: bool(m[1]))
    if gpu.get("mig_mode"):
        gpu["mig_devices"] = _mig_devices(r, i, handle, total)
    _put_memory_health(r, i, handle, gpu)
    persistence = r.call(
        "nvmlDeviceGetPersistenceMode", lambda: n.nvmlDeviceGetPersistenceMode(handle), i
    )
    _put(gpu, "persistence_mode", persistence, bool)
    brand = r.call("nvmlDeviceGetBrand", lambda: n.nvmlDeviceGetBrand(handle), i)
    _put(gpu, "brand", brand, int)
    _put_compute_use(r, i, handle, gpu)
    return gpu


# nvmlComputeMode_t (nvml.h; NVML_COMPUTEMODE_* in nvidia-ml-py): 0 DEFAULT,
# 1 EXCLUSIVE_THREAD (deprecated), 2 PROHIBITED, 3 EXCLUSIVE_PROCESS
COMPUTE_MODES = ("default", "exclusive_thread", "prohibited", "exclusive_process")


def _put_compute_use(r: _Reader, i: int, handle: Any, gpu: dict[str, Any]) -> None:
    """Who else computes on the GPU: its compute mode (nvmlDeviceGetComputeMode) and the
    processes holding a CUDA context there (nvmlDeviceGetComputeRunningProcesses). What
    tells a GPU busy with others' work from a broken one when the load test cannot
    make a context (node/loadtest.py). Recorded only where NVML answers them;
    NO_PERMISSION is an answer here, not a fault: neither call is a health check."""
    n = r.nvml
    quiet = ("NVML_ERROR_NO_PERMISSION",)
    mode = r.call(
        "nvmlDeviceGetComputeMode", lambda: n.nvmlDeviceGetComputeMode(handle), i, skip=quiet
    )
    if isinstance(mode, int) and 0 <= mode < len(COMPUTE_MODES):
        gpu["compute_mode"] = COMPUTE_MODES[mode]
    processes = r.call(
        "nvmlDeviceGetComputeRunningProcesses",
        lambda: n.nvmlDeviceGetComputeRunningProcesses(handle),
        i,
        skip=quiet,
    )
    if isinstance(processes, list):  # left out where NVML does not say
        gpu["compute_processes"] = len(processes)


def _put_memory_health(r: _Reader, i: int, handle: Any, gpu: dict[str, Any]) -> None:
    """The GPU memory's health: uncorrected ECC errors since the driver loaded, retired
    pages pending, remapped rows (each null where NVML says NOT_SUPPORTED)."""
    n = r.nvml
    ecc = r.call(
        "nvmlDeviceGetTotalEccErrors",
        lambda: n.nvmlDeviceGetTotalEccErrors(
            handle, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC
        ),
        i,
    )
    _put(gpu, "ecc_uncorrected_volatile", ecc, int)
    retired = r.call(
        "nvmlDeviceGetRetiredPagesPendingStatus",
        lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(handle),
        i,
    )
    _put(gpu, "retired_pages_pending", retired, bool)
    rows = r.call("nvmlDeviceGetRemappedRows", lambda: n.nvmlDeviceGetRemappedRows(handle), i)
    _put(
        gpu,
        "remapped_rows",
        rows,
        lambda v: {
            "corrected": int(v[0]),
            "uncorrected": int(v[1]),
            "pending": bool(v[2]),
            "failure": bool(v[3]),
        },
    )


def _gi_profiles(r: _Reader, i: int, parent: Any) -> dict[int, int]:
    """GPU-instance profile ID -> NVML_GPU_INSTANCE_PROFILE_* value on this GPU, by
    asking for every profile value as go-nvlib does (``migdevice.GetProfile``: values
    answering NOT_SUPPORTED or INVALID_ARGUMENT are skipped)."""
    n = r.nvml
    found: dict[int, int] = {}
    for p in range(mig.GPU_INSTANCE_PROFILE_COUNT):
        info = r.call(
            "nvmlDeviceGetGpuInstanceProfileInfo",
            functools.partial(n.nvmlDeviceGetGpuInstanceProfileInfo, parent, p, version=1),
            i,
            skip=("NVML_ERROR_INVALID_ARGUMENT",),
        )
        if info is not None and info is not UNSUPPORTED:
            found.setdefault(int(info.id), p)
    return found


def _mig_device(r: _Reader, i: int, parent: Any, handle: Any) -> dict[str, Any]:
    """One MIG device: ids, memory, attributes (nvml.h "Multi Instance GPU Management")."""
    n = r.nvml
    dev: dict[str, Any] = {}
    _put(dev, "uuid", r.call("nvmlDeviceGetUUID", lambda: n.nvmlDeviceGetUUID(handle), i), _text)
    gi_id = r.call("nvmlDeviceGetGpuInstanceId", lambda: n.nvmlDeviceGetGpuInstanceId(handle), i)
    _put(dev, "gpu_instance_id", gi_id, int)
    ci_id = r.call(
        "nvmlDeviceGetComputeInstanceId", lambda: n.nvmlDeviceGetComputeInstanceId(handle), i
    )
    _put(dev, "compute_instance_id", ci_id, int)
    if isinstance(gi_id, int):
        gi = r.call(
            "nvmlDeviceGetGpuInstanceById", lambda: n.nvmlDeviceGetGpuInstanceById(parent, gi_id), i
        )
        info = (
            None
            if gi in (None, UNSUPPORTED)
            else r.call("nvmlGpuInstanceGetInfo", lambda: n.nvmlGpuInstanceGetInfo(gi), i)
        )
        if info is not None and info is not UNSUPPORTED:
            dev["gi_profile_id"] = int(info.profileId)
    memory = r.call("nvmlDeviceGetMemoryInfo", lambda: n.nvmlDeviceGetMemoryInfo(handle), i)
    _put(dev, "memory_total_mib", memory, lambda m: int(m.total) // (1 << 20))
    attrs = r.call("nvmlDeviceGetAttributes", lambda: n.nvmlDeviceGetAttributes(handle), i)
    _put(
        dev,
        "attributes",
        attrs,
        lambda a: {
            "memory": int(a.memorySizeMB),
            "multiprocessors": int(a.multiprocessorCount),
            "slices_gi": int(a.gpuInstanceSliceCount),
            "slices_ci": int(a.computeInstanceSliceCount),
            "engines_copy": int(a.sharedCopyEngineCount),
            "engines_decoder": int(a.sharedDecoderCount),
            "engines_encoder": int(a.sharedEncoderCount),
            "engines_jpeg": int(a.sharedJpegCount),
            "engines_ofa": int(a.sharedOfaCount),
        },
    )
    return dev


def _mig_devices(r: _Reader, i: int, parent: Any, parent_total: int) -> list[dict[str, Any]]:
    """The MIG devices of GPU ``i``, as go-nvlib enumerates them (``VisitMigDevices``):
    every index below nvmlDeviceGetMaxMigDeviceCount; NOT_FOUND (no MIG device there)
    and INVALID_ARGUMENT are answers, not faults (nvml.h,
    nvmlDeviceGetMigDeviceHandleByIndex)."""
    n = r.nvml
    count = r.call(
        "nvmlDeviceGetMaxMigDeviceCount", lambda: n.nvmlDeviceGetMaxMigDeviceCount(parent), i
    )
    if not isinstance(count, int):
        return []
    profiles = _gi_profiles(r, i, parent)
    found = []
    for j in range(count):
        handle = r.call(
            "nvmlDeviceGetMigDeviceHandleByIndex",
            functools.partial(n.nvmlDeviceGetMigDeviceHandleByIndex, parent, j),
            i,
            skip=("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT"),
        )
        if handle is None or handle is UNSUPPORTED:
            continue
        dev = {"index": j, **_mig_device(r, i, parent, handle)}
        gi_profile = profiles.get(dev.pop("gi_profile_id", -1))
        if gi_profile is not None:
            dev["gpu_instance_profile"] = gi_profile
        attrs = dev.get("attributes")
        if gi_profile is not None and attrs is not None and parent_total:
            name = mig.profile_name(
                gpu_instance_profile=gi_profile,
                ci_slices=attrs["slices_ci"],
                memory_size_mb=attrs["memory"],
                parent_total_bytes=parent_total,
            )
            if name is not None:
                dev["profile"] = name
        found.append(dev)
    return found


def host_cpu() -> str | None:
    """This node's CPU architecture as the kubelet labels it (``kubernetes.io/arch``:
    Go's GOARCH), from uname's machine; None for a machine not known here. NVML does
    not say it; a Grace node (GH200, GB200) is ``arm64``."""
    import platform

    from buildmatrix.node.poolimages import node_platform

    found = node_platform(platform.machine())
    return found.split("/")[1] if found else None


def probe(hostname: str | None = None, *, sysfs: Path = Path("/sys")) -> dict[str, Any]:
    """Read every GPU on this node; returns a snapshot document (schema node-snapshot).

    The PCI bus under ``sysfs`` is read too: NVIDIA GPU functions the kernel lists,
    whether or not the driver brought them up (node/pci.py)."""
    try:
        import pynvml
    except ImportError:
        raise EnvironmentUnavailable(
            "NVML bindings are not installed: pip install nvidia-ml-py "
            "(buildmatrix depends on it; a broken install?)."
        ) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        code = error_name(pynvml, exc)
        hint = {
            "NVML_ERROR_LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 is not on the loader path: "
            "run on a GPU node with the NVIDIA driver, or in a container started by the "
            "NVIDIA container toolkit (NVIDIA_DRIVER_CAPABILITIES must include utility)",
            "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded",
            "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "libnvidia-ml and the kernel driver differ "
            "in version (a driver upgrade without reboot?)",
        }.get(code, "NVML could not start")
        mismatch = code == "NVML_ERROR_LIB_RM_VERSION_MISMATCH"
        error = DriverMismatch if mismatch else EnvironmentUnavailable
        raise error(f"NVML is unavailable ({code}): {hint}.") from None
    try:
        reader = _Reader(pynvml)
        driver = reader.call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)
        if driver in (None, UNSUPPORTED):
            raise EnvironmentUnavailable(
                "NVML started but did not report the driver version "
                f"({'; '.join(e['error'] for e in reader.errors) or 'not supported'})."
            )
        doc: dict[str, Any] = {
            "version": 1,
            "hostname": hostname or socket.gethostname(),
            "driver_version": _text(driver),
        }
        if (cpu := host_cpu()) is not None:
            doc["cpu"] = cpu
        cuda = reader.call("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion)
        if isinstance(cuda, int) and cuda > 0:
            doc["cuda_driver_version"] = cuda_version_text(cuda)
        count = reader.call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
        count = count if isinstance(count, int) else 0
        doc["gpu_count"] = count
        doc["gpus"] = [g for g in (_gpu(reader, i) for i in range(count)) if g is not None]
        on_bus = pci.read_gpus(sysfs)
        if on_bus is not None:
            doc["pci_gpus"] = [g.to_json() for g in on_bus]
        doc["errors"] = reader.errors
        return doc
    finally:
        with contextlib.suppress(pynvml.NVMLError):  # the snapshot is taken either way
            pynvml.nvmlShutdown()
