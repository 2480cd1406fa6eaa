"""The compatibility rules of docs/compatibility.md, table-driven and exhaustive.

The expected verdicts are computed here from the rules as the design states them
(and from the raw CUDA table file), independently of ``buildmatrix.compat``; a few
real-world cases are also spelled out by hand.
"""

from __future__ import annotations

import itertools
from functools import cache
from importlib import resources

import pytest
import yaml
from packaging.version import Version

from buildmatrix.arch import Arch, CodeKind, ComputeCapability, Suffix, parse_arch
from buildmatrix.compat import (
    CodeTarget,
    Verdict,
    combine,
    driver_floors,
    driver_meets_floors,
    judge_code,
    judge_codes,
)
from buildmatrix.cuda import DriverVersion, load_cuda_facts, parse_driver_version
from buildmatrix.profile_files import load_profiles
from tests.conftest import SHIPPED_PROFILES

CC = ComputeCapability
FACTS = load_cuda_facts()
PROFILES = load_profiles(SHIPPED_PROFILES)
RAW = yaml.safe_load(resources.files("buildmatrix").joinpath("data", "cuda.yaml").read_text())

# Every shipped GPU, plus GPUs the profiles do not know (a newer Blackwell, an sm_87
# Orin, the Tegra SMs, a future 13.0) so that the rules are exercised off the shipped grid too.
_OFF_GRID = {CC(7, 2), CC(8, 7), CC(8, 8), CC(10, 1), CC(11, 0), CC(12, 1), CC(13, 0)}
TARGET_CCS = sorted({p.cc for p in PROFILES} | _OFF_GRID)
CODE_NUMBERS = sorted({p.number for p in PROFILES} | {72, 87, 88, 101, 110})


def _driver(text: str) -> DriverVersion:
    return parse_driver_version(text)


def _around(text: str) -> list[DriverVersion]:
    """A floor, just below it and just above it."""
    major, minor, *patch = (int(x) for x in text.split("."))
    p = patch[0] if patch else 0
    below = f"{major}.{minor - 1}.99" if p == 0 else f"{major}.{minor}.{p - 1:02d}"
    return [_driver(text), _driver(below), _driver(f"{major}.{minor}.{p + 1:02d}")]


# Integrated (Tegra) GPUs: "Binary compatibility is supported only for the desktop. It
# is not supported for Tegra. Also, the binary compatibility between desktop and Tegra
# is not supported." (CUDA C++ Programming Guide, "Binary Compatibility"; nvlink 13.0
# agrees: tests/test_integrated_nvlink.py). Thor is 10.1 before CUDA 13.0, 11.0 after.
TEGRA = {(3, 2), (5, 3), (6, 2), (7, 2), (8, 7), (8, 8), (10, 1), (11, 0)}


def expected_sass(code: tuple[int, str], target: ComputeCapability) -> Verdict:
    number, suffix = code
    major, minor = divmod(number, 10)
    if (major, minor) in TEGRA or (target.major, target.minor) in TEGRA or suffix == "a":
        runs = (target.major, target.minor) == (major, minor)
    else:  # plain and family-specific: same major, same or later minor
        runs = target.major == major and target.minor >= minor
    return Verdict.NATIVE if runs else Verdict.NONE


@cache
def _first_driver_knowing(isa: str) -> DriverVersion | None:
    """The driver (cuda.yaml as written) of the oldest toolkit that emits PTX ISA ``isa``
    or a newer one; None where that toolkit ships none or no toolkit emits it. Read
    once per ISA (test_ptx_rules asks 170,000 times)."""
    knowing = [t["driver"] for t in RAW["toolkits"] if Version(t["ptx_isa"]) >= Version(isa)]
    return _driver(knowing[0]) if knowing and knowing[0] is not None else None


def expected_ptx(
    code: tuple[int, str], isa: str, target: ComputeCapability, driver: DriverVersion | None
) -> Verdict:
    number, suffix = code
    major, minor = divmod(number, 10)
    if suffix == "a":
        cc_ok = (target.major, target.minor) == (major, minor)
    elif suffix == "f":
        cc_ok = target.major == major and target.minor >= minor
    else:
        cc_ok = (target.major, target.minor) >= (major, minor)
    if not cc_ok:
        return Verdict.NONE
    if driver is None:
        return Verdict.JIT
    # The driver must know the ISA: that of the first toolkit emitting it or newer.
    # A toolkit that ships no driver (driver: null) names none that knows its ISA:
    # no driver can be shown to JIT it.
    need = _first_driver_knowing(isa)
    if need is None:
        return Verdict.NONE
    return Verdict.JIT if driver >= need else Verdict.NONE


