"""What an image source hands to ``check``: the config and the final view's device code."""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from buildmatrix.binary.report import FileReport, ScanProblem
from buildmatrix.errors import InputError
from buildmatrix.forward import CompatLibrary, CompatSetup, compat_code, find_compat
from buildmatrix.image.digests import BesideHasher
from buildmatrix.image.inplace import scan_layer_at
from buildmatrix.image.layers import scan_layer
from buildmatrix.image.tree import ImageTree, LayerSummary, merge

MAX_JSON = 16 << 20  # manifests and configs are small; refuse to buffer more

# Media types (OCI image spec; Docker image manifest v2 schema 2).
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)


@dataclass(frozen=True, kw_only=True)
class ImageConfig:
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    image_id: str | None = None
    # os/architecture[/variant] of the config (OCI image-spec config.md; the engine's
    # inspect spells them Os/Architecture/Variant); None where it names none
    platform: str | None = None

    @classmethod
    def from_json(
        cls, doc: dict[str, Any], *, image_id: str | None = None, source: str = "image config"
    ) -> ImageConfig:
        """From an image config blob (``{"config": {"Labels":…, "Env":[…]}}``); a field of
        the wrong type is an input error naming it (schema image-config)."""
        from buildmatrix import schema

        schema.validate(doc, "image-config", source=source)
        cfg = doc.get("config") or doc.get("Config") or {}
        labels = {str(k): str(v) for k, v in (cfg.get("Labels") or {}).items()}
        env = {}
        for item in cfg.get("Env") or []:
            key, _, value = str(item).partition("=")
            env[key] = value
        parts = [str(doc.get(k) or doc.get(k.title()) or "") for k in ("os", "architecture")]
        variant = str(doc.get("variant") or doc.get("Variant") or "")
        platform = "/".join([*parts, variant] if variant else parts) if all(parts) else None
        return cls(labels=labels, env=env, image_id=image_id, platform=platform)


@dataclass(frozen=True, kw_only=True)
class ScannedImage:
    """An image reduced to what ``check`` needs."""

    ref: str
    digest: str | None
    config: ImageConfig
    files: list[FileReport]
    problems: list[str]
    paths: list[str]
    layers: int
    # The final view's symlinks (path -> target as written) and the CUDA forward
    # compatibility driver the NVIDIA container toolkit would find (buildmatrix.forward).
    symlinks: dict[str, str] = field(default_factory=dict)
    compat: CompatSetup | None = None
    # How the layers were read, where there was a choice (the local engine).
    read_from: str | None = None
    # The platforms the image offers (os/arch[/variant]): an index's entries, else the
    # config's own platform; () where neither names one (buildmatrix.image.offered).
    offered: tuple[str, ...] = ()
    # Requests that pick what another containerd generation runs for the platform
    # asked (os.features: buildmatrix.image.manifests.choose); each is judged too.
    also: tuple[str, ...] = ()
    # The digest of the index the REF named, the entry above was picked from; None
    # where the REF named a single manifest or the source keeps no index.
    index_digest: str | None = None


Progress = Callable[[int], None]  # called with bytes read since the last call


@dataclass(frozen=True, kw_only=True)
class LayerBlob:
    """A layer to read: a name for messages, how to open it, the digest to verify."""

    name: str
    open: Callable[[], AbstractContextManager[IO[bytes]]]
    digest: str | None = None
    # Where the blob lies whole in a regular file (file, offset, size): a blob with
    # no digest to verify is then read in place (inplace.scan_layer_at).
    place: tuple[Path, int, int] | None = None
    # The config's rootfs.diff_ids entry: the digest of the uncompressed layer.
    diff_id: str | None = None
    # The local file the blob is read from (an OCI layout's): the layer cache trusts
    # its entry only while this file is the one a read verified.
    local: Path | None = None


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
        """Drain what the tar reader left unread, then compare digests."""
        while self.read(1 << 20):
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
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{name}: not valid JSON ({exc}).") from None
    if not isinstance(doc, dict):
        raise InputError(f"{name}: expected a JSON object.")
    return doc


