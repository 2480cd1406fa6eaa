"""Review (branch review6): a layer worker whose result cannot be pickled for a
reason other than PicklingError or RecursionError (CPython 3.11-3.13: a local object
is AttributeError, a lock or a memoryview TypeError) escaped run_all as a traceback,
where the thread route reads the same layers and passes; it is read again here."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_in_place import _in_a_fresh_process

UNPICKLABLE = """
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


def run():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(ARGS)
        except BaseException as exc:  # what the CLI lets through
            return "raised", type(exc).__name__, str(exc)
    return code, out.getvalue(), err.getvalue()


threads = run()
workers.PARALLEL_BYTES = 0
apart = run()
print(json.dumps([threads, apart]))
"""


def test_a_result_a_worker_cannot_pickle_reads_as_by_threads(tmp_path: Path) -> None:
    out = _in_a_fresh_process(UNPICKLABLE, str(tmp_path / "layout"))
    threads, apart = json.loads(out)
    assert threads[0] == 0, threads
    assert apart == threads
