"""Whether a file of the image itself may be loaded as ``libcuda.so.1`` in place of the
node's driver, outside the folders buildmatrix models (the compat folder,
buildmatrix.ldconfig; ``LD_LIBRARY_PATH``, ``ldconfig.searched_first``), and the
other ways the loader reaches one first: ``LD_PRELOAD`` (:func:`preloaded_libcuda`)
and the ELF files' ``DT_RPATH``/``DT_RUNPATH`` (:func:`searched_by_rpath`).

The node's driver is mounted into the image's own library folder (legacy runtime:
NVIDIA/libnvidia-container ``src/nvc_mount.c`` ``nvc_driver_mount``, ``mount_files``
into ``cnt->cfg.libs_dir``, set in ``src/nvc_container.c``; the multiarch
``/usr/lib/x86_64-linux-gnu`` on Debian and Ubuntu roots; CDI mounts keep the host
driver's own path), then ``ldconfig`` is run in the image root on the image's own
``/etc/ld.so.conf`` (buildmatrix.ldconfig). What the loader opens for
``libcuda.so.1`` then depends on files of the image that this rule does not read:

- ``/etc/ld.so.preload``: glibc ``elf/rtld.c`` ``dl_main`` loads every object it
  names before the program's own dependencies, whatever the cache says;
- the folders ldconfig scans, in order: those named by ``/etc/ld.so.conf`` and the
  files its ``include`` globs match (``elf/ldconfig.c`` ``parse_conf``,
  ``parse_conf_include``; Debian/Ubuntu's stock ``libc.conf`` names
  ``/usr/local/lib``, and sorts before ``x86_64-linux-gnu.conf``), then the trusted
  folders (``SYSTEM_DIRS``: ``/lib``, ``/usr/lib``, and the ``lib64`` or multiarch
  ones of the host's build); per SONAME the first folder's wins, and in one folder
  the newer name (``search_dir``), and a regular ``libcuda.so.1`` there is never
  replaced by a link (``create_links``: "is not a symbolic link").

So the node's driver is the one loaded only where no file of the image can take
``libcuda.so.1``'s place: ``check`` fails closed where the image holds
``/etc/ld.so.preload``, or a libcuda (by file name or by ``DT_SONAME``, as
buildmatrix.binary.scan records them) anywhere but in a CUDA compat folder
(``/usr/local/cuda[-X.Y]/compat``, which no stock configuration names: the
container toolkit's hook names it, buildmatrix.forward) or a ``stubs`` folder
(the CUDA toolkit's link-time stubs, ``targets/<arch>/lib/stubs``, which no stock
configuration names either). A stub copied elsewhere, or a driver left in the
image, fails, even where no configuration names its folder: the configuration files
are not read (docs/compatibility.md, "Not read").
"""

from __future__ import annotations

import posixpath
import re
from typing import TYPE_CHECKING

from buildmatrix.binary.compat_note import LIBCUDA
from buildmatrix.binary.dynamic import AUDIT
from buildmatrix.ldconfig import DRIVER_FOLDERS, SONAME, driver_first, searched_first

if TYPE_CHECKING:
    from collections.abc import Collection, Iterator, Mapping

    from buildmatrix.ldconfig import FolderView

PRELOAD = "etc/ld.so.preload"
_COMPAT = re.compile(r"usr/local/cuda(-[0-9]+(\.[0-9]+)*)?/compat")


def _libcuda(path: str, view: FolderView) -> bool:
    """A file the loader may take for ``libcuda.so.1``: named ``libcuda.so*``, or of
    such a SONAME, or one whose SONAME could not be read."""
    if posixpath.basename(path).startswith(LIBCUDA):
        return True
    lib = view.libraries.get(path)
    if lib is None:
        return False
    return lib.ld_unknown is not None or (lib.soname or "").startswith(LIBCUDA)


def _exempt(path: str, modelled: Collection[str | None]) -> bool:
    folder = posixpath.dirname(path)
    return (
        folder in modelled
        or _COMPAT.fullmatch(folder) is not None
        or posixpath.basename(folder) == "stubs"
    )


def _every(view: FolderView) -> Iterator[str]:
    """Each path of the view once, without a set of them all built (an image may hold
    a million): its entries, then the libraries and unreadable files it does not list."""
    yield from view.entries
    yield from (p for p in {*view.libraries, *view.unreadable} if p not in view.entries)


def exempt_libcuda(view: FolderView, modelled: Collection[str | None]) -> list[str]:
    """The libcudas :func:`image_libcuda` lets pass (in a compat or stubs folder):
    those the loader takes only where a configuration file names their folder
    (buildmatrix.ldsoconf)."""
    return sorted(p for p in _every(view) if _libcuda(p, view) and _exempt(p, modelled))


