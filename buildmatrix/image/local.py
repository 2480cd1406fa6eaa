"""Image sources on disk: OCI layouts, ``docker save`` archives, root folders and files."""

from __future__ import annotations

import contextlib
import json
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import IO, Any

from buildmatrix.binary.scan import FileReport, ScanProblem, inspect_file, scan_tree
from buildmatrix.errors import InputError
from buildmatrix.forward import CompatLibrary, find_compat
from buildmatrix.image.model import (
    MAX_JSON,
    ImageConfig,
    LayerBlob,
    Progress,
    ScannedImage,
    check_manifest,
    finish,
    is_index,
    problem_line,
    read_json_blob,
    scan_blobs,
)
from buildmatrix.image.platform import (
    DEFAULT_PLATFORM,
    require_config_platform,
    select_platform,
)
from buildmatrix.image.ref import ImageRef

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


def _json_blob(layout: Path, desc: dict[str, Any], *, name: str) -> dict[str, Any]:
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
    desc = chosen[0]
    doc = check_manifest(_json_blob(layout, desc, name=name), name=name)
    unplaced = False  # picked from an index entry without a platform
    while is_index(doc):
        desc = select_platform(doc.get("manifests") or [], platform, name=name)
        unplaced = not isinstance(desc.get("platform"), dict)
        doc = check_manifest(_json_blob(layout, desc, name=name), name=name)
    config_desc = doc.get("config") or {}
    config_doc = _json_blob(layout, config_desc, name=name)
    if unplaced:
        require_config_platform(config_doc, platform, name=ref.given)
    config = ImageConfig.from_json(
        config_doc,
        image_id=config_desc.get("digest"),
        source=f"{name} image config",
    )
    blobs = []
    for i, layer in enumerate(doc.get("layers") or []):
        digest = str(layer.get("digest", ""))
        path = _blob_path(layout, digest, name=name)
        blobs.append(
            LayerBlob(
                name=f"{name} layer {i} ({digest[:19]})",
                open=partial(_open_binary, path),
                digest=digest,
            )
        )
    layers = scan_blobs(blobs, progress, keep=keep)
    return finish(ref=ref.given, digest=desc.get("digest"), config=config, layers=layers)


@contextmanager
def _member(archive: Path, member: str) -> Iterator[IO[bytes]]:
    """A regular file of the archive; links are not followed (a loop would recurse)."""
    with tarfile.open(archive, mode="r:") as tar:
        try:
            info = tar.getmember(member)
        except KeyError:
            raise InputError(
                f"{archive}: manifest names '{member}', which is not in the archive."
            ) from None
        data = tar.extractfile(info) if info.isreg() else None
        if data is None:
            raise InputError(f"{archive}: '{member}' is not a regular file in the archive.")
        yield data


def _place(archive: Path, member: str) -> tuple[Path, int, int] | None:
    """Where a member's bytes lie in the archive, if in one run (a regular, not
    sparse, file); else None and it is read through the tar reader."""
    with tarfile.open(archive, mode="r:") as tar:
        try:
            info = tar.getmember(member)
        except KeyError:
            return None  # reported when it is opened
        if not info.isreg() or info.issparse():
            return None
        return archive, info.offset_data, info.size


def scan_docker_archive(
    ref: ImageRef, *, progress: Progress | None = None, keep: Path | None = None
) -> ScannedImage:
    """``docker-archive:PATH``: a ``docker save`` tar (legacy or OCI-style inside)."""
    archive = ref.path
    if archive is None or not archive.is_file():
        raise InputError(f"'{ref.given}': {archive} is not a file.")
    try:
        with _member(archive, "manifest.json") as f:
            data = f.read(MAX_JSON + 1)
        if len(data) > MAX_JSON:
            raise InputError(f"'{ref.given}': manifest.json is over {MAX_JSON >> 20} MiB.")
        manifest = json.loads(data)
    except (tarfile.TarError, OSError) as exc:
        raise InputError(f"'{ref.given}': not a docker-archive tar ({exc}).") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"'{ref.given}': manifest.json is not valid JSON ({exc}).") from None
    except UnicodeDecodeError:
        raise InputError(f"'{ref.given}': manifest.json is not UTF-8 JSON.") from None
    if isinstance(manifest, list) and len(manifest) != 1:
        raise InputError(
            f"'{ref.given}': expected one image in manifest.json, found {len(manifest)}."
        )
    from buildmatrix import schema

    schema.validate(manifest, "docker-archive-manifest", source=f"{archive}:manifest.json")
    entry = manifest[0]
    with _member(archive, entry["Config"]) as f:
        config_doc = read_json_blob(f, name=f"{archive}:{entry['Config']}", digest=None)
    image_id = "sha256:" + Path(entry["Config"]).name.removesuffix(".json")
    config = ImageConfig.from_json(
        config_doc, image_id=image_id, source=f"{archive}:{entry['Config']}"
    )
    blobs = [
        LayerBlob(
            name=f"{archive}:{member}",
            open=partial(_member, archive, member),
            place=_place(archive, member),
        )
        for member in entry.get("Layers") or []
    ]
    layers = scan_blobs(blobs, progress, keep=keep)
    return finish(ref=ref.given, digest=None, config=config, layers=layers)


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
    if path.is_dir():
        for result in scan_tree(path, compat=True):
            if isinstance(result, ScanProblem):
                problems.append(problem_line(result.path, result.message))
            elif isinstance(result, CompatLibrary):
                libraries[result.path] = result
            else:
                stored = str(path / result.path) if keep else None
                files.append(replace(result, stored=stored))
    else:
        report = inspect_file(path, display=path.name)
        if report is not None:
            files.append(replace(report, stored=str(path) if keep else None))
    paths = [f.path for f in files] if not path.is_dir() else _all_paths(path)
    symlinks = _symlinks(path) if path.is_dir() else {}
    return ScannedImage(
        ref=ref.given,
        digest=None,
        config=ImageConfig(),
        files=files,
        problems=problems,
        paths=paths,
        layers=0,
        symlinks=symlinks,
        compat=find_compat(libraries, paths, symlinks),
    )


def _all_paths(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()
    )


def _symlinks(root: Path) -> dict[str, str]:
    """Every symlink under ``root`` (not followed) and its target as written."""
    found = {}
    for p in root.rglob("*"):
        if p.is_symlink():
            with contextlib.suppress(OSError):
                found[str(p.relative_to(root))] = str(p.readlink())
    return found
