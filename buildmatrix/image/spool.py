"""Device-code candidates read from a stream: small ones in memory, large ones
spooled to a private temporary file, so memory stays bounded per worker."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import IO

from buildmatrix.binary.compat_note import named_compat_driver
from buildmatrix.binary.cudart import CudaRuntime
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
            blob = _read_whole(data, head, size)
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
        if isinstance(report, CudaRuntime):  # kept where what it wraps is kept
            inner = report.inner
            if isinstance(inner, SearchPaths) and inner.code is not None:
                return replace(
                    report, inner=replace(inner, code=replace(inner.code, stored=spool.name))
                )
            if isinstance(inner, FileReport):
                return replace(report, inner=replace(inner, stored=spool.name))
            Path(spool.name).unlink()
            return report
        if isinstance(report, SearchPaths) and report.code is not None:
            return replace(report, code=replace(report.code, stored=spool.name))
        if not isinstance(report, FileReport):  # no device code: nothing to keep
            Path(spool.name).unlink()
            return report
        return replace(report, stored=spool.name)
    except CorruptBinary as exc:
        return ScanProblem(path=path, message=str(exc))


def _read_whole(data: IO[bytes], head: bytes, size: int) -> bytearray:
    """The member's ``size`` bytes, ``head`` (read already) then the rest of ``data``
    read straight into one buffer (no copy held beside it: a 64 MiB member costs
    64 MiB), fewer only where it ends. One read of a raw stream may return fewer
    bytes than asked (``io.RawIOBase.readinto``), which would cut the file short and
    misreport it: it is asked again until the member is whole or the stream ends."""
    blob = bytearray(size)
    got = min(len(head), size)
    blob[:got] = head[:got]
    readinto = data.readinto  # type: ignore[attr-defined]
    with memoryview(blob) as view:
        while got < size and (n := readinto(view[got : min(size, got + CHUNK)])):
            got += n
    del blob[got:]
    return blob
