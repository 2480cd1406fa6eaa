"""Integrated (Tegra) SMs and the desktop line, with nvlink and ptxas as the oracle.

For every SASS target ptxas 13.0 compiles for and every GPU of the same list or of
the shipped profiles, ``sass_runs_on`` is what nvlink does with a cubin of that SM
alone linked into a program for that GPU; for every ``.target`` of PTX, whether it
JITs for a GPU is what ptxas does with it. Where a profile's GPU is older than this
nvlink knows (7.0), the CUDA C++ Programming Guide's rule, as written below, decides.
The tools' answers are cached (tests/toolchain_tables.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from packaging.version import Version

from buildmatrix.arch import (
    INTEGRATED,
    Arch,
    CodeKind,
    ComputeCapability,
    Suffix,
    integrated,
    parse_arch,
    sass_runs_on,
    serves_wherever,
)
from buildmatrix.compat import judge_code
from buildmatrix.cuda import load_cuda_facts, parse_driver_version
from buildmatrix.jit import ptx_targets
from buildmatrix.profile_files import load_profiles
from buildmatrix.verdict import CodeTarget, Verdict
from tests.conftest import SHIPPED_PROFILES
from tests.toolchain_tables import HAVE_TOOLS, nvlink_links, ptxas_compiles, ptxas_gpus

_SKIP = pytest.mark.skipif(not HAVE_TOOLS, reason="nvlink and ptxas are the oracle")


def needs_tools(test: Callable[[], None]) -> Callable[[], None]:
    """Runs nvlink and ptxas: marked ``nvcc`` (an integration test), skipped without them."""
    return pytest.mark.nvcc(_SKIP(test))


CC = ComputeCapability
FACTS = load_cuda_facts()
PROFILE_CCS = sorted({p.cc for p in load_profiles(SHIPPED_PROFILES)})


def _documented(code: Arch, cc: ComputeCapability) -> bool:
    """The Programming Guide's rule ("Binary Compatibility"), for GPUs this nvlink
    does not know: X.y SASS runs on X.z, z >= y, on the desktop only; "It is not
    supported for Tegra. Also, the binary compatibility between desktop and Tegra is
    not supported." ``a`` code runs on its own GPU alone."""
    tegra = {CC(3, 2), CC(5, 3), CC(6, 2), CC(7, 2), CC(8, 7), CC(8, 8), CC(10, 1), CC(11, 0)}
    if code.suffix is Suffix.ARCH or code.cc in tegra or cc in tegra:
        return cc == code.cc
    return cc.major == code.cc.major and cc.minor >= code.cc.minor


def _gpus() -> list[ComputeCapability]:
    plain = {parse_arch(n).cc for n in ptxas_gpus()}
    return sorted(plain | set(PROFILE_CCS))


@needs_tools
def test_sass_runs_where_nvlink_links_it() -> None:
    """Every (SASS target, GPU) pair: native exactly where nvlink links the cubin."""
    links = nvlink_links()
    plain = {parse_arch(n).cc: n for n in ptxas_gpus() if parse_arch(n).suffix is Suffix.NONE}
    wrong, pairs = [], 0
    for name, targets in links.items():
        code = parse_arch(name)
        for cc in _gpus():
            want = plain[cc] in targets if cc in plain else _documented(code, cc)
            got = judge_code(CodeTarget(arch=code), cc, driver=None, facts=FACTS)
            pairs += 1
            if sass_runs_on(code, cc) != want or (got.verdict is Verdict.NATIVE) != want:
                wrong.append((name, str(cc), want, got.reasons))
    assert not wrong, wrong
    # every SM ptxas 13.0 compiles for (23 with the a and f ones), on every GPU
    assert len(links) >= 23 and pairs == len(links) * len(_gpus())


@needs_tools
def test_nvlink_keeps_tegra_apart() -> None:
    """The classes the rule is about, as nvlink shows them: Orin (8.7) and 8.8 code
    links for itself alone, desktop 8.x code not for either, and Thor (11.0) code
    for 11.0 alone; the profiles' GPUs of the desktop line still take older minors."""
    links = nvlink_links()
    assert links["sm_87"] == ["sm_87"] and links["sm_88"] == ["sm_88"]
    assert "sm_87" not in links["sm_80"] and "sm_88" not in links["sm_86"]
    assert "sm_89" in links["sm_80"] and "sm_89" in links["sm_86"]
    assert [t for t in links["sm_110"] if t[-1].isdigit()] == ["sm_110"]
    assert "sm_121" in links["sm_120"]  # GB10 is on the desktop line


@needs_tools
def test_ptx_jits_where_ptxas_compiles_it() -> None:
    """PTX is forward-compatible by number across the two lines (compute_87 PTX JITs
    for 8.9 and 9.0; compute_80 for 8.7; ptxas --help: "PTX for .target sm_XY can be
    compiled to all GPU targets sm_MN, sm_MNa, SM_MNf where MN >= XY"): every
    (.target, GPU) pair as ptxas says."""
    compiles = ptxas_compiles()
    gpus = {parse_arch(n).cc: n for n in ptxas_gpus() if parse_arch(n).suffix is Suffix.NONE}
    wrong = []
    for name, targets in compiles.items():
        sm = parse_arch(name)
        code = Arch(sm.cc, CodeKind.PTX, sm.suffix)
        for cc, gpu in gpus.items():
            # a GPU of X.Y is what ptxas compiles for as sm_XY, sm_XYa or sm_XYf
            if ptx_targets(code, cc) != any(gpu + s in targets for s in ("", "a", "f")):
                wrong.append((str(code), str(cc)))
    assert not wrong, wrong
    assert "sm_89" in compiles["sm_87"] and "sm_87" in compiles["sm_80"]


def test_an_orin_image_on_an_ada_card_runs_nothing() -> None:
    """IGX Orin with an RTX 6000 Ada: sm_87 SASS alone is no code for 8.9; with
    compute_87 PTX a driver that knows the ISA JIT-compiles it."""
    sass = CodeTarget(arch=parse_arch("sm_87"))
    ptx = CodeTarget(arch=parse_arch("compute_87"), ptx_isa=Version("9.0"))
    got = judge_code(sass, CC(8, 9), driver=None, facts=FACTS)
    assert got.verdict is Verdict.NONE and "Tegra" in got.reasons[0], got.reasons
    driver = parse_driver_version("580.65.06")
    assert judge_code(ptx, CC(8, 9), driver=driver, facts=FACTS).verdict is Verdict.JIT
    desktop = judge_code(CodeTarget(arch=parse_arch("sm_80")), CC(8, 7), driver=None, facts=FACTS)
    assert desktop.verdict is Verdict.NONE and "Tegra" in desktop.reasons[0]


def test_serves_wherever_keeps_the_lines_apart() -> None:
    """sm_80 serves wherever sm_86 runs, not where sm_87 or sm_88 does (Orin code
    is no duplicate of desktop code), and the answer is the rule's over every pair."""
    numbers = [70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 110, 120, 121]
    sms = [Arch(CC.from_number(n), CodeKind.SASS) for n in numbers]
    every = [CC.from_number(n) for n in numbers]
    for s in sms:
        for t in sms:
            rule = all(sass_runs_on(s, cc) for cc in every if sass_runs_on(t, cc))
            assert serves_wherever(frozenset({s}), frozenset({t})) == rule, (str(s), str(t))
    assert all(integrated(cc) for cc in INTEGRATED)
