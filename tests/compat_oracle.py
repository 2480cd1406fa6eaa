"""The compatibility rules stated over cuobjdump's lists, for tests that hold ``check``
to them: which code of a file runs on a GPU, and the driver a CUDA release needs.

Written from NVIDIA's documents, not from buildmatrix: the CUDA C++ Programming Guide
("Binary Compatibility", "PTX Compatibility", and for ``a``/``f`` targets "Feature
Availability"), and the CUDA Compatibility guide ("Minor Version Compatibility").
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

# CUDA Compatibility guide, table "CUDA Toolkit and Minimum Required Driver Version
# for CUDA Minor Version Compatibility" (Linux): every release of a major runs on
# these drivers.
MINOR_COMPAT_FLOOR = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}
# Integrated (Tegra) compute capabilities: their SASS and the desktop SMs' of the same
# major do not run on each other (Programming Guide, "Binary Compatibility").
TEGRA = {(7, 2), (8, 7), (8, 8), (10, 1), (11, 0)}
_TOOL_VERSION = re.compile(r"Tool Version: Cuda compilation tools, release (\d+)\.(\d+)")
_PTX_VERSION = re.compile(r"^\s*\.version (\d+)\.(\d+)", re.M)


def cc_of(arch: str) -> tuple[int, int, str]:
    """``sm_90a`` / ``compute_100f`` -> (9, 0, "a") / (10, 0, "f")."""
    digits = arch.split("_")[1]
    suffix = digits[-1] if digits[-1] in "af" else ""
    digits = digits.removesuffix(suffix)
    return int(digits[:-1]), int(digits[-1]), suffix


def sass_runs(arch: str, gpu: tuple[int, int]) -> bool:
    major, minor, suffix = cc_of(arch)
    if ((major, minor) in TEGRA) != (gpu in TEGRA):
        return False
    if suffix == "a":
        return (major, minor) == gpu
    # plain and family-specific SASS: the same major, a minor not above the GPU's
    return major == gpu[0] and minor <= gpu[1]


def ptx_runs(arch: str, gpu: tuple[int, int]) -> bool:
    major, minor, suffix = cc_of(arch)
    if suffix == "a":
        return (major, minor) == gpu
    if suffix == "f":
        return major == gpu[0] and minor <= gpu[1]
    return (major, minor) <= gpu


def file_verdict(sass: Iterable[str], ptx: Iterable[str], gpu: tuple[int, int]) -> str:
    """``native`` (SASS runs), ``jit`` (only PTX does) or ``none``, for one file."""
    if any(sass_runs(a, gpu) for a in sass):
        return "native"
    return "jit" if any(ptx_runs(a, gpu) for a in ptx) else "none"


def image_verdict(verdicts: Iterable[str]) -> str:
    """The worst file decides; no file at all runs nothing that could fail."""
    found = set(verdicts)
    return "none" if "none" in found else "jit" if "jit" in found else "native"


def cuobjdump_toolkits(tool: Path, path: Path) -> set[tuple[int, int]]:
    """The CUDA releases whose ptxas/nvlink wrote the file's cubins, as ``cuobjdump
    -elf`` prints their ``.note.nv.tkinfo`` ("Tool Version: Cuda compilation tools,
    release 13.0")."""
    out = subprocess.run(
        [str(tool), "-elf", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return {(int(m[1]), int(m[2])) for m in _TOOL_VERSION.finditer(out)}


def cuobjdump_ptx_isas(tool: Path, path: Path) -> set[tuple[int, int]]:
    """The PTX ISA versions of the file's PTX (``.version`` of each text ``cuobjdump
    -ptx`` prints)."""
    out = subprocess.run(
        [str(tool), "-ptx", str(path)], capture_output=True, text=True, check=False
    ).stdout
    return {(int(m[1]), int(m[2])) for m in _PTX_VERSION.finditer(out)}


def driver_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))
