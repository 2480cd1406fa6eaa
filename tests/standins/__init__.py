"""STAND-INS for the GPU libraries, for tests on machines without an NVIDIA GPU.

``libnvidia-ml.so.1`` (nvml.c) and ``libcuda.so.1`` (cuda.c) are small C libraries
built here with gcc. They export the entry points buildmatrix calls with the C
signatures of ``nvml.h`` / ``cuda.h`` and answer from JSON scenarios, so the real
``nvidia-ml-py`` bindings and buildmatrix's ``ctypes`` driver calls run unchanged
against them (the loader finds them through ``LD_LIBRARY_PATH``). They stand in for
the driver; they are not tested as if they were one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests import forked_cli

HERE = Path(__file__).resolve().parent


def build(out: Path) -> Path:
    """Compile both stand-ins into ``out``; returns ``out`` (for LD_LIBRARY_PATH)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FileNotFoundError("gcc")
    for source, soname in (("nvml.c", "libnvidia-ml.so.1"), ("cuda.c", "libcuda.so.1")):
        subprocess.run(
            [
                gcc,
                "-O1",
                "-Wall",
                "-Werror",
                "-shared",
                "-fPIC",
                f"-Wl,-soname,{soname}",
                "-o",
                str(out / soname),
                str(HERE / source),
            ],
            check=True,
        )
    return out


# GPU-instance profile IDs an A100 reports for each NVML_GPU_INSTANCE_PROFILE_* value
# (nvidia-smi mig -lgip: 1g.5gb 19, 1g.5gb+me 20, 1g.10gb 15, 2g.10gb 14, 3g.20gb 9,
# 4g.20gb 5, 7g.40gb 0): the stand-in answers nvmlDeviceGetGpuInstanceProfileInfo
# with them, so the probe must match IDs to profile values as go-nvlib does.
GI_PROFILE_IDS = {0x0: 19, 0x1: 14, 0x2: 9, 0x3: 5, 0x4: 0, 0x7: 20, 0x9: 15}
_ATTRIBUTES = (  # nvmlDeviceAttributes_t field order
    "multiprocessors",
    "engines_copy",
    "engines_decoder",
    "engines_encoder",
    "engines_jpeg",
    "engines_ofa",
    "slices_gi",
    "slices_ci",
    "memory",
)


def _mig_scenario(g: dict[str, Any]) -> dict[str, Any]:
    """A MIG parent's answers: its profiles, and its MIG devices at their indexes."""
    devices: list[Any] = [None] * max(7, *(m["index"] + 1 for m in g["mig_devices"]))
    for m in g["mig_devices"]:
        p = m.get("gpu_instance_profile", 0)
        a = m.get("attributes")
        devices[m["index"]] = {
            "uuid": m.get("uuid", "NVML_ERROR_UNKNOWN"),
            "gpu_instance_id": m["gpu_instance_id"],
            "compute_instance_id": m["compute_instance_id"],
            "gi_profile_id": GI_PROFILE_IDS.get(p, 100 + p),
            "memory_total_bytes": m["memory_total_mib"] * 2**20 + 4_321,
            "attributes": "NVML_ERROR_UNKNOWN" if a is None else [a[k] for k in _ATTRIBUTES],
        }
    used = {m.get("gpu_instance_profile", 0) for m in g["mig_devices"]}
    return {
        "max_mig_devices": len(devices),
        "gi_profiles": [
            {"profile": p, "id": GI_PROFILE_IDS.get(p, 100 + p)}
            for p in sorted(set(GI_PROFILE_IDS) | used)
        ],
        "mig_devices": devices,
    }


def sysfs_tree(root: Path, functions: list[dict[str, str]]) -> Path:
    """A STAND-IN sysfs under ``root``, laid out as the kernel's: each PCI function a
    folder ``devices/pci0000:00/BDF`` with ``vendor``, ``device`` and ``class`` files
    (``0x%04x`` / ``0x%06x`` and a newline, drivers/pci/pci-sysfs.c), linked from
    ``bus/pci/devices/BDF``. ``functions``: {"bus_id", "vendor", "device", "class"}."""
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    for f in functions:
        folder = root / "devices" / "pci0000:00" / f["bus_id"]
        folder.mkdir(parents=True, exist_ok=True)
        for key in ("vendor", "device", "class"):
            (folder / key).write_text(f[key] + "\n")
        (bus / f["bus_id"]).symlink_to(Path("../../../devices/pci0000:00") / f["bus_id"])
    return root


def pci_functions(snapshot: dict[str, Any]) -> list[dict[str, str]]:
    """The sysfs functions behind a snapshot's ``pci_gpus`` (the probe's inverse)."""
    return [
        {"bus_id": p["bus_id"], "vendor": "0x10de", "device": p["device"], "class": p["class"]}
        for p in snapshot.get("pci_gpus", [])
    ]


# nvmlComputeMode_t values (nvml.h), by the snapshot's names for them
COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}


def _compute_use(g: dict[str, Any]) -> dict[str, Any]:
    """The compute mode and the processes running on a GPU, where the snapshot records
    them (a recording without them: both calls answer NOT_SUPPORTED, and the probe
    records neither)."""
    found: dict[str, Any] = {}
    if g.get("compute_mode") is not None:
        found["compute_mode"] = COMPUTE_MODES[g["compute_mode"]]
    if g.get("compute_processes") is not None:
        count = g["compute_processes"]
        found["processes"] = [{"pid": 4000 + i, "used_bytes": 70 * 2**30 + i} for i in range(count)]
    return found


