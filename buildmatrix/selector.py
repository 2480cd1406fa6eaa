"""Node selector terms as data, rendered as and evaluated by Kubernetes' rules.

Pure. A term is a conjunction of one :class:`Constraint` per label key; a selector
is a list of terms, ORed. Kubernetes' ``nodeSelectorTerms`` are ORed and each term's
``matchExpressions`` ANDed, and ``Gt``/``Lt`` compare a label's value parsed as an
integer with one integer (k8s.io/component-helpers ``nodeaffinity``; the operators:
k8s.io/apimachinery ``labels/selector.go``, ``Requirement.Matches``), so an integer
range is one ``Gt`` and one ``Lt`` on one key. Conditions ANDed over ORs become the
cross product of their terms (:func:`cross`), with contradictory terms dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Constraint:
    """What one label must be: one of ``values`` (In), absent (DoesNotExist), or an
    integer in ``lo``..``hi`` (inclusive; None: unbounded)."""

    values: frozenset[str] | None = None
    absent: bool = False
    lo: int | None = None
    hi: int | None = None


Term = Mapping[str, Constraint]


def one_of(values: Iterable[str]) -> Constraint:
    return Constraint(values=frozenset(values))


def equal(value: int) -> Constraint:
    return Constraint(lo=value, hi=value)


ABSENT = Constraint(absent=True)


def _both(a: Constraint, b: Constraint) -> Constraint | None:
    """The conjunction of two constraints on one key; None when nothing meets both."""
    if a.absent or b.absent:
        return ABSENT if a.absent and b.absent else None
    if a.values is not None or b.values is not None:
        if a.values is None or b.values is None:
            raise ValueError("a key is constrained both by a set and a range")
        common = a.values & b.values
        return Constraint(values=common) if common else None
    lo = max((x for x in (a.lo, b.lo) if x is not None), default=None)
    hi = min((x for x in (a.hi, b.hi) if x is not None), default=None)
    if lo is not None and hi is not None and lo > hi:
        return None
    return Constraint(lo=lo, hi=hi)


def conj(*terms: Term) -> dict[str, Constraint] | None:
    """All the terms at once; None when they contradict each other."""
    out: dict[str, Constraint] = {}
    for term in terms:
        for key, c in term.items():
            merged = _both(out[key], c) if key in out else c
            if merged is None:
                return None
            out[key] = merged
    return out


def cross(*alternatives: Sequence[Term]) -> list[dict[str, Constraint]]:
    """AND of several ORs of terms, as one OR of terms (contradictions dropped)."""
    out: list[dict[str, Constraint]] = []
    for combo in itertools.product(*alternatives):
        term = conj(*combo)
        if term is not None and term not in out:
            out.append(term)
    return out


def render(term: Term) -> list[dict[str, Any]]:
    """One term as matchExpressions, in the order its keys were added."""
    exprs: list[dict[str, Any]] = []
    for key, c in term.items():
        if c.absent:
            exprs.append({"key": key, "operator": "DoesNotExist"})
        elif c.values is not None:
            exprs.append({"key": key, "operator": "In", "values": _sorted(c.values)})
        elif c.lo is not None and c.lo == c.hi:
            exprs.append({"key": key, "operator": "In", "values": [str(c.lo)]})
        else:
            if c.lo is not None:
                exprs.append({"key": key, "operator": "Gt", "values": [str(c.lo - 1)]})
            if c.hi is not None:
                exprs.append({"key": key, "operator": "Lt", "values": [str(c.hi + 1)]})
    return exprs


def _sorted(values: Iterable[str]) -> list[str]:
    def key(v: str) -> tuple[tuple[int, ...], str]:
        try:
            return tuple(int(x) for x in v.split(".")), ""
        except ValueError:
            return (), v

    return sorted(values, key=key)
