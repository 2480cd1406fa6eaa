"""``smoke``: admit a GPU node, from its GPUs to the verdict written where asked.

One flow (docs/smoke.md): the references are checked before any work, the node is
read (a recorded snapshot, or NVML), the images it must run are checked on it
(node/image_fit.py), the node checks decide (node/checks.py), the labels follow
(node/labels.py), and the verdict goes to an NFD feature file (node/nfd.py) and onto
the Node object (node/apply.py) where asked. :func:`admit` returns everything smoke
reports as one :class:`Admission`; the CLI only prints it. Nothing here prints.

Fails closed: a node whose GPUs cannot be read is a failed admission (its report
printed, its failure mark written) with the exit code of the environment error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from buildmatrix.cuda import CudaFacts
from buildmatrix.errors import EnvironmentUnavailable, InputError
from buildmatrix.image.containerd_store import Store
from buildmatrix.image.ref import parse_ref
from buildmatrix.labelkeys import GFD_KEYS, TAINT_KEY, GfdKeys, is_mig_key, writes_gfd_keys
from buildmatrix.node import driver_change
from buildmatrix.node.apply import Applied, NodeApi
from buildmatrix.node.checks import NodeOptions, NodeReport, evaluate
from buildmatrix.node.gpu_models import Model
from buildmatrix.node.hold import SOURCE_GRACE, Transient
from buildmatrix.node.labels import VerifiedImage, node_labels
from buildmatrix.node.node_snapshot import read_snapshot
from buildmatrix.node.poolimages import ImagePlan, nothing_to_load, plan_images, require_images
from buildmatrix.node.pools import Pools
from buildmatrix.node.probe import DriverMismatch
from buildmatrix.node.results import LoadResult, NodeCheck
from buildmatrix.node.verdict_place import FAILED, Deadline, Overdue, Place
from buildmatrix.profiles import ProfileSet
from buildmatrix.snapshot import Snapshot

if TYPE_CHECKING:
    from buildmatrix.node.image_fit import ImageOutcome


@dataclass(frozen=True, kw_only=True)
class AdmitOptions:
    """smoke's options, as the command line gives them (docs/smoke.md)."""

    images: tuple[str, ...] = ()  # --image, in the order given
    snapshot: Path | None = None  # a recorded node; None: this node's GPUs (NVML)
    record: Path | None = None  # where to write what NVML said
    node: str | None = None  # the Node's name (--node, $NODE_NAME)
    sysfs: Path = Path("/sys")
    expect_gpus: int | None = None
    allow_mixed: bool = False
    gfd_keys: GfdKeys = GfdKeys.AUTO
    mig_strategy: str = "none"  # GPU Feature Discovery's --mig-strategy
    require_sass: bool = False
    load_test: bool = False
    nfd_file: Path | None = None
    apply: bool = False  # write the verdict onto the Node through the API
    kubeconfig: Path | None = None
    prefer_containerd: bool = False
    platform: str | None = None  # --platform where given (node/image_fit.images_platform)
    deadline: float | None = None  # --deadline: seconds the round may take (Deadline)
    # --mark-failed: read nothing, write only the failure mark with this reason
    mark_failed: str | None = None
    # --driver-file: the driver this container's libraries belong to (driver_change.py)
    driver_file: Path | None = None
    taint_key: str = TAINT_KEY  # --taint-key: the admission taint's key
    source_grace: float = SOURCE_GRACE  # --source-grace (node/hold.py)


@dataclass(frozen=True, kw_only=True)
class Admission:
    """What smoke found and did: every field its text and JSON reports show."""

    node: str | None  # --node, else the snapshot's host name
    checks: tuple[NodeCheck, ...]  # in report order
    labels: Mapping[str, str]  # as written; GFD's keys left out where GFD owns them
    loads: tuple[LoadResult, ...]  # --load-test, per image and GPU model
    applied: Applied | None  # --apply: what changed on the Node
    exit_code: int  # 0 pass, 1 fail, 2 an image was bad input, 3 NVML unavailable
    # Why NVML could not be read; set exactly when snapshot is None.
    unavailable: str | None = None
    snapshot: Snapshot | None = None
    models: tuple[Model, ...] = ()
    plan: ImagePlan = field(default_factory=lambda: ImagePlan(pool=None, given=(), from_pool=()))
    # Why the verdict was not written as the round says (node/hold.py): a pass held
    # mid-upgrade, an admitted node kept admitted (on the Node or in the NFD file).
    held: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def admit(
    options: AdmitOptions,
    *,
    profiles: ProfileSet,
    pools: Pools | None,
    facts: CudaFacts,
    containerd: Store | None = None,
    overdue: Overdue | None = None,
) -> Admission:
    """Admit (or reject) the node ``options`` describe.

    Bad input (a malformed reference, --load-test with no image anywhere, --apply
    without a node name) is refused before NVML or any image is read; unusable
    credentials for --apply likewise. ``containerd``: where ``containerd:`` references
    are read (default: the environment's, as ``ctr`` takes it). ``overdue``: what
    ends the process when ``options.deadline`` passes (:class:`Deadline`).
    """
    for ref in options.images:
        parse_ref(ref)  # a malformed reference is bad input, before any NVML or I/O
    if options.load_test:
        require_images(options.images, pools)
    if options.mark_failed is not None:
        return _mark_failed(options)
    place = _place(options)
    if options.deadline is None:
        return _round(
            options, place, None, profiles=profiles, pools=pools, facts=facts, containerd=containerd
        )
    if overdue is None:
        raise ValueError("a deadline needs what ends the process when it passes")
    deadline = Deadline(options.deadline, place, overdue)
    try:
        return _round(
            options,
            place,
            deadline,
            profiles=profiles,
            pools=pools,
            facts=facts,
            containerd=containerd,
        )
    finally:
        deadline.claim()  # bad input or an error raised midway: the timer stops too


