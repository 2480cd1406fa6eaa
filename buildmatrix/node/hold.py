"""When ``smoke --apply`` leaves a node's admission as it is rather than write the round's
verdict (docs/kubernetes.md, "Day 2"). Pure: the Node's labels and annotations in, a
decision out.

- **A driver upgrade in progress.** The GPU Operator's upgrade controller marks each
  node it upgrades with ``nvidia.com/gpu-driver-upgrade-state`` (NVIDIA/k8s-operator-libs
  ``pkg/upgrade/consts.go``: ``UpgradeStateLabelKeyFmt`` with the driver name ``gpu``
  that gpu-operator ``cmd/gpu-operator/main.go`` sets), then cordons, drains, restarts
  the driver, validates and uncordons it. A round that passes while the label holds
  any state but ``upgrade-done`` (gpu-operator ``controllers/clusterpolicy_controller.go``,
  ``isIncompleteDriverUpgradeState``: neither done nor unknown) does not admit a node
  that carries the admission taint: the driver it read may be about to go. It never
  cordons, uncordons or drains, and touches no taint but its own.
- **A transient failure of an admitted node.** A round whose every failed check says
  nothing about the node itself — an image source unavailable (a registry down,
  credentials expired: exit 3), or GPUs busy with other work (``--load-test``) — keeps
  a node that an earlier round admitted (``buildmatrix.io/smoke=passed``, no admission
  taint; with ``--nfd-file``, the earlier feature file's ``buildmatrix.io/smoke=passed``)
  admitted, with the report saying why. A source may be unavailable
  for ``--source-grace`` seconds from the first such round (the annotation
  :data:`UNAVAILABLE_SINCE` keeps when that was); past it the node fails as any other.
  A node that never passed stays tainted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from buildmatrix.labelkeys import SMOKE, UNAVAILABLE_ANNOTATION

UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_DONE = "upgrade-done"
UNAVAILABLE_SINCE = UNAVAILABLE_ANNOTATION  # when the source first failed (UTC)
SOURCE_GRACE = 86400  # seconds: smoke --source-grace, k8s manifests --source-grace


@dataclass(frozen=True, kw_only=True)
class Transient:
    """Every failed check of a round is transient: ``why`` says which; ``grace`` is how
    long (s) an admitted node may stay so (None: as long as it lasts, for busy GPUs:
    a healthy node running work)."""

    why: str
    grace: float | None


@dataclass(frozen=True, kw_only=True)
class Kept:
    """An admitted node kept admitted: the report, and the outage's start to record."""

    report: str
    since: str | None  # UNAVAILABLE_SINCE's value (None: nothing to record)


def upgrade_hold(labels: Mapping[str, str]) -> str | None:
    """Why a passing round does not admit this node (None: it may)."""
    state = labels.get(UPGRADE_STATE, "")
    if state in ("", UPGRADE_DONE):
        return None
    return (
        f"admission held: the GPU Operator is upgrading the driver ({UPGRADE_STATE}="
        f"{state}); the node is admitted at the first round after {UPGRADE_DONE}, with "
        "the new driver checked against the pool's floors"
    )


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        found = datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None  # not ours as written: the outage starts now
    return found.replace(tzinfo=UTC)


def admitted(labels: Mapping[str, str], *, tainted: bool) -> bool:
    """An earlier round admitted the node and nothing has failed it since."""
    return labels.get(SMOKE) == "passed" and not tainted


def keep_admitted(
    annotations: Mapping[str, str], transient: Transient, now: datetime
) -> Kept | str:
    """An admitted node's transient failure: :class:`Kept`, or (past the grace) the
    line that the failure report starts with."""
    if transient.grace is None:
        return Kept(report=f"kept admitted: {transient.why}", since=None)
    since = _parse(annotations.get(UNAVAILABLE_SINCE)) or now
    until = since + timedelta(seconds=transient.grace)
    if now > until:
        return (
            f"a source has been unavailable since {_stamp(since)}, longer than "
            f"--source-grace {transient.grace:g} s: {transient.why}"
        )
    return Kept(
        report=(
            f"kept admitted until {_stamp(until)} (--source-grace {transient.grace:g} s from "
            f"{_stamp(since)}, the first round that could not read it): {transient.why}"
        ),
        since=_stamp(since),
    )
