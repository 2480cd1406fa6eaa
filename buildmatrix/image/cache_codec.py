"""How a layer summary is written to and read from the layer cache (buildmatrix.image.
cache): gzip-compressed JSON lines behind the SHA-256 of their bytes, checked on every
read.

A change here changes what an entry means: the cache keys entries by a fingerprint of
this module's source among others (``cache.fingerprint``), so an old entry is never
read by a new codec.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import io
import json
import sys
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from packaging.version import InvalidVersion, Version

from buildmatrix.arch import Arch, parse_arch
from buildmatrix.binary.cudart import CudaRuntime
from buildmatrix.binary.dynamic import SearchPaths
from buildmatrix.binary.fatbin import EntryKind, FatbinEntry
from buildmatrix.binary.ldconf_file import ConfFile
from buildmatrix.binary.report import FileReport, Links, ScanProblem
from buildmatrix.errors import BuildmatrixError
from buildmatrix.forward import CompatLibrary
from buildmatrix.image.tree import PLAIN_FILE, WHITED_OUT, Dir, Inode, LayerSummary, Leaf

# The payload, gzip-compressed: a first line {"digest": ...}, then one JSON array a
# line per entry of the layer tree, each folder before its entries, an entry naming
# its folder by the number of that folder's line among the folders (the root: 0):
#   ["d", folder, name, opaque]        a folder
#   ["f", folder, name]                a plain file (no device code read)
#   ["l", folder, name, kind, target, result]   any other leaf
#   ["w", folder, name]                a whiteout
# Written and read line by line, a layer of a million entries never becomes a
# million JSON objects at once (a document of nested objects held ~250 B an entry
# twice over, as it was built and as it was parsed), and no folder depth is too deep.
_CHUNK = 1 << 16


def encode(digest: str, summary: LayerSummary) -> bytes:
    """An entry's bytes: the SHA-256 of the payload, a newline, the payload."""
    pack = zlib.compressobj(9, zlib.DEFLATED, 31)  # a gzip stream, as gzip.compress
    parts: list[bytes] = []
    pending: list[str] = [json.dumps({"digest": digest, "opaque": summary.root.opaque}), "\n"]
    size = 0
    for line in _lines(summary.root):
        pending.append(line)
        size += len(line)
        if size >= _CHUNK:
            parts.append(pack.compress("".join(pending).encode()))
            pending, size = [], 0
    parts.append(pack.compress("".join(pending).encode()))
    parts.append(pack.flush())
    payload = b"".join(parts)
    return hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def _lines(root: Dir) -> Iterator[str]:
    """The entry lines of a tree, folders numbered as their lines come."""
    plain = PLAIN_FILE.inode
    numbered = 0
    stack: list[tuple[int, Dir]] = [(0, root)]
    while stack:
        at, folder = stack.pop()
        for name, entry in folder.children.items():
            key = json.dumps(name)
            if entry is WHITED_OUT:
                yield f'["w", {at}, {key}]\n'
            elif isinstance(entry, Dir):
                numbered += 1
                yield f'["d", {at}, {key}, {"true" if entry.opaque else "false"}]\n'
                stack.append((numbered, entry))
            else:
                assert isinstance(entry, Leaf)
                inode = entry.inode
                if inode == plain:
                    yield f'["f", {at}, {key}]\n'
                else:
                    rest = json.dumps([inode.kind, inode.target, _dump_result(inode.result)])
                    yield f'["l", {at}, {key}, {rest[1:]}\n'


def decode(data: bytes, digest: str) -> LayerSummary | None:
    """The summary an entry holds; None when it is damaged or names another digest."""
    checksum, _, payload = data.partition(b"\n")
    if hashlib.sha256(payload).hexdigest().encode() != checksum:
        return None
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(payload)) as lines:
            head = json.loads(lines.readline())
            if not isinstance(head, dict) or head.get("digest") != digest:
                return None
            summary = LayerSummary(name=digest)
            summary.root, summary.entries = _load(lines, opaque=bool(head["opaque"]))
    except (OSError, ValueError, KeyError, TypeError, EOFError, InvalidVersion, BuildmatrixError):
        return None
    return summary


def _load(lines: Iterable[bytes], *, opaque: bool) -> tuple[Dir, int]:
    """The tree the entry lines make, and how many entries it holds."""
    root = Dir(opaque=opaque)
    folders = [root]
    count = 0
    for line in lines:
        count += 1
        kind, at, name, *rest = json.loads(line)
        children = folders[at].children
        if kind == "d":
            folder = children[name] = Dir(opaque=bool(rest[0]))
            folders.append(folder)
        elif kind == "f":
            children[name] = PLAIN_FILE
        elif kind == "w":
            children[name] = WHITED_OUT
        elif kind == "l":
            children[name] = Leaf(Inode(rest[0], rest[1], _load_result(rest[2])))
        else:
            raise ValueError(f"an entry of kind {kind!r}")
    return root, count


