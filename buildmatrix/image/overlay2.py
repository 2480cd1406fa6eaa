"""Layers as the overlay2 graph driver stores them: each layer's ``diff`` folder read
directly (docs/check.md, "The local engine's storage"), into the same tree a layer tar makes."""

from __future__ import annotations

from pathlib import Path

from buildmatrix.binary.scan import ScanProblem, inspect_image_file
from buildmatrix.binary.source import CorruptBinary, FileSource
from buildmatrix.image.spool import might_hold_code
from buildmatrix.image.tree import LayerSummary, Node, Result
from buildmatrix.image.workers import run_all

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
    return len(head) >= 4 and might_hold_code(head, path)


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
