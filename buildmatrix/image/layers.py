"""Layer tars: what each layer holds, and the filesystem the layers make together.

Each layer is read once, as a stream, into a :class:`LayerSummary`: every path
with its kind, the whiteouts and opaque folders, and for files that may hold
device code (ELF, fatbinary, ``.ptx``) the inspection result. Layers are
independent, so they can be summarised in parallel and in any order; :func:`merge`
then applies them in order with the OCI image-spec layer semantics (whiteout
``.wh.NAME`` removes NAME, ``.wh..wh..opq`` hides everything lower in its folder)
and resolves links inside the image root only, never on the host.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Literal, cast

from buildmatrix.binary.elf import is_elf
from buildmatrix.binary.fatbin import FATBIN_MAGIC_BYTES
from buildmatrix.binary.scan import FileReport, ScanProblem, inspect_source
from buildmatrix.binary.source import BytesSource, CorruptBinary, FileSource
from buildmatrix.errors import InputError

# Files up to this size are inspected in memory; larger candidates are spooled to a
# private temporary file (deleted at once), so memory stays bounded per worker.
SPOOL_LIMIT = 64 << 20
_CHUNK = 1 << 20
# tarfile's stream mode copies its whole buffer on every read, so its buffer must be
# small (headers are read 512 bytes at a time) while the reader below it does the
# large reads: 64 KiB measured fastest (docs/check.md).
TAR_BUFSIZE = 256 << 10
_MAX_LINK_HOPS = 40  # as Linux's path resolution (MAXSYMLINKS)

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"

Kind = Literal["file", "dir", "symlink", "hardlink", "other"]
Result = FileReport | ScanProblem | None


@dataclass(frozen=True, slots=True)
class Node:
    kind: Kind
    target: str = ""  # symlink target as written, or hard-link target path
    result: Result = None


@dataclass
class LayerSummary:
    name: str
    entries: dict[str, Node] = field(default_factory=dict)
    whiteouts: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)


def clean_member_name(name: str, *, layer: str) -> str:
    """Normalise a tar member name; refuse one that escapes the root, as Docker does."""
    path = posixpath.normpath("/" + name.lstrip("/")) if name not in ("", ".", "./") else "/"
    raw = posixpath.normpath(name.lstrip("/") or ".")
    if raw == ".." or raw.startswith("../"):
        raise InputError(
            f"{layer}: entry '{name}' escapes the image root; the image is refused "
            "(Docker refuses such layers too)."
        )
    return path.lstrip("/")


def _might_hold_code(head: bytes, path: str) -> bool:
    return is_elf(head) or head[:4] == FATBIN_MAGIC_BYTES or path.endswith(".ptx")


def _inspect_member(
    data: IO[bytes], size: int, path: str, head: bytes, keep: Path | None
) -> Result:
    """Inspect a member; with ``keep``, files with device code stay there (load test)."""
    try:
        if size <= SPOOL_LIMIT and keep is None:
            blob = head + data.read(size - len(head))
            return inspect_source(BytesSource(blob, name=path), path=path)
        with tempfile.NamedTemporaryFile(
            prefix="buildmatrix-", dir=keep, delete=keep is None
        ) as spool:
            spool.write(head)
            while chunk := data.read(_CHUNK):
                spool.write(chunk)
            spool.flush()
            report = inspect_source(FileSource(spool.fileno(), name=path), path=path)
        if keep is None:
            return report
        if report is None:
            Path(spool.name).unlink()
            return None
        return replace(report, stored=spool.name)
    except CorruptBinary as exc:
        return ScanProblem(path=path, message=str(exc))


def open_tar_stream(stream: IO[bytes], *, name: str) -> tarfile.TarFile:
    """A streaming tar reader over a plain, gzip or zstd layer (by magic bytes)."""
    buffered = (
        stream
        if isinstance(stream, io.BufferedReader)
        else io.BufferedReader(cast(io.RawIOBase, stream), buffer_size=_CHUNK)
    )
    magic = buffered.peek(4)[:4]
    if magic[:2] == b"\x1f\x8b":
        # ISA-L's gzip reader decompresses ~1.7x faster than zlib's (docs/check.md).
        from isal import igzip

        gunzipped = igzip.IGzipFile(fileobj=buffered, mode="rb")  # type: ignore[no-untyped-call]
        return tarfile.open(fileobj=gunzipped, mode="r|", bufsize=TAR_BUFSIZE)
    if magic == b"\x28\xb5\x2f\xfd":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(buffered, read_size=_CHUNK)
        return tarfile.open(fileobj=reader, mode="r|", bufsize=TAR_BUFSIZE)
    return tarfile.open(fileobj=buffered, mode="r|", bufsize=TAR_BUFSIZE)


def scan_layer(stream: IO[bytes], *, name: str, keep: Path | None = None) -> LayerSummary:
    """Read one layer tar stream into a summary; device code is inspected on the way.

    With ``keep`` (a private folder), every file with device code is kept there and
    its report says where (``FileReport.stored``).
    """
    summary = LayerSummary(name=name)
    try:
        with open_tar_stream(stream, name=name) as tar:
            for member in tar:
                path = clean_member_name(member.name, layer=name)
                if not path:
                    continue
                folder, base = posixpath.split(path)
                if base == OPAQUE:
                    summary.opaque.append(folder)
                    continue
                if base.startswith(WHITEOUT):
                    summary.whiteouts.append(posixpath.join(folder, base[len(WHITEOUT) :]))
                    continue
                if member.isdir():
                    summary.entries[path] = Node("dir")
                elif member.issym():
                    summary.entries[path] = Node("symlink", member.linkname)
                elif member.islnk():
                    target = clean_member_name(member.linkname, layer=name)
                    summary.entries[path] = Node("hardlink", target)
                elif member.isreg():
                    result = _file_result(tar, member, path, keep)
                    summary.entries[path] = Node("file", result=result)
                else:
                    summary.entries[path] = Node("other")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InputError(
            f"{name}: not a readable layer tar ({exc}); the blob is truncated or corrupt."
        ) from None
    return summary


def _file_result(
    tar: tarfile.TarFile, member: tarfile.TarInfo, path: str, keep: Path | None
) -> Result:
    if member.size < 4:
        return None
    data = tar.extractfile(member)
    if data is None:  # pragma: no cover - regular members always have data
        return None
    head = data.read(64)
    if not _might_hold_code(head, path):
        return None
    return _inspect_member(data, member.size, path, head, keep)


# ---------------------------------------------------------------- the merged view


@dataclass
class _Dir:
    children: dict[str, _Entry] = field(default_factory=dict)


@dataclass
class _Leaf:
    node: Node


_Entry = _Dir | _Leaf


class ImageTree:
    """The final filesystem of an image, built by applying layer summaries in order."""

    def __init__(self) -> None:
        self.root = _Dir()

    def _resolve_dir(self, path: str, *, create: bool) -> _Dir | None:
        """The folder at ``path``, following symlinks inside the root (never the host)."""
        parts = [p for p in path.split("/") if p]
        current = self.root
        stack: list[_Dir] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                current = stack.pop() if stack else self.root
                continue
            child = current.children.get(part)
            if isinstance(child, _Leaf) and child.node.kind == "symlink":
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    return None  # a loop: nothing can be written through it
                target = child.node.target
                if target.startswith("/"):
                    current, stack = self.root, []
                parts = [p for p in target.split("/") if p] + parts
                continue
            if child is None and create:
                child = _Dir()
                current.children[part] = child
            if not isinstance(child, _Dir):
                return None
            stack.append(current)
            current = child
        return current

    def apply(self, layer: LayerSummary) -> None:
        for folder in layer.opaque:
            target = self._resolve_dir(folder, create=False)
            if target is not None:
                target.children.clear()
        for path in layer.whiteouts:
            folder, base = posixpath.split(path)
            parent = self._resolve_dir(folder, create=False)
            if parent is not None:
                parent.children.pop(base, None)
        for path, node in layer.entries.items():
            folder, base = posixpath.split(path)
            parent = self._resolve_dir(folder, create=True)
            if parent is None:
                continue  # written through a symlink loop: no container could see it
            if node.kind == "dir":
                if not isinstance(parent.children.get(base), _Dir):
                    parent.children[base] = _Dir()
            elif node.kind == "hardlink":
                parent.children[base] = _Leaf(self._link_target(node.target))
            else:
                parent.children[base] = _Leaf(node)

    def _link_target(self, path: str) -> Node:
        folder, base = posixpath.split(path)
        parent = self._resolve_dir(folder, create=False)
        entry = parent.children.get(base) if parent else None
        return entry.node if isinstance(entry, _Leaf) else Node("other")

    def files(self) -> Iterator[tuple[str, Node]]:
        """Every non-folder entry as (path, node), sorted by path."""
        stack: list[tuple[str, _Dir]] = [("", self.root)]
        while stack:
            prefix, folder = stack.pop()
            subfolders = []
            for name in sorted(folder.children):
                child = folder.children[name]
                path = f"{prefix}{name}"
                if isinstance(child, _Dir):
                    subfolders.append((f"{path}/", child))
                else:
                    yield path, child.node
            stack.extend(reversed(subfolders))


def merge(layers: list[LayerSummary]) -> ImageTree:
    tree = ImageTree()
    for layer in layers:
        tree.apply(layer)
    return tree
