"""Arch profiles: one YAML per SM, validated on load into frozen dataclasses.

A profile is the single source of truth for one SM: what to build (gencode,
TORCH_CUDA_ARCH_LIST, CMake architectures), with which toolkits, and which nodes
may run it (products, driver floor, features).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from packaging.version import Version

from buildmatrix import schema
from buildmatrix.arch import (
    HOST_ARCHES,
    ComputeCapability,
    Family,
    gfd_family,
    parse_cc,
    platform_of,
    sorted_platforms,
)
from buildmatrix.cuda import (
    CudaFacts,
    DriverVersion,
    load_cuda_facts,
    major_minor,
    parse_cuda_version,
    parse_driver_version,
)
from buildmatrix.errors import InputError, did_you_mean

ENV_VAR = "BUILDMATRIX_PROFILES"

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
        return next((p for p in self.profiles if p.cc == cc), None)

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
        the major has no profile at or below ``cc``.
        """
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


def default_profiles_dir() -> Path:
    """Profiles shipped in the wheel, else those of the source checkout."""
    packaged = Path(str(resources.files("buildmatrix").joinpath("arch_profiles")))
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "arch-profiles"


def resolve_profiles_dir(option: str | os.PathLike[str] | None) -> Path:
    """``--profiles DIR``, else ``$BUILDMATRIX_PROFILES``, else the shipped profiles."""
    if option:
        return Path(option)
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else default_profiles_dir()


def _profile_from_data(data: Any, path: Path, facts: CudaFacts) -> Profile:
    source = str(path)
    if data is None:
        raise InputError(
            f"{source}: the file is empty; an arch profile needs at least the keys "
            "sm, compute_capability, family, products, min_cuda, min_driver, features."
        )
    schema.validate(data, "arch-profile", source=source)
    sm: str = data["sm"]
    if path.stem != sm:
        raise InputError(
            f"{source}: key 'sm' is '{sm}' but the file is named {path.name}; "
            f"name the file {sm}.yaml (one file per SM)."
        )
    cc = parse_cc(data["compute_capability"])
    if cc.number != int(sm.removeprefix("sm_")):
        raise InputError(
            f"{source}: key 'compute_capability' is {cc} but {sm} means "
            f"{ComputeCapability.from_number(int(sm[3:]))}; make them agree."
        )
    support = facts.arch_support(sm)
    if support is None:
        known = ", ".join(
            sorted((a for a in facts.architectures if a[-1].isdigit()), key=lambda a: int(a[3:]))
        )
        raise InputError(
            f"{source}: no CUDA toolkit in buildmatrix's CUDA facts targets {sm}, so no "
            f"variant could be built for it (targets known: {known}). Check the SM "
            "number; a target of a newer toolkit needs that toolkit in the facts table "
            "(buildmatrix/data/cuda.yaml, docs/compatibility.md)."
        )
    if data.get("arch_specific", False) and facts.arch_support(f"{sm}a") is None:
        raise InputError(
            f"{source}: key 'arch_specific' is true but no CUDA toolkit builds {sm}a "
            "(the arch-specific targets are those the CUDA facts list with an 'a' "
            "suffix, such as sm_90a); set arch_specific: false."
        )
    family = Family(data["family"])
    expected = gfd_family(cc)
    if family is not expected:
        raise InputError(
            f"{source}: key 'family' is '{family}' but compute capability {cc} belongs to "
            f"'{expected}' (GPU Feature Discovery's mapping); set family: {expected}."
        )
    min_cuda = parse_cuda_version(data["min_cuda"], what=f"{source}: key 'min_cuda'")
    max_cuda = (
        parse_cuda_version(data["max_cuda"], what=f"{source}: key 'max_cuda'")
        if "max_cuda" in data
        else None
    )
    if min_cuda < support.first:
        raise InputError(
            f"{source}: key 'min_cuda' is {min_cuda} but {sm} needs CUDA "
            f"{support.first} or newer; raise min_cuda."
        )
    if support.last is not None and (max_cuda is None or max_cuda > support.last):
        raise InputError(
            f"{source}: CUDA {support.last} is the last toolkit that targets "
            f'{sm}; set max_cuda: "{support.last}".'
        )
    if max_cuda is not None and max_cuda < min_cuda:
        raise InputError(
            f"{source}: key 'max_cuda' ({max_cuda}) is older than min_cuda ({min_cuda})."
        )
    for feature in data["features"]:
        floor = FEATURE_MIN_CC[feature]
        if cc < floor:
            raise InputError(
                f"{source}: key 'features' lists {feature}, which needs compute "
                f"capability {floor} or newer; {sm} is {cc}. Remove it."
            )
    min_driver = parse_driver_version(data["min_driver"], what=f"{source}: key 'min_driver'")
    default_hosts = tuple(a for a in HOST_ARCHES if a in data.get("hosts", HOST_ARCHES))
    products, floors, hosts = _products(
        data["products"], source=source, sm_floor=min_driver, default_hosts=default_hosts
    )
    return Profile(
        sm=sm,
        cc=cc,
        family=family,
        description=str(data.get("description", "")),
        products=products,
        product_floors=floors,
        product_hosts=hosts,
        min_cuda=min_cuda,
        max_cuda=max_cuda,
        min_driver=min_driver,
        features=tuple(data["features"]),
        ptx=bool(data.get("ptx", False)),
        arch_specific=bool(data.get("arch_specific", False)),
        source=source,
        arch_specific_from=_arch_specific_from(sm, data, facts),
    )


