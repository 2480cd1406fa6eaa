"""Layer tars read into layer trees (buildmatrix.image.tree), as the engine
extracts them: each member's name cleaned, each entry put where extraction puts it,
each regular file that may hold device code inspected on the way.

:func:`scan_layer` reads a stream (a registry blob, an OCI blob, the engine's save
stream); buildmatrix.image.inplace reads a tar lying inside an archive file with the
same :func:`summarise`. Layers are independent, so they are summarised in parallel
and in any order.
"""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import IO, cast

from buildmatrix.binary.ldconf_file import is_conf
from buildmatrix.binary.scan import read_head, worth_reading
from buildmatrix.errors import InputError
from buildmatrix.image.paxheaders import TarHeaderError
from buildmatrix.image.spool import inspect_member
from buildmatrix.image.tarheaders import TruncatedTar
from buildmatrix.image.tarstream import (
    CONTAINERD,
    DiffIdMismatch,
    check_end,
    ends_after,
    member_data,
    open_tar_stream,
    tar_digest,
)
from buildmatrix.image.tree import (
    DIR,
    OPAQUE,
    OTHER,
    PLAIN_FILE,
    WHITEOUT,
    Inode,
    LayerSummary,
    Result,
)


def clean_member_name(name: str, *, layer: str) -> str:
    """Normalise a tar member name; refuse one that escapes the root, as Docker does."""
    parts = name.split("/")
    if "" not in parts and "." not in parts and ".." not in parts:
        return name  # normal already: what the normalisation below leaves as it is
    path = posixpath.normpath("/" + name.lstrip("/")) if name not in ("", ".", "./") else "/"
    raw = posixpath.normpath(name.lstrip("/") or ".")
    if raw == ".." or raw.startswith("../"):
        raise InputError(
            f"{layer}: entry '{name}' escapes the image root; the image is refused "
            "(Docker refuses such layers too)."
        )
    return path.lstrip("/")


def scan_layer(
    stream: IO[bytes],
    *,
    name: str,
    keep: Path | None = None,
    diff_id: str | None = None,
    blob_digest: str | None = None,
    kinds: frozenset[str] = CONTAINERD,
) -> LayerSummary:
    """Read one layer tar stream into a summary; device code is inspected on the way.

    With ``keep`` (a private folder), every file with device code is kept there and
    its report says where (``FileReport.stored``). With ``diff_id``, the layer's
    uncompressed content must have that digest (``blob_digest``: the blob's own,
    verified by the caller, which is the diff_id of an uncompressed blob). ``kinds``:
    the compressions read (tarstream.open_tar_stream).
    """
    with read_as_layer(name):
        try:
            tar = open_tar_stream(
                stream, name=name, diff_id=diff_id, blob_digest=blob_digest, kinds=kinds
            )
        except DiffIdMismatch as exc:
            check_diff_id(name, diff_id, str(exc))
            raise  # pragma: no cover - check_diff_id raises on a mismatch
        # Closing the stream under the tar stops the hash beside it (tarfile leaves
        # a file object it was given open).
        with tar, closing(cast(IO[bytes], tar.fileobj)):
            summary = summarise(
                tar, name, lambda member, path: file_result(tar, member, path, keep)
            )
            check_diff_id(name, diff_id, tar_digest(tar))
            return summary


def check_diff_id(name: str, diff_id: str | None, got: str | None) -> None:
    """The engine refuses a layer whose uncompressed digest is not its config's
    diff_id (moby ``image/tarexport/load.go``: "invalid diffID for layer"; containerd
    ``core/unpack/unpacker.go``: "wrong diff id calculated on extraction") — but only
    when it reads the layer at all: one that already holds a layer of that diff_id
    runs that one instead. So a layer is judged only as the content its config names."""
    if diff_id is None or got is None or got == diff_id:
        return
    raise InputError(
        f"{name}: the layer's uncompressed content has digest {got}, but the image "
        f"config's rootfs.diff_ids names {diff_id} for it. An engine that already holds "
        f"a layer {diff_id[:19]} runs that one instead, and one that does not refuses "
        "the image; so it is refused here. Nothing was checked."
    )


