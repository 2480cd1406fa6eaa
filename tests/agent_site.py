"""buildmatrix as the DaemonSet's non-root agent user can import it, wherever the
checkout lies.

Tests that run ``python -m buildmatrix`` as that user (``setpriv --reuid 65532``) cannot
import the package from the checkout or its ``.venv`` when either sits under a folder
other users cannot enter (a clone under ``mktemp -d``'s 0700 folder, a 0700 home, a
pyenv interpreter under ``/root``). :func:`stage` copies the package, the profiles and
the installed distributions it needs at run time (its requirements, without extras,
and theirs, from their own metadata) into a folder open to every user, and
:func:`interpreters` lists the Pythons of this version such a user may run.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

DISTRIBUTION = "buildmatrix-gpu"


def _runtime_closure(name: str) -> Iterator[str]:
    """The installed distributions ``name`` needs at run time on this Python (no
    extras, environment markers evaluated), ``name`` left out."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        try:
            requires = distribution(todo.pop()).requires or []
        except PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            dep = canonicalize_name(req.name)
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
                yield dep


def _open_to_all(root: Path) -> None:
    """Folders 0755, files 0644 (0755 where executable), so any user reads them."""
    for folder, dirs, files in os.walk(root):
        Path(folder).chmod(0o755)
        for f in files:
            p = Path(folder, f)
            mode = p.stat().st_mode
            p.chmod(0o755 if mode & stat.S_IXUSR else 0o644)
        for d in dirs:
            Path(folder, d).chmod(0o755)


def stage(dest: Path) -> str:
    """Copy buildmatrix, ``arch-profiles/`` and the run-time distributions under
    ``dest`` (made open to all users, as are its parents' search bits checked by the
    caller) and return the ``PYTHONPATH`` that imports them."""
    site = dest / "site"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "buildmatrix", site / "buildmatrix", ignore=ignore)
    # profile_files falls back to the folder beside the package in a source tree
    shutil.copytree(REPO / "arch-profiles", site / "arch-profiles")
    for name in _runtime_closure(DISTRIBUTION):
        dist = distribution(name)
        for rel in dist.files or []:
            src = Path(str(dist.locate_file(rel)))
            if "__pycache__" in rel.parts or not src.is_file():
                continue
            if ".." in rel.parts:  # a console script installed outside site-packages
                continue
            target = site / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    _open_to_all(dest)
    dest.chmod(0o755)
    return str(site)


def interpreters() -> list[str]:
    """This Python (its real file, not the virtual environment's link) and the
    system's python3 of the same version: one of them the agent user may run."""
    found = [os.path.realpath(sys.executable)]
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if system:
        found.append(system)
    return list(dict.fromkeys(found))
