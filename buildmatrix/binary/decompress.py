"""Compressed fatbinary entries, decompressed as the CUDA runtime and cuobjdump do.

nvcc compresses an entry's payload when the fatbinary is built with ``-Xfatbin
-compress-all`` (or, for large entries, by default) and marks it in the entry
header's flags (docs/inspect.md; ZLUDA ``dark_api/src/fatbin.rs``,
``get_or_decompress_content``; n-eiling/cuda-fatbin-decompression,
``fatbin-decompress.h``):

- ``0x2000``: a raw LZ4 block (no frame), what ``--compress-mode=speed`` writes and
  what the CUDA 12.x compilers wrote by default;
- ``0x8000``: one Zstandard frame, what nvcc 13 writes with
  ``--compress-mode=default``, ``size`` and ``balance``.

The entry header gives both sizes: ``+16 u32`` the compressed bytes (the payload
that follows is padded to 8 bytes after them) and ``+56 u64`` the uncompressed size.
Established with nvcc 13.0 on this project's fixtures: every mode decompresses to
the very bytes of the uncompressed build's cubin (tests/test_decompress.py).

Two bounds keep a decompression bomb out, neither a size real libraries reach
(docs/security.md, "Bounds", gives the measurements and the commands):

- **ratio**: an entry may not claim more uncompressed bytes than :data:`MAX_RATIO`
  times its compressed ones. A raw LZ4 block cannot hold more than 255:1 (the
  format: a match grows by at most 255 bytes per input byte); for Zstandard the
  bound is 1024:1, five times the largest ratio in NVIDIA's wheels and torch (207:1,
  an sm_120 cubin of torch 2.14.1's libtorch_cuda.so). A claim past it is refused
  before anything is allocated; a payload that decompresses to more or fewer bytes
  than its header says is corrupt.
- **memory**: an entry is decompressed whole in memory only up to
  :data:`MAX_IN_MEMORY` (256 MiB, twice the largest entry measured: NCCL 2.32.3's
  sm_100 cubin, 134,372,904 bytes, an LZ4 block). A larger Zstandard frame is read
  through :class:`ZstdStream`: each read decodes it again from its start and keeps
  only the bytes asked for, within its window (8 MiB in nvcc's frames, at most
  :data:`_MAX_WINDOW`). A raw LZ4 block past the budget is refused: the format
  cannot be decoded in parts, so its whole output would have to be held.
"""

from __future__ import annotations

import io
from typing import Any

from buildmatrix.binary.source import ByteSource, BytesSource, CorruptBinary, read_exact

FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
COMPRESSION_FLAGS = FLAG_LZ4 | FLAG_ZSTD

# Uncompressed bytes per compressed byte an entry may claim (module docstring): LZ4's
# own limit, and for Zstandard five times the largest measured (207:1, torch 2.14.1).
MAX_RATIO = {FLAG_LZ4: 255, FLAG_ZSTD: 1024}
_RATIO_SLACK = 64  # a tiny block's fixed overhead
# The most of one entry held decompressed in memory: twice the largest entry of
# NVIDIA's wheels and torch (NCCL 2.32.3's sm_100 cubin, 134,372,904 bytes); the
# admission DaemonSet's container has 512 MiB (docs/security.md, "Bounds").
MAX_IN_MEMORY = 256 << 20
# Zstandard's window bounds the streaming decoder's own memory (its default limit,
# 128 MiB); nvcc's frames use 8 MiB.
_MAX_WINDOW = 1 << 27
_SKIP_CHUNK = 1 << 20
_METHODS = {FLAG_LZ4: "LZ4", FLAG_ZSTD: "Zstandard"}


