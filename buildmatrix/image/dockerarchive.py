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
import tarfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import IO, Any

from buildmatrix.errors import InputError
from buildmatrix.image.archivefile import uncompressed
from buildmatrix.image.blobs import (
    MAX_JSON,
    check_manifest,
    is_index,
    layer_diff_ids,
    manifest_layers,
    read_json_blob,
)
from buildmatrix.image.gokeys import check_keys, loads
from buildmatrix.image.layer_scan import finish, scan_blobs
from buildmatrix.image.manifests import CONFIG, NoPlatformMatch, choose, memo
from buildmatrix.image.offered import offered_platforms, runnable
from buildmatrix.image.paxheaders import TarHeaderError
from buildmatrix.image.platform import (
    DEFAULT_PLATFORM,
    config_platform,
    parse_platform,
    rank,
    require_config_platform,
)
from buildmatrix.image.ref import ImageRef
from buildmatrix.image.savetar import SavedMember, SaveTree, member_of
from buildmatrix.image.scanned import ImageConfig, LayerBlob, Progress, ScannedImage
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
    with uncompressed(path, source=source) as plain:
        archive = Archive(plain, source=source)
        return _scan(ref, archive, path=path, platform=platform, progress=progress, keep=keep)


def _scan(
    ref: ImageRef,
    archive: Archive,
    *,
    path: Path,
    platform: str,
    progress: Progress | None,
    keep: Path | None,
) -> ScannedImage:
    """The image of an archive (``path``: the file as given, for messages)."""
    source = archive.tree.source
    manifest = _json(archive.read("manifest.json", what="manifest"), name=f"{path}:manifest.json")
    if isinstance(manifest, list) and len(manifest) != 1:
        raise InputError(f"{source}: expected one image in manifest.json, found {len(manifest)}.")
    from buildmatrix import schema

    check_keys(manifest, shape="saveentry", name=f"{path}:manifest.json")
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
    index = _oci_index(archive)
    offered: tuple[str, ...] = ()
    also: tuple[str, ...] = ()
    if index is not None:
        view = _IndexView(archive, index, platform)
        offered, also = view.offered, view.also
        if rank(parse_platform(platform), config_platform(config_doc), legacy=True) is None:
            # manifest.json's image is for another platform: containerd (and Docker's
            # containerd image store) run the index's image for this one
            image = view.scan(ref, progress=progress, keep=keep)
            return replace(image, offered=offered or image.offered, also=also)
        view.same_as(config_id)
    require_config_platform(config_doc, platform, name=ref.given, entry=False)
    names = entry.get("Layers") or []
    diff_ids = layer_diff_ids(config_doc, count=len(names), source=f"{path}:{entry['Config']}")
    blobs = []
    for name, diff_id in zip(names, diff_ids, strict=True):
        member = archive.tree.resolve(name, what="layer")
        blobs.append(
            LayerBlob(
                name=f"{path}:{name}",
                open=partial(archive.open, member),
                place=archive.place(member),
                diff_id=diff_id,
                engine_load=True,  # docker load inflates it (moby loadLayer)
            )
        )
    layers = scan_blobs(blobs, progress, keep=keep)
    image = finish(ref=ref.given, digest=None, config=config, layers=layers)
    return replace(image, offered=offered or image.offered, also=also)


def _json(data: bytes, *, name: str) -> Any:
    return loads(data, name=name)  # a key twice is refused (buildmatrix.image.gokeys)


def _oci_index(archive: Archive) -> dict[str, Any] | None:
    """index.json of an archive that is also an OCI layout, else None (containerd
    reads such an archive by its manifest.json too)."""
    if not archive.tree.has("oci-layout"):
        return None
    source = archive.tree.source
    layout = _json(archive.read("oci-layout", what="OCI layout marker"), name="oci-layout")
    if not isinstance(layout, dict) or not layout.get("imageLayoutVersion"):
        return None
    index = _json(archive.read("index.json", what="OCI index"), name="index.json")
    if not isinstance(index, dict):
        raise InputError(f"{source}: index.json is not a JSON object.")
    check_keys(index, shape="manifest", name=f"{source} index.json")
    return check_manifest(index, name=f"{source} index.json")


