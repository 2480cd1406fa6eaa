"""NVIDIA GPU functions on the PCI bus, as the kernel lists them in sysfs.

NVML counts the GPUs the driver brought up; a GPU whose initialisation failed, or
that fell off the bus before the driver loaded, is simply not counted, with no
error. The kernel's PCI view is independent of the driver: every function it
enumerated is a folder of ``/sys/bus/pci/devices`` holding ``vendor``, ``device``
and ``class`` files (Linux ``Documentation/ABI/testing/sysfs-bus-pci``; values
written as ``0x%04x`` / ``0x%06x`` by ``drivers/pci/pci-sysfs.c``).

An NVIDIA GPU is vendor 0x10de (PCI-SIG vendor ID of NVIDIA) with base class 0x03
(display controller) and subclass 0x00 (VGA-compatible) or 0x02 (3D controller),
any programming interface. GPU Feature Discovery's PCI reader tells GPUs the same
way (NVIDIA/go-nvlib ``pkg/nvpci/nvpci.go``, ``NvidiaPCIDevice.IsGPU``:
``PCIVgaControllerClass`` 0x030000 or ``PCI3dControllerClass`` 0x030200; an
NVSwitch is ``PCINvSwitchClass`` 0x068000, a bridge). A board's HDMI audio
function is class 0x0403xx. Neither is a GPU.

:func:`read_gpus` is the only I/O here (the sysfs root is a parameter, so tests
read fake trees); the rest is pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from buildmatrix.snapshot import PciGpu, bus_id_key

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)  # class >> 8: VGA-compatible, 3D controller


def is_nvidia_gpu(vendor: int, pci_class: int) -> bool:
    """Vendor 0x10de with a VGA (0x0300xx) or 3D controller (0x0302xx) class."""
    return vendor == NVIDIA_VENDOR and pci_class >> 8 in GPU_CLASSES


def _hex(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="ascii").strip(), 16)
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def read_gpus(sysfs: Path) -> tuple[PciGpu, ...] | None:
    """The NVIDIA GPU functions under ``SYSFS/bus/pci/devices``, by bus id; None when
    that folder cannot be listed (no sysfs: the PCI view is then not recorded)."""
    devices = sysfs / "bus" / "pci" / "devices"
    try:
        entries: Iterable[Path] = sorted(devices.iterdir())
    except OSError:
        return None
    found = []
    for entry in entries:
        vendor, pci_class = _hex(entry / "vendor"), _hex(entry / "class")
        if vendor is None or pci_class is None or not is_nvidia_gpu(vendor, pci_class):
            continue
        device = _hex(entry / "device")
        found.append(
            PciGpu(
                bus_id=bus_id_key(entry.name) or entry.name,
                device=f"0x{device or 0:04x}",
                pci_class=f"0x{pci_class:06x}",
            )
        )
    return tuple(sorted(found, key=lambda g: g.bus_id))
