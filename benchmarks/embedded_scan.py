"""Benchmark: what searching ELF data for embedded device code costs ``inspect``.

    .venv/bin/python benchmarks/embedded_scan.py [--workdir DIR]

On the corpus of benchmarks/inspect_vs_cuobjdump.py (torch 2.14.1 and the nvidia-*
CUDA library wheels, fetched there), in one process with the page cache warm, three
times each, best time kept:

- inspect without the data search (sections and the runtime's wrapper only);
- inspect with it (every allocated, non-executable section searched for fatbinary
  and cubin headers: buildmatrix/binary/embedded.py);
- reading every byte of the same files (the I/O floor);
- searching every byte for both magic numbers: what a scan of a stream, which
  cannot go back to the section table at a file's end, would have to do.

Prints a Markdown table and checks that the search finds nothing the sections do not
already show in these libraries (their device code is all in .nv_fatbin). Nothing
here asserts on time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.inspect_vs_cuobjdump import fetch  # noqa: E402
from buildmatrix.binary.elf import ELF_MAGIC  # noqa: E402
from buildmatrix.binary.fatbin import FATBIN_MAGIC_BYTES  # noqa: E402
from buildmatrix.binary.scan import inspect_file  # noqa: E402


def best(fn: object, runs: int = 3) -> float:
    """The best of ``runs`` timings of ``fn()``, in seconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/buildmatrix-bench"))
    args = parser.parse_args()
    libs = fetch(args.workdir, None)
    total = sum(p.stat().st_size for p in libs)

    def scan(deep: bool) -> list[object]:
        return [inspect_file(p, deep=deep) for p in libs]

    def read_all() -> None:
        for p in libs:
            with p.open("rb") as f:
                while f.read(8 << 20):
                    pass

    shallow, deep = scan(False), scan(True)  # warm the cache, compare the findings
    extra = [
        (p.name, len(d.entries) - (len(s.entries) if s else 0))  # type: ignore[attr-defined]
        for p, s, d in zip(libs, shallow, deep, strict=True)
        if d is not None and (s is None or len(d.entries) != len(s.entries))  # type: ignore[attr-defined]
    ]

    def search_every_byte() -> None:
        # What a scan that cannot go back (a stream) would have to do: an ELF file
        # names its sections at its end, so every byte may be data holding code.
        for p in libs:
            with p.open("rb") as f:
                while chunk := f.read(8 << 20):
                    for needle in (ELF_MAGIC, FATBIN_MAGIC_BYTES):
                        at = chunk.find(needle)
                        while at >= 0:
                            at = chunk.find(needle, at + 1)

    t_shallow = best(lambda: scan(False))
    t_deep = best(lambda: scan(True))
    t_read = best(read_all)
    t_every = best(search_every_byte)
    print(f"{len(libs)} libraries, {total / 2**30:.2f} GiB\n")
    print("| inspect | time (s) | vs sections only | vs reading every byte |")
    print("| --- | ---: | ---: | ---: |")
    for name, t in (
        ("sections and wrapper only", t_shallow),
        ("with the data search", t_deep),
        ("read every byte (floor)", t_read),
        ("search every byte for both magic numbers (as a stream scan must)", t_every),
    ):
        print(f"| {name} | {t:.2f} | {t / t_shallow:.2f}x | {t / t_read:.2f}x |")
    print(f"\nentries found only by the data search: {extra or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
