"""Layer tars: what each layer holds, and the filesystem the layers make together.

The model is the one the overlay2 graph driver and containerd's overlayfs
snapshotter implement, checked against a real overlay2 engine in the tests
(tests/test_layer_semantics.py); docs/check.md, "Layer semantics", spells it out:

- Each layer is read once, as a stream, into a :class:`LayerSummary`: the tree the
  layer's entries make when extracted, in archive order, into an empty folder (the
  layer's "diff" folder). Inside that folder symlinks the same layer made are
  followed (the extraction is chrooted there, so nothing leaves it); missing parent
  folders are created; a whiteout ``.wh.NAME`` becomes a whiteout mark and
  ``.wh..wh..opq`` marks its folder opaque; a hard link is bound to what its
  target holds at that point. What the engine refuses (a path given twice, a hard
  link to a file the layer does not hold, an entry under a file, a whiteout over an
  entry of the same layer) is refused here too.
- :func:`merge` stacks the layers as overlayfs does, by literal names: an upper
  folder merges with a lower folder (all of it, if the upper one is opaque), an
  upper folder over a lower non-folder replaces it, an upper whiteout hides the
  lower name, anything else in the upper layer replaces the lower entry. Symlinks of
  lower layers are never followed: they matter only when the final view is queried.

Layers are independent, so they are summarised in parallel and in any order.
"""

from __future__ import annotations

import io
import posixpath
import re
import tarfile
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Literal, NoReturn, Self, cast

from buildmatrix.binary.archive import is_archive
from buildmatrix.binary.elf import is_elf
from buildmatrix.binary.fatbin import FATBIN_MAGIC_BYTES
from buildmatrix.binary.ptx import looks_like_ptx
from buildmatrix.binary.scan import FileReport, ScanProblem, inspect_image_file
from buildmatrix.binary.source import BytesSource, CorruptBinary, FileSource, SliceSource
from buildmatrix.errors import InputError
from buildmatrix.forward import COMPAT_NAME, CompatLibrary
from buildmatrix.image.workers import run_all

# Files up to this size are inspected in memory; larger candidates are spooled to a
# private temporary file (deleted at once), so memory stays bounded per worker.
SPOOL_LIMIT = 64 << 20
_CHUNK = 1 << 20
# Tar streams are read with tarfile's seekable reader over a forward-only stream
# (ForwardReader): headers come from a buffer of this size, file data is read straight
# into the caller's buffer or dropped, and never copied through tarfile's stream
# buffer (its "r|" mode copies its whole buffer on every read).
TAR_BUFSIZE = 256 << 10
_MAX_LINK_HOPS = 40  # as Linux's path resolution (MAXSYMLINKS)
PATH_MAX = 4096  # Linux: no path or symlink target is longer

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"

Kind = Literal["file", "dir", "symlink", "hardlink", "other"]
Result = FileReport | CompatLibrary | ScanProblem | None


@dataclass(frozen=True, slots=True)
class Node:
    kind: Kind
    target: str = ""  # symlink target as written, or hard-link target path
    result: Result = None


@dataclass
class _Dir:
    children: dict[str, _Entry] = field(default_factory=dict)
    opaque: bool = False


@dataclass(frozen=True, slots=True)
class _Leaf:
    node: Node


class _Whiteout:
    """A whiteout mark: the name is hidden in every lower layer."""


WHITED_OUT = _Whiteout()
_Entry = _Dir | _Leaf | _Whiteout


