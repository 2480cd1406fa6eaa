"""Layer digests computed on a thread beside the reading, so that checking a layer
against its config's diff_id (docs/check.md, "Layers against diff_ids") adds little
to how long the layer takes to read.

SHA-256 cannot be split: a layer's bytes are hashed in order, on one core. What can
be had is that core working beside the one that decompresses and parses. CPython's
hashlib releases the GIL while it hashes 2048 bytes or more at once (CPython
``Modules/hashlib.h``, ``HASHLIB_GIL_MINSIZE``, used by ``Modules/_hashopenssl.c``
``EVP_update``), and so does ``os.preadv``; a hash on a thread of its own so runs
in parallel with the reader, whatever the reader holds.

- :class:`BesideHasher`, for a stream: the bytes handed to it are copied (the
  reader reuses its buffers) in pieces of at least ``BATCH`` bytes; at most
  ``DEPTH`` pieces wait, so memory stays bounded and a reader faster than the hash
  waits for it. Pieces are hashed in the order given, by one thread. The hand-off
  costs about a quarter of the hash's own CPU time (measured: 0.54 against 0.42
  CPU-s for 600 MiB), so with one CPU, where nothing runs beside, it hashes inline.
- :class:`RegionHash`, for a layer lying in a regular file (a ``docker save``
  archive read in place): read with ``pread`` in big blocks into one buffer and
  hashed on a thread; stopped, not finished, when the read is abandoned.

No thread outlives its layer (``close``/``stop``): worker processes are forked only
from a process that runs no other thread (buildmatrix.image.workers). ``close``
never loses bytes: the stream a hasher sits in may be closed by a wrapper's
finaliser (``io.IOBase.__del__``, run whenever the garbage collector frees the
wrapper) before its owner asks for the digest, so what was handed over is still
hashed, and hashing goes on if more comes.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

BATCH = 1 << 20  # bytes handed to the hashing thread at once
DEPTH = 8  # pieces waiting at most: 8 MiB per digest
BLOCK = 4 << 20  # a region is read in blocks of this size


# Set by inline(): no CPU is free for a thread beside the reader.
_INLINE: ContextVar[bool] = ContextVar("buildmatrix_digest_inline", default=False)


@contextmanager
def inline() -> Iterator[None]:
    """Within: hashers made in this thread hash on it. For a worker process whose
    sibling workers take every CPU (buildmatrix.image.layer_scan): the hand-off costs
    CPU a free core would have paid for, and none is free (measured: a 3 GiB image of
    eight zstd layers read by two workers on two CPUs, 9.0-9.9 s inline against
    9.8-11.1 s beside, 2.6 against 3.3-3.7 s of system time)."""
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class BesideHasher:
    """A ``hashlib`` digest fed by one thread and computed on another."""

    def __init__(self, name: str = "sha256") -> None:
        self._hash = hashlib.new(name)
        # With one CPU there is no core to hash on beside the reader: inline.
        self._inline = _INLINE.get() or cpus() < 2
        self._pending = bytearray()
        self._queue: queue.Queue[bytearray | None] = queue.Queue(DEPTH)
        self._thread: threading.Thread | None = None

    def update(self, data: Any) -> None:
        """Hash ``data`` (bytes-like) after what came before; copied, so the caller
        may reuse its buffer at once."""
        if self._inline:
            self._hash.update(data)
            return
        view = memoryview(data)
        for at in range(0, len(view), BATCH):  # a big buffer is handed over in pieces
            self._pending += view[at : at + BATCH]
            if len(self._pending) >= BATCH:
                piece, self._pending = self._pending, bytearray()
                if self._thread is None:  # started once there is enough to hash
                    self._thread = threading.Thread(
                        target=self._run, name="buildmatrix-digest", daemon=True
                    )
                    self._thread.start()
                self._queue.put(piece)

    def _run(self) -> None:
        while (piece := self._queue.get()) is not None:
            self._hash.update(piece)

    def hexdigest(self) -> str:
        """The digest of everything given so far (the thread is done after this)."""
        self._join()
        self._hash.update(self._pending)
        self._pending = bytearray()
        return self._hash.hexdigest()

    def close(self) -> None:
        """End the thread once it has hashed what waits (at most ``DEPTH`` pieces).
        Nothing is dropped: a later :meth:`update` starts a thread again and
        :meth:`hexdigest` is still the digest of every byte given."""
        self._join()

    def _join(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


def sha256_at(fd: int, offset: int, size: int, stop: threading.Event | None = None) -> str:
    """The SHA-256 of ``[offset, offset + size)`` of the open file ``fd``, read in
    ``BLOCK`` pieces into one buffer (a file that ends before it is an ``OSError``);
    with ``stop``, given up (``InterruptedError``) once it is set."""
    digest = hashlib.sha256()
    view = memoryview(bytearray(min(BLOCK, size)))
    at, end = offset, offset + size
    while at < end:
        if stop is not None and stop.is_set():
            raise InterruptedError("the read was abandoned")
        n = os.preadv(fd, [view[: min(BLOCK, end - at)]], at)
        if n <= 0:
            raise OSError(f"the file ends at byte {at}, inside the layer")
        digest.update(view[:n])
        at += n
    return f"sha256:{digest.hexdigest()}"


class RegionHash:
    """The SHA-256 of ``[offset, offset + size)`` of the open file ``fd``, hashed on
    a thread once :meth:`start` is called; :meth:`result` waits for it. The caller
    keeps ``fd`` open until :meth:`result` or :meth:`stop` returns."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self._where = (fd, offset, size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._digest: str | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        """Start hashing (again: nothing)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="buildmatrix-digest", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        try:
            self._digest = sha256_at(*self._where, stop=self._stop)
        except BaseException as exc:  # raised again by result(), in the caller's thread
            self._error = exc

    def result(self) -> str:
        """The digest (started here if it was not)."""
        self.start()
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._digest is not None
        return self._digest

    def stop(self) -> None:
        """Give up the hash (within one block) and wait for the thread to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
