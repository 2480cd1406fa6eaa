"""Layers read by worker processes (buildmatrix.image.layer_scan._apart,
buildmatrix.image.workers.run_all) where the thread route reads them alike: what a
worker cannot send back is read in this process, with the thread route's result."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.images import Image, write_oci_layout
from tests.test_in_place import _in_a_fresh_process

# check in this process, as the command line runs it: its exit code and output, or
# what it let through
RUN = """
def run():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(ARGS)
        except BaseException as exc:  # what the CLI lets through
            return "raised", type(exc).__name__, str(exc)
    return code, out.getvalue(), err.getvalue()
"""

DEEP = (
    """
import io, json, sys, contextlib
from pathlib import Path
from buildmatrix.cli import main
from buildmatrix.image import layer_scan, workers
from tests.images import Image, write_oci_layout

layout, depth = Path(sys.argv[1]), int(sys.argv[2])
# one file that many folders down: valid for tar and for Linux (PATH_MAX 4096)
image = Image(layers=[{"d/" * depth + "f": b"x"}, {"etc/hostname": b"h"}])
write_oci_layout(layout, image, tag="t")
ARGS = ["check", f"oci:{layout}:t", "--sm", "sm_90", "--allow-empty", "--json", "--no-cache"]


"""
    + RUN
    + """

calls = []
real = layer_scan.run_all
def spy(*args, **kwargs):
    calls.append(1)
    return real(*args, **kwargs)
layer_scan.run_all = spy

threads = run()
workers.PARALLEL_BYTES = 0
apart = run()
assert calls, "not read by workers"
print(json.dumps([threads, apart]))
"""
)


@pytest.mark.parametrize("depth", [sys.getrecursionlimit() // 4, 1500])
def test_a_deep_folder_reads_by_workers_as_by_threads(tmp_path: Path, depth: int) -> None:
    """A layer's tree goes back from a worker pickled, and pickle recurses once per
    folder level (CPython Modules/_pickle.c, save): a folder a few hundred levels
    down made the worker route raise RecursionError where threads passed."""
    out = _in_a_fresh_process(DEEP, str(tmp_path / "layout"), str(depth))
    threads, apart = json.loads(out)
    assert threads[0] == 0, threads
    assert apart == threads


SECOND_FORK_FAILS = """
import io, os, sys, contextlib
from pathlib import Path
from buildmatrix.cli import main
from buildmatrix.image import workers
from tests.images import Image, write_oci_layout

layout = Path(sys.argv[1])
image = Image(layers=[{"a/f": b"x"}, {"b/f": b"y"}, {"c/f": b"z"}])
write_oci_layout(layout, image, tag="t")
workers.PARALLEL_BYTES = 0
real_fork, forks = os.fork, []
def fork():  # a stand-in for a pids limit reached after the first worker (EAGAIN)
    forks.append(1)
    if len(forks) == 2:
        raise BlockingIOError(11, "Resource temporarily unavailable")
    return real_fork()
