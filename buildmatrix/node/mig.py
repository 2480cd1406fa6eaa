"""MIG profile names, as GPU Feature Discovery derives them. Pure.

GFD names a MIG device by its profile (``internal/resource/nvml-mig-device.go``,
``nvmlMigDevice.GetName``): go-nvlib's ``MigProfile.String()`` with ``+`` replaced
by ``.``. go-nvlib (``pkg/nvlib/device/mig_profile.go``, ``NewMigProfile``,
``getMigMemorySizeGB``, ``MigProfileInfo.String``; ``mig_device.go``,
``migdevice.GetProfile``) builds the profile from:

- G: the GPU-instance slice count of the NVML_GPU_INSTANCE_PROFILE_* whose profile
  ID the GPU instance has, plus the attribute that profile implies (``+me``,
  ``+me.all``, ``+gfx``, ``-me``);
- C: the compute-instance slice count;
- GB: the MIG device's ``memorySizeMB`` as a fraction of the parent's total memory
  in bytes (``nvmlDeviceGetMemoryInfo`` on the parent: the call that needs MIG
  monitoring), rounded up to eighths, times the parent's memory in whole GiB
  rounded up, rounded to the nearest integer.

``String()`` writes ``<G>g.<GB>gb`` when C == G, else ``<C>c.<G>g.<GB>gb``, then
the attribute suffix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from buildmatrix.snapshot import Gpu

# NVML_GPU_INSTANCE_PROFILE_* (nvml.h) -> (slices, attribute suffix), as
# go-nvlib's NewMigProfile maps them.
GPU_INSTANCE_PROFILES: dict[int, tuple[int, str]] = {
    0x0: (1, ""),  # 1_SLICE
    0x1: (2, ""),  # 2_SLICE
    0x2: (3, ""),  # 3_SLICE
    0x3: (4, ""),  # 4_SLICE
    0x4: (7, ""),  # 7_SLICE
    0x5: (8, ""),  # 8_SLICE
    0x6: (6, ""),  # 6_SLICE
    0x7: (1, "+me"),  # 1_SLICE_REV1
    0x8: (2, "+me"),  # 2_SLICE_REV1
    0x9: (1, ""),  # 1_SLICE_REV2 (twice the memory)
    0xA: (1, "+gfx"),  # 1_SLICE_GFX
    0xB: (2, "+gfx"),  # 2_SLICE_GFX
    0xC: (4, "+gfx"),  # 4_SLICE_GFX
    0xD: (1, "-me"),  # 1_SLICE_NO_ME
    0xE: (2, "-me"),  # 2_SLICE_NO_ME
    0xF: (1, "+me.all"),  # 1_SLICE_ALL_ME
    0x10: (2, "+me.all"),  # 2_SLICE_ALL_ME
}
GPU_INSTANCE_PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT

# The NVIDIA container toolkit lets a container read a MIG-enabled GPU's aggregate
# state only with NVIDIA_MIG_MONITOR_DEVICES=all, and honours that variable only in a
# container whose bounding set holds CAP_SYS_ADMIN (NVIDIA/nvidia-container-toolkit
# cmd/nvidia-container-runtime/README.md "NVIDIA_MIG_MONITOR_DEVICES";
# cmd/nvidia-container-runtime-hook/container_config.go, getNvidiaConfig;
# internal/config/image/privileged.go, IsPrivileged).
MONITOR_HINT = (
    "NVML refuses a MIG-enabled GPU's aggregate queries without MIG monitoring: run "
    "smoke with NVIDIA_MIG_MONITOR_DEVICES=all in a container with CAP_SYS_ADMIN "
    "(buildmatrix k8s manifests --mig-strategy; docs/smoke.md, MIG), as the GPU Operator "
    "runs GPU Feature Discovery"
)


_MIB = 1 << 20
_GIB = 1 << 30


def memory_gb(*, memory_size_mb: int, parent_total_bytes: int) -> int:
    """go-nvlib ``getMigMemorySizeGB``: the GB figure of a profile name."""
    fraction = memory_size_mb * _MIB / parent_total_bytes
    fraction = math.ceil(fraction * 8) / 8
    total_gb = (parent_total_bytes + _GIB - 1) // _GIB
    # Go's math.Round rounds half away from zero; Python's round() is to even.
    return math.floor(fraction * total_gb + 0.5)


def profile_name(
    *, gpu_instance_profile: int, ci_slices: int, memory_size_mb: int, parent_total_bytes: int
) -> str | None:
    """``1g.10gb``, ``1c.2g.20gb``, ``1g.10gb+me``; None for a GPU-instance profile
    go-nvlib does not know (it then fails: "invalid GPU Instance Profile ID")."""
    known = GPU_INSTANCE_PROFILES.get(gpu_instance_profile)
    if known is None or parent_total_bytes <= 0:
        return None
    g, suffix = known
    gb = memory_gb(memory_size_mb=memory_size_mb, parent_total_bytes=parent_total_bytes)
    base = f"{g}g.{gb}gb" if ci_slices == g else f"{ci_slices}c.{g}g.{gb}gb"
    return base + suffix


def gfd_name(profile: str) -> str:
    """The name GFD gives a MIG device (and its ``nvidia.com/mig-<name>`` resource):
    the profile with ``+`` replaced by ``.``."""
    return profile.replace("+", ".")


def _profiles(gpus: Sequence[Gpu]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for g in gpus:
        for m in g.mig_devices or ():
            if m.profile is not None:
                counts[gfd_name(m.profile)] = counts.get(gfd_name(m.profile), 0) + 1
    return counts


def strategy_problems(gpus: Sequence[Gpu], strategy: str) -> list[str]:
    """Why the MIG layout cannot be labelled under ``strategy`` (empty: it can).

    For ``single`` these are GFD's own reasons to label ``<model>-MIG-INVALID``
    (``internal/lm/mig-strategy.go``, newMigStrategySingleLabeler); for both
    ``single`` and ``mixed`` a MIG device must have a recorded profile."""
    enabled = [g for g in gpus if g.mig_mode]
    if strategy == "none" or not enabled:
        return []
    problems = []
    unrecorded = [str(g.index) for g in enabled if g.mig_devices is None]
    if unrecorded:
        problems.append(
            f"GPU {','.join(unrecorded)}: MIG is on but the snapshot records no MIG devices "
            "(recorded before buildmatrix read them: record it again)"
        )
    unnamed = [g for g in enabled if any(m.profile is None for m in g.mig_devices or ())]
    if unnamed:
        count = sum(m.profile is None for g in unnamed for m in g.mig_devices or ())
        problems.append(
            f"no profile could be read for {count} MIG device(s) on GPU "
            f"{','.join(str(g.index) for g in unnamed)} (naming a profile needs the GPU's "
            "total memory, which NVML gives only to a caller allowed to monitor MIG)"
        )
    if strategy == "single":
        invalid = []
        if any(g.mig_devices is not None and not g.mig_devices for g in enabled):
            invalid.append("a MIG-enabled GPU has no MIG devices")
        if len(enabled) != len(gpus):
            invalid.append("GPUs with MIG enabled and disabled on one node")
        if len(_profiles(gpus)) > 1:
            invalid.append(
                "more than one MIG profile on the node ("
                + ", ".join(sorted(_profiles(gpus)))
                + "): use --mig-strategy mixed"
            )
        if invalid:
            problems += invalid
            problems.append("GPU Feature Discovery labels such a node <product>-MIG-INVALID")
    return problems


def strategy_summary(gpus: Sequence[Gpu], strategy: str) -> str:
    """What the labels will say about MIG, for a node that passes."""
    on = ",".join(str(g.index) for g in gpus if g.mig_mode)
    if strategy == "none":
        return (
            f"MIG on GPU {on}; --mig-strategy none labels whole GPUs: pass the device "
            "plugin's --mig-strategy"
        )
    found = ", ".join(f"{n} x {p}" for p, n in sorted(_profiles(gpus).items()))
    return f"MIG on GPU {on}: {found or 'no MIG devices'} (--mig-strategy {strategy})"
