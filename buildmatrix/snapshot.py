"""Node snapshots: what NVML said about a node's GPUs (docs/smoke.md, "Snapshot format").

A snapshot is what ``smoke --record`` writes and ``smoke --snapshot`` / ``check
--snapshot`` read. The probe builds the same document from NVML, so a recorded node
and a live one go through one loader.

Per-GPU health fields follow one rule: ``null`` means NVML answered NOT_SUPPORTED
(ECC on a GPU without ECC, remapped rows before Ampere or with MIG on), a missing
key means the field was not recorded (snapshots written before it existed). Both
load as ``None``; neither is a failure by itself. Any other NVML error is an entry
of ``errors``, and an error fails the node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildmatrix import schema
from buildmatrix.arch import ComputeCapability, parse_cc
from buildmatrix.cuda import DriverVersion, parse_driver_version
from buildmatrix.errors import InputError

_BUS_ID = re.compile(
    r"(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<device>[0-9a-fA-F]{1,2})\.(?P<function>[0-7])"
)


@dataclass(frozen=True, kw_only=True)
class PciGpu:
    """One NVIDIA GPU function the kernel enumerated (read from sysfs by node/pci.py)."""

    bus_id: str  # as sysfs names it: 0000:3b:00.0
    device: str  # PCI device ID, 0x2330
    pci_class: str  # 0x030200

    def to_json(self) -> dict[str, str]:
        return {"bus_id": self.bus_id, "device": self.device, "class": self.pci_class}


def bus_id_key(text: str) -> str | None:
    """One spelling for a PCI address: ``0000:3b:00.0`` (sysfs) and NVML's
    ``00000000:3B:00.0`` (nvmlPciInfo_t.busId: 8-digit domain, upper case) both give
    ``0000:3b:00.0``. None when the text is no PCI address."""
    m = _BUS_ID.fullmatch(text.strip())
    if m is None:
        return None
    domain = int(m["domain"] or "0", 16)
    return f"{domain:04x}:{int(m['bus'], 16):02x}:{int(m['device'], 16):02x}.{m['function']}"


@dataclass(frozen=True, kw_only=True)
class RemappedRows:
    """``nvmlDeviceGetRemappedRows``: (corrected, uncorrected, isPending, failureOccurred)."""

    corrected: int
    uncorrected: int
    pending: bool
    failure: bool


@dataclass(frozen=True, kw_only=True)
class MigAttributes:
    """``nvmlDeviceGetAttributes`` of a MIG device (nvmlDeviceAttributes_t); the
    names are GPU Feature Discovery's label suffixes for them (NVIDIA/k8s-device-plugin
    ``internal/resource/nvml-mig-device.go``, ``GetAttributes``)."""

    memory: int  # memorySizeMB
    multiprocessors: int
    slices_gi: int
    slices_ci: int
    engines_copy: int
    engines_decoder: int
    engines_encoder: int
    engines_jpeg: int
    engines_ofa: int


@dataclass(frozen=True, kw_only=True)
class MigDevice:
    """One MIG device (a compute instance) of a GPU in MIG mode."""

    index: int  # nvmlDeviceGetMigDeviceHandleByIndex index under its parent
    profile: str | None  # "1g.10gb", "1c.2g.20gb", "1g.10gb+me": go-nvlib's MigProfile
    uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    gpu_instance_profile: int | None = None  # NVML_GPU_INSTANCE_PROFILE_* value
    memory_total_mib: int | None = None  # nvmlDeviceGetMemoryInfo on the MIG handle
    attributes: MigAttributes | None = None


@dataclass(frozen=True, kw_only=True)
class Gpu:
    index: int
    name: str
    cc: ComputeCapability
    memory_total_mib: int | None
    uuid: str | None = None
    pci_bus_id: str | None = None
    mig_mode: bool | None = None
    mig_mode_pending: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows: RemappedRows | None = None
    persistence_mode: bool | None = None
    brand: int | None = None  # nvmlDeviceGetBrand (nvmlBrandType_t)
    # nvmlDeviceGetComputeMode as a name (COMPUTE_MODES), and the processes that hold a
    # CUDA context on the GPU: a busy GPU (node/loadtest.py, node/checks.py)
    compute_mode: str | None = None
    compute_processes: int | None = None
    mig_devices: tuple[MigDevice, ...] | None = None  # None: not recorded / MIG off


@dataclass(frozen=True, kw_only=True)
class NvmlError:
    """One NVML call that failed, e.g. ``nvmlDeviceGetHandleByIndex(3)`` GPU_IS_LOST."""

    call: str
    error: str
    index: int | None = None

    def __str__(self) -> str:
        where = f" on GPU {self.index}" if self.index is not None else ""
        return f"{self.call}{where}: {self.error}"


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    hostname: str
    driver: DriverVersion
    cuda_driver_version: str | None
    gpus: tuple[Gpu, ...]
    errors: tuple[NvmlError, ...]
    source: str
    gpu_count: int | None = None  # what nvmlDeviceGetCount said (lost GPUs included)
    pci_gpus: tuple[PciGpu, ...] | None = None  # the kernel's view; None: not recorded
    cpu: str | None = None  # kubernetes.io/arch of the node (amd64, arm64); None: not recorded

    @property
    def platform(self) -> str | None:
        """The platform the node's runtime pulls (``linux/arm64`` on a Grace node)."""
        return f"linux/{self.cpu}" if self.cpu else None

    def pci_missing_from_nvml(self) -> tuple[str, ...]:
        """Bus ids of NVIDIA GPUs on the PCI bus that NVML does not show (a GPU whose
        NVML record has no bus id cannot be matched, so none is named then)."""
        if self.pci_gpus is None or any(g.pci_bus_id is None for g in self.gpus):
            return ()
        seen = {bus_id_key(g.pci_bus_id or "") for g in self.gpus}
        return tuple(p.bus_id for p in self.pci_gpus if bus_id_key(p.bus_id) not in seen)


