"""CUDA forward compatibility on the NVIDIA container toolkit's legacy path.

A node whose ``nvidia-container-runtime`` runs in legacy mode (the ``--gpus`` flag,
and "auto" mode without CDI) does not run the ``enable-cuda-compat`` hook
(buildmatrix.forward): NVIDIA/nvidia-container-toolkit ``internal/modifier/gated.go``
``getCudaCompatModeModifier`` adds it in legacy mode only with
``cuda-compat-mode = "hook"``. By default (``api/config/v1/runtime.go``:
``defaultCUDACompatMode`` is ``ldconfig``; ``cmd/nvidia-container-runtime-hook/
hook_config.go`` ``nvidiaContainerCliCUDACompatModeFlags``) the decision is
libnvidia-container's (NVIDIA/libnvidia-container), rule by rule:

1. ``src/nvc_container.c`` ``find_library_paths``: ``/usr/local/cuda`` resolved
   inside the root, then ``compat/lib*.so.*`` globbed there (any entry of that name,
   symlinks included), each match resolved inside the root (``path_resolve``), and
   duplicates dropped;
2. ``src/cli/compat_mode.c`` ``filter_by_major_version``: a library is dropped when
   ``strncmp(host driver version, its major, length of its major) >= 0`` (the major
   is the digits after the first ``.so.`` of the resolved file's name; a name
   without ``.so.`` is kept);
3. ``get_compat_library_path``: the libraries left must share one folder, else the
   container does not start; that folder is given to ``ldconfig``
   (``cuda-compat-mode=ldconfig``), which then makes ``libcuda.so.1`` of it by SONAME
   (buildmatrix.ldconfig): the driver version is that file's, read from its name.

No note is read on this path. Where its choice differs from the hook's,
``check`` judges the image both ways (docs/compatibility.md).
"""

from __future__ import annotations

import fnmatch
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING

from buildmatrix.binary.compat_note import CompatLibrary
from buildmatrix.cuda import DriverVersion, parse_driver_version
from buildmatrix.errors import InputError
from buildmatrix.ldconfig import FolderView, LdPick, pick

if TYPE_CHECKING:
    from collections.abc import Callable

CUDART_DIR = "usr/local/cuda"  # libnvidia-container's CUDA_RUNTIME_DIR
LEGACY_GLOB = "lib*.so.*"
PATH = "the legacy runtime (libnvidia-container, cuda-compat-mode=ldconfig)"


@dataclass(frozen=True, kw_only=True)
class LegacySetup:
    """What libnvidia-container finds: the resolved compat libraries, and for each of
    their folders the libcuda.so.1 ldconfig makes of it."""

    libraries: tuple[str, ...]
    drivers: tuple[tuple[str, LdPick], ...]


def find_legacy(*, view: FolderView, is_driver_name: Callable[[str], bool]) -> LegacySetup | None:
    """Rule 1 of the module docstring on the final view. None when no compat library
    is found."""
    cudart = view.resolve(CUDART_DIR, view.symlinks)
    folder = view.resolve(f"{cudart}/compat", view.symlinks) if cudart is not None else None
    if folder is None:
        return None
    found: list[str] = []
    for name in sorted(view.entries):
        if posixpath.dirname(name) != folder:
            continue
        if not fnmatch.fnmatchcase(posixpath.basename(name), LEGACY_GLOB):
            continue
        target = view.resolve(name, view.symlinks)
        if target is not None and target not in found:
            found.append(target)
    if not found:
        return None
    drivers = [
        (where, pick(where, view)) for where in sorted({posixpath.dirname(p) for p in found})
    ]
    return LegacySetup(libraries=tuple(found), drivers=tuple(drivers))


def _excluded(path: str, host: str) -> bool:
    """``filter_by_major_version`` (ldconfig mode) for one resolved library."""
    name = posixpath.basename(path)
    at = name.find(".so.")
    if at < 0:
        return False
    major = name[at + 4 :]
    n = len(major) - len(major.lstrip("0123456789"))  # strspn(maj, "0123456789")
    raw = major.encode("utf-8", "surrogateescape")  # a name of any bytes
    return host.encode()[:n] >= raw[:n]  # strncmp(...) >= 0


@dataclass(frozen=True, kw_only=True)
class LegacyUse:
    """libnvidia-container's choice on a host with ``driver``: the compat driver it
    puts first (None: the node's), or why the container cannot start."""

    library: CompatLibrary | None
    version: DriverVersion | None
    why: str
    undetermined: str | None = None  # the container does not start, or ldconfig's pick


def legacy_use(setup: LegacySetup | None, driver: DriverVersion) -> LegacyUse | None:
    """Rules 2 and 3 of the module docstring, then the ``libcuda`` ldconfig takes."""
    if setup is None:
        return None
    kept = [p for p in setup.libraries if not _excluded(p, driver.text)]
    if not kept:
        why = f"{PATH}: no compat library has a major above the node's driver {driver}"
        return LegacyUse(library=None, version=None, why=why)
    folders = {posixpath.dirname(p) for p in kept}
    if len(folders) > 1:
        why = (
            f"{PATH}: the compat libraries it keeps lie in {len(folders)} folders "
            f"({', '.join('/' + f for f in sorted(folders))}); it refuses to start the "
            "container"
        )
        return LegacyUse(library=None, version=None, why=why, undetermined=why)
    folder = folders.pop()
    loaded = dict(setup.drivers).get(folder)
    if loaded is None or loaded.unknown is not None:
        why = (
            f"{PATH}: /{folder} is put first, and which libcuda.so.1 ldconfig then makes "
            f"of it buildmatrix cannot tell: {loaded.unknown if loaded else 'not looked at'}"
        )
        return LegacyUse(library=None, version=None, why=why, undetermined=why)
    if loaded.library is None:
        why = f"{PATH}: /{folder} is put first but {loaded.why}; the node's is used"
        return LegacyUse(library=None, version=None, why=why)
    lib = loaded.library
    name = posixpath.basename(lib.path)
    try:
        version = parse_driver_version(name[len("libcuda.so.") :])
    except InputError:
        version = None
    if not name.startswith("libcuda.so.") or version is None or not lib.elf or lib.undetermined:
        why = (
            f"{PATH}: /{folder} is put first on driver {driver}; {loaded.why}, whose driver "
            "version cannot be read from its name"
        )
        return LegacyUse(library=None, version=None, why=why, undetermined=why)
    why = f"{PATH}: /{folder} is put first on driver {driver}; {loaded.why}"
    return LegacyUse(library=lib, version=version, why=why)
