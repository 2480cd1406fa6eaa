"""The old runs' temporary folders are removed as pytest would remove them, only not
while the run waits (tests/old_basetemps.py)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _pytest.pathlib import cleanup_candidates  # the oracle: pytest's own choice

from tests.conftest import REPO
from tests.old_basetemps import _doomed

# a project's conftest.py that does what tests/conftest.py does
CONFTEST = (
    "import pytest\n"
    "from tests.old_basetemps import remove_in_background\n\n"
    "@pytest.hookimpl(tryfirst=True)\n"
    "def pytest_sessionfinish(session):\n"
    "    remove_in_background(session.config)\n"
)


def _project(folder: Path) -> Path:
    """A project whose conftest.py removes as tests/conftest.py does, with one test
    that writes 50 files into its tmp_path."""
    folder.mkdir()
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "test_write.py").write_text(
        "def test_write(tmp_path):\n"
        "    for i in range(50):\n"
        "        (tmp_path / str(i)).write_text('x')\n"
    )
    return folder


def _pytest(project: Path, env: dict[str, str], *args: str) -> None:
    """One pytest run of ``project``, with buildmatrix's tests importable."""
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *args],
        cwd=project, env=env | {"PYTHONPATH": str(REPO)}, check=True, capture_output=True,
    )  # fmt: skip


def test_the_folders_moved_aside_are_those_pytest_would_remove(tmp_path: Path) -> None:
    """Random sets of numbered folders, some locked, a few other names among them:
    the folders chosen are pytest's numbered candidates less the locked ones."""
    rng = random.Random(7)
    for case in range(200):
        root = tmp_path / str(case)
        root.mkdir()
        numbers = rng.sample(range(40), rng.randint(0, 8))
        locked = set(rng.sample(numbers, min(len(numbers), rng.randint(0, 2))))
        for n in numbers:
            (root / f"pytest-{n}").mkdir()
            if n in locked:
                (root / f"pytest-{n}" / ".lock").touch()
        (root / "pytest-current").symlink_to(root / "nowhere")
        elsewhere = tmp_path / f"{case}-elsewhere"
        elsewhere.mkdir()
        linked = rng.choice([n for n in range(40) if n not in numbers])
        (root / f"pytest-{linked}").symlink_to(elsewhere)  # pytest never removes a link
        (root / "pytest-x1").mkdir()
        (root / "removing-old").mkdir()
        keep = rng.randint(0, 4)
        # numbered ones only: the others (pytest-x1 here) are left to pytest's cleanup
        pytests = sorted(
            (
                p
                for p in cleanup_candidates(root, "pytest-", keep)
                if p.name[7:].isdigit() and not p.is_symlink()
            ),
            key=lambda p: int(p.name.removeprefix("pytest-")),
        )
        want = [p for p in pytests if int(p.name.removeprefix("pytest-")) not in locked]
        assert _doomed(root, keep) == want, (numbers, locked, keep)


def test_the_oldest_runs_folder_is_moved_aside_and_removed_by_another_process(
    tmp_path: Path,
) -> None:
    """Four runs of pytest, each with a test that writes into its tmp_path, with a
    ``nice`` on PATH that records what it is asked to run, then runs it: the first
    run's folder is moved aside and handed to it, and when that removal has ended the
    last three runs' folders are there, as pytest keeps them, and nothing else."""
    project = _project(tmp_path / "project")
    tools, temproot, log = tmp_path / "tools", tmp_path / "temproot", tmp_path / "nice.log"
    tools.mkdir()
    temproot.mkdir()
    (tools / "nice").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log}\nshift 2\nexec "$@"\n')
    (tools / "nice").chmod(0o755)
    env = dict(os.environ) | {
        "PYTEST_DEBUG_TEMPROOT": str(temproot),
        "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
    }
    for _ in range(4):
        _pytest(project, env)
    (root,) = temproot.iterdir()
    asked = log.read_text()  # one call: nice's arguments, the script's lines among them
    assert asked.startswith("-n 19 ") and "from _pytest.pathlib import rm_rf" in asked
    assert asked.count("-n 19 ") == 1
    assert asked.rstrip("\n").rpartition(" ")[2].startswith(f"{root}/removing-")
    deadline = time.monotonic() + 60
    while any(root.glob("removing-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    names = sorted(p.name for p in root.iterdir() if not p.is_symlink())
    assert names == ["pytest-1", "pytest-2", "pytest-3"]
    assert all((root / n / "test_write0" / "49").is_file() for n in names)


def test_a_folder_that_cannot_be_looked_into_is_left_to_pytest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where looking for a folder's lock fails (a mode-000 folder, for a user who is not
    root), the folder is not chosen: pytest's ensure_deletable leaves it too (#7491)."""
    for n in range(5):
        (tmp_path / f"pytest-{n}").mkdir()
    real = Path.exists

    def exists(self: Path, *args: Any, **kwargs: Any) -> bool:
        if self == tmp_path / "pytest-0" / ".lock":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", exists)
    assert _doomed(tmp_path, 3) == [tmp_path / "pytest-1"]


def test_a_given_base_folder_leaves_its_neighbours_alone(tmp_path: Path) -> None:
    """With --basetemp the base folder is the user's: nothing beside it is touched,
    however it is named."""
    work = tmp_path / "work"
    for n in range(1, 5):
        (work / f"pytest-{n}").mkdir(parents=True)
        (work / f"pytest-{n}" / "mine").write_text("keep")
    _pytest(_project(tmp_path / "project"), dict(os.environ), f"--basetemp={work / 'pytest-7'}")
    assert sorted(p.name for p in work.iterdir()) == [f"pytest-{n}" for n in (1, 2, 3, 4, 7)]
    assert all((work / f"pytest-{n}" / "mine").read_text() == "keep" for n in range(1, 5))
