"""``python -m buildmatrix`` in a new process, forked from one that has imported it.

The node tests run ``buildmatrix`` in a new process whose loader sees only the stand-in
GPU libraries (tests/standins: ``run_cli``, some fifty runs a suite), and the time-out
tests run it in a new process so that a missing time-out fails instead of hanging.
Most of such a run's CPU (~0.2 s) is Python starting and importing click, PyYAML,
jsonschema, the NVML bindings, the registry and Kubernetes clients; the work under
test is a few hundredths.

So a server process imports those modules and nothing else: it calls no NVML or CUDA
function and loads no GPU library (nvidia-ml-py opens libnvidia-ml at ``nvmlInit``,
buildmatrix opens libcuda where it loads modules). For each run it forks a child that
takes the run's environment, working directory, arguments and standard streams
(stdin /dev/null; stdout and stderr FIFOs that this process reads to their end, as
subprocess.run reads its pipes), runs ``buildmatrix/__main__.py`` as ``python -m
buildmatrix`` does, ends as the interpreter ends (threads joined, atexit handlers
run, streams flushed) and exits with the status Python would exit with (SystemExit
as the interpreter reads it; an uncaught exception: its traceback and 1). The child
loads the GPU libraries itself, after the fork, as a fresh process does. What the
imports read of the environment (the loader's path, which glibc reads only when a
process starts; the kubeconfig's default place) is the same for every run of one
server: there is a server for each set of those values (``_key``).

Not the same as a fresh process: every run of one server has the server's hash seed
(``hash()`` of a string, the order of a set of strings), and the modules are imported
in WARM's order, not the command's. A test that compares two runs' output for
sameness, or one about the imports themselves, runs ``python -m buildmatrix`` itself.

tests/test_forked_cli.py holds the two ways to the same exit status, output and
written files.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# What a node run (``smoke``, ``--record``, ``--apply``, ``--load-test``) and a check of
# a registry's image import: module imports only, none of which loads a library or
# starts a thread (what they read of the environment: _key).
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
import importlib, json, os, runpy, signal, sys, traceback

for name in sys.argv[1:]:
    importlib.import_module(name)
replies = os.dup(1)
requests = sys.stdin.buffer


def exit_status(exc):
    # as the interpreter reads a SystemExit (Python/pythonrun.c, _Py_HandleSystemExit:
    # an int as a C long, -1 where it does not fit; anything else printed, then 1)
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return (code if -(2**63) <= code < 2**63 else -1) & 0xFF
    print(code, file=sys.stderr)
    return 1


def child(req):
    os.close(replies)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        f = os.open(path, os.O_WRONLY)  # a FIFO the test process reads
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    if sys.path[0] == "":  # -c put "", python -m puts the working folder
        sys.path[0] = os.getcwd()
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = [req["module"], *req["args"]]
    try:
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as exc:
        status = exit_status(exc)
    except KeyboardInterrupt:  # Python ends by the signal (Modules/main.c)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
        status = 1
    # What Py_FinalizeEx does before the process ends: wait for the threads that are
    # not daemons, run the atexit handlers (multiprocessing joins its children there),
    # flush the standard streams (120 where that fails).
    import atexit, threading

    threading._shutdown()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = status or 120
    os._exit(status)


while chunk := requests.readline():
    req = json.loads(chunk)
    pid = os.fork()
    if pid == 0:
        try:
            child(req)  # ends with os._exit
        except BaseException:  # what escapes it (a working folder gone): never the loop
            traceback.print_exc()
        os._exit(1)
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
        self.lock = threading.Lock()  # one run at a time: the replies come in order

    def run(
        self, module: str, args: list[str], env: dict[str, str], cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        with self.lock, tempfile.TemporaryDirectory(prefix="forked-cli-") as folder:
            # FIFOs, as subprocess.run's pipes: the output ends when every process
            # holding it has closed it (the child, and any it left running), not when
            # the child ends. Until the child's status is in, this process holds the
            # write ends too, so that no end of file is read before the child opens them.
            paths = [Path(folder, "stdout"), Path(folder, "stderr")]
            reads, holds = [], []
            for path in paths:
                os.mkfifo(path, 0o600)
                reads.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
                holds.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            try:
                request = {"module": module, "args": args, "env": env, "cwd": str(cwd)}
                request |= {"out": str(paths[0]), "err": str(paths[1])}
                status, data = self._exchange(request, timeout, reads, holds)
            finally:
                for fd in reads + holds:
                    with contextlib.suppress(OSError):  # a hold closed already
                        os.close(fd)
            return subprocess.CompletedProcess(
                [sys.executable, "-m", module, *args], status, *map(_text, data)
            )

    def _exchange(
        self, request: dict[str, Any], timeout: float, reads: list[int], holds: list[int]
    ) -> tuple[int, list[bytearray]]:
        try:
            return self._answer(request, timeout, reads, holds)
        except BaseException:
            # whatever cut the exchange short (a time-out, a signal's handler), the
            # server's reply may still come: a server that is one reply behind would
            # give the next run this run's status
            if self.proc.returncode is None:
                self.close()
            raise

    def _answer(
        self, request: dict[str, Any], timeout: float, reads: list[int], holds: list[int]
    ) -> tuple[int, list[bytearray]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        data = {fd: bytearray() for fd in reads}
        deadline = time.monotonic() + timeout
        status: int | None = None
        live = list(reads)
        while live or status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                out, err = (_text(data[fd]) for fd in reads)
                argv = [request["module"], *request["args"]]
                raise subprocess.TimeoutExpired(argv, timeout, out, err)
            watch: list[Any] = [*live, *([self.proc.stdout] if status is None else [])]
            for ready in select.select(watch, [], [], left)[0]:
                if ready is self.proc.stdout:
                    reply = self.proc.stdout.readline()
                    if not reply:
                        self.close()
                        raise RuntimeError(f"the forking server ended ({self.proc.returncode})")
                    status = json.loads(reply)
                    for fd in holds:  # the child has ended: only what it left may hold them
                        os.close(fd)
                    holds.clear()
                elif chunk := os.read(ready, 1 << 16):
                    data[ready] += chunk
                else:
                    live.remove(ready)
        assert status is not None
        return status, [data[fd] for fd in reads]

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # already ended
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        for key, server in list(_servers.items()):
            if server is self:
                del _servers[key]


def _text(data: bytearray) -> str:
    """Bytes as subprocess.run(text=True) gives them: the locale's encoding, universal
    newlines."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


