"""inspect against nvcc's own output and NVIDIA's cuobjdump, entry for entry.

The fixtures are rebuilt from source with nvcc (skipped where nvcc is absent) so
that the committed ones can never drift from what the compiler really produces.
A build is kept in the user's cache, keyed by its commands, the tools' versions and
the sources (tests/fixtures/build.py, ``cached_build``): a later run with the same
compiler and sources reads what that compiler wrote instead of compiling again.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from buildmatrix.binary.fatbin import EntryKind
from buildmatrix.binary.scan import inspect_file
from tests.conftest import NVCC_CACHE
from tests.cuobjdump import cuobjdump_lists, find_cuobjdump
from tests.fixtures.build import (
    BIN,
    FIXTURES,
    Fixture,
    buildable,
    cached_build,
    expected,
    have_cross,
    have_nvcc,
)

pytestmark = [pytest.mark.integration, pytest.mark.nvcc]

CUOBJDUMP = find_cuobjdump()
CUOBJDUMP_READS = {"shared", "exe", "object", "cubin", "fatbin", "archive", "aarch64"}
_NO_CROSS = "aarch64-linux-gnu-gcc is missing (apt-get install gcc-aarch64-linux-gnu)"


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not have_nvcc():
        pytest.skip("nvcc is not installed: the committed fixtures are tested instead")
    out = tmp_path_factory.mktemp("fixtures")
    cached_build(out, buildable(), NVCC_CACHE)
    return out


def _ours(path: Path) -> tuple[Counter[str], Counter[str]]:
    report = inspect_file(path)
    sass: Counter[str] = Counter()
    ptx: Counter[str] = Counter()
    for e in report.entries if report else ():
        if e.kind is EntryKind.SASS:
            # cuobjdump names a family-specific cubin by its plain SM.
            sass[str(e.arch).removesuffix("f")] += 1
        elif e.kind is EntryKind.PTX:
            ptx[str(e.arch)] += 1
    return sass, ptx


@pytest.mark.parametrize("fx", FIXTURES, ids=lambda fx: fx.name)
def test_rebuilt_fixture_matches_gencode_and_committed(rebuilt: Path, fx: Fixture) -> None:
    if fx.kind == "aarch64" and not have_cross():
        pytest.skip(_NO_CROSS)
    fresh = inspect_file(rebuilt / fx.name)
    committed = inspect_file(BIN / fx.name)
    if fx.kind == "host":
        assert fresh is None
        assert committed is None
        return
    assert fresh is not None
    assert committed is not None
    assert (fresh.sass, fresh.ptx) == expected(fx)
    assert [e.arch_name for e in fresh.entries] == [e.arch_name for e in committed.entries]


@pytest.mark.parametrize(
    "fx", [f for f in FIXTURES if f.kind in CUOBJDUMP_READS], ids=lambda fx: fx.name
)
def test_agrees_with_cuobjdump_entry_for_entry(rebuilt: Path, fx: Fixture) -> None:
    if CUOBJDUMP is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    if fx.kind == "aarch64" and not have_cross():
        pytest.skip(_NO_CROSS)
    path = rebuilt / fx.name
    assert _ours(path) == cuobjdump_lists(CUOBJDUMP, path)


def test_the_committed_aarch64_library_agrees_with_cuobjdump() -> None:
    """The committed aarch64 fixture (no nvcc or cross toolchain needed to read it):
    an EM_AARCH64 shared object, listed as cuobjdump lists it."""
    from buildmatrix.binary.elf import EM_AARCH64, read_elf
    from buildmatrix.binary.source import BytesSource

    path = BIN / "libsass_ptx_aarch64.so"
    assert read_elf(BytesSource(path.read_bytes(), name=path.name)).machine == EM_AARCH64
    fx = next(f for f in FIXTURES if f.name == path.name)
    report = inspect_file(path)
    assert report is not None
    assert (report.sass, report.ptx) == expected(fx)
    if CUOBJDUMP is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    assert _ours(path) == cuobjdump_lists(CUOBJDUMP, path)
