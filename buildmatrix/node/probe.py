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
import socket
from collections.abc import Callable
from typing import Any

from buildmatrix.errors import EnvironmentUnavailable


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

    def call(self, name: str, fn: Callable[[], Any], index: int | None = None) -> Any:
        """The call's value, UNSUPPORTED, or None after recording the error."""
        try:
            return fn()
        except self.nvml.NVMLError as exc:
            code = error_name(self.nvml, exc)
            if code == "NVML_ERROR_NOT_SUPPORTED":
                return UNSUPPORTED
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
    memory = r.call("nvmlDeviceGetMemoryInfo", lambda: n.nvmlDeviceGetMemoryInfo(handle), i)
    if memory is not None and memory is not UNSUPPORTED:
        gpu["memory_total_mib"] = int(memory.total) // (1 << 20)  # as GFD: total / 1 MiB
    mig = r.call("nvmlDeviceGetMigMode", lambda: n.nvmlDeviceGetMigMode(handle), i)
    _put(gpu, "mig_mode", mig, lambda m: bool(m[0]))
    _put(gpu, "mig_mode_pending", mig, lambda m: bool(m[1]))
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
    persistence = r.call(
        "nvmlDeviceGetPersistenceMode", lambda: n.nvmlDeviceGetPersistenceMode(handle), i
    )
    _put(gpu, "persistence_mode", persistence, bool)
    brand = r.call("nvmlDeviceGetBrand", lambda: n.nvmlDeviceGetBrand(handle), i)
    _put(gpu, "brand", brand, int)
    return gpu


def probe(hostname: str | None = None) -> dict[str, Any]:
    """Read every GPU on this node; returns a snapshot document (schema node-snapshot)."""
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
        raise EnvironmentUnavailable(f"NVML is unavailable ({code}): {hint}.") from None
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
        cuda = reader.call("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion)
        if isinstance(cuda, int) and cuda > 0:
            doc["cuda_driver_version"] = cuda_version_text(cuda)
        count = reader.call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
        count = count if isinstance(count, int) else 0
        doc["gpu_count"] = count
        doc["gpus"] = [g for g in (_gpu(reader, i) for i in range(count)) if g is not None]
        doc["errors"] = reader.errors
        return doc
    finally:
        with contextlib.suppress(pynvml.NVMLError):  # the snapshot is taken either way
            pynvml.nvmlShutdown()
