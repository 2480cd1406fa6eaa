"""Tar streams read once, front to back: plain or compressed (told by magic bytes, as
the engines tell it), through tarfile's seekable reader over a forward-only stream."""

from __future__ import annotations

import io
import tarfile
from typing import IO, Any, cast

from buildmatrix.errors import InputError
from buildmatrix.image.digests import BesideHasher
from buildmatrix.image.paxheaders import TarHeaderError
from buildmatrix.image.tarheaders import StrictTarInfo, TruncatedTar

# Tar streams are read with tarfile's seekable reader over a forward-only stream
# (ForwardReader): headers come from a buffer of this size, file data is read straight
# into the caller's buffer or dropped, and never copied through tarfile's stream
# buffer (its "r|" mode copies its whole buffer on every read).
TAR_BUFSIZE = 256 << 10
CHUNK = 1 << 20  # read buffer for decompression and for bytes a seek skips

GZIP_MAGIC, ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"  # how compression is told
# The compressions a layer may carry. Docker's ``docker load`` (moby
# ``image/tarexport/load.go`` ``loadLayer`` -> ``DecompressStream``, moby/go-archive
# ``compression/compression.go``; Docker 20.10: ``pkg/archive/archive.go``) inflates
# gzip, bzip2, xz and (Docker 23 on) zstd layers; containerd (its applier and
# ``core/images/archive/importer.go``, by ``pkg/archive/compression``
# ``DetectCompression``) knows gzip and zstd only and takes anything else for a
# plain tar.
ENGINE_LOAD = frozenset({"gzip", "bzip2", "xz", "zstd"})
CONTAINERD = frozenset({"gzip", "zstd"})


def detect(head: bytes) -> str | None:
    """The compression ``head`` (a stream's first 8 bytes or more) opens with, by
    the magic bytes of moby/go-archive ``compression_detect.go`` ``Detect`` (a zstd
    stream may open with a skippable frame, 0x184D2A5?), gzip by its two ID bytes;
    None: a plain tar."""
    if head[:2] == GZIP_MAGIC:
        return "gzip"
    if head[:3] == b"BZh":
        return "bzip2"
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz"
    if head[:4] == ZSTD_MAGIC or (
        len(head) >= 8 and int.from_bytes(head[:4], "little") & 0xFFFFFFF0 == 0x184D2A50
    ):
        return "zstd"
    return None


class UnsupportedCompression(InputError):
    """A layer compressed in a way the runtime that would unpack it does not read."""


def open_tar_stream(
    stream: IO[bytes],
    *,
    name: str,
    diff_id: str | None = None,
    blob_digest: str | None = None,
    kinds: frozenset[str] = CONTAINERD,
) -> tarfile.TarFile:
    """A streaming tar reader over a plain or compressed layer (by magic bytes,
    :func:`detect`); ``kinds``: the compressions the runtime that unpacks it reads
    (:data:`CONTAINERD`, or :data:`ENGINE_LOAD` for a ``docker load`` archive), any
    other is refused (:class:`UnsupportedCompression`).

    With ``diff_id`` (the config's digest of the uncompressed layer), the tar stream
    is hashed as it is read, on a thread beside the reader (buildmatrix.image.digests;
    :func:`tar_digest` then drains and names it; closing the tar's ``fileobj`` stops
    that thread), except
    where the layer is stored uncompressed and its blob digest, verified by the
    caller, is a SHA-256: the blob digest is then the diff_id, or the layer is not
    the one the config names (:class:`DiffIdMismatch`, at once)."""
    buffered = (
        stream
        if isinstance(stream, io.BufferedReader)
        else io.BufferedReader(cast(io.RawIOBase, stream), buffer_size=CHUNK)
    )
    kind = detect(buffered.peek(8)[:8])
    if kind is not None and kind not in kinds:
        raise UnsupportedCompression(
            f"{name}: the layer is {kind}-compressed. containerd reads gzip and zstd "
            "layers only (pkg/archive/compression, DetectCompression) and takes any "
            "other for a plain tar, which this is not, so no node's containerd unpacks "
            "it (only Docker's docker load of a docker save archive inflates bzip2 and "
            "xz layers). Refused; recompress the layer with gzip or zstd."
        )
    hasher = None
    if diff_id is not None:
        if kind is None and blob_digest is not None and blob_digest.startswith("sha256:"):
            if blob_digest != diff_id:
                raise DiffIdMismatch(blob_digest)
        else:
            hasher = BesideHasher()
    if kind == "gzip":
        # ISA-L's gzip reader decompresses ~1.7x faster than zlib's (docs/check.md).
        from isal import igzip

        gunzipped = igzip.IGzipFile(fileobj=buffered, mode="rb")  # type: ignore[no-untyped-call]
        return _open(cast(IO[bytes], gunzipped), hasher)
    if kind == "zstd":
        import zstandard

        from buildmatrix.image.zstdframes import WalkedReader

        # Frames one after another, as containerd's zstd reader reads them; a stream
        # cut inside a frame raises (python-zstandard's reader would end quietly).
        walked = io.BufferedReader(WalkedReader(buffered), buffer_size=CHUNK)
        reader = zstandard.ZstdDecompressor().stream_reader(
            walked, read_size=CHUNK, read_across_frames=True
        )
        return _open(reader, hasher)
    if kind == "bzip2":  # streams one after another, as Go's compress/bzip2 reads them
        import bz2

        return _open(cast(IO[bytes], bz2.BZ2File(buffered)), hasher)
    if kind == "xz":  # streams one after another, as xz -d (moby's xzDecompress) reads
        import lzma

        return _open(cast(IO[bytes], lzma.LZMAFile(buffered)), hasher)
    return _open(buffered, hasher)


