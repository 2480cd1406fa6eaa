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

The uncompressed size bounds the output: a size past :data:`MAX_UNCOMPRESSED` is
refused before anything is allocated, and a payload that would decompress to more
or fewer bytes than its header says is corrupt.
"""

from __future__ import annotations

import io
from typing import Any

from buildmatrix.binary.source import ByteSource, CorruptBinary

FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
COMPRESSION_FLAGS = FLAG_LZ4 | FLAG_ZSTD

# ZLUDA's bound for one module (MAX_MODULE_DECOMPRESSION_BOUND, dark_api/src/fatbin.rs),
# and the in-memory bound of a candidate file (docs/check.md, memory bound). The largest
# cubin in the libraries of the tests (torch 2.14.1, cuBLAS 13, cuDNN 9) is far below it.
MAX_UNCOMPRESSED = 64 << 20
# Zstandard's window bounds the decoder's own memory (its default limit is 128 MiB);
# no frame of an entry of at most MAX_UNCOMPRESSED bytes needs a larger one.
_MAX_WINDOW = 1 << 27
_LZ4_MAX_RATIO = 255
_LZ4_SLACK = 64


def decompress_payload(data: bytes, *, flags: int, size: int, name: str) -> bytes:
    """The ``size`` uncompressed bytes of a compressed entry payload ``data``.

    ``name`` names the entry in messages. Raises :class:`CorruptBinary` for a size
    past the bound, an unknown or doubled compression flag, and any payload that does
    not decompress to exactly ``size`` bytes.
    """
    method = flags & COMPRESSION_FLAGS
    if method not in (FLAG_LZ4, FLAG_ZSTD):
        raise CorruptBinary(
            f"{name}: compression flags {method:#x} name no known method "
            f"(0x2000 LZ4, 0x8000 Zstandard)."
        )
    if not 0 < size <= MAX_UNCOMPRESSED:
        raise CorruptBinary(
            f"{name}: claims {size} bytes uncompressed; buildmatrix decompresses at most "
            f"{MAX_UNCOMPRESSED >> 20} MiB per entry, so it refuses this one."
        )
    out = _lz4(data, size, name) if method == FLAG_LZ4 else _zstd(data, size, name)
    if len(out) != size:
        raise CorruptBinary(
            f"{name}: decompresses to {len(out)} bytes, but its header says {size}."
        )
    return out


def _lz4(data: bytes, size: int, name: str) -> bytes:
    import lz4.block

    # The block format (lz4 doc/lz4_Block_format.md) grows a match by at most 255 bytes
    # per input byte, so a block cannot hold more: the output buffer, allocated whole
    # before decoding, is sized only for what the input can make.
    if size > _LZ4_MAX_RATIO * len(data) + _LZ4_SLACK:
        raise CorruptBinary(
            f"{name}: claims {size} bytes uncompressed from a {len(data)}-byte LZ4 block, "
            "more than such a block can hold."
        )
    try:
        # uncompressed_size is the output buffer: LZ4_decompress_safe never writes past it.
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


def decompress_head(
    src: ByteSource, at: int, packed: int, *, flags: int, size: int, limit: int, name: str
) -> bytes:
    """The first ``limit`` uncompressed bytes (fewer where the payload is shorter) of
    the compressed payload of ``packed`` bytes at ``at`` in ``src``: a PTX text's
    head, for its directives. A Zstandard frame is decoded only that far (streaming);
    a raw LZ4 block is decoded whole, which its C decoder does faster than a reader
    that stops could (cuFFT 12's 8,131 PTX texts: 389 MiB in 0.6 s of CPU)."""
    method = flags & COMPRESSION_FLAGS
    if method not in (FLAG_LZ4, FLAG_ZSTD) or not 0 < size <= MAX_UNCOMPRESSED:
        return decompress_payload(b"", flags=flags, size=size, name=name)  # its refusal
    if at + packed > src.size:
        raise CorruptBinary(f"{name}: its {packed} compressed bytes run past the file's end.")
    want = min(limit, size)
    if method == FLAG_LZ4:  # no stop inside a block: lz4's C decoder outruns any head reader
        whole = src.read_at(at, packed)
        return decompress_payload(whole, flags=flags, size=size, name=name)[:want]
    import zstandard

    chunks: list[bytes] = []
    have = 0
    dctx = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW)
    try:
        with dctx.stream_reader(
            io.BufferedReader(_Reader(src, at, packed), 16384),
            read_size=16384,
            read_across_frames=False,
        ) as reader:
            while have < want and (chunk := reader.read(want - have)):
                chunks.append(chunk)
                have += len(chunk)
    except zstandard.ZstdError as exc:
        raise CorruptBinary(f"{name}: not a valid Zstandard frame ({exc}).") from None
    return b"".join(chunks)
