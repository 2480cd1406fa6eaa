"""Node Feature Discovery outputs: a local feature file, or a ``NodeFeature`` object.

NFD's local source reads every non-dot file in ``features.d/`` (at most 64 KiB),
one ``key[=value]`` per line, ``#`` comments, and the directive
``# +expiry-time=<RFC3339>`` after which NFD drops the labels (NFD docs, "Feature
sources: local"). GFD publishes the same way without API access. Since NFD v0.13
``nvidia.com/`` keys need no extra configuration; ``gpu-pool`` (no prefix) is
published as ``feature.node.kubernetes.io/gpu-pool`` by NFD — see docs/smoke.md.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from buildmatrix.errors import InputError

MAX_FEATURE_FILE = 64 << 10  # NFD ignores larger files
NODEFEATURE_API = "nfd.k8s-sigs.io/v1alpha1"
NFD_TTL = timedelta(hours=24)  # NFD drops the labels if smoke stops re-running


def feature_file(
    labels: Mapping[str, str],
    *,
    now: datetime,
    ttl: timedelta,
    notes: Mapping[str, str] | None = None,
) -> str:
    """The file's text: a header, the expiry directive, ``notes`` as ``# KEY=VALUE``
    comments (what smoke keeps between rounds: node/hold.py), then ``key=value``
    lines."""
    expiry = (now + ttl).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [
        "# Written by buildmatrix smoke; rewritten on every run, do not edit.",
        f"# +expiry-time={expiry}",
        # one line each; never "# +...", which NFD would read as a directive
        *(f"# {k}={' '.join(v.split())}" for k, v in (notes or {}).items()),
        *(f"{k}={v}" for k, v in sorted(labels.items())),
    ]
    text = "\n".join(lines) + "\n"
    if len(text.encode()) > MAX_FEATURE_FILE:  # pragma: no cover - labels are few and short
        raise InputError(f"feature file would be {len(text)} bytes; NFD reads at most 64 KiB.")
    return text


def read_feature_file(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and the ``# KEY=VALUE`` notes of a feature file smoke wrote (both
    empty where there is none, or it cannot be read: no earlier verdict then)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}, {}
    labels: dict[str, str] = {}
    notes: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# ") and not line.startswith("# +") and "=" in line:
            key, _, value = line[2:].partition("=")
            notes[key] = value
        elif line and not line.startswith("#"):
            key, _, value = line.partition("=")
            labels[key] = value or "true"  # NFD: a key without value is "true"
    return labels, notes


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` by rename, so NFD never reads half a file.

    The temporary file is a dot file in the same folder: NFD skips dot files.
    """
    folder = path.parent
    if not folder.is_dir():
        raise InputError(
            f"--nfd-file {path}: folder {folder} does not exist; mount NFD's features.d "
            "there (e.g. /etc/kubernetes/node-feature-discovery/features.d)."
        )
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            Path(tmp).chmod(0o644)
            Path(tmp).replace(path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise InputError(f"--nfd-file {path}: cannot write: {exc.strerror}.") from None


def node_feature(labels: Mapping[str, str], *, node: str, namespace: str) -> dict[str, Any]:
    """A ``NodeFeature`` object for clusters where NFD reads features from the API."""
    return {
        "apiVersion": NODEFEATURE_API,
        "kind": "NodeFeature",
        "metadata": {
            "name": f"buildmatrix-features-for-{node}",
            "namespace": namespace,
            "labels": {"nfd.node.kubernetes.io/node-name": node},
        },
        "spec": {"labels": dict(sorted(labels.items()))},
    }
