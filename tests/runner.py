"""A workflow's steps run as the GitHub runner runs them, for the pipeline tests
(tests/pipeline.py): ``run:`` steps in bash with the workflow's expressions expanded,
artifacts handed over as actions/upload-artifact and download-artifact do it, and
stand-ins, each recording its calls, for commands that cannot run here."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import shlex
import shutil
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.buildx_standin import called


def run(
    clone: Path, script: str, env: dict[str, str], first: tuple[Path, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """One `run:` step of the workflow as the runner runs it (bash -e, the workflow's
    env, a GITHUB_OUTPUT file), with buildmatrix as installed here (stand-ins in
    ``first`` ahead of it)."""
    path = os.pathsep.join([*map(str, first), str(Path(sys.executable).parent), os.environ["PATH"]])
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=clone,
        env={**os.environ, **env, "PATH": path},
        capture_output=True,
        text=True,
        check=False,
    )


_EXPR = re.compile(r"\$\{\{(.*?)\}\}")


def expand(text: str, ctx: dict[str, Any]) -> str:
    """The workflow expressions these jobs use, as GitHub evaluates them: a context
    path (``matrix.key``, ``runner.temp``, ``matrix.tags[0]``) or ``join(path, 'sep')``
    where the separator may be ``fromJSON('"\\n"')`` (a newline: GitHub's expression
    strings have no escapes). Anything else fails the test, so the stand-in never
    silently evaluates what it does not know."""

    def value(path: str) -> Any:
        found: Any = ctx
        for part in path.strip().split("."):
            name, _, index = part.partition("[")
            found = found[name]
            if index:  # `tags[0]`: an array element
                found = found[int(index.removesuffix("]"))]
        return found

    def sub(m: re.Match[str]) -> str:
        expr = m[1].strip()
        join = re.fullmatch(r"join\(([\w.]+),\s*(?:'([^']*)'|fromJSON\('([^']*)'\))\)", expr)
        if join:
            sep = join[2] if join[3] is None else json.loads(join[3])
            return str(sep).join(value(join[1]))
        if not re.fullmatch(r"[\w.-]+(\[\d+\])?", expr):
            raise AssertionError(f"expression the stand-in does not know: {expr}")
        return str(value(expr))

    return _EXPR.sub(sub, text)


def step_of(job: dict[str, Any], *, name: str | None = None, uses: str | None = None) -> Any:
    (found,) = [
        s
        for s in job["steps"]
        if (name is not None and s.get("name") == name)
        or (uses is not None and uses in s.get("uses", ""))
    ]
    return found


def run_step(
    step: dict[str, Any],
    ctx: dict[str, Any],
    cwd: Path,
    path: list[Path],
    runner_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {
        **(runner_env or {}),
        **{k: expand(str(v), ctx) for k, v in step.get("env", {}).items()},
    }
    env["RUNNER_TEMP"] = ctx["runner"]["temp"]
    return run(cwd, step["run"], env, tuple(path))


def stand_in(folder: Path, name: str, *, log: Path, fail_on: str = "") -> Path:
    """A stand-in for a command that cannot run here (docker buildx: the test engine
    has no buildx, docs/development.md) or whose own tests live elsewhere
    (buildmatrix check): it appends its arguments to ``log``, and exits 1 when they
    contain ``fail_on``."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    test = f'case "$*" in *"{fail_on}"*) exit 1;; esac\n' if fail_on else ""
    script.write_text(
        f"#!/bin/sh\nprintf '%s %s\\n' {name} \"$*\" >> {shlex.quote(str(log))}\n{test}"
    )
    script.chmod(0o755)
    return folder


def cosign_stand_in(folder: Path, *, log: Path, keep: Path) -> Path:
    """A STAND-IN for cosign (no Sigstore, no OIDC token here): it appends its
    arguments to ``log`` and, for ``cosign attest``, keeps a copy of the file given as
    ``--predicate`` in ``keep`` (numbered by call), as cosign reads it at that moment;
    a ``--predicate`` naming no readable file fails, as cosign does."""
    folder.mkdir(parents=True, exist_ok=True)
    keep.mkdir(parents=True, exist_ok=True)
    script = folder / "cosign"
    log_q, keep_q = shlex.quote(str(log)), shlex.quote(str(keep))
    script.write_text(
        "#!/bin/sh\n"
        f"printf 'cosign %s\\n' \"$*\" >> {log_q}\n"
        f'n="$(wc -l < {log_q})"\n'
        "while [ $# -gt 0 ]; do\n"
        '  if [ "$1" = --predicate ]; then\n'
        f'    cp "$2" {keep_q}/"predicate-$n.json" || exit 1\n'
        "  fi\n"
        "  shift\n"
        "done\n"
    )
    script.chmod(0o755)
    return folder


