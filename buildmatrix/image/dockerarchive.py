"""``docker-archive:PATH``: a ``docker save`` tar, read as ``docker load`` reads it.

The archive's headers are read once into the folder ``docker load`` would extract
(buildmatrix.image.savetar); ``manifest.json``, the config and the layers are then
found in it as the engine finds them, and the layers read in place
(buildmatrix.image.inplace), each checked against the config's ``rootfs.diff_ids``
as the engine checks it (moby ``image/tarexport/load.go``, ``Load``: "invalid
diffID for layer"). An archive that is also an OCI layout (``oci-layout`` and
``index.json``, as Docker 25 and later write it) is what containerd and Docker's
containerd image store load instead of ``manifest.json`` (containerd
``core/images/archive/importer.go``, ``ImportIndex``): the two must name the same
image config, else the archive is refused as ambiguous.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import IO, Any

from buildmatrix.errors import InputError
from buildmatrix.image.model import (
    MAX_JSON,
    ImageConfig,
    LayerBlob,
    Progress,
    ScannedImage,
    check_manifest,
    finish,
    is_index,
    layer_diff_ids,
    read_json_blob,
    scan_blobs,
)
from buildmatrix.image.paxheaders import TarHeaderError
from buildmatrix.image.platform import (
    DEFAULT_PLATFORM,
    require_config_platform,
    select_platform,
)
from buildmatrix.image.ref import ImageRef
from buildmatrix.image.savetar import SavedMember, SaveTree, member_of
from buildmatrix.image.tarheaders import StrictTarInfo
from buildmatrix.image.tarstream import check_end


class Archive:
    """A ``docker save`` tar's members (as extracted) and how to read them."""

    def __init__(self, path: Path, *, source: str) -> None:
        self.path = path
        self.tree = SaveTree(source)
        self._infos: dict[int, tarfile.TarInfo] = {}  # stored bytes' offset -> header
        try:
            self._read_headers()
        except TarHeaderError as exc:
            raise InputError(
                f"{source}: {exc}; tar readers (Python's, and Go's that docker load uses) "
                "would not read this archive alike, so it is refused."
            ) from None
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise InputError(f"{source}: not a docker-archive tar ({exc}).") from None

    def _read_headers(self) -> None:
        end = self.path.stat().st_size
        with tarfile.open(self.path, mode="r:", tarinfo=StrictTarInfo) as tar:
            for info in tar:
                member, link = member_of(info, source=self.tree.source)
                # tarfile stops quietly where a header's size runs past the end of
                # the file; Go's reader (docker load) fails: refused.
                if (
                    member.kind == "file"
                    and not member.sparse
                    and member.offset + member.size > end
                ):
                    raise InputError(
                        f"{self.tree.source}: member '{info.name}' claims {info.size} bytes "
                        f"from offset {info.offset_data}, past the archive's end ({end} "
                        "bytes); docker load fails on it, so it is refused."
                    )
                if member.kind == "file":
                    self._infos[member.offset] = info
                self.tree.add(member, link=link)
            check_end(tar)

    @contextmanager
    def open(self, member: SavedMember) -> Iterator[IO[bytes]]:
        """A regular member's bytes (a sparse one through the tar reader's map)."""
        with tarfile.open(self.path, mode="r:") as tar:
            data = tar.extractfile(self._infos[member.offset])
            if data is None:  # pragma: no cover - regular members always have data
                raise InputError(f"{self.tree.source}: '{member.name}' has no data.")
            yield data

    def read(self, name: str, *, what: str) -> bytes:
        """A small member (manifest, config, index), at most :data:`MAX_JSON` bytes."""
        member = self.tree.resolve(name, what=what)
        if member.size > MAX_JSON:
            raise InputError(
                f"{self.tree.source}: {what} '{name}' is over {MAX_JSON >> 20} MiB; refused."
            )
        with self.open(member) as f:
            return f.read(MAX_JSON)

    def place(self, member: SavedMember) -> tuple[Path, int, int] | None:
        """Where a member's bytes lie in one run of the archive (not sparse)."""
        return None if member.sparse else (self.path, member.offset, member.size)


