"""``python -m buildmatrix`` in a new process, forked from one that has imported it.

The node tests run ``buildmatrix`` in a new process whose loader sees only the stand-in
GPU libraries (tests/standins): ``run_cli``, some fifty runs a suite. Most of such a
run's CPU (~0.2 s) is Python starting and importing click, PyYAML, jsonschema, the
NVML bindings and the Kubernetes client; the work under test is a few hundredths.

So one server process per loader path (``LD_LIBRARY_PATH``, which glibc reads only
when a process starts) imports those modules and nothing else: it calls no NVML or
CUDA function and loads no GPU library (nvidia-ml-py opens libnvidia-ml at
``nvmlInit``, buildmatrix opens libcuda where it loads modules). For each run it forks
a child that takes the run's environment, working directory, arguments and standard
streams (stdin /dev/null, stdout and stderr to files), runs ``buildmatrix/__main__.py``
as ``python -m buildmatrix`` does, and exits with the status Python would exit with
(``SystemExit`` as the interpreter reads it; an uncaught exception: its traceback and
1). The child loads the GPU libraries itself, after the fork, as a fresh process does.

tests/test_node_probe.py ``test_a_forked_run_answers_as_a_fresh_process`` holds the two
to the same exit status, output and written files.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What a node run (``smoke``, ``--record``, ``--apply``, ``--load-test``) and a check of
# a registry's image import: module imports only, none of which loads a library,
# reads the environment or starts a thread.
WARM = (
    "buildmatrix.cli",
    "buildmatrix.cli.node_cmd",
    "buildmatrix.cli.check_cmd",
    "buildmatrix.check",
    "buildmatrix.node.admit",
    "buildmatrix.node.probe",
    "buildmatrix.node.apply",
    "buildmatrix.snapshot",
    "buildmatrix.image.registry",
    "oras.provider",
    "pynvml",
    "jsonschema",
    "yaml",
    "kubernetes.client",
    "kubernetes.config",
)

_SERVER = r"""
import importlib, json, os, runpy, sys, traceback

for name in sys.argv[1:]:
    importlib.import_module(name)
replies = os.dup(1)
requests = sys.stdin.buffer


def exit_status(exc):
    # as the interpreter reads a SystemExit (Python/pythonrun.c, handle_system_exit)
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def child(req):
    os.close(replies)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    sys.path[0] = os.getcwd()  # as python -m sets it (here: -c, "")
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = ["buildmatrix", *req["args"]]
    try:
        runpy.run_module("buildmatrix", run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = status or 120  # as Py_FinalizeEx does where flushing fails
    os._exit(status)


while chunk := requests.readline():
    req = json.loads(chunk)
    pid = os.fork()
    if pid == 0:
        child(req)
    _, status = os.waitpid(pid, 0)
    os.write(replies, (json.dumps(os.waitstatus_to_exitcode(status)) + "\n").encode())
"""


class _Server:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, *WARM],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=REPO,
            start_new_session=True,  # its children are killed with it (close)
        )

    def run(
        self, args: list[str], env: dict[str, str], cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with tempfile.TemporaryDirectory(prefix="forked-cli-") as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            request = {"args": args, "env": env, "cwd": str(cwd), "out": str(out), "err": str(err)}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            if not ready:
                self.close()
                raise subprocess.TimeoutExpired(["buildmatrix", *args], timeout)
            reply = self.proc.stdout.readline()
            if not reply:
                raise RuntimeError(f"the forking server ended ({self.proc.wait()})")
            return subprocess.CompletedProcess(
                [sys.executable, "-m", "buildmatrix", *args],
                json.loads(reply),
                out.read_text(),
                err.read_text(),
            )

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # already ended
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


_servers: dict[str | None, _Server] = {}


def run(
    args: list[str], env: dict[str, str], *, cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python -m buildmatrix ARGS`` with ``env`` and ``cwd``, as subprocess.run with
    ``capture_output=True, text=True`` returns it; forked from the server for
    ``env``'s loader path (started on first use, ended when the tests end)."""
    key = env.get("LD_LIBRARY_PATH")
    server = _servers.get(key)
    if server is None or server.proc.poll() is not None:
        base = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        server = _servers[key] = _Server(base | ({} if key is None else {"LD_LIBRARY_PATH": key}))
    return server.run(args, env, cwd, timeout)


@atexit.register
def _close() -> None:
    for server in _servers.values():
        server.close()
