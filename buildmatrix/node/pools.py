"""Pools files: which pool (label ``gpu-pool``) a node joins, by GPU product or family.

```yaml
families: {hopper: training-hopper, ampere: inference-ampere}
products: {NVIDIA A40: inference-ampere}   # a product wins over its family
default: general                           # optional: nodes no rule matches
pools:                                     # optional: what each pool's nodes must do
  training-hopper:
    images: [registry.example.com/ml/train:1.4.0-cu128-hopper]  # smoke checks these
    gpus: 8                                # every node shows 8 GPUs (NVML and PCI bus)
    products: [NVIDIA H100 80GB HBM3]      # optional: the products the pool really has
    driver: "580.65.06"                    # optional: the driver its nodes run (a promise)
```

Validated on load (schema ``pools``): families must be ones the profiles know,
products ones a profile lists (a typo would silently match nothing), pool names
valid Kubernetes label values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildmatrix import schema
from buildmatrix.cuda import DriverVersion, parse_driver_version
from buildmatrix.errors import InputError, did_you_mean
from buildmatrix.node.values import is_label_value
from buildmatrix.profiles import ProfileSet


@dataclass(frozen=True, kw_only=True)
class PoolSpec:
    """What every node of one pool must satisfy (the pools file's ``pools.<name>``)."""

    images: tuple[str, ...] = ()
    gpus: int | None = None
    # The products the pool's nodes have, where fewer than its rules map to it
    # (``buildmatrix drivers`` holds the pool to these models' floors only).
    products: tuple[str, ...] = ()
    # The driver every node of the pool runs: what its NodePool template promises
    # (``k8s nodepools``); smoke fails a node whose driver differs (node/pool_promise.py).
    driver: DriverVersion | None = None


@dataclass(frozen=True, kw_only=True)
class Pools:
    families: Mapping[str, str] = field(default_factory=dict)
    products: Mapping[str, str] = field(default_factory=dict)
    default: str | None = None
    specs: Mapping[str, PoolSpec] = field(default_factory=dict)
    source: str = ""

    def spec(self, pool: str | None) -> PoolSpec:
        """The pool's requirements; a pool the file says nothing more about has none."""
        return self.specs.get(pool or "", PoolSpec())

    def pool_for(self, *, product: str, family: str) -> str | None:
        """The pool of a GPU model: its product's, else its family's, else the default."""
        return self.products.get(product) or self.families.get(family) or self.default


def _check_mapped(
    families: dict[str, str], products: dict[str, str], profiles: ProfileSet, *, source: str
) -> None:
    """Every family and product the file maps is one a profile knows."""
    known_families = [f.value for f in profiles.families]
    for name in families:
        if name not in known_families:
            raise InputError(
                f"{source}: key 'families.{name}': no profile has family '{name}'."
                f"{did_you_mean(name, known_families)} Known: {', '.join(known_families)}."
            )
    known_products = [n for p in profiles for n in p.products]
    for name in products:
        if profiles.by_product(name) is None:
            # "NVIDIA H100 80GB" means "NVIDIA H100 80GB HBM3" more likely than what
            # difflib finds closest, so a product the name begins is the first hint.
            longer = [p for p in known_products if p.lower().startswith(name.lower())]
            hint = f" Did you mean '{longer[0]}'?" if longer else did_you_mean(name, known_products)
            raise InputError(
                f"{source}: key 'products.{name}': no profile lists the product '{name}'."
                f"{hint} Write it as NVML names it "
                "(nvidia-smi --query-gpu=name), or add it to its profile's products."
            )


def pools_from_data(data: Any, *, source: str, profiles: ProfileSet) -> Pools:
    if data is None:
        raise InputError(f"{source}: the pools file is empty; map families or products to pools.")
    schema.validate(data, "pools", source=source)
    families: dict[str, str] = dict(data.get("families") or {})
    products: dict[str, str] = dict(data.get("products") or {})
    _check_mapped(families, products, profiles, source=source)
    pools = [*families.values(), *products.values()]
    if data.get("default") is not None:
        pools.append(data["default"])
    for pool in pools:
        if not is_label_value(pool):
            raise InputError(
                f"{source}: pool name '{pool}' is not a valid Kubernetes label value "
                "(at most 63 characters: letters, digits, '-', '_', '.', starting and "
                "ending with a letter or digit)."
            )
    specs = {
        name: PoolSpec(
            images=_image_refs(name, doc.get("images") or (), source=source),
            gpus=doc.get("gpus"),
            products=tuple(doc.get("products") or ()),
            driver=(
                parse_driver_version(doc["driver"], what=f"{source}: key 'pools.{name}.driver'")
                if doc.get("driver") is not None
                else None
            ),
        )
        for name, doc in (data.get("pools") or {}).items()
    }
    for name in specs:
        if name not in pools:
            raise InputError(
                f"{source}: key 'pools.{name}': no family, product or default maps a node "
                f"to the pool '{name}', so its requirements would never apply."
                f"{did_you_mean(name, sorted(set(pools)))} Map a family or product to it, "
                "or correct the name."
            )
    pools_of = Pools(families=families, products=products, default=data.get("default"))
    for name, spec in specs.items():
        _check_products(name, spec.products, pools_of, profiles, source=source)
    return Pools(
        families=families,
        products=products,
        default=data.get("default"),
        specs=specs,
        source=source,
    )


def _check_products(
    pool: str, listed: Sequence[str], pools: Pools, profiles: ProfileSet, *, source: str
) -> None:
    """Each product a pool lists is one a profile knows and one the rules map to it."""
    for i, name in enumerate(listed):
        profile = profiles.by_product(name)
        key = f"key 'pools.{pool}.products[{i}]'"
        if profile is None:
            known = [p for prof in profiles for p in prof.products]
            raise InputError(
                f"{source}: {key}: no profile lists the product '{name}'."
                f"{did_you_mean(name, known)} Write it as NVML names it "
                "(nvidia-smi --query-gpu=name), or add it to its profile's products."
            )
        mapped = pools.pool_for(product=name, family=profile.family.value)
        if mapped != pool:
            where = f"the pool '{mapped}'" if mapped else "no pool"
            raise InputError(
                f"{source}: {key}: '{name}' ({profile.family}) is mapped to {where} by "
                f"the families/products rules, so no node of pool '{pool}' has it. Map it "
                f"to '{pool}' under products: or families:, or remove it from the list."
            )


def _image_refs(pool: str, refs: Sequence[str], *, source: str) -> tuple[str, ...]:
    """Each of a pool's images parsed as check parses a REF: a typo is found when the
    file is loaded (``k8s manifests``), not on every node at admission time."""
    from buildmatrix.image.ref import parse_ref

    for i, ref in enumerate(refs):
        try:
            parse_ref(ref)
        except InputError as exc:
            raise InputError(
                f"{source}: key 'pools.{pool}.images[{i}]': {exc} Images are given as "
                "'buildmatrix check' takes them (docs/check.md), e.g. "
                "registry.example.com/ml/train:1.4.0-cu128-hopper."
            ) from None
    return tuple(refs)


def load_pools(path: Path, profiles: ProfileSet) -> Pools:
    from buildmatrix.yamlio import load_yaml_file

    return pools_from_data(load_yaml_file(path), source=str(path), profiles=profiles)
