"""Where ``smoke`` writes a verdict, and the deadline that writes a failed one.

A verdict goes to the NFD feature file (``--nfd-file``) and onto the Node through
the API (``--apply``), wherever it comes from: a round that concluded, a node whose
GPUs could not be read, ``--mark-failed``, or a round that did not end in time
(:class:`Deadline`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from buildmatrix.errors import EnvironmentUnavailable
from buildmatrix.labelkeys import REPORT_ANNOTATION, SMOKE, TAINT_KEY, GfdKeys
from buildmatrix.node.apply import Applied, NodeApi, apply
from buildmatrix.node.hold import UNAVAILABLE_SINCE, Kept, Transient, admitted, keep_admitted
from buildmatrix.node.nfd import NFD_TTL, feature_file, read_feature_file, write_atomically

FAILED = {SMOKE: "failed"}  # the failure mark's labels


def write_nfd(
    path: Path, labels: Mapping[str, str], notes: Mapping[str, str] | None = None
) -> None:
    text = feature_file(labels, now=datetime.now(UTC), ttl=NFD_TTL, notes=notes)
    write_atomically(path, text)


def write_nfd_verdict(
    path: Path, *, passed: bool, labels: Mapping[str, str], transient: Transient | None
) -> str | None:
    """The feature file of a round; where every failure is transient and the file
    says an earlier round admitted the node, that file's labels again (a fresh
    expiry), with why and since when as notes (node/hold.py). Returns why it was kept
    (None: the round's verdict was written)."""
    if not passed and transient is not None:
        previous, notes = read_feature_file(path)
        if admitted(previous, tainted=False):
            kept = keep_admitted(notes, transient, datetime.now(UTC))
            if isinstance(kept, Kept):
                keep = {REPORT_ANNOTATION: kept.report}
                if kept.since is not None:
                    keep[UNAVAILABLE_SINCE] = kept.since
                write_nfd(path, previous, keep)
                return kept.report
    write_nfd(path, labels)
    return None


@dataclass(frozen=True, kw_only=True)
class Place:
    """Where the verdict goes: ``nfd_file``, and the Node ``node`` through ``api``
    (``--apply``; None without)."""

    api: NodeApi | None
    node: str | None
    nfd_file: Path | None
    gfd_keys: GfdKeys
    taint_key: str = TAINT_KEY  # --taint-key

    def write(
        self,
        *,
        passed: bool,
        labels: Mapping[str, str],
        failures: Sequence[str],
        transient: Transient | None = None,
    ) -> Applied | None:
        """Write the verdict; what changed on the Node, None where it is not written
        there."""
        applied, _ = self.write_verdict(
            passed=passed, labels=labels, failures=failures, transient=transient
        )
        return applied

    def write_verdict(
        self,
        *,
        passed: bool,
        labels: Mapping[str, str],
        failures: Sequence[str],
        transient: Transient | None = None,
    ) -> tuple[Applied | None, str | None]:
        """Write the verdict: what changed on the Node (None where it is not written
        there), and why the NFD file kept an earlier admission (None: it did not).
        ``transient``: every failure is one (node/hold.py), which keeps an admitted
        node admitted, on the Node and in the NFD file alike."""
        held = None
        if self.nfd_file is not None:
            held = write_nfd_verdict(
                self.nfd_file, passed=passed, labels=labels, transient=transient
            )
        if self.api is None or self.node is None:
            return None, held
        return apply(
            self.api,
            self.node,
            passed=passed,
            labels=labels,
            failures=failures,
            gfd_keys=self.gfd_keys,
            taint_key=self.taint_key,
            transient=transient,
        ), held

    def write_failed(self, failure: str) -> Applied | None:
        """The failure mark: ``buildmatrix.io/smoke=failed``, the taint, ``failure``
        as the report."""
        return self.write(passed=False, labels=FAILED, failures=[failure])


DEADLINE_THREAD = "buildmatrix-deadline"
# Called by the deadline's thread with the message and the exit code; never returns
# (the CLI prints the message and ends the process).
Overdue = Callable[[str, int], None]


class Deadline:
    """``--deadline``: a round that has not concluded when it passes is concluded as
    failed by this timer's thread (the failure mark written where the verdict would
    go: the Node, the NFD file), which then hands over to ``overdue`` to end the
    process. A GPU whose NVML calls hang, or a load test that never returns, must not
    leave a node admitted by an earlier round admitted: the interval's re-check is
    what catches a GPU that degrades after admission. NVML and the CUDA driver (the
    load test) are called through ctypes, which releases the GIL while in them, and
    registries are read with time-outs: the thread runs while the main thread waits."""

    def __init__(self, seconds: float, place: Place, overdue: Overdue) -> None:
        self._seconds = seconds
        self._place = place
        self._overdue = overdue
        self._lock = threading.Lock()
        self._claimed = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.name = DEADLINE_THREAD
        self._timer.daemon = True
        self._timer.start()

    def claim(self) -> None:
        """The main thread concludes the round: the timer no longer may. Blocks only
        where the timer is concluding, and it ends the process. Once is enough."""
        if not self._claimed:
            self._lock.acquire()
            self._claimed = True
            self._timer.cancel()

    def _expire(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # the main thread is writing its own verdict
        why = (
            f"deadline: the round did not finish within {self._seconds:g} s (--deadline): "
            "an NVML call, an image read or the load test hung"
        )
        code = 1
        try:
            if self._place.write_failed(why) is not None:
                why += f"; node {self._place.node} marked failed and tainted"
        except Exception as exc:  # whatever failed, the process must end
            why += f"; writing the failure mark failed: {exc}"
            code = EnvironmentUnavailable.exit_code
        try:
            self._overdue(why, code)
        finally:
            # overdue ends the process; should it return or raise, the lock this
            # thread holds would stop the main thread for good: end it here.
            os._exit(code)
