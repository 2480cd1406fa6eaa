"""The order a parallel run hands the modules out in (tests/conftest.py, SLOWEST)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.conftest import SLOWEST, _slowest_first

TESTS = Path(__file__).parent


def test_every_module_named_is_a_test_module_here() -> None:
    assert sorted(n for n in SLOWEST if not (TESTS / n).is_file()) == []


def test_modules_go_slowest_first_each_whole_and_in_its_order() -> None:
    names = ["test_a.py", "test_workflow.py", "test_b.py", "test_fuzz.py"]
    items: list[Any] = [SimpleNamespace(path=TESTS / n, n=i) for n in names for i in range(3)]
    _slowest_first(items)
    got = [(i.path.name, i.n) for i in items]
    assert got == [
        (n, i)
        for n in ["test_workflow.py", "test_fuzz.py", "test_a.py", "test_b.py"]
        for i in range(3)
    ]