os.fork = fork
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["check", f"oci:{layout}:t", "--sm", "sm_90", "--allow-empty", "--no-cache"])
print(code, len(forks), flush=True)
"""


def test_a_pool_that_forks_one_worker_of_two_does_not_hang_the_exit(tmp_path: Path) -> None:
    """The second fork fails (OSError at submit, before the pool's manager thread
    starts): run_all reads the layers here, and ends the first worker, which would
    wait on the call queue for good while multiprocessing joins it at exit (CPython
    Lib/multiprocessing/util.py, _exit_function)."""
    # the check itself takes about a second
    out = _in_a_fresh_process(SECOND_FORK_FAILS, str(tmp_path / "layout"), timeout=30)
    assert out.split() == ["0", "2"], out


@pytest.mark.parametrize("depth", [sys.getrecursionlimit() // 2, 1500])
def test_a_deep_folder_is_checked_with_the_layer_cache_as_without(
    cli: CliRunner, tmp_path: Path, depth: int
) -> None:
    """A layer nested deeper than Python's recursion limit: checked with the layer
    cache, written and then read back, as with --no-cache (a codec that recursed
    once per folder level raised RecursionError, a traceback)."""
    layout = tmp_path / "layout"
    image = Image(layers=[{"d/" * depth + "f": b"x"}, {"etc/hostname": b"h"}])
    write_oci_layout(layout, image, tag="t")
    args = ["check", f"oci:{layout}:t", "--sm", "sm_90", "--allow-empty", "--json"]
    without = cli(*args, "--no-cache")
    assert without.code == 0, without.err
    for _ in range(2):  # written, then read back
        result = cli(*args)
        assert (result.code, result.out) == (without.code, without.out), result.err


def test_an_entry_of_any_depth_is_read_back_whatever_the_stack() -> None:
    """The codec writes and reads an entry line by line, never recursing per folder:
    an entry written where the stack had room reads back where it has far less."""
    from buildmatrix.image import cache_codec
    from buildmatrix.image.tree import Inode, LayerSummary, merge

    summary = LayerSummary(name="x")
    summary.add("d/" * 2000 + "f", Inode("file"))
    data = cache_codec.encode("sha256:x", summary)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(150)
    try:
        back = cache_codec.decode(data, "sha256:x")
    finally:
        sys.setrecursionlimit(limit)
    assert back is not None
    assert [p for p, _ in merge([back]).files()] == ["d/" * 2000 + "f"]


KILLED_WORKER = """
import os, signal
from buildmatrix.image import workers
from tests.test_layer_workers_edges import _dies_in_a_worker

workers.PARALLEL_BYTES = 0
workers.workers = lambda: 2
parent = os.getpid()
jobs = [(parent, i) for i in range(6)]
sizes = [10 * (i + 1) for i in range(6)]
counted = []
out = workers.run_all(_dies_in_a_worker, jobs, sizes, finished=counted.append)
assert out == list(range(6)), out
print(sum(counted), sum(sizes))
"""


def _dies_in_a_worker(job: tuple[int, int]) -> int:
    """Job ``i``; the last one kills the worker process it runs in (as the OOM killer
    would), never the process that made the jobs."""
    import os
    import signal
    import time

    parent, i = job
    if i == 5 and os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05 * (5 - i))  # the others end first, and are counted
    return i


def test_progress_after_a_worker_died_counts_each_job_once() -> None:
    """A worker killed midway: the jobs are read again in this process, as the
    threads would read them, and the progress count ends at the total, not above."""
    counted, total = _in_a_fresh_process(KILLED_WORKER).split()
    assert counted == total, (counted, total)


UNPICKLABLE = (
    """
import io, json, os, sys, threading, contextlib
from pathlib import Path
from buildmatrix.cli import main
from buildmatrix.image import layer_scan, workers
from tests.images import Image, write_oci_layout

layout = Path(sys.argv[1])
image = Image(layers=[{"a/f": b"x"}, {"b/f": b"y"}, {"c/f": b"z"}])
write_oci_layout(layout, image, tag="t")
ARGS = ["check", f"oci:{layout}:t", "--sm", "sm_90", "--allow-empty", "--json", "--no-cache"]
PARENT = os.getpid()
real = layer_scan.scan_blob


def scan_blob(blob, progress, keep=None):
    summary = real(blob, progress, keep)
    if os.getpid() != PARENT:  # only what a worker sends back cannot be pickled
        summary.held = threading.Lock()  # TypeError: cannot pickle '_thread.lock' object
    return summary


layer_scan.scan_blob = scan_blob


"""
    + RUN
    + """

threads = run()
workers.PARALLEL_BYTES = 0
apart = run()
print(json.dumps([threads, apart]))
"""
)


def test_a_result_a_worker_cannot_pickle_reads_as_by_threads(tmp_path: Path) -> None:
    """A result pickle refuses with TypeError (here a lock; a local object gives
    AttributeError), as CPython before 3.14 does, is read again in this process: it
    escaped run_all as a traceback where threads pass."""
    out = _in_a_fresh_process(UNPICKLABLE, str(tmp_path / "layout"))
    threads, apart = json.loads(out)
    assert threads[0] == 0, threads
    assert apart == threads
