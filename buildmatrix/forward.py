"""CUDA forward compatibility: the ``cuda-compat`` driver an image ships, and when a
node runs the image through it.

The facts, and where they come from (docs/compatibility.md, "Forward compatibility"):

- NVIDIA's CUDA Compatibility guide, "Forward Compatibility": the ``cuda-compat-X-Y``
  package puts a newer user-mode driver, ``libcuda.so.<driver version>``, in
  ``/usr/local/cuda-X.Y/compat``; with it, a newer CUDA runtime runs on an older
  kernel-mode driver. It works on NVIDIA data-center GPUs (and select NGC-ready RTX
  boards and Jetson) only; elsewhere CUDA fails to start with
  ``cudaErrorCompatNotSupportedOnDevice`` (804, CUDA runtime API reference).
- Whether a container uses it is decided when the container is created, by the NVIDIA
  Container Toolkit's ``enable-cuda-compat`` hook. Its source (NVIDIA/nvidia-container-
  toolkit, ``cmd/nvidia-cdi-hook/cudacompat``), rule by rule:

  1. ``getContainerForwardCompatDir``: ``/usr/local/cuda/compat`` is opened inside the
     container root, every symlink on the way followed inside the root
     (``root.hasPath``, ``pathrs.OpenatInRoot``), whatever the folder it ends in is
     called;
  2. ``root.globFiles`` (container-root_linux.go): the folder's entries that match
     ``libcuda.so.*.*`` and are **regular files** (``dentry.Type().IsRegular()``): a
     symlink or a folder of that name is not a candidate, a hard link is a regular
     file like any other;
  3. exactly one candidate, else nothing is used;
  4. ``useCompatLibraries``: the compat and host driver versions are parsed with
     Masterminds semver's ``NewVersion`` (buildmatrix.forward_semver); the note is read
     (buildmatrix.binary.compat_note); where a note was read, ``compatElfHeader.
     UseCompat`` decides: the host major must be in the note's ``driver`` list (a
     note without one lists nothing) and the compat driver must compare newer than
     the host's; a version that does not parse means not used;
  5. where no note was read (none, or unreadable): used iff the host major is lower
     than the compat driver's;
  6. used means only that the hook names the folder in
     ``/etc/ld.so.conf.d/00-compat-*.conf`` (``createLdsoconfdFile``): the file the
     loader then opens as ``libcuda.so.1`` is the one ``ldconfig`` makes of the folder,
     by SONAME (buildmatrix.ldconfig), which may be another than the one the hook
     judged (a regular ``libcuda.so.1`` of an older driver, a ``libcuda.so.999`` whose
     SONAME is ``libcuda.so.1``). The driver version that counts is that file's, read
     from its name (``libcuda.so.X.Y[.Z]``) and judged by rules 4-5 in turn; where it
     cannot be read or does not pass them, ``check`` fails closed.

  The runtime passes the hook only ``--host-driver-version`` on an NVML host
  (``internal/discover/compat_libs.go``, ``pkg/nvcdi/driver-nvml.go``), so the note's
  CUDA-version rule (CSV mode, Jetson) never applies here.
- The note's ``device`` values are the NVML brand types (``nvmlBrandType_t``) the
  library accepts: the lists NVIDIA ships leave out exactly GeForce, TITAN, NVS and
  GRID, the brands that are not data-center or professional boards. This reading is
  ours (NVIDIA does not document the field); where the brand is unknown the product
  name decides, and GeForce, TITAN and NVS boards are refused either way.

Kernel-mode limits stay with the host driver: a GPU's hardware floor is never met
through the compat library; the CUDA runtime floor and PTX JIT are.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from buildmatrix.binary.compat_note import NOTE_SECTION, CompatLibrary, read_compat_library
from buildmatrix.cuda import DriverVersion, parse_driver_version
from buildmatrix.errors import InputError
from buildmatrix.forward_conf import conf_effect, conf_refusal, older_releases
from buildmatrix.forward_legacy import CUDART_DIR, LegacySetup, find_legacy
from buildmatrix.forward_semver import parse_semver, semver_newer
from buildmatrix.ldconfig import FolderView, LdPick, machine_of, pick
from buildmatrix.ldshadow import audited_libcuda, before_cache, image_libcuda, preloaded_libcuda

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from buildmatrix.binary.ldconf_file import ConfFile

__all__ = ["NOTE_SECTION", "CompatLibrary", "read_compat_library"]

COMPAT_DIR = "usr/local/cuda/compat"  # where the container toolkit looks
LIBRARY_GLOB = "libcuda.so.*.*"
_MAX_LINK_HOPS = 40


def is_driver_name(path: str) -> bool:
    """Whether the toolkit's glob matches the file's name (``filepath.Match``). Such a
    file, in whatever folder, is read for its note: the compat folder is known only
    on the final view, and may be reached through symlinks under any name."""
    return fnmatch.fnmatchcase(posixpath.basename(path), LIBRARY_GLOB)


def compat_code(setup: CompatSetup | None, libraries: Mapping[str, CompatLibrary]) -> list[str]:
    """The paths whose device code counts although they were read as driver
    libraries: all but the compat driver the toolkit finds (that one is the driver)."""
    chosen = {setup.library.path} if setup is not None and setup.library is not None else set()
    if setup is not None and setup.loaded is not None and setup.loaded.path is not None:
        chosen.add(setup.loaded.path)  # the file the loader takes as libcuda.so.1
    return [p for p, lib in libraries.items() if lib.code is not None and p not in chosen]


@dataclass(frozen=True, kw_only=True)
class CompatSetup:
    """What the container toolkit would find in an image: one library, or why none."""

    library: CompatLibrary | None
    why: str  # how it was found, or why nothing is used
    undetermined: str | None = None  # buildmatrix cannot tell what the toolkit decides
    legacy: LegacySetup | None = None  # what the legacy runtime finds (forward_legacy)
    loaded: LdPick | None = None  # libcuda.so.1 of the compat folder after ldconfig
    # A libcuda.so.1 the image's LD_LIBRARY_PATH puts first: (its folder, why).
    preload: tuple[str | None, str] | None = None
    # The image's own loader configuration (buildmatrix.forward_conf): whether ldconfig
    # reads the hook's 00-compat-*.conf (None: unknown), and whether the image names
    # the hook's compat folder itself.
    hook_read: bool | None = True
    named: bool = False
    ahead: tuple[str, ...] = ()  # folders the configuration has ldconfig scan first
    node_first: str | None = None  # LD_LIBRARY_PATH reaches the node's driver first
    older: str | None = None  # why toolkit releases 1.17.5 to 1.18.0 leave it unused


def find_compat(
    libraries: Mapping[str, CompatLibrary],
    regular: Collection[str],
    symlinks: Mapping[str, str],
    unreadable: Collection[str] = (),
    *,
    entries: Collection[str] = (),
    folders: Collection[str] = (),
    library_path: str = "",
    platform: str | None = None,
    confs: Mapping[str, ConfFile] | None = None,
    ld_preload: str = "",
    ld_audit: str = "",
    searches: Mapping[str, tuple[str, ...]] | None = None,
) -> CompatSetup | None:
    """The toolkit's lookup on the final view (rules 1-3 of the module docstring):
    ``libraries`` by final path (hard links share the file's), ``regular`` the
    regular files, ``unreadable`` the files that could not be read, ``entries`` every
    non-folder path, ``folders`` every folder (for ldconfig's view of the compat
    folder, buildmatrix.ldconfig, and the legacy path, buildmatrix.forward_legacy),
    ``library_path`` the image's LD_LIBRARY_PATH, ``ld_preload`` its LD_PRELOAD
    (buildmatrix.ldshadow.preloaded_libcuda), ``ld_audit`` its LD_AUDIT
    (``audited_libcuda``), ``searches`` the ELF files' DT_RPATH and DT_RUNPATH
    (buildmatrix.ldshadow.searched_by_rpath), ``platform`` its os/arch where known,
    ``confs`` the loader's configuration files kept as text (buildmatrix.ldsoconf; a
    configuration file without text fails closed where it may matter). None when
    neither path finds a compat library and LD_LIBRARY_PATH leads to no libcuda.so.1."""
    view = FolderView(
        entries=_as_set(entries or {*regular, *symlinks}),
        regular=_as_set(regular),
        symlinks=symlinks,
        folders=frozenset(folders) | _parents(entries or {*regular, *symlinks}),
        unreadable=frozenset(unreadable),
        libraries=libraries,
        resolve=resolve,
        machine=machine_of(platform),
    )
    setup = _find(view, unreadable)
    cudart = resolve(CUDART_DIR, symlinks)
    modelled = {resolve(COMPAT_DIR, symlinks), resolve(f"{cudart}/compat", symlinks)}
    hook = posixpath.dirname(setup.library.path) if setup and setup.library else None
    conf = conf_effect(view, modelled, hook, confs or {})  # buildmatrix.forward_conf
    # The node's driver is not known to be the one loaded: fail closed.
    preloaded = preloaded_libcuda(ld_preload, view) or audited_libcuda(ld_audit, view)
    for why in (image_libcuda(view, modelled), preloaded, conf.undetermined if conf else None):
        if why is not None and setup is None:
            setup = CompatSetup(library=None, why=why, undetermined=why)
        elif why is not None and setup is not None:
            setup = replace(setup, undetermined=setup.undetermined or why)
    if conf is not None and conf.undetermined is None and setup is not None:
        setup = replace(setup, hook_read=conf.hook_read, named=conf.named, ahead=conf.ahead)
    if setup is not None and setup.library is not None:
        setup = replace(setup, older=older_releases(view))
    # What the loader finds before its cache (buildmatrix.ldshadow.before_cache).
    hook = setup.loaded.folder if setup is not None and setup.loaded is not None else None
    preload, node = before_cache(library_path, searches or {}, view, hook)
    if node is not None and setup is not None:
        setup = replace(setup, node_first=node)
    if preload is None:
        return setup
    if setup is None:
        return CompatSetup(library=None, why=preload[1], preload=preload)
    return replace(setup, preload=preload)


def _find(view: FolderView, unreadable: Collection[str]) -> CompatSetup | None:
    libraries, regular, symlinks = view.libraries, view.regular, view.symlinks
    legacy = find_legacy(view=view, is_driver_name=is_driver_name)
    folder = resolve(COMPAT_DIR, symlinks)
    names = sorted(
        p
        for p in (regular if folder is not None else ())
        if posixpath.dirname(p) == folder and is_driver_name(p)
    )
    if not names:
        if legacy is None:
            return None
        why = f"no regular file /{COMPAT_DIR}/{LIBRARY_GLOB}: the enable-cuda-compat hook uses none"
        return CompatSetup(library=None, why=why, legacy=legacy)
    if len(names) > 1:
        listed = ", ".join(f"/{n}" for n in names)
        return CompatSetup(
            library=None,
            why=f"{len(names)} compat driver libraries ({listed}); the NVIDIA container "
            "toolkit's enable-cuda-compat hook uses none unless there is exactly one",
            legacy=legacy,
        )
    name = names[0]
    where = f"found at /{COMPAT_DIR}" + (f" (/{folder})" if folder != COMPAT_DIR else "")
    if name in unreadable:
        why = f"/{name} could not be read, so its forward-compatibility note is unknown"
        return CompatSetup(library=None, why=why, undetermined=why, legacy=legacy)
    library = libraries.get(name)
    if library is None:
        # Not ELF, or a hard link to a file of another name without the note section:
        # the toolkit reads no note in it; whether the loader can use it is unknown.
        library = CompatLibrary(path=name, elf=False)
    loaded = pick(posixpath.dirname(name), view)
    return CompatSetup(
        library=library,
        why=where,
        undetermined=library.undetermined,
        legacy=legacy,
        loaded=loaded,
    )


def _as_set(paths: Collection[str]) -> AbstractSet[str]:
    """``paths`` as a set, not copied where it is one (an image's view may hold a
    million paths: a copy is ~32 MiB)."""
    return paths if isinstance(paths, AbstractSet) else frozenset(paths)


def _parents(paths: Collection[str]) -> frozenset[str]:
    """Every folder that holds one of ``paths``."""
    found: set[str] = set()
    for path in paths:
        p = path
        while "/" in p:
            p = p.rpartition("/")[0]
            if p in found:
                break
            found.add(p)
    return frozenset(found)


def resolve(path: str, symlinks: Mapping[str, str]) -> str | None:
    """``path`` with every symlink in it followed inside the image root (as the
    container toolkit resolves it: never outside the root); None on a loop."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = "/".join([*done, part])
        target = symlinks.get(here)
        if target is None:
            done.append(part)
            continue
        hops += 1
        if hops > _MAX_LINK_HOPS:
            return None
        if target.startswith("/"):
            done = []
        parts[:0] = [p for p in target.split("/") if p not in ("", ".")]
    return "/".join(done)


