"""Layers read by worker processes (buildmatrix.image.layer_scan._apart,
buildmatrix.image.workers.run_all) where the thread route reads them alike: what a
worker cannot send back is read in this process, with the thread route's result."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.test_in_place import _in_a_fresh_process

DEEP = """
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


def run():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(ARGS)
        except BaseException as exc:  # what the CLI lets through
            return "raised", type(exc).__name__, str(exc)
    return code, out.getvalue(), err.getvalue()


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


@pytest.mark.parametrize("depth", [sys.getrecursionlimit() // 4, 1500])
def test_a_deep_folder_reads_by_workers_as_by_threads(tmp_path: Path, depth: int) -> None:
    """A layer's tree goes back from a worker pickled, and pickle recurses once per
    folder level (CPython Modules/_pickle.c, save): a folder a few hundred levels
    down made the worker route raise RecursionError where threads passed."""
    out = _in_a_fresh_process(DEEP, str(tmp_path / "layout"), str(depth))
    threads, apart = json.loads(out)
    assert threads[0] == 0, threads
    assert apart == threads
