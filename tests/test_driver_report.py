"""The fleet report of ``buildmatrix drivers``: HTML in a real headless browser,
Markdown for ``$GITHUB_STEP_SUMMARY``.

The browser is Debian's ``chromium`` (scripts/test installs it); where it is absent
the browser tests are skipped with the reason. The page is loaded from a file with
``--dump-dom`` (what the browser built, not the text we wrote) and ``--screenshot``,
and Chromium's own log (``--enable-logging=stderr``) is read for console messages.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliRunner
from tests.driver_fleet import Fleet, build_fleet

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/test installs it)"
)
PROPOSAL = ("--driver", "training-hopper=570.172.08", "--driver", "general=580.82.07")
_RANK = {"fails": 0, "jit": 1, "native": 2}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    return build_fleet(tmp_path_factory.mktemp("fleet"))


def _browser(*args: str, page: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", *args, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip


def _console(log: str) -> list[str]:
    """Chromium's log lines for the page's console (``INFO:CONSOLE``, ``ERROR:CONSOLE``)."""
    return [line for line in log.splitlines() if ":CONSOLE" in line]


class Cells(HTMLParser):
    """(pool, image) -> data-state of each matrix cell in the DOM the browser built."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str], str] = {}
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "td" and "data-state" in a:
            self.cells[(a["data-pool"] or "", a["data-image"] or "")] = a["data-state"] or ""
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]


def _expected(doc: dict[str, Any]) -> dict[tuple[str, str], str]:
    """The worst state over a pool's models per image, from the JSON report."""
    out: dict[tuple[str, str], str] = {}
    for pool in doc["pools"]:
        for c in pool["cells"]:
            key = (pool["name"], c["image"])
            if key not in out or _RANK[c["state"]] < _RANK[out[key]]:
                out[key] = c["state"]
    return out


@pytest.mark.integration  # a real browser
@needs_browser
def test_the_console_check_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "noisy.html"
    page.write_text("<html><body><script>console.error('boom')</script></body></html>")
    assert _console(_browser("--dump-dom", page=page).stderr)


@pytest.mark.integration  # a real browser
@needs_browser
def test_the_html_report_renders_the_matrix(cli: CliRunner, fleet: Fleet, tmp_path: Path) -> None:
    r = cli("drivers", "--pools", str(fleet.pools), *PROPOSAL, "--format", "json")
    assert r.code == 1  # R570 on the hopper pool breaks its CUDA 13 images
    expected = _expected(r.json())
    r = cli("drivers", "--pools", str(fleet.pools), *PROPOSAL, "--format", "html")
    assert r.code == 1
    page = tmp_path / "report.html"
    page.write_text(r.out)
    shown = _browser("--dump-dom", page=page)
    assert _console(shown.stderr) == []
    dom = Cells()
    dom.feed(shown.stdout)
    assert dom.cells == expected
    assert dom.urls == []  # self-contained: nothing to fetch
    assert "fails" in dom.cells.values() and "native" in dom.cells.values()
    assert dom.cells[("training-hopper", fleet.refs["multi"])] == "fails"
    assert dom.cells[("training-ampere", fleet.refs["ampere-sass"])] == "native"
    assert dom.cells[("training-blackwell", fleet.refs["ptx-only"])] == "jit"
    shot = tmp_path / "report.png"  # kept in the test's tmp folder as its artefact
    _browser("--screenshot=" + str(shot), "--window-size=1400,640", "--hide-scrollbars", page=page)
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1400, 640)


def test_the_markdown_report(cli: CliRunner, fleet: Fleet) -> None:
    r = cli("drivers", "--pools", str(fleet.pools), *PROPOSAL, "--format", "markdown")
    assert r.code == 1
    lines = r.out.splitlines()
    assert lines[0] == "## GPU driver policy: **fail**"
    header = next(line for line in lines if line.startswith("| pool |"))
    assert header.count("|") == 4 + len(fleet.refs)
    hopper = next(line for line in lines if line.startswith("| **training-hopper**"))
    assert "570.172.08" in hopper and "| 580.65.06 |" in hopper
    assert "❌ fails" in hopper
    assert "- **general**: 520.61.05, set by" in r.out