class LayerSummary:
    """One layer as its entries make it when extracted into an empty folder."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.root = _Dir()
        self._names: set[str] = set()

    def _refuse(self, why: str) -> NoReturn:
        raise InputError(
            f"{self.name}: {why}; the Docker engine refuses such a layer too, so the image "
            "is refused. Nothing was checked."
        )

    def claim(self, path: str) -> None:
        """Each path once per layer: the engine refuses duplicates."""
        if path in self._names:
            self._refuse(f"'{path}' appears twice in the layer")
        self._names.add(path)

    def _folder(self, parts: list[str], *, create: bool, what: str) -> _Dir:
        """The folder ``parts`` name, following this layer's symlinks inside its root.

        Missing folders are created (as the engine's MkdirAll does), except along a
        symlink's own target, which must exist.
        """
        current, parents = self.root, list[_Dir]()
        queue = deque((p, False) for p in parts)
        hops = 0
        while queue:
            part, via_link = queue.popleft()
            if part in ("", "."):
                continue
            if part == "..":
                current = parents.pop() if parents else self.root
                continue
            child = current.children.get(part)
            if child is None:
                if via_link or not create:
                    self._refuse(
                        f"'{what}' is written through a symlink whose target the layer "
                        "does not hold"
                    )
                child = current.children[part] = _Dir()
            if isinstance(child, _Leaf) and child.node.kind == "symlink":
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    self._refuse(f"'{what}' is written through a symlink loop")
                if child.node.target.startswith("/"):
                    current, parents = self.root, []
                queue.extendleft((p, True) for p in reversed(child.node.target.split("/")))
                continue
            if not isinstance(child, _Dir):
                self._refuse(f"'{what}' is under '{part}', which is not a folder in the layer")
            parents.append(current)
            current = child
        return current

    def _parent(self, path: str) -> tuple[_Dir, str]:
        *folders, base = path.split("/")
        return self._folder(folders, create=True, what=path), base

    def add(self, path: str, node: Node) -> None:
        """A folder, file, symlink or other entry: it replaces what the path held."""
        if node.kind == "symlink" and len(node.target) >= PATH_MAX:
            self._refuse(f"symlink '{path}' has a target longer than PATH_MAX ({PATH_MAX})")
        folder, base = self._parent(path)
        if node.kind == "dir":
            if not isinstance(folder.children.get(base), _Dir):
                folder.children[base] = _Dir()
        else:
            folder.children[base] = _Leaf(node)

    def add_hardlink(self, path: str, target: str) -> None:
        """Bound to what ``target`` holds now, in this layer (the engine links in it)."""
        *folders, base = target.split("/")
        entry = self._folder(folders, create=False, what=target).children.get(base)
        if not isinstance(entry, _Leaf):
            self._refuse(f"hard link '{path}' points at '{target}', which the layer does not hold")
        folder, name = self._parent(path)
        folder.children[name] = entry

    def whiteout(self, path: str) -> None:
        folder, base = self._parent(path)
        if base in folder.children:
            self._refuse(f"whiteout of '{path}' over an entry of the same layer")
        folder.children[base] = WHITED_OUT

    def make_opaque(self, path: str) -> None:
        """Mark the marker's folder opaque. The engine sets an xattr on whatever the
        path holds: on a file of this layer that has no effect, so it is accepted."""
        if not path:
            self.root.opaque = True
            return
        folder, base = self._parent(path)
        entry = folder.children.get(base)
        if entry is None:
            entry = folder.children[base] = _Dir()
        elif isinstance(entry, _Leaf) and entry.node.kind == "symlink":
            entry = self._folder(path.split("/"), create=False, what=path)
        if isinstance(entry, _Dir):
            entry.opaque = True


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


class TarHeaderError(Exception):
    """A tar header two readers could read differently (kept apart from tarfile's own
    HeaderError, which tarfile turns into a silent end of the archive)."""


# Numeric fields of a header (POSIX ustar): mode, uid, gid, size, mtime, chksum,
# devmajor, devminor. Go's archive/tar (Docker, containerd) trims spaces and NULs on
# both sides and parses octal digits; Python's tarfile cuts at the first NUL and
# accepts what int(x, 8) accepts ("+7", "1_0"). Only forms both read alike pass.
_NUMERIC = (
    (100, 108),
    (108, 116),
    (116, 124),
    (124, 136),
    (136, 148),
    (148, 156),
    (329, 337),
    (337, 345),
)
_OCTAL = re.compile(rb" *[0-7]*[ \0]*")
_USTAR, _GNU, _V7 = b"ustar\x0000", b"ustar  \x00", b"\0" * 8
# Type flags container layers use: files, links, devices, folders, FIFOs, and the
# PAX and GNU long-name extension headers.
_TYPES = frozenset(b"\x0001234567xgLK")


class StrictTarInfo(tarfile.TarInfo):
    """tarfile's TarInfo, but every header block is first checked strictly."""

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        if buf and buf.count(0) != len(buf):  # empty and all-zero blocks: tarfile's ends
            _check_header(bytes(buf))
        return super().frombuf(buf, encoding, errors)


def _check_header(buf: bytes) -> None:
    if len(buf) != tarfile.BLOCKSIZE:
        raise TarHeaderError(f"a header is truncated ({len(buf)} bytes)")
    for start, end in _NUMERIC:
        field = buf[start:end]
        if field[0] & 0x80 == 0 and not _OCTAL.fullmatch(field):
            raise TarHeaderError(
                f"a header has a numeric field (bytes {start}..{end}) of {field!r}, which "
                "tar readers parse differently"
            )
    unsigned = sum(buf[:148]) + 8 * 32 + sum(buf[156:])
    if buf[148] & 0x80 or _field(buf, 148, 156) not in (unsigned, _signed(buf)):
        raise TarHeaderError("a header's checksum does not match")
    magic = buf[257:265]
    if buf[156] not in _TYPES:
        raise TarHeaderError(f"a header has the type flag {buf[156:157]!r}, not one of a layer")
    if magic == _USTAR:
        if buf[508:512] == b"tar\0" and 0 not in buf[345:476]:
            raise TarHeaderError("a header is ambiguous between the ustar and star formats")
    elif magic in (_GNU, _V7):
        # Neither format has a prefix field; Python's tarfile would still read one.
        if any(buf[345:500]):
            raise TarHeaderError("a header without a ustar prefix field has bytes in it")
        if magic == _V7 and any(buf[257:345]):
            raise TarHeaderError("a V7 header has bytes after its link name")
    else:
        raise TarHeaderError(f"a header has the unknown magic {magic!r}")


def _field(buf: bytes, start: int, end: int) -> int:
    digits = buf[start:end].strip(b" \0")
    return int(digits, 8) if digits else 0


def _signed(buf: bytes) -> int:
    """The checksum as some old tars compute it, over signed bytes."""
    signed = [b - 256 if b > 127 else b for b in buf]
    return sum(signed[:148]) + 8 * 32 + sum(signed[156:])


def _might_hold_code(head: bytes, path: str) -> bool:
    return (
        is_elf(head)
        or head[:4] == FATBIN_MAGIC_BYTES
        or is_archive(head)
        or looks_like_ptx(head, path)
    )


def _inspect_member(
    data: IO[bytes], size: int, path: str, head: bytes, keep: Path | None
) -> Result:
    """Inspect a member; with ``keep``, files with device code stay there (load test).

    A CUDA forward-compatibility driver (``…/compat/libcuda.so.X.Y``) is read for its
    note instead: it is the driver, not code of the image's own.
    """
    if is_elf(head) and COMPAT_NAME.search(path):
        keep = None  # the driver is not loaded by the load test
    try:
        if size <= SPOOL_LIMIT and keep is None:
            blob = head + data.read(size - len(head))
            return inspect_image_file(BytesSource(blob, name=path), path=path, head=head)
        with tempfile.NamedTemporaryFile(
            prefix="buildmatrix-", dir=keep, delete=keep is None
        ) as spool:
            spool.write(head)
            view = memoryview(bytearray(_CHUNK))
            while n := data.readinto(view):  # type: ignore[attr-defined]
                spool.write(view[:n])
            spool.flush()
            report = inspect_image_file(FileSource(spool.fileno(), name=path), path=path, head=head)
        if keep is None:
            return report
        if not isinstance(report, FileReport):  # no device code: nothing to keep
            Path(spool.name).unlink()
            return report
        return replace(report, stored=spool.name)
    except CorruptBinary as exc:
        return ScanProblem(path=path, message=str(exc))


GZIP_MAGIC, ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"  # how compression is told


def open_tar_stream(stream: IO[bytes], *, name: str) -> tarfile.TarFile:
    """A streaming tar reader over a plain, gzip or zstd layer (by magic bytes)."""
    buffered = (
        stream
        if isinstance(stream, io.BufferedReader)
        else io.BufferedReader(cast(io.RawIOBase, stream), buffer_size=_CHUNK)
    )
    magic = buffered.peek(4)[:4]
    if magic[:2] == GZIP_MAGIC:
        # ISA-L's gzip reader decompresses ~1.7x faster than zlib's (docs/check.md).
        from isal import igzip

        gunzipped = igzip.IGzipFile(fileobj=buffered, mode="rb")  # type: ignore[no-untyped-call]
        return _open(cast(IO[bytes], gunzipped))
    if magic == ZSTD_MAGIC:
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(buffered, read_size=_CHUNK)
        return _open(reader)
    return _open(buffered)


def _open(stream: IO[bytes]) -> tarfile.TarFile:
    return open_forward(stream, tarinfo=StrictTarInfo)


def open_forward(
    stream: IO[bytes], *, tarinfo: type[tarfile.TarInfo] = tarfile.TarInfo
) -> tarfile.TarFile:
    """tarfile's seekable reader over a stream read once, front to back."""
    buffered = io.BufferedReader(ForwardReader(stream), buffer_size=TAR_BUFSIZE)
    return tarfile.open(fileobj=buffered, mode="r:", tarinfo=tarinfo)


def member_data(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    """A regular member's bytes as a file object, read straight from the tar's
    stream; a sparse member through the tar reader's map."""
    if member.issparse() or tar.fileobj is None:
        data = tar.extractfile(member)  # its bytes are not one run of the stream
        if data is None:  # pragma: no cover - regular members always have data
            raise tarfile.ReadError(f"{member.name}: no data")
        return data
    stream = cast(IO[bytes], tar.fileobj)
    return cast(IO[bytes], _MemberData(stream, member.offset_data, member.size))


class _MemberData(io.RawIOBase):
    """A regular member's bytes, read straight from the tar's stream into the
    caller's buffer (tarfile's own member reader copies every read twice)."""

    def __init__(self, stream: IO[bytes], offset: int, size: int) -> None:
        super().__init__()
        self._stream, self._offset, self._size, self._pos = stream, offset, size, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        self._stream.seek(self._offset + self._pos)  # where the tar reader left it
        got = self._stream.readinto(memoryview(buffer)[:n])  # type: ignore[attr-defined]
        if not got:
            raise tarfile.ReadError("unexpected end of data")
        self._pos += got
        return int(got)


class ForwardReader(io.RawIOBase):
    """A stream read once, front to back, as a file tarfile's seekable reader can use:
    a seek forward reads and drops the bytes in between (a digest or progress count
    below still sees every byte), a seek back is an error. Member data the reader
    skips is so never copied into Python objects, nor the tar stream through
    tarfile's stream buffer."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__()
        self._stream = stream
        self._pos = 0
        self._scratch: bytearray | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        readinto = getattr(self._stream, "readinto", None)
        if readinto is not None:
            n = readinto(buffer) or 0
        else:
            data = self._stream.read(len(buffer))
            n = len(data)
            buffer[:n] = data
        self._pos += n
        return int(n)

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            pos += self._pos
        elif whence != io.SEEK_SET:
            raise OSError("a tar stream has no known end to seek from")
        if pos < self._pos:
            raise OSError(f"a tar stream cannot go back (from {self._pos} to {pos})")
        if self._scratch is None:
            self._scratch = bytearray(_CHUNK)
        view = memoryview(self._scratch)
        while self._pos < pos:
            if not self.readinto(view[: min(len(view), pos - self._pos)]):
                self._pos = pos  # the end: the next read returns nothing
                break
        return self._pos


def _check_end(tar: tarfile.TarFile) -> None:
    """After the first zero block, Go's reader wants a second one (or the end of the
    stream); Python's stops at the first. A header there would be read by neither
    the same way, so anything but zeros is refused."""
    rest = tar.fileobj.read(tarfile.BLOCKSIZE) if tar.fileobj is not None else b""
    if rest and (len(rest) != tarfile.BLOCKSIZE or any(rest)):
        raise TarHeaderError("data follows a single end-of-archive block")


def scan_layer(stream: IO[bytes], *, name: str, keep: Path | None = None) -> LayerSummary:
    """Read one layer tar stream into a summary; device code is inspected on the way.

    With ``keep`` (a private folder), every file with device code is kept there and
    its report says where (``FileReport.stored``).
    """
    with _read_as_layer(name), open_tar_stream(stream, name=name) as tar:
        return _summarise(tar, name, lambda member, path: _file_result(tar, member, path, keep))


def scan_layer_at(file: Path, offset: int, size: int, *, name: str) -> LayerSummary:
    """One layer whose tar lies in ``[offset, offset + size)`` of a regular file (a
    ``docker save`` archive): as :func:`scan_layer` reads it, but an uncompressed tar
    is read in place — headers only, each file that may hold device code inspected
    where it lies, the rest skipped — instead of streamed and spooled. A compressed
    layer is streamed."""
    import os

    fd = os.open(file, os.O_RDONLY)
    try:
        window = _Window(fd, offset, size)
        head = os.pread(fd, min(4, size), offset)
        if head[:2] == GZIP_MAGIC or head == ZSTD_MAGIC:
            return scan_layer(cast(IO[bytes], window), name=name)
        archive = FileSource(fd, name=str(file))
        with _read_as_layer(name):
            buffered = io.BufferedReader(window, buffer_size=TAR_BUFSIZE)
            with tarfile.open(fileobj=buffered, mode="r:", tarinfo=StrictTarInfo) as tar:
                ahead = _read_ahead(tar, archive, file, offset, size)
                end = buffered.tell()

                def in_place(member: tarfile.TarInfo, path: str) -> Result:
                    if member.offset in ahead:
                        return ahead[member.offset]
                    if member.size < 4:
                        return None
                    if member.issparse():  # its bytes are not one run of the file
                        result = _file_result(tar, member, path, None)
                        if ahead:
                            buffered.seek(end)  # where the end-of-archive check reads
                        return result
                    return _inspect_in_archive(_job(file, offset, size, member, path), archive)

                return _summarise(tar, name, in_place)
    finally:
        os.close(fd)


def _read_ahead(
    tar: tarfile.TarFile, archive: FileSource, file: Path, offset: int, size: int
) -> dict[int, Result]:
    """The device code of a layer's candidate files (regular, not sparse, whose first
    bytes may be code) by member offset, read by workers (buildmatrix.image.workers);
    none when the layer is small or its headers do not all read — the summary then
    reads each file as it comes, and refuses the layer where the reader does."""
    from buildmatrix.image.workers import PARALLEL_BYTES

    if size < PARALLEL_BYTES:
        return {}
    ahead: dict[int, Result] = {}
    refused: tuple[type[Exception], ...] = (TarHeaderError, InputError, *_unreadable())
    try:
        members = tar.getmembers()
        jobs = []
        for m in members:
            if not m.isreg() or m.issparse() or m.size < 4:
                continue
            job = _job(file, offset, size, m, clean_member_name(m.name, layer=str(file)))
            _, start, length, path = job
            head = archive.read_at(start, min(64, length))
            if len(head) >= 4 and _might_hold_code(head, path):
                jobs.append((m.offset, job))
            else:
                ahead[m.offset] = None  # no device code: nothing to read again
    except refused:
        return {}
    results = run_all(_inspect_archived, [job for _, job in jobs], [job[2] for _, job in jobs])
    ahead.update((at, result) for (at, _), result in zip(jobs, results, strict=True))
    return ahead


def _job(
    file: Path, offset: int, size: int, member: tarfile.TarInfo, path: str
) -> tuple[str, int, int, str]:
    """Where a member of a layer lying at ``[offset, offset + size)`` of ``file`` has
    its bytes: (file, start, length within the layer, path in the layer)."""
    start = offset + member.offset_data
    return str(file), start, min(member.size, offset + size - start), path


def _inspect_archived(job: tuple[str, int, int, str]) -> Result:
    """A worker's :func:`_inspect_in_archive`: it opens the archive itself."""
    import os

    fd = os.open(job[0], os.O_RDONLY)
    try:
        return _inspect_in_archive(job, FileSource(fd, name=job[0]))
    finally:
        os.close(fd)