ISAS = [*sorted({t["ptx_isa"] for t in RAW["toolkits"]}, key=Version), "9.9"]
PTX_DRIVERS: list[DriverVersion | None] = [None, _driver("616.00"), _driver("999.99.99")]
for tk in RAW["toolkits"]:
    if tk["driver"] is not None:
        PTX_DRIVERS.extend(_around(tk["driver"]))

SASS_CASES = list(itertools.product(CODE_NUMBERS, ["", "a", "f"], TARGET_CCS))


@pytest.mark.parametrize(("number", "suffix", "target"), SASS_CASES)
def test_sass_rules(number: int, suffix: str, target: ComputeCapability) -> None:
    arch = Arch(CC.from_number(number), CodeKind.SASS, Suffix(suffix))
    want = expected_sass((number, suffix), target)
    for driver in [None, _driver("450.80.02"), _driver("580.65.06")]:  # SASS ignores the driver
        got = judge_code(CodeTarget(arch=arch), target, driver=driver, facts=FACTS)
        assert got.verdict is want, (str(arch), str(target), got.reasons)
        assert got.reasons and all(str(arch) in r for r in got.reasons)


@pytest.mark.parametrize(
    ("number", "suffix"), [(n, s) for n in CODE_NUMBERS for s in ("", "a", "f")]
)
def test_ptx_rules(number: int, suffix: str) -> None:
    arch = Arch(CC.from_number(number), CodeKind.PTX, Suffix(suffix))
    seen: dict[tuple[ComputeCapability, str], set[Verdict]] = {}
    codes = {isa: CodeTarget(arch=arch, ptx_isa=Version(isa)) for isa in ISAS}
    for target, isa, driver in itertools.product(TARGET_CCS, ISAS, PTX_DRIVERS):
        got = judge_code(codes[isa], target, driver=driver, facts=FACTS)
        want = expected_ptx((number, suffix), isa, target, driver)
        assert got.verdict is want, (str(arch), isa, str(target), str(driver), got.reasons)
        seen.setdefault((target, isa), set()).add(got.verdict)
    # The sweep crosses the driver rule for every ISA: on the code's own GPU, some driver
    # JITs it and some cannot be shown to (below the ISA's floor, or a release without one).
    own = CC(*divmod(number, 10))
    undecided = [isa for isa in ISAS if seen[(own, isa)] != {Verdict.JIT, Verdict.NONE}]
    assert not undecided, f"{arch}: the driver decides no verdict for PTX ISA {undecided}"


@pytest.mark.parametrize(
    ("codes", "cc", "driver", "verdict"),
    [
        # A100 running an image built only for Hopper: the classic failure.
        (["sm_90"], CC(8, 0), None, Verdict.NONE),
        (["sm_80"], CC(8, 0), None, Verdict.NATIVE),
        (["sm_80"], CC(9, 0), None, Verdict.NONE),
        # sm_86 SASS runs on Ada (8.9): same major, later minor.
        (["sm_86"], CC(8, 9), None, Verdict.NATIVE),
        # Orin (8.7) SASS on an Ada card (IGX Orin with an RTX 6000 Ada), and back.
        (["sm_87"], CC(8, 9), None, Verdict.NONE),
        (["sm_80", "sm_86"], CC(8, 7), None, Verdict.NONE),
        (["sm_87"], CC(8, 7), None, Verdict.NATIVE),
        (["sm_100"], CC(10, 1), None, Verdict.NONE),
        (["sm_110"], CC(12, 0), None, Verdict.NONE),
        (["compute_87@9.0"], CC(8, 9), "580.65.06", Verdict.JIT),
        (["compute_80@9.0"], CC(8, 7), "580.65.06", Verdict.JIT),
        (["sm_89"], CC(8, 6), None, Verdict.NONE),
        (["sm_90a"], CC(9, 0), None, Verdict.NATIVE),
        (["sm_100a"], CC(10, 3), None, Verdict.NONE),
        (["sm_100f"], CC(10, 3), None, Verdict.NATIVE),
        (["sm_100f"], CC(12, 0), None, Verdict.NONE),
        # PTX JIT: forward across majors, if the driver knows the ISA.
        (["sm_80", "compute_80@8.4"], CC(9, 0), "550.54.14", Verdict.JIT),
        (["sm_80", "compute_80@8.4"], CC(9, 0), "535.104.05", Verdict.NONE),
        (["sm_80", "compute_80@8.4"], CC(8, 6), "535.104.05", Verdict.NATIVE),
        (["compute_90a@8.0"], CC(10, 0), None, Verdict.NONE),
        (["compute_120@8.7"], CC(10, 0), None, Verdict.NONE),
        (["compute_90@9.0"], CC(12, 0), "580.65.06", Verdict.JIT),
        (["compute_90@9.0"], CC(12, 0), "575.51.03", Verdict.NONE),
        ([], CC(9, 0), None, Verdict.NONE),
    ],
)
def test_real_world_cases(
    codes: list[str], cc: ComputeCapability, driver: str | None, verdict: Verdict
) -> None:
    targets = []
    for c in codes:
        name, _, isa = c.partition("@")
        targets.append(CodeTarget(arch=parse_arch(name), ptx_isa=Version(isa) if isa else None))
    drv = _driver(driver) if driver else None
    got = judge_codes(targets, cc, driver=drv, facts=FACTS)
    assert got.verdict is verdict, got.reasons


