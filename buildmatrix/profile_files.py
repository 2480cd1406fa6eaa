"""Reading arch profiles: the folder (``--profiles``, ``$BUILDMATRIX_PROFILES`` or the
shipped one), each ``sm_XY.yaml`` validated against its schema and the CUDA facts, and
the checks across files, into a :class:`~buildmatrix.profiles.ProfileSet`.

buildmatrix.profiles holds what a profile is; this module is where files are read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from packaging.version import Version

from buildmatrix import PROFILES_ENV, package_file, schema
from buildmatrix.arch import (
    HOST_ARCHES,
    ComputeCapability,
    Family,
    gfd_family,
    parse_cc,
)
from buildmatrix.cuda import (
    ArchSupport,
    CudaFacts,
    DriverVersion,
    load_cuda_facts,
    parse_cuda_version,
    parse_driver_version,
)
from buildmatrix.errors import InputError
from buildmatrix.profiles import FEATURE_MIN_CC, ProductFloor, Profile, ProfileSet

ENV_VAR = PROFILES_ENV


def default_profiles_dir() -> Path:
    """Profiles shipped in the wheel, else those of the source checkout."""
    packaged = package_file("arch_profiles")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "arch-profiles"


def resolve_profiles_dir(option: str | os.PathLike[str] | None) -> Path:
    """``--profiles DIR``, else ``$BUILDMATRIX_PROFILES``, else the shipped profiles."""
    if option:
        return Path(option)
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else default_profiles_dir()


def _profile_from_data(data: Any, path: Path, facts: CudaFacts, *, text: str) -> Profile:
    source = str(path)
    if data is None:
        raise InputError(
            f"{source}: the file is empty; an arch profile needs at least the keys "
            "sm, compute_capability, family, products, min_cuda, min_driver, features."
        )
    schema.validate(data, "arch-profile", source=source, text=text)
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
    support = _arch_support(data, sm, source=source, facts=facts)
    family = Family(data["family"])
    expected = gfd_family(cc)
    if family is not expected:
        raise InputError(
            f"{source}: key 'family' is '{family}' but compute capability {cc} belongs to "
            f"'{expected}' (GPU Feature Discovery's mapping); set family: {expected}."
        )
    min_cuda, max_cuda = _cuda_range(data, sm, source=source, support=support)
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


def _arch_support(data: Any, sm: str, *, source: str, facts: CudaFacts) -> ArchSupport:
    """Which CUDA releases target ``sm`` (the facts' table), or an input error where
    none does, or where ``arch_specific`` asks for an ``sm_XYa`` no release builds."""
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
    return support


def _cuda_range(
    data: Any, sm: str, *, source: str, support: ArchSupport
) -> tuple[Version, Version | None]:
    """The profile's min_cuda and max_cuda, held to the releases that target ``sm``."""
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
    return min_cuda, max_cuda


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


def _profile_from_text(path: Path, text: str, facts: CudaFacts) -> Profile:
    from buildmatrix.yamlio import load_yaml_text  # PyYAML only when profiles are read

    return _profile_from_data(load_yaml_text(text, source=str(path)), path, facts, text=text)


@lru_cache(maxsize=256)
def _shipped_facts_profile(path: Path, text: str) -> Profile:
    """A profile file's text against the shipped CUDA facts, parsed and validated once
    per process for each path and text: the commands run in one process (a test
    session) read the same files again and again; an edited file is a new key. An
    error is raised again on each call (lru_cache keeps only results)."""
    return _profile_from_text(path, text, load_cuda_facts())


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
    from buildmatrix.yamlio import read_yaml_file

    shipped = load_cuda_facts()
    if facts is None:
        facts = shipped
    if facts is shipped:
        profiles = [_shipped_facts_profile(p, read_yaml_file(p)) for p in paths]
    else:
        profiles = [_profile_from_text(p, read_yaml_file(p), facts) for p in paths]
    _cross_check(profiles)
    profiles.sort(key=lambda p: p.cc)
    return ProfileSet(tuple(profiles), directory)
