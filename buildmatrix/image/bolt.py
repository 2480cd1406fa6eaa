"""A small read-only reader of bbolt files (go.etcd.io/bbolt), for containerd's
metadata store (``io.containerd.metadata.v1.bolt/meta.db``).

The on-disk format, from bbolt's ``internal/common`` (page.go, meta.go, bucket.go):

- every page starts with a 16-byte header: ``id u64, flags u16, count u16,
  overflow u32`` (flags: 0x01 branch, 0x02 leaf, 0x04 meta, 0x10 freelist); a page
  with ``overflow`` n spans n + 1 pages;
- pages 0 and 1 are meta pages: after the header, ``magic u32 (0xED0CDAED), version
  u32 (2), pageSize u32, flags u32, root {pgid u64, sequence u64}, freelist u64,
  pgid u64 (high-water mark), txid u64, checksum u64``, the checksum being FNV-1a
  64 over the 56 bytes before it (``Meta.Sum64``); the valid one with the higher
  txid is the database (``DB.meta`` in db.go);
- branch elements are ``pos u32, ksize u32, pgid u64``; leaf elements ``flags u32,
  pos u32, ksize u32, vsize u32``; ``pos`` counts from the element itself;
- a leaf value with flag 0x01 (``BucketLeafFlag``) is a nested bucket: a 16-byte
  ``InBucket {root pgid, sequence}`` and, where root is 0, an inline page right
  after it (``Bucket.openBucket`` in bucket.go).

Reading while containerd writes is safe by bbolt's copy-on-write: a write
transaction never writes a page reachable from the last committed meta page; it
writes new or freed pages, fsyncs them, and then the other meta page
(``Tx.Commit``: write, then writeMeta). Pages the next commit frees are reused only
by a later write transaction. So a walk that starts from the meta page with txid N
and finds N still the newest afterwards saw one committed state;
:func:`read_consistent` retries the walk otherwise. Nothing is locked (bbolt's
flock would block on the daemon's exclusive lock) and nothing is written.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

MAGIC = 0xED0CDAED
VERSION = 2
PAGE_HEADER = struct.Struct("<QHHI")  # id, flags, count, overflow
META = struct.Struct("<IIIIQQQQQQ")  # magic .. txid, checksum
BRANCH = struct.Struct("<IIQ")  # pos, ksize, pgid
LEAF = struct.Struct("<IIII")  # flags, pos, ksize, vsize
BUCKET_HEADER = 16
BRANCH_PAGE, LEAF_PAGE, META_PAGE = 0x01, 0x02, 0x04
BUCKET_LEAF = 0x01
MAX_DEPTH = 32  # a B+tree of 4 KiB pages this deep would hold more than any disk
MAX_READS = 1 << 20  # page reads in one walk; a metadata lookup needs a few dozen
MAX_PAGE_BYTES = 1 << 30  # bbolt's maxAllocSize is 0x7FFFFFFF; a metadata page is far less
ATTEMPTS = 8

T = TypeVar("T")


class BoltError(Exception):
    """The file is not a bbolt database, or a page is out of its bounds."""


class BoltBusy(BoltError):
    """Every walk met a newer commit: the database is being written too fast to read."""


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@dataclass(frozen=True, kw_only=True)
class Meta:
    page_size: int
    root: int
    high_water: int
    txid: int


def _meta(page: bytes) -> Meta | None:
    """The meta in a page, or None where it does not validate (``Meta.Validate``)."""
    if len(page) < PAGE_HEADER.size + META.size:
        return None
    _, flags, _, _ = PAGE_HEADER.unpack_from(page)
    fields = META.unpack_from(page, PAGE_HEADER.size)
    magic, version, page_size, _, root, _, _, pgid, txid, checksum = fields
    body = page[PAGE_HEADER.size : PAGE_HEADER.size + META.size - 8]
    if flags != META_PAGE or magic != MAGIC or version != VERSION or checksum != fnv1a64(body):
        return None
    return Meta(page_size=page_size, root=root, high_water=pgid, txid=txid)


class BoltFile:
    """One committed state of a bbolt file, read with ``pread`` (no lock, no mmap)."""

    def __init__(self, fd: int, *, name: str) -> None:
        self.fd, self.name = fd, name
        self.meta = self._newest_meta()
        self.reads = 0

    def _newest_meta(self) -> Meta:
        first = _meta(os.pread(self.fd, 4096, 0))
        # As DB.mmap: page 1 lies one page size on, the size from page 0 if it is valid.
        sizes = [first.page_size] if first else [4096, 8192, 16384, 65536]
        found = [m for m in [first] if m]
        for size in sizes:
            if (second := _meta(os.pread(self.fd, 4096, size))) is not None:
                found.append(second)
                break
        found = [m for m in found if 512 <= m.page_size <= 1 << 20 and m.root < m.high_water]
        if not found:
            raise BoltError(f"{self.name}: not a bbolt database (no valid meta page).")
        return max(found, key=lambda m: m.txid)

    def newest_txid(self) -> int:
        return self._newest_meta().txid

    def page(self, pgid: int) -> bytes:
        size = self.meta.page_size
        self.reads += 1
        if self.reads > MAX_READS:
            raise BoltError(f"{self.name}: more than {MAX_READS} page reads for one lookup.")
        if not 2 <= pgid < self.meta.high_water:
            raise BoltError(f"{self.name}: page {pgid} is outside the database.")
        head = os.pread(self.fd, size, pgid * size)
        if len(head) < PAGE_HEADER.size:
            raise BoltError(f"{self.name}: page {pgid} is past the end of the file.")
        got, flags, _, overflow = PAGE_HEADER.unpack_from(head)
        if got != pgid or flags not in (BRANCH_PAGE, LEAF_PAGE):
            raise BoltError(f"{self.name}: page {pgid} is not a tree page (id {got}).")
        total = (overflow + 1) * size
        if total > MAX_PAGE_BYTES or pgid + overflow >= self.meta.high_water:
            raise BoltError(f"{self.name}: page {pgid} claims {overflow} overflow pages.")
        data = head if overflow == 0 else os.pread(self.fd, total, pgid * size)
        if len(data) < total:
            raise BoltError(f"{self.name}: page {pgid} is cut short by the end of the file.")
        return data

    def root(self) -> Bucket:
        return Bucket(file=self, root=self.meta.root, inline=None)


@dataclass(frozen=True, kw_only=True)
class Bucket:
    file: BoltFile
    root: int
    inline: bytes | None  # the inline page of a bucket whose root is 0

    def items(self) -> Iterator[tuple[bytes, bytes, bool]]:
        """Every (key, value, is_bucket) in key order."""
        if self.inline is not None:
            yield from _leaf_items(self.inline, name=self.file.name)
        else:
            yield from self._walk(self.root, 0, set())

    def _walk(self, pgid: int, depth: int, seen: set[int]) -> Iterator[tuple[bytes, bytes, bool]]:
        if depth > MAX_DEPTH:
            raise BoltError(f"{self.file.name}: the tree is deeper than {MAX_DEPTH} pages.")
        if pgid in seen:  # a B+tree reaches each page once; a loop is a broken file
            raise BoltError(f"{self.file.name}: page {pgid} is reached twice in one bucket.")
        seen.add(pgid)
        page = self.file.page(pgid)
        _, flags, count, _ = PAGE_HEADER.unpack_from(page)
        if flags == LEAF_PAGE:
            yield from _leaf_items(page, name=self.file.name)
            return
        for i in range(count):
            at = PAGE_HEADER.size + i * BRANCH.size
            _check(page, at + BRANCH.size, name=self.file.name)
            _, _, child = BRANCH.unpack_from(page, at)
            yield from self._walk(child, depth + 1, seen)

    def get(self, key: bytes) -> tuple[bytes, bool] | None:
        """(value, is_bucket) for ``key``, or None."""
        for k, value, is_bucket in self.items():
            if k == key:
                return value, is_bucket
            if k > key:
                return None
        return None

    def bucket(self, *keys: bytes) -> Bucket | None:
        """The nested bucket at ``keys`` (as containerd's ``getBucket``), or None."""
        found: Bucket | None = self
        for key in keys:
            entry = found.get(key) if found is not None else None
            if entry is None or not entry[1]:
                return None
            found = self.open(entry[0])
        return found

    def open(self, value: bytes) -> Bucket:
        """The nested bucket a bucket-flagged value holds."""
        if len(value) < BUCKET_HEADER:
            raise BoltError(f"{self.file.name}: a bucket value of {len(value)} bytes.")
        (root,) = struct.unpack_from("<Q", value)
        inline = value[BUCKET_HEADER:] if root == 0 else None
        if inline is not None and len(inline) < PAGE_HEADER.size:
            raise BoltError(f"{self.file.name}: an inline bucket without its page.")
        return Bucket(file=self.file, root=root, inline=inline)


def _check(page: bytes, end: int, *, name: str) -> None:
    if end > len(page):
        raise BoltError(f"{name}: an element runs past the end of its page.")


def _leaf_items(page: bytes, *, name: str) -> Iterator[tuple[bytes, bytes, bool]]:
    _, flags, count, _ = PAGE_HEADER.unpack_from(page)
    if flags != LEAF_PAGE:
        raise BoltError(f"{name}: expected a leaf page, found flags {flags:#x}.")
    for i in range(count):
        at = PAGE_HEADER.size + i * LEAF.size
        _check(page, at + LEAF.size, name=name)
        elem_flags, pos, ksize, vsize = LEAF.unpack_from(page, at)
        start = at + pos
        _check(page, start + ksize + vsize, name=name)
        key = page[start : start + ksize]
        value = page[start + ksize : start + ksize + vsize]
        yield key, value, bool(elem_flags & BUCKET_LEAF)


def read_consistent(path: Path, walk: Callable[[Bucket], T]) -> T:
    """``walk(root bucket)`` over one committed state of the file at ``path``.

    Raises :class:`OSError` where the file cannot be opened, :class:`BoltError` where
    it is not a bbolt file or keeps changing under ``ATTEMPTS`` walks.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for _ in range(ATTEMPTS):
            db = BoltFile(fd, name=str(path))
            try:
                result = walk(db.root())
            except Exception:  # a walk over pages rewritten under it may fail any way
                if db.newest_txid() == db.meta.txid:
                    raise  # the state did not move: the file itself is broken
                continue
            if db.newest_txid() == db.meta.txid:
                return result
        raise BoltBusy(f"{path}: the database changed during each of {ATTEMPTS} reads.")
    finally:
        os.close(fd)