def checked_method(flags: int, *, size: int, packed: int, name: str) -> int:
    """The compression method of ``flags`` (:data:`FLAG_LZ4` or :data:`FLAG_ZSTD`),
    once ``size`` uncompressed bytes from ``packed`` compressed ones are within the
    ratio bound; refused (:class:`CorruptBinary`) before anything is allocated."""
    method = flags & COMPRESSION_FLAGS
    if method not in (FLAG_LZ4, FLAG_ZSTD):
        raise CorruptBinary(
            f"{name}: compression flags {method:#x} name no known method "
            f"(0x2000 LZ4, 0x8000 Zstandard)."
        )
    if size <= 0:
        raise CorruptBinary(f"{name}: claims {size} bytes uncompressed.")
    if size > MAX_RATIO[method] * packed + _RATIO_SLACK:
        raise CorruptBinary(
            f"{name}: claims {size} bytes uncompressed from {packed} compressed bytes, "
            f"more than {_METHODS[method]} may at {MAX_RATIO[method]}:1 (real CUDA "
            "libraries stay below 210:1), so buildmatrix refuses it as a decompression "
            "bomb."
        )
    return method


def _held_whole(method: int, size: int, name: str) -> None:
    """Refuse an entry too large to decompress whole in memory."""
    if size > MAX_IN_MEMORY:
        how = (
            "an LZ4 block can only be decoded whole" if method == FLAG_LZ4 else "it is asked whole"
        )
        raise CorruptBinary(
            f"{name}: claims {size} bytes uncompressed; {how}, and buildmatrix holds at "
            f"most {MAX_IN_MEMORY >> 20} MiB of one entry in memory (twice the largest "
            "entry of NVIDIA's libraries), so it refuses this one."
        )


def decompress_payload(data: bytes, *, flags: int, size: int, name: str) -> bytes:
    """The ``size`` uncompressed bytes of a compressed entry payload ``data``.

    ``name`` names the entry in messages. Raises :class:`CorruptBinary` for a claim
    past the ratio bound or the memory budget, an unknown or doubled compression
    flag, and any payload that does not decompress to exactly ``size`` bytes.
    """
    method = checked_method(flags, size=size, packed=len(data), name=name)
    _held_whole(method, size, name)
    out = _lz4(data, size, name) if method == FLAG_LZ4 else _zstd(data, size, name)
    if len(out) != size:
        raise CorruptBinary(
            f"{name}: decompresses to {len(out)} bytes, but its header says {size}."
        )
    return out


def _lz4(data: bytes, size: int, name: str) -> bytes:
    import lz4.block

    try:
        # uncompressed_size is the output buffer: LZ4_decompress_safe never writes past
        # it, and the ratio bound sized it only for what the block can make.
        out: bytes = lz4.block.decompress(data, uncompressed_size=size)
    except lz4.block.LZ4BlockError as exc:
        raise CorruptBinary(f"{name}: not a valid LZ4 block ({exc}).") from None
    return out


def _zstd(data: bytes, size: int, name: str) -> bytes:
    import zstandard

    dctx = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW)
    chunks: list[bytes] = []
    have = 0
    try:
        # Read at most one byte past the header's size: a frame that claims (or holds)
        # more is refused without decompressing the rest.
        with dctx.stream_reader(data, read_across_frames=False) as reader:
            while have <= size:
                chunk = reader.read(size + 1 - have)
                if not chunk:
                    break
                chunks.append(chunk)
                have += len(chunk)
    except zstandard.ZstdError as exc:
        raise CorruptBinary(f"{name}: not a valid Zstandard frame ({exc}).") from None
    return b"".join(chunks)


class _Reader(io.RawIOBase):
    """``size`` bytes of a source from ``at`` as a file, for a streaming decoder."""

    def __init__(self, src: ByteSource, at: int, size: int) -> None:
        super().__init__()
        self._src, self._at, self._end = src, at, at + size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._src.read_at(self._at, min(len(view), self._end - self._at))
        view[: len(data)] = data
        self._at += len(data)
        return len(data)


def _frame_reader(src: ByteSource, at: int, packed: int) -> Any:
    """A streaming reader of the Zstandard frame of ``packed`` bytes at ``at``."""
    import zstandard

    dctx = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW)
    return dctx.stream_reader(
        io.BufferedReader(_Reader(src, at, packed), 16384),
        read_size=16384,
        read_across_frames=False,
    )


