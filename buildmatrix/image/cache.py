"""A cache of layer summaries, keyed by the layer blob's digest.

A layer is content-addressed: a blob whose digest was verified while it was read
always summarises to the same thing, so its summary (buildmatrix.image.layers) can be
kept and reused by every image that shares the layer: the variants of a build matrix
share their base layers, and checking them all then reads those layers once.

The rule (docs/security.md, "The layer cache"): a verdict with the cache is always
the verdict without it. Hence:

- **Only this user's entries.** Like pip, which disables its cache when the folder
  or its parent is not owned by or writable for the current user (pip, ``pip/
  _internal/utils/filesystem.py`` ``check_path_owner``, used by ``pip/_internal/cli/
  base_command.py`` ``_main``: "The cache has been disabled"), the cache is not used,
  with a warning, when its folder (or a folder above it) is not owned by the current
  user (or root, above it) or is writable by group or others (a sticky folder such
  as ``/tmp`` above it is fine: only an entry's owner may rename it there). Each
  entry must be a regular file owned by the user and writable by no one else, or it
  is ignored. Folders are made ``0700``, entries ``0600``.
- **Only this scanner's entries.** Entries are kept under a fingerprint of the
  source of every module that shapes a summary (``SCANNER_SOURCES``: the binary
  readers, the image and layer readers, this cache and its codec, the arch and
  cuda-compat name rules): any change to the scanner starts a new cache.
- **Only blobs whose digest was verified** (OCI layouts, registries, containerd's
  content store); the engine's ``docker save`` stream and ``docker-archive:`` files
  are not cached. A blob read from a local file (an OCI layout's, a content store's)
  is trusted from the cache only while that file is the one that was verified: its
  device, inode, size, mtime and ctime are kept beside the entry; a file not seen
  so, or changed since, has its digest checked again by hashing it (and is read
  again where it no longer matches).
- **Only blobs proven to be the entry's layer.** An entry is kept under the layer's
  diff_id, but a manifest may pair any blob with any diff_id. So each blob digest a
  read verified to decompress to that diff_id is recorded beside the entry (a
  *binding*, one small file per pair, tamper-evident as entries are), and an entry
  is served for a blob only through its binding: another blob, even one whose own
  digest verifies, is read (and refused where it is not that layer, as without the
  cache). A blob whose digest is the diff_id (an uncompressed layer) is its own
  binding.
- Each entry holds the SHA-256 of its own content, checked on every read: an entry
  that does not match (a torn write, a disk error, a hand edit) is deleted and the
  layer read again. Entries are written to a temporary name and renamed.
- The folder is bounded (``max_bytes``): after a write, the least recently used
  entries go until the rest fit (entries of older fingerprints first, as they are
  never used again).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from buildmatrix import package_file
from buildmatrix.image.cache_codec import decode, encode
from buildmatrix.image.tree import LayerSummary

FORMAT = 5  # 3: entries are served only through a blob's binding; 4: loader conf text;
# 5: an entry is JSON lines, one per layer entry (buildmatrix.image.cache_codec)
MEMO_ENTRIES = 250_000  # the largest layer whose summary a run holds for its images
DEFAULT_MAX_BYTES = 1 << 30
# Package sources whose change may change a summary (paths relative to buildmatrix/).
SCANNER_SOURCES = (
    "binary/*.py",
    "image/*.py",
    "arch.py",
    "cuda.py",
    "data/cuda.yaml",  # binary.kernels reads notes up to its newest CUDA major
    "errors.py",
    "forward*.py",
    "ldconfig.py",
    "ldshadow.py",
    "ldsoconf.py",
    "verdict.py",
    "yamlio.py",  # reads data/cuda.yaml
)
_ACTIVE: contextvars.ContextVar[LayerCache | None] = contextvars.ContextVar(
    "buildmatrix_layer_cache", default=None
)
Stamp = tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns


def default_folder() -> Path:
    """``$XDG_CACHE_HOME/buildmatrix/layers``, else ``~/.cache/buildmatrix/layers``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "buildmatrix" / "layers"


@functools.cache
def fingerprint() -> str | None:
    """SHA-256 over the scanner's sources (``SCANNER_SOURCES``), once per process;
    None where the package ships no sources to hash (then nothing is cached)."""
    package = package_file()
    files = sorted({p for pattern in SCANNER_SOURCES for p in package.glob(pattern)})
    if not files:
        return None
    h = hashlib.sha256(f"format {FORMAT}\n".encode())
    for p in files:
        data = p.read_bytes()
        h.update(f"{p.relative_to(package).as_posix()} {len(data)}\n".encode())
        h.update(data)
    return h.hexdigest()


