"""Layers read in place: a ``docker-archive`` file's uncompressed layers are read
where they lie (tar headers, then each file that may hold device code inspected in
the archive), not streamed through the tar reader and spooled. Whatever the reader,
the result must be the stream reader's (tests/test_layer_semantics.py holds that one
to the engine; test_tar_headers.py and test_fuzz.py compare the two on hostile
headers and mutated layers)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.image.layers import scan_layer
from buildmatrix.image.tree import merge
from tests.conftest import CliRunner
from tests.fixtures.build import BIN
from tests.images import Entry, Image, fixture, layer_tar, scan_in_place, write_archive_blobs

EVERY_FIXTURE: dict[str, Entry] = {
    f"usr/lib/{p.name}": p.read_bytes() for p in sorted(BIN.iterdir()) if p.is_file()
}


def _view(summary: object) -> list[tuple[str, object]]:
    return list(merge([summary]).files())  # type: ignore[list-item]


def test_every_kind_of_file_reads_as_the_stream_reads_it() -> None:
    raw = layer_tar(EVERY_FIXTURE)
    streamed = _view(scan_layer(io.BytesIO(raw), name="layer"))
    in_place = _view(scan_in_place(raw))
    assert in_place == streamed
    with_code = [path for path, node in in_place if node.result is not None]  # type: ignore[attr-defined]
    assert len(with_code) >= 15, with_code  # ELF, fatbin, cubin, PTX, archive, object


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar writes the sparse member")
def test_a_sparse_member_is_read_through_its_map(tmp_path: Path) -> None:
    """A PAX sparse member's bytes are not one run of the archive: it is read through
    the tar reader's sparse map, as the engine (Go's archive/tar) expands it. The
    fatbinary has a hole between its two containers and a file follows it, so
    reading the stored bytes as one run would find that file's header where the
    second container's padding ends."""
    root = tmp_path / "root" / "usr" / "lib"
    root.mkdir(parents=True)
    container = fixture("kernels.fatbin")
    with (root / "k.fatbin").open("wb") as f:
        f.write(container)
        f.seek(1 << 20)  # a hole: zeros between containers, as padding
        f.write(container)
    (root / "z.txt").write_bytes(b"text after the sparse member\n" * 100)
    layer = tmp_path / "layer.tar"
    subprocess.run(
        [
            "tar",
            "--sparse",
            "--format=pax",
            "--sort=name",
            "-cf",
            str(layer),
            "-C",
            root.parent.parent,
            "usr",
        ],
        check=True,
    )
    with tarfile.open(layer) as t:
        assert t.getmember("usr/lib/k.fatbin").issparse()
    raw = layer.read_bytes()
    streamed = _view(scan_layer(io.BytesIO(raw), name="layer"))
    in_place = _view(scan_in_place(raw))
    assert in_place == streamed
    (report,) = [n.result for p, n in in_place if p.endswith(".fatbin")]  # type: ignore[attr-defined]
    assert len({e.container for e in report.entries}) == 2, report


def _archive_with(tmp_path: Path, layer: bytes, name: str = "layer.tar") -> Path:
    """A docker-archive whose single layer member holds ``layer`` as given."""
    plain = gzip.decompress(layer) if layer[:2] == b"\x1f\x8b" else layer
    config = Image(layers=[], labels={"io.buildmatrix.family": "hopper"}).config(
        ["sha256:" + hashlib.sha256(plain).hexdigest()]  # the diff_id: uncompressed
    )
    return write_archive_blobs(tmp_path / "image.tar", config, [(name, layer)], tag="bmtest/x:v1")


def test_a_compressed_layer_in_an_archive_is_streamed(cli: CliRunner, tmp_path: Path) -> None:
    raw = layer_tar({"usr/lib/libsass_sm80.so": fixture("libsass_sm80.so")})
    plain = cli("check", f"docker-archive:{_archive_with(tmp_path, raw)}", "--json")
    squeezed = _archive_with(tmp_path, gzip.compress(raw, mtime=0), "layer.tar.gz")
    packed = cli("check", f"docker-archive:{squeezed}", "--json")
    assert plain.code == packed.code == 1  # hopper claimed, sm_80 inside
    assert plain.json()["files"] == packed.json()["files"]


