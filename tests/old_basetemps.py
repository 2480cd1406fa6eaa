"""The temporary folders of earlier pytest runs, removed behind the tests' backs.

pytest keeps the base temporary folders of the last three runs
(``/tmp/pytest-of-USER/pytest-N``, ``tmp_path_retention_count``) and removes the older
ones when a run ends, before it returns (``_pytest.tmpdir.pytest_sessionfinish``). An
engine-free run leaves some 25,000 files there; on the development machine (ext4
mounted with ``discard``) removing one such folder takes 5-9 s, every run, after the
last test. So when a run that made its own base folder ends, the folders pytest is
about to remove are moved aside in the same file system (a rename, ``removing-UUID``
beside them, a name pytest's cleanup does not look at) and removed by a process of
the lowest CPU and I/O priority that the run does not wait for. A folder whose lock
file is there (a run still going, or one that died) is left to pytest, which knows
when such a lock is dead. docs/development.md, "The old runs' temporary folders".
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

_NUMBERED = re.compile(r"pytest-(\d+)")


def _doomed(root: Path, keep: int) -> list[Path]:
    """The numbered folders pytest's cleanup would remove (``cleanup_candidates``: a
    number at most the highest less ``keep``), less those with a lock file."""
    numbered = {
        int(m[1]): p for p in root.iterdir() if (m := _NUMBERED.fullmatch(p.name)) and p.is_dir()
    }
    if not numbered:
        return []
    highest = max(numbered)
    return [
        p
        for n, p in sorted(numbered.items())
        if n <= highest - keep and not (p / ".lock").exists() and not p.is_symlink()
    ]


def remove_in_background(config: pytest.Config) -> None:
    """At the end of a run: move the folders pytest would now remove aside, and start
    their removal in a process of its own. Does nothing on a pytest-xdist worker, where
    the base folder was given (--basetemp), under a retention policy other than
    pytest's default, or where pytest's factory is not as this module knows it."""
    if hasattr(config, "workerinput") or config.option.basetemp:
        return
    if config.getini("tmp_path_retention_policy") != "all":
        return
    factory = getattr(config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)
    if not isinstance(basetemp, Path):
        return
    root = basetemp.parent
    aside = []
    for path in _doomed(root, int(config.getini("tmp_path_retention_count"))):
        target = root / f"removing-{uuid.uuid4()}"
        try:
            path.rename(target)
        except OSError:  # another run's cleanup took it first
            continue
        aside.append(target)
    aside += [p for p in root.glob("removing-*") if p not in aside]  # an earlier removal cut short
    if not aside:
        return
    command = ["rm", "-rf", "--", *map(str, aside)]
    if shutil.which("ionice"):
        command = ["ionice", "-c", "3", *command]  # idle: only when no one else reads
    if shutil.which("nice"):
        command = ["nice", "-n", "19", *command]
    try:
        subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not a child pytest waits for or signals
        )
    except OSError:  # no rm to start: removed here, as pytest would have
        for path in aside:
            shutil.rmtree(path, ignore_errors=True)
