"""Node checks: a snapshot (and what was found out about images) in, named verdicts out.

Pure. Each check is a small function from data to a :class:`NodeCheck` with a
message a human can act on; :func:`evaluate` runs them in order and fails closed:
any NVML error, unknown GPU or failed check makes the node ``fail``.
What each check means: docs/smoke.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from buildmatrix.arch import ComputeCapability, gfd_family
from buildmatrix.check import CheckResult
from buildmatrix.compat import Floor, driver_floors
from buildmatrix.compat import check_driver as compat_check_driver
from buildmatrix.cuda import CudaFacts, DriverVersion
from buildmatrix.node import mig
from buildmatrix.node.pools import Pools
from buildmatrix.profiles import Profile, ProfileSet
from buildmatrix.snapshot import Gpu, Snapshot


@dataclass(frozen=True, kw_only=True)
class NodeCheck:
    name: str
    ok: bool
    message: str
    warning: bool = False  # ok, but worth a look (persistence mode off)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "message": self.message, "warning": self.warning}


@dataclass(frozen=True, kw_only=True)
class Model:
    """One GPU model on the node: NVML name and compute capability, with its GPUs."""

    name: str
    gpus: tuple[Gpu, ...]
    profile: Profile | None

    @property
    def cc(self) -> ComputeCapability:
        return self.gpus[0].cc

    @property
    def memory_mib(self) -> int | None:
        sizes = [g.memory_total_mib for g in self.gpus if g.memory_total_mib]
        return min(sizes) if sizes else None

    @property
    def indexes(self) -> str:
        return ",".join(str(g.index) for g in self.gpus)


@dataclass(frozen=True, kw_only=True)
class LoadResult:
    """``--load-test`` of one image on one GPU model (node/loadtest.py fills it)."""

    image: str
    model: str
    loaded: int
    jit: int
    jit_seconds: float = 0.0
    failures: tuple[str, ...] = ()
    files: tuple[str, ...] = ()  # one line per file: how it loaded, or its errors
    error: str | None = None  # the load test could not run (to the end)


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


def models_of(snapshot: Snapshot, profiles: ProfileSet) -> tuple[Model, ...]:
    """GPU models in order of their first GPU; one model = one (name, CC)."""
    groups: dict[tuple[str, ComputeCapability], list[Gpu]] = {}
    for gpu in sorted(snapshot.gpus, key=lambda g: g.index):
        groups.setdefault((gpu.name, gpu.cc), []).append(gpu)
    return tuple(
        Model(name=name, gpus=tuple(gpus), profile=profiles.by_cc(cc))
        for (name, cc), gpus in groups.items()
    )


def least_capable(models: Sequence[Model]) -> Model:
    """The model every workload on the node can count on: lowest CC, then least memory."""
    return min(models, key=lambda m: (m.cc, m.memory_mib or 0, m.name))


def check_nvml(snapshot: Snapshot) -> NodeCheck:
    if snapshot.errors:
        mig_on = {g.index for g in snapshot.gpus if g.mig_mode}
        refused = [
            e
            for e in snapshot.errors
            if e.error == "NVML_ERROR_NO_PERMISSION" and e.index in mig_on
        ]
        why = (
            mig.MONITOR_HINT
            if refused
            else "A lost GPU or one needing reset must be serviced before the node is admitted"
        )
        return NodeCheck(
            name="nvml",
            ok=False,
            message="NVML reported errors: "
            + "; ".join(str(e) for e in snapshot.errors)
            + f". {why}.",
        )
    return NodeCheck(
        name="nvml", ok=True, message=f"driver {snapshot.driver}, {len(snapshot.gpus)} GPU(s) read"
    )


def check_count(snapshot: Snapshot, expected: Sequence[tuple[int, str]]) -> NodeCheck:
    """NVML's GPUs against the kernel's PCI bus and each expected count.

    ``expected``: (count, where it comes from), e.g. (8, "--expect-gpus"). A GPU the
    kernel enumerated but the driver did not bring up is not counted by NVML and
    raises no NVML error: only the PCI bus shows it (node/pci.py).
    """
    seen = len(snapshot.gpus)
    if seen == 0:
        return NodeCheck(
            name="gpus", ok=False, message="no GPU is visible to NVML; nothing to admit"
        )
    problems = []
    if snapshot.gpu_count is not None and snapshot.gpu_count > seen:
        # nvmlDeviceGetCount counts every GPU the driver manages; one the probe could
        # not read (its handle, name or compute capability not answered) is missing.
        problems.append(
            f"NVML counts {snapshot.gpu_count} GPU(s) (nvmlDeviceGetCount) but {seen} could "
            "be read; a GPU the driver manages could not be identified"
        )
    on_bus = snapshot.pci_gpus
    missing = snapshot.pci_missing_from_nvml()
    if missing or (on_bus is not None and len(on_bus) > seen):
        named = f": {', '.join(missing)} not shown by NVML" if missing else ""
        problems.append(
            f"the PCI bus has {len(on_bus or ())} NVIDIA GPU(s), NVML shows {seen}{named}. "
            "The driver did not bring a GPU up (dmesg: Xid 79, RmInitAdapter failed) or the "
            "container sees only some GPUs (NVIDIA_VISIBLE_DEVICES)"
        )
    counts = [seen] if on_bus is None else [seen, len(on_bus)]
    for count, where in expected:
        if min(counts) < count:
            problems.append(
                f"{min(counts)} GPU(s) visible, {count} expected ({where}): a GPU has fallen "
                "off the bus or is hidden; check dmesg for Xid 79 and lspci"
            )
    if problems:
        return NodeCheck(name="gpus", ok=False, message="; ".join(problems))
    bus = " (PCI bus not read)" if on_bus is None else f", {len(on_bus)} on the PCI bus"
    want = "".join(f", {count} expected ({where})" for count, where in expected)
    return NodeCheck(name="gpus", ok=True, message=f"{seen} GPU(s) visible{bus}{want}")


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


def check_profiles(models: Sequence[Model], profiles: ProfileSet) -> NodeCheck:
    unknown = [m for m in models if m.profile is None]
    if unknown:
        what = "; ".join(f"{m.name} (compute capability {m.cc}, GPU {m.indexes})" for m in unknown)
        sms = ", ".join(sorted({f"sm_{m.cc.number}.yaml" for m in unknown}))
        return NodeCheck(
            name="profiles",
            ok=False,
            message=f"no arch profile for {what} in {profiles.directory}: buildmatrix cannot "
            f"judge this GPU. Add {sms} (docs/profiles.md) to a profiles folder and pass "
            "--profiles DIR",
        )
    parts = [
        f"{m.name}: {p.sm} ({p.family})"
        + ("" if m.name in p.products else " (product not listed in the profile)")
        for m in models
        if (p := m.profile) is not None
    ]
    return NodeCheck(name="profiles", ok=True, message="; ".join(parts))


def check_uniform(models: Sequence[Model], allow_mixed: bool) -> NodeCheck:
    if len(models) <= 1:
        return NodeCheck(name="uniform", ok=True, message="one GPU model on the node")
    names = "; ".join(f"{m.name} (GPU {m.indexes})" for m in models)
    if not allow_mixed:
        return NodeCheck(
            name="uniform",
            ok=False,
            message=f"several GPU models: {names}. GPU Feature Discovery labels such a node "
            "from one model chosen arbitrarily, so its labels would lie; pass --allow-mixed "
            "to label it by its least capable model",
        )
    low = least_capable(models)
    return NodeCheck(
        name="uniform",
        ok=True,
        warning=True,
        message=f"several GPU models: {names}; --allow-mixed: labels describe the least "
        f"capable, {low.name}",
    )


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
    result = compat_check_driver(driver, floors)
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


def check_health(gpus: Sequence[Gpu]) -> NodeCheck:
    """ECC, retired pages, remapped rows, MIG reset pending; unsupported fields pass."""
    problems: list[str] = []
    unsupported: set[str] = set()
    for g in gpus:
        where = f"GPU {g.index}"
        if g.ecc_uncorrected_volatile is None:
            unsupported.add("ECC")
        elif g.ecc_uncorrected_volatile > 0:
            problems.append(
                f"{where}: {g.ecc_uncorrected_volatile} uncorrected ECC error(s) since the "
                "driver loaded"
            )
        if g.retired_pages_pending:
            problems.append(f"{where}: retired pages pending; reboot the node")
        if g.remapped_rows is None:
            unsupported.add("remapped rows")
        else:
            if g.remapped_rows.failure:
                problems.append(f"{where}: row remapping failed; the GPU needs service (RMA)")
            if g.remapped_rows.pending:
                problems.append(f"{where}: row remapping pending; reset the GPU")
        if (
            g.mig_mode is not None
            and g.mig_mode_pending is not None
            and g.mig_mode != g.mig_mode_pending
        ):
            now, then = ("on", "off") if g.mig_mode else ("off", "on")
            problems.append(f"{where}: MIG mode is {now} but {then} after a reset; reset the GPU")
    if problems:
        return NodeCheck(name="health", ok=False, message="; ".join(problems))
    note = f" ({', '.join(sorted(unsupported))} not supported)" if unsupported else ""
    return NodeCheck(
        name="health",
        ok=True,
        message=f"ECC, retired pages, remapped rows and MIG state clean on {len(gpus)} GPU(s)"
        + note,
    )


def check_persistence(gpus: Sequence[Gpu]) -> NodeCheck:
    off = [str(g.index) for g in gpus if g.persistence_mode is False]
    if off:
        return NodeCheck(
            name="persistence",
            ok=True,
            warning=True,
            message=f"persistence mode off on GPU {','.join(off)}: the first CUDA call of "
            "each job pays driver start-up; enable nvidia-persistenced",
        )
    return NodeCheck(name="persistence", ok=True, message="persistence mode on or not reported")


def check_mig(gpus: Sequence[Gpu], strategy: str) -> NodeCheck:
    """MIG devices labelled under GFD's strategy (node/mig.py); ``none`` is a warning."""
    problems = mig.strategy_problems(gpus, strategy)
    if problems:
        return NodeCheck(
            name="mig", ok=False, message=f"--mig-strategy {strategy}: " + "; ".join(problems)
        )
    return NodeCheck(
        name="mig",
        ok=True,
        warning=strategy == "none",
        message=mig.strategy_summary(gpus, strategy),
    )


def check_image(result: CheckResult) -> NodeCheck:
    name = f"image {result.image.ref}"
    if result.passed:
        verdicts = ", ".join(f"{t.target.name}: {t.verdict.value}" for t in result.targets)
        return NodeCheck(name=name, ok=True, message=f"runs on every GPU model ({verdicts})")
    return NodeCheck(name=name, ok=False, message="; ".join(result.problems))


def check_load(result: LoadResult) -> NodeCheck:
    name = f"load-test {result.image} on {result.model}"
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
    checks += [check_image(r) for r in images]
    checks += [
        NodeCheck(name=f"image {ref}", ok=False, message=f"cannot be checked: {why}")
        for ref, why in unreadable
    ]
    checks += [check_load(r) for r in loads]
    return NodeReport(
        checks=tuple(checks),
        models=models,
        labelled=labelled,
        driver_floor=max((f.driver for f in floors if f.driver is not None), default=None),
    )
