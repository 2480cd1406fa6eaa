"""buildmatrix.binary.walk: the one folder walk, held to Python's own os.walk
(followlinks=False) on trees of files, folders and links, and to its order."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from buildmatrix.binary.walk import walk


def _tree(root: Path, seed: int) -> None:
    """A random tree: nested folders, files, links to files and to folders (inside
    and outside the tree), and a dangling link."""
    rng = random.Random(seed)
    folders = [root]
    for i in range(40):
        parent = rng.choice(folders)
        kind = rng.choice(["dir", "file", "file", "link"])
        path = parent / f"{rng.choice('abcXYZ_.')}{i}"
        if kind == "dir":
            path.mkdir()
            folders.append(path)
        elif kind == "file":
            path.write_bytes(b"x" * i)
        else:
            path.symlink_to(rng.choice([*folders, root.parent, root / "missing"]))


def _parent(rel: str) -> str:
    return rel.rpartition("/")[0]


def _name(rel: str) -> str:
    return rel.rpartition("/")[2]


def _oracle(root: Path) -> set[str]:
    found = set()
    for folder, dirs, files in os.walk(root, followlinks=False):
        rel = os.path.relpath(folder, root)
        for name in dirs + files:
            found.add(name if rel == "." else f"{rel}/{name}")
    return found


@pytest.mark.parametrize("seed", range(20))
def test_walk_finds_what_os_walk_finds_in_order(tmp_path: Path, seed: int) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _tree(root, seed)
    walked = list(walk(root))
    rels = [rel for _, rel, _ in walked]
    assert len(rels) == len(set(rels))  # each entry once
    assert set(rels) == _oracle(root)
    for full, rel, entry in walked:
        assert not isinstance(entry, OSError)
        assert full == str(root / rel) == entry.path
    # Each folder's entries sorted by name and all of them before any entry deeper
    # down that folder; a link to a folder is not entered.
    for i, rel in enumerate(rels):
        parent = _parent(rel)
        later_siblings = [r for r in rels[i + 1 :] if _parent(r) == parent]
        assert all(_name(r) > _name(rel) for r in later_siblings)
        below = [j for j, r in enumerate(rels) if r.startswith(rel + "/")]
        if below:
            assert (root / rel).is_dir() and not (root / rel).is_symlink()
            last_sibling = max((j for j, r in enumerate(rels) if _parent(r) == parent), default=i)
            assert min(below) > last_sibling


def test_an_unlisted_folder_is_reported_in_place_of_its_entries(tmp_path: Path) -> None:
    """A folder that goes between its parent's listing and its own (as root, no
    permission bits stop a listing) is an error in its place; the walk goes on."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "gone").write_bytes(b"")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "kept").write_bytes(b"")
    walked = []
    for full, rel, entry in walk(tmp_path):
        walked.append((rel, entry if isinstance(entry, OSError) else None))
        if rel == "a" and not isinstance(entry, OSError):
            shutil.rmtree(full)
    assert [rel for rel, _ in walked] == ["a", "b", "a", "b/kept"]
    assert isinstance(walked[2][1], FileNotFoundError)


def test_an_unlisted_root_is_reported(tmp_path: Path) -> None:
    ((full, rel, error),) = list(walk(tmp_path / "missing"))
    assert (full, rel) == (str(tmp_path / "missing"), "")
    assert isinstance(error, FileNotFoundError)
