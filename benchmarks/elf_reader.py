"""Benchmark: buildmatrix's section reader against pyelftools, in one process.

    .venv/bin/python benchmarks/elf_reader.py [DIR ...]

For every ELF file under the folders (default: the committed test fixtures and,
if present, the corpus of benchmarks/inspect_vs_cuobjdump.py), locate the fatbin
section both ways, check that they agree, and report the time per file.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from elftools.elf.elffile import ELFFile

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from buildmatrix.binary.elf import read_elf  # noqa: E402
from buildmatrix.binary.source import FileSource  # noqa: E402

SECTIONS = (".nv_fatbin", "__nv_relfatbin")


def ours(path: Path) -> tuple[int, int] | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        info = read_elf(FileSource(fd, name=str(path)))
    finally:
        os.close(fd)
    for name in SECTIONS:
        s = info.section(name)
        if s is not None:
            return s.offset, s.size
    return None


def pyelftools(path: Path) -> tuple[int, int] | None:
    with path.open("rb") as f:
        elf = ELFFile(f)
        for name in SECTIONS:
            s = elf.get_section_by_name(name)
            if s is not None:
                return s["sh_offset"], s["sh_size"]
    return None


def main() -> int:
    roots = [Path(a) for a in sys.argv[1:]] or [
        REPO / "tests/fixtures/bin",
        Path("/tmp/buildmatrix-bench/lib"),
    ]
    files = [
        p
        for r in roots
        if r.is_dir()
        for p in sorted(r.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.read_bytes()[:4] == b"\x7fELF"
    ]
    rounds = 20
    results = {}
    for label, fn in (("buildmatrix", ours), ("pyelftools", pyelftools)):
        start = time.perf_counter()
        for _ in range(rounds):
            found = [fn(p) for p in files]
        results[label] = ((time.perf_counter() - start) / rounds / len(files), found)
    same = results["buildmatrix"][1] == results["pyelftools"][1]
    bm, pe = results["buildmatrix"][0], results["pyelftools"][0]
    print(f"{len(files)} ELF files, {rounds} rounds; same sections found: {same}")
    print("| reader | time per file |")
    print("|---|---:|")
    print(f"| buildmatrix.binary.elf | {bm * 1e6:.0f} µs |")
    print(f"| pyelftools 0.33 | {pe * 1e6:.0f} µs ({pe / bm:.1f}x) |")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
