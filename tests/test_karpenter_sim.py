"""tests/karpenter_sim.py against Karpenter's own test table: every entry of
``pkg/scheduling/requirement_test.go``'s "should intersect two requirements without
minValues" (kubernetes-sigs/karpenter at commit 22664681; the table and its
requirements copied unchanged to tests/fixtures/k8s/karpenter-requirement-intersections.go.txt),
the fourteen requirements over In, NotIn, Exists, DoesNotExist, Gt and Lt intersected
pairwise, each result as upstream expects it; and HasIntersection agrees with the
intersection being satisfiable, as Karpenter's faster path must."""

from __future__ import annotations

import re

from tests import karpenter_sim
from tests.conftest import REPO
from tests.karpenter_sim import Requirement

TABLE = REPO / "tests" / "fixtures" / "k8s" / "karpenter-requirement-intersections.go.txt"
_DEF = re.compile(r'^\s*(\w+) := NewRequirement\("key", corev1\.NodeSelectorOp(\w+)(.*)\)$')
_ENTRY = re.compile(r"^\s*Entry\(nil, (\w+), (\w+), (.+)\),$")
_LITERAL = re.compile(
    r'^&Requirement\{Key: "key", complement: (true|false)'
    r"(?:, gte: (\w+)\.gte)?(?:, lte: (\w+)\.lte)?, values: sets\.New(?:\[string\])?\((.*)\)\}$"
)


def _table() -> tuple[dict[str, Requirement], list[tuple[str, str, str]]]:
    named: dict[str, Requirement] = {}
    entries = []
    for line in TABLE.read_text().splitlines():
        if m := _DEF.match(line):
            values = re.findall(r'"([^"]*)"', m.group(3))
            named[m.group(1)] = karpenter_sim.requirement(m.group(2), values)
        elif m := _ENTRY.match(line):
            entries.append((m.group(1), m.group(2), m.group(3)))
    return named, entries


def _expected(text: str, named: dict[str, Requirement]) -> Requirement:
    if text in named:
        return named[text]
    m = _LITERAL.match(text)
    assert m is not None, text
    complement, gte_of, lte_of, values = m.groups()
    return Requirement(
        complement == "true",
        frozenset(re.findall(r'"([^"]*)"', values)),
        named[gte_of].gte if gte_of else None,
        named[lte_of].lte if lte_of else None,
    )


def test_every_intersection_of_karpenters_table() -> None:
    named, entries = _table()
    assert len(named) == 14
    assert len(entries) == 196  # 14 x 14
    for a, b, want in entries:
        got = karpenter_sim.intersection(named[a], named[b])
        assert got == _expected(want, named), (a, b, want)


def test_has_intersection_is_the_intersection_being_satisfiable() -> None:
    """requirement.go: HasIntersection is "a more efficient implementation of
    Intersection"; Karpenter's own use: an empty non-complement set (DoesNotExist) means
    none, unless both sides are DoesNotExist/NotIn (requirements.go Intersects)."""
    named, _ = _table()
    for a in named.values():
        for b in named.values():
            both = karpenter_sim.intersection(a, b)
            satisfiable = both.complement or bool(both.values)
            assert karpenter_sim.has_intersection(a, b) == satisfiable, (a, b)