class ZstdStream:
    """The ``size`` bytes a Zstandard frame of ``packed`` bytes at ``at`` in ``src``
    decompresses to, as a source that never holds them: each read decodes the frame
    again from its start, discards what comes before the offset and keeps what was
    asked for. For an entry past :data:`MAX_IN_MEMORY`: a cubin's ELF header, section
    table, symbol table and notes are a handful of reads (buildmatrix.binary.cubin)."""

    def __init__(self, src: ByteSource, at: int, packed: int, *, size: int, name: str) -> None:
        self._src, self._at, self._packed = src, at, packed
        self._size, self._name = size, name

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, size: int) -> bytes:
        import zstandard

        size = max(0, min(size, self._size - offset))
        if offset < 0 or size == 0:
            return b""
        out = bytearray()
        try:
            with _frame_reader(self._src, self._at, self._packed) as reader:
                skip = offset
                while skip and (chunk := reader.read(min(skip, _SKIP_CHUNK))):
                    skip -= len(chunk)
                while not skip and len(out) < size and (chunk := reader.read(size - len(out))):
                    out += chunk
        except zstandard.ZstdError as exc:
            raise CorruptBinary(f"{self._name}: not a valid Zstandard frame ({exc}).") from None
        if len(out) != size:
            raise CorruptBinary(
                f"{self._name}: decompresses to fewer bytes than its header says "
                f"({self._size}): it ends before offset {offset + size:#x}."
            )
        return bytes(out)


def decompressed_source(
    src: ByteSource,
    at: int,
    packed: int,
    *,
    flags: int,
    size: int,
    name: str,
    budget: int = MAX_IN_MEMORY,
) -> ByteSource:
    """The ``size`` bytes the compressed payload of ``packed`` bytes at ``at`` in
    ``src`` decompresses to, as a source: a Zstandard frame in memory up to ``budget``
    bytes and a :class:`ZstdStream` past it; an LZ4 block always in memory, refused
    past :data:`MAX_IN_MEMORY`. Bounded by the ratio before anything is read."""
    method = checked_method(flags, size=size, packed=packed, name=name)
    if size <= budget or method == FLAG_LZ4:
        data = read_exact(src, at, packed, what="compressed fatbin entry")
        return BytesSource(decompress_payload(data, flags=flags, size=size, name=name), name=name)
    if at < 0 or at + packed > src.size:
        raise CorruptBinary(f"{name}: its {packed} compressed bytes run past the file's end.")
    return ZstdStream(src, at, packed, size=size, name=name)


def decompress_head(
    src: ByteSource, at: int, packed: int, *, flags: int, size: int, limit: int, name: str
) -> bytes:
    """The first ``limit`` uncompressed bytes (fewer where the payload is shorter) of
    the compressed payload of ``packed`` bytes at ``at`` in ``src``: a PTX text's
    head, for its directives. A Zstandard frame is decoded only that far (streaming);
    a raw LZ4 block is decoded whole, which its C decoder does faster than a reader
    that stops could (cuFFT 12's 8,131 PTX texts: 389 MiB in 0.6 s of CPU)."""
    method = checked_method(flags, size=size, packed=packed, name=name)
    if at + packed > src.size:
        raise CorruptBinary(f"{name}: its {packed} compressed bytes run past the file's end.")
    want = min(limit, size)
    if method == FLAG_LZ4:  # no stop inside a block: lz4's C decoder outruns any head reader
        whole = src.read_at(at, packed)
        return decompress_payload(whole, flags=flags, size=size, name=name)[:want]
    import zstandard

    chunks: list[bytes] = []
    have = 0
    try:
        with _frame_reader(src, at, packed) as reader:
            while have < want and (chunk := reader.read(want - have)):
                chunks.append(chunk)
                have += len(chunk)
    except zstandard.ZstdError as exc:
        raise CorruptBinary(f"{name}: not a valid Zstandard frame ({exc}).") from None
    return b"".join(chunks)
