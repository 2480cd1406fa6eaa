"""Image sources on disk: OCI layouts, ``docker save`` archives, root folders and files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import IO, Any

from buildmatrix.binary.cudart import CudaRuntime
from buildmatrix.binary.dynamic import SearchPaths
from buildmatrix.binary.ldconf_file import ConfFile
from buildmatrix.binary.report import FileReport, Links, ScanProblem
from buildmatrix.binary.scan import inspect_file, scan_tree
from buildmatrix.errors import InputError
from buildmatrix.forward import CompatLibrary, compat_code, find_compat
from buildmatrix.image.blobs import (
    check_manifest,
    is_index,
    manifest_layers,
    read_json_blob,
)
from buildmatrix.image.gokeys import check_keys
from buildmatrix.image.layer_scan import finish, problem_line, scan_blobs
from buildmatrix.image.manifests import choose, memo
from buildmatrix.image.offered import offered_platforms
from buildmatrix.image.platform import DEFAULT_PLATFORM, require_config_platform
from buildmatrix.image.ref import ImageRef
from buildmatrix.image.scanned import ImageConfig, LayerBlob, Progress, ScannedImage

REF_NAME = "org.opencontainers.image.ref.name"


def _blob_path(layout: Path, digest: str, *, name: str) -> Path:
    algo, _, hexdigest = digest.partition(":")
    if not algo.isalnum() or not hexdigest.isalnum():
        raise InputError(f"{name}: malformed digest '{digest}'.")
    path = layout / "blobs" / algo / hexdigest
    if not path.is_file():
        raise InputError(f"{name}: blob {digest} is missing from {layout / 'blobs'}.")
    return path


def _open_binary(path: Path) -> IO[bytes]:
    return path.open("rb")


def _json_blob(layout: Path, desc: Mapping[str, Any], *, name: str) -> dict[str, Any]:
    digest = str(desc.get("digest", ""))
    with _blob_path(layout, digest, name=name).open("rb") as f:
        return read_json_blob(f, name=f"{name} blob {digest[:19]}", digest=digest)


def scan_oci_layout(
    ref: ImageRef,
    *,
    platform: str = DEFAULT_PLATFORM,
    progress: Progress | None = None,
    keep: Path | None = None,
) -> ScannedImage:
    """``oci:PATH[:TAG]``: index.json, the manifest for the tag and platform, its layers."""
    layout = ref.path
    if layout is None or not (layout / "index.json").is_file():
        raise InputError(f"'{ref.given}': {layout} is not an OCI image layout (no index.json).")
    name = f"oci:{layout}"
    with (layout / "index.json").open("rb") as f:
        index = read_json_blob(f, name=f"{layout}/index.json", digest=None)
    check_manifest(index, name=f"{layout}/index.json")
    check_keys(index, shape="manifest", name=f"{layout}/index.json")
    manifests = index.get("manifests") or []
    if ref.tag:
        chosen = [m for m in manifests if (m.get("annotations") or {}).get(REF_NAME) == ref.tag]
    else:
        chosen = manifests
    if len(chosen) != 1:
        _refuse_twice_named(chosen, given=ref.given, index=layout / "index.json")
        tags = sorted({(m.get("annotations") or {}).get(REF_NAME, "") for m in manifests} - {""})
        what = f"no image tagged '{ref.tag}'" if ref.tag else f"{len(chosen)} images"
        raise InputError(
            f"'{ref.given}': {what} in the layout; name one of: "
            f"{', '.join(tags) or '(untagged)'} as oci:{layout}:TAG."
        )
    top = chosen[0]
    doc = check_manifest(_json_blob(layout, top, name=name), name=name)
    fetch = memo(lambda d, _what: _json_blob(layout, d, name=name))
    offered = offered_platforms(top, doc, fetch=fetch, name=name) if is_index(doc) else ()
    index_digest = str(top.get("digest")) if is_index(doc) else None
    picked, also = choose(top, doc, platform, fetch=fetch, name=name)
    desc, doc = picked.desc, picked.manifest
    config_desc = doc.get("config") or {}
    config_doc = _json_blob(layout, config_desc, name=name)
    if picked.unplaced or picked.single:
        require_config_platform(config_doc, platform, name=ref.given, entry=picked.unplaced)
    config = ImageConfig.from_json(
        config_doc,
        image_id=config_desc.get("digest"),
        source=f"{name} image config",
    )
    pairs = manifest_layers(doc, config_doc, source=f"{name} image config")
    blobs = []
    for i, (layer, diff_id) in enumerate(pairs):
        digest = str(layer.get("digest", ""))
        path = _blob_path(layout, digest, name=name)
        blobs.append(
            LayerBlob(
                name=f"{name} layer {i} ({digest[:19]})",
                open=partial(_open_binary, path),
                digest=digest,
                diff_id=diff_id,
                local=path,
            )
        )
    layers = scan_blobs(blobs, progress, keep=keep)
    image = finish(ref=ref.given, digest=desc.get("digest"), config=config, layers=layers)
    image = replace(image, offered=offered or image.offered, also=also)
    return replace(image, index_digest=index_digest) if index_digest else image


def _refuse_twice_named(chosen: list[Any], *, given: str, index: Path) -> None:
    """Several images of index.json under one ``ref.name``: a name is given twice, and
    naming it picks none (the OCI image-spec's annotation names one image; skopeo and
    containerd replace the entry of a name they write again)."""
    names = [(m.get("annotations") or {}).get(REF_NAME) for m in chosen]
    twice = sorted({n for n in names if n and names.count(n) > 1})
    if twice:
        raise InputError(
            f"'{given}': {index} gives the name '{twice[0]}' ({REF_NAME}) to "
            f"{names.count(twice[0])} images, so the name does not say which one to judge. "
            "A layout names each image once: remove or rename the extra entries of "
            "index.json (or write the layout again with skopeo copy)."
        )


@dataclass(kw_only=True)
class _FolderWalk:
    """What the scan's one walk over a root folder finds on its way."""

    files: list[FileReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    libraries: dict[str, CompatLibrary] = field(default_factory=dict)
    confs: dict[str, ConfFile] = field(default_factory=dict)
    searches: dict[str, tuple[str, ...]] = field(default_factory=dict)
    loading: dict[str, Links] = field(default_factory=dict)  # binary.report.Links
    unreadable: list[str] = field(default_factory=list)
    runtimes: list[CudaRuntime] = field(default_factory=list)
    regular: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    symlinks: dict[str, str] = field(default_factory=dict)  # link -> its target
    folders: list[str] = field(default_factory=list)

    def on_file(self, rel: str, _has_code: bool) -> None:
        self.regular.append(rel)

    def on_link(self, rel: str, target: str | None) -> None:
        self.links.append(rel)
        if target is not None:
            self.symlinks[rel] = target


def _walk_folder(path: Path, *, keep: bool) -> _FolderWalk:
    found = _FolderWalk()
    for item in scan_tree(
        path,
        compat=True,
        on_file=found.on_file,
        on_link=found.on_link,
        on_folder=found.folders.append,
    ):
        if isinstance(item, CudaRuntime):
            found.runtimes.append(replace(item, inner=None))
            if item.inner is None:
                continue
        result = item.inner if isinstance(item, CudaRuntime) else item
        if isinstance(result, ScanProblem):
            found.problems.append(problem_line(result.path, result.message))
            found.unreadable.append(result.path)
        elif isinstance(result, CompatLibrary):
            found.libraries[result.path] = result
        elif isinstance(result, ConfFile):
            found.confs[result.path] = result
        elif isinstance(result, SearchPaths):
            if result.search:
                found.searches[result.path] = result.search
            if result.links is not None:
                found.loading[result.path] = result.links
            if result.code is not None:
                stored = str(path / result.path) if keep else None
                found.files.append(replace(result.code, stored=stored))
        else:
            stored = str(path / result.path) if keep else None
            found.files.append(replace(result, stored=stored))
    found.loading.update((f.path, f.links) for f in found.files if f.links is not None)
    return found


def scan_directory(ref: ImageRef, *, keep: bool = False) -> ScannedImage:
    """``dir:PATH`` or a plain path: a root folder (symlinks not followed) or one file.

    With ``keep``, reports point at the files where they are (nothing is copied).
    """
    path = ref.path
    if path is None or not path.exists():
        raise InputError(f"'{ref.given}': no such file or folder.")
    if path.is_dir():
        found = _walk_folder(path, keep=keep)
        paths = sorted(found.regular + found.links)
        loading: dict[str, Links] | None = found.loading
    else:
        found = _FolderWalk()
        loading = None  # one file given: judged whatever loads it
        report = inspect_file(path, display=path.name)
        if report is not None:
            found.files.append(replace(report, stored=str(path) if keep else None))
        paths = [f.path for f in found.files]
    lookup = partial(
        find_compat,
        found.libraries,
        sorted(found.regular),
        found.symlinks,
        found.unreadable,
        entries=paths,
        folders=found.folders,
        confs=found.confs,
    )
    compat = lookup(searches=found.searches)
    files = found.files
    for lib_path in compat_code(compat, found.libraries):
        code = found.libraries[lib_path].code
        if code is not None:
            stored = str(path / lib_path) if keep else None
            files.append(replace(code, path=lib_path, stored=stored))
    return ScannedImage(
        ref=ref.given,
        digest=None,
        config=ImageConfig(),
        files=files,
        problems=found.problems,
        paths=paths,
        layers=0,
        symlinks=found.symlinks,
        compat=compat,
        searches=found.searches,
        compat_lookup=lookup,
        links=loading,
        runtimes=tuple(found.runtimes),
    )