def nvml_scenario(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The stand-in NVML scenario that reports ``snapshot`` (the probe's inverse).

    Memory is given in bytes with a remainder, so the probe's MiB rounding is tested;
    ``null`` fields answer NOT_SUPPORTED; a lost GPU's handle fails with its error;
    MIG monitoring is granted unless the snapshot records its refusal.
    """
    unsupported = "NVML_ERROR_NOT_SUPPORTED"
    major, _, minor = snapshot["cuda_driver_version"].partition(".")
    by_index = {g["index"]: g for g in snapshot["gpus"]}
    errors = snapshot.get("errors", [])
    lost = {e["index"]: e["error"] for e in errors if e["call"] == "nvmlDeviceGetHandleByIndex"}
    gpus = []
    for i in range(snapshot.get("gpu_count", len(snapshot["gpus"]))):
        if i in lost:
            gpus.append({"handle": lost[i]})
            continue
        g = by_index[i]
        rows = g.get("remapped_rows")
        mig = (g.get("mig_mode"), g.get("mig_mode_pending"))

        def value(key: str, g: dict[str, Any] = g) -> Any:
            v = g.get(key)
            return unsupported if v is None else int(v)

        gpus.append(
            ({} if g.get("mig_devices") is None else _mig_scenario(g))
            | {
                "name": g["name"],
                "uuid": g["uuid"],
                "pci_bus_id": g["pci_bus_id"],
                "compute_capability": [int(x) for x in g["compute_capability"].split(".")],
                "memory_total_bytes": g.get("memory_total_mib", 0) * 2**20 + 123_456,
                "mig_mode": unsupported if None in mig else [int(mig[0]), int(mig[1])],
                "ecc_uncorrected_volatile": value("ecc_uncorrected_volatile"),
                "retired_pages_pending": value("retired_pages_pending"),
                "remapped_rows": unsupported
                if rows is None
                else [
                    rows["corrected"],
                    rows["uncorrected"],
                    int(rows["pending"]),
                    int(rows["failure"]),
                ],
                "persistence_mode": value("persistence_mode"),
                "brand": value("brand"),
                **_compute_use(g),
            }
        )
    return {
        "driver_version": snapshot["driver_version"],
        "cuda_driver_version": int(major) * 1000 + int(minor) * 10,
        "gpus": gpus,
        "mig_monitor": not any(e["error"] == "NVML_ERROR_NO_PERMISSION" for e in errors),
    }


def run_cli(
    args: list[str],
    *,
    libs: Path | None,
    tmp: Path,
    nvml: dict[str, Any] | None = None,
    cuda: dict[str, Any] | None = None,
    sysfs: Path | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``buildmatrix ARGS`` in a new process whose loader sees only the stand-ins.

    ``libs=None`` runs with no GPU library at all (as on a CPU-only machine).
    ``sysfs``: the PCI bus the probe reads (default: none, so this machine's own
    /sys never enters a test). The process is forked from one that has imported
    buildmatrix (tests/forked_cli.py); ``fresh``: started as ``python -m buildmatrix``
    instead.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NODE_NAME")}
    env.pop("BUILDMATRIX_PROFILES", None)
    env["BUILDMATRIX_SYSFS"] = str(sysfs if sysfs is not None else tmp / "no-sysfs")
    if libs is not None:
        env["LD_LIBRARY_PATH"] = str(libs)
    if nvml is not None:
        (tmp / "nvml.json").write_text(json.dumps(nvml))
        env["NVML_STANDIN_SCENARIO"] = str(tmp / "nvml.json")
    if cuda is not None:
        (tmp / "cuda.json").write_text(json.dumps(cuda))
        env["CUDA_STANDIN_SCENARIO"] = str(tmp / "cuda.json")
        env["CUDA_STANDIN_LOG"] = str(tmp / "cuda.log")
    if fresh:
        return subprocess.run(
            [sys.executable, "-m", "buildmatrix", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    return forked_cli.run(args, env, cwd=Path.cwd(), timeout=120)


# The note of NVIDIA's CUDA 13.1 compat driver 590.44.01, as the NVIDIA container
# toolkit's test data records it: the one the tests' compat libraries carry.
NOTE_13_1 = {
    "format": 1,
    "CUDA version": "13.1",
    "driver": [535, 550, 570, 575, 580, 590],
    "device": [1, 2, 7, 8, 9, 10, 11, 12, 13, 14],
}


def compat_library(
    out: Path, version: str, note: dict[str, Any] | str | None, *, section_type: str = "@note"
) -> Path:
    """A STAND-IN for cuda-compat's ``libcuda.so.VERSION``: an empty shared library
    built by gcc that carries NVIDIA's forward-compatibility ELF note (owner "NVIDIA
    Corporation", a JSON description, in a SHT_NOTE section named
    ``.note.cuda.fwd_compatibility``), laid out as in the libraries NVIDIA ships (the
    NVIDIA container toolkit's test data). ``note`` None: no note; a str: written as is.
    ``section_type`` (gas syntax) gives the section another type, for the tests.
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FileNotFoundError("gcc")
    source = out / f"compat-{version}.S"
    text = (
        '    .section .note.GNU-stack,"",@progbits\n'
        "    .text\n    .globl cuInit\ncuInit:\n    xorl %eax, %eax\n    ret\n"
    )
    if note is not None:
        desc = note if isinstance(note, str) else json.dumps(note, separators=(",", ":"))
        quoted = desc.replace("\\", "\\\\").replace('"', '\\"')
        text += f"""
    .section .note.cuda.fwd_compatibility,"a",{section_type}
    .balign 4
    .long 19
    .long .Ldesc_end - .Ldesc
    .long 0
    .asciz "NVIDIA Corporation"
    .balign 4
.Ldesc:
    .asciz "{quoted}"
.Ldesc_end:
    .balign 4
"""
    source.write_text(text)
    library = out / f"libcuda.so.{version}"
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(library), str(source)],
        check=True,
    )
    source.unlink()
    return library
