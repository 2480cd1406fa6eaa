"""Which file ``libcuda.so.1`` is in a folder once ``ldconfig`` has run on it: the
file the dynamic loader then opens for ``dlopen("libcuda.so.1")``.

The NVIDIA container toolkit does not load the compat driver itself: its
``enable-cuda-compat`` hook only names the compat folder in
``/etc/ld.so.conf.d/00-compat-*.conf`` (NVIDIA/nvidia-container-toolkit
``cmd/nvidia-cdi-hook/cudacompat/cudacompat.go``, ``createLdsoconfdFile``), and its
``update-ldcache`` hook runs the host's ``ldconfig -f /etc/ld.so.conf -C
/etc/ld.so.cache`` inside the container root (``internal/ldconfig/ldconfig.go``,
``UpdateLDCache``: no ``-N``/``-X``, so ldconfig also rewrites the SONAME links).
The legacy runtime gives ldconfig the folder the same way (buildmatrix.forward_legacy).
What ldconfig then does in the folder is glibc's ``elf/ldconfig.c`` ``search_dir``
and ``create_links`` (glibc 2.36), rule by rule:

1. an entry counts when its name looks like a library (``_dl_is_dso``: ``lib*.so*``,
   ``ld-*.so*``, ``ld.so.*``, ``ld64.so.*``), is not a prelink temporary, and is a
   regular file or a symlink to one (a stale symlink is skipped); a symlink of
   another name counts too where the name is a hwcap platform's (``tls``, the
   machine's platform names: ``is_hwcap_platform``), which depends on the machine:
   such a symlink to a libcuda makes the choice unknown here;
2. the file must be an ELF shared object (``ET_DYN``) with a dynamic segment and a
   ``DT_STRTAB`` (``readlib.c`` ``process_file``, ``readelflib.c``); its SONAME is
   its ``DT_SONAME``, else the entry's own name (``implicit_soname``);
3. a symlink stays a link only where its own name is that SONAME (or the ``.so``
   development link, a prefix of it); any other symlink counts as a file of its
   own name;
4. per SONAME one entry wins: a file over a link, else the newer name by
   ``_dl_cache_libcmp`` (digit runs compared as numbers); on a tie the entry read
   first stays, and ``readdir`` order is the file system's: unknown here;
5. ``create_links``: the SONAME's own path is made a symlink to the winner, unless
   it already is the same file, or it exists and is not a symlink ("is not a
   symbolic link": then it is left as it is, and it is what is loaded);
6. the cache maps the SONAME to ``FOLDER/SONAME``. The loader's cache lookup
   compares names with ``_dl_cache_libcmp`` too (``elf/dl-cache.c``), so another
   SONAME equal to ``libcuda.so.1`` by it (``libcuda.so.01``) makes the pick unknown,
   and so does a ``libcuda`` in a subfolder (``glibc-hwcaps/*``, legacy hwcaps),
   which the loader may prefer.

Files of another ELF class or machine than the group's make the choice unknown
(ldconfig's machine filter, ``sysdeps/unix/sysv/linux/*/readelflib.c``, differs by
host). ``tests/test_ldconfig.py`` holds this model to the real ``ldconfig``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from buildmatrix.binary.compat_note import LIBCUDA

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping

    from buildmatrix.binary.compat_note import CompatLibrary

SONAME = "libcuda.so.1"
_INT = 1 << 32


def is_dso(name: str) -> bool:
    """glibc ``elf/dl-is_dso.h`` ``_dl_is_dso``."""
    return (
        (name.startswith(("lib", "ld-")) and ".so" in name)
        or name.startswith("ld.so.")
        or name.startswith("ld64.so.")
    )


_PRELINK = b".#prelink#"


def is_prelink_temporary(name: str) -> bool:
    """glibc ``elf/ldconfig.c`` ``search_dir``: a name ending in ``.#prelink#``, or in
    ``.#prelink#.`` and exactly six more bytes (``.#prelink#.XXXXXX``), is a prelink
    temporary and skipped; nothing else is."""
    raw = name.encode("utf-8", "surrogateescape")
    return raw.endswith(_PRELINK) or (
        len(raw) >= len(_PRELINK) + 7 and raw[-7 - len(_PRELINK) : -6] == _PRELINK + b"."
    )


def _int32(value: int) -> int:
    value %= _INT
    return value - _INT if value >= _INT >> 1 else value


def libcmp(a: str, b: str) -> int:
    """glibc ``elf/dl-cache.c`` ``_dl_cache_libcmp`` on bytes, with C's 32-bit ``int``
    wrapping and the signed ``char`` of x86-64."""
    p1, p2 = (
        a.encode("utf-8", "surrogateescape") + b"\0",
        b.encode("utf-8", "surrogateescape") + b"\0",
    )
    i = j = 0

    def digit(c: int) -> bool:
        return 0x30 <= c <= 0x39

    def signed(c: int) -> int:
        return c - 256 if c >= 128 else c

    while p1[i] != 0:
        if digit(p1[i]):
            if not digit(p2[j]):
                return 1
            v1 = v2 = 0
            while digit(p1[i]):
                v1, i = _int32(v1 * 10 + p1[i] - 0x30), i + 1
            while digit(p2[j]):
                v2, j = _int32(v2 * 10 + p2[j] - 0x30), j + 1
            if v1 != v2:
                return _int32(v1 - v2)
        elif digit(p2[j]):
            return -1
        elif p1[i] != p2[j]:
            return signed(p1[i]) - signed(p2[j])
        else:
            i, j = i + 1, j + 1
    return signed(p1[i]) - signed(p2[j])


@dataclass(frozen=True, kw_only=True)
class FolderView:
    """An image's final view, as far as ldconfig looks at it: regular files, symlinks
    (path -> target as written), folders, files that could not be read, and the
    files the readers recorded as libcuda candidates (by SONAME or name)."""

    entries: Collection[str]  # every non-folder path
    regular: Collection[str]
    symlinks: Mapping[str, str]
    folders: Collection[str]
    unreadable: Collection[str]
    libraries: Mapping[str, CompatLibrary]
    resolve: Callable[[str, Mapping[str, str]], str | None]
    machine: str | None = None  # the image platform's (``machine_of``), where known


# The ELF class, byte order and e_machine of each platform's 64-bit libraries, as
# buildmatrix.binary.dynamic names them (EM_X86_64 62, EM_AARCH64 183, EM_PPC64 21).
_MACHINES = {"amd64": "ELF64 LSB machine 62", "arm64": "ELF64 LSB machine 183",
             "ppc64le": "ELF64 LSB machine 21"}  # fmt: skip


def machine_of(platform: str | None) -> str | None:
    """The machine the loader of an ``os/arch[/variant]`` platform takes libraries of."""
    parts = (platform or "").split("/")
    return _MACHINES.get(parts[1]) if len(parts) > 1 and parts[0] == "linux" else None


@dataclass(frozen=True, kw_only=True)
class LdPick:
    """What ``FOLDER/libcuda.so.1`` is after ldconfig: ``path`` the file the loader
    opens (None: none in the folder, the node's own is used), or ``unknown`` why this
    cannot be told (fail closed)."""

    folder: str
    path: str | None
    library: CompatLibrary | None = None
    why: str = ""
    unknown: str | None = None


@dataclass(frozen=True, kw_only=True)
class _Entry:
    name: str
    soname: str
    link: bool
    machine: str


def pick(folder: str, view: FolderView) -> LdPick:
    """Rules 1-6 of the module docstring for ``libcuda.so.1`` in ``folder``."""
    here = (*view.regular, *view.symlinks, *view.unreadable)
    names = sorted({posixpath.basename(p) for p in here if posixpath.dirname(p) == folder})
    entries: list[_Entry] = []
    for name in names:
        entry = _entry(folder, name, view)
        if isinstance(entry, str):
            return LdPick(folder=folder, path=None, unknown=entry)
        if entry is not None:
            entries.append(entry)
    if (why := _elsewhere(folder, view, entries)) is not None:
        return LdPick(folder=folder, path=None, unknown=why)
    group = [e for e in entries if e.soname == SONAME]
    if not group:
        return LdPick(
            folder=folder, path=None, why=f"/{folder} holds no library of SONAME {SONAME}"
        )
    machines = {e.machine for e in group} | ({view.machine} if view.machine else set())
    if len(machines) > 1:  # ldconfig's machine filter depends on the host's glibc
        listed = ", ".join(f"{e.name} ({e.machine})" for e in group)
        host = f" on a {view.machine} host" if view.machine else ""
        why = f"/{folder} holds {SONAME} for several ELF classes or machines{host} ({listed})"
        return LdPick(folder=folder, path=None, unknown=why)
    winner = _winner(group)
    if winner is None:
        tied = ", ".join(e.name for e in group)
        why = (
            f"ldconfig's choice among {tied} in /{folder} depends on the order the file "
            "system lists them (they tie by glibc's _dl_cache_libcmp)"
        )
        return LdPick(folder=folder, path=None, unknown=why)
    return _loaded(folder, winner, view)


def _entry(folder: str, name: str, view: FolderView) -> _Entry | str | None:
    """One directory entry as ldconfig counts it (None: not counted, str: unknown)."""
    path = f"{folder}/{name}"
    link = path in view.symlinks
    if is_prelink_temporary(name):
        return None
    final = view.resolve(path, view.symlinks) if link else path
    if (
        final is None
        or final in view.folders
        or (link and final not in view.regular and final not in view.unreadable)
    ):
        return None  # a stale link, or a folder (rule 6 looks at those)
    lib = view.libraries.get(final)
    if not is_dso(name):
        if link and lib is not None:
            return (
                f"/{path} links to /{final}; ldconfig counts it where its name is a hwcap "
                "platform's"
            )
        return None
    if final in view.unreadable:
        return f"/{final} could not be read, so its SONAME is unknown"
    if lib is None:
        # Unrecorded: not ELF where its own name is libcuda's (binary.scan records every
        # ELF file so named), so ldconfig skips it; else its SONAME is not libcuda's,
        # but where it has none, a link's own name would stand for it.
        if link and name.startswith(LIBCUDA) and not posixpath.basename(final).startswith(LIBCUDA):
            return f"the SONAME of /{final}, which /{path} links to, was not read"
        return None  # its SONAME and name are not libcuda's (binary.scan records those)
    if lib.ld_unknown is not None:
        return f"what ldconfig reads from /{final} is unknown: {lib.ld_unknown}"
    if lib.ld_skip is not None:
        return None
    soname = lib.soname or name
    keep_link = link and (name == soname or (name.endswith(".so") and soname.startswith(name)))
    return _Entry(
        name=name, soname=name if keep_link else soname, link=keep_link, machine=lib.machine
    )


def _elsewhere(folder: str, view: FolderView, entries: list[_Entry]) -> str | None:
    """Rule 6: a SONAME the loader takes for libcuda.so.1, or a libcuda below the folder."""
    for e in entries:
        if e.soname != SONAME and libcmp(e.soname, SONAME) == 0:
            return (
                f"/{folder}/{e.name} has SONAME {e.soname}, which the loader's cache lookup "
                f"takes for {SONAME}"
            )

    def libcuda(p: str) -> bool:
        return posixpath.basename(p).startswith(LIBCUDA) or p in view.libraries

    below = [
        p
        for p in (*view.regular, *view.symlinks, *view.unreadable)
        if p.startswith(folder + "/") and posixpath.dirname(p) != folder and libcuda(p)
    ]
    for p in view.symlinks:  # a subfolder that is a symlink to a folder elsewhere
        target = view.resolve(p, view.symlinks) if posixpath.dirname(p) == folder else None
        if target in view.folders:
            below += [q for q in (*view.libraries, *view.unreadable) if q.startswith(f"{target}/")]
    if below:
        return (
            f"/{below[0]} lies in a subfolder of /{folder}; ldconfig caches glibc-hwcaps and "
            "hwcap subfolders, which the loader may prefer"
        )
    return None


def _better(old: _Entry, new: _Entry) -> bool:
    """``search_dir``: whether ``new`` replaces ``old`` as the SONAME's entry."""
    return (not new.link and old.link) or (new.link == old.link and libcmp(old.name, new.name) < 0)


def _winner(group: list[_Entry]) -> _Entry | None:
    """The entry ldconfig keeps whatever the order it reads them in; None where the
    order decides (rule 4). One that every other yields to and that yields to none
    wins in any order; without one, some order differs."""
    for e in group:
        if all(_better(o, e) and not _better(e, o) for o in group if o is not e):
            return e
    return None if len(group) > 1 else group[0]


def _loaded(folder: str, winner: _Entry, view: FolderView) -> LdPick:
    """Rule 5: the file ``FOLDER/libcuda.so.1`` is once the links are made."""
    own = f"{folder}/{SONAME}"
    target = view.resolve(f"{folder}/{winner.name}", view.symlinks)
    current = view.resolve(own, view.symlinks)
    exists = current is not None and (current in view.entries or current in view.folders)
    if winner.link or not exists or current == target:
        path = target
        how = (
            f"ldconfig links /{own} to {winner.name}" if not winner.link else f"/{own} links to it"
        )
    elif own in view.symlinks:
        path = target
        how = f"ldconfig points the symlink /{own} at {winner.name}"
    else:
        path = own
        how = (
            f"ldconfig picks {winner.name}, but /{own} is not a symbolic link, so it stays "
            "and is loaded"
        )
    if path is None or path not in view.regular:
        why = f"/{own} is not a readable regular file after ldconfig ({how})"
        return LdPick(folder=folder, path=None, unknown=why)
    lib = view.libraries.get(path)
    if path in view.unreadable or lib is None:
        why = f"the loader takes /{path} ({how}), which was not read as a libcuda"
        return LdPick(folder=folder, path=path, unknown=why)
    return LdPick(folder=folder, path=path, library=lib, why=f"{how}: the loader takes /{path}")


def searched_first(value: str, view: FolderView) -> tuple[str | None, str] | None:
    """A ``libcuda.so.1`` the loader finds through ``LD_LIBRARY_PATH`` (the image's
    environment), which it searches before its cache (glibc ``elf/dl-load.c``
    ``_dl_map_object``: ``__rtld_env_path_list`` first; entries split at ``:`` and
    ``;``, ``_dl_init_paths``): (the folder, why), or None. An entry that is empty or
    relative (the working folder decides) or holds a dynamic string token (``$ORIGIN``:
    the program's folder decides) counts where the image holds any ``libcuda.so.1``
    (folder None)."""
    anywhere = [p for p in view.entries if posixpath.basename(p) == SONAME]
    for raw, folder, holds in _path_entries(value, view):
        if folder is None:  # relative, or a token: the loader's caller decides
            if anywhere:
                why = (
                    f"LD_LIBRARY_PATH holds '{raw}', which the loader searches before its cache "
                    f"and which may be the folder of /{anywhere[0]}"
                )
                return None, why
            continue
        if holds:
            why = (
                f"LD_LIBRARY_PATH names {raw}, where the loader finds /{folder}/{SONAME} "
                "before its cache, whatever the container toolkit chooses"
            )
            return folder, why
    return None


def _path_entries(value: str, view: FolderView) -> Iterator[tuple[str, str | None, bool]]:
    """Each ``LD_LIBRARY_PATH`` entry as the loader splits them (``:`` and ``;``):
    (the entry, its folder in ``view`` — None where it is empty, relative or holds a
    dynamic string token —, whether the loader finds ``libcuda.so.1`` there). An
    absolute entry that leads nowhere in the image is left out."""
    for raw in value.replace(";", ":").split(":"):
        if not raw.startswith("/") or "$" in raw:
            yield raw, None, False
            continue
        folder = view.resolve(raw, view.symlinks)
        if folder is None:
            continue
        found = view.resolve(f"{folder}/{SONAME}", view.symlinks) if folder else SONAME
        yield raw, folder, found is not None and found in view.entries


# The folders the container toolkit mounts a node's driver into: the host's own
# library folders (CDI keeps the host path) or the image's (libnvidia-container
# ``cnt->cfg.libs_dir``): glibc's system folders on each platform (the update-ldcache
# hook's ``debianSystemSearchPaths`` and ``nonDebianSystemSearchPaths``,
# internal/ldconfig/ldconfig.go).
DRIVER_FOLDERS = (
    "lib", "usr/lib", "lib64", "usr/lib64",
    *(f"{p}lib/{a}-linux-gnu" for p in ("", "usr/") for a in ("x86_64", "aarch64", "powerpc64le")),
)  # fmt: skip


def driver_first(value: str, view: FolderView) -> str | None:
    """Why the node's own ``libcuda.so.1`` may come first through ``LD_LIBRARY_PATH``
    (None: it cannot): an entry naming a folder the toolkit mounts the node's driver
    into (:data:`DRIVER_FOLDERS`) before any entry where the image holds a
    ``libcuda.so.1``. The loader searches those entries before its cache
    (``searched_first``), so there the compat driver the cache holds is passed over.
    A folder the node mounts its driver into elsewhere is not known here."""
    drivers = {view.resolve(f, view.symlinks) for f in DRIVER_FOLDERS} | set(DRIVER_FOLDERS)
    for raw, folder, holds in _path_entries(value, view):
        if folder is None:
            continue
        if holds:
            return None
        if folder in drivers:
            return (
                f"LD_LIBRARY_PATH names {raw}, a folder the node's driver is mounted into, "
                "which the loader searches before its cache: there the node's "
                f"{SONAME} is loaded, not the compat driver"
            )
    return None