def _dump_result(result: Any) -> Any:
    if result is None:
        return None
    if isinstance(result, FileReport):
        return {
            "report": {
                "path": result.path,
                "format": result.format,
                "entries": [_dump_fatbin_entry(e) for e in result.entries],
                "links": _dump_links(result.links),
            }
        }
    if isinstance(result, ScanProblem):
        return {"problem": {"path": result.path, "message": result.message}}
    if isinstance(result, ConfFile):
        text = base64.b64encode(result.text).decode() if result.text is not None else None
        return {"conf": {"path": result.path, "size": result.size, "text": text}}
    if isinstance(result, CudaRuntime):
        release = str(result.release) if result.release is not None else None
        return {
            "runtime": {
                "path": result.path,
                "release": release,
                "how": result.how,
                "inner": _dump_result(result.inner),
            }
        }
    if isinstance(result, SearchPaths):
        doc = {
            "path": result.path,
            "search": list(result.search),
            "code": _dump_result(result.code),
            "links": _dump_links(result.links),
        }
        return {"search": doc}
    assert isinstance(result, CompatLibrary)
    return {
        "compat": {
            "path": result.path,
            "elf": result.elf,
            "note": result.note,
            "cuda": result.cuda,
            "branches": list(result.branches),
            "devices": list(result.devices) if result.devices is not None else None,
            "problem": result.problem,
            "undetermined": result.undetermined,
            "code": _dump_result(result.code),
            "soname": result.soname,
            "ld_skip": result.ld_skip,
            "ld_unknown": result.ld_unknown,
            "machine": result.machine,
        }
    }


def _dump_links(links: Links | None) -> dict[str, Any] | None:
    if links is None:
        return None
    return {
        "soname": links.soname,
        "needed": list(links.needed),
        "program": links.program,
        "python_module": links.python_module,
        "unread": links.unread,
    }


def _load_links(doc: dict[str, Any] | None) -> Links | None:
    if doc is None:
        return None
    return Links(
        soname=None if doc["soname"] is None else str(doc["soname"]),
        needed=tuple(sys.intern(str(n)) for n in doc["needed"]),
        program=bool(doc["program"]),
        python_module=bool(doc["python_module"]),
        unread=None if doc["unread"] is None else str(doc["unread"]),
    )


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


def _load_result(doc: Any) -> Any:
    if doc is None:
        return None
    if "report" in doc:
        r = doc["report"]
        entries = tuple(_load_fatbin_entry(e) for e in r["entries"])
        links = _load_links(r["links"])
        return FileReport(path=r["path"], format=r["format"], entries=entries, links=links)
    if "problem" in doc:
        return ScanProblem(path=doc["problem"]["path"], message=doc["problem"]["message"])
    if "conf" in doc:
        f = doc["conf"]
        text = base64.b64decode(f["text"], validate=True) if f["text"] is not None else None
        return ConfFile(path=str(f["path"]), size=int(f["size"]), text=text)
    if "runtime" in doc:
        r = doc["runtime"]
        release = _version(r["release"]) if r["release"] is not None else None
        inner = _load_result(r["inner"])
        return CudaRuntime(path=str(r["path"]), release=release, how=str(r["how"]), inner=inner)
    if "search" in doc:
        f, code = doc["search"], _load_result(doc["search"]["code"])
        search = tuple(sys.intern(str(s)) for s in f["search"])
        report = code if isinstance(code, FileReport) else None
        links = _load_links(f["links"])
        return SearchPaths(path=str(f["path"]), search=search, code=report, links=links)
    c = doc["compat"]
    code = _load_result(c["code"])
    return CompatLibrary(
        path=c["path"],
        elf=bool(c["elf"]),
        note=bool(c["note"]),
        cuda=str(c["cuda"]),
        branches=tuple(int(b) for b in c["branches"]),
        devices=tuple(c["devices"]) if c["devices"] is not None else None,
        problem=c["problem"],
        undetermined=c["undetermined"],
        code=code if isinstance(code, FileReport) else None,
        soname=c["soname"],
        ld_skip=c["ld_skip"],
        ld_unknown=c["ld_unknown"],
        machine=str(c["machine"]),
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
