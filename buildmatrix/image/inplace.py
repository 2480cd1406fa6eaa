"""Layers read in place: a layer tar that lies in a regular file (a ``docker save``
archive) is read where it lies — headers only, each file that may hold device code
inspected in the archive, the rest skipped — instead of streamed and spooled; large
layers' candidates are read by worker processes (buildmatrix.image.workers)."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

from buildmatrix.binary.ldconf_file import is_conf
from buildmatrix.binary.report import ScanProblem
from buildmatrix.binary.scan import inspect_image_file, read_head, worth_reading
from buildmatrix.binary.source import CorruptBinary, FileSource, SliceSource
from buildmatrix.errors import InputError
from buildmatrix.image.digests import RegionHash
from buildmatrix.image.layers import (
    check_diff_id,
    clean_member_name,
    file_result,
    forward_members,
    read_as_layer,
    scan_layer,
    summarise,
    unreadable,
)
from buildmatrix.image.paxheaders import TarHeaderError
from buildmatrix.image.tarheaders import StrictTarInfo
from buildmatrix.image.tarstream import CONTAINERD, TAR_BUFSIZE, detect
from buildmatrix.image.tree import LayerSummary, Result
from buildmatrix.image.workers import run_all


def scan_layer_at(
    file: Path,
    offset: int,
    size: int,
    *,
    name: str,
    diff_id: str | None = None,
    kinds: frozenset[str] = CONTAINERD,
) -> LayerSummary:
    """One layer whose tar lies in ``[offset, offset + size)`` of a regular file (a
    ``docker save`` archive): as :func:`scan_layer` reads it, but an uncompressed tar
    is read in place — headers only, each file that may hold device code inspected
    where it lies, the rest skipped — instead of streamed and spooled. A compressed
    layer is streamed (``kinds``: the compressions read, tarstream.open_tar_stream).
    With ``diff_id``, the layer's bytes must have that SHA-256
    (:func:`layers.check_diff_id`), hashed on a thread beside the reading
    (buildmatrix.image.digests): from the start where this process reads the
    candidates, else once the workers that read them are forked."""
    fd = os.open(file, os.O_RDONLY)
    hashing = None
    try:
        window = _Window(fd, offset, size)
        head = os.pread(fd, min(8, size), offset)
        if detect(head) is not None:
            return scan_layer(cast(IO[bytes], window), name=name, diff_id=diff_id, kinds=kinds)
        archive = FileSource(fd, name=str(file))
        hashing = RegionHash(fd, offset, size) if diff_id is not None else None
        with read_as_layer(name):
            ahead = _read_ahead(
                _Window(fd, offset, size),
                archive,
                file,
                offset,
                size,
                meanwhile=hashing.start if hashing is not None else None,
            )
            if hashing is not None:
                hashing.start()  # (where the read-ahead did not start it)
            buffered = io.BufferedReader(window, buffer_size=TAR_BUFSIZE)
            with tarfile.open(fileobj=buffered, mode="r:", tarinfo=StrictTarInfo) as tar:

                def in_place(member: tarfile.TarInfo, path: str) -> Result:
                    if member.size < 4 and not is_conf(path):
                        return None
                    if member.issparse():  # its bytes are not one run of the file
                        return file_result(tar, member, path, None)
                    if ahead is not None:  # every candidate was read ahead
                        return ahead.get(member.offset)
                    return _inspect_in_archive(_job(file, offset, size, member, path), archive)

                summary = summarise(tar, name, in_place)
            digest = hashing.result() if hashing is not None else None
        check_diff_id(name, diff_id, digest)
        return summary
    finally:
        if hashing is not None:
            hashing.stop()  # a refused layer: the hash is given up
        os.close(fd)


def _read_ahead(
    window: _Window,
    archive: FileSource,
    file: Path,
    offset: int,
    size: int,
    *,
    meanwhile: Callable[[], None] | None,
) -> dict[int, Result] | None:
    """The device code of a layer's candidate files (regular, not sparse, whose first
    bytes may be code) by member offset, read by workers (buildmatrix.image.workers)
    after a first pass over the headers that keeps no member, ``meanwhile`` called
    as they start (workers.run_all); None when the layer is small or its headers do
    not all read — the summary then reads each file as it comes, and refuses the
    layer where the reader does."""
    from buildmatrix.image.workers import PARALLEL_BYTES

    if size < PARALLEL_BYTES:
        return None
    refused: tuple[type[Exception], ...] = (TarHeaderError, InputError, *unreadable())
    jobs = []
    try:
        # A window of its own: the buffer closes it when it goes (the fd stays open).
        buffered = io.BufferedReader(window, buffer_size=TAR_BUFSIZE)
        with tarfile.open(fileobj=buffered, mode="r:", tarinfo=StrictTarInfo) as tar:
            for m in forward_members(tar):
                if not m.isreg() or m.issparse():
                    continue
                at = clean_member_name(m.name, layer=str(file))
                if m.size < 4 and not is_conf(at):
                    continue
                job = _job(file, offset, size, m, at)
                _, start, length, path = job
                head = read_head(SliceSource(archive, start, length, name=path).read_at)
                if worth_reading(head, path):
                    jobs.append((m.offset, job))
    except refused:
        return None
    results = run_all(
        _inspect_archived,
        [job for _, job in jobs],
        [job[2] for _, job in jobs],
        meanwhile=meanwhile,
    )
    return {at: result for (at, _), result in zip(jobs, results, strict=True)}


def _job(
    file: Path, offset: int, size: int, member: tarfile.TarInfo, path: str
) -> tuple[str, int, int, str]:
    """Where a member of a layer lying at ``[offset, offset + size)`` of ``file`` has
    its bytes: (file, start, length within the layer, path in the layer)."""
    start = offset + member.offset_data
    return str(file), start, min(member.size, offset + size - start), path


def _inspect_archived(job: tuple[str, int, int, str]) -> Result:
    """A worker's :func:`_inspect_in_archive`: it opens the archive itself."""
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
    head = read_head(src.read_at)
    if not worth_reading(head, path):
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
