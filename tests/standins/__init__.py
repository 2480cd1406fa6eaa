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


def nvml_scenario(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The stand-in NVML scenario that reports ``snapshot`` (the probe's inverse).

    Memory is given in bytes with a remainder, so the probe's MiB rounding is tested;
    ``null`` fields answer NOT_SUPPORTED; a lost GPU's handle fails with its error.
    """
    unsupported = "NVML_ERROR_NOT_SUPPORTED"
    major, _, minor = snapshot["cuda_driver_version"].partition(".")
    by_index = {g["index"]: g for g in snapshot["gpus"]}
    lost = {e["index"]: e["error"] for e in snapshot.get("errors", []) if "index" in e}
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
            {
                "name": g["name"],
                "uuid": g["uuid"],
                "pci_bus_id": g["pci_bus_id"],
                "compute_capability": [int(x) for x in g["compute_capability"].split(".")],
                "memory_total_bytes": g["memory_total_mib"] * 2**20 + 123_456,
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
            }
        )
    return {
        "driver_version": snapshot["driver_version"],
        "cuda_driver_version": int(major) * 1000 + int(minor) * 10,
        "gpus": gpus,
    }


def run_cli(
    args: list[str],
    *,
    libs: Path | None,
    tmp: Path,
    nvml: dict[str, Any] | None = None,
    cuda: dict[str, Any] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``buildmatrix ARGS`` in a new process whose loader sees only the stand-ins.

    ``libs=None`` runs with no GPU library at all (as on a CPU-only machine).
    """
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NODE_NAME")}
    env.pop("BUILDMATRIX_PROFILES", None)
    if libs is not None:
        env["LD_LIBRARY_PATH"] = str(libs)
    if nvml is not None:
        (tmp / "nvml.json").write_text(json.dumps(nvml))
        env["NVML_STANDIN_SCENARIO"] = str(tmp / "nvml.json")
    if cuda is not None:
        (tmp / "cuda.json").write_text(json.dumps(cuda))
        env["CUDA_STANDIN_SCENARIO"] = str(tmp / "cuda.json")
        env["CUDA_STANDIN_LOG"] = str(tmp / "cuda.log")
    return subprocess.run(
        [sys.executable, "-m", "buildmatrix", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def compat_library(out: Path, version: str, note: dict[str, Any] | str | None) -> Path:
    """A STAND-IN for cuda-compat's ``libcuda.so.VERSION``: an empty shared library
    built by gcc that carries NVIDIA's forward-compatibility ELF note (owner "NVIDIA
    Corporation", a JSON description, in a SHT_NOTE section named
    ``.note.cuda.fwd_compatibility``), laid out as in the libraries NVIDIA ships (the
    NVIDIA container toolkit's test data). ``note`` None: no note; a str: written as is.
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
    .section .note.cuda.fwd_compatibility,"a",@note
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
