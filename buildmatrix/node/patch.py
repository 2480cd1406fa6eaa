"""The patch that brings a Node to ``smoke``'s verdict (``smoke --apply``). Pure: the
Node as read, the verdict in; a strategic merge patch and what it changes out
(node/apply.py sends it).

Only labels buildmatrix owns are set or removed, GPU Feature Discovery's keys only
where buildmatrix writes them; the admission taint (``--taint-key``, effect
NoSchedule) is removed on pass and kept or added on fail; the report annotation says
why a node failed. A pass during a driver upgrade, and an admitted node's transient
failure, are held (node/hold.py). ``spec.taints`` is one list that a patch replaces
whole, so a patch that changes it carries the ``metadata.resourceVersion`` it was
computed from (node/apply.py retries on 409 Conflict).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from buildmatrix.labelkeys import (
    POOL,
    REPORT_ANNOTATION,
    SMOKE,
    TAINT_EFFECT,
    TAINT_KEY,
    GfdKeys,
    owned,
    writes_gfd_keys,
)
from buildmatrix.node.hold import (
    UNAVAILABLE_SINCE,
    Kept,
    Transient,
    admitted,
    keep_admitted,
    upgrade_hold,
)

MAX_REPORT = 4096  # bytes of the annotation; an object's annotations share 256 KiB


@dataclass(frozen=True, kw_only=True)
class Applied:
    node: str
    labels_set: tuple[str, ...]
    labels_removed: tuple[str, ...]
    taint: str  # removed | kept | added | absent
    attempts: int
    gfd_keys: bool  # whether buildmatrix wrote GFD's keys (else they are GFD's)
    # Why the round's verdict was not written as is (node/hold.py): a pass held during
    # a driver upgrade, or an admitted node kept admitted through a transient failure.
    held: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "node": self.node,
            "labels_set": list(self.labels_set),
            "labels_removed": list(self.labels_removed),
            "taint": self.taint,
            "attempts": self.attempts,
            "gfd_keys": "written" if self.gfd_keys else "left to GPU Feature Discovery",
        }
        if self.held is not None:
            doc["held"] = self.held
        return doc

    def describe(self) -> str:
        held = f" ({self.held})" if self.held is not None else ""
        return (
            f"node {self.node}: {len(self.labels_set)} label(s) set, "
            f"{len(self.labels_removed)} removed, admission taint {self.taint}{held}"
        )


def report_text(failures: Sequence[str]) -> str:
    """The failed checks, one per line, cut to MAX_REPORT bytes."""
    text = "\n".join(failures)
    data = text.encode("utf-8")
    if len(data) <= MAX_REPORT:
        return text
    return data[: MAX_REPORT - 3].decode("utf-8", "ignore") + "..."


def plan(
    node: Mapping[str, Any],
    *,
    passed: bool,
    labels: Mapping[str, str],
    report: str,
    gfd_keys: GfdKeys,
    taint_key: str = TAINT_KEY,
    transient: Transient | None = None,
    now: datetime | None = None,
) -> tuple[dict[str, Any], Applied]:
    """The strategic merge patch that brings ``node`` to the verdict (pure).

    Only labels buildmatrix owns (labelkeys.owned) are set or removed; GFD's keys are
    left out of both where GFD labels the node (``gfd_keys``: labelkeys.GfdKeys).
    ``taint_key`` is the admission taint's key (``--taint-key``). A pass during a
    driver upgrade, and an admitted node's ``transient`` failure, are held
    (node/hold.py); ``now`` is when the round ends (a source's grace is counted from it).

    A failed verdict leaves the pool label (``gpu-pool``) as the node has it: the
    taint alone keeps workloads off, while the label also selects the pool's own
    DaemonSets (the GPU Operator's driver of the pool's ``NVIDIADriver``: ``k8s
    drivers``), whose Pods the DaemonSet controller deletes from a node it no longer
    selects. Removing it on a failed round (a registry outage fails the whole pool at
    once) would unload the driver the next round needs to pass."""
    meta = node.get("metadata") or {}
    current: dict[str, str] = dict(meta.get("labels") or {})
    taints: list[dict[str, Any]] = list((node.get("spec") or {}).get("taints") or [])
    annotations = dict((meta.get("annotations") or {}).items())
    ours = [t for t in taints if t.get("key") == taint_key and t.get("effect") == TAINT_EFFECT]
    held = upgrade_hold(current) if passed and ours else None
    if held is not None:  # no admission mid-upgrade: the taint stays, the report says why
        passed, labels, report = False, {SMOKE: "failed"}, held
    elif not passed and transient is not None and admitted(current, tainted=bool(ours)):
        kept = keep_admitted(annotations, transient, now or datetime.now(UTC))
        if isinstance(kept, Kept):
            return _kept(meta, annotations, kept, gfd=writes_gfd_keys(gfd_keys, current))
        report = report_text([kept, report])
    ours_gfd = writes_gfd_keys(gfd_keys, current)
    # one predicate for what is written and what is removed
    wanted = {k: v for k, v in labels.items() if owned(k, gfd_keys=ours_gfd)}
    label_patch: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    removed = sorted(
        k
        for k in current
        if owned(k, gfd_keys=ours_gfd) and k not in wanted and (passed or k != POOL)
    )
    label_patch.update(dict.fromkeys(removed))
    if passed:
        new_taints = [t for t in taints if t not in ours]
        taint = "removed" if ours else "absent"
    elif ours:
        new_taints, taint = taints, "kept"
    else:
        new_taints, taint = [*taints, {"key": taint_key, "effect": TAINT_EFFECT}], "added"
    metadata: dict[str, Any] = {}
    if label_patch:
        metadata["labels"] = label_patch
    notes: dict[str, str | None] = dict.fromkeys(
        [k for k in (UNAVAILABLE_SINCE,) if k in annotations]  # the outage is over
    )
    if passed and REPORT_ANNOTATION in annotations:
        notes[REPORT_ANNOTATION] = None
    elif not passed and annotations.get(REPORT_ANNOTATION) != report:
        notes[REPORT_ANNOTATION] = report
    if notes:
        metadata["annotations"] = notes
    body: dict[str, Any] = {}
    if new_taints != taints:
        # the precondition that makes replacing the list safe against a concurrent write
        metadata["resourceVersion"] = meta.get("resourceVersion")
        body["spec"] = {"taints": new_taints}
    if metadata:
        body["metadata"] = metadata
    applied = Applied(
        node=str(meta.get("name", "")),
        labels_set=tuple(sorted(k for k, v in label_patch.items() if v is not None)),
        labels_removed=tuple(removed),
        taint=taint,
        attempts=0,
        gfd_keys=ours_gfd,
        held=held,
    )
    return body, applied


def _kept(
    meta: Mapping[str, Any], annotations: Mapping[str, str], kept: Kept, *, gfd: bool
) -> tuple[dict[str, Any], Applied]:
    """An admitted node kept admitted: only the report (and the outage's start)."""
    report = report_text([kept.report])  # the annotation's limit, as a failure's
    notes = {
        k: v
        for k, v in ((REPORT_ANNOTATION, report), (UNAVAILABLE_SINCE, kept.since))
        if annotations.get(k) != v
    }
    applied = Applied(
        node=str(meta.get("name", "")),
        labels_set=(),
        labels_removed=(),
        taint="absent",
        attempts=0,
        gfd_keys=gfd,
        held=report,
    )
    return ({"metadata": {"annotations": notes}} if notes else {}), applied
