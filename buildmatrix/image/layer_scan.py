"""Layers into an image: each blob summarised (in parallel, through the layer cache),
the summaries merged into the final view, and its device code and cuda-compat driver
collected into a :class:`~buildmatrix.image.scanned.ScannedImage` (:func:`finish`)."""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import replace
from functools import partial
from pathlib import Path

from buildmatrix.binary.cudart import CudaRuntime
from buildmatrix.binary.dynamic import SearchPaths
from buildmatrix.binary.ldconf_file import ConfFile
from buildmatrix.binary.report import FileReport, Links, ScanProblem
from buildmatrix.forward import CompatLibrary, compat_code, find_compat
from buildmatrix.image.blobs import VerifyingReader
from buildmatrix.image.digests import cpus, inline
from buildmatrix.image.inplace import scan_layer_at
from buildmatrix.image.layers import scan_layer
from buildmatrix.image.scanned import ImageConfig, LayerBlob, Progress, ScannedImage
from buildmatrix.image.tarstream import CONTAINERD, ENGINE_LOAD
from buildmatrix.image.tree import ImageTree, LayerSummary, merge
from buildmatrix.image.workers import parallel, run_all


def scan_blob(blob: LayerBlob, progress: Progress | None, keep: Path | None = None) -> LayerSummary:
    if blob.place is not None and blob.digest is None and keep is None:
        file, offset, size = blob.place
        summary = scan_layer_at(
            file, offset, size, name=blob.name, diff_id=blob.diff_id, kinds=_kinds(blob)
        )
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
            kinds=_kinds(blob),
        )
        reader.verify()
    return summary


def _kinds(blob: LayerBlob) -> frozenset[str]:
    return ENGINE_LOAD if blob.engine_load else CONTAINERD