def _round(
    options: AdmitOptions,
    place: Place,
    deadline: Deadline | None,
    *,
    profiles: ProfileSet,
    pools: Pools | None,
    facts: CudaFacts,
    containerd: Store | None,
) -> Admission:
    """The round itself: the node read, judged and its verdict written; the verdict
    is written only after ``deadline`` is claimed from its timer."""
    try:
        snap = read_snapshot(
            snapshot=options.snapshot, record=options.record, node=options.node, sysfs=options.sysfs
        )
    except EnvironmentUnavailable as exc:
        if deadline is not None:
            deadline.claim()
        check = NodeCheck(name="nvml", ok=False, message=str(exc))
        if isinstance(exc, DriverMismatch) and options.driver_file is not None:
            check = driver_change.changed(options.driver_file, driver_change.MISMATCH)
        return _failed(place, check, exc.exit_code)
    if options.driver_file is not None and options.snapshot is None:
        changed = driver_change.compare(options.driver_file, str(snap.driver))
        if changed is not None:
            if deadline is not None:
                deadline.claim()
            return _failed(place, changed, EnvironmentUnavailable.exit_code)
    plan = plan_images(options.images, snapshot=snap, profiles=profiles, pools=pools)
    outcomes = (
        _check_images(
            plan.refs, snap, profiles=profiles, facts=facts, options=options, containerd=containerd
        )
        if plan.refs
        else []
    )
    report = _judge(snap, profiles, facts, options, pools=pools, outcomes=outcomes)
    empty = nothing_to_load(plan, pools) if options.load_test else None
    if empty is not None:  # a load test of no image is bad input, and never a pass
        report = replace(report, checks=(*report.checks, empty))
    labels = node_labels(
        snap,
        report,
        pools=pools,
        gfd_keys=writes_gfd_keys(options.gfd_keys, None),
        verified=_verified(outcomes),
        mig_strategy=options.mig_strategy,
    )
    if deadline is not None:
        deadline.claim()
    transient = _transient(report, outcomes, grace=options.source_grace)
    return _conclude(
        place, snap, report, labels, plan=plan, outcomes=outcomes, empty=empty, transient=transient
    )


def _transient(
    report: NodeReport, outcomes: list[ImageOutcome], *, grace: float
) -> Transient | None:
    """Whether every failed check says nothing about the node (node/hold.py): an image
    whose source is unavailable (exit 3: a registry down or refusing its credentials),
    or a load test that found the GPUs busy with other work."""
    failed = [c for c in report.checks if not c.ok]
    unavailable = {
        f"image {o.ref}": str(o.error)
        for o in outcomes
        if o.error is not None and o.error.exit_code == EnvironmentUnavailable.exit_code
    }
    if not failed or not all(c.name in unavailable or c.busy for c in failed):
        return None
    why = "; ".join(f"{c.name}: {c.message}" for c in failed)
    return Transient(why=why, grace=grace if any(c.name in unavailable for c in failed) else None)


def _check_images(
    refs: tuple[str, ...],
    snap: Snapshot,
    *,
    profiles: ProfileSet,
    facts: CudaFacts,
    options: AdmitOptions,
    containerd: Store | None,
) -> list[ImageOutcome]:
    """The images the node must run, each checked on it (node/image_fit.py). Imported
    here: a node with no image to check never loads the image readers or check."""
    from buildmatrix.node.image_fit import ImageChecks, check_images, images_platform

    how = ImageChecks(
        require_sass=options.require_sass,
        load_test=options.load_test,
        platform=images_platform(
            options.platform, live=options.snapshot is None, recorded=snap.platform
        ),
        prefer_containerd=options.prefer_containerd,
        containerd=containerd or Store.from_env(),
    )
    return check_images(refs, snap, profiles, facts, how)


def _verified(outcomes: list[ImageOutcome]) -> list[VerifiedImage]:
    if not outcomes:
        return []
    from buildmatrix.node.image_fit import verified_images

    return verified_images(outcomes)


