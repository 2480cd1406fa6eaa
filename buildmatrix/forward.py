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
  Container Toolkit's ``enable-cuda-compat`` hook (its source:
  cmd/nvidia-cdi-hook/cudacompat): it looks for exactly one
  ``/usr/local/cuda/compat/libcuda.so.*.*`` in the container. When that library
  carries NVIDIA's ``.note.cuda.fwd_compatibility`` ELF note (JSON: the CUDA release,
  the kernel driver branches it supports, and the device classes), the folder is put
  first on the loader path iff the host driver's branch is listed and the compat
  driver is newer than the host's; without the note, iff the host driver's major is
  lower than the compat driver's.
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
import json
import posixpath
import re
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from buildmatrix.binary.elf import read_elf
from buildmatrix.binary.source import ByteSource, CorruptBinary, read_exact
from buildmatrix.cuda import DriverVersion, parse_driver_version
from buildmatrix.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

NOTE_SECTION = ".note.cuda.fwd_compatibility"
NOTE_OWNER = "NVIDIA Corporation"
COMPAT_DIR = "usr/local/cuda/compat"  # where the container toolkit looks
LIBRARY_GLOB = "libcuda.so.*.*"
# Any compat folder's driver library is read while scanning; which one counts is
# decided on the final view (find_compat).
COMPAT_NAME = re.compile(r"(?:^|/)compat/libcuda\.so\.[^/]*\.[^/]*$")
_MAX_NOTE = 64 << 10
_MAX_LINK_HOPS = 40
# nvmlBrandType_t values of boards forward compatibility never covers.
CONSUMER_BRANDS = {
    3: "NVS",
    4: "GRID",
    5: "GeForce",
    6: "TITAN",
    15: "GeForce RTX",
    16: "TITAN RTX",
}
_CONSUMER_NAMES = ("geforce", "titan", "nvs ")


@dataclass(frozen=True, kw_only=True)
class CompatLibrary:
    """One compat ``libcuda.so.<version>`` and what its note says (None: no note)."""

    path: str
    version: DriverVersion | None  # from the file name, as the container toolkit reads it
    cuda: Version | None = None
    branches: tuple[int, ...] | None = None
    devices: tuple[int, ...] | None = None
    problem: str | None = None  # a note that could not be read: the toolkit ignores it too

    def describe(self) -> str:
        parts = [f"/{self.path}"]
        if self.cuda is not None:
            parts.append(f"CUDA {self.cuda}")
        if self.branches is not None:
            parts.append("kernel driver branches " + ", ".join(f"R{b}" for b in self.branches))
        return parts[0] + (f" ({'; '.join(parts[1:])})" if parts[1:] else "")


def read_compat_library(src: ByteSource, *, path: str) -> CompatLibrary:
    """The compat library at ``path``: its version from the name, its note if any."""
    name = posixpath.basename(path)
    try:
        version: DriverVersion | None = parse_driver_version(name[len("libcuda.so.") :])
    except InputError:
        version = None
    try:
        note = _note(src)
    except (CorruptBinary, ValueError) as exc:
        return CompatLibrary(path=path, version=version, problem=f"unreadable note: {exc}")
    if note is None:
        return CompatLibrary(path=path, version=version)
    try:
        doc = json.loads(note)
        fields = {k.lower(): v for k, v in doc.items()}  # Go's decoder ignores case
        cuda = Version(str(fields["cuda version"])) if "cuda version" in fields else None
        branches = _ints(fields.get("driver"))
        devices = _ints(fields.get("device"))
    except (ValueError, AttributeError, KeyError, TypeError, InvalidVersion) as exc:
        return CompatLibrary(path=path, version=version, problem=f"unreadable note: {exc}")
    return CompatLibrary(path=path, version=version, cuda=cuda, branches=branches, devices=devices)


def _ints(value: object) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise ValueError(f"expected a list of integers, got {value!r}")
    return tuple(value)


