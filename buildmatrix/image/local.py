"""Image sources on disk: OCI layouts, ``docker save`` archives, root folders and files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import IO, Any

from buildmatrix.binary.ldconf_file import ConfFile
from buildmatrix.binary.report import FileReport, ScanProblem
from buildmatrix.binary.scan import inspect_file, scan_tree
from buildmatrix.errors import InputError
from buildmatrix.forward import CompatLibrary, compat_code, find_compat
from buildmatrix.image.blobs import check_manifest, is_index, layer_diff_ids, read_json_blob
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
    manifests = index.get("manifests") or []
    if ref.tag:
        chosen = [m for m in manifests if (m.get("annotations") or {}).get(REF_NAME) == ref.tag]
    else:
        chosen = manifests
    if len(chosen) != 1:
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
    descs = doc.get("layers") or []
    diff_ids = layer_diff_ids(config_doc, count=len(descs), source=f"{name} image config")
    blobs = []
    for i, (layer, diff_id) in enumerate(zip(descs, diff_ids, strict=True)):
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


def scan_directory(ref: ImageRef, *, keep: bool = False) -> ScannedImage:
    """``dir:PATH`` or a plain path: a root folder (symlinks not followed) or one file.

    With ``keep``, reports point at the files where they are (nothing is copied).
    """
    path = ref.path
    if path is None or not path.exists():
        raise InputError(f"'{ref.given}': no such file or folder.")
    files: list[FileReport] = []
    problems: list[str] = []
    libraries: dict[str, CompatLibrary] = {}
    confs: dict[str, ConfFile] = {}
    unreadable: list[str] = []
    # The regular files and the links (with their targets) that the scan's one walk
    # finds on its way.
    regular: list[str] = []
    links: list[str] = []
    symlinks: dict[str, str] = {}
    folders: list[str] = []

    def on_file(rel: str, _has_code: bool) -> None:
        regular.append(rel)

    def on_link(rel: str, target: str | None) -> None:
        links.append(rel)
        if target is not None:
            symlinks[rel] = target

    if path.is_dir():
        for result in scan_tree(
            path, compat=True, on_file=on_file, on_link=on_link, on_folder=folders.append
        ):
            if isinstance(result, ScanProblem):
                problems.append(problem_line(result.path, result.message))
                unreadable.append(result.path)
            elif isinstance(result, CompatLibrary):
                libraries[result.path] = result
            elif isinstance(result, ConfFile):
                confs[result.path] = result
            else:
                stored = str(path / result.path) if keep else None
                files.append(replace(result, stored=stored))
    else:
        report = inspect_file(path, display=path.name)
        if report is not None:
            files.append(replace(report, stored=str(path) if keep else None))
    paths = sorted(regular + links) if path.is_dir() else [f.path for f in files]
    compat = find_compat(
        libraries,
        sorted(regular),
        symlinks,
        unreadable,
        entries=paths,
        folders=folders,
        confs=confs,
    )
    for lib_path in compat_code(compat, libraries):
        code = libraries[lib_path].code
        if code is not None:
            stored = str(path / lib_path) if keep else None
            files.append(replace(code, path=lib_path, stored=stored))
    return ScannedImage(
        ref=ref.given,
        digest=None,
        config=ImageConfig(),
        files=files,
        problems=problems,
        paths=paths,
        layers=0,
        symlinks=symlinks,
        compat=compat,
    )