def _inspect_in_archive(job: tuple[str, int, int, str], archive: FileSource) -> Result:
    """The device code of a file that lies in ``[start, start + length)`` of an
    archive (job: archive, start, length, path in the layer), or None."""
    _, start, length, path = job
    src = SliceSource(archive, start, length, name=path)
    head = src.read_at(0, 64)
    if len(head) < 4 or not _might_hold_code(head, path):
        return None
    try:
        return inspect_image_file(src, path=path, head=head)
    except CorruptBinary as exc:
        return ScanProblem(path=path, message=str(exc))


class _Window(io.RawIOBase):
    """``[offset, offset + size)`` of an open file, read as a file of its own."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        super().__init__()
        self._fd, self._offset, self._size, self._pos = fd, offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        import os

        n = max(0, min(len(buffer), self._size - self._pos))
        got = os.preadv(self._fd, [memoryview(buffer)[:n]], self._offset + self._pos) if n else 0
        self._pos += got
        return got

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos


def _summarise(
    tar: tarfile.TarFile, name: str, file_result: Callable[[tarfile.TarInfo, str], Result]
) -> LayerSummary:
    """The summary the members of a layer tar make; ``file_result`` reads a regular
    file's device code."""
    summary = LayerSummary(name=name)
    for member in tar:
        path = clean_member_name(member.name, layer=name)
        if not path:
            continue
        summary.claim(path)
        folder, base = posixpath.split(path)
        if base == OPAQUE:
            summary.make_opaque(folder)
        elif base.startswith(WHITEOUT):
            summary.whiteout(posixpath.join(folder, base[len(WHITEOUT) :]))
        elif member.isdir():
            summary.add(path, Node("dir"))
        elif member.issym():
            summary.add(path, Node("symlink", member.linkname))
        elif member.islnk():
            summary.add_hardlink(path, clean_member_name(member.linkname, layer=name))
        elif member.isreg():
            summary.add(path, Node("file", result=file_result(member, path)))
        else:
            summary.add(path, Node("other"))
    _check_end(tar)
    return summary


