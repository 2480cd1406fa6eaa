"""``docker-daemon:`` on an engine that keeps its images in containerd's image store.

Docker Engine with the containerd image store (docs.docker.com/engine/storage/
containerd; the default of fresh Docker Engine 29 installs) keeps no layer folders
of its own: its images are containerd images in the engine's namespace, their
blobs in containerd's content store. Such an engine is read the way ``containerd:``
reads (image/containerd.py), not through the ``docker save`` stream the engine
would first have to assemble.

What the engine says, from its documented API (``GET /info``, api/swagger.yaml
``SystemInfo``; moby daemon/info.go ``fillDriverInfo``, ``fillContainerdInfo``):

- ``DriverStatus`` holds ``["driver-type", "io.containerd.snapshotter.v1"]``
  exactly when the containerd image service answers (moby daemon/containerd/
  service.go ``LayerStoreStatus``: ``plugins.SnapshotPlugin``); ``Driver`` is then
  the snapshotter (``overlayfs``), never ``overlay2``;
- ``Containerd.Address`` and ``Containerd.Namespaces.Containers`` (API 1.46 and
  later; moby daemon/server/router/system/system_routes.go drops the field for
  older clients): the socket and the namespace the engine keeps images in, default
  ``moby`` (moby daemon/config ``DefaultContainersNamespace``);
- the image's ``Id`` (``GET /images/NAME/json``) is its containerd target digest
  (moby daemon/containerd/image_inspect.go ``ImageInspect``: ``ID:
  target.Digest.String()``), so the record read is the one the engine resolved.

containerd's root is not in the API. The system containerd's is ``/var/lib/
containerd``; a containerd the engine starts itself listens under the engine's
exec root and keeps its root in ``<DockerRootDir>/containerd/daemon`` (moby
daemon/command/daemon.go ``containerdRootDir``). ``--containerd-root`` /
``$CONTAINERD_ROOT`` wins where given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildmatrix.errors import EnvironmentUnavailable
from buildmatrix.image.containerd import NotInStore, scan_containerd, socket_at
from buildmatrix.image.containerd_store import DEFAULT_ADDRESS, DEFAULT_ROOT, Store
from buildmatrix.image.ref import ImageRef
from buildmatrix.image.scanned import Progress, ScannedImage

if TYPE_CHECKING:
    import docker

SNAPSHOTTER_TYPE = "io.containerd.snapshotter.v1"  # containerd plugins.SnapshotPlugin
ENGINE_NAMESPACE = "moby"  # moby daemon/config: DefaultContainersNamespace


@dataclass(frozen=True, kw_only=True)
class EngineStore:
    """Where an engine's containerd image store is, or why it is not read there
    (``containerd``: whether the engine uses that store at all)."""

    containerd: bool
    store: Store | None = None
    why_not: str = ""


def engine_store(
    info: Mapping[str, Any], *, given: Store, host: str, system_socket: bool
) -> EngineStore:
    """The containerd store behind an engine, from its ``GET /info`` answer.

    ``given``: the store the command's options name (its root wins where set);
    ``host``: ``$DOCKER_HOST`` (only a local engine's store is on this machine);
    ``system_socket``: whether containerd's default socket exists here (used only
    where the engine's answer is older than API 1.46 and does not name its socket:
    moby then uses the system containerd when that socket is there, daemon/command/
    daemon.go ``systemContainerdRunning``)."""
    status = info.get("DriverStatus")
    pairs = [p for p in status if isinstance(p, list) and len(p) == 2] if status else []
    if ["driver-type", SNAPSHOTTER_TYPE] not in pairs:
        return EngineStore(containerd=False)
    if not host.startswith("unix://"):
        return EngineStore(containerd=True, why_not="the engine is not on this host")
    containerd = info.get("Containerd")
    containerd = containerd if isinstance(containerd, dict) else {}
    namespaces = containerd.get("Namespaces")
    namespace = namespaces.get("Containers") if isinstance(namespaces, dict) else None
    address = containerd.get("Address")
    if not isinstance(address, str) or not address:
        address = DEFAULT_ADDRESS if system_socket else ""
    if given.root != Path(DEFAULT_ROOT):
        root = given.root
    elif address == DEFAULT_ADDRESS:
        root = Path(DEFAULT_ROOT)
    elif isinstance(info.get("DockerRootDir"), str) and info["DockerRootDir"]:
        root = Path(info["DockerRootDir"]) / "containerd" / "daemon"
    else:
        why = "the engine does not say where its containerd is"
        return EngineStore(containerd=True, why_not=why)
    return EngineStore(
        containerd=True,
        store=Store(
            root=root,
            namespace=namespace if isinstance(namespace, str) and namespace else ENGINE_NAMESPACE,
            address=address,
        ),
    )


def read_engine_store(
    client: docker.DockerClient,
    ref: ImageRef,
    attrs: Mapping[str, Any],
    *,
    given: Store | None,
    platform: str,
    progress: Progress | None,
    keep: Path | None,
) -> tuple[ScannedImage | None, str]:
    """The engine's image read from its containerd image store: (the image, ""); or
    (None, why) where the engine uses that store and it cannot be read here (not
    root, not this host: the caller reads the save stream instead and says why); or
    (None, "") where the engine does not use it. A damaged or missing blob is the
    error it is for ``containerd:`` (exit 2), never a silent switch of source."""
    import docker

    try:
        info = client.info()
    except docker.errors.DockerException:
        return None, ""  # the overlay2 path asks again and says why
    where = engine_store(
        info,
        given=given or Store.from_env(),
        host=os.environ.get("DOCKER_HOST") or "unix://",
        system_socket=socket_at(DEFAULT_ADDRESS),
    )
    if where.store is None:
        return None, where.why_not and f"containerd image store: {where.why_not}"
    store = where.store
    try:
        image = scan_containerd(
            ref,
            platform=platform,
            progress=progress,
            keep=keep,
            store=store,
            target=str(attrs.get("Id") or ""),
            engine=True,
        )
    except (EnvironmentUnavailable, NotInStore) as exc:
        said = str(exc).removeprefix(f"'{ref.given}': ")
        return None, f"containerd's image store could not be read here: {said}"
    what = f"containerd image store (namespace '{store.namespace}' at {store.root})"
    return replace(image, read_from=what), ""