def _remapped(doc: Mapping[str, Any] | None) -> RemappedRows | None:
    if doc is None:
        return None
    return RemappedRows(
        corrected=doc["corrected"],
        uncorrected=doc["uncorrected"],
        pending=doc["pending"],
        failure=doc["failure"],
    )


def _mig_device(doc: Mapping[str, Any]) -> MigDevice:
    a = doc.get("attributes")
    return MigDevice(
        index=doc["index"],
        profile=doc.get("profile"),
        uuid=doc.get("uuid"),
        gpu_instance_id=doc.get("gpu_instance_id"),
        compute_instance_id=doc.get("compute_instance_id"),
        gpu_instance_profile=doc.get("gpu_instance_profile"),
        memory_total_mib=doc.get("memory_total_mib"),
        attributes=None if a is None else MigAttributes(**a),
    )


def _pci(doc: Any) -> tuple[PciGpu, ...] | None:
    if doc is None:
        return None
    return tuple(
        PciGpu(
            bus_id=bus_id_key(p["bus_id"]) or p["bus_id"], device=p["device"], pci_class=p["class"]
        )
        for p in doc
    )


def snapshot_from_doc(doc: Any, *, source: str) -> Snapshot:
    """Validate a snapshot document (parsed JSON) and convert it."""
    schema.validate(doc, "node-snapshot", source=source)
    gpus = tuple(
        Gpu(
            index=g["index"],
            name=g["name"],
            cc=parse_cc(g["compute_capability"]),
            memory_total_mib=g.get("memory_total_mib"),
            uuid=g.get("uuid"),
            pci_bus_id=g.get("pci_bus_id"),
            mig_mode=g.get("mig_mode"),
            mig_mode_pending=g.get("mig_mode_pending"),
            ecc_uncorrected_volatile=g.get("ecc_uncorrected_volatile"),
            retired_pages_pending=g.get("retired_pages_pending"),
            remapped_rows=_remapped(g.get("remapped_rows")),
            persistence_mode=g.get("persistence_mode"),
            brand=g.get("brand"),
            compute_mode=g.get("compute_mode"),
            compute_processes=g.get("compute_processes"),
            mig_devices=None
            if g.get("mig_devices") is None
            else tuple(_mig_device(m) for m in g["mig_devices"]),
        )
        for g in doc["gpus"]
    )
    indexes = [g.index for g in gpus]
    if len(set(indexes)) != len(indexes):
        raise InputError(f"{source}: key 'gpus': a GPU index appears twice; indexes are unique.")
    return Snapshot(
        hostname=str(doc.get("hostname", "")),
        driver=parse_driver_version(doc["driver_version"], what=f"{source}: driver_version"),
        cuda_driver_version=doc.get("cuda_driver_version"),
        gpus=gpus,
        errors=tuple(
            NvmlError(call=e["call"], error=e["error"], index=e.get("index"))
            for e in doc.get("errors", [])
        ),
        gpu_count=doc.get("gpu_count"),
        pci_gpus=_pci(doc.get("pci_gpus")),
        cpu=doc.get("cpu"),
        source=source,
    )


def load_snapshot(path: Path) -> Snapshot:
    """Read and validate a snapshot file; anything wrong is an input error naming it."""
    source = str(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{source}: cannot read the node snapshot: {exc.strerror}.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{source}: the node snapshot is not valid JSON ({exc}).") from None
    return snapshot_from_doc(doc, source=source)
