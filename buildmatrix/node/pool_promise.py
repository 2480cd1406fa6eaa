"""The ``pool`` check: a node is what its pool promised (docs/kubernetes.md, "Day 2:
autoscaling from zero"). Pure.

An autoscaler knows a node that does not exist yet only by its template: Karpenter's
NodePool (``spec.template.metadata.labels``, applied to the Node when it registers:
kubernetes-sigs/karpenter ``pkg/controllers/nodeclaim/lifecycle/registration.go``),
cluster-autoscaler's node-group tags. ``buildmatrix k8s nodepools`` renders those
labels from the pools file: the labels smoke writes for the pool's models at the pool's
``driver``. A node whose driver differs (an AMI or driver-container upgrade nobody
told the pools file about), or whose GPU is not one of the pool's ``products``, would
make the template a lie for the next scale-up, so it fails here; a pool that promises
neither is not checked.
"""

from __future__ import annotations

from collections.abc import Sequence

from buildmatrix.arch import gfd_family
from buildmatrix.node.gpu_models import Model
from buildmatrix.node.pools import Pools
from buildmatrix.node.results import NodeCheck
from buildmatrix.snapshot import Snapshot

NAME = "pool"


def check_pool_promise(
    snapshot: Snapshot, models: Sequence[Model], labelled: Model | None, pools: Pools | None
) -> NodeCheck | None:
    """The node's driver is its pool's ``driver`` and each of its GPU models one of the
    pool's ``products`` (where the pools file gives them); None where the node's pool
    promises nothing."""
    if pools is None or labelled is None:
        return None
    pool = pools.pool_for(product=labelled.name, family=gfd_family(labelled.cc).value)
    spec = pools.spec(pool)
    if spec.driver is None and not spec.products:
        return None
    problems = []
    if spec.driver is not None and snapshot.driver.key != spec.driver.key:
        problems.append(
            f"driver {snapshot.driver} is not the {spec.driver} pools.{pool}.driver promises "
            "(the pool's NodePool labels say that driver): install it, or change the "
            "promise and re-render the templates (buildmatrix k8s nodepools)"
        )
    if spec.products:
        strangers = [m.name for m in models if m.name not in spec.products]
        if strangers:
            problems.append(
                f"{', '.join(strangers)} is not among pools.{pool}.products "
                f"({', '.join(spec.products)}): the pool's templates promise only those"
            )
    if problems:
        return NodeCheck(name=NAME, ok=False, message="; ".join(problems))
    said = [f"driver {spec.driver}"] if spec.driver is not None else []
    if spec.products:
        said.append("GPU models")
    return NodeCheck(name=NAME, ok=True, message=f"{' and '.join(said)} as pool {pool} promises")
