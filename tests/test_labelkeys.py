"""labelkeys: the driver ordinal sorts as the versions do, and the keys' owners.

The oracle for the order is ``packaging.version.Version`` (PEP 440 release segments
compare as integer tuples, a missing trailing part being 0: ``570.86 == 570.86.0``),
checked over a generated set of versions with every field width NVIDIA's drivers use
(a minor of one to three digits, a revision of none, one or two digits with its
leading zero, and the edges 0 and 999), as text NVML would print it.
"""

from __future__ import annotations

import itertools

from packaging.version import Version

from buildmatrix.cuda import parse_driver_version
from buildmatrix.labelkeys import (
    COMPUTE_CAPABILITY,
    DRIVER_VERSION,
    LEGACY,
    MEMORY_MB,
    SEED_KEYS,
    driver_ordinal,
    driver_ordinal_at_least,
    owned,
)

MAJORS = ("0", "1", "99", "390", "450", "470", "525", "535", "570", "580", "999", "1000")
MINORS = ("0", "00", "1", "9", "10", "65", "86", "99", "100", "104", "256", "999")
REVISIONS = (None, "0", "00", "01", "02", "05", "06", "1", "9", "10", "99", "100", "999")


def _versions() -> list[str]:
    out = []
    for major, minor, revision in itertools.product(MAJORS, MINORS, REVISIONS):
        out.append(f"{major}.{minor}" if revision is None else f"{major}.{minor}.{revision}")
    return out


def _ordinal(text: str) -> int:
    value = driver_ordinal(parse_driver_version(text).key)
    assert value is not None, text
    return value


def test_the_ordinal_sorts_every_generated_version_as_packaging_does() -> None:
    """Sorted by ordinal and sorted by Version give the same sequence, and two
    versions have one ordinal iff Version calls them equal (570.86 and 570.86.0)."""
    versions = _versions()
    assert len(versions) == 1872
    by_version = sorted(versions, key=Version)
    by_ordinal = sorted(versions, key=_ordinal)
    assert [Version(v) for v in by_ordinal] == [Version(v) for v in by_version]
    groups: dict[int, set[Version]] = {}
    for v in versions:
        groups.setdefault(_ordinal(v), set()).add(Version(v))
    assert all(len(g) == 1 for g in groups.values())
    assert len(groups) == len({Version(v) for v in versions})


def test_the_ordinal_fits_kubernetes_gt_and_a_label_value() -> None:
    """Gt/Lt parse the label with strconv.ParseInt(v, 10, 64) (k8s.io/apimachinery
    labels/selector.go, Requirement.Matches); a label value is at most 63 characters."""
    for v in _versions():
        value = _ordinal(v)
        assert 0 <= value < 2**63
        assert len(str(value)) <= 63
    assert _ordinal("580.65.06") == 580_065_006
    assert _ordinal("570.86") == 570_086_000
    assert _ordinal("535.104.05") == 535_104_005


def test_a_field_of_four_digits_has_no_ordinal_and_bounds_round_up() -> None:
    """No NVIDIA driver has one; such a node is labelled without the ordinal (no term
    matches it), and a bound past the widths is the next version that has one."""
    assert driver_ordinal((580, 1000, 0)) is None
    assert driver_ordinal((580, 65, 1000)) is None
    for bound in ((580, 65, 1000), (580, 999, 1000), (580, 1000, 5), (580, 65, 6)):
        low = driver_ordinal_at_least(bound)
        for v in _versions():
            key = parse_driver_version(v).key
            assert (key >= bound) == (_ordinal(v) >= low), (v, bound)


def test_affinitys_keys_are_buildmatrixs_own_and_the_seeds_stay_owned() -> None:
    """The keys affinity reads sit under buildmatrix.io/; the seed's nvidia.com/ names
    are still owned (smoke writes them for the transition and may remove them)."""
    for key in (COMPUTE_CAPABILITY, MEMORY_MB, DRIVER_VERSION):
        assert key.startswith("buildmatrix.io/")
        assert owned(key, gfd_keys=False)
    assert set(LEGACY.values()) == set(SEED_KEYS)
    for key in SEED_KEYS:
        assert key.startswith("nvidia.com/")
        assert owned(key, gfd_keys=False)
