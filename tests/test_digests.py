"""Layer digests computed beside the reading (buildmatrix.image.digests): the digest
is hashlib's over the same bytes whatever the pieces, a layer that is not its
config's diff_id is refused on every route a layer takes (streamed, in place in
this process, in place with workers, in place beside other layers' threads), and
no hashing thread outlives its layer, refused or not. The engine's own refusal of
such a layer ("invalid diffID") is held in tests/test_docker_archive.py."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buildmatrix.errors import InputError
from buildmatrix.image import digests
from buildmatrix.image.blobs import VerifyingReader
from buildmatrix.image.digests import BesideHasher, RegionHash, sha256_at
from buildmatrix.image.inplace import scan_layer_at
from buildmatrix.image.layers import scan_layer
from buildmatrix.image.tree import merge
from tests.images import Entry, fixture, layer_tar
from tests.test_in_place import _in_a_fresh_process

SMALL = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _digest_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "buildmatrix-digest"]


@SMALL
@given(
    pieces=st.lists(st.binary(max_size=40), max_size=30),
    batch=st.integers(1, 50),
    depth=st.integers(1, 4),
    cpus=st.sampled_from([1, 2]),
)
def test_a_digest_beside_is_hashlibs_over_the_same_bytes(
    pieces: list[bytes], batch: int, depth: int, cpus: int
) -> None:
    """Any pieces, any batch and queue size (small ones put every piece through the
    thread and the bounded queue), on one CPU (hashed inline) or more: the digest is
    hashlib's over their concatenation, and the thread is gone after it."""
    old = digests.BATCH, digests.DEPTH, digests.cpus
    digests.BATCH, digests.DEPTH = batch, depth
    digests.cpus = lambda: cpus
    try:
        hasher = BesideHasher()
        for piece in pieces:
            hasher.update(memoryview(bytearray(piece)))
        if cpus == 1:
            assert not _digest_threads()
        assert "sha256:" + hasher.hexdigest() == _sha(b"".join(pieces))
    finally:
        digests.BATCH, digests.DEPTH, digests.cpus = old
    assert not _digest_threads()


