"""The device code of many files of a layer at once, in worker processes when there
is enough of it to read.

Reading device code is CPU work in Python (searching a library's data for code kept
as data, listing tens of thousands of fatbinary entries), so the files of a layer
that lie in regular files — an engine's layer folder, a ``docker save`` archive read
in place — are inspected by a pool of processes, one per CPU, biggest file first.
Small layers are read in this process: starting workers costs more than it saves.
Each worker runs the same function the serial path runs, so the results are the
same by construction (tests/test_in_place.py and test_engine_storage.py compare).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

# Below this many bytes of candidate files, one process is faster than starting workers.
PARALLEL_BYTES = 256 << 20
MAX_WORKERS = 8

Job = TypeVar("Job")
Out = TypeVar("Out")


def workers() -> int:
    """How many processes may read at once: the CPUs this process may run on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


def run_all(inspect: Callable[[Job], Out], jobs: Sequence[Job], sizes: Sequence[int]) -> list[Out]:
    """``inspect(job)`` of every job, in job order. ``inspect`` must be a module-level
    function (it runs in worker processes) and ``sizes`` says how many bytes each job
    reads. Exceptions raised by a job are raised here, as in a loop."""
    count = min(workers(), len(jobs))
    if count < 2 or sum(sizes) < PARALLEL_BYTES:
        return [inspect(job) for job in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # forkserver: workers start from a clean process, never from a copy of this one
    # (which may run threads: layers are summarised two at a time).
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["buildmatrix.image.layers"])
    order = sorted(range(len(jobs)), key=lambda i: -sizes[i])  # the biggest first
    try:
        with ProcessPoolExecutor(count, mp_context=context) as pool:
            futures = {i: pool.submit(inspect, jobs[i]) for i in order}
            return [futures[i].result() for i in range(len(jobs))]
    except (BrokenProcessPool, OSError):
        # Workers that cannot start (no writable temporary folder for the server's
        # socket, a process limit) or that died: the same work, in this process (a
        # job's own error is raised again there, as without workers).
        return [inspect(job) for job in jobs]
