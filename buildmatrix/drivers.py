"""Driver policy per pool (docs/drivers.md): the driver floor each pool needs, and what
a proposed driver would break. Pure: pools, profiles, scanned images in; data out.

There is one derivation of "the driver this needs", ``check --snapshot``'s: every
verdict here is :func:`buildmatrix.check.run_check` on a node snapshot of one GPU model
at one driver, the same call ``check --snapshot`` makes. A pool's floor is found by
running it at every driver version where its answer can change
(:func:`buildmatrix.affinity.breakpoints`: the CUDA runtime floor, each hardware floor,
the driver that JITs each PTX, the edges of the image's forward-compatibility library)
plus each model's own product floor; between two such versions every rule
(compat.driver_floors, compat._judge_ptx, forward.compat_use) gives the same answer.
A pool without images still needs its GPUs' hardware floors, taken as ``check``
takes them (compat.driver_floors), which are also the ones ``smoke`` applies
(node/driver_check.py ``node_floors``). Which models a pool has: node/poolmodels.py.

The floor of a (model, image) pair is the lowest driver from which ``check`` passes
on every newer one. A forward-compatibility image may also pass on an older branch
that its compat driver lists; that is reported by ``--driver``, never taken as the
floor, since an upgrade within the branch could leave the window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from buildmatrix.affinity import breakpoints
from buildmatrix.check import CheckResult, Options, run_check
from buildmatrix.compat import Floor as CompatFloor
from buildmatrix.compat import Verdict, driver_floors, driver_meets_floors
from buildmatrix.cuda import CudaFacts, DriverVersion, major_minor
from buildmatrix.image.scanned import ScannedImage
from buildmatrix.profiles import Profile, ProfileSet
from buildmatrix.snapshot import Gpu, Snapshot


class State(StrEnum):
    """One image on one GPU model at one driver, as the report colours it."""

    NATIVE = "native"  # check passes, SASS for the GPU in every file
    JIT = "jit"  # check passes, some file runs only by PTX JIT
    FAILS = "fails"  # check fails (no code, driver too old, a claim it breaks)


@dataclass(frozen=True, kw_only=True)
class GpuModel:
    """One GPU product of a pool, with its profile (every product a profile lists)."""

    product: str
    profile: Profile

    @property
    def hardware_floor(self) -> DriverVersion:
        return self.profile.driver_floor(self.product)


@dataclass(frozen=True, kw_only=True)
class Cell:
    """``check --snapshot``'s verdict of one image on one model at one driver."""

    image: str
    model: str
    driver: DriverVersion
    state: State
    reasons: tuple[str, ...]
    own: bool = True  # one of the pool's images (else judged only to show where it runs)


@dataclass(frozen=True, kw_only=True)
class Floor:
    """The lowest driver that admits something, and why the driver below it does not.
    ``driver`` None: no driver admits it (``why`` says what fails on the newest)."""

    driver: DriverVersion | None
    subject: str  # "NVIDIA H200" or "IMAGE on NVIDIA H200"
    why: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class PoolPolicy:
    name: str
    models: tuple[GpuModel, ...]
    images: tuple[str, ...]  # the pool's own images (pools.<name>.images)
    floor: Floor  # the highest of ``floors``
    floors: tuple[Floor, ...]  # each model's hardware floor, each (image, model) pair's
    proposed: DriverVersion | None
    cells: tuple[Cell, ...]  # at the proposed driver, else the current one, else the floor
    # what the proposal is compared with: the pool's current driver (pools.<name>.driver)
    # where the pools file states it, else its floor
    baseline: tuple[Cell, ...]
    hardware: tuple[Cell, ...]  # each model's hardware floor at the driver judged
    current: DriverVersion | None = None

    @property
    def baseline_at(self) -> str:
        """The driver the baseline is judged at, and what it is: 'current' or 'floor'."""
        if self.current is not None:
            return f"{self.current} (current)"
        return f"{self.floor.driver} (floor)" if self.floor.driver else "the floor"

    @property
    def judged_at(self) -> DriverVersion | None:
        return self.proposed or self.current or self.floor.driver

    @property
    def breaks(self) -> tuple[Cell, ...]:
        own = (*self.hardware, *(c for c in self.cells if c.own))
        return tuple(c for c in own if c.state is State.FAILS)

    @property
    def changes(self) -> tuple[tuple[Cell, Cell], ...]:
        """(at the floor, at the proposed driver) for each of the pool's own images on
        each model whose state differs."""
        pairs = zip(self.baseline, self.cells, strict=True)
        return tuple((b, c) for b, c in pairs if c.own and b.state is not c.state)

    @property
    def setters(self) -> tuple[Floor, ...]:
        """Every floor equal to the pool's: what sets it."""
        return tuple(f for f in self.floors if f.driver == self.floor.driver)

    @property
    def passed(self) -> bool:
        no_floor = self.floor.driver is None and bool(self.models)
        return not no_floor and not self.breaks


def snapshot_of(model: GpuModel, driver: DriverVersion, facts: CudaFacts) -> Snapshot:
    """A node of one GPU of ``model`` at ``driver``, as ``smoke --record`` writes one:
    NVML's CUDA driver version is the newest CUDA the driver supports."""
    cuda = facts.driver_cuda(driver)
    return Snapshot(
        hostname=f"{model.product} at {driver}",
        driver=driver,
        cuda_driver_version=major_minor(cuda) if cuda is not None else None,
        gpus=(Gpu(index=0, name=model.product, cc=model.profile.cc, memory_total_mib=None),),
        errors=(),
        source=f"buildmatrix drivers: {model.product} at driver {driver}",
    )


