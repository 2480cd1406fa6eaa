"""Where containerd's stores are (image/containerd.py reads them): the root folder,
the namespace and the socket, as ``ctr`` and the daemon take them.

Apart from the reader so that a command can carry its ``--containerd-*`` options
without importing the image readers it may never use (``smoke`` on a node with no
image to check; docs/development.md, "Start-up time").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = "/var/lib/containerd"
DEFAULT_ADDRESS = "/run/containerd/containerd.sock"
DEFAULT_NAMESPACE = "k8s.io"


@dataclass(frozen=True, kw_only=True)
class Store:
    root: Path
    namespace: str
    address: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Store:
        return cls(
            root=Path(env.get("CONTAINERD_ROOT") or DEFAULT_ROOT),
            namespace=env.get("CONTAINERD_NAMESPACE") or DEFAULT_NAMESPACE,
            address=env.get("CONTAINERD_ADDRESS") or DEFAULT_ADDRESS,
        )
