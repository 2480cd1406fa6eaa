"""tests/fixtures/build.py's ``cached_build``: the cache of nvcc fixture builds
(docs/inspect.md, "Verified against nvcc and cuobjdump") rebuilds exactly when a
build could differ.

The compiler is a stand-in: a shell script named ``nvcc`` first on ``PATH`` that
answers ``--version`` with the text of its ``version.txt`` and otherwise writes to
``-o`` its arguments (the output path left out), that version text and every file
beside the source, as a real compiler's output depends on its flags, its release and
the sources it includes. No nvcc runs here, so this runs everywhere.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import tests.fixtures.build as fixture_build
from tests.fixtures.build import Fixture, build, cached_build

STANDIN = """#!/bin/sh
here=$(dirname "$0")
if [ "$1" = --version ]; then cat "$here/version.txt"; exit 0; fi
echo run >> "$here/runs.log"
out=; prev=; for a; do [ "$prev" = -o ] && out=$a; prev=$a; done
{ for a; do [ "$a" = "$out" ] || echo "$a"; done
  cat "$here/version.txt"; cat "$(dirname "$a")"/*; } > "$out"
"""

# Each input the key must follow, in two values: the fixture's gencode flag, the
# compiled source's text, another file under src/ (a header it may include), and
# the compiler's --version text.
GENCODE = ("arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90")
KERNELS = ("__global__ void k() {}\n", "__global__ void k() { return; }\n")
HEADER = ("#define N 1\n", "#define N 2\n")
VERSION = ("nvcc: Cuda compilation tools, release 13.0, V13.0.88\n",
           "nvcc: Cuda compilation tools, release 13.1, V13.1.80\n")  # fmt: skip

State = tuple[int, int, int, int]


def test_the_key_follows_flags_sources_and_tool_versions_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every combination of the four inputs, visited, then visited again in another
    order, each time into a new output folder, with the sources rewritten (same text,
    new mtime) and the fixture's notes changed: the stand-in compiles on the first
    visit of a combination only, one cache entry per combination, and what
    ``cached_build`` hands out is what an uncached ``build`` writes for that
    combination. A key that left out any of the four would hand out a stale build;
    one that took in the output folder, the mtimes or the notes would compile again."""
    tools, src, cache = tmp_path / "bin", tmp_path / "src", tmp_path / "cache"
    tools.mkdir()
    src.mkdir()
    compiler = tools / "nvcc"
    compiler.write_text(STANDIN)
    compiler.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    monkeypatch.setattr(fixture_build, "SRC", src)

    def runs() -> int:
        log = tools / "runs.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    states: list[State] = [(f, k, h, v) for f, k, h, v in itertools.product((0, 1), repeat=4)]
    visits = [*states, *states[::-2], *states[::2]]
    seen: set[State] = set()
    for n, state in enumerate(visits):
        flag, kernels, header, version = state
        (src / "kernels.cu").write_text(KERNELS[kernels])
        (src / "common.h").write_text(HEADER[header])
        (tools / "version.txt").write_text(VERSION[version])
        fx = Fixture(name="libk.so", kind="shared", gencode=(GENCODE[flag],), notes=f"visit {n}")

        before = runs()
        [got] = cached_build(tmp_path / f"out{n}", [fx], cache)
        compiled = runs() - before
        [fresh] = build(tmp_path / f"fresh{n}", [fx])

        assert got.read_bytes() == fresh.read_bytes(), (n, state)
        assert compiled == (0 if state in seen else 1), (n, state)
        seen.add(state)
        entries = [p for p in cache.iterdir() if not p.name.startswith(".")]
        assert len(entries) == len(seen), (n, state)
    assert len(seen) == 16
