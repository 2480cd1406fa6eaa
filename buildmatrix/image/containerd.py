"""``containerd:NAME[:TAG|@DIGEST]``: an image in containerd's stores on this machine.

Names are resolved in containerd's metadata store, read-only (image/bolt.py says
why that is safe while containerd runs), with the layout of containerd's
core/metadata/buckets.go: ``v1/<namespace>/images/<name>/target/{digest,
mediatype,size}`` for an image record and ``v1/<namespace>/content/blob/<digest>``
for each blob the namespace holds. Blobs are read from the content store's folder
(``<root>/io.containerd.content.v1.content/blobs/sha256/<hex>``, plugins/content/
local/store.go ``blobPath``) and verified against their digests as they are read,
so the layer cache (image/cache.py) applies as for registries.

The namespace and root are taken as ``ctr`` and the daemon take them:
``$CONTAINERD_NAMESPACE`` (default ``k8s.io``, the CRI plugin's), ``$CONTAINERD_ROOT``
(default ``/var/lib/containerd``, the daemon's ``root``); ``$CONTAINERD_ADDRESS``
(default ``/run/containerd/containerd.sock``) only helps say what is wrong when the
store is not where it is looked for: nothing is asked of the daemon.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import IO, Any

from buildmatrix.errors import EnvironmentUnavailable, InputError
from buildmatrix.image.blobs import (
    check_manifest,
    is_index,
    manifest_layers,
    read_json_blob,
)
from buildmatrix.image.bolt import BoltBusy, BoltError, Bucket, read_consistent
from buildmatrix.image.containerd_store import DEFAULT_NAMESPACE, Store
from buildmatrix.image.layer_scan import finish, scan_blobs
from buildmatrix.image.manifests import choose, memo
from buildmatrix.image.mobypick import moby_choose
from buildmatrix.image.offered import offered_platforms
from buildmatrix.image.platform import DEFAULT_PLATFORM, require_config_platform
from buildmatrix.image.ref import ImageRef, Transport, parse_name
from buildmatrix.image.scanned import ImageConfig, LayerBlob, Progress, ScannedImage

METADATA = Path("io.containerd.metadata.v1.bolt") / "meta.db"
CONTENT = Path("io.containerd.content.v1.content") / "blobs"
LISTED = 12  # names shown in a message


@dataclass(frozen=True, kw_only=True)
class Record:
    """What the metadata store says: the image's target, the namespace's blobs."""

    name: str
    digest: str
    media_type: str
    blobs: frozenset[str]


def candidate_names(ref: ImageRef, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """The record names NAME may stand for. In the CRI's namespace the name a Pod
    runs comes first: the CRI resolves an image only by ``docker.ParseDockerRef``
    of it (``docker.io/library/NAME:latest``; with a tag and a digest, the digest
    alone; containerd ``internal/cri/server/images/service.go``, ``LocalResolve``;
    1.6: ``pkg/cri/server/helpers.go``, ``localResolve``). Elsewhere NAME as given
    comes first, as ``ctr`` looks it up, then the normalised name (what ``ctr
    images import`` and nerdctl write)."""
    given = ref.given.removeprefix(f"{ref.transport.value}:")
    full = parse_name(given, given=ref.given, transport=Transport.REGISTRY)
    normalised = _docker_ref(full)
    names = [given]
    if not ref.tag and not ref.digest:
        names.append(f"{given}:latest")
    names.append(normalised)
    if full.digest and full.tag:
        names.append(f"{full.host}/{full.repository}:{full.tag}@{full.digest}")
    if namespace == DEFAULT_NAMESPACE:
        names.insert(0, normalised)
    return list(dict.fromkeys(names))


def _docker_ref(full: ImageRef) -> str:
    """distribution/reference ``ParseDockerRef(...).String()`` of a parsed name:
    ``index.docker.io`` is ``docker.io`` (``splitDockerDomain``), a one-component
    Docker Hub name is under ``library/``, a digest drops the tag."""
    host = "docker.io" if full.host == "index.docker.io" else full.host
    repo = full.repository
    if host == "docker.io" and "/" not in repo:
        repo = f"library/{repo}"
    return (
        f"{host}/{repo}@{full.digest}" if full.digest else f"{host}/{repo}:{full.tag or 'latest'}"
    )


def _text(bucket: Bucket | None, key: bytes) -> str:
    entry = bucket.get(key) if bucket is not None else None
    return entry[0].decode("utf-8", "replace") if entry and not entry[1] else ""


def _find(ref: ImageRef, store: Store, meta: Path, *, target: str = "") -> Record:
    """The record NAME names; with ``target`` (an engine's answer for NAME) only a
    record with that target digest, by name first, else any: as Docker's containerd
    image service resolves an image ID (daemon/containerd/image.go ``resolveImage``,
    ``target.digest==`` and the first image listed)."""
    names = candidate_names(ref, store.namespace)
    full = parse_name(names[0], given=ref.given, transport=Transport.REGISTRY)
    wanted = target or full.digest

    def walk(root: Bucket) -> Record | tuple[list[str], list[str]]:
        schema = root.bucket(b"v1")
        items = schema.items() if schema is not None else iter(())
        namespaces = sorted(k.decode("utf-8", "replace") for k, _, is_b in items if is_b)
        images = root.bucket(b"v1", store.namespace.encode(), b"images")
        if images is None:
            return namespaces, []
        for name in names:
            held = images.bucket(name.encode(), b"target")
            if held is not None and (not wanted or _text(held, b"digest") == wanted):
                return _record(root, store, name, held)
        listed = []
        for key, value, is_bucket in images.items():
            if not is_bucket:
                continue
            name = key.decode("utf-8", "replace")
            listed.append(name)
            if wanted and (target or _repository(name) == (full.host, full.repository)):
                entry = images.open(value).bucket(b"target")
                if entry is not None and _text(entry, b"digest") == wanted:
                    return _record(root, store, name, entry)
        return namespaces, listed

    try:
        found = read_consistent(meta, walk)
    except PermissionError:
        raise _unreadable(meta, store) from None
    except FileNotFoundError:
        raise _missing(store) from None
    except BoltBusy as exc:
        raise EnvironmentUnavailable(f"'{ref.given}': {exc} Try again.") from None
    except BoltError as exc:
        raise InputError(
            f"'{ref.given}': containerd's metadata store cannot be read ({exc}). "
            f"Check that {store.root} is a containerd root ($CONTAINERD_ROOT)."
        ) from None
    except OSError as exc:
        raise EnvironmentUnavailable(f"'{ref.given}': {meta} cannot be read ({exc}).") from None
    if isinstance(found, Record):
        return found
    namespaces, listed = found
    return _not_found(ref, store, names, namespaces, listed)


def _repository(name: str) -> tuple[str, str]:
    """(host, repository) of a record's name; ('', '') for one that is no reference."""
    try:
        parsed = parse_name(name, given=name, transport=Transport.REGISTRY)
    except InputError:
        return "", ""
    return parsed.host, parsed.repository


def _record(root: Bucket, store: Store, name: str, target: Bucket) -> Record:
    blobs = root.bucket(b"v1", store.namespace.encode(), b"content", b"blob")
    held = frozenset(
        k.decode("utf-8", "replace") for k, _, b in (blobs.items() if blobs else []) if b
    )
    return Record(
        name=name,
        digest=_text(target, b"digest"),
        media_type=_text(target, b"mediatype"),
        blobs=held,
    )


class NotInStore(InputError):
    """The store has no image of that name (in that namespace): for a caller that can
    look elsewhere (smoke --prefer-containerd falls back to the registry)."""


def _not_found(
    ref: ImageRef, store: Store, names: list[str], namespaces: list[str], listed: list[str]
) -> Record:
    looked = " or ".join(f"'{n}'" for n in names)
    if store.namespace not in namespaces:
        there = ", ".join(namespaces) or "none"
        raise NotInStore(
            f"'{ref.given}': containerd at {store.root} has no namespace '{store.namespace}' "
            f"(namespaces there: {there}). Set $CONTAINERD_NAMESPACE to the one that holds "
            "the image (Kubernetes' is k8s.io, ctr's default is 'default', Docker's moby)."
        )
    more = f" and {len(listed) - LISTED} more" if len(listed) > LISTED else ""
    shown = ", ".join(listed[:LISTED]) + more
    raise NotInStore(
        f"'{ref.given}': containerd namespace '{store.namespace}' (at {store.root}) has no "
        f"image {looked}; it has: {shown or 'no images'}. Pull or import it there, or set "
        "$CONTAINERD_NAMESPACE to the namespace that holds it."
    )


def socket_at(path: str) -> bool:
    """Whether a unix socket is at ``path``; one in a folder this user may not look
    into (``/run/containerd`` is 0711 on some systems) counts as there."""
    try:
        return stat.S_ISSOCK(Path(path).stat().st_mode)
    except PermissionError:
        return True
    except (OSError, ValueError):
        return False


def _missing(store: Store) -> EnvironmentUnavailable:
    socket = Path(store.address)
    why = (
        f"a containerd socket is at {socket}, so its root is elsewhere: pass --containerd-root "
        "(or set $CONTAINERD_ROOT) to the 'root' of its config (containerd config dump)"
        if socket_at(store.address)
        else f"and no containerd socket is at {socket} (--containerd-address, "
        "$CONTAINERD_ADDRESS) either"
    )
    return EnvironmentUnavailable(
        f"containerd's metadata store {store.root / METADATA} is not there ({why}). In a "
        "Pod, mount the node's containerd root read-only (docs/kubernetes.md)."
    )


def _unreadable(path: Path, store: Store) -> EnvironmentUnavailable:
    return EnvironmentUnavailable(
        f"{path} is not readable by this user: containerd's stores under {store.root} belong "
        "to root. Run as root on the node (docs/check.md, containerd: permissions)."
    )


class _Content:
    """The namespace's view of the content store: a blob the namespace does not hold
    is not found, as containerd's metadata content store answers (core/metadata/
    content.go, ``Info`` and ``ReaderAt`` look in ``getBlobBucket``)."""

    def __init__(self, ref: ImageRef, store: Store, record: Record) -> None:
        self.ref, self.store, self.record = ref, store, record
        self.folder = store.root / CONTENT

    def path(self, digest: str, *, what: str) -> Path:
        algo, _, hexdigest = digest.partition(":")
        if not algo.isalnum() or not hexdigest.isalnum():
            raise InputError(f"'{self.ref.given}': {what} has a malformed digest '{digest}'.")
        path = self.folder / algo / hexdigest
        if digest not in self.record.blobs or not path.is_file():
            where = "not in the content store" if not path.is_file() else "not in this namespace"
            raise InputError(
                f"'{self.ref.given}': {what} {digest} is {where} (containerd at "
                f"{self.store.root}, namespace '{self.store.namespace}'). containerd keeps "
                "only what it fetched: pull the image again for this platform "
                "(ctr images pull --platform, or --all-platforms), or pass --platform "
                "for the platform this node pulled (without it, every platform the "
                "image offers is judged)."
            )
        return path

    def json(self, desc: Mapping[str, Any], *, what: str) -> dict[str, Any]:
        digest = str(desc.get("digest", ""))
        try:
            with self.path(digest, what=what).open("rb") as f:
                label = f"'{self.ref.given}' {what} {digest[:19]}"
                return read_json_blob(f, name=label, digest=digest)
        except PermissionError:
            raise _unreadable(self.folder, self.store) from None


def _open_binary(path: Path, store: Store) -> IO[bytes]:
    try:
        return path.open("rb")
    except PermissionError:
        raise _unreadable(path, store) from None


def scan_containerd(
    ref: ImageRef,
    *,
    platform: str = DEFAULT_PLATFORM,
    progress: Progress | None = None,
    keep: Path | None = None,
    store: Store | None = None,
    target: str = "",
    engine: bool = False,
) -> ScannedImage:
    """Name → image record → manifest (an index → ``platform``) → config and layers.
    ``target``: the record must point at this digest (what an engine answered);
    ``engine``: the manifest is picked as Docker Engine picks the one it runs
    (image/mobypick.py), not as containerd's ``images.Manifest`` does."""
    store = store or Store.from_env()
    record = _find(ref, store, store.root / METADATA, target=target)
    content = _Content(ref, store, record)
    name = f"containerd:{record.name}"
    top: dict[str, Any] = {"digest": record.digest, "mediaType": record.media_type}
    doc = check_manifest(content.json(top, what="the image's manifest"), name=name)
    fetch = memo(lambda d, what: content.json(d, what=what))
    offered = offered_platforms(top, doc, fetch=fetch, name=name) if is_index(doc) else ()
    index_digest = record.digest if is_index(doc) else None
    if engine:
        present = record.blobs.__contains__  # moby's walk skips what Info does not find
        picked, also = moby_choose(top, doc, platform, fetch=fetch, present=present, name=name)
    else:
        picked, also = choose(top, doc, platform, fetch=fetch, name=name)
    desc, doc, unplaced, single = picked.desc, picked.manifest, picked.unplaced, picked.single
    if doc.get("schemaVersion") != 2 or "layers" not in doc:
        raise InputError(
            f"'{ref.given}': unsupported manifest (schema {doc.get('schemaVersion')}, "
            f"media type {doc.get('mediaType')}); only OCI and Docker v2 images."
        )
    config_desc = doc.get("config") or {}
    config_doc = content.json(config_desc, what="the image config")
    if unplaced or single:
        require_config_platform(config_doc, platform, name=ref.given, entry=unplaced)
    config = ImageConfig.from_json(
        config_doc, image_id=config_desc.get("digest"), source=f"{name} image config"
    )
    pairs = manifest_layers(doc, config_doc, source=f"{name} image config")
    blobs = []
    for i, (layer, diff_id) in enumerate(pairs):
        digest = str(layer.get("digest", ""))
        path = content.path(digest, what=f"layer {i}")
        blobs.append(
            LayerBlob(
                name=f"{name} layer {i} ({digest[:19]})",
                open=partial(_open_binary, path, store),
                digest=digest,
                diff_id=diff_id,
                local=path,
            )
        )
    layers = scan_blobs(blobs, progress, keep=keep)
    image = finish(ref=ref.given, digest=str(desc.get("digest")), config=config, layers=layers)
    image = replace(image, offered=offered or image.offered, also=also)
    return replace(image, index_digest=index_digest) if index_digest else image