@contextmanager
def _read_as_layer(name: str) -> Iterator[None]:
    """Turn what the tar and decompression readers raise into input errors naming
    the layer."""
    try:
        yield
    except TarHeaderError as exc:
        raise InputError(
            f"{name}: {exc}; tar readers (Python's, and Go's that Docker and containerd "
            "use) would not read this layer alike, so the image is refused. Nothing was "
            "checked."
        ) from None
    except _unreadable() as exc:
        raise InputError(
            f"{name}: not a readable layer tar ({exc}); the blob is truncated or corrupt."
        ) from None


def _unreadable() -> tuple[type[Exception], ...]:
    """What the tar, gzip (ISA-L and zlib) and zstd readers raise on corrupt input."""
    import zlib

    import zstandard
    from isal import igzip_lib

    isal_error = cast(type[Exception], igzip_lib.IsalError)
    return (tarfile.TarError, EOFError, OSError, zlib.error, isal_error, zstandard.ZstdError)


def _file_result(
    tar: tarfile.TarFile, member: tarfile.TarInfo, path: str, keep: Path | None
) -> Result:
    if member.size < 4:
        return None
    data = member_data(tar, member)
    head = data.read(64)
    if not _might_hold_code(head, path):
        return None
    return _inspect_member(data, member.size, path, head, keep)


