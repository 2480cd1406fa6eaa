"""Node snapshots: what NVML said about a node's GPUs (DESIGN.md section 4)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from buildmatrix import schema
from buildmatrix.arch import ComputeCapability, parse_cc
from buildmatrix.cuda import DriverVersion, parse_driver_version
from buildmatrix.errors import InputError


@dataclass(frozen=True, kw_only=True)
class Gpu:
    index: int
    name: str
    cc: ComputeCapability
    memory_total_mib: int | None


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    hostname: str
    driver: DriverVersion
    cuda_driver_version: str | None
    gpus: tuple[Gpu, ...]
    errors: tuple[str, ...]
    source: str


def load_snapshot(path: Path) -> Snapshot:
    """Read and validate a snapshot file; anything wrong is an input error naming it."""
    source = str(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{source}: cannot read the node snapshot: {exc.strerror}.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{source}: the node snapshot is not valid JSON ({exc}).") from None
    schema.validate(doc, "node-snapshot", source=source)
    return Snapshot(
        hostname=str(doc.get("hostname", "")),
        driver=parse_driver_version(doc["driver_version"], what=f"{source}: driver_version"),
        cuda_driver_version=doc.get("cuda_driver_version"),
        gpus=tuple(
            Gpu(
                index=g["index"],
                name=g["name"],
                cc=parse_cc(g["compute_capability"]),
                memory_total_mib=g.get("memory_total_mib"),
            )
            for g in doc["gpus"]
        ),
        errors=tuple(
            f"{e['call']}({e.get('index', '')}): {e['error']}" for e in doc.get("errors", [])
        ),
        source=source,
    )