def test_a_buffer_reused_at_once_is_hashed_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader refills its buffer as soon as ``update`` returns: what is hashed is
    what the buffer held then (a copy), for buffers larger than a batch too."""
    monkeypatch.setattr(digests, "cpus", lambda: 2)  # a thread, whatever the machine
    hasher, expected = BesideHasher(), hashlib.sha256()
    buffer = bytearray(3 * digests.BATCH + 5)
    for i in range(6):
        buffer[:] = bytes([i]) * len(buffer)
        hasher.update(buffer)
        expected.update(buffer)
    assert _digest_threads()  # a thread did the hashing
    assert hasher.hexdigest() == expected.hexdigest()
    assert not _digest_threads()


def test_an_abandoned_digest_leaves_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digests, "cpus", lambda: 2)
    hasher = BesideHasher()
    hasher.update(os.urandom(digests.DEPTH * digests.BATCH))  # the queue is full
    assert _digest_threads()
    hasher.close()
    assert not _digest_threads()


@SMALL
@given(data=st.binary(max_size=3000), cut=st.data(), block=st.integers(1, 700))
def test_a_region_is_hashed_as_hashlib_hashes_its_bytes(
    data: bytes, cut: st.DataObject, block: int
) -> None:
    start = cut.draw(st.integers(0, len(data)))
    end = cut.draw(st.integers(start, len(data)))
    old, digests.BLOCK = digests.BLOCK, block
    try:
        with tempfile.TemporaryFile() as f:
            f.write(data)
            f.flush()
            assert sha256_at(f.fileno(), start, end - start) == _sha(data[start:end])
            region = RegionHash(f.fileno(), start, end - start)
            region.start()
            assert region.result() == _sha(data[start:end])
    finally:
        digests.BLOCK = old


def test_a_region_past_the_end_of_its_file_is_an_error(tmp_path: Path) -> None:
    """A file that ends inside the region (shortened under the reader) is an error,
    never the digest of the part that is there."""
    path = tmp_path / "short"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="ends at byte 100"):
            sha256_at(fd, 10, 200)
        with pytest.raises(OSError, match="ends at byte 100"):
            RegionHash(fd, 10, 200).result()
    finally:
        os.close(fd)


def test_a_stopped_region_hash_ends_its_thread(tmp_path: Path) -> None:
    path = tmp_path / "big"
    with path.open("wb") as f:  # 64 MiB of zeros, sparse: nothing written to the disk
        f.truncate(64 << 20)
    fd = os.open(path, os.O_RDONLY)
    try:
        region = RegionHash(fd, 0, 64 << 20)
        region.start()
        region.stop()
        assert not _digest_threads()
        stop = threading.Event()
        stop.set()
        with pytest.raises(InterruptedError):
            sha256_at(fd, 0, 64 << 20, stop)
    finally:
        os.close(fd)


# -------------------------------------------------- layers against their diff_id

# More than a batch of bytes no compressor shrinks: the hash runs on its thread.
# Two libraries: enough jobs for two workers.
BIG: dict[str, Entry] = {
    "usr/lib/libhopper_a.so": fixture("libhopper_a.so"),
    "usr/share/noise": os.urandom(3 << 20),
    "usr/lib/libtwo.so": fixture("libtwo.so"),
}


def _in_file(tmp_path: Path, raw: bytes) -> tuple[Path, int]:
    """``raw`` written between other bytes, as a layer lies in a save archive."""
    path = tmp_path / "archive"
    path.write_bytes(b"\xa5" * 1536 + raw + b"\x5a" * 1536)
    return path, 1536


@pytest.mark.parametrize("compress", [False, True], ids=["in place", "gzip, streamed"])
def test_a_layer_is_judged_only_as_its_diff_id(tmp_path: Path, compress: bool) -> None:
    """The layer's own digest passes with the summary read without a diff_id; a
    diff_id one byte off is refused, naming both; no thread is left either way."""
    raw = layer_tar(BIG)
    blob = gzip.compress(raw, compresslevel=1, mtime=0) if compress else raw
    path, at = _in_file(tmp_path, blob)
    plain = list(merge([scan_layer_at(path, at, len(blob), name="l")]).files())
    checked = scan_layer_at(path, at, len(blob), name="l", diff_id=_sha(raw))
    assert list(merge([checked]).files()) == plain
    wrong = _sha(raw[:-1] + b"\x01")
    with pytest.raises(InputError, match=f"rootfs.diff_ids names {wrong}") as refused:
        scan_layer_at(path, at, len(blob), name="l", diff_id=wrong)
    assert _sha(raw) in str(refused.value)
    with pytest.raises(InputError, match=f"rootfs.diff_ids names {wrong}"):
        scan_layer(io.BytesIO(blob), name="l", diff_id=wrong)
    streamed = scan_layer(io.BytesIO(blob), name="l", diff_id=_sha(raw))
    assert list(merge([streamed]).files()) == plain
    assert not _digest_threads()


@pytest.mark.parametrize("compress", [False, True], ids=["in place", "gzip, streamed"])
def test_a_refused_layer_leaves_no_hashing_thread(tmp_path: Path, compress: bool) -> None:
    """A layer refused half-way (a name escaping the root, after more than a batch
    was hashed): the refusal is the reader's, and the hash is given up."""
    raw = layer_tar({**BIG, "../escape": b"x"})
    blob = gzip.compress(raw, compresslevel=1, mtime=0) if compress else raw
    path, at = _in_file(tmp_path, blob)
    with pytest.raises(InputError, match="escapes the image root"):
        scan_layer_at(path, at, len(blob), name="l", diff_id=_sha(raw))
    assert not _digest_threads()


