"""Registry time-outs through the CLI: a registry that accepts and never answers, one
that never completes the connection, and one that stops in the middle of an answer
fail with exit 3 within --timeout, the message naming the wait that ran out and the
host. Every server here is on loopback and made by the test; each command runs in a
child process with a hard limit, so a missing time-out fails the test instead of
hanging it."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildmatrix.cli._common import MAX_TIMEOUT
from buildmatrix.errors import EnvironmentUnavailable
from buildmatrix.image.ref import parse_ref
from buildmatrix.image.registry import DEFAULT_TIMEOUT, RegistryClient, waiting
from tests import forked_cli
from tests.conftest import REPO, CliRunner

LIMIT = 60  # seconds a child may take: far above any --timeout here, far below a hang
# --timeout where the wait can only run out (nothing ever answers, or the connection
# is never accepted): the test needs it to fire, not to last. The silent socket's
# handshake is the kernel's (its backlog), not a thread's that might run late. Where a
# thread of this process must answer first (stalling), the wait stays longer.
SHORT = 0.2
NODE = REPO / "tests" / "fixtures" / "nodes" / "h100-535.json"


def _buildmatrix(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m buildmatrix ARGS`` in a new process (forked from one that has
    imported buildmatrix: tests/forked_cli.py)."""
    return forked_cli.run(list(args), dict(os.environ), cwd=REPO, timeout=LIMIT)


@pytest.fixture
def silent() -> Iterator[str]:
    """host:port of a socket that listens (the kernel completes the handshake) but is
    never read from nor written to."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def full() -> Iterator[str]:
    """host:port whose accept queue is full: Linux drops further SYNs, so a new
    connection is never established (tcp_v4_syn_recv_sock / sk_acceptq_is_full)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    address = server.getsockname()
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(address)
        fillers.append(filler)
    try:
        yield f"127.0.0.1:{address[1]}"
    finally:
        for s in [*fillers, server]:
            s.close()


class _Stalling(http.server.BaseHTTPRequestHandler):
    """Answers /v2/ as a registry does; for a manifest sends the headers and part of
    the body, then nothing until the test ends."""

    release = threading.Event()

    def do_GET(self) -> None:
        if self.path == "/v2/":
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b'{"schemaVersion": 2,')
        self.wfile.flush()
        self.release.wait(LIMIT)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def stalling() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stalling)
    _Stalling.release.clear()  # a class attribute: set by the previous use's teardown
    # poll_interval: how soon shutdown() is seen (socketserver.BaseServer.serve_forever)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        _Stalling.release.set()
        server.shutdown()
        server.server_close()


def test_a_registry_that_never_answers_is_a_read_time_out(silent: str) -> None:
    proc = _buildmatrix("check", f"docker://{silent}/team/app:1", "--timeout", str(SHORT))
    assert proc.returncode == 3, proc.stderr
    assert (
        f"registry {silent} accepted the connection but sent nothing for {SHORT:g} s" in proc.stderr
    )
    assert "(read time-out)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_registry_that_never_accepts_is_a_connect_time_out(full: str) -> None:
    proc = _buildmatrix("check", f"docker://{full}/team/app:1", "--timeout", str(SHORT))
    assert proc.returncode == 3, proc.stderr
    assert (
        f"registry {full} did not accept a connection within {SHORT:g} s (connect time-out)"
        in proc.stderr
    )


def test_an_answer_that_stops_midway_is_a_read_time_out(stalling: str) -> None:
    """/v2/ answers, so the time-out that fires is the one on oras-py's own session (the
    manifest request), while its body is read."""
    proc = _buildmatrix("check", f"docker://{stalling}/team/app:1", "--timeout", "1.5")
    assert proc.returncode == 3, proc.stderr
    assert f"registry {stalling} accepted the connection but sent nothing for 1.5 s" in (
        proc.stderr
    )


def test_affinity_and_smoke_take_the_time_out(silent: str) -> None:
    proc = _buildmatrix("affinity", f"docker://{silent}/team/app:1", "--timeout", str(SHORT))
    assert proc.returncode == 3, proc.stderr
    assert "(read time-out)" in proc.stderr
    smoke = _buildmatrix(
        "smoke", "--snapshot", str(NODE), "--image", f"docker://{silent}/team/app:1",
        "--timeout", str(SHORT),
    )  # fmt: skip
    # an image that cannot be read fails the node; its registry is a source unavailable
    assert smoke.returncode == 3, smoke.stderr
    assert "buildmatrix.io/smoke=failed" in smoke.stdout
    assert "(read time-out)" in smoke.stdout


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf", "-inf", "1e300", ""])
@pytest.mark.parametrize("command", ["check", "affinity", "smoke"])
def test_a_time_out_must_be_a_positive_number(
    cli: CliRunner, command: str, value: str, tmp_path: Path
) -> None:
    """NaN and infinity passed click's range and reached the socket as a traceback
    ("ValueError: Invalid value NaN", "OverflowError: timestamp out of range")."""
    result = cli(command, str(tmp_path), "--timeout", value)
    assert result.code == 2
    assert "Invalid value for '--timeout'" in result.err


def test_a_time_out_of_nan_says_what_to_give(cli: CliRunner, tmp_path: Path) -> None:
    result = cli("check", str(tmp_path), "--timeout", "nan")
    assert f"'nan' is not a number of seconds: give one in the range 0<x<={MAX_TIMEOUT}" in (
        result.err
    )
    longest = cli(
        "check", str(tmp_path), "--sm", "9.0", "--allow-empty", "--timeout", str(MAX_TIMEOUT)
    )
    assert longest.code == 0, longest.err


def test_the_default_suits_a_ci_step(cli: CliRunner) -> None:
    assert DEFAULT_TIMEOUT == 30
    for command in ("check", "affinity", "smoke"):
        help_text = " ".join(cli(command, "--help").out.split())
        assert f"(default {DEFAULT_TIMEOUT:g})" in help_text, command


def test_the_option_sets_the_wait_of_the_clients_made_meanwhile(silent: str) -> None:
    ref = parse_ref(f"docker://{silent}/team/app:1")
    with waiting(SHORT), pytest.raises(EnvironmentUnavailable, match=f"for {SHORT:g} s"):
        RegistryClient(ref)