def image_libcuda(view: FolderView, modelled: Collection[str | None]) -> str | None:
    """Why a file of the image may be loaded as ``libcuda.so.1`` instead of the node's
    driver (None: none can). ``modelled``: the compat folders buildmatrix.ldconfig
    models, as final paths."""
    preload = view.resolve(PRELOAD, view.symlinks)
    if PRELOAD in view.entries or preload in view.entries:
        return (
            f"the image holds /{PRELOAD}, whose libraries glibc's loader maps before any "
            "other (elf/rtld.c), so the node's libcuda.so.1 may not be the one loaded"
        )
    found = sorted(p for p in _every(view) if _libcuda(p, view) and not _exempt(p, modelled))
    if not found:
        return None
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (
        f"the image holds /{found[0]}{more}, a libcuda outside the CUDA compat and stubs "
        "folders: ldconfig may put it ahead of the node's driver (a folder its "
        "/etc/ld.so.conf names, the folder the driver is mounted into, or a regular "
        "libcuda.so.1 that ldconfig does not replace), and buildmatrix does not read "
        "the loader's configuration"
    )


def _libcudas(view: FolderView) -> list[str]:
    return sorted(p for p in _every(view) if _libcuda(p, view))


def audited_libcuda(value: str, view: FolderView) -> str | None:
    """Why an ``LD_AUDIT`` module of the image's environment may have the loader map a
    libcuda of the image (None: it cannot). glibc ``elf/rtld.c`` loads each module
    ``LD_AUDIT`` names (split at ``:``, ``audit_list_next``) before the program, and a
    module's ``la_objsearch`` may give the loader any other name for
    ``libcuda.so.1`` (``elf/dl-load.c`` ``_dl_map_object``; man 7 rtld-audit): what
    it does is code, so where the image holds any libcuda this fails closed."""
    if not value.strip(":"):
        return None
    libcudas = _libcudas(view)
    if not libcudas:
        return None
    return (
        f"the image's LD_AUDIT names '{value}', an audit module glibc's loader runs before "
        f"the program, which may have it map /{libcudas[0]} for libcuda.so.1 "
        "(la_objsearch, elf/dl-load.c), whatever the container toolkit chose"
    )


def preloaded_libcuda(value: str, view: FolderView) -> str | None:
    """Why a library the image's ``LD_PRELOAD`` names may be the ``libcuda.so.1`` a
    process uses (None: none can). glibc ``elf/rtld.c`` ``handle_preload_list`` splits
    the value at spaces and colons and maps each entry before the program's own
    dependencies (``do_preload``, ``_dl_map_object``): one with a ``/`` is opened as
    written (relative to the working folder; ``$ORIGIN`` and the other dynamic string
    tokens expanded), any other is searched by file name. A later
    ``dlopen("libcuda.so.1")`` returns an object already mapped whose ``DT_SONAME`` is
    that name (``elf/dl-load.c`` ``_dl_map_object``), so a preloaded compat driver or
    link-time stub is used whatever the container toolkit decided. A bare
    ``libcuda.so.1`` is searched as the program's own dependency is (the rest of the
    model); a bare name of another libcuda counts where the image holds a file so
    named."""
    if not value.strip(" :"):
        return None
    libcudas = sorted(p for p in _every(view) if _libcuda(p, view))
    for raw in re.split("[ :]", value):
        if not raw or raw == "libcuda.so.1":
            continue
        if "/" not in raw:
            hit = next((p for p in libcudas if posixpath.basename(p) == raw), None)
        elif not raw.startswith("/") or "$" in raw:
            hit = libcudas[0] if libcudas else None
        else:
            final = view.resolve(raw.lstrip("/"), view.symlinks)
            if final is None or final not in view.entries:
                hit = None  # nothing to map: the loader says so and goes on
            elif final in view.unreadable or _libcuda(final, view) or _libcuda(raw, view):
                hit = final
            else:
                hit = None
        if hit is not None:
            return (
                f"the image's LD_PRELOAD names '{raw}', which glibc's loader maps before "
                f"anything else and which may be /{hit}, a libcuda: a later dlopen of "
                "libcuda.so.1 returns it (elf/rtld.c handle_preload_list), whatever the "
                "container toolkit chose"
            )
    return None