class _IndexView:
    """What containerd loads from the archive's index.json (``ImportIndex``: each
    entry an image) for ``platform``: the manifest each entry's image runs there,
    and the platforms the entries offer."""

    def __init__(self, archive: Archive, index: dict[str, Any], platform: str) -> None:
        self.archive, self.platform = archive, platform
        self.source = archive.tree.source
        self.fetch = memo(partial(_blob, archive))
        offered: dict[str, None] = {}
        picks, also = [], set[str]()
        for desc in index.get("manifests") or []:
            doc = self.fetch(desc, "an image of index.json")
            if is_index(doc):
                found = offered_platforms(desc, doc, fetch=self.fetch, name=self.source)
            else:
                found = tuple(p for p in [runnable(config_platform(self._config(doc)))] if p)
            offered |= dict.fromkeys(found)
            try:
                picked, more = choose(desc, doc, platform, fetch=self.fetch, name=self.source)
            except NoPlatformMatch:
                continue  # that image has nothing for this platform
            picks.append(picked)
            also |= set(more)
        self.offered, self.also, self.picks = tuple(offered), tuple(sorted(also)), picks

    def _config(self, manifest: dict[str, Any]) -> dict[str, Any]:
        config = self.fetch(manifest.get("config") or {}, CONFIG)
        check_keys(config, shape="config", name=f"{self.source} image config")
        return config

    def configs(self) -> set[str]:
        return {str((p.manifest.get("config") or {}).get("digest", "")) for p in self.picks}

    def same_as(self, config_id: str) -> None:
        """Every image the index names at the platform must be the one manifest.json
        names (the same config digest), else the classic engine and containerd run
        different images: refused."""
        configs = self.configs()
        if configs != {config_id}:
            raise InputError(
                f"{self.source}: index.json names the image config(s) "
                f"{', '.join(sorted(configs)) or 'none'} for {self.platform} and manifest.json "
                f"names {config_id}: docker load (and the classic engine) would run the one, "
                "containerd and Docker's containerd image store the other. The archive is "
                "ambiguous and refused; save it again with one tool."
            )

    def scan(self, ref: ImageRef, *, progress: Progress | None, keep: Path | None) -> ScannedImage:
        """The index's image for the platform, read from the archive's blobs (each
        verified against its digest, its layers against the config's diff_ids)."""
        if len(self.configs()) != 1:
            raise InputError(
                f"{self.source}: index.json names {len(self.configs())} images for "
                f"{self.platform} ({', '.join(sorted(self.configs())) or 'none'}) and "
                "manifest.json's image is for another platform, so which one a node runs "
                "depends on the name it is run by: refused. Save one image per archive."
                if self.configs()
                else f"{self.source}: no image for platform {self.platform}: index.json "
                "names none and manifest.json's image is for another platform. Pass "
                "--platform for the platform the archive holds."
            )
        picked = self.picks[0]
        config_desc = picked.manifest.get("config") or {}
        config_doc = self._config(picked.manifest)
        if picked.unplaced or picked.single:
            require_config_platform(
                config_doc, self.platform, name=ref.given, entry=picked.unplaced
            )
        source = f"{self.source} config {str(config_desc.get('digest'))[:19]}"
        config = ImageConfig.from_json(
            config_doc, image_id=config_desc.get("digest"), source=source
        )
        pairs = manifest_layers(picked.manifest, config_doc, source=source)
        blobs = []
        for i, (layer, diff_id) in enumerate(pairs):
            digest = str(layer.get("digest", ""))
            member = self.archive.tree.resolve(_blob_name(self.archive, digest), what="layer")
            blobs.append(
                LayerBlob(
                    name=f"{self.source} {self.platform} layer {i} ({digest[:19]})",
                    open=partial(self.archive.open, member),
                    digest=digest,
                    diff_id=diff_id,
                )
            )
        layers = scan_blobs(blobs, progress, keep=keep)
        top = str(picked.desc.get("digest") or "") or None
        return finish(ref=ref.given, digest=top, config=config, layers=layers)


def _blob_name(archive: Archive, digest: str) -> str:
    """The member of a blob of the layout; a blob index.json names that the archive
    lacks (an export of one platform of a multi-platform image, e.g. ``ctr images
    export`` without ``--all-platforms``) is refused: that image cannot be loaded
    from this archive."""
    algo, _, hexdigest = digest.partition(":")
    if not algo.isalnum() or not hexdigest.isalnum():
        raise InputError(f"{archive.tree.source}: malformed digest '{digest}' in the index.")
    name = f"blobs/{algo}/{hexdigest}"
    if not archive.tree.has(name):
        raise InputError(
            f"{archive.tree.source}: index.json names blob {digest}, which the archive does "
            "not hold (an export of fewer platforms than its index lists, e.g. ctr images "
            "export without --all-platforms): the image it belongs to cannot be loaded from "
            "this archive, so it cannot be judged. Pass --platform for a platform the "
            "archive holds, or export with --all-platforms."
        )
    return name


def _blob(archive: Archive, desc: Mapping[str, Any], what: str = "OCI blob") -> dict[str, Any]:
    """A JSON blob of the layout by its descriptor, verified against its digest."""
    digest = str(desc.get("digest", ""))
    data = archive.read(_blob_name(archive, digest), what="OCI blob")
    return read_json_blob(
        io.BytesIO(data), name=f"{archive.tree.source} {what} {digest[:19]}", digest=digest
    )
