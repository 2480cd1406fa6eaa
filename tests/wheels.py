"""Real wheels from the package index, downloaded once and kept between runs.

The real-software tests (the corpus, NVIDIA's libraries, torch) judge the files of
pinned wheels. A wheel is fetched with ``pip download --no-deps`` the first time and
kept under ``$BUILDMATRIX_WHEEL_CACHE`` (default ``~/.cache/buildmatrix/wheels``), so
a second run, and CI on the same machine, reads it from disk; its members are
extracted once too, beside it. A test whose wheel cannot be had skips with pip's
reason. ``BUILDMATRIX_WHEEL_CACHE`` names another folder (a shared disk, a CI cache).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def cache_dir() -> Path:
    env = os.environ.get("BUILDMATRIX_WHEEL_CACHE", "").strip()
    root = Path(env) if env else Path.home() / ".cache" / "buildmatrix" / "wheels"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One process at a time per wheel (the suite's workers may ask for the same one)."""
    with path.open("a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _normal(name: str) -> str:
    return name.replace("-", "_").lower()


def wheel(name: str, version: str) -> Path:
    """The wheel ``name==version`` (any Linux x86_64 or pure build the index serves for
    this Python), from the cache or ``pip download``; skips the test where pip fails."""
    root = cache_dir() / f"{_normal(name)}-{version}"
    root.mkdir(exist_ok=True)
    with _locked(root / ".lock"):
        found = sorted(root.glob(f"{_normal(name)}-{version}-*.whl"), key=lambda p: p.name)
        if found:
            return found[0]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "--disable-pip-version-check",
                "-d",
                str(root),
                f"{name}=={version}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        found = sorted(root.glob("*.whl"), key=lambda p: p.name)
        if proc.returncode != 0 or not found:
            pytest.skip(
                f"{name}=={version} cannot be downloaded here: {proc.stderr.strip()[-300:]}"
            )
        return found[0]


def extracted(name: str, version: str) -> Path:
    """The folder holding the wheel's whole tree, extracted once beside the wheel (the
    folder is read-only to the tests by convention: copy what a test changes)."""
    whl = wheel(name, version)
    dest = whl.parent / "tree"
    with _locked(whl.parent / ".lock"):
        if not (dest / ".complete").exists():
            tmp = whl.parent / "tree.partial"
            if tmp.exists():
                subprocess.run(["rm", "-rf", str(tmp)], check=True)
            with zipfile.ZipFile(whl) as zf:
                zf.extractall(tmp)
            if dest.exists():
                subprocess.run(["rm", "-rf", str(dest)], check=True)
            tmp.rename(dest)
            (dest / ".complete").touch()
    return dest


def member(name: str, version: str, pattern: str) -> Path:
    """The one extracted file of the wheel whose path matches ``pattern`` (Path.match,
    e.g. ``nvidia/cublas/lib/libcublas.so.12`` or ``*/libnccl.so.2``)."""
    tree = extracted(name, version)
    hits = sorted(p for p in tree.rglob("*") if p.is_file() and p.match(pattern))
    assert hits, f"no {pattern} in {name}=={version}"
    return hits[0]
