"""Reading blobs as the sources fetch them: a reader that verifies a layer's digest as it
streams, small JSON blobs (manifests, indexes, configs) read whole and verified, the
media types, and the config's ``rootfs.diff_ids``."""

from __future__ import annotations

import hashlib
import io
import re
from typing import IO, Any

from buildmatrix.errors import InputError
from buildmatrix.image.digests import BesideHasher
from buildmatrix.image.gokeys import loads
from buildmatrix.image.scanned import Progress

MAX_JSON = 16 << 20  # manifests and configs are small; refuse to buffer more


# Media types (OCI image spec; Docker image manifest v2 schema 2).
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
# A manifest's "layers" entries containerd applies: those its images.IsLayerType
# (core/images/mediatypes.go) calls layers, any "application/vnd.oci.image.layer."
# type or one of Docker's, a "+" suffix aside (containerd 1.6 to 2.x; 2.x adds
# Docker's zstd type and EROFS layers, counted here so that no generation applies
# what is skipped). Its unpacker (unpacker.go handlerWrapper in 1.6, core/unpack/
# unpacker.go Unpack in 2.x, what a CRI pull runs) leaves every other entry out,
# the OCI empty descriptor (application/vnd.oci.empty.v1+json) and artifacts, and
# then wants one rootfs.diff_ids entry per layer left.
OCI_LAYER_PREFIX = "application/vnd.oci.image.layer."
DOCKER_LAYER_TYPES = frozenset(
    {
        "application/vnd.docker.image.rootfs.diff.tar",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "application/vnd.docker.image.rootfs.diff.tar.zstd",
        "application/vnd.docker.image.rootfs.foreign.diff.tar",
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
        "application/vnd.erofs.layer.v1",
    }
)


def is_layer_type(media_type: str) -> bool:
    """Whether containerd applies a manifest entry of this media type as a layer."""
    return (
        media_type.startswith(OCI_LAYER_PREFIX) or media_type.split("+", 1)[0] in DOCKER_LAYER_TYPES
    )


def layer_descriptors(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's "layers" entries containerd applies, in order
    (:func:`is_layer_type`); the rest are left out as its unpacker leaves them."""
    entries = manifest.get("layers") or []
    return [d for d in entries if isinstance(d, dict) and is_layer_type(str(d.get("mediaType")))]


def manifest_layers(
    manifest: dict[str, Any], config: dict[str, Any], *, source: str
) -> list[tuple[dict[str, Any], str]]:
    """Each layer containerd applies (:func:`layer_descriptors`) with its diff_id from
    the config (:func:`layer_diff_ids`, counted against those layers, the manifest's
    other entries named as left out): what every image source reads."""
    descs = layer_descriptors(manifest)
    left_out = len(manifest.get("layers") or []) - len(descs)
    diff_ids = layer_diff_ids(config, count=len(descs), source=source, left_out=left_out)
    return list(zip(descs, diff_ids, strict=True))


class VerifyingReader(io.RawIOBase):
    """Reads through a stream, hashing what passes (on a thread beside the reader,
    buildmatrix.image.digests; :meth:`close` stops it) and counting it for progress."""

    def __init__(
        self, stream: IO[bytes], *, digest: str | None, name: str, progress: Progress | None = None
    ) -> None:
        super().__init__()
        self._stream = stream
        self._name = name
        self._progress = progress
        self._expected = digest
        algo = digest.split(":", 1)[0] if digest else "sha256"
        if algo not in ("sha256", "sha512"):
            raise InputError(f"{name}: unsupported digest algorithm '{algo}'.")
        # Nothing to verify against (the engine's save stream): count only, hash nothing.
        self._algo = algo
        self._hash = BesideHasher(algo) if digest else None
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        readinto = getattr(self._stream, "readinto", None)
        data: bytes | memoryview
        if readinto is not None:
            n = readinto(buffer) or 0
            data = memoryview(buffer)[:n]
        else:
            data = self._stream.read(len(buffer))
            n = len(data)
            buffer[:n] = data
        if self._hash is not None:
            self._hash.update(data)
        self.bytes_read += n
        if self._progress is not None and n:
            self._progress(n)
        return n

    def verify(self) -> None:
        """Drain what the tar reader left unread, then compare digests. A wrapper may
        have closed this reader already (its finaliser closes what it wraps): the
        stream under it is the caller's, still open, and is read to its end."""
        scratch = bytearray(1 << 20)
        while self.readinto(scratch):
            pass
        if self._expected is None or self._hash is None:
            return
        got = f"{self._algo}:{self._hash.hexdigest()}"
        if got != self._expected:
            raise InputError(
                f"{self._name}: content digest {got} does not match the expected "
                f"{self._expected} ({self.bytes_read} bytes read); the blob is corrupt or "
                "truncated. Nothing was checked."
            )

    def close(self) -> None:
        if self._hash is not None:
            self._hash.close()
        super().close()


def is_index(doc: dict[str, Any]) -> bool:
    return doc.get("mediaType") in INDEX_TYPES or "manifests" in doc


def check_manifest(doc: dict[str, Any], *, name: str) -> dict[str, Any]:
    """An index or manifest whose descriptors buildmatrix reads must have their
    fields' types (schemas image-index, image-manifest); else an input error naming
    the document and key."""
    from buildmatrix import schema

    schema.validate(doc, "image-index" if is_index(doc) else "image-manifest", source=name)
    return doc


def read_json_blob(stream: IO[bytes], *, name: str, digest: str | None) -> dict[str, Any]:
    """Read a small JSON blob, verify its digest, and parse it."""
    data = stream.read(MAX_JSON + 1)
    if len(data) > MAX_JSON:
        raise InputError(f"{name}: JSON blob larger than {MAX_JSON >> 20} MiB; refused.")
    if digest is not None:
        algo, _, expected = digest.partition(":")
        if algo not in ("sha256", "sha512") or hashlib.new(algo, data).hexdigest() != expected:
            raise InputError(f"{name}: content does not match digest {digest}; corrupt blob.")
    # A key twice (Go merges the values) or nesting past Python's reader: refused.
    doc = loads(data, name=name)
    if not isinstance(doc, dict):
        raise InputError(f"{name}: expected a JSON object.")
    return doc


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def layer_diff_ids(
    config: dict[str, Any], *, count: int, source: str, left_out: int = 0
) -> list[str]:
    """The config's ``rootfs.diff_ids``, one per layer: what the engine checks each
    layer against, and what a layer is judged as (layers.check_diff_id). An image
    without them, or with another count than its layers, is refused, as the engine
    refuses it (moby ``image/tarexport/load.go``: "layers length mismatch";
    containerd's unpacker: "number of layers and diffIDs don't match", its
    ``Image.Unpack``: "mismatched image rootfs and manifest layers"). ``count``: the
    manifest's layers containerd applies (:func:`layer_descriptors`), ``left_out``
    its other entries."""
    rootfs = config.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or not all(
        isinstance(d, str) and _DIGEST.fullmatch(d) for d in diff_ids
    ):
        raise InputError(
            f"{source}: rootfs.diff_ids is missing or not a list of sha256 digests; the "
            "engine cannot tell which layers the image is made of, so it is refused."
        )
    if len(diff_ids) != count:
        others = (
            f" ({left_out} entries of other media types left out, as containerd's "
            "unpacker leaves them)"
            if left_out
            else ""
        )
        raise InputError(
            f"{source}: rootfs.diff_ids names {len(diff_ids)} layers, the manifest "
            f"{count}{others}; the engine refuses such an image, so it is refused."
        )
    return list(diff_ids)