def test_none_lists_every_refusal() -> None:
    codes = [CodeTarget(arch=parse_arch("sm_90")), CodeTarget(arch=parse_arch("sm_90a"))]
    got = judge_codes(codes, CC(8, 0), driver=None, facts=FACTS)
    assert got.verdict is Verdict.NONE
    assert got.reasons == (
        "sm_90 SASS runs only on compute capability 9.x, not 8.0",
        "sm_90a is arch-specific SASS and runs only on 9.0, not 8.0",
    )


def test_ptx_reason_names_driver_and_need() -> None:
    code = CodeTarget(arch=parse_arch("compute_90"), ptx_isa=Version("8.4"))
    got = judge_code(code, CC(10, 0), driver=_driver("535.104.05"), facts=FACTS)
    assert got.reasons == (
        "compute_90 PTX ISA 8.4 needs CUDA 12.4, driver >= 550.54.14 to JIT; "
        "driver 535.104.05 supports only CUDA 12.2",
    )


def test_combine_worst_wins() -> None:
    assert combine([]) is Verdict.NATIVE
    assert combine([Verdict.NATIVE, Verdict.JIT]) is Verdict.JIT
    assert combine([Verdict.JIT, Verdict.NONE, Verdict.NATIVE]) is Verdict.NONE


RUNTIME_FLOORS = RAW["minor_version_compatibility"]


@pytest.mark.parametrize(
    ("runtime", "driver"),
    [
        (f"{major}.{minor}", drv)
        for major, floor in RUNTIME_FLOORS.items()
        for minor in (0, 4, 9)
        for drv in _around(floor)
    ],
)
def test_runtime_floor(runtime: str, driver: DriverVersion) -> None:
    floor = _driver(RUNTIME_FLOORS[runtime.split(".", maxsplit=1)[0]])
    floors = driver_floors(cuda_runtime=Version(runtime), hardware_floor=None, facts=FACTS)
    got = driver_meets_floors(driver, floors)
    assert got.ok is (driver >= floor), got.reasons


@pytest.mark.parametrize(
    ("sm", "driver"), [(p.sm, d) for p in PROFILES for d in _around(str(p.min_driver))]
)
def test_hardware_floor(sm: str, driver: DriverVersion) -> None:
    profile = PROFILES.get(sm)
    floors = driver_floors(
        cuda_runtime=None, hardware_floor=profile.min_driver, hardware=sm, facts=FACTS
    )
    got = driver_meets_floors(driver, floors)
    assert got.ok is (driver >= profile.min_driver), got.reasons


def test_hopper_needs_r525_even_for_cuda_11() -> None:
    """An 11.8 image on H100 with R520: the runtime floor passes, the runbook floor fails."""
    hopper = PROFILES.get("sm_90")
    floors = driver_floors(
        cuda_runtime=Version("11.8"),
        hardware_floor=hopper.min_driver,
        hardware="hopper",
        facts=FACTS,
    )
    got = driver_meets_floors(_driver("520.61.05"), floors)
    assert not got.ok
    assert got.reasons == (
        "driver 520.61.05 >= 450.80.02: CUDA 11.8 runtime (CUDA 11.x minor version compatibility)",
        "hardware floor for hopper needs driver >= 525.60.13; node has 520.61.05",
    )


def test_unknown_cuda_major_fails_closed() -> None:
    floors = driver_floors(cuda_runtime=Version("14.0"), hardware_floor=None, facts=FACTS)
    got = driver_meets_floors(_driver("999.1"), floors)
    assert not got.ok
    assert "knows no driver floor for CUDA 14.x" in got.reasons[0]
