"""Node checks: a snapshot (and what was found out about images) in, named verdicts out.

Pure. Each check is a small function from data to a :class:`NodeCheck` with a
message a human can act on; :func:`evaluate` runs them in order and fails closed:
any NVML error, unknown GPU or failed check makes the node ``fail``.
What each check means: docs/smoke.md.

The checks live by subject: node/hardware_checks.py (the GPUs), node/driver_check.py
(driver floors); the image and load-test verdicts are here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from buildmatrix.arch import gfd_family
from buildmatrix.cuda import CudaFacts, DriverVersion
from buildmatrix.node.driver_check import check_driver, node_floors
from buildmatrix.node.gpu_models import Model, least_capable, models_of
from buildmatrix.node.hardware_checks import (
    check_count,
    check_health,
    check_mig,
    check_nvml,
    check_persistence,
    check_profiles,
    check_uniform,
)
from buildmatrix.node.pool_promise import check_pool_promise
from buildmatrix.node.pools import Pools
from buildmatrix.node.results import LoadResult, NodeCheck
from buildmatrix.profiles import ProfileSet
from buildmatrix.snapshot import Gpu, Snapshot

if TYPE_CHECKING:  # check's results are judged here, check itself is not run
    from buildmatrix.check import CheckResult


@dataclass(frozen=True, kw_only=True)
class NodeOptions:
    expect_gpus: int | None = None
    allow_mixed: bool = False
    pools: Pools | None = None  # its pools.<pool>.gpus is a count the node must show
    mig_strategy: str = "none"  # GPU Feature Discovery's --mig-strategy


@dataclass(frozen=True, kw_only=True)
class NodeReport:
    checks: tuple[NodeCheck, ...]
    models: tuple[Model, ...]
    labelled: Model | None  # the model the labels describe
    driver_floor: DriverVersion | None  # the highest floor applied to the driver

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def expected_counts(options: NodeOptions, labelled: Model | None) -> list[tuple[int, str]]:
    """The GPU counts the node must show: --expect-gpus, and its pool's
    ``pools.<pool>.gpus`` (the pool of the model its labels describe)."""
    found = []
    if options.expect_gpus is not None:
        found.append((options.expect_gpus, "--expect-gpus"))
    if options.pools is not None and labelled is not None:
        pool = options.pools.pool_for(product=labelled.name, family=gfd_family(labelled.cc).value)
        gpus = options.pools.spec(pool).gpus
        if gpus is not None:
            found.append((gpus, f"pools.{pool}.gpus in {options.pools.source}"))
    return found


def check_image(result: CheckResult) -> NodeCheck:
    name = f"image {result.image.ref}"
    if result.passed:
        verdicts = ", ".join(f"{t.target.name}: {t.verdict.value}" for t in result.targets)
        return NodeCheck(name=name, ok=True, message=f"runs on every GPU model ({verdicts})")
    return NodeCheck(name=name, ok=False, message="; ".join(result.problems))


def busy_with_others(result: LoadResult, gpus: Sequence[Gpu]) -> str | None:
    """Why NVML shows the model's GPUs busy with other work where the driver refused
    the load test on every one of them (None: NVML shows nothing that explains it, and
    the refusal is the node's fault). The GPUs of the model (``result.model`` is
    ``NAME (CC)``) run CUDA processes (nvmlDeviceGetComputeRunningProcesses) that hold
    them in exclusive-process mode or fill their memory (nvmlDeviceGetComputeMode)."""
    if not result.busy:
        return None
    mine = [g for g in gpus if result.model == f"{g.name} ({g.cc})"]
    running = [g for g in mine if g.compute_processes]
    if not mine or len(running) < len(mine):
        return None  # a GPU without others' processes refused: not busy, broken
    modes = sorted({g.compute_mode or "unknown" for g in running})
    count = sum(g.compute_processes or 0 for g in running)
    return (
        f"every {result.model} runs others' CUDA work ({count} process(es); compute mode "
        f"{', '.join(modes)}): {result.error}"
    )


def check_load(result: LoadResult, gpus: Sequence[Gpu] = ()) -> NodeCheck:
    name = f"load-test {result.image} on {result.model}"
    busy = busy_with_others(result, gpus)
    if busy is not None:
        return NodeCheck(name=name, ok=False, message=busy, busy=True)
    if result.error is not None:
        return NodeCheck(name=name, ok=False, message=result.error)
    if result.failures:
        return NodeCheck(
            name=name,
            ok=False,
            message=f"{len(result.failures)} module(s) failed to load: "
            + "; ".join(result.failures),
        )
    jit = f", {result.jit} by PTX JIT in {result.jit_seconds:.2f} s" if result.jit else ""
    return NodeCheck(
        name=name,
        ok=True,
        message=f"{result.loaded} module(s) of {len(result.files)} file(s) loaded by the "
        f"driver{jit}",
    )


def evaluate(
    snapshot: Snapshot,
    profiles: ProfileSet,
    facts: CudaFacts,
    *,
    options: NodeOptions,
    images: Sequence[CheckResult] = (),
    unreadable: Sequence[tuple[str, str]] = (),
    loads: Sequence[LoadResult] = (),
) -> NodeReport:
    """All node checks in report order, and what the labels should describe.

    ``unreadable`` lists (REF, why) for images that could not be read: each is a
    failed check, since the node cannot be shown to run them.
    """
    models = models_of(snapshot, profiles)
    labelled = least_capable(models) if models else None
    floors = node_floors(models, images, facts)
    checks = [
        check_nvml(snapshot),
        check_count(snapshot, expected_counts(options, labelled)),
    ]
    if models:
        checks += [
            check_profiles(models, profiles),
            check_uniform(models, options.allow_mixed),
            check_driver(snapshot.driver, floors),
            check_health(snapshot.gpus),
            check_persistence(snapshot.gpus),
        ]
        if any(g.mig_mode for g in snapshot.gpus):
            checks.append(check_mig(snapshot.gpus, options.mig_strategy))
        if (promise := check_pool_promise(snapshot, models, labelled, options.pools)) is not None:
            checks.append(promise)
    checks += [check_image(r) for r in images]
    checks += [
        NodeCheck(name=f"image {ref}", ok=False, message=f"cannot be checked: {why}")
        for ref, why in unreadable
    ]
    checks += [check_load(r, snapshot.gpus) for r in loads]
    return NodeReport(
        checks=tuple(checks),
        models=models,
        labelled=labelled,
        driver_floor=max((f.driver for f in floors if f.driver is not None), default=None),
    )