def _note(src: ByteSource) -> bytes | None:
    """The description of the NVIDIA forward-compatibility note, or None."""
    info = read_elf(src)
    section = info.section(NOTE_SECTION)
    if section is None:
        return None
    if section.size > _MAX_NOTE:
        raise ValueError(f"{NOTE_SECTION} is {section.size} bytes; refused")
    data = read_exact(src, section.offset, section.size, what=NOTE_SECTION)
    if len(data) < 12:
        raise ValueError(f"{NOTE_SECTION} is shorter than a note header")
    order = "<" if read_exact(src, 5, 1, what="ELF byte order") == b"\x01" else ">"
    namesz, descsz, _type = struct.unpack(order + "III", data[:12])
    name_end = 12 + namesz
    desc_start = 12 + ((namesz + 3) & ~3)  # note fields are 4-byte aligned
    if desc_start + descsz > len(data):
        raise ValueError(f"{NOTE_SECTION}: sizes run past the section")
    if data[12:name_end].rstrip(b"\0").decode("latin-1") != NOTE_OWNER:
        return None
    return data[desc_start : desc_start + descsz].rstrip(b"\0")


@dataclass(frozen=True, kw_only=True)
class CompatSetup:
    """What the container toolkit would find in an image: one library, or why none."""

    library: CompatLibrary | None
    why: str  # how it was found, or why nothing is used


def find_compat(
    libraries: Mapping[str, CompatLibrary], paths: Sequence[str], symlinks: Mapping[str, str]
) -> CompatSetup | None:
    """The container toolkit's lookup on the final view: ``/usr/local/cuda/compat``
    resolved through the image's symlinks, then ``libcuda.so.*.*`` in it, which must
    match exactly one entry. None when the image has no such folder or library."""
    folder = resolve(COMPAT_DIR, symlinks)
    if folder is None:
        return None
    names = sorted(
        p
        for p in {*paths, *symlinks}
        if posixpath.dirname(p) == folder
        and fnmatch.fnmatchcase(posixpath.basename(p), LIBRARY_GLOB)
    )
    if not names:
        return None
    if len(names) > 1:
        listed = ", ".join(f"/{n}" for n in names)
        return CompatSetup(
            library=None,
            why=f"{len(names)} compat driver libraries ({listed}); the NVIDIA container "
            "toolkit uses none unless there is exactly one",
        )
    target = resolve(names[0], symlinks)
    library = libraries.get(target) if target is not None else None
    if library is None:
        return CompatSetup(
            library=None, why=f"/{names[0]} is not a readable ELF library; it is not used"
        )
    return CompatSetup(library=library, why=f"found at /{COMPAT_DIR}")


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


def compat_use(setup: CompatSetup | None, driver: DriverVersion) -> CompatUse | None:
    """The container toolkit's decision (module docstring) for a host driver."""
    if setup is None or setup.library is None:
        return None
    lib = setup.library
    branch = driver.key[0]
    if lib.version is None:
        return CompatUse(
            library=lib, in_use=False, why=f"{lib.describe()}: no driver version in its name"
        )
    newer = lib.version > driver
    if lib.branches is not None:
        if branch not in lib.branches:
            why = f"driver branch R{branch} is not one it supports"
            return CompatUse(library=lib, in_use=False, why=f"{lib.describe()}: {why}")
        if not newer:
            why = f"driver {driver} is not older than {lib.version}"
            return CompatUse(library=lib, in_use=False, why=f"{lib.describe()}: {why}")
        why = f"used on driver {driver} (its branch is listed and {lib.version} is newer)"
        return CompatUse(library=lib, in_use=True, why=f"{lib.describe()}: {why}")
    note = f" ({lib.problem})" if lib.problem else " (no forward-compatibility note)"
    if branch < lib.version.key[0]:
        why = f"used on driver {driver}: its major is lower{note}"
        return CompatUse(library=lib, in_use=True, why=f"{lib.describe()}: {why}")
    why = f"driver {driver} is not of an older major{note}"
    return CompatUse(library=lib, in_use=False, why=f"{lib.describe()}: {why}")


def device_refusal(
    library: CompatLibrary, *, products: Sequence[str], brand: int | None = None
) -> str | None:
    """Why the compat driver would refuse these GPUs (None: it accepts them).

    With the GPU's NVML brand, the note's device list decides (module docstring);
    without it, the product names do: GeForce, TITAN and NVS boards are refused.
    """
    if brand is not None:
        if library.devices is not None and brand not in library.devices:
            return f"NVML brand {brand} is not in the library's device list {list(library.devices)}"
        if library.devices is None and brand in CONSUMER_BRANDS:
            return f"a {CONSUMER_BRANDS[brand]} board is not a data-center GPU"
        return None
    consumer = [p for p in products if any(w in p.lower() + " " for w in _CONSUMER_NAMES)]
    if consumer:
        return ", ".join(consumer) + " (not data-center GPUs)"
    return None
