"""Arch profiles: one YAML per SM (read and validated by buildmatrix.profile_files)
as frozen dataclasses.

A profile is the single source of truth for one SM: what to build (gencode,
TORCH_CUDA_ARCH_LIST, CMake architectures), with which toolkits, and which nodes
may run it (products, driver floor, features).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from packaging.version import Version

from buildmatrix.arch import (
    HOST_ARCHES,
    ComputeCapability,
    Family,
    platform_of,
    sorted_platforms,
)
from buildmatrix.cuda import (
    DriverVersion,
    major_minor,
)
from buildmatrix.errors import InputError, did_you_mean

# Lowest compute capability whose tensor cores have each precision (NVIDIA
# architecture whitepapers: Volta FP16; Xavier/Turing INT8; Ampere BF16/TF32;
# Ada and Hopper FP8 (CC 8.9 and 9.0, not 8.0/8.6); Blackwell FP6/FP4).
FEATURE_MIN_CC: Mapping[str, ComputeCapability] = {
    "fp16": ComputeCapability(7, 0),
    "int8": ComputeCapability(7, 2),
    "bf16": ComputeCapability(8, 0),
    "tf32": ComputeCapability(8, 0),
    "fp8": ComputeCapability(8, 9),
    "fp6": ComputeCapability(10, 0),
    "fp4": ComputeCapability(10, 0),
}


@dataclass(frozen=True, kw_only=True)
class ProductFloor:
    """A product whose driver floor is above its SM's (e.g. H200 on sm_90)."""

    min_driver: DriverVersion
    source: str


@dataclass(frozen=True, kw_only=True)
class Profile:
    sm: str
    cc: ComputeCapability
    family: Family
    description: str
    products: tuple[str, ...]
    min_cuda: Version
    max_cuda: Version | None
    min_driver: DriverVersion
    features: tuple[str, ...]
    ptx: bool
    arch_specific: bool
    source: str
    # The first CUDA release that builds sm_XYa, from the CUDA facts the profile was
    # loaded with (None where arch_specific is false).
    arch_specific_from: Version | None = None
    product_floors: Mapping[str, ProductFloor] = field(default_factory=dict, hash=False)
    # CPU architectures of each product's hosts (every product has an entry)
    product_hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    @property
    def number(self) -> int:
        return self.cc.number

    def hosts(self, product: str | None = None) -> tuple[str, ...]:
        """The CPU architectures ``product`` comes with; without a product (or for one
        the profile does not list), those of any of the SM's products."""
        if product is not None and product in self.product_hosts:
            return self.product_hosts[product]
        found = {a for hosts in self.product_hosts.values() for a in hosts}
        return tuple(a for a in HOST_ARCHES if a in found) or HOST_ARCHES

    @property
    def platforms(self) -> tuple[str, ...]:
        """The platforms (``linux/amd64``, ``linux/arm64``) some product of the SM sits
        behind: those an image needs to run on every GPU of the SM."""
        return tuple(platform_of(a) for a in self.hosts())

    def driver_floor(self, product: str | None = None) -> DriverVersion:
        """The hardware driver floor: the SM's, or the product's where it is higher."""
        special = self.product_floors.get(product) if product else None
        return max(self.min_driver, special.min_driver) if special else self.min_driver

    def supports_cuda(self, cuda: Version) -> bool:
        """Whether toolkit ``cuda`` can build this SM (min_cuda <= cuda <= max_cuda)."""
        mm = Version(major_minor(cuda))
        return self.min_cuda <= mm and (self.max_cuda is None or mm <= self.max_cuda)

    def builds_arch_specific(self, cuda: Version | None) -> bool:
        """Whether ``sm_XYa`` is built: asked for, and the toolkit knows the suffix."""
        if not self.arch_specific or self.arch_specific_from is None:
            return False
        return cuda is None or Version(major_minor(cuda)) >= self.arch_specific_from

    def gencode(self, cuda: Version | None = None) -> tuple[str, ...]:
        """nvcc ``-gencode`` flags; with ``cuda``, only what that toolkit can build."""
        n = self.number
        flags = [f"-gencode=arch=compute_{n},code=sm_{n}"]
        if self.builds_arch_specific(cuda):
            flags.append(f"-gencode=arch=compute_{n}a,code=sm_{n}a")
        if self.ptx:
            flags.append(f"-gencode=arch=compute_{n},code=compute_{n}")
        return tuple(flags)

    def torch_arch_list(self, cuda: Version | None = None) -> tuple[str, ...]:
        """Entries for ``TORCH_CUDA_ARCH_LIST`` (``9.0+PTX``, ``9.0a``)."""
        entries = [f"{self.cc}+PTX" if self.ptx else str(self.cc)]
        if self.builds_arch_specific(cuda):
            entries.append(f"{self.cc}a")
        return tuple(entries)

    def cmake_architectures(self, cuda: Version | None = None) -> tuple[str, ...]:
        """Entries for ``CMAKE_CUDA_ARCHITECTURES`` (``90-real``, ``90a-real``, ``90-virtual``)."""
        n = self.number
        entries = [f"{n}-real"]
        if self.builds_arch_specific(cuda):
            entries.append(f"{n}a-real")
        if self.ptx:
            entries.append(f"{n}-virtual")
        return tuple(entries)

    def to_json(self) -> dict[str, Any]:
        """The profile as ``profiles --json`` prints it: file keys plus derived ones."""
        return {
            "sm": self.sm,
            "compute_capability": str(self.cc),
            "family": self.family.value,
            "description": self.description,
            "products": list(self.products),
            "product_floors": {
                name: {"min_driver": str(f.min_driver), "source": f.source}
                for name, f in self.product_floors.items()
            },
            "hosts": {name: list(self.hosts(name)) for name in self.products},
            "platforms": list(self.platforms),
            "min_cuda": str(self.min_cuda),
            "max_cuda": str(self.max_cuda) if self.max_cuda else None,
            "min_driver": str(self.min_driver),
            "features": list(self.features),
            "ptx": self.ptx,
            "arch_specific": self.arch_specific,
            "gencode": list(self.gencode()),
            "torch_arch_list": list(self.torch_arch_list()),
            "cmake_architectures": list(self.cmake_architectures()),
            "source": self.source,
        }