def stamp(path: Path) -> Stamp | None:
    """What identifies a local file's content without reading it (None: gone)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def untrusted(st: os.stat_result, *, above: bool = False) -> str | None:
    """Why a cache folder (``above``: a folder above it) or entry with this status
    may hold what another user wrote; None when only this user (or root) could."""
    uid = os.geteuid()
    if st.st_uid != uid and not (above and st.st_uid == 0):
        return f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & 0o022 and not (above and st.st_mode & stat.S_ISVTX):
        return f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check_folder(folder: Path) -> str | None:
    """Why ``folder`` cannot hold a trusted cache; None when it can. Missing folders
    on the way are made, 0700 (not by the umask: a group-writable one would fail)."""
    try:
        folder = folder.resolve()  # the folders checked are the real ones
        for path in [*reversed(folder.parents), folder]:
            if not path.exists():
                with contextlib.suppress(FileExistsError):
                    path.mkdir(mode=0o700)
            st = path.lstat() if path == folder else path.stat()
            if path == folder and not stat.S_ISDIR(st.st_mode):
                return "it is not a folder"
            if (why := untrusted(st, above=path != folder)) is not None:
                return why if path == folder else f"{path} (above it): {why}"
    except OSError as exc:
        return f"it cannot be used: {exc.strerror}"
    return None


class LayerCache:
    def __init__(self, folder: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.folder = folder
        fp = fingerprint()
        self.root = folder / f"v{FORMAT}-{fp[:16] if fp else 'none'}"
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.discarded = 0
        self.ignored = 0  # entries refused: not this user's, or their blob changed
        self.hashed = 0  # local blobs whose digest was checked by hashing the file
        self.unbound = 0  # misses: the entry is there, but not known to be this blob's
        # Why the folder is not used (the CLI warns); None: it is.
        self.disabled = (
            "the installed buildmatrix has no sources to fingerprint"
            if fp is None
            else check_folder(folder)
        )
        # Summaries read or written in this process: images of one run that share a
        # layer share its summary (summaries are never changed once made). A layer of
        # more than MEMO_ENTRIES entries is not held (:meth:`_memo`).
        self._memory: dict[str, LayerSummary] = {}
        # Local blob files whose digest a read in this process verified, as stamped.
        self._verified: set[tuple[str, Stamp]] = set()
        # (diff_id, blob digest) pairs known to hold: the blob decompresses to the layer.
        self._bound: set[tuple[str, str]] = set()
        self._written = False

    def _path(self, digest: str) -> Path | None:
        algo, _, hexdigest = digest.partition(":")
        if self.disabled or algo not in ("sha256", "sha512") or not hexdigest.isalnum():
            return None
        return self.root / algo / f"{hexdigest}.json.gz"

    def _stamp_path(self, digest: str, seen: Stamp) -> Path:
        key = hashlib.sha256(f"{digest}\0{seen[0]}\0{seen[1]}".encode()).hexdigest()
        return self.root / "verified" / f"{key}.json"

    def binding_path(self, digest: str, blob: str) -> Path:
        """Where the record that the blob ``blob`` decompresses to the layer ``digest``
        is kept (its content names both: see ``_binding``)."""
        key = hashlib.sha256(f"{digest}\0{blob}".encode()).hexdigest()
        return self.root / "bound" / f"{key}.json"

    def get(
        self, digest: str, *, local: Path | None = None, blob: str | None = None
    ) -> LayerSummary | None:
        """The summary kept under ``digest`` (a layer's diff_id, or its blob's digest)
        for the blob ``blob`` (default: ``digest``): only if a read verified that this
        blob is that layer (its binding), and with ``local`` (the file the blob is read
        from), only while that file (by device and inode, so hard links share it) is
        unchanged since a read verified that it has the digest ``blob``."""
        blob = blob or digest
        if not self._is_bound(digest, blob):
            self.unbound += 1
            self.misses += 1
            return None
        # The entry first: where there is none, the local file is not hashed for nothing
        # (the read that follows verifies it anyway).
        summary = self._entry(digest)
        if summary is None:
            self.misses += 1
            return None
        if local is not None and not self._still_verified(blob, local):
            self.ignored += 1
            self.misses += 1
            return None
        self.hits += 1
        return summary

    def _entry(self, digest: str) -> LayerSummary | None:
        """The summary kept under ``digest``, in this process or in a file of this user's
        (a damaged file is removed; one written by an older scanner is keyed apart)."""
        if digest in self._memory:
            return self._memory[digest]
        path = self._path(digest)
        data = self._read_own(path) if path is not None else None
        summary = decode(data, digest) if data is not None else None
        if summary is None:
            if data is not None and path is not None:
                self.discarded += 1
                with contextlib.suppress(OSError):
                    path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # type: ignore[arg-type]  # recently used
        self._memo(digest, summary)
        return summary

    def _memo(self, digest: str, summary: LayerSummary) -> None:
        """Hold ``summary`` for the rest of the run, unless it is of a layer of more
        than MEMO_ENTRIES entries: that one is let go once its image is judged (held,
        ~90 B an entry for the whole run, it made a layer of a million empty files
        cost ~380 MiB), and read back from the cache folder where another image of
        the run has it (~20 s for a million entries)."""
        if summary.entries <= MEMO_ENTRIES:
            self._memory[digest] = summary

    def _read_own(self, path: Path) -> bytes | None:
        """An entry's bytes, if it is a regular file only this user could write."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or untrusted(st) is not None:
                self.ignored += 1
                return None
            return f.read()

    def _is_bound(self, digest: str, blob: str) -> bool:
        """Whether a read verified that the blob ``blob`` decompresses to the layer
        ``digest``: in this process, or as a binding file this user wrote."""
        if blob == digest or (digest, blob) in self._bound:
            return True
        path = self.binding_path(digest, blob)
        if self.disabled or self._read_own(path) != _binding(digest, blob):
            return False
        self._bound.add((digest, blob))
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used, as its entry
        return True

    def _still_verified(self, digest: str, local: Path) -> bool:
        """Whether ``local`` holds the blob ``digest``: known from a stamp kept when a
        read verified it, else by hashing the file now (far cheaper than reading the
        layer: nothing is decompressed or parsed), then stamped."""
        now = stamp(local)
        if now is None:
            return False
        if (digest, now) in self._verified:
            return True
        if not self.disabled:
            data = self._read_own(self._stamp_path(digest, now))
            with contextlib.suppress(ValueError):
                if data is not None and json.loads(data) == list(now):
                    self._verified.add((digest, now))
                    return True
        if not _has_digest(local, digest) or stamp(local) != now:
            return False
        self._verified.add((digest, now))
        self.hashed += 1
        if not self.disabled:
            self._write(self._stamp_path(digest, now), json.dumps(list(now)).encode())
        return True

    def put(
        self,
        digest: str,
        summary: LayerSummary,
        *,
        local: Path | None = None,
        seen: Stamp | None = None,
        blob: str | None = None,
    ) -> None:
        """Keep ``summary`` under ``digest`` (a diff_id or blob digest), which a read of
        the blob ``blob`` (default: ``digest``) just verified: that blob is bound to
        the entry. With ``local``, ``seen`` is that file's stamp from before the read
        (kept only if the file is still so after it), recorded as the file that has
        the digest ``blob``."""
        self._memo(digest, summary)
        if blob is not None and blob != digest and (digest, blob) not in self._bound:
            # A fact about the two digests, whatever becomes of the file read.
            self._bound.add((digest, blob))
            if not self.disabled:
                self._write(self.binding_path(digest, blob), _binding(digest, blob))
        if local is not None and (seen is None or stamp(local) != seen):
            return  # changed while it was read: verify it again next time
        path = self._path(digest)
        if path is not None:
            try:
                data = encode(digest, summary)
            except RecursionError:  # the codec recurses per folder: hundreds deep
                return  # not kept; read again next time (docs/check.md)
            self._write(path, data)
        if seen is not None:
            verified = blob or digest
            self._verified.add((verified, seen))
            if path is not None:
                stamp_path = self._stamp_path(verified, seen)
                self._write(stamp_path, json.dumps(list(seen)).encode())

    def _write(self, path: Path, data: bytes) -> bool:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")  # 0600
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            Path(tmp).replace(path)
        except OSError:
            return False  # a cache that cannot be written only costs time
        self._written = True
        return True

    def shared(self, key: str, make: Callable[[], LayerSummary]) -> LayerSummary:
        """The summary ``make`` gives for ``key``, made once per run and kept in memory
        only: for layers read where the engine stores them, which carry no digest
        this process verified, so nothing is written to the cache folder."""
        if key in self._memory:
            self.hits += 1
            return self._memory[key]
        summary = self._memory[key] = make()
        return summary

    def evict(self) -> None:
        """Keep the folder within its bound, least recently used entries first; after
        a run that wrote to it (once, not after every write: it lists the folder)."""
        if not self._written or self.disabled:
            return
        self._written = False
        entries = []
        for p in self.folder.glob("v*/*/*.json*"):
            with contextlib.suppress(OSError):
                st = p.lstat()
                if stat.S_ISREG(st.st_mode) and untrusted(st) is None:
                    entries.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        for _, size, p in sorted(entries):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                p.unlink()
                total -= size


def _binding(digest: str, blob: str) -> bytes:
    """A binding file's bytes: the pair it records, so a file under another pair's
    name (or a damaged one) proves nothing."""
    return json.dumps({"diff_id": digest, "blob": blob}).encode()


def _has_digest(path: Path, digest: str) -> bool:
    algo, _, expected = digest.partition(":")
    if algo not in ("sha256", "sha512"):
        return False
    h = hashlib.new(algo)
    try:
        with path.open("rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
    except OSError:
        return False
    return h.hexdigest() == expected


@contextlib.contextmanager
def use(cache: LayerCache | None) -> Iterator[LayerCache | None]:
    """Make ``cache`` the one layer scans consult in this context; on leaving it, the
    cache folder is brought back within its bound."""
    token = _ACTIVE.set(cache)
    try:
        yield cache
    finally:
        _ACTIVE.reset(token)
        if cache is not None:
            cache.evict()


def active() -> LayerCache | None:
    return _ACTIVE.get()
