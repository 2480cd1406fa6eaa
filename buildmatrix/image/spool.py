"""Device-code candidates read from a stream: small ones in memory, large ones
spooled to a private temporary file, so memory stays bounded per worker."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import IO

from buildmatrix.binary.archive import is_archive
from buildmatrix.binary.compat_note import COMPAT_NAME
from buildmatrix.binary.elf import is_elf
from buildmatrix.binary.fatbin import FATBIN_MAGIC_BYTES
from buildmatrix.binary.ptx import looks_like_ptx
from buildmatrix.binary.report import FileReport, ScanProblem
from buildmatrix.binary.scan import inspect_image_file
from buildmatrix.binary.source import BytesSource, CorruptBinary, FileSource
from buildmatrix.image.tarstream import CHUNK
from buildmatrix.image.tree import Result

# Files up to this size are inspected in memory; larger candidates are spooled to a
# private temporary file (deleted at once), so memory stays bounded per worker.
SPOOL_LIMIT = 64 << 20


def might_hold_code(head: bytes, path: str) -> bool:
    """Whether a file whose first bytes are ``head`` (64 are enough) may hold device
    code: an ELF file, a fatbinary, a static archive or PTX text."""
    return (
        is_elf(head)
        or head[:4] == FATBIN_MAGIC_BYTES
        or is_archive(head)
        or looks_like_ptx(head, path)
    )


def inspect_member(data: IO[bytes], size: int, path: str, head: bytes, keep: Path | None) -> Result:
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
            view = memoryview(bytearray(CHUNK))
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