def scan_blobs(
    blobs: list[LayerBlob],
    progress: Progress | None = None,
    workers: int = 2,
    keep: Path | None = None,
) -> list[LayerSummary]:
    """Summarise layers, ``workers`` at a time: on threads (decompression, hashing and
    reads release the GIL), or one per worker process where the blobs lie in local
    files and there is enough to read (:func:`_apart`).

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
    elif (sizes := _apart(todo, keep, workers)) is not None:
        # as many processes as layers read at once on threads, whatever the CPUs:
        # each holds a layer's buffers, and the smoke DaemonSet's container has a
        # 512Mi memory limit (buildmatrix/k8s.py)
        # each worker hashes on its reading thread where the workers take every CPU
        spare = min(len(todo), workers) < cpus()
        jobs = [(b, spare) for _, b in todo]
        scanned = run_all(_scan_apart, jobs, sizes, finished=progress, most=workers)
    else:
        with ThreadPoolExecutor(workers) as pool:
            scanned = list(pool.map(lambda ib: scan_blob(ib[1], progress, keep), todo))
    for (i, blob), summary in zip(todo, scanned, strict=True):
        found[i] = summary
        if cache is not None and blob.digest is not None:  # verified as it was read
            cache.put(_key(blob), summary, local=blob.local, seen=seen.get(i), blob=blob.digest)
    return [found[i] for i in range(len(blobs))]


def _apart(todo: list[tuple[int, LayerBlob]], keep: Path | None, most: int) -> list[int] | None:
    """The blobs' sizes where each lies in a local file (an OCI layout's, a containerd
    content store's) and there is enough to read them in worker processes, one layer
    per process (buildmatrix.image.workers): decompressing, hashing and parsing a
    layer is then done by a process of its own, where two layers read on two threads
    of one process share its interpreter for the parsing. None: read on threads."""
    if keep is not None or any(b.local is None or b.place is not None for _, b in todo):
        return None
    try:
        sizes = [b.local.stat().st_size for _, b in todo if b.local is not None]
    except OSError:
        return None  # read on threads, which say what is wrong with the file
    return sizes if parallel(sizes, most=most) else None


def _scan_apart(job: tuple[LayerBlob, bool]) -> LayerSummary:
    """One layer read in a worker process (its progress is counted as it ends); its
    digests are hashed beside the reading thread only where a CPU is left over."""
    blob, beside = job
    if beside:
        return scan_blob(blob, None)
    with inline():
        return scan_blob(blob, None)


def _key(blob: LayerBlob) -> str:
    return blob.diff_id or str(blob.digest)


def finish(
    *, ref: str, digest: str | None, config: ImageConfig, layers: list[LayerSummary]
) -> ScannedImage:
    """Merge layer summaries and collect the final view's device code. ``layers`` is
    emptied once merged: a summary no one else holds (buildmatrix.image.cache keeps
    those of small layers for the run) is let go before the view is judged."""
    count = len(layers)
    tree: ImageTree = merge(layers)
    layers.clear()
    files: list[FileReport] = []
    problems: list[str] = []
    paths: list[str] = []
    symlinks: dict[str, str] = {}
    irregular: list[str] = []  # symlinks and others: the view's regular files are the rest
    unreadable: list[str] = []
    compat_libraries: dict[str, CompatLibrary] = {}
    confs: dict[str, ConfFile] = {}  # the loader's configuration (ldconf_file)
    searches: dict[str, tuple[str, ...]] = {}  # DT_RPATH/DT_RUNPATH (binary.dynamic)
    links: dict[str, Links] = {}  # how each ELF file is loaded (binary.report.Links)
    runtimes: list[CudaRuntime] = []
    for path, node in tree.files():
        paths.append(path)
        result = node.result
        if isinstance(result, CudaRuntime):
            runtimes.append(replace(result, path=path, inner=None))
            result = result.inner
        if node.kind == "symlink":
            symlinks[path] = node.target
        if node.kind != "file":  # hard links included: the toolkit sees regular files
            irregular.append(path)
        if isinstance(result, FileReport):
            files.append(_at(result, path))
            if result.links is not None:
                links[path] = result.links
        elif isinstance(result, CompatLibrary):
            compat_libraries[path] = replace(result, path=path)
        elif isinstance(result, ConfFile):
            confs[path] = replace(result, path=path)
        elif isinstance(result, SearchPaths):
            if result.search:
                searches[path] = result.search
            if result.links is not None:
                links[path] = result.links
            if result.code is not None:
                files.append(_at(result.code, path))
                if result.code.links is not None:
                    links[path] = result.code.links
        elif isinstance(result, ScanProblem):
            problems.append(problem_line(path, result.message))
            unreadable.append(path)
    folders = list(tree.folders())
    del tree  # the merged tree's folders (~40 B an entry): only the lists are used now
    entries = frozenset(paths)
    lookup = partial(
        find_compat,
        compat_libraries,
        Without(entries, frozenset(irregular)),
        symlinks,
        unreadable,
        entries=entries,
        folders=folders,
        library_path=config.env.get("LD_LIBRARY_PATH", ""),
        ld_preload=config.env.get("LD_PRELOAD", ""),
        ld_audit=config.env.get("LD_AUDIT", ""),
        platform=config.platform,
        confs=confs,
    )
    compat = lookup(searches=searches)
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
        layers=count,
        symlinks=symlinks,
        compat=compat,
        searches=searches,
        compat_lookup=lookup,
        links=links,
        runtimes=tuple(runtimes),
    )


class Without(AbstractSet[str]):
    """The paths of ``whole`` but those of ``but``, as a set that holds no copy of
    them: the regular files of a view of a million entries, ~32 MiB as a set."""

    def __init__(self, whole: AbstractSet[str], but: AbstractSet[str]) -> None:
        self._whole, self._but = whole, but
        self._len = len(whole) - len(but & whole)

    def __contains__(self, item: object) -> bool:
        return item in self._whole and item not in self._but

    def __iter__(self) -> Iterator[str]:
        return (p for p in self._whole if p not in self._but)

    def __len__(self) -> int:
        return self._len


def problem_line(path: str, message: str) -> str:
    """``PATH: why``; reader messages already start with the path where it is the same."""
    return message if message.startswith(path) else f"{path}: {message}"


def _at(report: FileReport, path: str) -> FileReport:
    """The report under the path where the final view has it (hard links differ)."""
    return report if report.path == path else replace(report, path=path)
