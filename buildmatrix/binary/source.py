"""Random-access byte sources: the readers ask for (offset, size) and nothing more."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
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

    def __init__(self, data: bytes, *, name: str) -> None:
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


SEARCH_CHUNK = 8 << 20  # searches read in chunks of this size: memory stays bounded


def find_all(
    src: ByteSource, start: int, end: int, needles: Sequence[bytes]
) -> Iterator[tuple[int, bytes]]:
    """(offset, needle) of every occurrence of the needles in ``[start, end)``, in
    offset order, read chunk by chunk; a needle cut by a chunk's end is found whole."""
    overlap = max(len(n) for n in needles) - 1
    pos = start
    while pos < end:
        size = min(SEARCH_CHUNK, end - pos)
        chunk = src.read_at(pos, min(size + overlap, end - pos))
        found = []
        for needle in needles:
            at = chunk.find(needle)
            while 0 <= at < size:
                found.append((pos + at, needle))
                at = chunk.find(needle, at + 1)
        yield from sorted(found)
        pos += size
