"""What the node checks and the load test produce: one named verdict per check
(:class:`NodeCheck`) and one load test's outcome (:class:`LoadResult`). Data only;
node/checks.py runs the checks, node/loadtest.py fills a :class:`LoadResult`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class NodeCheck:
    name: str
    ok: bool
    message: str
    warning: bool = False  # ok, but worth a look (persistence mode off)
    # failed only because the GPUs are busy with other work (node/hold.py)
    busy: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "message": self.message, "warning": self.warning}


@dataclass(frozen=True, kw_only=True)
class LoadResult:
    """``--load-test`` of one image on one GPU model (node/loadtest.py fills it)."""

    image: str
    model: str
    loaded: int
    jit: int
    jit_seconds: float = 0.0
    failures: tuple[str, ...] = ()
    files: tuple[str, ...] = ()  # one line per file: how it loaded, or its errors
    error: str | None = None  # the load test could not run (to the end)
    busy: bool = False  # every GPU of the model refused it a context or memory (loadtest.Busy)
