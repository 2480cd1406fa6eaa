"""The local Docker engine, through the docker SDK: the image config from the API,
the filesystem from one streamed ``docker save`` (nothing written to disk).

The save stream holds the layers in an order only its manifest.json (which may
come last) tells, so each layer tar is summarised as it streams by and the
summaries are merged once the manifest is known.
"""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from buildmatrix import schema
from buildmatrix.errors import EnvironmentUnavailable, InputError
from buildmatrix.image.blobs import MAX_JSON, VerifyingReader
from buildmatrix.image.layer_scan import finish
from buildmatrix.image.layers import scan_layer
from buildmatrix.image.overlay2 import UnreadableLayer, scan_layer_dir
from buildmatrix.image.platform import DEFAULT_PLATFORM
from buildmatrix.image.prefetch import iter_chunks_reader
from buildmatrix.image.ref import ImageRef
from buildmatrix.image.savetar import SaveTree, member_of
from buildmatrix.image.scanned import ImageConfig, Progress, ScannedImage
from buildmatrix.image.tarstream import member_data, open_forward
from buildmatrix.image.tree import LayerSummary

if TYPE_CHECKING:
    import docker

    from buildmatrix.image.containerd_store import Store

_CHUNK = 4 << 20


def engine() -> docker.DockerClient:
    """A client for the engine named by DOCKER_HOST (or the default socket)."""
    import docker

    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except docker.errors.DockerException as exc:
        raise EnvironmentUnavailable(
            f"no Docker engine answers ({exc}). Start one, or set DOCKER_HOST to its socket."
        ) from None
    return client


def find_image(client: docker.DockerClient, ref: ImageRef) -> Any | None:
    import docker

    for name in (ref.given.removeprefix("docker-daemon:"), ref.name):
        try:
            return client.images.get(name)
        except docker.errors.ImageNotFound:
            continue
        except docker.errors.APIError as exc:
            raise EnvironmentUnavailable(
                f"the Docker engine failed to look up {name}: {exc}."
            ) from None
    return None


def scan_daemon_image(
    client: docker.DockerClient,
    image: Any,
    ref: ImageRef,
    *,
    progress: Progress | None = None,
    keep: Path | None = None,
    platform: str = DEFAULT_PLATFORM,
    containerd: Store | None = None,
) -> ScannedImage:
    """The engine's image from the engine's own storage where it can be read here
    (containerd's image store, image/enginestore.py; the overlay2 driver's folders),
    else from its ``docker save`` stream; ``read_from`` says which, and why not."""
    attrs = image.attrs
    config = ImageConfig.from_json(attrs, image_id=attrs.get("Id"), blob=False)
    repo = ref.name.rsplit(":", 1)[0] if not ref.digest else ref.name.split("@")[0]
    digests = [d for d in attrs.get("RepoDigests") or [] if d.split("@")[0] == repo]
    digest = digests[0].split("@", 1)[1] if digests else None
    from buildmatrix.image.enginestore import read_engine_store

    read, why = read_engine_store(
        client, ref, attrs, given=containerd, platform=platform, progress=progress, keep=keep
    )
    if read is not None:  # the digest of the manifest judged (docs/check.md, "Digests")
        return replace(read, digest=read.digest or digest)
    if why:  # the engine keeps its images in containerd, which cannot be read here
        saved = _scan_saved(client, attrs, ref, progress=progress, keep=keep)
        image_ = finish(ref=ref.given, digest=digest, config=config, layers=saved)
        return replace(image_, read_from=f"docker save stream ({why})")
    folders, why = storage_folders(client, attrs) if keep is None else (None, "--load-test")
    if folders is not None:
        try:
            layers = [
                _read_folder(folder, name=f"{ref.given} layer {i} ({folder})")
                for i, folder in enumerate(folders)
            ]
        except UnreadableLayer as exc:
            why = str(exc)
        else:
            image_ = finish(ref=ref.given, digest=digest, config=config, layers=layers)
            return replace(image_, read_from=f"engine storage (overlay2, {len(folders)} layers)")
    saved = _scan_saved(client, attrs, ref, progress=progress, keep=keep)
    image_ = finish(ref=ref.given, digest=digest, config=config, layers=saved)
    return replace(image_, read_from=f"docker save stream ({why})")


def _read_folder(folder: Path, *, name: str) -> LayerSummary:
    """One layer folder of the engine's storage; read once per run when a layer cache
    is in use (images of a build matrix share their base layers' folders)."""
    from buildmatrix.image.cache import active

    cache = active()
    if cache is None:
        return scan_layer_dir(folder, name=name)
    return cache.shared(f"overlay2:{folder}", lambda: scan_layer_dir(folder, name=name))


