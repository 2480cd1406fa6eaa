"""Where the image's own loader configuration decides instead of the NVIDIA container
toolkit's ``enable-cuda-compat`` hook (docs/compatibility.md, "Forward compatibility",
rule 6 of buildmatrix.forward).

The hook puts the compat folder in use only by naming it in
``/etc/ld.so.conf.d/00-compat-*.conf`` (nvidia-container-toolkit
``cmd/nvidia-cdi-hook/cudacompat/cudacompat.go`` ``createLdsoconfdFile``), for
``ldconfig`` to read. buildmatrix.ldsoconf reads what the image's configuration makes
``ldconfig`` search; this module says what that means for buildmatrix.forward:

- a configuration that names a compat or stubs folder holding a libcuda, other than
  the hook's, or that cannot be followed, fails closed (buildmatrix.ldshadow lets such
  a libcuda pass only because no stock configuration names its folder);
- one that names the hook's compat folder itself puts its libcuda in the cache even
  where the hook would not use it;
- one that never reads the hook's file leaves the node's own libcuda.so.1 loaded;
- one that names a folder before the compat folder (a line of ``/etc/ld.so.conf``
  above its ``include``, a file of ``/etc/ld.so.conf.d`` that sorts before
  ``00-compat-*.conf``) has ldconfig cache that folder's ``libcuda.so.1`` first
  (``elf/cache.c`` ``add_to_cache`` keeps entries of one SONAME in the order the
  folders are scanned, ``elf/dl-cache.c`` ``search_cache`` takes the first): where
  the node's driver lies there, it is loaded, not the compat driver. Which folder the
  node's driver is in is the host's (the ``update-ldcache`` hook writes it to
  ``00-nvcr-*.conf`` only where the image's configuration does not name it already,
  ``internal/ldconfig/ldconfig.go`` ``filterDirectories``), so that fails closed.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING

from buildmatrix.binary.ldconf_file import CONF
from buildmatrix.ldshadow import exempt_libcuda
from buildmatrix.ldsoconf import read_loader_conf

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from buildmatrix.binary.ldconf_file import ConfFile
    from buildmatrix.ldconfig import FolderView


@dataclass(frozen=True, kw_only=True)
class ConfEffect:
    """What the image's loader configuration does to the toolkit's lookup."""

    undetermined: str | None  # why ldconfig may cache a libcuda whatever the hook decides
    hook_read: bool | None  # whether ldconfig reads the hook's 00-compat-*.conf (None: unknown)
    named: bool  # whether the configuration names the hook's compat folder itself
    ahead: tuple[str, ...] = ()  # the folders ldconfig scans before the compat folder


@dataclass(frozen=True, kw_only=True)
class ConfRefusal:
    """Why the compat library the hook would use is not the one loaded."""

    why: str
    undetermined: bool  # the effect is unknown: check fails closed


def conf_effect(
    view: FolderView,
    modelled: Collection[str | None],
    hook: str | None,
    confs: Mapping[str, ConfFile],
) -> ConfEffect | None:
    """The image's own loader configuration, where a compat or stubs folder holds a
    libcuda (``modelled``: the compat folders the toolkit's lookup models; ``hook``:
    the folder of the compat library the hook finds, if any). None where no such
    libcuda is there, so the configuration does not matter."""
    exempt = exempt_libcuda(view, modelled)
    if not exempt:
        return None
    conf = read_loader_conf(view, confs)
    # ldconfig scans a folder and its hwcap subfolders (search_dir), never "stubs".
    named = [
        p
        for p in exempt
        for f in conf.folders
        if p.startswith(f"{f}/") and "stubs" not in p[len(f) + 1 :].split("/")[:-1]
    ]
    other = [p for p in named if posixpath.dirname(p) != hook]
    why = None
    if conf.unknown is not None:
        why = (
            f"the image's loader configuration (/etc/ld.so.conf) cannot be followed: "
            f"{conf.unknown}; it may name the folder of /{exempt[0]}, a libcuda that "
            "ldconfig then caches whatever the container toolkit's hook decides"
        )
    elif other:
        why = (
            f"the image's loader configuration (/etc/ld.so.conf and what it includes) "
            f"names /{posixpath.dirname(other[0])}, so ldconfig caches /{other[0]} "
            "whatever the container toolkit's hook decides"
        )
    # Where the compat folder comes in ldconfig's order: the hook's file, or where the
    # configuration names it first; the folders named before it come first.
    first = len(conf.ahead) if conf.hook_read else len(conf.listed)
    if hook is not None and hook in conf.listed:
        first = min(first, conf.listed.index(hook))
    ahead = conf.listed[:first] if named or conf.hook_read else ()
    return ConfEffect(undetermined=why, hook_read=conf.hook_read, named=bool(named), ahead=ahead)


def conf_refusal(
    *,
    folder: str,
    named: bool,
    hook_read: bool | None,
    in_use: bool,
    decided: str,
    driver: str,
    ahead: tuple[str, ...] = (),
) -> ConfRefusal | None:
    """Where the image's own configuration decides instead of the hook: it names the
    compat ``folder`` itself, or never reads the hook's file, or names folders that
    ldconfig scans before it (``ahead``). ``in_use`` and ``decided`` are the hook's
    decision and why, on ``driver``."""
    if in_use and ahead and (named or hook_read is True):
        listed = ", ".join(f"/{f}" for f in ahead[:3]) + (" ..." if len(ahead) > 3 else "")
        why = (
            f"{decided}; but the image's loader configuration names {listed} before "
            f"/{folder}, so ldconfig caches a libcuda.so.1 there first: where the node's "
            "driver is mounted in one of them, the node's driver is loaded, not the "
            "compat driver, and which folder that is depends on the node"
        )
        return ConfRefusal(why=why, undetermined=True)
    if named:
        if in_use:
            return None
        why = (
            f"the image's loader configuration names /{folder} itself, so ldconfig "
            f"caches its libcuda although the hook would not use it ({decided}); "
            f"whether that driver runs on driver {driver} is unknown"
        )
        return ConfRefusal(why=why, undetermined=True)
    if not in_use or hook_read is True:
        return None
    if hook_read is False:
        why = (
            f"{decided}; but the image's /etc/ld.so.conf includes no "
            "/etc/ld.so.conf.d/*.conf, so ldconfig never reads the hook's "
            "00-compat-*.conf: the node's own libcuda.so.1 is loaded"
        )
        return ConfRefusal(why=why, undetermined=False)
    why = (
        f"{decided}; but whether ldconfig reads the hook's "
        "/etc/ld.so.conf.d/00-compat-*.conf is unknown: an include pattern of the "
        "image's /etc/ld.so.conf matches some of the names the hook gives it only"
    )
    return ConfRefusal(why=why, undetermined=True)


CACHE = "etc/ld.so.cache"


def older_releases(view: FolderView) -> str | None:
    """Why the container toolkit releases that first shipped the ``enable-cuda-compat``
    hook leave the folder it names unused (None: they use it as the current ones do).

    - Releases 1.17.5 to 1.18.0 do not create a missing ``/etc/ld.so.conf``
      (``ensureLdsoconfFile`` came in 1.18.1): glibc's ``ldconfig -f /etc/ld.so.conf``
      then reads no configuration, and never the hook's ``00-compat-*.conf``.
    - Releases 1.17.5 to 1.18.0-rc.5 run ``ldconfig -N`` (no cache) where the image
      has no ``/etc/ld.so.cache`` (``cmd/nvidia-cdi-hook/update-ldcache`` ``runLdconfig``,
      ``containerRoot.hasPath``): the loader then has no cache to find the compat
      folder in.

    Either way the node's own ``libcuda.so.1`` is loaded there."""
    top = view.resolve(CONF, view.symlinks)
    if top is None or (CONF not in view.entries and top not in view.entries):
        return (
            "NVIDIA container toolkit releases 1.17.5 to 1.18.0 do not create the "
            "/etc/ld.so.conf this image lacks (ensureLdsoconfFile came in 1.18.1), so "
            "their ldconfig never reads the hook's 00-compat-*.conf: the node's own "
            "libcuda.so.1 is loaded"
        )
    cache = view.resolve(CACHE, view.symlinks)
    if cache is None or (cache not in view.entries and cache not in view.folders):
        return (
            "NVIDIA container toolkit releases 1.17.5 to 1.18.0-rc.5 run ldconfig -N (no "
            "cache) where the image has no /etc/ld.so.cache, as this one, so the loader "
            "finds no compat folder: the node's own libcuda.so.1 is loaded"
        )
    return None