def _judge(
    snap: Snapshot,
    profiles: ProfileSet,
    facts: CudaFacts,
    options: AdmitOptions,
    *,
    pools: Pools | None,
    outcomes: list[ImageOutcome],
) -> NodeReport:
    """The node checks, with what the images showed."""
    node_options = NodeOptions(
        expect_gpus=options.expect_gpus,
        allow_mixed=options.allow_mixed,
        pools=pools,
        mig_strategy=options.mig_strategy,
    )
    return evaluate(
        snap,
        profiles,
        facts,
        options=node_options,
        images=[o.result for o in outcomes if o.result is not None],
        unreadable=[(o.ref, str(o.error)) for o in outcomes if o.error is not None],
        loads=[x for o in outcomes for x in o.loads],
    )


def _conclude(
    place: Place,
    snap: Snapshot,
    report: NodeReport,
    labels: dict[str, str],
    *,
    plan: ImagePlan,
    outcomes: list[ImageOutcome],
    empty: NodeCheck | None,
    transient: Transient | None = None,
) -> Admission:
    """The verdict written where asked (NFD file, Node object), and the admission."""
    failures = [f"{c.name}: {c.message}" for c in report.checks if not c.ok]
    applied, nfd_held = place.write_verdict(
        passed=report.passed, labels=labels, failures=failures, transient=transient
    )
    if applied is not None and not applied.gfd_keys:  # GFD labels the node: its keys
        labels = {k: v for k, v in labels.items() if k not in GFD_KEYS and not is_mig_key(k)}
    codes = [o.error.exit_code for o in outcomes if o.error is not None]
    bad_input = [InputError.exit_code] if empty is not None else []
    checks = report.checks
    if report.passed and applied is not None and applied.held is not None:
        # a pass the Node does not get (mid-upgrade, node/hold.py): not admitted
        checks = (*checks, NodeCheck(name="driver-upgrade", ok=False, message=applied.held))
        labels = dict(FAILED)
    return Admission(
        node=place.node or snap.hostname,
        checks=checks,
        labels=labels,
        loads=tuple(x for o in outcomes for x in o.loads),
        applied=applied,
        held=applied.held if applied is not None and applied.held is not None else nfd_held,
        exit_code=0 if all(c.ok for c in checks) else max([1, *codes, *bad_input]),
        snapshot=snap,
        models=report.models,
        plan=plan,
    )


def _failed(place: Place, check: NodeCheck, exit_code: int) -> Admission:
    """The admission of a round that judged nothing (the GPUs could not be read,
    --mark-failed): failed by ``check``, with every field of a full one (docs/smoke.md,
    --json), its failure mark written; the node as --node names it (None without)."""
    return Admission(
        node=place.node,
        checks=(check,),
        labels=dict(FAILED),
        loads=(),
        applied=place.write_failed(f"{check.name}: {check.message}"),
        exit_code=exit_code,
        unavailable=check.message,
    )


def _mark_failed(options: AdmitOptions) -> Admission:
    """``--mark-failed REASON``: the failure mark alone, where the verdict goes, and no
    GPU or image read. What the DaemonSet's loop runs after a round was killed (the
    OOM killer's SIGKILL ends a process before it can write anything), so that a node
    an earlier round admitted does not stay admitted unchecked."""
    given = [
        flag
        for flag, on in (
            ("--snapshot", options.snapshot is not None),
            ("--record", options.record is not None),
            ("--image", bool(options.images)),
            ("--load-test", options.load_test),
            ("--deadline", options.deadline is not None),
        )
        if on
    ]
    if given:
        raise InputError(
            f"--mark-failed reads nothing and only writes the failure mark: leave out "
            f"{', '.join(given)}."
        )
    if not options.apply and options.nfd_file is None:
        raise InputError(
            "--mark-failed writes the failure mark where the verdict goes: give --apply "
            "(the Node) or --nfd-file PATH."
        )
    check = NodeCheck(name="round", ok=False, message=options.mark_failed or "")
    return _failed(_place(options), check, 1)


def _place(options: AdmitOptions) -> Place:
    """Where the verdict goes; the API client made first (:func:`_node_api`)."""
    api = _node_api(options.node, options.kubeconfig) if options.apply else None
    return Place(
        api=api,
        node=options.node,
        nfd_file=options.nfd_file,
        gfd_keys=options.gfd_keys,
        taint_key=options.taint_key,
    )


def _node_api(node: str | None, kubeconfig: Path | None) -> NodeApi:
    """The API client for --apply, made before any NVML or image work: a missing node
    name or unusable credentials is found before the node is judged."""
    if not node:
        raise InputError(
            "--apply needs the Node's name: pass --node NAME or set NODE_NAME (a "
            "DaemonSet sets it from spec.nodeName)."
        )
    return NodeApi(kubeconfig)
