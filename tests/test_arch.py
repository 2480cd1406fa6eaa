from __future__ import annotations

import pytest

from buildmatrix.arch import (
    Arch,
    CodeKind,
    ComputeCapability,
    Family,
    Suffix,
    gfd_family,
    parse_arch,
    parse_cc,
    parse_sm,
)
from buildmatrix.errors import InputError

CC = ComputeCapability


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sm_80", Arch(CC(8, 0), CodeKind.SASS)),
        ("sm_90a", Arch(CC(9, 0), CodeKind.SASS, Suffix.ARCH)),
        ("sm_100f", Arch(CC(10, 0), CodeKind.SASS, Suffix.FAMILY)),
        ("compute_103f", Arch(CC(10, 3), CodeKind.PTX, Suffix.FAMILY)),
        ("compute_120", Arch(CC(12, 0), CodeKind.PTX)),
    ],
)
def test_parse_arch_round_trips(text: str, expected: Arch) -> None:
    assert parse_arch(text) == expected
    assert str(parse_arch(text)) == text


@pytest.mark.parametrize("text", ["sm90", "sm_9", "sm_90b", "compute_", "gfx90a", "sm_0900", ""])
def test_parse_arch_rejects(text: str) -> None:
    with pytest.raises(InputError, match="not a GPU arch name"):
        parse_arch(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sm_90", "sm_90"),
        ("sm_90a", "sm_90a"),
        ("9.0", "sm_90"),
        ("90", "sm_90"),
        ("100f", "sm_100f"),
        ("10.3", "sm_103"),
        (" 12.0 ", "sm_120"),
    ],
)
def test_parse_sm_accepts_every_documented_form(text: str, expected: str) -> None:
    assert str(parse_sm(text)) == expected


@pytest.mark.parametrize("text", ["hopper", "9", "9.0.1", "compute_90", "sm-90", "x"])
def test_parse_sm_rejects(text: str) -> None:
    with pytest.raises(InputError):
        parse_sm(text)


def test_parse_cc() -> None:
    assert parse_cc("10.3") == CC(10, 3)
    assert CC(10, 3).number == 103
    assert CC.from_number(121) == CC(12, 1)
    with pytest.raises(InputError, match=r"MAJOR\.MINOR"):
        parse_cc("90")


# GPU Feature Discovery's getArchFamily, case by case.
@pytest.mark.parametrize(
    ("cc", "family"),
    [
        (CC(7, 0), Family.VOLTA),
        (CC(7, 2), Family.VOLTA),
        (CC(7, 5), Family.TURING),
        (CC(8, 0), Family.AMPERE),
        (CC(8, 6), Family.AMPERE),
        (CC(8, 7), Family.AMPERE),
        (CC(8, 9), Family.ADA_LOVELACE),
        (CC(9, 0), Family.HOPPER),
        (CC(10, 0), Family.BLACKWELL),
        (CC(10, 3), Family.BLACKWELL),
        (CC(12, 0), Family.BLACKWELL),
        (CC(11, 0), Family.UNDEFINED),
        (CC(13, 0), Family.RUBIN),
        (CC(14, 0), Family.UNDEFINED),
    ],
)
def test_gfd_family(cc: ComputeCapability, family: Family) -> None:
    assert gfd_family(cc) == family


# GPU Feature Discovery v0.20.0, internal/lm/resource.go getArchFamily, transcribed as
# its switch reads: one row per `case` on the compute major; within 7 and 8 the
# minor splits (`computeMinor < 5` volta, `< 9` ampere); every other major falls
# through to "undefined".
GFD_GET_ARCH_FAMILY: dict[int, str | tuple[int, str, str]] = {
    1: "tesla",
    2: "fermi",
    3: "kepler",
    5: "maxwell",
    6: "pascal",
    7: (5, "volta", "turing"),
    8: (9, "ampere", "ada-lovelace"),
    9: "hopper",
    10: "blackwell",
    12: "blackwell",
    13: "rubin",
}


def test_gfd_family_is_getarchfamily_on_every_compute_capability() -> None:
    """Every CC a profile can name (majors 1-99, minors 0-9) against GFD's table."""
    for major in range(1, 100):
        row = GFD_GET_ARCH_FAMILY.get(major, "undefined")
        for minor in range(10):
            if isinstance(row, tuple):
                split, below, above = row
                want = below if minor < split else above
            else:
                want = row
            assert gfd_family(CC(major, minor)).value == want, (major, minor)


def test_every_family_gfd_names_is_a_family_profiles_may_declare() -> None:
    import json

    from tests.conftest import REPO

    schema = json.loads((REPO / "buildmatrix" / "schemas" / "arch-profile.schema.json").read_text())
    declared = set(schema["properties"]["family"]["enum"])
    gfd = {"undefined"}
    for row in GFD_GET_ARCH_FAMILY.values():
        gfd |= {row} if isinstance(row, str) else {row[1], row[2]}
    assert gfd == {f.value for f in Family} == declared
