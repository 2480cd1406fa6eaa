"""A ``docker save`` archive's members as ``docker load`` sees them.

``docker load`` (moby ``image/tarexport/load.go``, ``Load``) first extracts the whole
archive into a temporary folder with ``chrootarchive.Untar`` (moby
``pkg/archive/archive.go``, ``Unpack``), then opens ``manifest.json``, the config and
each layer through ``safePath``, which follows symlinks inside that folder
(``symlink.FollowSymlinkInScope``). So:

- a member's name is cleaned as Go's ``filepath.Clean`` does and joined under the
  folder: ``X``, ``./X``, ``/X`` and ``X//`` are one file; a name that leaves the
  folder (``../X``) fails the load (``breakoutError``);
- a later member replaces an earlier one of the same name (``Unpack`` removes what
  is there first), except that two folders merge; ``containerd``'s importer
  (``core/images/archive/importer.go``, ``ImportIndex``) also keeps the later one.
  Two members that clean to one name are refused here: which one was meant cannot
  be known, and the engine would take the one a reader of names would not;
- a member written under a symlink or a file member is refused (extraction would
  follow or fail on it); a hard link is bound to the regular file it names;
- a name looked up (manifest, config, layer) follows symlinks of the archive: Docker
  up to 24 writes a layer repeated in an image as a symlink member,
  ``<id>/layer.tar -> ../<id0>/layer.tar`` (moby v20.10 and v24
  ``image/tarexport/save.go``, ``saveLayer``). A link that leaves the archive's root
  or loops is refused (``FollowSymlinkInScope`` clamps the one and gives up after 255
  links on the other; neither is anything a real ``docker save`` writes).

Pure: the caller reads the tar headers and hands each member in archive order.
"""

from __future__ import annotations

import posixpath
import tarfile
from dataclasses import dataclass
from typing import Literal, NoReturn

from buildmatrix.errors import InputError

MAX_LINKS = 255  # moby/sys/symlink FollowSymlinkInScope's limit

Kind = Literal["file", "dir", "symlink", "other"]


@dataclass(frozen=True, kw_only=True)
class SavedMember:
    """One member as extracted: its name as written, where it lands, what it is."""

    name: str
    path: str  # cleaned, relative to the extraction folder ("" is the folder)
    kind: Kind
    target: str = ""  # a symlink's target as written
    offset: int = 0  # where a regular file's bytes start in the archive
    size: int = 0
    sparse: bool = False


def clean_name(name: str, *, source: str) -> str:
    """Go's ``filepath.Clean`` of a member name, joined under the extraction folder
    (``Unpack``): the path below it, or an input error if it leaves it."""
    cleaned = posixpath.normpath(name) if name else "."
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")  # Go keeps one leading slash, POSIX two
    if cleaned == ".." or cleaned.startswith("../"):
        raise InputError(
            f"{source}: member '{name}' lies outside the archive's folder once cleaned "
            f"('{cleaned}'); docker load refuses such an archive (breakout), so it is "
            "refused."
        )
    relative = cleaned.lstrip("/")
    return "" if relative == "." else relative


def member_of(info: tarfile.TarInfo, *, source: str) -> tuple[SavedMember, str | None]:
    """A tar header as a member to :meth:`SaveTree.add`, and a hard link's target
    (the member then becomes the file that target names)."""
    kind: Kind = "other"
    if info.isreg():
        kind = "file"
    elif info.isdir():
        kind = "dir"
    elif info.issym():
        kind = "symlink"
    member = SavedMember(
        name=info.name,
        path=clean_name(info.name, source=source),
        kind=kind,
        target=info.linkname if info.issym() else "",
        offset=info.offset_data,
        size=info.size,
        sparse=info.issparse(),
    )
    return member, info.linkname if info.islnk() else None


class SaveTree:
    """The folder an archive extracts into, member by member, in archive order."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._members: dict[str, SavedMember] = {}

    def _refuse(self, why: str) -> NoReturn:
        raise InputError(f"{self.source}: {why}. Nothing was checked.")

    def add(self, member: SavedMember, *, link: str | None = None) -> None:
        """Put ``member`` where extraction puts it; ``link`` is a hard link's target
        (the member then is the regular file that target names)."""
        path = member.path
        if not path:
            if member.kind != "dir":
                self._refuse(f"member '{member.name}' names the archive's own folder")
            return
        parts = path.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            above = self._members.get(folder)
            if above is None:  # created as extraction creates missing parents
                self._members[folder] = SavedMember(name=f"{folder}/", path=folder, kind="dir")
            elif above.kind != "dir":
                self._refuse(
                    f"member '{member.name}' lies under '{above.name}', which is a "
                    f"{above.kind}, not a folder; docker load would write through or fail "
                    "on it"
                )
        earlier = self._members.get(path)
        if earlier is not None:
            if earlier.kind == "dir" and member.kind == "dir":
                return
            self._refuse(
                f"members '{earlier.name}' and '{member.name}' name the same file once "
                f"cleaned ('{path}'); docker load and containerd keep the later one, a "
                "reader going by name may take the first, so the archive is refused"
            )
        if link is not None:
            bound = self._members.get(clean_name(link, source=self.source))
            if bound is None or bound.kind != "file":
                self._refuse(
                    f"hard link '{member.name}' points at '{link}', which is not a "
                    "regular file earlier in the archive"
                )
            member = SavedMember(
                name=member.name,
                path=path,
                kind="file",
                offset=bound.offset,
                size=bound.size,
                sparse=bound.sparse,
            )
        self._members[path] = member

    def has(self, name: str) -> bool:
        return clean_name(name, source=self.source) in self._members

    def resolve(self, name: str, *, what: str) -> SavedMember:
        """The regular file ``name`` opens in the extracted folder, through the
        archive's symlinks (``safePath``)."""
        parts = clean_name(name, source=self.source).split("/")
        done: list[str] = []
        links = 0
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if not done:
                    self._refuse(f"{what} '{name}' leads out of the archive through '..'")
                done.pop()
                continue
            here = self._members.get("/".join([*done, part]))
            if here is None:
                self._refuse(f"{what} '{name}' is not in the archive")
            if here.kind == "symlink":
                links += 1
                if links > MAX_LINKS:
                    self._refuse(f"{what} '{name}' goes through a symlink loop")
                if here.target.startswith("/"):
                    done = []
                parts = [*here.target.split("/"), *parts]
                continue
            if parts and here.kind != "dir":
                self._refuse(f"{what} '{name}' runs through '{here.name}', not a folder")
            done.append(part)
        found = self._members.get("/".join(done))
        if found is None or found.kind != "file":
            kind = found.kind if found is not None else "the archive's folder"
            self._refuse(f"{what} '{name}' is a {kind}, not a regular file of the archive")
        return found

    def files(self) -> list[SavedMember]:
        return [m for m in self._members.values() if m.kind == "file"]