def _open(stream: IO[bytes], hasher: Any = None) -> tarfile.TarFile:
    return open_forward(stream, tarinfo=StrictTarInfo, hasher=hasher)


def open_forward(
    stream: IO[bytes], *, tarinfo: type[tarfile.TarInfo] = tarfile.TarInfo, hasher: Any = None
) -> tarfile.TarFile:
    """tarfile's seekable reader over a stream read once, front to back (hashed as
    it is read, with a ``hashlib`` object or a :class:`BesideHasher`)."""
    buffered = io.BufferedReader(ForwardReader(stream, hasher=hasher), buffer_size=TAR_BUFSIZE)
    try:
        return tarfile.open(fileobj=buffered, mode="r:", tarinfo=tarinfo)
    except BaseException:
        buffered.close()  # no hashing thread outlives a stream that is not a tar
        raise


class DiffIdMismatch(Exception):
    """A layer whose uncompressed content is not the digest its config names: the
    digest it has."""


def tar_digest(tar: tarfile.TarFile) -> str | None:
    """The SHA-256 of the whole tar stream, once the rest (what follows the end of
    the archive: padding) is read, or None where it was not hashed."""
    buffered = tar.fileobj
    raw = getattr(buffered, "raw", None)
    if not isinstance(raw, ForwardReader) or raw.hasher is None:
        return None
    raw.drain()
    return f"sha256:{raw.hasher.hexdigest()}"