# ------------------------------------------------------- layers as the engine stores them

# overlayfs features the overlay2 driver can leave in a layer folder that change what
# a name means; a layer that uses them is not read directly (the caller falls back
# to the engine's own export).
_UNREAD_XATTRS = ("trusted.overlay.redirect", "trusted.overlay.metacopy")
_OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")


class UnreadableLayer(Exception):
    """A layer folder that cannot be read as the engine would export it."""


def scan_layer_dir(root: Path, *, name: str) -> LayerSummary:
    """One layer from its overlay2 ``diff`` folder, as :func:`scan_layer` reads it
    from a tar: whiteouts are 0/0 character devices, an opaque folder carries the
    ``trusted.overlay.opaque`` (or ``user.overlay.opaque``) attribute ``y``; files
    are inspected in place. Raises :class:`UnreadableLayer` where the folder uses
    overlayfs features this reader does not model."""
    import os
    import stat

    summary = LayerSummary(name=name)
    candidates: list[tuple[str, str]] = []  # (full path, path in the layer)
    sizes: list[int] = []
    stack = [(str(root), "")]
    while stack:  # iterative: layers may nest folders thousands deep
        folder, rel = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise UnreadableLayer(f"{folder}: cannot list: {exc.strerror}") from None
        subfolders = []
        for entry in entries:
            path = f"{rel}{entry.name}"
            st = entry.stat(follow_symlinks=False)
            _refuse_unmodelled(entry.path)
            if stat.S_ISDIR(st.st_mode):
                summary.add(path, Node("dir"))
                if _xattr(entry.path, _OPAQUE_XATTRS) == b"y":
                    summary.make_opaque(path)
                subfolders.append((entry.path, f"{path}/"))
            elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                summary.whiteout(path)
            elif stat.S_ISLNK(st.st_mode):
                summary.add(path, Node("symlink", str(Path(entry.path).readlink())))
            elif stat.S_ISREG(st.st_mode):
                summary.add(path, Node("file"))
                if _stored_candidate(entry.path, path):
                    candidates.append((entry.path, path))
                    sizes.append(st.st_size)
            else:
                summary.add(path, Node("other"))
        stack.extend(reversed(subfolders))
    # Files that may hold device code are read once the folder is listed, several at
    # a time where they are many (buildmatrix.image.workers).
    for (_, path), result in zip(
        candidates, run_all(_inspect_stored, candidates, sizes), strict=True
    ):
        summary.add(path, Node("file", result=result))
    return summary


