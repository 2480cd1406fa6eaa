"""The node tests' ``buildmatrix`` runs are forked from a process that has imported it
(tests/forked_cli.py). Each run here is made both ways, forked and as a fresh
``python -m buildmatrix``, against the same stand-in libraries and files: the exit
status, standard output, standard error and every file the run writes are the same.
The runs cover each exit status (0 pass, 1 verdict fail, 2 bad input, 3 no NVML or
no registry), NVML through the stand-in library, CUDA module loads through the
stand-in libcuda, a feature file written, a run with no GPU library on the loader
path, and ``check`` of a folder and of an unreachable registry (the time-out tests'
runs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests import forked_cli
from tests.conftest import REPO, without_frames
from tests.standins import nvml_scenario, run_cli

NODES = REPO / "tests" / "fixtures" / "nodes"
BIN = REPO / "tests" / "fixtures" / "bin"
H100_535 = json.loads((NODES / "h100-535.json").read_text())
H100 = {"name": "NVIDIA H100 80GB HBM3", "cc": [9, 0], "load": "CUDA_SUCCESS"}


# the expiry a feature file carries is a day from the moment it is written
EXPIRY = re.compile(rb"expiry-time=[0-9TZ:-]+")


def _failing_field() -> dict[str, Any]:
    scenario = nvml_scenario(H100_535)
    scenario["gpus"][3]["ecc_uncorrected_volatile"] = "NVML_ERROR_UNKNOWN"
    return scenario


def _rootfs(folder: Path) -> str:
    (folder / "usr" / "lib").mkdir(parents=True)
    shutil.copy(BIN / "libsass_ptx.so", folder / "usr" / "lib")
    return f"dir:{folder}"


class Run(NamedTuple):
    args: list[str]  # {tmp}: the run's folder; {image}: a root folder with a library
    stand_ins: bool  # the stand-in libraries on the loader path
    nvml: Any  # the stand-in NVML's scenario
    cuda: Any  # the stand-in libcuda's scenario
    status: int


RUNS = {
    "record-pass": Run(
        ["smoke", "--record", "{tmp}/r.json", "--json"], True, nvml_scenario(H100_535), None, 0
    ),
    "record-fail": Run(["smoke", "--record", "{tmp}/r.json"], True, _failing_field(), None, 1),
    "no-nvml": Run(["smoke", "--json", "--nfd-file", "{tmp}/features"], False, None, None, 3),
    "bad-input": Run(["smoke", "--snapshot", "{tmp}/missing.json"], True, None, None, 2),
    "load-test": Run(
        ["smoke", "--snapshot", str(NODES / "h100-580.json"), "--image", "{image}", "--load-test"],
        True,
        None,
        {"devices": [H100, H100]},
        0,
    ),
    "check": Run(["check", "{image}", "--sm", "9.0", "--json"], False, None, None, 0),
    # port 1 on loopback: nothing listens, the connection is refused
    "unreachable-registry": Run(
        ["check", "docker://127.0.0.1:1/team/app:1", "--timeout", "5"], False, None, None, 3
    ),
}


@pytest.mark.parametrize("name", RUNS)
def test_a_forked_run_answers_as_a_fresh_process(
    standin_libs: Path, tmp_path: Path, name: str
) -> None:
    run = RUNS[name]
    answers = []
    for fresh in (True, False):
        # the same path for both runs (the messages name it), emptied in between
        tmp = tmp_path / "run"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        image = _rootfs(tmp / "rootfs")
        proc = run_cli(
            [a.format(tmp=tmp, image=image) for a in run.args],
            libs=standin_libs if run.stand_ins else None,
            tmp=tmp,
            nvml=run.nvml,
            cuda=run.cuda,
            fresh=fresh,
        )
        written = {
            str(p.relative_to(tmp)): EXPIRY.sub(b"expiry-time=(a day on)", p.read_bytes())
            for p in sorted(tmp.rglob("*"))
            if p.is_file() and "rootfs" not in p.parts
        }
        answers.append((proc.returncode, proc.stdout, proc.stderr, written))
    fresh_answer, forked_answer = answers
    assert fresh_answer[0] == run.status, fresh_answer[2]
    assert "Traceback" not in fresh_answer[2]
    assert forked_answer == fresh_answer


# How a process ends, from a package of its own (``python -m ending CASE``): the
# forked run ends as the interpreter does, and its output ends as a pipe's does.
ENDING = """\
import atexit, subprocess, sys, threading, time

case = sys.argv[1]
print("main", case, flush=True)
if case == "thread":  # a thread that is not a daemon, still working when main returns
    threading.Thread(target=lambda: (time.sleep(0.1), print("thread done"))).start()
elif case == "atexit":  # a handler that prints, one that fails
    atexit.register(lambda: print("atexit ran"))
    atexit.register(lambda: 1 / 0)
elif case == "helper":  # a process left running that holds stdout for a while
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2); print('helper')"])
elif case == "text":
    sys.exit("a message for exit")
elif case == "huge":
    sys.exit(2**70)
elif case == "raises":
    raise ValueError("not caught")
elif case == "sleep":  # longer than any run here waits
    time.sleep(60)
sys.exit(4)
"""


@pytest.fixture(scope="module")
def ending(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the package ``ending``, found by ``python -m`` from the working
    folder (sys.path[0]); no PYTHONPATH, so the runs share the tests' server."""
    folder = tmp_path_factory.mktemp("ending")
    (folder / "ending").mkdir()
    (folder / "ending" / "__main__.py").write_text(ENDING)
    return folder


@pytest.mark.parametrize("case", ["thread", "atexit", "helper", "text", "huge", "raises"])
def test_a_forked_run_ends_as_a_fresh_process_ends(ending: Path, case: str) -> None:
    env = dict(os.environ)
    fresh = subprocess.run(
        [sys.executable, "-m", "ending", case],
        env=env, cwd=ending, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    forked = forked_cli.run([case], env, cwd=ending, timeout=60, module="ending")
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert without_frames(forked.stderr) == without_frames(fresh.stderr)
    assert fresh.stdout.startswith(f"main {case}\n")


def test_a_run_cut_short_leaves_no_reply_for_the_next(ending: Path) -> None:
    """A run whose wait is cut short (here a time-out; a signal's handler alike) ends
    its server: the next run starts a new one and gets its own answer, not the
    earlier run's."""
    env = dict(os.environ)
    with pytest.raises(subprocess.TimeoutExpired) as cut:
        forked_cli.run(["sleep"], env, cwd=ending, timeout=0.3, module="ending")
    assert cut.value.output == "main sleep\n"  # what was read before the time-out
    after = forked_cli.run(["text"], env, cwd=ending, timeout=60, module="ending")
    assert (after.returncode, after.stdout) == (1, "main text\n")
    assert after.stderr == "a message for exit\n"


def test_a_working_folder_that_is_not_there_is_refused_as_subprocess_refuses_it(
    tmp_path: Path,
) -> None:
    gone = tmp_path / "gone"
    with pytest.raises(FileNotFoundError) as fresh:
        subprocess.run([sys.executable, "-c", "pass"], cwd=gone, check=False)
    with pytest.raises(FileNotFoundError) as forked:
        forked_cli.run(["--version"], dict(os.environ), cwd=gone, timeout=60)
    assert forked.value.filename == fresh.value.filename == gone
