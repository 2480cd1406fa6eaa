"""The device code of many files of a layer at once, in worker processes when there
is enough of it to read.

Reading device code is CPU work in Python (searching a library's data for code kept
as data, listing tens of thousands of fatbinary entries), so the files of a layer
that lie in regular files — an engine's layer folder, a ``docker save`` archive read
in place — are inspected by a pool of processes, one per CPU, biggest file first.
Small layers are read in this process: starting workers costs more than it saves.
Each worker runs the same function the serial path runs, so the results are the
same by construction (tests/test_in_place.py and test_engine_storage.py compare).
Workers are forked, and only from a process that runs no other thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

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


def run_all(
    inspect: Callable[[Job], Out],
    jobs: Sequence[Job],
    sizes: Sequence[int],
    *,
    meanwhile: Callable[[], None] | None = None,
    finished: Callable[[int], None] | None = None,
    most: int = MAX_WORKERS,
) -> list[Out]:
    """``inspect(job)`` of every job, in job order. ``inspect`` must be a module-level
    function (it runs in worker processes) and ``sizes`` says how many bytes each job
    reads. Exceptions raised by a job are raised here, as in a loop.

    ``meanwhile`` is called once in this process as the jobs start: after the
    workers are forked (so a thread it starts is never in a fork), or before the
    jobs run here; it may start work beside them (a layer's digest). ``finished``
    is called here with a job's size as each job ends (a progress count). ``most``:
    at most this many workers (each holds a job's memory)."""
    started = False

    def start() -> None:
        nonlocal started
        if meanwhile is not None and not started:
            started = True
            meanwhile()

    if not parallel(sizes, most=most):
        start()
        return _here(inspect, jobs, sizes, finished)
    count = min(workers(), len(jobs), most)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool
    from pickle import PicklingError

    # fork: the workers are copies of this single-threaded process (the pool forks
    # them all before it starts its own thread); unlike spawn or forkserver, nothing
    # re-imports the program's main module in them.
    context = multiprocessing.get_context("fork")
    order = sorted(range(len(jobs)), key=lambda i: -sizes[i])  # the biggest first
    counted: set[int] = set()  # jobs whose end was reported to ``finished``
    try:
        with ProcessPoolExecutor(count, mp_context=context) as pool:
            try:
                futures = {i: pool.submit(inspect, jobs[i]) for i in order}
            except BaseException:
                _end_forked(pool)
                raise
            # The pool forked all its workers at the first submit, before it started
            # a thread (CPython Lib/concurrent/futures/process.py,
            # ProcessPoolExecutor._start_executor_manager_thread, for "fork").
            start()
            if finished is not None:
                index = {future: i for i, future in futures.items()}
                for future in as_completed(futures.values()):
                    finished(sizes[index[future]])
                    counted.add(index[future])
            return [futures[i].result() for i in range(len(jobs))]
    except (
        BrokenProcessPool,
        OSError,
        NotImplementedError,
        ImportError,
        PicklingError,
        RecursionError,
        TypeError,
        AttributeError,
    ):
        # Workers that cannot start (a process limit, no working sem_open: no
        # /dev/shm), that died, or whose result could not be sent back (pickle
        # recurses once per nesting level: a layer's folder some hundreds of levels
        # down; an object pickle refuses, TypeError or AttributeError before CPython
        # 3.14; CPython Lib/concurrent/futures/process.py, _sendback_result, sends the
        # pickling error instead): the same work, in this process (a job's own error
        # is raised again there, as without workers). Jobs whose end was counted
        # already are not counted again.
        start()
        return _here(inspect, jobs, sizes, finished, counted)


def parallel(sizes: Sequence[int], *, most: int = MAX_WORKERS) -> bool:
    """Whether :func:`run_all` reads jobs of these sizes in worker processes: two
    CPUs or more, enough to read, and no other thread running here (layers read two
    at a time), which a forked worker would not have (their locks could stay held)."""
    return (
        min(workers(), len(sizes), most) >= 2
        and sum(sizes) >= PARALLEL_BYTES
        and threading.active_count() == 1
    )


def _end_forked(pool: Any) -> None:
    """End the workers a pool forked before it failed to fork the rest (an ``OSError``
    at ``submit``: a process limit): the pool's manager thread, which would end them,
    is not started yet, so each would wait on its call queue for good, and
    multiprocessing joins them at exit (CPython Lib/multiprocessing/util.py,
    ``_exit_function``): the process would never end."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()
        process.join()


def _here(
    inspect: Callable[[Job], Out],
    jobs: Sequence[Job],
    sizes: Sequence[int],
    finished: Callable[[int], None] | None,
    counted: set[int] | frozenset[int] = frozenset(),
) -> list[Out]:
    """The jobs in this process, one after another (``counted``: jobs whose end was
    reported to ``finished`` already)."""
    out = []
    for i, (job, size) in enumerate(zip(jobs, sizes, strict=True)):
        out.append(inspect(job))
        if finished is not None and i not in counted:
            finished(size)
    return out