def test_a_truncated_layer_is_refused(cli: CliRunner, tmp_path: Path) -> None:
    """The layer tar ends inside its last file: refused, nothing judged — never a
    verdict from the part that was there, nor bytes read past the layer's end."""
    raw = layer_tar(
        {"usr/lib/libhopper_a.so": fixture("libhopper_a.so"), "usr/lib/b.so": fixture("libtwo.so")}
    )
    cut = raw[: raw.index(fixture("libtwo.so")[:4096]) + 2048]  # inside the second file
    r = cli("check", f"docker-archive:{_archive_with(tmp_path, cut)}", "--sm", "9.0")
    assert r.code == 2, r.out + r.err
    assert "the layer ends inside the data of member 'usr/lib/b.so'" in r.err, r.err
    assert "the blob is truncated" in r.err


def test_the_archive_reader_reads_only_what_it_needs(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No spool, no member copied: a large file with no device code is never read,
    only its header (the tar reader skips it by seeking)."""
    from buildmatrix.image import inplace, layers

    filler = b"\0" * (8 << 20)
    raw = layer_tar({"usr/share/big.bin": filler, "usr/lib/l.so": fixture("libhopper_a.so")})
    archive = _archive_with(tmp_path, raw)
    read: list[int] = []
    original = inplace._Window.readinto

    def counting(self: object, buffer: object) -> int:
        n = original(self, buffer)  # type: ignore[arg-type]
        read.append(n)
        return n

    monkeypatch.setattr(inplace._Window, "readinto", counting)
    monkeypatch.setattr(layers, "inspect_member", None)  # the spooling reader is not used
    r = cli("check", f"docker-archive:{archive}", "--sm", "9.0", "--json", "--no-cache")
    assert r.code == 0, r.out + r.err
    assert sum(read) < 1 << 20, sum(read)  # tar headers; the library is read in place
    assert r.json()["files"][0]["path"] == "usr/lib/l.so"


def _in_a_fresh_process(code: str, *args: str, timeout: float | None = None) -> str:
    """Run ``code`` in a new Python, which runs no thread but its main one (this
    test process may run servers in threads, and then no worker is forked); a
    process still running after ``timeout`` seconds fails the test."""
    import sys
    import textwrap

    repo = Path(__file__).resolve().parent.parent
    try:
        r = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not end within {timeout} s: {exc.stdout!r}")
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_workers_read_what_one_process_reads() -> None:
    """Large layers are read by worker processes (buildmatrix.image.workers): the
    same view as one process, file by file, in processes other than this one;
    refusals still come in archive order."""
    out = _in_a_fresh_process(
        """
        import os
        from buildmatrix.errors import InputError
        from buildmatrix.image.tree import merge
        from tests.images import layer_tar, scan_in_place
        from tests.test_in_place import EVERY_FIXTURE, pool_everything

        raw = layer_tar(EVERY_FIXTURE)
        serial = list(merge([scan_in_place(raw)]).files())
        pids = pool_everything()
        pooled = list(merge([scan_in_place(raw)]).files())
        assert pooled == serial
        assert pids and os.getpid() not in pids, pids
        assert sum(1 for _, n in pooled if n.result is not None) >= 15
        bad = layer_tar({**EVERY_FIXTURE, "../escape": b"x"})
        try:
            scan_in_place(bad)
        except InputError as exc:
            assert "escapes the image root" in str(exc)
        else:
            raise AssertionError("not refused")
        print("same")
        """
    )
    assert out.strip() == "same"


@pytest.mark.parametrize(
    "refusal",
    [
        PermissionError(13, "Permission denied"),  # a process limit, a policy
        NotImplementedError("This Python lacks a functioning sem_open"),  # no /dev/shm
    ],
)
def test_workers_that_cannot_start_leave_the_work_to_this_process(
    refusal: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker processes that cannot start: the layer is read in this process, with
    the same result, never a traceback."""
    from buildmatrix.image import workers

    raw = layer_tar(EVERY_FIXTURE)
    serial = _view(scan_in_place(raw))
    monkeypatch.setattr(workers, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(workers, "workers", lambda: 2)
    # as in a fresh CLI process; the pool is refused before anything is forked
    monkeypatch.setattr("buildmatrix.image.workers.threading.active_count", lambda: 1)

    def refuse(*args: object, **kwargs: object) -> None:
        raise refusal

    monkeypatch.setattr("concurrent.futures.ProcessPoolExecutor", refuse)
    assert _view(scan_in_place(raw)) == serial


def test_the_jobs_run_in_other_processes() -> None:
    """The pool is real: jobs run in forked workers, results come back in job order;
    with another thread running, they run in the one process instead."""
    out = _in_a_fresh_process(
        """
        import os, threading
        from buildmatrix.image import workers
        from tests.test_in_place import _pid_and_job

        workers.PARALLEL_BYTES = 0
        workers.workers = lambda: 2
        jobs = list(range(8))
        results = workers.run_all(_pid_and_job, jobs, [1] * len(jobs))
        assert [job for _, job in results] == jobs
        assert os.getpid() not in {pid for pid, _ in results}
        stop = threading.Event()
        other = threading.Thread(target=stop.wait)
        other.start()
        try:
            results = workers.run_all(_pid_and_job, jobs, [1] * len(jobs))
        finally:
            stop.set()
            other.join()
        assert {pid for pid, _ in results} == {os.getpid()}
        print("ok")
        """
    )
    assert out.strip() == "ok"


def _pid_and_job(job: int) -> tuple[int, int]:
    import os

    return os.getpid(), job


def _where(job: tuple[Callable[[Any], Any], Any]) -> tuple[int, Any]:
    """``fn(arg)`` beside the pid of the process that ran it."""
    import os

    fn, arg = job
    return os.getpid(), fn(arg)


def pool_everything() -> set[int]:
    """For a fresh process: every layer from now on is read by two workers; the set
    returned fills with the pids of the processes that made the results."""
    from buildmatrix.image import inplace, overlay2, workers

    pids: set[int] = set()

    def run_all(
        fn: Callable[[Any], Any], jobs: list[Any], sizes: list[int], **kwargs: Any
    ) -> list[Any]:
        both = workers.run_all(_where, [(fn, job) for job in jobs], sizes, **kwargs)
        pids.update(pid for pid, _ in both)
        return [result for _, result in both]

    workers.PARALLEL_BYTES = 0
    setattr(workers, "workers", lambda: 2)  # noqa: B010 - mypy: no assigning to a function
    for reader in (inplace, overlay2):  # the two readers that hand work to workers
        setattr(reader, "run_all", run_all)  # noqa: B010
    return pids


LOCAL_BLOBS = """
import io, json, os, sys, contextlib
from pathlib import Path
from buildmatrix.cli import main
from buildmatrix.image import layer_scan, workers
from tests.images import Image, write_oci_layout
from tests.test_in_place import EVERY_FIXTURE, _where

layout = Path(sys.argv[1])
names = sorted(EVERY_FIXTURE)
image = Image(layers=[{n: EVERY_FIXTURE[n] for n in names[i::3]} for i in range(3)])
write_oci_layout(layout, image, tag="t")
ARGS = ["check", f"oci:{layout}:t", "--sm", "sm_90", "--sm", "sm_80", "--json", "--no-cache"]


def run():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(ARGS)
    return code, out.getvalue(), err.getvalue()


pids, calls = set(), []
def spy(fn, jobs, sizes, **kwargs):
    calls.append(len(jobs))
    both = workers.run_all(_where, [(fn, job) for job in jobs], sizes, **kwargs)
    pids.update(pid for pid, _ in both)
    return [result for _, result in both]
layer_scan.run_all = spy

threads = run()
workers.PARALLEL_BYTES = 0
workers.workers = lambda: 8  # a big node: still two layers at once, as on threads
apart = run()
assert pids and os.getpid() not in pids and len(pids) <= 2, pids
assert apart == threads, (apart, threads)
assert threads[0] in (0, 1) and json.loads(threads[1])["files"], threads

# a blob corrupt in its middle: refused alike, exit 2
blobs = sorted((layout / "blobs" / "sha256").iterdir(), key=lambda p: -p.stat().st_size)
data = bytearray(blobs[0].read_bytes())
data[len(data) // 2] ^= 0xFF
blobs[0].write_bytes(bytes(data))
calls.clear()
bad = run()
assert calls, "not read by workers"
workers.PARALLEL_BYTES = 1 << 60
assert bad == run() and bad[0] == 2, bad
print(json.dumps(bad))
"""


def test_local_blobs_are_read_by_workers_as_by_threads(tmp_path: Path) -> None:
    """Layers in local files (an OCI layout's, a containerd content store's) are read
    one per worker process where there is enough to read (layer_scan._apart): the
    same check output as the layers read on two threads of one process, in other
    processes; a corrupt blob is refused with the same message and exit code."""
    out = _in_a_fresh_process(LOCAL_BLOBS, str(tmp_path / "layout"))
    code, _, err = json.loads(out)
    assert code == 2 and ("does not match" in err or "corrupt" in err), err