def scan_docker_archive(
    ref: ImageRef,
    *,
    platform: str = DEFAULT_PLATFORM,
    progress: Progress | None = None,
    keep: Path | None = None,
) -> ScannedImage:
    """``docker-archive:PATH``: a ``docker save`` tar (legacy or OCI-style inside)."""
    path = ref.path
    if path is None or not path.is_file():
        raise InputError(f"'{ref.given}': {path} is not a file.")
    source = f"'{ref.given}'"
    archive = Archive(path, source=source)
    manifest = _json(archive.read("manifest.json", what="manifest"), name=f"{path}:manifest.json")
    if isinstance(manifest, list) and len(manifest) != 1:
        raise InputError(f"{source}: expected one image in manifest.json, found {len(manifest)}.")
    from buildmatrix import schema

    schema.validate(manifest, "docker-archive-manifest", source=f"{path}:manifest.json")
    entry = manifest[0]
    config_bytes = archive.read(entry["Config"], what="config")
    config_id = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    config_doc = _json(config_bytes, name=f"{path}:{entry['Config']}")
    if not isinstance(config_doc, dict):
        raise InputError(f"{path}:{entry['Config']}: expected a JSON object.")
    config = ImageConfig.from_json(
        config_doc, image_id=config_id, source=f"{path}:{entry['Config']}"
    )  # a malformed config is named as such before its platform is judged
    require_config_platform(config_doc, platform, name=ref.given, entry=False)
    names = entry.get("Layers") or []
    diff_ids = layer_diff_ids(config_doc, count=len(names), source=f"{path}:{entry['Config']}")
    if archive.tree.has("oci-layout"):
        _same_image_in_index(archive, config_id, platform=platform)
    blobs = []
    for name, diff_id in zip(names, diff_ids, strict=True):
        member = archive.tree.resolve(name, what="layer")
        blobs.append(
            LayerBlob(
                name=f"{path}:{name}",
                open=partial(archive.open, member),
                place=archive.place(member),
                diff_id=diff_id,
            )
        )
    layers = scan_blobs(blobs, progress, keep=keep)
    return finish(ref=ref.given, digest=None, config=config, layers=layers)


def _json(data: bytes, *, name: str) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{name}: not valid JSON ({exc}).") from None


def _same_image_in_index(archive: Archive, config_id: str, *, platform: str) -> None:
    """containerd loads an archive with ``oci-layout`` through ``index.json``
    (``ImportIndex``); the legacy engine through ``manifest.json``. Every image the
    index names (at ``platform``, for a multi-platform one) must be the image
    ``manifest.json`` names (the same config digest), else the two engines would run
    different images: refused."""
    source = archive.tree.source
    layout = _json(archive.read("oci-layout", what="OCI layout marker"), name="oci-layout")
    if not isinstance(layout, dict) or not layout.get("imageLayoutVersion"):
        return  # containerd reads such an archive by its manifest.json too
    index = _json(archive.read("index.json", what="OCI index"), name="index.json")
    if not isinstance(index, dict):
        raise InputError(f"{source}: index.json is not a JSON object.")
    check_manifest(index, name=f"{source} index.json")
    configs = set()
    for desc in index.get("manifests") or []:
        doc = _blob(archive, desc)
        while is_index(doc):
            check_manifest(doc, name=f"{source} index")
            doc = _blob(archive, select_platform(doc.get("manifests") or [], platform, name=source))
        check_manifest(doc, name=f"{source} manifest")
        configs.add(str((doc.get("config") or {}).get("digest", "")))
    if configs != {config_id}:
        raise InputError(
            f"{source}: index.json names the image config(s) {', '.join(sorted(configs)) or 'none'}"
            f" and manifest.json names {config_id}: docker load (and the classic engine) "
            "would run the one, containerd and Docker's containerd image store the other. "
            "The archive is ambiguous and refused; save it again with one tool."
        )


def _blob(archive: Archive, desc: dict[str, Any]) -> dict[str, Any]:
    """A JSON blob of the layout by its descriptor, verified against its digest."""
    digest = str(desc.get("digest", ""))
    algo, _, hexdigest = digest.partition(":")
    if not algo.isalnum() or not hexdigest.isalnum():
        raise InputError(f"{archive.tree.source}: malformed digest '{digest}' in the index.")
    data = archive.read(f"blobs/{algo}/{hexdigest}", what="OCI blob")
    return read_json_blob(
        io.BytesIO(data), name=f"{archive.tree.source} blob {digest[:19]}", digest=digest
    )
