"""The temporary folders of earlier pytest runs, removed behind the tests' backs.

pytest keeps the base temporary folders of the last three runs
(``/tmp/pytest-of-USER/pytest-N``, ``tmp_path_retention_count``) and removes the older
ones when a run ends, before it returns (``_pytest.tmpdir.pytest_sessionfinish``). An
engine-free run leaves some 25,000 files there; on the development machine (ext4
mounted with ``discard``) removing one such folder takes 5-9 s, every run, after the
last test. So when a run that made its own base folder ends, the folders pytest is
about to remove are moved aside in the same file system (a rename, ``removing-UUID``
beside them, a name pytest's cleanup does not look at) and removed by a process of
the lowest CPU and I/O priority that the run does not wait for, with pytest's own
``rm_rf``. A folder whose lock file is there (a run still going, or one that died) or
that cannot be looked into is left to pytest, which knows when such a lock is dead; so
is everything where something fails. docs/development.md, "Forked node runs, and the
old runs' temporary folders".
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from _pytest.pathlib import create_cleanup_lock, rm_rf

_NUMBERED = re.compile(r"pytest-(\d+)")


def _doomed(root: Path, keep: int) -> list[Path]:
    """The numbered folders pytest's cleanup would remove (``cleanup_candidates``: a
    number at most the highest less ``keep``), less those with a lock file and those
    that cannot be looked into (pytest's ``ensure_deletable`` leaves both)."""
    numbered = {
        int(m[1]): p for p in root.iterdir() if (m := _NUMBERED.fullmatch(p.name)) and p.is_dir()
    }
    if not numbered:
        return []
    highest = max(numbered)
    doomed = []
    for n, path in sorted(numbered.items()):
        if n > highest - keep or path.is_symlink():
            continue
        try:
            if (path / ".lock").exists():
                continue
        except OSError:
            continue
        doomed.append(path)
    return doomed


# pytest's own removal (_pytest.pathlib.rm_rf: it makes read-only folders writable
# first), in a process of its own
_REMOVE = (
    "import pathlib, sys\n"
    "from _pytest.pathlib import rm_rf\n"
    "for path in sys.argv[1:]:\n"
    "    rm_rf(pathlib.Path(path))\n"
)


def remove_in_background(config: pytest.Config) -> None:
    """At the end of a run: move the folders pytest would now remove aside, and start
    their removal in a process of its own. Does nothing on a pytest-xdist worker, where
    the base folder was given (--basetemp), under a retention policy other than
    pytest's default, or where pytest's factory is not as this module knows it; any
    error leaves the rest to pytest's cleanup, which runs next."""
    if hasattr(config, "workerinput") or config.option.basetemp:
        return
    if config.getini("tmp_path_retention_policy") != "all":
        return
    factory = getattr(config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)
    if not isinstance(basetemp, Path):
        return
    with contextlib.suppress(OSError):
        _remove_in_background(basetemp.parent, int(config.getini("tmp_path_retention_count")))


def _remove_in_background(root: Path, keep: int) -> None:
    aside = []
    for path in _doomed(root, keep):
        target = root / f"removing-{uuid.uuid4()}"
        try:
            # as pytest's maybe_delete_a_numbered_dir: its lock first (O_EXCL), so that
            # no session can take the folder between the look above and the rename
            create_cleanup_lock(path)
            path.rename(target)
        except OSError:  # locked or taken meanwhile: left to pytest
            continue
        aside.append(target)
    aside += [p for p in root.glob("removing-*") if p not in aside]  # an earlier removal cut short
    if not aside:
        return
    command = [sys.executable, "-c", _REMOVE, *map(str, aside)]
    if shutil.which("ionice"):
        # idle I/O class; -t: run the command even where the class cannot be set
        command = ["ionice", "-c", "3", "-t", *command]
    if shutil.which("nice"):
        command = ["nice", "-n", "19", *command]
    # started by a shell that returns at once ("&"): the removal is nobody's child
    # here, so no Popen is left to warn that its process still runs
    try:
        subprocess.run(
            ["sh", "-c", '"$@" &', "sh", *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    except OSError:  # no shell to start it: removed here, as pytest would have
        for path in aside:
            rm_rf(path)
