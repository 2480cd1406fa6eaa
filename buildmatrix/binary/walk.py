"""The one walk over a folder: every entry under it, symbolic links never followed.

Used by the folder scan (buildmatrix.binary.scan.scan_tree, and through it ``dir:``
image sources) and by the engine storage reader (buildmatrix.image.overlay2), which
each decide what an entry is; the order and the recursion are the same for both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


def walk(root: Path) -> Iterator[tuple[str, str, os.DirEntry[str] | OSError]]:
    """(full path, path relative to ``root``, entry) of every entry under ``root``:
    each folder's entries sorted by name, all of them before the contents of its
    subfolders (which follow in the same order); folders are entered only when they
    are folders themselves, not links to one. A folder that cannot be listed (``root``
    too) gives (its full path, its relative path, the error) in place of its entries.

    Iterative: a tree may nest folders thousands deep.
    """
    stack = [(str(root), "")]
    while stack:
        folder, rel = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            yield folder, rel, exc
            continue
        subfolders = []
        for entry in entries:
            child = f"{rel}/{entry.name}" if rel else entry.name
            yield entry.path, child, entry
            if entry.is_dir(follow_symlinks=False):
                subfolders.append((entry.path, child))
        stack.extend(reversed(subfolders))