def _search_entries(
    searches: Mapping[str, tuple[str, ...]], view: FolderView
) -> Iterator[tuple[str, str, str]]:
    """(file, entry as written, entry with ``$ORIGIN`` expanded) for every entry of
    every file's ``DT_RPATH``/``DT_RUNPATH`` (split at ``:``, glibc ``fillin_rpath``).
    ``$ORIGIN`` is the folder the object is mapped from (``_dl_new_object``): its own,
    or that of a symlink to it."""
    origins: dict[str, set[str]] = {p: {posixpath.dirname(p)} for p in searches}
    if any("ORIGIN" in s for strings in searches.values() for s in strings):
        # Only a link whose target is named like a searched file or another link can end
        # at one (a folder link gives the same physical folders).
        names = {posixpath.basename(p) for p in (*searches, *view.symlinks)}
        for link, target in view.symlinks.items():
            if posixpath.basename(target.rstrip("/")) not in names:
                continue
            final = view.resolve(link, view.symlinks)
            if final in origins:
                origins[final].add(posixpath.dirname(link))
    for path in sorted(searches):
        for string in searches[path]:
            if string == AUDIT:
                continue
            for raw in string.split(":"):
                entry = raw.replace("${ORIGIN}", "$ORIGIN")
                for where in sorted({entry.replace("$ORIGIN", f"/{o}") for o in origins[path]}):
                    yield path, raw, where


def _said(path: str, raw: str) -> str:
    return f"/{path} has the search path '{raw}' (DT_RPATH/DT_RUNPATH)"


def searched_by_rpath(
    searches: Mapping[str, tuple[str, ...]], view: FolderView
) -> tuple[list[tuple[str | None, str]], str | None]:
    """What the loader finds through the ``DT_RPATH`` or ``DT_RUNPATH`` of the image's
    ELF files (``searches``: the strings by the file's final path), which it searches
    before its cache (glibc ``elf/dl-load.c`` ``_dl_map_object``: the calling
    object's, its loaders' and the program's ``DT_RPATH`` before ``LD_LIBRARY_PATH``,
    ``DT_RUNPATH`` after it): (each ``libcuda.so.1`` of the image it may find there,
    as (its folder, why), one per folder;
    why the node's driver may be found first: an entry naming a folder the toolkit
    mounts it into, buildmatrix.ldconfig.DRIVER_FOLDERS, that holds no ``libcuda.so.1``
    of the image). Which objects ``dlopen`` libcuda is not known, so every file's
    count. An entry with another dynamic string token than ``$ORIGIN``, or relative
    (the working folder), or unread, counts where the image holds any
    ``libcuda.so.1`` (folder None)."""
    if not searches:
        return [], None
    found: dict[str | None, str] = {}  # folder -> why
    audit = next((p for p in sorted(searches) if AUDIT in searches[p]), None)
    libcudas = _libcudas(view) if audit is not None else []
    if audit is not None and libcudas:
        found[None] = (
            f"/{audit} names an audit module (DT_AUDIT/DT_DEPAUDIT), which glibc's loader "
            f"runs before the program and which may have it map /{libcudas[0]} for "
            "libcuda.so.1 (la_objsearch, elf/dl-load.c), whatever the container toolkit chose"
        )
    anywhere = sorted(p for p in view.entries if p.endswith(f"/{SONAME}") or p == SONAME)
    drivers = {view.resolve(f, view.symlinks) for f in DRIVER_FOLDERS} | set(DRIVER_FOLDERS)
    folders: dict[str, str | None] = {}  # entry -> final folder, each resolved once
    seen: set[str] = set()
    node: str | None = None
    for path, raw, where in _search_entries(searches, view):
        if not where.startswith("/") or "$" in where:
            if anywhere and None not in found:
                found[None] = (
                    f"{_said(path, raw)}, which the loader searches before its cache and "
                    f"which may be the folder of /{anywhere[0]}"
                )
            continue
        if where not in folders:
            folders[where] = view.resolve(where.lstrip("/"), view.symlinks)
        folder = folders[where]
        if folder is None or folder in seen:
            continue
        seen.add(folder)
        here = view.resolve(f"{folder}/{SONAME}", view.symlinks) if anywhere else None
        if here is not None and here in view.entries:
            found[folder] = (
                f"{_said(path, raw)}, where the loader finds /{folder}/{SONAME} before its "
                "cache, whatever the container toolkit chooses"
            )
        elif folder in drivers and node is None:
            node = (
                f"{_said(path, raw)}, a folder the node's driver is mounted into, which the "
                f"loader searches before its cache: there the node's {SONAME} is loaded, not "
                "the compat driver"
            )
    return list(found.items()), node


def before_cache(
    library_path: str, searches: Mapping[str, tuple[str, ...]], view: FolderView, hook: str | None
) -> tuple[tuple[str | None, str] | None, str | None]:
    """What the loader finds before its cache, through ``LD_LIBRARY_PATH`` and the search
    paths: (a ``libcuda.so.1`` of the image found first, as (its folder, why): one in
    another folder than ``hook``, the compat folder the hook puts in use, where there
    is one; why the node's driver may be found first)."""
    first = searched_first(library_path, view) if library_path else None
    by_rpath, node = searched_by_rpath(searches, view)
    found = [f for f in (first, *by_rpath) if f is not None]
    preload = next((f for f in found if f[0] != hook), found[0] if found else None)
    return preload, (driver_first(library_path, view) if library_path else None) or node
