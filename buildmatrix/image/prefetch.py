"""The engine's save stream, read ahead in a thread so that reading and scanning
overlap (:func:`iter_chunks_reader`)."""

from __future__ import annotations

import io
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

PREFETCH_BYTES = 32 << 20  # how far the engine's save stream is read ahead


def iter_chunks_reader(chunks: Iterator[bytes]) -> io.BufferedReader:
    """A file object over an iterator of byte chunks (the engine's save stream), read
    ahead by up to :data:`PREFETCH_BYTES` in a thread: the engine stops sending
    when its socket is full, so without it the engine waits while the layers are
    parsed and the parse waits while the engine works, and the two times add up.
    Close it to stop the thread."""
    return io.BufferedReader(_Prefetched(chunks, PREFETCH_BYTES), buffer_size=1 << 20)


class _Prefetched(io.RawIOBase):
    def __init__(self, chunks: Iterator[bytes], limit: int) -> None:
        super().__init__()
        self._chunk = memoryview(b"")
        self._pos = 0
        self._limit = limit
        self._queued: deque[bytes | BaseException | None] = deque()
        self._bytes = 0
        self._ready = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(
            target=self._pump, args=(chunks,), name="buildmatrix-save-stream", daemon=True
        )
        self._thread.start()

    def _pump(self, chunks: Iterator[bytes]) -> None:
        try:
            for chunk in chunks:
                if not self._put(chunk, len(chunk)):
                    return
            self._put(None, 0)
        except BaseException as exc:  # handed to the reader, raised there
            self._put(exc, 0)

    def _put(self, item: bytes | BaseException | None, size: int) -> bool:
        with self._ready:
            while self._bytes >= self._limit and not self._stopped:
                self._ready.wait()
            if self._stopped:
                return False
            self._queued.append(item)
            self._bytes += size
            self._ready.notify_all()
            return True

    def _next(self) -> bytes | None:
        with self._ready:
            while not self._queued:
                self._ready.wait()
            item = self._queued.popleft()
            if isinstance(item, bytes):
                self._bytes -= len(item)
            else:
                self._queued.appendleft(item)  # the end, or the error, stays
            self._ready.notify_all()
        if isinstance(item, BaseException):
            raise item
        return item

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._pos >= len(self._chunk):  # a memoryview: no copy of the rest
            chunk = self._next()
            if chunk is None:
                return 0
            self._chunk, self._pos = memoryview(chunk), 0
        n = min(len(buffer), len(self._chunk) - self._pos)
        buffer[:n] = self._chunk[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify_all()
        super().close()
