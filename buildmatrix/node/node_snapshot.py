"""Where ``smoke`` and ``labels`` get the node they judge: a recorded snapshot file
(``--snapshot``), or this node's GPUs read through NVML and the PCI bus
(node/probe.py), written to ``--record`` first when asked (docs/smoke.md)."""

from __future__ import annotations

import json
from pathlib import Path

from buildmatrix.errors import InputError
from buildmatrix.node.probe import probe
from buildmatrix.snapshot import Snapshot, load_snapshot, snapshot_from_doc


def live_snapshot(node: str | None, record: Path | None, sysfs: Path) -> Snapshot:
    """Probe NVML and the PCI bus; with ``record``, write what they said first
    (before any judging)."""
    doc = probe(hostname=node, sysfs=sysfs)
    if record is not None:
        try:
            record.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"--record {record}: cannot write: {exc.strerror}.") from None
    return snapshot_from_doc(doc, source="NVML")


def read_snapshot(
    *, snapshot: Path | None, record: Path | None, node: str | None, sysfs: Path
) -> Snapshot:
    """The recorded node ``snapshot``, else this node's GPUs (EnvironmentUnavailable
    where NVML cannot be read)."""
    if snapshot is not None and record is not None:
        raise InputError(
            "--snapshot and --record exclude each other: --record reads this node's GPUs "
            "and writes them to FILE, --snapshot judges a recorded node instead."
        )
    if snapshot is not None:
        return load_snapshot(snapshot)
    return live_snapshot(node, record, sysfs)
