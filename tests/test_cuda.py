from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from buildmatrix.cuda import (
    CudaFacts,
    DriverVersion,
    Toolkit,
    facts_from_data,
    load_cuda_facts,
    parse_cuda_version,
    parse_driver_version,
)
from buildmatrix.errors import InputError
from tests.conftest import REPO, CliRunner

NEWEST = REPO / "tests" / "fixtures" / "newest"


def test_driver_version_keeps_its_text_and_compares_numerically() -> None:
    v = parse_driver_version("535.104.05")
    assert str(v) == "535.104.05"
    assert parse_driver_version("570.26") < parse_driver_version("570.26.01")
    assert parse_driver_version("570.26") == parse_driver_version("570.26.0")
    assert parse_driver_version("525.60.13") > parse_driver_version("525.60.9")


@pytest.mark.parametrize("text", ["535", "R525", "535.104.05.1", "", "latest"])
def test_bad_driver_versions(text: str) -> None:
    with pytest.raises(InputError, match="not a driver version"):
        parse_driver_version(text)


@pytest.mark.parametrize("text", ["12", "12.4.1", "v12.4", "twelve"])
def test_bad_cuda_versions(text: str) -> None:
    with pytest.raises(InputError, match=r"MAJOR\.MINOR"):
        parse_cuda_version(text)


def test_verified_facts() -> None:
    """Values checked against NVIDIA's CUDA release notes (docs/compatibility.md)."""
    facts = load_cuda_facts()
    expected = {
        "12.0": ("525.60.13", "8.0"),
        "12.1": ("530.30.02", "8.1"),
        "12.2": ("535.54.03", "8.2"),
        "12.3": ("545.23.06", "8.3"),
        "12.4": ("550.54.14", "8.4"),
        "12.5": ("555.42.02", "8.5"),
        "12.6": ("560.28.03", "8.5"),
        "12.8": ("570.26", "8.7"),
        "12.9": ("575.51.03", "8.8"),
        "13.0": ("580.65.06", "9.0"),
    }
    for version, (driver, isa) in expected.items():
        tk = facts.toolkit(Version(version))
        assert tk is not None, version
        assert str(tk.driver) == driver
        assert tk.ptx_isa == Version(isa)
    assert str(facts.runtime_floor(11)) == "450.80.02"
    assert str(facts.runtime_floor(12)) == "525.60.13"
    assert str(facts.runtime_floor(13)) == "580.65.06"
    assert facts.runtime_floor(14) is None
    for sm, first in [("sm_80", "11.0"), ("sm_86", "11.1"), ("sm_89", "11.8"), ("sm_90", "11.8"),
                      ("sm_90a", "12.0"), ("sm_100", "12.8"), ("sm_120", "12.8"),
                      ("sm_103", "12.9"), ("sm_100f", "12.9")]:  # fmt: skip
        support = facts.arch_support(sm)
        assert support is not None
        assert support.first == Version(first), sm


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [
        ("535.104.05", "12.2"),
        ("535.54.03", "12.2"),
        ("535.54.02", "12.1"),
        ("525.60.13", "12.0"),
        ("470.82.01", "11.4"),
        ("590.44.01", "13.1"),
        ("616.00", "13.3"),  # newer than every bundled driver: the newest known, a lower bound
        ("440.33", None),
    ],
)
def test_driver_cuda(driver: str, cuda: str | None) -> None:
    got = load_cuda_facts().driver_cuda(parse_driver_version(driver))
    assert got == (Version(cuda) if cuda else None)


def _facts_data() -> dict[str, Any]:
    return {
        "toolkits": [
            {"version": "12.0", "driver": "525.60.13", "ptx_isa": "8.0"},
            {"version": "12.1", "driver": "530.30.02", "ptx_isa": "8.1"},
        ],
        "minor_version_compatibility": {"12": "525.60.13"},
        "architectures": {"sm_90": {"first": "11.8"}},
    }


def test_facts_order_is_checked() -> None:
    data = _facts_data()
    data["toolkits"].reverse()
    with pytest.raises(InputError, match="oldest first"):
        facts_from_data(data, source="cuda.yaml")


def test_facts_schema_is_checked() -> None:
    data = _facts_data()
    data["toolkits"][0]["drivr"] = "1.2"
    with pytest.raises(InputError, match=r"cuda\.yaml: key 'toolkits\[0\]': unknown key 'drivr'"):
        facts_from_data(data, source="cuda.yaml")


