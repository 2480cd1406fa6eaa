"""Benchmark: ``buildmatrix check`` against ``cuobjdump --list-elf --list-ptx`` on real
CUDA libraries, one checkout against another, with the time of each reading phase.

    .venv/bin/python benchmarks/check_vs_cuobjdump.py FILE... [--before OLD_CHECKOUT]
        [--runs 3] [--phases]

For each FILE, after one ``cat FILE > /dev/null`` that warms the page cache, runs
``--runs`` rounds of, interleaved so that each sees the same load:

- ``buildmatrix check FILE --sm 8.0 --sm 9.0 --sm 10.0 --sm 12.0 --json`` from this
  checkout (and from ``--before``'s, where given), a fresh process each;
- ``cuobjdump --list-elf --list-ptx FILE`` (tests/cuobjdump.py finds it);
- ``cat FILE > /dev/null``: the time merely to read the bytes (the I/O floor);

and prints a Markdown table of the smallest CPU time (user + system of the child,
``os.wait4``: the steady figure on a shared machine) and the smallest wall time of
each, with ratios. Both checkouts must print the same JSON; a difference is shown.

``--phases`` also reads each FILE in this process, once per phase wrapped in a CPU
clock (time.process_time), and prints where the time of ``inspect_source`` goes:
the runtime's wrappers (buildmatrix.binary.registered), the sections' fatbinaries,
the search of the data for embedded code, the compressed PTX heads, the compressed
cubins (decompressing, reading their sections) and the rest. The phases nest
(a compressed PTX head is read inside a fatbinary's parse), so each is inclusive.

This is a benchmark, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.cuobjdump import find_cuobjdump  # noqa: E402

PHASES = (
    "inspect_source, all",
    "wrappers (registered.py, relocations)",
    "section fatbinaries (fatbin.py)",
    "data search (embedded.py)",
    "compressed PTX heads (in either above)",
    "compressed cubins (kernels.py)",
    "of which decompressing",
    "of which cubin sections and notes",
)
SMS = ("--sm", "8.0", "--sm", "9.0", "--sm", "10.0", "--sm", "12.0")


@dataclass
class Run:
    cpu: float
    wall: float
    stdout: bytes


def measure(cmd: list[str], *, env: dict[str, str] | None = None, keep: bool = False) -> Run:
    """CPU (user + system) and wall seconds of the child ``cmd`` alone (os.wait4)."""
    out = subprocess.PIPE if keep else subprocess.DEVNULL
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env)
    data = proc.stdout.read() if proc.stdout else b""
    _, _status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    return Run(usage.ru_utime + usage.ru_stime, wall, data)


def checkout_env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(tree)
    env["PYTHONPYCACHEPREFIX"] = str(Path("/tmp/buildmatrix-bench-pycache") / tree.name)
    return env


def best(runs: list[Run]) -> tuple[float, float]:
    return min(r.cpu for r in runs), min(r.wall for r in runs)


def phases(path: Path) -> dict[str, float]:
    """CPU seconds of each reading phase of ``path`` (inclusive; see the docstring)."""
    from buildmatrix.binary import fatbin, kernels, scan
    from buildmatrix.binary.source import FileSource

    spent: dict[str, float] = defaultdict(float)

    def clocked(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.process_time() - start

        return run

    patches = [
        (scan, "_registered", PHASES[1]),
        (scan, "parse_fatbin", PHASES[2]),
        (scan, "embedded_code", PHASES[3]),
        (fatbin, "_compressed_ptx", PHASES[4]),
        (scan, "read_compressed", PHASES[5]),
        (kernels, "decompressed_cubin", PHASES[6]),
        (kernels, "cubin_facts", PHASES[7]),
    ]
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in patches]
    for module, attr, label in patches:
        setattr(module, attr, clocked(label, getattr(module, attr)))
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            start = time.process_time()
            scan.inspect_source(FileSource(fd, name=str(path)), path=str(path))
            spent[PHASES[0]] = time.process_time() - start
        finally:
            os.close(fd)
    finally:
        for module, attr, fn in saved:
            setattr(module, attr, fn)
    return dict(spent)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--before", type=Path, help="an older checkout to compare with")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--phases", action="store_true")
    args = parser.parse_args()
    tool = find_cuobjdump()
    if tool is None:
        print("cuobjdump not found: pip install nvidia-cuda-cuobjdump", file=sys.stderr)
        return 3
    trees = {"after": REPO} | ({"before": args.before.resolve()} if args.before else {})
    print(
        "| library | MiB | check CPU s | check wall s | "
        + ("before CPU s | before wall s | " if args.before else "")
        + "cuobjdump CPU s | cuobjdump wall s | cat CPU s | cat wall s | "
        "check/cuobjdump CPU | check/cuobjdump wall | same JSON |"
    )
    print("|---|---:|" + "---:|" * (10 if args.before else 8) + "---|")
    for path in args.files:
        measure(["cat", str(path)])
        runs: dict[str, list[Run]] = defaultdict(list)
        for _ in range(args.runs):
            for name, tree in trees.items():
                cmd = [sys.executable, "-m", "buildmatrix", "check", str(path), *SMS, "--json"]
                runs[name].append(measure(cmd, env=checkout_env(tree), keep=True))
            runs["cuobjdump"].append(measure([str(tool), "--list-elf", "--list-ptx", str(path)]))
            runs["cat"].append(measure(["cat", str(path)]))
        docs = {json.loads(r[-1].stdout or b"null").__repr__() for r in (runs[n] for n in trees)}
        cells = [f"{path.name}", f"{path.stat().st_size / 2**20:.0f}"]
        for name in (*trees, "cuobjdump", "cat"):
            cpu, wall = best(runs[name])
            cells += [f"{cpu:.2f}", f"{wall:.2f}"]
        ours, ref = best(runs["after"]), best(runs["cuobjdump"])
        cells += [f"{ours[0] / ref[0]:.2f}", f"{ours[1] / ref[1]:.2f}"]
        cells.append("yes" if len(docs) == 1 else "NO")
        print("| " + " | ".join(cells) + " |", flush=True)
    if args.phases:
        print("\nCPU seconds per phase (inclusive; this checkout, in one process):\n")
        for path in args.files:
            spent = phases(path)
            shown = "; ".join(f"{label.strip()} {spent.get(label, 0.0):.2f}" for label in PHASES)
            print(f"- {path.name}: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
