"""Benchmark: ``buildmatrix inspect`` against ``cuobjdump --list-elf`` on real CUDA libraries.

    .venv/bin/python benchmarks/inspect_vs_cuobjdump.py [--workdir DIR] [--only torch]

Fetches torch==2.14.1 and the nvidia-* CUDA library wheels with ``pip download``
(the local package index serves them offline), extracts their shared libraries
and, for each library and for the whole corpus, measures in one run:

- ``buildmatrix inspect FILE --json`` (a fresh process, start-up included);
- ``cuobjdump --list-elf FILE`` (what a user would otherwise run);
- ``cat FILE > /dev/null``: the time to merely read the bytes (the I/O floor);

each as wall time and peak RSS of the process (``os.wait4``), page cache warm for
all three. It also checks that both tools list the same SASS entries. Prints a
Markdown table. This is a benchmark, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.cuobjdump import cuobjdump_lists, find_cuobjdump  # noqa: E402

WHEELS = {
    "torch": "torch==2.14.1",
    "cublas": "nvidia-cublas",
    "cudnn": "nvidia-cudnn-cu13",
    "cufft": "nvidia-cufft",
    "cusparse": "nvidia-cusparse",
    "cusolver": "nvidia-cusolver",
    "curand": "nvidia-curand",
    "nccl": "nvidia-nccl-cu13",
}


@dataclass
class Run:
    seconds: float
    max_rss_mb: float
    stdout: bytes


def measure(cmd: list[str], *, stdout_to_null: bool = False) -> Run:
    """Run ``cmd``; wall time and the peak RSS of that process alone (os.wait4)."""
    out = subprocess.DEVNULL if stdout_to_null else subprocess.PIPE
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
    data = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(seconds, usage.ru_maxrss / 1024, data)


def fetch(workdir: Path, only: set[str] | None) -> list[Path]:
    libs: list[Path] = []
    wheels = workdir / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for key, requirement in WHEELS.items():
        if only and key not in only:
            continue
        target = workdir / "lib" / key
        if not target.is_dir():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "-q",
                    "-d",
                    str(wheels),
                    requirement,
                ],
                check=True,
            )
            name = requirement.split("==")[0].replace("-", "_")
            (wheel,) = sorted(wheels.glob(f"{name}-*.whl"))[-1:]
            with zipfile.ZipFile(wheel) as zf:
                for member in zf.namelist():
                    base = Path(member).name
                    if ".so" in base and ("cuda" in base or key != "torch"):
                        zf.extract(member, target)
            wheel.unlink()
        libs.extend(sorted(p for p in target.rglob("*.so*") if p.is_file()))
    return libs


def sass_of_json(data: bytes) -> Counter[str]:
    doc = json.loads(data)
    return Counter(
        e["arch"].removesuffix("f")
        for f in doc["files"]
        for e in f["entries"]
        if e["kind"] == "sass"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/buildmatrix-bench"))
    parser.add_argument("--only", action="append", choices=sorted(WHEELS))
    args = parser.parse_args()
    tool = find_cuobjdump()
    if tool is None:
        print("cuobjdump not found: pip install nvidia-cuda-cuobjdump", file=sys.stderr)
        return 3
    buildmatrix = [sys.executable, "-m", "buildmatrix"]
    libs = fetch(args.workdir, set(args.only) if args.only else None)
    rows = []
    totals = {"bm": 0.0, "cu": 0.0, "cat": 0.0}
    for lib in libs:
        measure(["cat", str(lib)], stdout_to_null=True)  # warm the page cache
        floor = measure(["cat", str(lib)], stdout_to_null=True)
        ours = measure([*buildmatrix, "inspect", "--json", str(lib)])
        ref = measure([str(tool), "--list-elf", str(lib)], stdout_to_null=True)
        cu_sass, _ = cuobjdump_lists(tool, lib)
        same = sass_of_json(ours.stdout) == cu_sass
        totals["bm"] += ours.seconds
        totals["cu"] += ref.seconds
        totals["cat"] += floor.seconds
        rows.append(
            (lib.name, lib.stat().st_size / 2**20, sum(cu_sass.values()), ours, ref, floor, same)
        )
    startup = min(measure([*buildmatrix, "--version"]).seconds for _ in range(3))
    corpus = args.workdir / "lib"
    whole = measure([*buildmatrix, "inspect", "--json", str(corpus)])
    whole_floor = measure(["sh", "-c", f"find {corpus} -type f -exec cat {{}} + > /dev/null"])
    print(
        "| library | size MiB | cubins | buildmatrix s | cuobjdump s | speed-up | "
        "buildmatrix RSS MiB | cuobjdump RSS MiB | RSS ratio | cat s (I/O floor) | same |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, size, cubins, ours, ref, floor, same in rows:
        if cubins == 0 and ours.seconds < 0.5 and ref.seconds < 0.5:
            continue  # host-only helper libraries: nothing to compare
        print(
            f"| {name} | {size:.0f} | {cubins} | {ours.seconds:.2f} | {ref.seconds:.2f} | "
            f"{ref.seconds / ours.seconds:.0f}x | {ours.max_rss_mb:.0f} | {ref.max_rss_mb:.0f} | "
            f"1/{ref.max_rss_mb / ours.max_rss_mb:.0f} | {floor.seconds:.2f} | "
            f"{'yes' if same else 'NO'} |"
        )
    total_mb = sum(r[1] for r in rows)
    print(
        f"\nWhole corpus ({len(rows)} files, {total_mb:.0f} MiB): `buildmatrix inspect DIR` "
        f"{whole.seconds:.2f} s (peak RSS {whole.max_rss_mb:.0f} MiB); reading every byte "
        f"(`cat`) {whole_floor.seconds:.2f} s; cuobjdump file by file {totals['cu']:.1f} s."
    )
    print(f"All results identical: {all(r[-1] for r in rows)}")
    print(f"buildmatrix process start-up alone (`--version`): {startup:.2f} s, included above.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
