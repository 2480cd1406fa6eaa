"""A ``docker-archive:`` file as ``docker load`` takes it: a tar, or a tar compressed
with gzip, bzip2, xz or zstd, which the engine decompresses before it extracts the
archive (docs/check.md, "docker save archives")."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, cast

from buildmatrix.errors import InputError
from buildmatrix.image.layers import unreadable

# What ``docker load`` decompresses before it extracts the archive (moby
# ``pkg/archive/archive.go``: ``chrootarchive.Untar`` -> ``DecompressStream``, by
# ``DetectCompression``'s magic bytes, now moby/go-archive ``compression/
# compression_detect.go``, ``Detect``); Docker's own example is ``docker load <
# busybox.tar.gz``. A zstd stream may also open with a skippable frame.
_COMPRESSED = {
    b"\x1f\x8b\x08": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}


@contextmanager
def uncompressed(path: Path, *, source: str) -> Iterator[Path]:
    """``path``, or where it is compressed as ``docker load`` accepts it, the tar
    inside it written to a private temporary file (its members are then read in
    place there, as from any archive); removed on exit."""
    with path.open("rb") as f:
        head = f.read(8)
    kind = next((k for magic, k in _COMPRESSED.items() if head.startswith(magic)), None)
    if len(head) == 8 and int.from_bytes(head[:4], "little") & 0xFFFFFFF0 == 0x184D2A50:
        kind = "zstd"
    if kind is None:
        yield path
        return
    import lzma
    import shutil
    import tempfile

    failures: tuple[type[Exception], ...] = (*unreadable(), lzma.LZMAError)

    with tempfile.TemporaryDirectory(prefix="buildmatrix-archive-") as folder:
        plain = Path(folder) / "archive.tar"
        try:
            with path.open("rb") as raw, plain.open("wb") as out:
                if kind == "zstd":
                    _unzstd(raw, out)
                else:
                    with _decompressor(kind, raw) as data:
                        shutil.copyfileobj(data, out, 1 << 20)
        except failures as exc:
            raise InputError(
                f"{source}: a {kind}-compressed archive that does not decompress ({exc}); "
                "docker load would fail on it too."
            ) from None
        yield plain


def _decompressor(kind: str, raw: IO[bytes]) -> IO[bytes]:
    """A reader of gzip (members one after another), bzip2 or xz; each raises on a
    stream cut short."""
    if kind == "gzip":
        from isal import igzip

        return cast(IO[bytes], igzip.IGzipFile(fileobj=raw, mode="rb"))  # type: ignore[no-untyped-call]
    if kind == "bzip2":
        import bz2

        return bz2.BZ2File(raw)
    import lzma

    return lzma.LZMAFile(raw)


def _unzstd(raw: IO[bytes], out: IO[bytes]) -> None:
    """zstd frames one after another, skippable ones included, each read to its end:
    a stream cut inside a frame raises (python-zstandard's stream reader would end
    there quietly)."""
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    frame, started = dctx.decompressobj(), False
    while chunk := raw.read(1 << 20):
        while chunk:
            out.write(frame.decompress(chunk))
            started = True
            if not frame.eof:
                break
            chunk = frame.unused_data
            frame, started = dctx.decompressobj(), False
    if started:
        raise EOFError("the zstd stream ends inside a frame")