def scan_blob(blob: LayerBlob, progress: Progress | None, keep: Path | None = None) -> LayerSummary:
    if blob.place is not None and blob.digest is None and keep is None:
        file, offset, size = blob.place
        summary = scan_layer_at(file, offset, size, name=blob.name, diff_id=blob.diff_id)
        if progress is not None:
            progress(size)
        return summary
    with (
        blob.open() as raw,
        closing(
            VerifyingReader(raw, digest=blob.digest, name=blob.name, progress=progress)
        ) as reader,
    ):
        summary = scan_layer(
            reader,  # type: ignore[arg-type]
            name=blob.name,
            keep=keep,
            diff_id=blob.diff_id,
            blob_digest=blob.digest,
        )
        reader.verify()
    return summary


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def layer_diff_ids(config: dict[str, Any], *, count: int, source: str) -> list[str]:
    """The config's ``rootfs.diff_ids``, one per layer: what the engine checks each
    layer against, and what a layer is judged as (layers.check_diff_id). An image
    without them, or with another count than its layers, is refused, as the engine
    refuses it (moby ``image/tarexport/load.go``: "layers length mismatch";
    containerd's unpacker: "mismatched image rootfs and manifest layers")."""
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
        raise InputError(
            f"{source}: rootfs.diff_ids names {len(diff_ids)} layers, the manifest "
            f"{count}; the engine refuses such an image, so it is refused."
        )
    return list(diff_ids)


def scan_blobs(
    blobs: list[LayerBlob],
    progress: Progress | None = None,
    workers: int = 2,
    keep: Path | None = None,
) -> list[LayerSummary]:
    """Summarise layers in parallel (decompression and reads release the GIL).

    With a layer cache in use (buildmatrix.image.cache) a blob whose digest is known
    and cached is not read at all, and each one read and verified is cached. Entries
    are keyed by the layer's diff_id where the config names one, and served only for
    a blob that a read proved to decompress to it (the cache's bindings): another
    blob under a cached diff_id is read, and refused where it is not that layer, as
    without the cache (docs/check.md, "Several images, and the layer cache").
    """
    from buildmatrix.image.cache import active, stamp

    cache = active() if keep is None else None  # the load test needs the bytes
    found: dict[int, LayerSummary] = {}
    if cache is not None:
        for i, blob in enumerate(blobs):
            if blob.digest is None:
                continue
            if (hit := cache.get(_key(blob), local=blob.local, blob=blob.digest)) is not None:
                found[i] = hit
    todo = [(i, b) for i, b in enumerate(blobs) if i not in found]
    # A local blob is stamped before it is read, so a change during the read shows.
    seen = {i: stamp(b.local) for i, b in todo if b.local is not None}
    if len(todo) <= 1 or workers <= 1:
        scanned = [scan_blob(b, progress, keep) for _, b in todo]
    else:
        with ThreadPoolExecutor(workers) as pool:
            scanned = list(pool.map(lambda ib: scan_blob(ib[1], progress, keep), todo))
    for (i, blob), summary in zip(todo, scanned, strict=True):
        found[i] = summary
        if cache is not None and blob.digest is not None:  # verified as it was read
            cache.put(_key(blob), summary, local=blob.local, seen=seen.get(i), blob=blob.digest)
    return [found[i] for i in range(len(blobs))]


def _key(blob: LayerBlob) -> str:
    return blob.diff_id or str(blob.digest)