@dataclass(frozen=True)
class ProfileSet:
    """All profiles of one folder, sorted by compute capability."""

    profiles: tuple[Profile, ...]
    directory: Path

    def __iter__(self) -> Iterator[Profile]:
        return iter(self.profiles)

    def __len__(self) -> int:
        return len(self.profiles)

    @property
    def families(self) -> tuple[Family, ...]:
        """Families in order of their first SM."""
        return tuple(dict.fromkeys(p.family for p in self.profiles))

    def get(self, sm: str) -> Profile:
        """The profile for ``sm_XY``; an unknown SM is an input error with a hint."""
        for p in self.profiles:
            if p.sm == sm:
                return p
        known = [p.sm for p in self.profiles]
        raise InputError(
            f"no arch profile for '{sm}' in {self.directory}.{self._nearest(sm, known)} "
            f"Known SMs: {', '.join(known)}. Add {sm}.yaml to a profiles folder and pass "
            "--profiles DIR to support it (docs/profiles.md)."
        )

    def _nearest(self, sm: str, known: list[str]) -> str:
        """The hint for an unknown SM: the nearest older SM of its major, where the
        name is an SM at all (sm_101 -> sm_100, not the closest spelling sm_120)."""
        number = sm.removeprefix("sm_")
        if number.isdigit():
            nearest = self._at_or_below(ComputeCapability.from_number(int(number)))
            if nearest is not None:
                return f" The nearest older one of its major is '{nearest.sm}'."
        return did_you_mean(sm, known)

    def _at_or_below(self, cc: ComputeCapability) -> Profile | None:
        """The profile of ``cc``, else the newest older one of the same major."""
        same = [p for p in self.profiles if p.cc.major == cc.major and p.cc <= cc]
        return max(same, key=lambda p: p.cc) if same else None

    def by_cc(self, cc: ComputeCapability) -> Profile | None:
        return self._by_cc.get(cc)

    @cached_property
    def _by_cc(self) -> dict[ComputeCapability, Profile]:
        """The first profile of each compute capability (the set is immutable)."""
        found: dict[ComputeCapability, Profile] = {}
        for p in self.profiles:
            found.setdefault(p.cc, p)
        return found

    def family(self, name: str) -> tuple[Profile, ...]:
        """The profiles of a family; an unknown family is an input error with a hint."""
        members = tuple(p for p in self.profiles if p.family.value == name)
        if not members:
            known = [f.value for f in self.families]
            raise InputError(
                f"no arch profile has family '{name}'."
                f"{self.product_hint(name) or did_you_mean(name, known)} "
                f"Families in {self.directory}: {', '.join(known)}."
            )
        return members

    def hardware_floor(
        self, cc: ComputeCapability, product: str | None = None
    ) -> tuple[DriverVersion, str] | None:
        """The driver floor of a GPU of ``cc`` and what sets it.

        Its own profile's (its product's where the profile names one); for a compute
        capability without a profile, that of the nearest older profile of the same
        major: a newer GPU of a family needs at least the family's driver. None where
        the major has no profile at or below ``cc``. Kept per (cc, product): ``check``
        asks for each target of each node it judges.
        """
        key = (cc, product)
        if key not in self._hardware_floors:
            self._hardware_floors[key] = self._hardware_floor(cc, product)
        return self._hardware_floors[key]

    @cached_property
    def _hardware_floors(
        self,
    ) -> dict[tuple[ComputeCapability, str | None], tuple[DriverVersion, str] | None]:
        return {}

    def _hardware_floor(
        self, cc: ComputeCapability, product: str | None
    ) -> tuple[DriverVersion, str] | None:
        profile = self._at_or_below(cc)
        if profile is None:
            return None
        if profile.cc == cc and product in profile.product_floors:
            return profile.driver_floor(product), f"{product} (product floor)"
        if profile.cc == cc:
            return profile.min_driver, f"{profile.sm} ({profile.family})"
        return profile.min_driver, f"{cc}, a GPU newer than {profile.sm} ({profile.family})"

    def product_hint(self, name: str) -> str:
        """For a GPU product name given where an SM or a family belongs (``H100``,
        ``l40s``): ' 'H100' is a GPU product, of ... (family hopper, sm_90): pass
        --family hopper or --sm sm_90.' Matched as a whole word of the NVML product
        names the profiles list (A100 matches 'NVIDIA A100-SXM4-80GB'); '' when none."""
        word = name.lower()
        found = [
            (p, product)
            for p in self.profiles
            for product in p.products
            if word in re.split(r"[\s\-]+", product.lower())
        ]
        if not found:
            return ""
        sms = list(dict.fromkeys(p.sm for p, _ in found))
        families = list(dict.fromkeys(p.family.value for p, _ in found))
        products = ", ".join(product for _, product in found[:3])
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        return (
            f" '{name}' is a GPU product ({products}{more}: family {', '.join(families)}, "
            f"{', '.join(sms)}): pass --family {' or --family '.join(families)}, or "
            f"--sm {' or --sm '.join(sms)}."
        )

    def platforms(self, profiles: Iterable[Profile] | None = None) -> tuple[str, ...]:
        """The platforms an image needs so that every GPU of ``profiles`` (default: all)
        can run it: the union of their products' hosts."""
        chosen = self.profiles if profiles is None else profiles
        return sorted_platforms(p for profile in chosen for p in profile.platforms)

    def family_platforms(self, name: str) -> tuple[str, ...]:
        """The platforms family ``name``'s images need: its products' hosts."""
        return self.platforms(self.family(name))

    def platforms_of_cc(self, cc: ComputeCapability, product: str | None = None) -> tuple[str, ...]:
        """The platforms a GPU of ``cc`` (and ``product``, where known) can sit behind:
        its profile's; every platform for a compute capability without a profile (the
        safe side: ``check`` then judges every entry an image offers)."""
        profile = self.by_cc(cc)
        if profile is None:
            return tuple(platform_of(a) for a in HOST_ARCHES)
        return tuple(platform_of(a) for a in profile.hosts(product))

    def by_product(self, name: str) -> Profile | None:
        """The profile that lists NVML product ``name`` (exact match)."""
        return next((p for p in self.profiles if name in p.products), None)
