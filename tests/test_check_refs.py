"""buildmatrix/check_refs.py: check's flow over several references as a library call,
on folders holding the nvcc-built fixture libraries (tests/fixtures/bin). The
verdicts come from the fixtures' contents (sm_80 SASS runs on 8.x only; docs/check.md),
which cuobjdump confirms in tests/test_fatbin.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import ClassVar

import pytest

from buildmatrix.check import Options
from buildmatrix.check_refs import check_refs
from buildmatrix.cuda import load_cuda_facts
from buildmatrix.profiles import ProfileSet
from tests.conftest import REPO

BIN = REPO / "tests" / "fixtures" / "bin"


def _rootfs(tmp_path: Path, name: str, lib: str) -> str:
    root = tmp_path / name
    (root / "usr" / "lib").mkdir(parents=True)
    shutil.copy(BIN / lib, root / "usr" / "lib" / lib)
    return f"dir:{root}"


class _Recorded:
    """A progress display that remembers what it was told."""

    made: ClassVar[list[_Recorded]] = []

    def __init__(self) -> None:
        self.bytes = 0
        self.finished = False
        _Recorded.made.append(self)

    def __call__(self, n: int) -> None:
        self.bytes += n

    def done(self) -> None:
        self.finished = True


@pytest.mark.parametrize(
    ("sm", "verdicts"),
    [("sm_90", {"fits": True, "old": False}), ("sm_80", {"fits": True, "old": True})],
)
def test_each_reference_judged_in_order(
    sm: str, verdicts: dict[str, bool], profiles: ProfileSet, tmp_path: Path
) -> None:
    fits = _rootfs(tmp_path, "fits", "libsass_ptx.so")  # sm_80 + sm_90 SASS, compute_90 PTX
    old = _rootfs(tmp_path, "old", "libsass_sm80.so")  # sm_80 SASS only
    _Recorded.made = []
    run = check_refs(
        [fits, old],
        profiles=profiles,
        options=Options(sms=(sm,)),
        facts=load_cuda_facts(),
        progress=_Recorded,
    )
    assert [r.primary.image.ref for r in run.results] == [fits, old]
    assert [r.passed for r in run.results] == [verdicts["fits"], verdicts["old"]]
    assert run.passed == all(verdicts.values())
    assert len(_Recorded.made) == 2  # one display per image read
    assert all(p.finished for p in _Recorded.made)
