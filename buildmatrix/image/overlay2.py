"""Layers as the overlay2 graph driver stores them: each layer's ``diff`` folder read
directly (docs/check.md, "The local engine's storage"), into the same tree a layer tar makes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from buildmatrix.binary.report import ScanProblem
from buildmatrix.binary.scan import inspect_image_file, read_head, worth_reading
from buildmatrix.binary.source import CorruptBinary, FileSource
from buildmatrix.binary.walk import walk
from buildmatrix.errors import EnvironmentUnavailable, InputError
from buildmatrix.image.tree import Inode, LayerSummary, Result
from buildmatrix.image.workers import run_all

# overlayfs xattrs in a layer folder (Linux Documentation/filesystems/overlayfs.rst).
# The root engine's overlay2 mounts use the trusted.overlay.* names; user.overlay.*
# ones count only on a mount with "userxattr" (a rootless engine). An opaque folder
# is modelled; a redirect or metacopy makes the container see what the folder does
# not hold, so it is refused, never read past; a user.overlay.opaque folder is left
# to the engine's export (the layer's own tar), whose meaning does not depend on
# the mount. Any other overlay xattr is refused, except the bookkeeping below.
_OPAQUE = "trusted.overlay.opaque"
_MOUNT_DEPENDENT = "user.overlay.opaque"
_OVERLAY = ("trusted.overlay.", "user.overlay.")
# Bookkeeping overlayfs writes itself when a build step (BuildKit's COPY or RUN on
# the overlay2 engine, whose upper folder becomes the layer) writes into a folder an
# earlier layer made, none of which changes the names or contents a container sees
# (overlayfs.rst): "origin", the file handle of the lower inode stored "on every
# copy_up" ("Changes to underlying filesystems"; only the "index" and "nfs_export"
# features verify it, and moby's overlay2 driver mounts with "index=off":
# daemon/graphdriver/overlay2/overlay.go, Init); "uuid", the overlay's own fsid
# ("UUID and fsid"); "impure", a folder that holds copied-up entries, read only to
# keep readdir's d_ino consistent (fs/overlayfs/overlayfs.h, OVL_IMPURE: "Pure
# upper dir that may contain non pure upper entries"; fs/overlayfs/readdir.c).
# Under user.* they mean the same on a userxattr mount and nothing on any other.
_BOOKKEEPING = frozenset(
    f"{prefix}{name}" for prefix in _OVERLAY for name in ("origin", "uuid", "impure")
)


class UnreadableLayer(EnvironmentUnavailable):
    """A layer folder that cannot be read as the engine would export it (the engine's
    source then reads the image from a ``docker save`` stream instead)."""


def scan_layer_dir(root: Path, *, name: str) -> LayerSummary:
    """One layer from its overlay2 ``diff`` folder, as :func:`scan_layer` reads it
    from a tar: whiteouts are 0/0 character devices, an opaque folder carries the
    ``trusted.overlay.opaque`` attribute ``y``; files are inspected in place. Raises
    :class:`UnreadableLayer` where what the folder means depends on the mount, and
    InputError where it carries overlay redirects or metacopy."""
    summary = LayerSummary(name=name)
    candidates: list[tuple[str, str]] = []  # (full path, path in the layer)
    sizes: list[int] = []
    for folder, path, entry in walk(root):
        if isinstance(entry, OSError):
            raise UnreadableLayer(f"{folder}: cannot list: {entry.strerror}") from None
        st = entry.stat(follow_symlinks=False)
        opaque = _overlay_xattrs(entry.path, name=name, path=path)
        if stat.S_ISDIR(st.st_mode):
            summary.add(path, Inode("dir"))
            if opaque:
                summary.make_opaque(path)
        elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
            summary.whiteout(path)
        elif stat.S_ISLNK(st.st_mode):
            summary.add(path, Inode("symlink", str(Path(entry.path).readlink())))
        elif stat.S_ISREG(st.st_mode):
            summary.add(path, Inode("file"))
            if _stored_candidate(entry.path, path):
                candidates.append((entry.path, path))
                sizes.append(st.st_size)
        else:
            summary.add(path, Inode("other"))
    # Files that may hold device code are read once the folder is listed, several at
    # a time where they are many (buildmatrix.image.workers).
    for (_, path), result in zip(
        candidates, run_all(_inspect_stored, candidates, sizes), strict=True
    ):
        summary.add(path, Inode("file", result=result))
    return summary


def _overlay_xattrs(full: str, *, name: str, path: str) -> bool:
    """Whether the entry is an opaque folder; refuses redirects, metacopy and other
    overlay xattrs (InputError), leaves mount-dependent ones to the export, and
    passes over the bookkeeping of a copy-up."""
    try:
        found = [a for a in os.listxattr(full, follow_symlinks=False) if a.startswith(_OVERLAY)]
    except OSError:
        return False  # a file system without xattrs: overlayfs sees none either
    found = [a for a in found if a not in _BOOKKEEPING]
    if not found:
        return False
    if set(found) - {_OPAQUE, _MOUNT_DEPENDENT}:  # refused before any fallback
        raise InputError(
            f"{name}: '{path}' carries the overlayfs xattr(s) {', '.join(sorted(found))} in "
            "the engine's layer folder; overlayfs follows them (a redirect shows other files "
            "than the layer holds), so the image is refused. Nothing was checked."
        )
    if _MOUNT_DEPENDENT in found:
        raise UnreadableLayer(
            f"{full}: {_MOUNT_DEPENDENT} means something only on userxattr mounts"
        )
    try:
        return os.getxattr(full, _OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _open_stored(full: str) -> int:
    try:
        return os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise UnreadableLayer(f"{full}: cannot open: {exc.strerror}") from None


def _stored_candidate(full: str, path: str) -> bool:
    """Whether a file of a layer folder may hold device code (by its first bytes)."""
    fd = _open_stored(full)
    try:
        head = read_head(lambda at, n: os.pread(fd, n, at))
    except OSError as exc:
        raise UnreadableLayer(f"{full}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    return worth_reading(head, path)


def _inspect_stored(job: tuple[str, str]) -> Result:
    """The device code of a file of a layer folder (full path, path in the layer)."""
    full, path = job
    fd = _open_stored(full)
    try:
        src = FileSource(fd, name=path)
        head = read_head(src.read_at)
        return inspect_image_file(src, path=path, head=head)
    except CorruptBinary as exc:
        return ScanProblem(path=path, message=str(exc))
    except OSError as exc:
        raise UnreadableLayer(f"{full}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
