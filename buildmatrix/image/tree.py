"""Layer trees and the filesystem the layers make together (the overlay model).

The model is the one the overlay2 graph driver and containerd's overlayfs
snapshotter implement, checked against a real overlay2 engine in the tests
(tests/test_layer_semantics.py); docs/check.md, "Layer semantics", spells it out:

- Each layer is read once into a :class:`LayerSummary`: the tree the layer's
  entries make when extracted, in archive order, into an empty folder (the layer's
  "diff" folder). Inside that folder symlinks the same layer made are followed (the
  extraction is chrooted there, so nothing leaves it); missing parent folders are
  created; a whiteout ``.wh.NAME`` becomes a whiteout mark and ``.wh..wh..opq``
  marks its folder opaque; a hard link is bound to what its target holds at that
  point. What the engine refuses (a path given twice, a hard link to a file the
  layer does not hold, an entry under a file, a whiteout over an entry of the same
  layer) is refused here too.
- :func:`merge` stacks the layers as overlayfs does, by literal names: an upper
  folder merges with a lower folder (all of it, if the upper one is opaque), an
  upper folder over a lower non-folder replaces it, an upper whiteout hides the
  lower name, anything else in the upper layer replaces the lower entry. Symlinks of
  lower layers are never followed: they matter only when the final view is queried.

This module is pure: the readers that fill a summary are buildmatrix.image.layers
(layer tars), buildmatrix.image.inplace (tars inside an archive file) and
buildmatrix.image.overlay2 (the engine's layer folders).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, NoReturn

from buildmatrix.binary.cudart import CudaRuntime
from buildmatrix.binary.dynamic import SearchPaths
from buildmatrix.binary.ldconf_file import ConfFile
from buildmatrix.binary.report import FileReport, ScanProblem
from buildmatrix.errors import InputError
from buildmatrix.forward import CompatLibrary

MAX_LINK_HOPS = 40  # as Linux's path resolution (MAXSYMLINKS)
PATH_MAX = 4096  # Linux: no path or symlink target is longer

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"

Kind = Literal["file", "dir", "symlink", "hardlink", "other"]
Result = FileReport | CompatLibrary | ConfFile | SearchPaths | CudaRuntime | ScanProblem | None


@dataclass(frozen=True, slots=True)
class Inode:
    """What a non-folder entry of a layer is, as its inode would say (a filesystem
    entry, nothing to do with buildmatrix.node): its kind, its link target, and for a
    regular file the device code read from it (None: none, or not a candidate)."""

    kind: Kind
    target: str = ""  # symlink target as written, or hard-link target path
    result: Result = None


@dataclass
class Dir:
    """A folder of a layer tree: its entries by name, and whether it is opaque (it
    hides every lower layer's folder of the same path)."""

    children: dict[str, Entry] = field(default_factory=dict)
    opaque: bool = False


@dataclass(frozen=True, slots=True)
class Leaf:
    """A non-folder entry of a layer tree; hard links share one Leaf."""

    inode: Inode


PLAIN_FILE = Leaf(Inode("file"))
"""Every file without device code: one shared leaf (leaves are immutable)."""
DIR, OTHER = Inode("dir"), Inode("other")
"""The inodes of every folder and of every other entry (FIFOs, devices)."""


class _Whiteout:
    """A whiteout mark: the name is hidden in every lower layer."""


WHITED_OUT = _Whiteout()
Entry = Dir | Leaf | _Whiteout
"""What a name of a layer tree holds: a folder, a leaf, or the whiteout mark."""


class _Hashes:
    """A set of 64-bit hashes in a table of machine words, at most half full (linear
    probing; 0 marks a free slot): 16 to 32 B a hash, where a set of them held an int
    object and a (hash, pointer) slot each, ~100 B, and a layer of a million entries
    peaked with it at 275 MiB."""

    def __init__(self) -> None:
        self._slots = array("q", [0]) * 1024
        self._used = 0

    def __len__(self) -> int:
        return self._used

    def add(self, key: int) -> bool:
        """Put ``key`` in; False where it was in already."""
        key = key or 1
        slots = self._slots
        mask = len(slots) - 1
        at = key & mask
        while (held := slots[at]) != 0:
            if held == key:
                return False
            at = (at + 1) & mask
        slots[at] = key
        self._used += 1
        if self._used * 2 > len(slots):
            old, self._slots, self._used = slots, array("q", [0]) * (2 * len(slots)), 0
            for held in old:
                if held:
                    self.add(held)
        return True


class LayerSummary:
    """One layer as its entries make it when extracted into an empty folder."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.root = Dir()
        # Paths claimed so far, by their str hash (SipHash, keyed per process: PEP 456).
        # A collision could only refuse a layer.
        self._names = _Hashes()
        self.entries = 0  # how many the layer held, once read (buildmatrix.image.cache)

    def read(self) -> None:
        """The whole layer is in: its entries are counted and the claimed paths let go
        (held otherwise as long as the summary)."""
        self.entries = len(self._names)
        self._names = _Hashes()

    def _refuse(self, why: str) -> NoReturn:
        raise InputError(
            f"{self.name}: {why}; the Docker engine refuses such a layer too, so the image "
            "is refused. Nothing was checked."
        )

    def claim(self, path: str) -> None:
        """Each path once per layer: the engine refuses duplicates."""
        if not self._names.add(hash(path)):
            self._refuse(f"'{path}' appears twice in the layer")

    def _folder(self, parts: list[str], *, create: bool, what: str) -> Dir:
        """The folder ``parts`` name, following this layer's symlinks inside its root.

        Missing folders are created (as the engine's MkdirAll does), except along a
        symlink's own target, which must exist.
        """
        current, parents = self.root, list[Dir]()
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
                if via_link:
                    self._refuse(
                        f"'{what}' is written through a symlink whose target the layer "
                        "does not hold"
                    )
                if not create:
                    self._refuse(f"'{what}' is under '{part}', which the layer does not hold")
                child = current.children[part] = Dir()
            if isinstance(child, Leaf) and child.inode.kind == "symlink":
                hops += 1
                if hops > MAX_LINK_HOPS:
                    self._refuse(f"'{what}' is written through a symlink loop")
                if child.inode.target.startswith("/"):
                    current, parents = self.root, []
                queue.extendleft((p, True) for p in reversed(child.inode.target.split("/")))
                continue
            if not isinstance(child, Dir):
                self._refuse(f"'{what}' is under '{part}', which is not a folder in the layer")
            parents.append(current)
            current = child
        return current

    def _parent(self, path: str) -> tuple[Dir, str]:
        *folders, base = path.split("/")
        # The common walk, through folders only, inline; at a symlink, a non-folder,
        # or a name :meth:`_folder` treats apart, that walk is taken from the root
        # (the folders made so far are those it makes itself).
        current = self.root
        for part in folders:
            child = current.children.get(part)
            if child is None:
                if part in ("", ".", ".."):
                    return self._folder(folders, create=True, what=path), base
                child = current.children[part] = Dir()
            elif type(child) is not Dir:
                return self._folder(folders, create=True, what=path), base
            current = child
        return current, base

    def add(self, path: str, inode: Inode) -> None:
        """A folder, file, symlink or other entry: it replaces what the path held."""
        if inode.kind == "symlink" and len(inode.target) >= PATH_MAX:
            self._refuse(f"symlink '{path}' has a target longer than PATH_MAX ({PATH_MAX})")
        folder, base = self._parent(path)
        if inode.kind == "dir":
            if not isinstance(folder.children.get(base), Dir):
                folder.children[base] = Dir()
        else:
            folder.children[base] = PLAIN_FILE if inode == PLAIN_FILE.inode else Leaf(inode)

    def add_hardlink(self, path: str, target: str) -> None:
        """Bound to what ``target`` holds now, in this layer (the engine links in it)."""
        *folders, base = target.split("/")
        try:
            entry = self._folder(folders, create=False, what=target).children.get(base)
        except InputError as exc:  # said of the link, not only of its target
            why = str(exc).removeprefix(f"{self.name}: ")
            raise InputError(f"{self.name}: hard link '{path}': {why}") from None
        if not isinstance(entry, Leaf):
            self._refuse(f"hard link '{path}' points at '{target}', which the layer does not hold")
        folder, name = self._parent(path)
        folder.children[name] = entry

    def whiteout(self, path: str) -> None:
        folder, base = self._parent(path)
        if base in ("", ".", ".."):
            # overlay: mknod of an existing path fails; vfs: RemoveAll of the folder
            # or its parent (moby pkg/archive, overlayWhiteoutConverter.ConvertRead
            # and UnpackLayer)
            self._refuse(f"whiteout '{WHITEOUT}{base}' names no entry of its folder")
        if base in folder.children:
            self._refuse(f"whiteout of '{path}' over an entry of the same layer")
        folder.children[base] = WHITED_OUT

    def make_opaque(self, path: str) -> None:
        """Mark the marker's folder opaque. The engine sets an xattr on whatever the
        path holds: on a file of this layer that has no effect, so it is accepted.
        A marker for the layer's root is refused (:meth:`_refuse_root_opaque`)."""
        entry: Entry | None = self.root
        if path:
            folder, base = self._parent(path)
            entry = folder.children.get(base)
            if entry is None:
                entry = folder.children[base] = Dir()
            elif isinstance(entry, Leaf) and entry.inode.kind == "symlink":
                entry = self._folder(path.split("/"), create=False, what=path)
        if entry is self.root:
            self._refuse_root_opaque(path)
        if isinstance(entry, Dir):
            entry.opaque = True

    def _refuse_root_opaque(self, path: str) -> NoReturn:
        """overlayfs never looks at the opaque xattr of a layer's root folder (Linux
        fs/overlayfs: ``ovl_lookup`` stops at an opaque folder it looks up, and the
        root is never looked up), so with the overlay2 driver or containerd's
        overlayfs snapshotter the lower layers stay visible; the vfs driver and the
        naive snapshotters apply the mark and remove them (moby pkg/archive/diff.go
        ``UnpackLayer``; containerd ``archive.applyNaive``). tests/test_layer_semantics.py
        shows both engines."""
        marker = f"{path}/{OPAQUE}" if path else OPAQUE
        raise InputError(
            f"{self.name}: '{marker}' marks the image root opaque. overlayfs ignores the "
            "mark on a layer's root and shows the lower layers; the vfs driver and naive "
            "snapshotters remove them. What the container sees depends on the engine's "
            "storage, so the image is refused. Nothing was checked."
        )


class ImageTree:
    """The final filesystem of an image: layer trees stacked as overlayfs does."""

    def __init__(self) -> None:
        self.root = Dir()

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
                elif isinstance(entry, Dir):
                    below = lower.children.get(name)
                    if not isinstance(below, Dir):  # a folder over a non-folder replaces it
                        below = lower.children[name] = Dir()
                    stack.append((below, entry))
                else:
                    lower.children[name] = entry

    def folders(self) -> Iterator[str]:
        """Every folder's path (empty ones too), in no particular order."""
        stack: list[tuple[str, Dir]] = [("", self.root)]
        while stack:
            prefix, folder = stack.pop()
            for name, child in folder.children.items():
                if isinstance(child, Dir):
                    yield f"{prefix}{name}"
                    stack.append((f"{prefix}{name}/", child))

    def files(self) -> Iterator[tuple[str, Inode]]:
        """Every non-folder entry as (path, inode), sorted by path."""
        stack: list[tuple[str, Dir]] = [("", self.root)]
        while stack:
            prefix, folder = stack.pop()
            subfolders = []
            for name in sorted(folder.children):
                child = folder.children[name]
                path = f"{prefix}{name}"
                if isinstance(child, Dir):
                    subfolders.append((f"{path}/", child))
                elif isinstance(child, Leaf):
                    yield path, child.inode
            stack.extend(reversed(subfolders))


def merge(layers: list[LayerSummary]) -> ImageTree:
    tree = ImageTree()
    for layer in layers:
        tree.apply(layer)
    return tree