def artifact_upload(upload: dict[str, Any], ctx: dict[str, Any], store: Path) -> None:
    """actions/upload-artifact: the files ``path`` matches, under ``name``; a name
    uploaded twice fails (artifacts are immutable in v4)."""
    name = expand(upload["with"]["name"], ctx)
    files = sorted(Path("/").glob(expand(upload["with"]["path"], ctx).lstrip("/")))
    assert files or upload["with"].get("if-no-files-found") != "error"
    assert not (store / name).exists(), f"two jobs upload {name}"
    (store / name).mkdir(parents=True)
    for f in files:
        shutil.copy(f, store / name)


def artifact_download(download: dict[str, Any], ctx: dict[str, Any], store: Path) -> Path:
    """actions/download-artifact with ``pattern`` (``src/download-artifact.ts`` at
    v4.3.0): into ``path``, each artifact in a folder of its name, or all in one with
    ``merge-multiple``; a pattern that matches nothing downloads nothing, no error."""
    into = Path(expand(download["with"]["path"], ctx))
    into.mkdir(parents=True, exist_ok=True)
    pattern = expand(download["with"]["pattern"], ctx)
    for art in sorted(store.iterdir()):
        if fnmatch.fnmatchcase(art.name, pattern):
            target = into if download["with"].get("merge-multiple") else into / art.name
            target.mkdir(exist_ok=True)
            for f in art.iterdir():
                shutil.copy(f, target)
    return into


def runner_temp(tmp_path: Path, name: str) -> dict[str, Any]:
    temp = tmp_path / "runner" / name
    temp.mkdir(parents=True)
    return {"temp": str(temp)}


@contextlib.contextmanager
def docker_stand_in(folder: Path, log: Path) -> Iterator[Path]:
    """``docker``: ``buildx imagetools`` as tests/buildx_standin.py does it, each call
    appended to ``log``; a folder to put first on the step's PATH, for the ``with``
    block.

    The promote job calls it some thirty times a run, and a Python process that
    imports the stand-in costs about 0.1 s of CPU: the ``docker`` on the PATH is a
    bash script that hands its arguments over loopback (bash's ``/dev/tcp``) to
    :func:`tests.buildx_standin.called` in a thread of this process, then prints
    what it printed and exits with its status, as the process would."""
    folder.mkdir(parents=True, exist_ok=True)

    class Call(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            count = int(self._field())
            status, out, err = called([self._field() for _ in range(count)])
            data = err.encode()
            self.wfile.write(f"{status} {len(data)}\n".encode() + data + out)

        def _field(self) -> str:
            field = bytearray()
            while (byte := self.rfile.read(1)) not in (b"\0", b""):
                field += byte
            return field.decode()

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Call) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
        port = server.server_address[1]
        (folder / "docker").write_text(
            "#!/bin/bash\nexport LC_ALL=C\n"
            f"printf '%s\\n' \"$*\" >> {shlex.quote(str(log))}\n"
            f"exec 3<>/dev/tcp/127.0.0.1/{port} || exit 125\n"
            'printf "%s\\0" "$#" "$@" >&3\n'
            "IFS=' ' read -r status size <&3\n"
            # byte counts, read byte by byte from the socket: nothing of stdout is taken
            'if [ "$size" -gt 0 ]; then IFS= read -r -N "$size" err <&3; '
            'printf "%s" "$err" >&2; fi\n'
            "cat <&3\n"
            'exit "$status"\n'
        )
        (folder / "docker").chmod(0o755)
        try:
            yield folder
        finally:
            server.shutdown()


def skopeo_plain_http(folder: Path, log: Path) -> Path:
    """The real ``skopeo``, with ``--tls-verify=false`` after its subcommand: the
    tests' registry speaks plain HTTP (ghcr.io speaks HTTPS). Each call is appended
    to ``log``."""
    real = shutil.which("skopeo")
    if real is None:
        import pytest

        pytest.skip("skopeo is not installed (Debian package skopeo)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "skopeo").write_text(
        f"#!/bin/sh\nprintf 'skopeo %s\\n' \"$*\" >> {shlex.quote(str(log))}\n"
        f'sub="$1"; shift\nexec {shlex.quote(real)} "$sub" --tls-verify=false "$@"\n'
    )
    (folder / "skopeo").chmod(0o755)
    return folder