@pytest.mark.parametrize(
    ("fixture", "isa", "driver", "passes", "says"),
    [
        ("kernels_cuda133.ptx", "9.3", "610.43.02", True, ""),
        (
            "kernels_cuda133.ptx",
            "9.3",
            "610.43.01",
            False,
            "PTX ISA 9.3 needs CUDA 13.3, driver >= 610.43.02 to JIT",
        ),
        (
            "kernels_cuda135.ptx",
            "9.5",
            "616.00",
            False,
            "PTX ISA 9.5 is CUDA 13.5's, which ships no driver",
        ),
    ],
)
def test_ptx_of_the_newest_compilers(
    cli: CliRunner, fixture: str, isa: str, driver: str, passes: bool, says: str
) -> None:
    """PTX written by the 13.3 and 13.5 nvcc wheels: judged by its real driver floor."""
    path = NEWEST / fixture
    assert f"\n.version {isa}\n" in path.read_text()
    result = cli("check", str(path), "--sm", "10.0", "--driver", driver, "--json")
    assert result.code == (0 if passes else 1)
    assert says in " ".join(result.json()["problems"])
    assert "update buildmatrix's CUDA table" not in result.out


def _scan_driver_cuda(facts: CudaFacts, driver: DriverVersion) -> Version | None:
    """The definition: the last toolkit in the table whose driver is <= ``driver``."""
    best = None
    for tk in facts.toolkits:
        if tk.driver is not None and tk.driver <= driver:
            best = tk.version
    return best


def _scan_ptx_toolkit(facts: CudaFacts, isa: Version) -> Toolkit | None:
    """The definition: the first toolkit in the table whose PTX ISA is >= ``isa``."""
    return next((tk for tk in facts.toolkits if tk.ptx_isa >= isa), None)


def test_the_lookups_answer_as_the_definitions_on_the_shipped_table() -> None:
    """driver_cuda and ptx_toolkit bisect the table; every driver and ISA of the table,
    one below and one above each, and the ends, answer as a scan does."""
    facts = load_cuda_facts()
    drivers = {tk.driver for tk in facts.toolkits if tk.driver is not None}
    probes = set()
    for d in drivers:
        a, b, c = d.key
        probes |= {d, DriverVersion((a, b, c + 1), "x"), DriverVersion((a, b, c - 1), "x")}
    probes |= {DriverVersion((0, 0, 0), "0"), DriverVersion((999, 0, 0), "999")}
    for driver in sorted(probes):
        assert facts.driver_cuda(driver) == _scan_driver_cuda(facts, driver), driver
    isas = {tk.ptx_isa for tk in facts.toolkits}
    for isa in sorted(
        isas | {Version(f"{v.major}.{v.minor + 1}") for v in isas} | {Version("0.1")}
    ):
        assert facts.ptx_toolkit(isa) is _scan_ptx_toolkit(facts, isa), isa


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.one_of(st.none(), st.tuples(st.integers(0, 5), st.integers(0, 3))),
            st.tuples(st.integers(0, 5), st.integers(0, 3)),
        ),
        min_size=1,
        max_size=8,
    ),
    driver=st.tuples(st.integers(0, 6), st.integers(0, 4)),
    isa=st.tuples(st.integers(0, 6), st.integers(0, 4)),
)
def test_the_lookups_answer_as_the_definitions_on_any_table(
    rows: list[tuple[tuple[int, int] | None, tuple[int, int]]],
    driver: tuple[int, int],
    isa: tuple[int, int],
) -> None:
    """Tables in order (bisected) and out of order (made without facts_from_data,
    which refuses them: scanned) alike."""
    facts = CudaFacts(
        toolkits=tuple(
            Toolkit(
                version=Version(f"1.{n}"),
                driver=None if d is None else DriverVersion((d[0], d[1], 0), f"{d[0]}.{d[1]}"),
                ptx_isa=Version(f"{i[0]}.{i[1]}"),
            )
            for n, (d, i) in enumerate(rows)
        ),
        minor_compat={},
        architectures={},
    )
    probe = DriverVersion((driver[0], driver[1], 0), "probe")
    assert facts.driver_cuda(probe) == _scan_driver_cuda(facts, probe)
    wanted = Version(f"{isa[0]}.{isa[1]}")
    assert facts.ptx_toolkit(wanted) is _scan_ptx_toolkit(facts, wanted)
