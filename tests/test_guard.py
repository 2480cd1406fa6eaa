"""benchmarks/guard.py's decisions, on given times (the guard's measurements are its own
run in .ci/run; no test here depends on timing)."""

from __future__ import annotations

import pytest

from benchmarks.guard import LIMIT, PATHS, Price, judge, read_prices
from tests.conftest import REPO


@pytest.mark.parametrize("ratio", [0.5, 1.0, 1.24, 1.25, 1.26, 2.0])
def test_a_path_may_be_a_quarter_slower_without_a_price(ratio: float) -> None:
    (o,) = judge({"archive": (2.0, 2.0 * ratio)}, [])
    assert o.ok is (ratio <= LIMIT)


def test_a_stated_price_allows_its_cost_on_its_path_only() -> None:
    price = Price(path="archive", cost=1.6, reason="layers read to their end")
    outcomes = {o.path: o for o in judge({"archive": (1.0, 1.7), "oci": (1.0, 1.7)}, [price])}
    assert outcomes["archive"].ok and outcomes["archive"].priced_by == (price.reason,)
    assert not outcomes["oci"].ok  # the price names another path
    (over,) = judge({"archive": (1.0, 1.6 * 1.1 + 0.01)}, [price])
    assert not over.ok  # a price is no blank cheque: its cost, and a tenth for noise


def test_a_path_the_base_cannot_run_is_not_compared() -> None:
    (o,) = judge({"inspect": (None, 9.0)}, [])
    assert o.ok and o.ratio is None


def test_the_shipped_prices_file_reads() -> None:
    prices = read_prices((REPO / "benchmarks" / "prices.yaml").read_text(), source="prices.yaml")
    assert all(p.path in PATHS for p in prices)


@pytest.mark.parametrize(
    "text",
    [
        "prices: [{path: archive, cost: 1.3}]",  # no reason
        "prices: [{path: disk, cost: 1.3, reason: why}]",  # no such path
        "prices: [{path: oci, cost: fast, reason: why}]",
        "prices: [{path: oci, cost: 0, reason: why}]",
        "prices: [{path: oci, cost: 1.2, reason: '  '}]",
    ],
)
def test_a_price_without_path_cost_or_reason_is_refused(text: str) -> None:
    with pytest.raises(SystemExit, match="prices"):
        read_prices(text, source="prices.yaml")