def _arch_specific_from(sm: str, data: Any, facts: CudaFacts) -> Version | None:
    support = facts.arch_support(f"{sm}a") if data.get("arch_specific", False) else None
    return support.first if support is not None else None


def _products(
    items: list[Any], *, source: str, sm_floor: DriverVersion, default_hosts: tuple[str, ...]
) -> tuple[tuple[str, ...], dict[str, ProductFloor], dict[str, tuple[str, ...]]]:
    """Product names, the per-product floors of those written as mappings, and each
    product's host CPU architectures (its own ``hosts``, else the profile's)."""
    names: list[str] = []
    floors: dict[str, ProductFloor] = {}
    hosts: dict[str, tuple[str, ...]] = {}
    for item in items:
        name = item if isinstance(item, str) else item["name"]
        if name in names:
            raise InputError(f"{source}: key 'products' lists '{name}' twice; list it once.")
        names.append(name)
        hosts[name] = default_hosts
        if isinstance(item, str):
            continue
        if "hosts" in item:
            own = tuple(a for a in HOST_ARCHES if a in item["hosts"])
            if own == default_hosts:
                raise InputError(
                    f"{source}: products '{name}' has hosts {list(own)}, the same as the "
                    "profile's 'hosts'; leave the product's out."
                )
            hosts[name] = own
        if "min_driver" not in item:
            continue
        floor = parse_driver_version(
            item["min_driver"], what=f"{source}: products '{name}' min_driver"
        )
        if floor <= sm_floor:
            raise InputError(
                f"{source}: products '{name}' has min_driver {floor}, not above the SM's "
                f"min_driver {sm_floor}; write the product as a plain name."
            )
        floors[name] = ProductFloor(min_driver=floor, source=item["source"])
    return tuple(names), floors, hosts


def _cross_check(profiles: Sequence[Profile]) -> None:
    """Rules across files: no SM twice, a product belongs to one SM."""
    seen_sm: dict[str, Profile] = {}
    seen_product: dict[str, Profile] = {}
    for p in profiles:
        if p.sm in seen_sm:
            raise InputError(
                f"{p.source}: {p.sm} is already defined in {seen_sm[p.sm].source}; "
                "keep one profile per SM."
            )
        seen_sm[p.sm] = p
        for product in p.products:
            other = seen_product.get(product)
            if other is not None:
                raise InputError(
                    f"{p.source}: product '{product}' is also listed in {other.source} "
                    f"({other.sm}); a GPU has one compute capability, list it once."
                )
            seen_product[product] = p


def load_profiles(directory: Path, *, facts: CudaFacts | None = None) -> ProfileSet:
    """Load, validate and cross-check every ``*.yaml`` / ``*.yml`` in ``directory``,
    against ``facts`` (which targets each CUDA release builds; None: the shipped
    facts, read here, the one place this module reads them)."""
    if not directory.is_dir():
        raise InputError(
            f"profiles folder {directory} does not exist or is not a folder; "
            f"pass --profiles DIR or set {ENV_VAR} to a folder of sm_XY.yaml files."
        )
    paths = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))
    if not paths:
        raise InputError(
            f"profiles folder {directory} holds no .yaml files; "
            "add one sm_XY.yaml per architecture."
        )
    from buildmatrix.yamlio import load_yaml_file  # PyYAML only when profiles are read

    if facts is None:
        facts = load_cuda_facts()
    profiles = [_profile_from_data(load_yaml_file(p), p, facts) for p in paths]
    _cross_check(profiles)
    profiles.sort(key=lambda p: p.cc)
    return ProfileSet(tuple(profiles), directory)