def member_data(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    """A regular member's bytes as a file object, read straight from the tar's
    stream; a sparse member through the tar reader's map."""
    if member.issparse() or tar.fileobj is None:
        data = tar.extractfile(member)  # its bytes are not one run of the stream
        if data is None:  # pragma: no cover - regular members always have data
            raise tarfile.ReadError(f"{member.name}: no data")
        return data
    stream = cast(IO[bytes], tar.fileobj)
    return cast(IO[bytes], _MemberData(stream, member))


class _MemberData(io.RawIOBase):
    """A regular member's bytes, read straight from the tar's stream into the
    caller's buffer (tarfile's own member reader copies every read twice)."""

    def __init__(self, stream: IO[bytes], member: tarfile.TarInfo) -> None:
        super().__init__()
        self._stream, self._member, self._pos = stream, member, 0
        self._offset, self._size = member.offset_data, member.size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        self._stream.seek(self._offset + self._pos)  # where the tar reader left it
        got = self._stream.readinto(memoryview(buffer)[:n])  # type: ignore[attr-defined]
        if not got:
            raise TruncatedTar(data_cut(self._member))
        self._pos += got
        return int(got)


class ForwardReader(io.RawIOBase):
    """A stream read once, front to back, as a file tarfile's seekable reader can use:
    a seek forward reads and drops the bytes in between (a digest or progress count
    below still sees every byte), a seek back is an error. Member data the reader
    skips is so never copied into Python objects, nor the tar stream through
    tarfile's stream buffer."""

    def __init__(self, stream: IO[bytes], *, hasher: Any = None) -> None:
        super().__init__()
        self._stream = stream
        self._pos = 0
        self._scratch: bytearray | None = None
        # Every byte passes readinto once, in order: hashed there (the diff_id).
        self.hasher = hasher

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        # At most CHUNK at once (a buffered caller asks again for the rest): a hash
        # beside the reader then works on one piece while the next is decompressed.
        buffer = memoryview(buffer)[:CHUNK]
        readinto = getattr(self._stream, "readinto", None)
        if readinto is not None:
            n = readinto(buffer) or 0
        else:
            data = self._stream.read(len(buffer))
            n = len(data)
            buffer[:n] = data
        if self.hasher is not None and n:
            self.hasher.update(memoryview(buffer)[:n])
        self._pos += n
        return int(n)

    def close(self) -> None:
        """Closed, and a hash beside the reader stopped (the stream itself is the
        caller's)."""
        close = getattr(self.hasher, "close", None)
        if close is not None:
            close()
        super().close()

    def drain(self) -> None:
        """Read the stream to its end (the bytes are hashed and dropped)."""
        if self._scratch is None:
            self._scratch = bytearray(CHUNK)
        while self.readinto(self._scratch):
            pass

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            pos += self._pos
        elif whence != io.SEEK_SET:
            raise OSError("a tar stream has no known end to seek from")
        if pos < self._pos:
            raise OSError(f"a tar stream cannot go back (from {self._pos} to {pos})")
        if self._scratch is None:
            self._scratch = bytearray(CHUNK)
        view = memoryview(self._scratch)
        while self._pos < pos:
            if not self.readinto(view[: min(len(view), pos - self._pos)]):
                self._pos = pos  # the end: the next read returns nothing
                break
        return self._pos


def check_end(tar: tarfile.TarFile) -> None:
    """After the first zero block, Go's reader wants a second one (or the end of the
    stream); Python's stops at the first. A header there would be read by neither
    the same way, so anything but zeros is refused, and so is a second block cut
    short (Go: ``io.ReadFull``, "unexpected EOF")."""
    rest = tar.fileobj.read(tarfile.BLOCKSIZE) if tar.fileobj is not None else b""
    if rest and any(rest):
        raise TarHeaderError("data follows a single end-of-archive block")
    if rest and len(rest) != tarfile.BLOCKSIZE:
        raise TruncatedTar(
            f"the layer ends inside its end-of-archive marker (the second block has "
            f"{len(rest)} of {tarfile.BLOCKSIZE} bytes)"
        )


def ends_after(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bool:
    """Before the header after ``member``: raise :class:`TruncatedTar` where the
    stream ends inside the member's data; True where it ends in the padding after
    it, where Go's reader ends the archive without an error (``Reader.next``:
    ``tryReadFull`` of the padding returns ``io.EOF``), and tarfile's ``next``
    would fail ("unexpected end of data"); else False. Header-only types (links,
    folders, devices) have no data in either reader, whatever their size field."""
    start, size = getattr(member, "stored", (member.offset_data, member.size))
    data_end = min(start + size, tar.offset)  # tar.offset: where the next header is
    stream = cast(IO[bytes], tar.fileobj)
    if data_end > start and stream.tell() < data_end:  # not read to its end already
        stream.seek(data_end - 1)
        if not stream.read(1):
            raise TruncatedTar(data_cut(member))
    if tar.offset > max(data_end, stream.tell()):
        stream.seek(tar.offset - 1)
        return not stream.read(1)
    return False


def data_cut(member: tarfile.TarInfo) -> str:
    return (
        f"the layer ends inside the data of member '{member.name}' (its header claims "
        f"{member.size} bytes)"
    )
