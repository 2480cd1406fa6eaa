"""A cache of layer summaries, keyed by the layer blob's digest.

A layer is content-addressed: a blob whose digest was verified while it was read
always summarises to the same thing, so its summary (buildmatrix.image.tree) can be
kept and reused by every image that shares the layer: the variants of a build matrix
share their base layers, and checking them all then reads those layers once.

- Only blobs with a digest that the read verified are cached (OCI layouts,
  registries); the engine's ``docker save`` stream and legacy archives are not.
- Each entry holds the SHA-256 of its own content, checked on every read: an entry
  that does not match (a torn write, a disk error, a hand edit) is deleted and the
  layer read again. Entries are written to a temporary name and renamed.
- Entries are per scanner format and buildmatrix version: a new version never reads
  an older one's summaries.
- The folder is bounded (``max_bytes``): after a write, the least recently used
  entries go until the rest fit.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import gzip
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from buildmatrix import __version__
from buildmatrix.arch import Arch, parse_arch
from buildmatrix.binary.fatbin import EntryKind, FatbinEntry
from buildmatrix.binary.scan import FileReport, ScanProblem
from buildmatrix.errors import BuildmatrixError
from buildmatrix.forward import CompatLibrary
from buildmatrix.image.tree import WHITED_OUT, Dir, Entry, LayerSummary, Leaf, Node

FORMAT = 1
DEFAULT_MAX_BYTES = 1 << 30
_ACTIVE: contextvars.ContextVar[LayerCache | None] = contextvars.ContextVar(
    "buildmatrix_layer_cache", default=None
)


def default_folder() -> Path:
    """``$XDG_CACHE_HOME/buildmatrix/layers``, else ``~/.cache/buildmatrix/layers``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "buildmatrix" / "layers"


