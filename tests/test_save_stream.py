"""The engine's save stream is read ahead in a thread (buildmatrix.image.prefetch
iter_chunks_reader): the bytes arrive whole and in order, the read-ahead is bounded,
an error of the engine's stream reaches the reader, and closing stops the thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from buildmatrix.image import prefetch


def _chunks(count: int, size: int, pulled: list[int] | None = None) -> Iterator[bytes]:
    for i in range(count):
        if pulled is not None:
            pulled.append(size)
        yield bytes([i % 251]) * size


def test_every_byte_arrives_in_order() -> None:
    reader = prefetch.iter_chunks_reader(_chunks(100, 10_000))
    data = reader.read()
    assert data == b"".join(_chunks(100, 10_000))
    assert reader.read(10) == b"" and reader.read() == b""  # the end stays the end
    reader.close()


def test_the_read_ahead_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch, "PREFETCH_BYTES", 64 << 10)
    pulled: list[int] = []
    reader = prefetch.iter_chunks_reader(_chunks(1000, 4096, pulled))
    time.sleep(0.3)  # the thread fills what it may, then waits
    assert sum(pulled) <= (64 << 10) + 4096
    assert len(reader.read(1 << 20)) == 1 << 20  # and goes on as the reader reads
    reader.close()


def test_an_error_of_the_stream_reaches_the_reader() -> None:
    def failing() -> Iterator[bytes]:
        yield b"x" * 1000
        raise ConnectionResetError("engine went away")

    reader = prefetch.iter_chunks_reader(failing())
    for _ in range(2):  # and again on the next read, never a quiet end
        with pytest.raises(ConnectionResetError, match="engine went away"):
            reader.read()
    reader.close()


def test_closing_stops_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch, "PREFETCH_BYTES", 8192)
    before = set(threading.enumerate())
    reader = prefetch.iter_chunks_reader(_chunks(10_000, 4096))
    assert reader.read(100) == bytes(100)
    (thread,) = set(threading.enumerate()) - before
    reader.close()
    thread.join(timeout=5)
    assert not thread.is_alive()
