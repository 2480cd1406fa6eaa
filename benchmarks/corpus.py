"""Benchmark and report: ``buildmatrix check`` on the real-package corpus.

    .venv/bin/python benchmarks/corpus.py [--only NAME]... [--json FILE] [--no-cuobjdump]

Lays out the 19 packages of ``tests/corpus.py`` as installed trees (the wheels are
downloaded once, about 5 GB, and kept under ~/.cache/buildmatrix/wheels), then:

1. prints the corpus table: package x GPU of the shipped profiles, each cell
   ``pass``, ``pass, N skipped`` or ``FAIL <file>: <why>``, from one
   ``check DIR --sm ... --driver 580.65.06 --json`` per package, and the cells that
   differ from what the package documents (tests/corpus_expected.py);
2. per package, in one run with the page cache warm for all three: the wall time of
   that ``check`` (a fresh process, start-up included, every GPU at once), of
   ``cuobjdump --list-elf --list-ptx`` on each file ``check`` found device code in
   or refused (one process per file, what a user would otherwise run), and of
   reading those files' bytes (the I/O floor), with the ratios.

This is a benchmark, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import corpus  # noqa: E402
from tests.corpus_expected import DOCUMENTED  # noqa: E402
from tests.cuobjdump import find_cuobjdump  # noqa: E402


def _files(doc: dict, root: Path) -> list[Path]:  # type: ignore[type-arg]
    """The files ``check`` found device code in (static archives left out: cuobjdump
    lists their members another way) and the ones it refused to read."""
    paths = {f["path"] for f in doc["files"] if not f["path"].endswith(".a")}
    paths |= {
        r.removeprefix("unreadable: ").split(" (")[0]
        for t in doc["targets"]
        for r in t["reasons"]
        if r.startswith("unreadable: ")
    }
    return sorted(root / p for p in paths)


def _read(files: list[Path]) -> float:
    start = time.perf_counter()
    for path in files:
        with path.open("rb", buffering=0) as fh:
            while fh.read(1 << 20):
                pass
    return time.perf_counter() - start


def _cuobjdump(tool: Path, files: list[Path]) -> float:
    start = time.perf_counter()
    for path in files:
        subprocess.run(
            [str(tool), "--list-elf", "--list-ptx", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="package name")
    parser.add_argument("--json", type=Path, help="write the cells and times here")
    parser.add_argument("--no-cuobjdump", action="store_true", help="table only")
    args = parser.parse_args(argv)
    gpus = corpus.gpus()
    packages = [p for p in corpus.PACKAGES if not args.only or p.name in args.only]
    tool = None if args.no_cuobjdump else find_cuobjdump()
    rows: dict[str, dict[str, str]] = {}
    differ: list[str] = []
    times: dict[str, dict[str, float]] = {}
    for package in packages:
        root = corpus.image(package)
        corpus.check(root, gpus[:1])  # warms the page cache for the timed runs
        start = time.perf_counter()
        doc = corpus.check(root, gpus)
        took = time.perf_counter() - start
        cells = corpus.cells(doc)
        rows[package.name] = {cc: cells[cc].text for cc in gpus}
        for cc in gpus:
            status, why = DOCUMENTED[package.name].expected(cc)
            if status != cells[cc].status:
                differ.append(
                    f"{package.name} on {cc}: documented {status}" + (f" ({why})" if why else "")
                )
        files = _files(doc, root)
        size = sum(p.stat().st_size for p in files)
        floor = _read(files)
        times[package.name] = {"check": took, "read": floor, "mib": size / (1 << 20)}
        if tool is not None:
            times[package.name]["cuobjdump"] = _cuobjdump(tool, files)
            times[package.name]["files"] = len(files)
        print(f"{package.name}: check {took:.1f} s", file=sys.stderr, flush=True)
    print(f"## check --driver {corpus.DRIVER}, every GPU of the profiles\n")
    print(corpus.render(rows, gpus))
    print(f"\n{len(differ)} of {len(rows) * len(gpus)} cells differ from the documented:")
    for line in differ:
        print(f"- {line}")
    print("\n## Time (s), page cache warm\n")
    print("| package | MiB | files | check | cuobjdump | check / cuobjdump | read | check / read |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, t in times.items():
        cuob = t.get("cuobjdump")
        ratio = f"{t['check'] / cuob:.2f}" if cuob else "-"
        print(
            f"| {name} | {t['mib']:.0f} | {t.get('files', '-')} | {t['check']:.1f} | "
            f"{f'{cuob:.1f}' if cuob else '-'} | {ratio} | {t['read']:.2f} | "
            f"{t['check'] / t['read'] if t['read'] else 0:.1f} |"
        )
    total = {k: sum(t.get(k, 0.0) for t in times.values()) for k in ("check", "read", "mib")}
    cuob_total = sum(t.get("cuobjdump", 0.0) for t in times.values())
    print(
        f"| all | {total['mib']:.0f} | - | {total['check']:.1f} | "
        f"{cuob_total:.1f} | {total['check'] / cuob_total if cuob_total else 0:.2f} | "
        f"{total['read']:.2f} | {total['check'] / total['read'] if total['read'] else 0:.1f} |"
    )
    if args.json:
        args.json.write_text(json.dumps({"cells": rows, "times": times}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