def judge(
    image: ScannedImage,
    model: GpuModel,
    driver: DriverVersion,
    *,
    profiles: ProfileSet,
    facts: CudaFacts,
) -> CheckResult:
    """``check --snapshot`` of ``image`` on a node of ``model`` at ``driver``."""
    opts = Options(snapshot=snapshot_of(model, driver, facts))
    return run_check(image, profiles, opts, facts)


def cell_of(result: CheckResult, model: GpuModel, driver: DriverVersion, *, own: bool) -> Cell:
    if not result.passed:
        state, reasons = State.FAILS, tuple(result.problems)
    else:
        jit = any(t.verdict is Verdict.JIT for t in result.targets)
        state = State.JIT if jit else State.NATIVE
        reasons = tuple(r for t in result.targets for r in t.reasons)
    return Cell(
        image=result.image.ref,
        model=model.product,
        driver=driver,
        state=state,
        reasons=reasons,
        own=own,
    )


def _hardware_floors(model: GpuModel, facts: CudaFacts) -> tuple[CompatFloor, ...]:
    """The model's hardware floor as ``check --snapshot`` takes it for a target
    (check.py ``resolve_targets``: ``ProfileSet.hardware_floor``, then
    compat.driver_floors), which is also what ``smoke`` applies (node_floors)."""
    special = model.product in model.profile.product_floors
    label = model.product if special else f"{model.profile.sm} ({model.product})"
    return driver_floors(
        cuda_runtime=None, hardware_floor=model.hardware_floor, hardware=label, facts=facts
    )


def hardware_cell(model: GpuModel, driver: DriverVersion, facts: CudaFacts) -> Cell:
    """Whether ``driver`` meets the model's hardware floor."""
    result = driver_meets_floors(driver, _hardware_floors(model, facts))
    return Cell(
        image="",
        model=model.product,
        driver=driver,
        state=State.NATIVE if result.ok else State.FAILS,
        reasons=result.failures or result.reasons,
    )


def hardware_floor(model: GpuModel, facts: CudaFacts) -> Floor:
    top = max(_hardware_floors(model, facts), key=lambda f: f.driver or _ZERO)
    return Floor(driver=top.driver, subject=model.product, why=(top.why,))


_ZERO = DriverVersion((0, 0, 0), "0")


def pair_floor(
    image: ScannedImage, model: GpuModel, *, profiles: ProfileSet, facts: CudaFacts
) -> Floor:
    """The lowest driver from which ``check --snapshot`` passes ``image`` on ``model``
    on every newer driver; ``why`` is what ``check`` says just below it."""
    points = sorted({*breakpoints(image, profiles, facts), model.hardware_floor})
    results = [judge(image, model, v, profiles=profiles, facts=facts) for v in points]
    subject = f"{image.ref} on {model.product}"
    if not results[-1].passed:
        return Floor(driver=None, subject=subject, why=tuple(results[-1].problems))
    i = len(results) - 1
    while i > 0 and results[i - 1].passed:
        i -= 1
    why = tuple(results[i - 1].problems) if i > 0 else ()
    return Floor(driver=points[i], subject=subject, why=why)


def highest(floors: Sequence[Floor]) -> Floor:
    """The floor that binds: one no driver meets, else the highest driver."""
    never = [f for f in floors if f.driver is None]
    if never:
        return never[0]
    return max(floors, key=lambda f: f.driver or _ZERO)


def pool_policy(
    name: str,
    *,
    models: Sequence[GpuModel],
    images: Mapping[str, ScannedImage],
    others: Mapping[str, ScannedImage],
    proposed: DriverVersion | None,
    profiles: ProfileSet,
    facts: CudaFacts,
    current: DriverVersion | None = None,
) -> PoolPolicy:
    """One pool's floor (its models and its own ``images``), the verdict of each image,
    its own and the fleet's ``others``, on each model at the proposed driver (else at
    the pool's ``current`` one, else at the floor), and the same at the current driver
    (else at the floor) for comparison."""
    floors = [hardware_floor(m, facts) for m in models]
    floors += [
        pair_floor(img, m, profiles=profiles, facts=facts)
        for img in images.values()
        for m in models
    ]
    floor = highest(floors) if floors else Floor(driver=None, subject=name, why=("no GPU model",))
    at = proposed or current or floor.driver or _newest(facts)

    every = [(img, True) for img in images.values()]
    every += [(img, False) for ref, img in others.items() if ref not in images]

    def cells(driver: DriverVersion) -> tuple[Cell, ...]:
        return tuple(
            cell_of(judge(img, m, driver, profiles=profiles, facts=facts), m, driver, own=own)
            for img, own in every
            for m in models
        )

    judged = cells(at)
    base_at = current or floor.driver or at
    baseline = judged if base_at == at else cells(base_at)
    return PoolPolicy(
        name=name,
        models=tuple(models),
        images=tuple(images),
        floor=floor,
        floors=tuple(floors),
        proposed=proposed,
        cells=judged,
        baseline=baseline,
        current=current,
        hardware=tuple(hardware_cell(m, at, facts) for m in models),
    )


def _newest(facts: CudaFacts) -> DriverVersion:
    """The newest driver the CUDA table names: where a pool with no floor is judged."""
    return max(tk.driver for tk in facts.toolkits if tk.driver is not None)


def fleet_passed(policies: Sequence[PoolPolicy]) -> bool:
    return all(p.passed for p in policies)
