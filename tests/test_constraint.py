"""NVIDIA_REQUIRE_ARCH admits a (GPU, driver) pair if and only if ``check`` passes there.

Exhaustive over every variant of the shipped image specs and the end-to-end test spec,
each also rebuilt for every CUDA release of the table that can build it; every compute
capability of the profiles plus GPUs the profiles do not know; drivers at, just below
and just above every floor the facts and profiles name. The constraint is evaluated
by a small evaluator written here from the NVIDIA container toolkit's documented
semantics (not by buildmatrix); ``check`` runs on an image holding exactly the code
the variant's gencode flags produce, with the variant's CUDA runtime.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from buildmatrix.arch import ComputeCapability
from buildmatrix.binary.fatbin import EntryKind, FatbinEntry
from buildmatrix.binary.report import FileReport
from buildmatrix.check import Options, run_check
from buildmatrix.cuda import load_cuda_facts, parse_driver_version
from buildmatrix.image.scanned import ImageConfig, ScannedImage
from buildmatrix.matrix import expand_all
from buildmatrix.profile_files import load_profiles
from buildmatrix.snapshot import Gpu, Snapshot
from buildmatrix.specs import Cuda, load_specs
from buildmatrix.variant import Entry
from tests.conftest import REPO, SHIPPED_PROFILES

FACTS = load_cuda_facts()
PROFILES = load_profiles(SHIPPED_PROFILES)
CC = ComputeCapability

# ---------------------------------------------------------------- the evaluator

_CONDITION = re.compile(r"(?P<key>[a-z]+)(?P<op>>=|<=|!=|=|<|>)(?P<value>[0-9.]+)")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def _cmp(a: tuple[int, ...], op: str, b: tuple[int, ...]) -> bool:
    width = max(len(a), len(b))  # versions compare numerically, missing parts as 0
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return {
        "=": a == b,
        "!=": a != b,
        "<": a < b,
        "<=": a <= b,
        ">": a > b,
        ">=": a >= b,
    }[op]


@functools.cache
def _alternatives(value: str) -> tuple[tuple[tuple[str, str, tuple[int, ...]], ...], ...]:
    """The constraint parsed: its alternatives, each its (key, op, version) conditions."""
    parsed = []
    for alternative in value.split():
        conditions = []
        for condition in alternative.split(","):
            m = _CONDITION.fullmatch(condition)
            assert m is not None, f"not a condition the toolkit understands: {condition!r}"
            conditions.append((m["key"], m["op"], _version(m["value"])))
        parsed.append(tuple(conditions))
    return tuple(parsed)


# A pure function of its three inputs, asked ~10^5 times over ~4x10^4 distinct
# triples (variants share constraints; two tests walk the same domain): memoised.
@functools.cache
def admits(value: str, *, arch: str, driver: str) -> bool:
    """nvidia-container-toolkit: space-separated alternatives (OR), each comma-separated
    conditions (AND) on arch and driver."""
    facts = {"arch": _version(arch), "driver": _version(driver)}
    return any(
        all(_cmp(facts[key], op, version) for key, op, version in alternative)
        for alternative in _alternatives(value)
    )


def test_evaluator() -> None:
    assert admits("arch>=8.0,arch<9.0,driver>=525.60.13", arch="8.6", driver="535.104.05")
    assert not admits("arch>=8.0,arch<9.0,driver>=525.60.13", arch="9.0", driver="535.104.05")
    assert not admits("arch=8.9,driver>=525.60.13", arch="8.9", driver="525.60.12")
    assert admits("arch=8.9,driver>=525 arch>=9.0,driver>=580", arch="9.0", driver="580.65.06")
    assert admits("driver>=570.26", arch="9.0", driver="570.26.0")
    assert not admits("", arch="9.0", driver="999")


# ---------------------------------------------------------------- the domain


def _variants() -> Iterator[Entry]:
    roots = [REPO / "images", REPO / "tests" / "fixtures" / "images"]
    specs = [s for root in roots for s in load_specs(root, PROFILES, facts=FACTS)]
    for entry in expand_all(specs, PROFILES, facts=FACTS, out=Path("/nonexistent")).entries:
        yield entry
        for tk in FACTS.toolkits:  # the same variant built by every release that can
            cuda = Cuda(full=f"{tk.version}.0", major=tk.version.major, minor=tk.version.minor)
            if cuda.mm != entry.cuda.mm and all(
                p.supports_cuda(tk.version) for p in entry.profiles
            ):
                yield dataclasses.replace(entry, cuda=cuda)


def _distinct(entries: Iterator[Entry]) -> list[Entry]:
    """One variant per (code, CUDA release): axes such as Python do not change either side."""
    seen: dict[tuple[tuple[str, ...], str], Entry] = {}
    for e in entries:
        seen.setdefault((tuple(str(c) for c in e.codes()), e.cuda.mm), e)
    return list(seen.values())


VARIANTS = _distinct(_variants())

CCS = sorted(
    {p.cc for p in PROFILES}
    | {
        CC(7, 2),
        CC(8, 7),
        CC(8, 8),
        CC(9, 5),
        CC(10, 1),
        CC(10, 7),
        CC(11, 0),
        CC(12, 1),
        CC(13, 0),
        CC(14, 2),
    }
)


def _around(text: str) -> list[str]:
    major, minor, *patch = (int(x) for x in text.split("."))
    p = patch[0] if patch else 0
    below = f"{major}.{minor - 1}.99" if p == 0 else f"{major}.{minor}.{p - 1:02d}"
    return [text, below, f"{major}.{minor}.{p + 1:02d}"]


DRIVERS = sorted(
    {d for tk in FACTS.toolkits if tk.driver for d in _around(str(tk.driver))}
    | {d for floor in FACTS.minor_compat.values() for d in _around(str(floor))}
    | {d for p in PROFILES for d in _around(str(p.min_driver))}
    | {d for p in PROFILES for f in p.product_floors.values() for d in _around(str(f.min_driver))}
    | {"450.36.06", "999.99.99"},
    key=_version,
)


def _image(entry: Entry) -> ScannedImage:
    entries = tuple(
        FatbinEntry(
            kind=EntryKind.SASS if str(code.arch).startswith("sm_") else EntryKind.PTX,
            arch=code.arch,
            ptx_isa=code.ptx_isa,
            compressed=False,
            size=1,
            offset=0,
        )
        for code in entry.codes()
    )
    report = FileReport(path="usr/lib/libvariant.so", format="elf", entries=entries)
    return ScannedImage(
        ref=entry.image_ref,
        digest=None,
        config=ImageConfig(env={"CUDA_VERSION": entry.cuda.full}),
        files=[report],
        problems=[],
        paths=[report.path],
        layers=1,
    )


@functools.cache
def _options(cc: ComputeCapability, driver: str) -> Options:
    """check's options for a node of one GPU of ``cc`` at ``driver`` (frozen: built once
    per pair and shared by every variant)."""
    gpu = Gpu(index=0, name=f"GPU {cc}", cc=cc, memory_total_mib=None)
    snapshot = Snapshot(
        hostname="n",
        driver=parse_driver_version(driver),
        cuda_driver_version=None,
        gpus=(gpu,),
        errors=(),
        source="test",
    )
    return Options(snapshot=snapshot)


def test_domain_is_wide() -> None:
    assert len(VARIANTS) >= 60  # distinct (code, CUDA release) pairs
    assert {v.cuda.mm for v in VARIANTS} >= {"12.8", "12.9", "13.0", "13.3", "13.5"}
    assert len(CCS) >= 19 and len(DRIVERS) >= 80


@pytest.mark.parametrize("entry", VARIANTS, ids=[f"{v.image_ref}@{v.cuda.mm}" for v in VARIANTS])
def test_constraint_admits_exactly_what_check_passes(entry: Entry) -> None:
    constraint = entry.nvidia_require_arch
    image = _image(entry)
    outcomes: set[bool] = set()
    for cc in CCS:
        for driver in DRIVERS:
            result = run_check(image, PROFILES, _options(cc, driver), FACTS)
            # The image is a legacy CUDA image (CUDA_VERSION, no NVIDIA_REQUIRE_CUDA), so
            # the container toolkit's legacy hook requires cuda>=MAJOR.MINOR as well
            # (buildmatrix.toolkit_require): the driver's CUDA version, that of the newest
            # release whose driver it meets (a lower bound above the newest one known).
            have = FACTS.driver_cuda(parse_driver_version(driver))
            cuda_ok = have is not None and have >= Version(entry.cuda.mm)
            want = admits(constraint, arch=str(cc), driver=driver) and cuda_ok
            assert want is result.passed, (
                f"{entry.image_ref} CUDA {entry.cuda.full} on {cc} with {driver}: "
                f"constraint {'admits' if want else 'refuses'} ({constraint}) but check "
                f"{'passes' if result.passed else 'fails'}: {result.problems}"
            )
            outcomes.add(want)
    # Both sides of the constraint are compared: a variant whose constraint admitted
    # every pair (or none) would make this test agree with any check.
    # A release that names no driver (13.4, 13.5): no driver can be shown to report
    # its CUDA version, so the toolkit's cuda>= requirement admits none (fail closed).
    release = FACTS.toolkit(Version(entry.cuda.mm))
    named = release is not None and release.driver is not None
    assert outcomes == ({True, False} if named else {False}), f"{entry.image_ref}: {outcomes}"


def test_min_driver_label_is_the_lowest_admitted_driver() -> None:
    for entry in VARIANTS:
        lowest = min(
            (
                d
                for cc in CCS
                for d in DRIVERS
                if admits(entry.nvidia_require_arch, arch=str(cc), driver=d)
            ),
            key=_version,
        )
        # DRIVERS holds every floor, so the lowest admitted one is the label's value exactly.
        assert _version(entry.min_driver) == _version(lowest), (entry.image_ref, lowest)


def test_shipped_cuda13_variants_need_r580() -> None:
    for entry in VARIANTS:
        if entry.cuda.major == 13:
            assert Version(entry.min_driver.split(".")[0]) >= Version("580"), entry.image_ref