@dataclass(frozen=True, kw_only=True)
class CompatUse:
    """Whether a host with ``driver`` runs the image through its compat library."""

    library: CompatLibrary
    in_use: bool
    why: str
    version: DriverVersion | None = None  # the compat driver's, from its file name
    undetermined: str | None = None  # the toolkit's choice is known, its effect is not


def compat_use(setup: CompatSetup | None, driver: DriverVersion) -> CompatUse | None:
    """The container toolkit's decision (rules 4-5 of the module docstring), then the
    libcuda.so.1 that ldconfig makes of the folder it names (rule 6)."""
    if setup is None or setup.library is None:
        return None
    lib = setup.library
    decided = _decide(lib, driver)
    # The image's own loader configuration may decide instead (buildmatrix.forward_conf).
    refusal = conf_refusal(
        folder=posixpath.dirname(lib.path),
        named=setup.named,
        hook_read=setup.hook_read,
        in_use=decided.in_use,
        decided=decided.why,
        driver=str(driver),
        ahead=setup.ahead,
    )
    if refusal is not None:
        unknown = refusal.why if refusal.undetermined else None
        return CompatUse(library=lib, in_use=False, why=refusal.why, undetermined=unknown)
    if not decided.in_use or setup.loaded is None:
        return decided
    loaded = setup.loaded
    hook = f"the enable-cuda-compat hook names /{loaded.folder} ({decided.why})"
    if loaded.unknown is not None:
        why = f"{hook}, and which libcuda.so.1 the loader then takes is unknown: {loaded.unknown}"
        return CompatUse(library=lib, in_use=False, why=why, undetermined=why)
    if loaded.library is None:
        why = f"{hook}, but {loaded.why}: the node's own libcuda.so.1 is loaded"
        return CompatUse(library=lib, in_use=False, why=why)
    if loaded.library.path == lib.path:
        return decided
    name = posixpath.basename(loaded.library.path)
    if _driver_version(name) is None:
        why = (
            f"{hook}; {loaded.why}, whose driver version cannot be read from its name "
            f"({name}), so whether it runs on driver {driver} is unknown"
        )
        return CompatUse(library=loaded.library, in_use=False, why=why, undetermined=why)
    other = _decide(loaded.library, driver)
    if other.in_use and other.version is not None:
        why = f"{hook}; {loaded.why}, which is used in turn: {other.why}"
        return CompatUse(library=loaded.library, in_use=True, why=why, version=other.version)
    why = (
        f"{hook}; {loaded.why}, whose driver version the toolkit's rules do not accept "
        f"on driver {driver} ({other.why})"
    )
    return CompatUse(library=loaded.library, in_use=False, why=why, undetermined=why)