def summarise(
    tar: tarfile.TarFile, name: str, read_file: Callable[[tarfile.TarInfo, str], Result]
) -> LayerSummary:
    """The summary the members of a layer tar make; ``read_file`` reads a regular
    file's device code."""
    summary = LayerSummary(name=name)
    for member in forward_members(tar):
        path = clean_member_name(member.name, layer=name)
        if not path:
            continue
        summary.claim(path)
        folder, _, base = path.rpartition("/")
        kind = member.type  # as TarInfo.isdir, issym, islnk and isreg tell it
        if base.startswith(WHITEOUT):
            if base == OPAQUE:
                summary.make_opaque(folder)
            else:
                summary.whiteout(posixpath.join(folder, base[len(WHITEOUT) :]))
        elif kind == tarfile.DIRTYPE:
            summary.add(path, DIR)
        elif kind == tarfile.SYMTYPE:
            summary.add(path, Inode("symlink", member.linkname))
        elif kind == tarfile.LNKTYPE:
            summary.add_hardlink(path, clean_member_name(member.linkname, layer=name))
        elif kind in tarfile.REGULAR_TYPES:
            result = read_file(member, path)
            summary.add(path, PLAIN_FILE.inode if result is None else Inode("file", result=result))
        else:
            summary.add(path, OTHER)
    check_end(tar)
    summary.read()
    return summary


@contextmanager
def read_as_layer(name: str) -> Iterator[None]:
    """Turn what the tar and decompression readers raise into input errors naming
    the layer."""
    try:
        yield
    except TruncatedTar as exc:
        raise InputError(
            f"{name}: {exc}. Go's archive/tar, which the Docker engine and containerd "
            'unpack layers with, stops there with "unexpected EOF", so no runtime '
            "unpacks this layer: the blob is truncated, and the image is refused. "
            "Nothing was checked."
        ) from None
    except TarHeaderError as exc:
        raise InputError(
            f"{name}: {exc}; tar readers (Python's, and Go's that Docker and containerd "
            "use) would not read this layer alike, so the image is refused. Nothing was "
            "checked."
        ) from None
    except unreadable() as exc:
        raise InputError(
            f"{name}: not a readable layer tar ({exc}); the blob is truncated or corrupt."
        ) from None


def unreadable() -> tuple[type[Exception], ...]:
    """What the tar, gzip (ISA-L and zlib), zstd, bzip2 (OSError) and xz readers
    raise on corrupt input."""
    import lzma
    import zlib

    import zstandard
    from isal import igzip_lib

    isal_error = cast(type[Exception], igzip_lib.IsalError)
    return (
        tarfile.TarError,
        EOFError,
        OSError,
        zlib.error,
        isal_error,
        zstandard.ZstdError,
        lzma.LZMAError,
    )


def forward_members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Each member once, front to back, kept by no one: tarfile's own iterator keeps
    every member it reads (``TarFile.members``), which for a layer of a million
    empty files was ~1 GiB. Members read before (the in-place reader's read-ahead,
    all or up to a refusal) come first, from that list."""
    members: list[tarfile.TarInfo] = tar.members  # type: ignore[attr-defined]
    if getattr(tar, "_loaded", False):  # every member read already
        yield from members
        return
    # tarfile reads the first member when it opens; it is handed out by next().
    pending = [] if tar.firstmember is not None else list(members)  # type: ignore[attr-defined]
    members.clear()
    yield from pending
    last = pending[-1] if pending else None
    # Where the stream ends after a member is judged as Go's reader judges it
    # (tarstream.ends_after) before tarfile's next() reads on.
    while not (last is not None and ends_after(tar, last)):
        if (member := tar.next()) is None:
            return
        members.clear()
        last = member
        yield member


def file_result(
    tar: tarfile.TarFile, member: tarfile.TarInfo, path: str, keep: Path | None
) -> Result:
    """The device code of a regular member read from the tar's stream (spooled as
    buildmatrix.image.spool does), or None where its first bytes show none."""
    if member.size < 4 and not is_conf(path):
        return None
    data = member_data(tar, member)
    head = read_head(lambda _at, n: data.read(n))  # the stream goes on where it stopped
    if not worth_reading(head, path):
        return None
    return inspect_member(data, member.size, path, head, keep)