def test_every_in_place_route_checks_the_diff_id() -> None:
    """In a fresh process: the read-ahead with workers (the hash beside them, once
    they are forked), the read-ahead run in this process because another thread
    runs (the hash on a thread beside the loop), and the small-layer path each pass
    the right diff_id and refuse a wrong one."""
    out = _in_a_fresh_process(
        """
        import hashlib, os, tempfile, threading
        from pathlib import Path
        from buildmatrix.errors import InputError
        from buildmatrix.image.inplace import scan_layer_at
        from tests.images import layer_tar
        from tests.test_digests import BIG
        from tests.test_in_place import pool_everything

        raw = layer_tar(BIG)
        right = "sha256:" + hashlib.sha256(raw).hexdigest()
        wrong = "sha256:" + hashlib.sha256(raw + b"\\0").hexdigest()

        def both(route):
            with tempfile.NamedTemporaryFile() as f:
                f.write(b"\\xa5" * 1536 + raw + b"\\x5a" * 1536)
                f.flush()
                scan_layer_at(Path(f.name), 1536, len(raw), name="l", diff_id=right)
                try:
                    scan_layer_at(Path(f.name), 1536, len(raw), name="l", diff_id=wrong)
                except InputError as exc:
                    assert "rootfs.diff_ids names " + wrong in str(exc), exc
                else:
                    raise AssertionError(route + ": not refused")
            assert [t.name for t in threading.enumerate()] == [
                "MainThread", *extra
            ], (route, threading.enumerate())

        extra = []
        both("small layer")
        pids = pool_everything()
        both("workers")
        assert pids and os.getpid() not in pids, pids
        pids.clear()
        stop = threading.Event()
        other = threading.Thread(target=stop.wait, name="other")
        other.start()
        extra = ["other"]
        try:
            both("beside another thread")
        finally:
            stop.set()
            other.join()
        assert pids == {os.getpid()}, pids
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_a_digest_closed_midway_still_counts_every_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """``close`` ends the thread without dropping what waits, and bytes given after it
    are hashed too: a finaliser may close the stream a hasher sits in before its owner
    asks for the digest."""
    monkeypatch.setattr(digests, "cpus", lambda: 2)
    first, then = os.urandom(digests.DEPTH * digests.BATCH), os.urandom(3 * digests.BATCH + 7)
    hasher = BesideHasher()
    hasher.update(first)  # the queue is full
    hasher.close()
    assert not _digest_threads()
    hasher.update(then)
    assert "sha256:" + hasher.hexdigest() == _sha(first + then)
    assert not _digest_threads()


def test_a_verifying_reader_closed_by_its_wrapper_still_verifies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tar reader wraps the verifying reader in a buffered one; when the garbage
    collector frees that wrapper (``io.IOBase.__del__`` closes what it wraps) before
    ``verify``, the blob is still verified over every byte: the right blob passes
    and another one is refused. (A 3 GiB content-store image was once refused with
    "content digest … does not match" by a cache-filling run: the wrapper had been
    freed while pieces waited for the hashing thread, and they were dropped.)"""
    monkeypatch.setattr(digests, "cpus", lambda: 2)
    blob = os.urandom(12 * digests.BATCH + 11)
    for data, ok in ((blob, True), (blob[:-1] + b"!", False)):
        reader = VerifyingReader(io.BytesIO(data), digest=_sha(blob), name="layer 0")
        wrapper = io.BufferedReader(reader, buffer_size=1 << 16)
        wrapper.read(len(data) - 5000)  # the tar reader stops before the padding
        wrapper.close()  # what its finaliser does
        assert reader.closed
        if ok:
            reader.verify()
            assert reader.bytes_read == len(data)
        else:
            with pytest.raises(InputError, match="does not match"):
                reader.verify()
    assert not _digest_threads()


def test_within_inline_a_hasher_hashes_on_its_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker process whose siblings take every CPU hashes inline (layer_scan):
    no thread beside, the same digest; outside, a thread hashes beside again."""
    monkeypatch.setattr(digests, "cpus", lambda: 2)
    data = os.urandom(3 * digests.BATCH + 5)
    with digests.inline():
        hasher = BesideHasher()
        hasher.update(data)
        assert not _digest_threads()
        assert hasher.hexdigest() == hashlib.sha256(data).hexdigest()
    beside = BesideHasher()
    beside.update(data)
    assert _digest_threads()
    assert beside.hexdigest() == hashlib.sha256(data).hexdigest()
    assert not _digest_threads()
