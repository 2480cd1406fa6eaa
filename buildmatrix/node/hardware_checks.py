"""The node checks of the GPUs themselves: NVML errors, GPU counts, arch profiles,
one model per node, health, persistence mode and MIG. Pure: a snapshot (and the GPU
models, profiles) in, one :class:`NodeCheck` out. What each means: docs/smoke.md."""

from __future__ import annotations

from collections.abc import Sequence

from buildmatrix.node import mig
from buildmatrix.node.gpu_models import Model, least_capable
from buildmatrix.node.results import NodeCheck
from buildmatrix.profiles import ProfileSet
from buildmatrix.snapshot import Gpu, Snapshot


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