def _xattr(path: str, names: tuple[str, ...]) -> bytes | None:
    import os

    for attr in names:
        try:
            return os.getxattr(path, attr, follow_symlinks=False)
        except OSError:
            continue
    return None


def _refuse_unmodelled(path: str) -> None:
    if _xattr(path, _UNREAD_XATTRS) is not None:
        raise UnreadableLayer(f"{path}: uses overlayfs redirect or metacopy")


def _open_stored(full: str) -> int:
    import os

    try:
        return os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise UnreadableLayer(f"{full}: cannot open: {exc.strerror}") from None


def _stored_candidate(full: str, path: str) -> bool:
    """Whether a file of a layer folder may hold device code (by its first bytes)."""
    import os

    fd = _open_stored(full)
    try:
        head = os.pread(fd, 64, 0)
    except OSError as exc:
        raise UnreadableLayer(f"{full}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    return len(head) >= 4 and _might_hold_code(head, path)


def _inspect_stored(job: tuple[str, str]) -> Result:
    """The device code of a file of a layer folder (full path, path in the layer)."""
    import os

    full, path = job
    fd = _open_stored(full)
    try:
        src = FileSource(fd, name=path)
        head = src.read_at(0, 64)
        return inspect_image_file(src, path=path, head=head)
    except CorruptBinary as exc:
        return ScanProblem(path=path, message=str(exc))
    except OSError as exc:
        raise UnreadableLayer(f"{full}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the merged view


class ImageTree:
    """The final filesystem of an image: layer trees stacked as overlayfs does."""

    def __init__(self) -> None:
        self.root = _Dir()

    def apply(self, layer: LayerSummary) -> None:
        """Put ``layer`` on top (the layer's own tree is copied, never changed)."""
        stack = [(self.root, layer.root)]
        while stack:  # iterative: a layer may nest folders thousands deep
            lower, upper = stack.pop()
            if upper.opaque:
                lower.children.clear()
            for name, entry in upper.children.items():
                if entry is WHITED_OUT:
                    lower.children.pop(name, None)
                elif isinstance(entry, _Dir):
                    below = lower.children.get(name)
                    if not isinstance(below, _Dir):  # a folder over a non-folder replaces it
                        below = lower.children[name] = _Dir()
                    stack.append((below, entry))
                else:
                    lower.children[name] = entry

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
                elif isinstance(child, _Leaf):
                    yield path, child.node
            stack.extend(reversed(subfolders))


def merge(layers: list[LayerSummary]) -> ImageTree:
    tree = ImageTree()
    for layer in layers:
        tree.apply(layer)
    return tree
