"""Device-code candidates read from a stream: small ones in memory, large ones
spooled to a private temporary file, so memory stays bounded per worker."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import IO

from buildmatrix.binary.compat_note import named_compat_driver
from buildmatrix.binary.dynamic import SearchPaths
from buildmatrix.binary.report import FileReport, ScanProblem
from buildmatrix.binary.scan import inspect_image_file
from buildmatrix.binary.source import BytesSource, CorruptBinary, FileSource
from buildmatrix.image.tarstream import CHUNK
from buildmatrix.image.tree import Result

# Files up to this size are inspected in memory; larger candidates are spooled to a
# private temporary file (deleted at once), so memory stays bounded per worker.
SPOOL_LIMIT = 64 << 20


def inspect_member(data: IO[bytes], size: int, path: str, head: bytes, keep: Path | None) -> Result:
    """Inspect a member; with ``keep``, files with device code stay there (load test).

    A CUDA forward-compatibility driver (``…/compat/libcuda.so.X.Y``) is read for its
    note instead: it is the driver, not code of the image's own.
    """
    if named_compat_driver(head, path):
        keep = None  # the driver is not loaded by the load test
    try:
        if size <= SPOOL_LIMIT and keep is None:
            blob = head + _read_up_to(data, size - len(head))
            return inspect_image_file(BytesSource(blob, name=path), path=path, head=head)
        with tempfile.NamedTemporaryFile(
            prefix="buildmatrix-", dir=keep, delete=keep is None
        ) as spool:
            spool.write(head)
            view = memoryview(bytearray(CHUNK))
            while n := data.readinto(view):  # type: ignore[attr-defined]
                spool.write(view[:n])
            spool.flush()
            report = inspect_image_file(FileSource(spool.fileno(), name=path), path=path, head=head)
        if keep is None:
            return report
        if isinstance(report, SearchPaths) and report.code is not None:
            return replace(report, code=replace(report.code, stored=spool.name))
        if not isinstance(report, FileReport):  # no device code: nothing to keep
            Path(spool.name).unlink()
            return report
        return replace(report, stored=spool.name)
    except CorruptBinary as exc:
        return ScanProblem(path=path, message=str(exc))


def _read_up_to(data: IO[bytes], size: int) -> bytes:
    """``size`` bytes of ``data``, fewer only where it ends: one ``read`` of a raw
    stream may return fewer bytes than asked (``io.RawIOBase.read``), which would
    cut the file short and misreport it."""
    blob = bytearray()
    while len(blob) < size and (piece := data.read(min(CHUNK, size - len(blob)))):
        blob += piece
    return bytes(blob)
