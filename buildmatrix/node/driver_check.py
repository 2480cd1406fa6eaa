"""The node's driver check: every floor its driver must meet (each GPU model's
hardware floor, each image's CUDA runtime floor) and the verdict on them, by the rules
of buildmatrix/compat.py. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from buildmatrix.compat import Floor, driver_floors, driver_meets_floors
from buildmatrix.cuda import CudaFacts, DriverVersion
from buildmatrix.node.gpu_models import Model
from buildmatrix.node.results import NodeCheck

if TYPE_CHECKING:  # check's results are read here, check itself is not run
    from buildmatrix.check import CheckResult


def node_floors(
    models: Sequence[Model], images: Sequence[CheckResult], facts: CudaFacts
) -> list[Floor]:
    """Every floor the node's driver must meet: each GPU model's hardware floor (its
    product's where the profile names one) and each image's CUDA runtime floor, except
    for an image that runs through its own cuda-compat driver on this node."""
    floors: list[Floor] = []
    for m in models:
        if m.profile is not None:
            special = m.name in m.profile.product_floors
            floors += driver_floors(
                cuda_runtime=None,
                hardware_floor=m.profile.driver_floor(m.name),
                hardware=m.name if special else f"{m.profile.sm} ({m.name})",
                facts=facts,
            )
    for result in images:
        legacy = result.forward_legacy
        if (
            result.forward is not None
            and result.forward.in_use
            and (legacy is None or legacy.in_use)
        ):
            # The image brings its own user-mode driver (CUDA forward compatibility):
            # its runtime floor applies to that, and its own check judges it.
            continue
        if result.cuda_runtime is not None:
            for f in driver_floors(
                cuda_runtime=result.cuda_runtime[0], hardware_floor=None, facts=facts
            ):
                floors.append(Floor(driver=f.driver, why=f"{f.why} of {result.image.ref}"))
    return floors


def check_driver(driver: DriverVersion, floors: Sequence[Floor]) -> NodeCheck:
    if not floors:
        return NodeCheck(
            name="driver",
            ok=False,
            message=f"driver {driver}: no floor is known for these GPUs (no profile)",
        )
    result = driver_meets_floors(driver, floors)
    if not result.ok:
        return NodeCheck(
            name="driver",
            ok=False,
            message=f"driver {driver} is too old: "
            + "; ".join(result.failures)
            + ". Upgrade the driver branch",
        )
    known = [(f.driver, f.why) for f in floors if f.driver is not None]
    top, why = max(known, key=lambda x: x[0])
    return NodeCheck(name="driver", ok=True, message=f"driver {driver} >= {top}: {why}")
