"""CUDA facts as data: toolkit -> driver, PTX ISA, driver floors, SM support windows.

The numbers live in ``buildmatrix/data/cuda.yaml`` (sources cited there); this
module loads them once into frozen dataclasses and answers questions about them.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any

from packaging.version import Version

from buildmatrix import package_file, schema
from buildmatrix.errors import InputError

_CUDA_RE = re.compile(r"[0-9]+\.[0-9]+")
_DRIVER_RE = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?")


def parse_cuda_version(text: str, *, what: str = "CUDA version") -> Version:
    """Parse ``12.4`` (MAJOR.MINOR). Raises :class:`InputError` naming ``what``."""
    value = str(text).strip()
    if not _CUDA_RE.fullmatch(value):
        raise InputError(f"{what}: '{text}' is not a CUDA version; write MAJOR.MINOR, e.g. 12.4.")
    return Version(value)


@dataclass(frozen=True, order=True)
class DriverVersion:
    """A Linux driver version: compared numerically, printed as written (``535.104.05``).

    ``packaging.Version`` would print ``535.104.5``, which is not how NVML, nvidia-smi
    or the release notes write it.
    """

    key: tuple[int, int, int]
    text: str = field(compare=False)

    def __str__(self) -> str:
        return self.text


def parse_driver_version(text: str, *, what: str = "driver version") -> DriverVersion:
    """Parse a Linux driver version such as ``535.104.05`` or ``570.26``."""
    value = str(text).strip()
    if not _DRIVER_RE.fullmatch(value):
        raise InputError(
            f"{what}: '{text}' is not a driver version; write it as NVML reports it, "
            "e.g. 535.104.05."
        )
    parts = [int(x) for x in value.split(".")] + [0]
    return DriverVersion((parts[0], parts[1], parts[2]), value)


def major_minor(version: Version) -> str:
    return f"{version.major}.{version.minor}"


@dataclass(frozen=True, kw_only=True)
class Toolkit:
    version: Version
    driver: DriverVersion | None  # None: NVIDIA bundles no driver with it (13.4+)
    ptx_isa: Version


@dataclass(frozen=True, kw_only=True)
class ArchSupport:
    first: Version
    last: Version | None


@dataclass(frozen=True, kw_only=True)
class CudaFacts:
    toolkits: tuple[Toolkit, ...]
    minor_compat: dict[int, DriverVersion]
    architectures: dict[str, ArchSupport]
    # MAJOR.MINOR -> its patch releases published as nvidia/cuda images (data/cuda.yaml)
    releases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # releases whose nvidia/cuda tags NVIDIA deleted from Docker Hub (data/cuda.yaml)
    removed: frozenset[str] = frozenset()
    # release -> the OS names of its nvidia/cuda images (data/cuda.yaml, os)
    os: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def toolkit(self, cuda: Version) -> Toolkit | None:
        """The toolkit release MAJOR.MINOR, or None when the table does not know it."""
        for tk in self.toolkits:
            if (tk.version.major, tk.version.minor) == (cuda.major, cuda.minor):
                return tk
        return None

    @property
    def newest(self) -> Toolkit:
        return self.toolkits[-1]

    def driver_cuda(self, driver: DriverVersion) -> Version | None:
        """Highest CUDA version the driver fully supports (its toolkit driver is <= it).

        Drivers newer than the newest known toolkit's report that toolkit: a lower
        bound, which is what the fail-closed rules need.
        """
        index = self._by_driver
        if index is not None:  # the last toolkit whose driver is <= driver
            at = bisect.bisect_right(index[0], driver)
            return index[1][at - 1] if at else None
        best: Version | None = None
        for tk in self.toolkits:
            if tk.driver is not None and tk.driver <= driver:
                best = tk.version
        return best

    def ptx_toolkit(self, ptx_isa: Version) -> Toolkit | None:
        """The oldest toolkit whose PTX ISA is at least ``ptx_isa`` (None: newer than
        every toolkit known)."""
        isas = self._ptx_isas
        if isas is not None:
            at = bisect.bisect_left(isas, ptx_isa)
            return self.toolkits[at] if at < len(isas) else None
        return next((tk for tk in self.toolkits if tk.ptx_isa >= ptx_isa), None)

    # Judging an image on a fleet asks the two questions above some hundred thousand
    # times: where the table is in order (facts_from_data refuses one that is not),
    # they are answered by bisection over these keys, else by the scans.

    @cached_property
    def _by_driver(self) -> tuple[list[DriverVersion], list[Version]] | None:
        pairs = [(tk.driver, tk.version) for tk in self.toolkits if tk.driver is not None]
        drivers = [driver for driver, _ in pairs]
        if not _ascending(drivers):
            return None
        return drivers, [version for _, version in pairs]

    @cached_property
    def _ptx_isas(self) -> list[Version] | None:
        isas = [tk.ptx_isa for tk in self.toolkits]
        return isas if _ascending(isas) else None

    def runtime_floor(self, cuda_major: int) -> DriverVersion | None:
        """Minimum driver for any runtime of this CUDA major (minor version compatibility)."""
        return self.minor_compat.get(cuda_major)

    def arch_support(self, arch_name: str) -> ArchSupport | None:
        return self.architectures.get(arch_name)


def _ascending(values: Sequence[Any]) -> bool:
    """Whether ``values`` never decrease (equal neighbours allowed)."""
    return all(a <= b for a, b in itertools.pairwise(values))


def facts_from_data(data: object, *, source: str, text: str | None = None) -> CudaFacts:
    """Validate and convert the parsed YAML of a CUDA facts file (``text``: the file's
    text, where it was read from one; schema.validate)."""
    schema.validate(data, "cuda-facts", source=source, text=text)
    if not isinstance(data, dict):  # pragma: no cover - the schema requires an object
        raise InputError(f"{source}: expected a mapping.")
    toolkits = tuple(
        Toolkit(
            version=parse_cuda_version(t["version"], what=f"{source}: toolkits"),
            driver=parse_driver_version(t["driver"], what=f"{source}: toolkits")
            if t["driver"] is not None
            else None,
            ptx_isa=parse_cuda_version(t["ptx_isa"], what=f"{source}: toolkits"),
        )
        for t in data["toolkits"]
    )
    drivers = [tk.driver for tk in toolkits if tk.driver is not None]
    drivers_ordered = _ascending(drivers)
    for prev, cur in itertools.pairwise(toolkits):
        if not (prev.version < cur.version and drivers_ordered and prev.ptx_isa <= cur.ptx_isa):
            raise InputError(
                f"{source}: toolkits must be listed oldest first with non-decreasing drivers "
                f"and PTX ISA versions; {cur.version} breaks the order after {prev.version}."
            )
    minor_compat = {
        int(major): parse_driver_version(v, what=f"{source}: minor_version_compatibility")
        for major, v in data["minor_version_compatibility"].items()
    }
    architectures = {
        name: ArchSupport(
            first=parse_cuda_version(a["first"], what=f"{source}: architectures.{name}"),
            last=parse_cuda_version(a["last"], what=f"{source}: architectures.{name}")
            if "last" in a
            else None,
        )
        for name, a in data["architectures"].items()
    }
    releases = {mm: tuple(v) for mm, v in data.get("releases", {}).items()}
    listed = {f"{tk.version.major}.{tk.version.minor}" for tk in toolkits}
    for mm, patches in releases.items():
        if mm not in listed:
            raise InputError(f"{source}: releases: '{mm}' is not a toolkit of 'toolkits'.")
        for patch in patches:
            if not patch.startswith(f"{mm}."):
                raise InputError(f"{source}: releases.{mm}: '{patch}' is not a {mm} release.")
    removed = frozenset(data.get("removed", ()))
    for version in sorted(removed):
        if version not in releases.get(version.rsplit(".", 1)[0], ()):
            raise InputError(f"{source}: removed: '{version}' is not one of 'releases'.")
    os_names = {version: tuple(names) for version, names in data.get("os", {}).items()}
    for version in os_names:
        if version not in releases.get(version.rsplit(".", 1)[0], ()):
            raise InputError(f"{source}: os: '{version}' is not one of 'releases'.")
    return CudaFacts(
        toolkits=toolkits,
        minor_compat=minor_compat,
        architectures=architectures,
        releases=releases,
        removed=removed,
        os=os_names,
    )


def facts_from_text(text: str, *, source: str) -> CudaFacts:
    """Parse, validate and convert the text of a CUDA facts file."""
    from buildmatrix.yamlio import load_yaml_text  # PyYAML only when the table is read

    return facts_from_data(load_yaml_text(text, source=source), source=source, text=text)


@cache
def load_cuda_facts() -> CudaFacts:
    """The CUDA facts shipped with buildmatrix (parsed once per process)."""
    text = package_file("data", "cuda.yaml").read_text(encoding="utf-8")
    return facts_from_text(text, source="buildmatrix/data/cuda.yaml")


def newer_release_hint() -> str:
    """How a user gets facts this installation lacks, without editing its files (an
    adopter's copy of data/cuda.yaml lies in site-packages and an upgrade replaces it)."""
    from buildmatrix import installed_version

    return (
        f"If NVIDIA released it after this buildmatrix ({installed_version()}), a newer "
        "release of buildmatrix-gpu knows it: pip install -U buildmatrix-gpu."
    )