def _driver_version(name: str) -> DriverVersion | None:
    """The driver version a ``libcuda.so.X.Y[.Z]`` file name gives (None: none)."""
    if not name.startswith("libcuda.so."):
        return None
    try:
        return parse_driver_version(name[len("libcuda.so.") :])
    except InputError:
        return None


def _decide(lib: CompatLibrary, driver: DriverVersion) -> CompatUse:
    """Rules 4-5 for one library, by its file name's driver version."""
    name = posixpath.basename(lib.path)[len("libcuda.so.") :]
    compat, host = parse_semver(name), parse_semver(driver.text)
    version = _driver_version(posixpath.basename(lib.path))

    def use(in_use: bool, why: str) -> CompatUse:
        why = f"{lib.describe()}: {why}"
        if in_use and not lib.elf:
            unknown = (
                f"{why}; but /{lib.path} was not read as an ELF library (not ELF, or a hard "
                "link to a file of another name), so whether the loader uses it is unknown"
            )
            return CompatUse(library=lib, in_use=False, why=unknown, undetermined=unknown)
        if in_use and version is None:
            unknown = f"{why}; but its driver version cannot be read from its name"
            return CompatUse(library=lib, in_use=False, why=unknown, undetermined=unknown)
        return CompatUse(library=lib, in_use=in_use, why=why, version=version)

    if compat is None or host is None:
        which = f"'{name}'" if compat is None else f"'{driver}'"
        return use(False, f"the toolkit cannot parse the driver version {which}")
    if lib.note:
        if host[0] not in lib.branches:
            return use(False, f"driver branch R{host[0]} is not one its note lists")
        if not semver_newer(compat, host):
            return use(False, f"driver {driver} is not older than {name}")
        return use(True, f"used on driver {driver} (its branch is listed and {name} is newer)")
    note = (
        f" (the toolkit ignores its {NOTE_SECTION} section: {lib.problem})"
        if lib.problem
        else " (no forward-compatibility note)"
    )
    if host[0] < compat[0]:
        return use(True, f"used on driver {driver}: its major is lower{note}")
    return use(False, f"driver {driver} is not of an older major{note}")


def driver_breakpoints(setup: CompatSetup | None) -> set[tuple[int, int, int]]:
    """Every driver version (as a key) at which either toolkit path's choice for this
    image can change: the version and major of the compat driver and of the file
    ldconfig loads as libcuda.so.1, each branch their notes list and the next, and the
    major of each library the legacy path finds."""
    found: set[tuple[int, int, int]] = set()
    if setup is None:
        return found
    libs = [setup.library, setup.loaded.library if setup.loaded else None]
    libs += [p.library for _, p in (setup.legacy.drivers if setup.legacy else ())]
    for lib in libs:
        if lib is None:
            continue
        version = _driver_version(posixpath.basename(lib.path))
        if version is not None:
            found |= {version.key, (version.key[0], 0, 0), (version.key[0] + 1, 0, 0)}
        for branch in lib.branches:
            found |= {(branch, 0, 0), (branch + 1, 0, 0)}
    for path in setup.legacy.libraries if setup.legacy is not None else ():
        major = posixpath.basename(path).partition(".so.")[2]
        digits = major[: len(major) - len(major.lstrip("0123456789"))]
        if digits:
            found |= {(int(digits), 0, 0), (int(digits) + 1, 0, 0)}
    return found
