"""Where a zstd stream's frames end, walked over the compressed bytes as they are read.

python-zstandard's stream reader ends quietly where its input ends inside a frame;
the zstd reader containerd unpacks layers with (klauspost/compress ``zstd.Decoder``,
which reads frames one after another, skippable frames too) stops there with
"unexpected EOF". :class:`FrameWalk` follows the frame format (RFC 8878, section
3.1: frame header, block headers and their sizes, the optional checksum; section
3.1.2: skippable frames) from the headers alone, so a layer whose zstd stream ends
inside a frame is told apart without decompressing anything a second time.
"""

from __future__ import annotations

import io
from typing import IO, Any

ZSTD_FRAME = 0xFD2FB528  # RFC 8878 3.1.1, Magic_Number (little-endian)
_DICT_ID = (0, 1, 2, 4)  # Dictionary_ID_Flag -> field size
_FCS = (0, 2, 4, 8)  # Frame_Content_Size_Flag -> field size (0: 1 byte if single segment)


class FrameWalk:
    """The frame structure of bytes fed in order (:meth:`update`); :attr:`between`
    says whether they end between frames. Bytes that are no zstd frame stop the
    walk (the decompressor refuses them itself)."""

    def __init__(self) -> None:
        self._want = 4  # bytes of the field being read
        self._field = bytearray()
        self._skip = 0  # bytes to pass over (block contents, skippable frames)
        self._state = "magic"
        self._checksum = False
        self.lost = False

    @property
    def between(self) -> bool:
        return self.lost or (self._state == "magic" and not self._field and not self._skip)

    def update(self, data: Any) -> None:
        view, at = memoryview(data), 0
        while at < len(view) and not self.lost:
            if self._skip:
                step = min(self._skip, len(view) - at)
                self._skip -= step
                at += step
                continue
            step = min(self._want - len(self._field), len(view) - at)
            self._field += view[at : at + step]
            at += step
            if len(self._field) == self._want:
                field = bytes(self._field)
                self._field.clear()
                self._next(int.from_bytes(field, "little"))

    def _next(self, value: int) -> None:
        state = self._state
        if state == "magic":
            if value == ZSTD_FRAME:
                self._state, self._want = "descriptor", 1
            elif value & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame: its size next
                self._state, self._want = "skippable", 4
            else:
                self.lost = True
        elif state == "skippable":
            self._skip, self._state, self._want = value, "magic", 4
        elif state == "descriptor":  # Frame_Header_Descriptor, then the rest of the header
            single = value >> 5 & 1
            fcs = _FCS[value >> 6] or single
            self._checksum = bool(value >> 2 & 1)
            self._skip = (0 if single else 1) + _DICT_ID[value & 3] + fcs
            self._state, self._want = "block", 3
        elif state == "block":  # Block_Header: Last_Block, Block_Type, Block_Size
            kind, size = value >> 1 & 3, value >> 3
            if kind == 3:  # reserved
                self.lost = True
                return
            self._skip = 1 if kind == 1 else size  # an RLE block stores one byte
            if value & 1:
                self._skip += 4 if self._checksum else 0
                self._state, self._want = "magic", 4


class WalkedReader(io.RawIOBase):
    """``inner`` read through, its bytes walked (:class:`FrameWalk`); its end, where
    it falls inside a frame, raises EOFError as the decompressor's reader should."""

    def __init__(self, inner: IO[bytes]) -> None:
        super().__init__()
        self.inner = inner
        self.walk = FrameWalk()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(len(buffer))
        if data:
            buffer[: len(data)] = data
            self.walk.update(data)
        elif not self.walk.between:
            raise EOFError("the zstd stream ends inside a frame")
        return len(data)