def finish(
    *, ref: str, digest: str | None, config: ImageConfig, layers: list[LayerSummary]
) -> ScannedImage:
    """Merge layer summaries and collect the final view's device code."""
    tree: ImageTree = merge(layers)
    files: list[FileReport] = []
    problems: list[str] = []
    paths: list[str] = []
    symlinks: dict[str, str] = {}
    regular: list[str] = []  # hard links included: the toolkit sees regular files
    unreadable: list[str] = []
    compat_libraries: dict[str, CompatLibrary] = {}
    for path, node in tree.files():
        paths.append(path)
        result = node.result
        if node.kind == "symlink":
            symlinks[path] = node.target
        elif node.kind == "file":
            regular.append(path)
        if isinstance(result, FileReport):
            files.append(_at(result, path))
        elif isinstance(result, CompatLibrary):
            compat_libraries[path] = replace(result, path=path)
        elif isinstance(result, ScanProblem):
            problems.append(problem_line(path, result.message))
            unreadable.append(path)
    compat = find_compat(
        compat_libraries,
        regular,
        symlinks,
        unreadable,
        entries=paths,
        folders=list(tree.folders()),
        library_path=config.env.get("LD_LIBRARY_PATH", ""),
        platform=config.platform,
    )
    for path in compat_code(compat, compat_libraries):
        code = compat_libraries[path].code
        if code is not None:
            files.append(_at(code, path))
    return ScannedImage(
        ref=ref,
        digest=digest,
        config=config,
        offered=(config.platform,) if config.platform else (),
        files=files,
        problems=problems,
        paths=paths,
        layers=len(layers),
        symlinks=symlinks,
        compat=compat,
    )


def problem_line(path: str, message: str) -> str:
    """``PATH: why``; reader messages already start with the path where it is the same."""
    return message if message.startswith(path) else f"{path}: {message}"


def _at(report: FileReport, path: str) -> FileReport:
    """The report under the path where the final view has it (hard links differ)."""
    return report if report.path == path else replace(report, path=path)


PREFETCH_BYTES = 32 << 20  # how far the engine's save stream is read ahead


def iter_chunks_reader(chunks: Iterator[bytes]) -> io.BufferedReader:
    """A file object over an iterator of byte chunks (the engine's save stream), read
    ahead by up to :data:`PREFETCH_BYTES` in a thread: the engine stops sending
    when its socket is full, so without it the engine waits while the layers are
    parsed and the parse waits while the engine works, and the two times add up.
    Close it to stop the thread."""
    return io.BufferedReader(_Prefetched(chunks, PREFETCH_BYTES), buffer_size=1 << 20)


class _Prefetched(io.RawIOBase):
    def __init__(self, chunks: Iterator[bytes], limit: int) -> None:
        super().__init__()
        self._chunk = memoryview(b"")
        self._pos = 0
        self._limit = limit
        self._queued: deque[bytes | BaseException | None] = deque()
        self._bytes = 0
        self._ready = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(
            target=self._pump, args=(chunks,), name="buildmatrix-save-stream", daemon=True
        )
        self._thread.start()

    def _pump(self, chunks: Iterator[bytes]) -> None:
        try:
            for chunk in chunks:
                if not self._put(chunk, len(chunk)):
                    return
            self._put(None, 0)
        except BaseException as exc:  # handed to the reader, raised there
            self._put(exc, 0)

    def _put(self, item: bytes | BaseException | None, size: int) -> bool:
        with self._ready:
            while self._bytes >= self._limit and not self._stopped:
                self._ready.wait()
            if self._stopped:
                return False
            self._queued.append(item)
            self._bytes += size
            self._ready.notify_all()
            return True

    def _next(self) -> bytes | None:
        with self._ready:
            while not self._queued:
                self._ready.wait()
            item = self._queued.popleft()
            if isinstance(item, bytes):
                self._bytes -= len(item)
            else:
                self._queued.appendleft(item)  # the end, or the error, stays
            self._ready.notify_all()
        if isinstance(item, BaseException):
            raise item
        return item

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._pos >= len(self._chunk):  # a memoryview: no copy of the rest
            chunk = self._next()
            if chunk is None:
                return 0
            self._chunk, self._pos = memoryview(chunk), 0
        n = min(len(buffer), len(self._chunk) - self._pos)
        buffer[:n] = self._chunk[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify_all()
        super().close()