# What the modules WARM imports read of the environment when they are imported: the
# loader's path (glibc, at the start of the process) and the kubeconfig's default
# place (kubernetes.config, KUBE_CONFIG_DEFAULT_LOCATION), and the interpreter's
# PYTHON* variables. One server for each set of their values.
def _key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    names = ("LD_LIBRARY_PATH", "KUBECONFIG", *(k for k in env if k.startswith("PYTHON")))
    return tuple(sorted((k, env[k]) for k in set(names) if k in env))


_servers: dict[tuple[tuple[str, str], ...], _Server] = {}


def run(
    args: list[str], env: dict[str, str], *, cwd: Path, timeout: float, module: str = "buildmatrix"
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` with ``env`` and ``cwd``, as subprocess.run with
    ``capture_output=True, text=True`` returns it; forked from the server for the
    values ``env`` gives to what is read at import (started on first use, with the
    first such run's environment; ended when the tests end). ``module``: another
    package, for the tests of this one."""
    if not cwd.is_dir():  # as subprocess.run: before anything starts
        raise FileNotFoundError(2, "No such file or directory", cwd)
    key = _key(env)
    server = _servers.get(key)
    if server is None or server.proc.poll() is not None:
        server = _servers[key] = _Server(env)
    return server.run(module, args, env, cwd, timeout)


@atexit.register
def _close() -> None:
    for server in list(_servers.values()):
        server.close()
