"""Benchmark: what a fresh ``buildmatrix`` process costs, per command, one checkout
against another.

    .venv/bin/python benchmarks/startup.py --before /path/to/old/checkout [--runs 5]

Runs each command below as ``python -m buildmatrix ARGS`` in a fresh process, with
the checkout on ``PYTHONPATH`` and its bytecode kept under ``--pycache`` (as
scripts/test keeps it: ``PYTHONPYCACHEPREFIX``), one warm-up run each, then
``--runs`` runs interleaved between the two checkouts, so that both see the same
load. Prints a Markdown table of the median wall time and the median CPU time (user
+ system of the child; the steadier figure on a shared machine), with ratios.
Nothing here asserts on time (docs/development.md, "Start-up time").

``smoke --apply`` runs against the tests' stand-in API server (tests/kube_standin.py),
served by this process; the warm-up run admits the node, the measured runs find it
admitted (one GET each).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMANDS = (
    "--version",
    "--help",
    "profiles",
    "profiles --json",
    "smoke --snapshot tests/fixtures/nodes/a40.json --json",
    "labels --snapshot tests/fixtures/nodes/a40.json",
    "check tests/fixtures/bin/libsass_sm80.so --sm sm_90",
    "k8s manifests",
    "smoke --snapshot tests/fixtures/nodes/h100-535.json --json --apply --node gpu-1"
    " --kubeconfig {kubeconfig}",
)


def run_once(tree: Path, args: str, pycache: Path) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and exit code of one fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.pop("BUILDMATRIX_PROFILES", None)
    env["PYTHONPATH"] = str(tree)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "buildmatrix", *args.split()],
        cwd=tree,
        env=env,
        capture_output=True,
        check=False,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the checkout to compare")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--pycache", type=Path, default=REPO / ".venv" / "pycache")
    opts = parser.parse_args()
    trees = {"before": opts.before.resolve(), "after": REPO}
    sys.path.insert(0, str(REPO))
    from tests.test_kube_apply import standin_with_nodes

    standin = standin_with_nodes()
    server, url = standin.serve()
    scratch = Path(tempfile.mkdtemp(prefix="buildmatrix-startup-"))
    kubeconfig = standin.kubeconfig(scratch / "kubeconfig", url, "smoke")
    print(f"load average at the start: {os.getloadavg()}", file=sys.stderr)
    print("| command | before: wall, CPU | after: wall, CPU | CPU after/before |")
    print("| --- | --- | --- | --- |")
    for command in COMMANDS:
        args = command.format(kubeconfig=kubeconfig)
        for tree in trees.values():
            run_once(tree, args, opts.pycache)  # bytecode written, files in the page cache
        seen: dict[str, list[tuple[float, float, int]]] = {name: [] for name in trees}
        for _ in range(opts.runs):
            for name, tree in trees.items():
                seen[name].append(run_once(tree, args, opts.pycache))
        cells = []
        for name in trees:
            wall = statistics.median(r[0] for r in seen[name])
            cpu = statistics.median(r[1] for r in seen[name])
            codes = sorted({r[2] for r in seen[name]})
            cells.append((wall, cpu, codes))
        ratio = cells[1][1] / cells[0][1] if cells[0][1] else float("nan")
        row = " | ".join(f"{w:.3f} s, {c:.3f} s (exit {codes})" for w, c, codes in cells)
        print(f"| `{command}` | {row} | {ratio:.2f} |", flush=True)
    print(f"load average at the end: {os.getloadavg()}", file=sys.stderr)
    server.shutdown()
    server.server_close()
    shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
