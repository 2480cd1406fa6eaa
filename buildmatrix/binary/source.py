"""Random-access byte sources: the readers ask for (offset, size) and nothing more."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Protocol

from buildmatrix.errors import InputError


class CorruptBinary(InputError):
    """A file that looks like a CUDA binary but whose structure is broken."""


class ByteSource(Protocol):
    """What the readers need: a size, and bytes at an offset."""

    @property
    def name(self) -> str: ...

    @property
    def size(self) -> int: ...

    def read_at(self, offset: int, size: int) -> bytes: ...


class FileSource:
    """A regular file read with ``os.pread``: no seeks, no buffering of unread data."""

    def __init__(self, fd: int, *, name: str) -> None:
        self._fd = fd
        self._name = name
        self._size = os.fstat(fd).st_size

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)


class BytesSource:
    """A file already in memory (a tar member, a test vector)."""

    def __init__(self, data: bytes | bytearray, *, name: str) -> None:
        self._data = memoryview(data)
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return len(self._data)

    def read_at(self, offset: int, size: int) -> bytes:
        return bytes(self._data[offset : offset + size])


class SliceSource:
    """A window of another source: an embedded cubin read in place, never copied."""

    def __init__(self, src: ByteSource, offset: int, size: int, *, name: str) -> None:
        self._src = src
        self._offset = offset
        self._size = max(0, min(size, src.size - offset))
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, size: int) -> bytes:
        size = max(0, min(size, self._size - offset))
        return self._src.read_at(self._offset + offset, size)


def read_exact(src: ByteSource, offset: int, size: int, *, what: str) -> bytes:
    """Read exactly ``size`` bytes or raise :class:`CorruptBinary` naming ``what``.

    Bounds are checked against the source size first, so an untrusted length can
    never drive a large allocation.
    """
    if offset < 0 or size < 0 or offset + size > src.size:
        raise CorruptBinary(
            f"{src.name}: {what} at offset {offset:#x} ({size} bytes) runs past the end of "
            f"the file ({src.size} bytes); the file is truncated or corrupt."
        )
    data = src.read_at(offset, size)
    if len(data) != size:
        raise CorruptBinary(f"{src.name}: short read of {what} at offset {offset:#x}.")
    return data


SEARCH_CHUNK = 8 << 20  # searches read in windows of this size: memory stays bounded


class Searcher:
    """Searches one source for byte strings from positions that only move forward,
    reading it a window of :data:`SEARCH_CHUNK` bytes at a time. A window is read
    when a search starts past the current one, so bytes a caller skips (a blob already
    read as device code) are never read at all. It is a source too: reads inside the
    window are served from it, so what a search found is read without another call.
    """

    def __init__(self, src: ByteSource, end: int) -> None:
        self._src = src
        self._end = end
        self._base = 0
        self._data = b""

    @property
    def name(self) -> str:
        return self._src.name

    @property
    def size(self) -> int:
        return self._src.size

    def read_at(self, offset: int, size: int) -> bytes:
        start = offset - self._base
        if start >= 0 and start + size <= len(self._data):
            return self._data[start : start + size]
        return self._src.read_at(offset, size)

    def find(self, needle: bytes, start: int, stop: int) -> int:
        """Offset of the first ``needle`` that starts at or after ``start`` and ends
        by ``stop`` (and the searcher's end), or -1; a needle cut by a window's end
        is found whole."""
        stop = min(stop, self._end)
        pos = start
        while pos + len(needle) <= stop:
            if not self._base <= pos or pos + len(needle) > self._base + len(self._data):
                self._base = pos
                self._data = self._src.read_at(pos, min(SEARCH_CHUNK, self._end - pos))
                if len(self._data) < len(needle):
                    return -1  # short read: the source ends here
            limit = min(stop, self._base + len(self._data))
            at = self._data.find(needle, pos - self._base, limit - self._base)
            if at >= 0:
                return self._base + at
            if limit == stop:
                return -1
            pos = limit - len(needle) + 1
        return -1


def find_each(src: ByteSource, start: int, end: int, needle: bytes) -> Iterator[int]:
    """The offset of every occurrence of ``needle`` in ``[start, end)``, in order."""
    for at, _ in find_each_read(src, start, end, needle, read=0):
        yield at


def find_each_read(
    src: ByteSource, start: int, end: int, needle: bytes, *, read: int
) -> Iterator[tuple[int, bytes]]:
    """(offset, the ``read`` bytes of ``src`` there) for every occurrence of ``needle``
    in ``[start, end)``, in order; the bytes come from the search's window where it
    holds them (``src.read_at`` otherwise, so they may run past ``end``)."""
    searcher = Searcher(src, end)
    at = searcher.find(needle, start, end)
    while at >= 0:
        yield at, searcher.read_at(at, read) if read else b""
        at = searcher.find(needle, at + 1, end)