class LayerCache:
    def __init__(self, folder: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = folder / f"v{FORMAT}-{__version__}"
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.discarded = 0
        # Summaries read or written in this process: images of one run that share a
        # layer share its summary (summaries are never changed once made).
        self._memory: dict[str, LayerSummary] = {}
        self._written = False

    def _path(self, digest: str) -> Path | None:
        algo, _, hexdigest = digest.partition(":")
        if algo not in ("sha256", "sha512") or not hexdigest.isalnum():
            return None
        return self.root / algo / f"{hexdigest}.json.gz"

    def get(self, digest: str) -> LayerSummary | None:
        path = self._path(digest)
        if path is None:
            return None
        if digest in self._memory:
            self.hits += 1
            return self._memory[digest]
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        summary = _verified(data, digest)
        if summary is None:
            self.discarded += 1
            self.misses += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used
        self.hits += 1
        self._memory[digest] = summary
        return summary

    def put(self, digest: str, summary: LayerSummary) -> None:
        path = self._path(digest)
        if path is None:
            return
        self._memory[digest] = summary
        payload = gzip.compress(
            json.dumps({"digest": digest, "root": _dump_dir(summary.root)}).encode(), mtime=0
        )
        data = hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            Path(tmp).replace(path)
        except OSError:
            return  # a cache that cannot be written only costs time
        self._written = True

    def shared(self, key: str, make: Callable[[], LayerSummary]) -> LayerSummary:
        """The summary ``make`` gives for ``key``, made once per run and kept in memory
        only: for layers read where the engine stores them, which carry no digest
        this process verified, so nothing is written to the cache folder."""
        if key in self._memory:
            self.hits += 1
            return self._memory[key]
        summary = self._memory[key] = make()
        return summary

    def evict(self) -> None:
        """Keep the folder within its bound, least recently used entries first; after
        a run that wrote to it (once, not after every write: it lists the folder)."""
        if not self._written:
            return
        self._written = False
        entries = []
        for p in self.root.glob("*/*.json.gz"):
            with contextlib.suppress(OSError):
                st = p.stat()
                entries.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        for _, size, p in sorted(entries):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                p.unlink()
                total -= size


@contextlib.contextmanager
def use(cache: LayerCache | None) -> Iterator[LayerCache | None]:
    """Make ``cache`` the one layer scans consult in this context; on leaving it, the
    cache folder is brought back within its bound."""
    token = _ACTIVE.set(cache)
    try:
        yield cache
    finally:
        _ACTIVE.reset(token)
        if cache is not None:
            cache.evict()


def active() -> LayerCache | None:
    return _ACTIVE.get()


# ------------------------------------------------------------------ serialisation


def _verified(data: bytes, digest: str) -> LayerSummary | None:
    checksum, _, payload = data.partition(b"\n")
    if hashlib.sha256(payload).hexdigest().encode() != checksum:
        return None
    try:
        doc = json.loads(gzip.decompress(payload))
        if doc.get("digest") != digest:
            return None
        summary = LayerSummary(name=digest)
        summary.root = _load_dir(doc["root"])
    except (OSError, ValueError, KeyError, TypeError, EOFError, InvalidVersion, BuildmatrixError):
        return None
    return summary


def _dump_dir(folder: Dir) -> dict[str, Any]:
    return {
        "opaque": folder.opaque,
        "children": {name: _dump_entry(entry) for name, entry in folder.children.items()},
    }


def _dump_entry(entry: Entry) -> Any:
    if entry is WHITED_OUT:
        return {"whiteout": True}
    if isinstance(entry, Dir):
        return {"dir": _dump_dir(entry)}
    assert isinstance(entry, Leaf)
    node = entry.node
    return {"kind": node.kind, "target": node.target, "result": _dump_result(node.result)}


def _dump_result(result: Any) -> Any:
    if result is None:
        return None
    if isinstance(result, FileReport):
        return {
            "report": {
                "path": result.path,
                "format": result.format,
                "entries": [_dump_fatbin_entry(e) for e in result.entries],
            }
        }
    if isinstance(result, ScanProblem):
        return {"problem": {"path": result.path, "message": result.message}}
    assert isinstance(result, CompatLibrary)
    return {
        "compat": {
            "path": result.path,
            "note": result.note,
            "cuda": result.cuda,
            "branches": list(result.branches),
            "devices": list(result.devices) if result.devices is not None else None,
            "problem": result.problem,
            "undetermined": result.undetermined,
            "code": _dump_result(result.code),
        }
    }


def _dump_fatbin_entry(e: FatbinEntry) -> dict[str, Any]:
    return {
        "kind": e.kind.value,
        "arch": str(e.arch),
        "ptx_isa": str(e.ptx_isa) if e.ptx_isa is not None else None,
        "compressed": e.compressed,
        "size": e.size,
        "offset": e.offset,
        "container": e.container,
        "kernels": list(e.kernels) if e.kernels is not None else None,
        "toolkit": str(e.toolkit) if e.toolkit is not None else None,
        "embedded": e.embedded,
    }


def _load_dir(doc: dict[str, Any]) -> Dir:
    folder = Dir(opaque=bool(doc["opaque"]))
    for name, entry in doc["children"].items():
        folder.children[name] = _load_entry(entry)
    return folder


def _load_entry(doc: dict[str, Any]) -> Entry:
    if doc.get("whiteout"):
        return WHITED_OUT
    if "dir" in doc:
        return _load_dir(doc["dir"])
    return Leaf(Node(doc["kind"], doc["target"], _load_result(doc["result"])))


def _load_result(doc: Any) -> Any:
    if doc is None:
        return None
    if "report" in doc:
        r = doc["report"]
        entries = tuple(_load_fatbin_entry(e) for e in r["entries"])
        return FileReport(path=r["path"], format=r["format"], entries=entries)
    if "problem" in doc:
        return ScanProblem(path=doc["problem"]["path"], message=doc["problem"]["message"])
    c = doc["compat"]
    code = _load_result(c["code"])
    return CompatLibrary(
        path=c["path"],
        note=bool(c["note"]),
        cuda=str(c["cuda"]),
        branches=tuple(int(b) for b in c["branches"]),
        devices=tuple(c["devices"]) if c["devices"] is not None else None,
        problem=c["problem"],
        undetermined=c["undetermined"],
        code=code if isinstance(code, FileReport) else None,
    )


@functools.cache
def _arch(text: str) -> Arch:
    return parse_arch(text)


@functools.cache
def _version(text: str) -> Version:
    return Version(text)


def _load_fatbin_entry(d: dict[str, Any]) -> FatbinEntry:
    return FatbinEntry(
        kind=EntryKind(d["kind"]),
        arch=_arch(d["arch"]),
        ptx_isa=_version(d["ptx_isa"]) if d["ptx_isa"] is not None else None,
        compressed=bool(d["compressed"]),
        size=int(d["size"]),
        offset=int(d["offset"]),
        container=int(d["container"]),
        kernels=tuple(d["kernels"]) if d["kernels"] is not None else None,
        toolkit=_version(d["toolkit"]) if d["toolkit"] is not None else None,
        embedded=bool(d["embedded"]),
    )