def storage_folders(
    client: docker.DockerClient, attrs: dict[str, Any]
) -> tuple[list[Path] | None, str]:
    """The image's layers as the overlay2 driver stores them, bottom first, or None
    and why not. The folders come from the image's own layer chain (the config's
    diff_ids, chained as the engine's layer store names them), each checked to be
    one the engine's overlay2 driver reports for this image."""
    import hashlib

    driver = (attrs.get("GraphDriver") or {}).get("Name")
    if driver != "overlay2":
        return None, f"the engine's storage driver is {driver or 'unknown'}, not overlay2"
    host = os.environ.get("DOCKER_HOST", "unix://")
    if not host.startswith("unix://"):
        return None, "the engine is not on this host"
    import docker

    try:
        root = Path(client.info()["DockerRootDir"])
    except (docker.errors.DockerException, KeyError, TypeError) as exc:
        return None, f"the engine's data root is unknown ({exc})"
    diff_ids = ((attrs.get("RootFS") or {}).get("Layers")) or []
    layerdb = root / "image" / "overlay2" / "layerdb"
    reported = _reported(attrs)
    folders: list[Path] = []
    chain = ""
    for diff_id in diff_ids:
        chain = (
            diff_id
            if not chain
            else "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
        )
        algo, _, hexdigest = chain.partition(":")
        try:
            cache_id = (layerdb / algo / hexdigest / "cache-id").read_text().strip()
        except OSError as exc:
            return None, f"the layer store is not readable here ({exc.strerror}; run as root)"
        folder = root / "overlay2" / cache_id / "diff"
        if folder not in reported:
            return None, f"layer {diff_id[:19]} is not where the engine reports it"
        if not os.access(folder, os.R_OK | os.X_OK):
            return None, f"{folder} is not readable (run as root)"
        folders.append(folder)
    if not folders:
        return None, "the image has no layers"
    return folders, ""


def _reported(attrs: dict[str, Any]) -> set[Path]:
    data = (attrs.get("GraphDriver") or {}).get("Data") or {}
    lower = [p for p in str(data.get("LowerDir") or "").split(":") if p]
    upper = [str(data["UpperDir"])] if data.get("UpperDir") else []
    return {Path(p) for p in [*lower, *upper]}


def _scan_saved(
    client: docker.DockerClient,
    attrs: dict[str, Any],
    ref: ImageRef,
    *,
    progress: Progress | None,
    keep: Path | None,
) -> list[LayerSummary]:
    import docker

    chunks = client.api.get_image(attrs["Id"], chunk_size=_CHUNK)
    stream = iter_chunks_reader(iter(chunks))
    counter = VerifyingReader(stream, digest=None, name=ref.given, progress=progress)
    try:
        tree, summaries, documents = scan_save_stream(
            counter,  # type: ignore[arg-type]
            name=ref.given,
            keep=keep,
        )
    except (tarfile.TarError, docker.errors.DockerException) as exc:
        raise EnvironmentUnavailable(
            f"the Docker engine could not export {ref.given} ({exc})."
        ) from None
    finally:
        stream.close()
    try:
        manifest = json.loads(documents[tree.resolve("manifest.json", what="manifest").offset])
        schema.validate(manifest, "docker-archive-manifest", source=f"{ref.given} manifest.json")
        return [
            summaries[tree.resolve(layer, what="layer").offset] for layer in manifest[0]["Layers"]
        ]
    except (KeyError, ValueError) as exc:
        raise InputError(
            f"'{ref.given}': the engine's save stream has no usable manifest ({exc})."
        ) from None


def scan_save_stream(
    stream: IO[bytes], *, name: str, keep: Path | None = None
) -> tuple[SaveTree, dict[int, LayerSummary], dict[int, bytes]]:
    """Read a ``docker save`` tar as one stream: the folder it extracts to
    (buildmatrix.image.savetar: names cleaned, symlinks kept, e.g. Docker 24 and
    older write a repeated layer as one), and the layer summaries and JSON documents
    by where their bytes start in the stream (the manifest says which layer is
    which; a link resolves to the member it names)."""
    tree = SaveTree(f"'{name}'")
    summaries: dict[int, LayerSummary] = {}
    documents: dict[int, bytes] = {}
    with open_forward(stream) as outer:
        for member in outer:
            saved, link = member_of(member, source=tree.source)
            tree.add(saved, link=link)
            if not member.isreg():
                continue
            data = member_data(outer, member)
            head = data.read(512)
            if head[:1] in (b"{", b"[") and member.size <= MAX_JSON:  # manifest, config
                documents[member.offset_data] = head + data.read()
            elif head[257:262] == b"ustar":  # a layer tar
                layer = _Prefixed(head, data)
                label = f"{name} {member.name}"
                summaries[member.offset_data] = scan_layer(
                    cast(IO[bytes], layer), name=label, keep=keep
                )
    return tree, summaries, documents


class _Prefixed:
    """A file object that first returns bytes already read, then the rest."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self._head = head
        self._rest = rest

    def read(self, size: int = -1) -> bytes:
        if self._head:
            if size < 0:
                data, self._head = self._head + self._rest.read(), b""
                return bytes(data)
            data, self._head = self._head[:size], self._head[size:]
            if len(data) < size:
                data += self._rest.read(size - len(data))
            return bytes(data)
        return bytes(self._rest.read(size))

    def readinto(self, buffer: Any) -> int:
        if not self._head:
            return int(self._rest.readinto(buffer))
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False
