"""Which images ``smoke`` checks on a node: those given with ``--image``, and those of
the pool the node falls in (the pools file's ``pools.<name>.images``). Pure.

The pool is the one the labels give the node (``gpu-pool``): the pool of the model
the labels describe, the least capable one (node/gpu_models.py ``least_capable``), by
its product, else its family (node/pools.py ``Pools.pool_for``). So a node is
checked against exactly the images of the pool it is admitted to.

``--load-test`` with nothing to load is never a pass (docs/smoke.md): without any
image it would prove nothing while the report said the load test ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from buildmatrix.errors import InputError
from buildmatrix.node.gpu_models import least_capable, models_of
from buildmatrix.node.labels import gfd_family_label
from buildmatrix.node.pools import Pools
from buildmatrix.node.results import NodeCheck
from buildmatrix.profiles import ProfileSet
from buildmatrix.snapshot import Snapshot

# The machine names uname gives -> the architecture an image index names (Go's GOARCH,
# which the OCI image-spec's image-index.md "platform.architecture" takes).
_GOARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}


def node_platform(machine: str) -> str | None:
    """The platform (``linux/ARCH``) of a node whose ``uname -m`` is ``machine``: the
    variant of a multi-platform image its container runtime would pull (a Grace node,
    GH200 or GB200, pulls ``linux/arm64``). None for a machine not known here."""
    arch = _GOARCH.get(machine.lower())
    return f"linux/{arch}" if arch else None


@dataclass(frozen=True, kw_only=True)
class ImagePlan:
    """The images to check on one node, and where each comes from."""

    pool: str | None  # the node's pool, None without a pools file or a matching rule
    given: tuple[str, ...]  # --image, in the order given
    from_pool: tuple[str, ...]  # the pool's images not already given

    @property
    def refs(self) -> tuple[str, ...]:
        return (*self.given, *self.from_pool)


def node_pool(snapshot: Snapshot, profiles: ProfileSet, pools: Pools) -> str | None:
    """The pool the node's labels name (``gpu-pool``), whether or not it passes."""
    models = models_of(snapshot, profiles)
    if not models:
        return None
    model = least_capable(models)
    return pools.pool_for(product=model.name, family=gfd_family_label(model.cc))


def plan_images(
    given: Sequence[str], *, snapshot: Snapshot, profiles: ProfileSet, pools: Pools | None
) -> ImagePlan:
    """``--image`` first, then the pool's images; each reference once."""
    mine = tuple(dict.fromkeys(given))
    if pools is None:
        return ImagePlan(pool=None, given=mine, from_pool=())
    pool = node_pool(snapshot, profiles, pools)
    extra = tuple(ref for ref in dict.fromkeys(pools.spec(pool).images) if ref not in mine)
    return ImagePlan(pool=pool, given=mine, from_pool=extra)


def pools_without_images(pools: Pools) -> list[str]:
    """The pools a node can be mapped to that list no image, sorted."""
    mapped = {*pools.families.values(), *pools.products.values()}
    if pools.default:
        mapped.add(pools.default)
    return sorted(p for p in mapped if not pools.spec(p).images)


def require_images(given: Sequence[str], pools: Pools | None) -> None:
    """``--load-test`` before any NVML or image work: with no ``--image`` and no pool
    image anywhere in the pools file, there can be nothing to load on any node."""
    if given or (pools is not None and any(s.images for s in pools.specs.values())):
        return
    where = (
        f"the pools file {pools.source} lists no images (pools.<name>.images)"
        if pools is not None
        else "no --pools file names the pool's images"
    )
    raise InputError(
        f"--load-test loads the images this node must run, and there are none: no --image "
        f"was given and {where}. Pass --image REF, or list each pool's images under "
        "pools.<name>.images in the pools file (docs/smoke.md, Pools file); without "
        "--load-test, smoke checks the node without loading any code."
    )


def nothing_to_load(plan: ImagePlan, pools: Pools | None) -> NodeCheck | None:
    """The failed ``load-test`` check of a node that has no image to load, or None."""
    if plan.refs:
        return None
    source = pools.source if pools is not None else "the pools file"
    if plan.pool is None:
        why = (
            f"this node falls in no pool of {source} (no product, family or default "
            "matches its GPUs), so no pool names its images"
        )
    else:
        why = f"its pool '{plan.pool}' lists no images (add pools.{plan.pool}.images to {source})"
    return NodeCheck(
        name="load-test",
        ok=False,
        message=f"nothing to load: no --image was given and {why}. A load test of no "
        "image proves nothing, so the node is not admitted",
    )
