"""Which GPU models each pool of a pools file holds (docs/drivers.md). Pure.

A pool's models are every product a profile lists that the pools file maps to it, by
the rule the labels follow (node/pools.py ``Pools.pool_for``: its product's pool, else
its family's, else the default), narrowed to the pool's own ``products:`` list where
the file gives one (a fleet that has B200s only need not be held to the B300's floor).
"""

from __future__ import annotations

from buildmatrix.drivers import GpuModel
from buildmatrix.node.pools import Pools
from buildmatrix.profiles import ProfileSet


def pool_models(pools: Pools, profiles: ProfileSet) -> dict[str, tuple[GpuModel, ...]]:
    """Pool name -> its GPU models in profile order; pools in the order the file maps them."""
    order = [*pools.families.values(), *pools.products.values()]
    if pools.default:
        order.append(pools.default)
    found: dict[str, list[GpuModel]] = {name: [] for name in dict.fromkeys(order)}
    for profile in profiles:
        for product in profile.products:
            pool = pools.pool_for(product=product, family=profile.family.value)
            if pool is None:
                continue
            listed = pools.spec(pool).products
            if listed and product not in listed:
                continue
            found[pool].append(GpuModel(product=product, profile=profile))
    return {name: tuple(models) for name, models in found.items()}
