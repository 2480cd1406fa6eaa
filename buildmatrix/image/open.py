"""One entry point: a reference in, the scanned image out, whatever the transport."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from buildmatrix.errors import BuildmatrixError, EnvironmentUnavailable
from buildmatrix.image.platform import DEFAULT_PLATFORM
from buildmatrix.image.ref import ImageRef, Transport, parse_ref
from buildmatrix.image.scanned import Progress, ScannedImage

if TYPE_CHECKING:
    from buildmatrix.image.containerd_store import Store


def scan_image(
    text: str,
    *,
    platform: str = DEFAULT_PLATFORM,
    progress: Progress | None = None,
    keep: Path | None = None,
    containerd: Store | None = None,
) -> ScannedImage:
    """Open REF and reduce it to its config and final-view device code.

    With ``keep`` (a private folder the caller deletes), every file with device code
    can be read again afterwards from ``FileReport.stored`` (``smoke --load-test``).
    ``containerd`` says where ``containerd:`` REFs are read (default: from $CONTAINERD_*).
    """
    ref = parse_ref(text)
    image = _scan(ref, platform=platform, progress=progress, keep=keep, containerd=containerd)
    if ref.plain:  # a path that holds an image: say how it was read (the read line)
        what = "an OCI layout" if ref.transport is Transport.OCI else "a docker save archive"
        image = replace(image, read_from=f"{ref.transport.value}:{ref.path} ({what})")
    return image


def _scan(
    ref: ImageRef,
    *,
    platform: str,
    progress: Progress | None,
    keep: Path | None,
    containerd: Store | None,
) -> ScannedImage:
    match ref.transport:
        case Transport.DIR:
            from buildmatrix.image.local import scan_directory

            return scan_directory(ref, keep=keep is not None)
        case Transport.OCI:
            from buildmatrix.image.local import scan_oci_layout

            return scan_oci_layout(ref, platform=platform, progress=progress, keep=keep)
        case Transport.ARCHIVE:
            from buildmatrix.image.dockerarchive import scan_docker_archive

            return scan_docker_archive(ref, platform=platform, progress=progress, keep=keep)
        case Transport.REGISTRY:
            from buildmatrix.image.registry import scan_registry

            return scan_registry(ref, platform=platform, progress=progress, keep=keep)
        case Transport.CONTAINERD:
            from buildmatrix.image.containerd import scan_containerd

            return scan_containerd(
                ref, platform=platform, progress=progress, keep=keep, store=containerd
            )
        case Transport.DAEMON:
            return _from_engine(
                ref, platform=platform, progress=progress, keep=keep, containerd=containerd
            )
        case Transport.BARE:
            return _engine_else_registry(
                ref, platform=platform, progress=progress, keep=keep, containerd=containerd
            )
    raise AssertionError(ref.transport)  # pragma: no cover - every transport is handled


def _engine_else_registry(
    ref: ImageRef,
    *,
    platform: str,
    progress: Progress | None,
    keep: Path | None,
    containerd: Store | None,
) -> ScannedImage:
    """A bare NAME[:TAG]: the local engine's image if it has one, else the registry's.
    When the registry fails too, the message says first why the engine did not serve
    it (no engine, or no such image there), then what the registry said."""
    from buildmatrix.image.daemon import engine, find_image, scan_daemon_image
    from buildmatrix.image.ref import parse_name
    from buildmatrix.image.registry import scan_registry

    try:
        client = engine()
    except EnvironmentUnavailable:
        why = "no local Docker engine answers (DOCKER_HOST or the default socket)"
    else:
        image = find_image(client, ref)
        if image is not None:
            return scan_daemon_image(
                client,
                image,
                ref,
                progress=progress,
                keep=keep,
                platform=platform,
                containerd=containerd,
            )
        why = f"the local Docker engine has no image {ref.name}"
    remote = parse_name(ref.given, given=ref.given, transport=Transport.REGISTRY)
    try:
        return scan_registry(remote, platform=platform, progress=progress, keep=keep)
    except BuildmatrixError as exc:
        said = str(exc).removeprefix(f"'{ref.given}': ")
        raise type(exc)(
            f"'{ref.given}': {why}, so the registry was asked, and: {said} "
            f"(docker-daemon:NAME reads only the engine, docker://HOST/NAME only the registry.)"
        ) from None


def _from_engine(
    ref: ImageRef,
    *,
    platform: str,
    progress: Progress | None,
    keep: Path | None,
    containerd: Store | None,
) -> ScannedImage:
    from buildmatrix.errors import InputError
    from buildmatrix.image.daemon import engine, find_image, scan_daemon_image

    client = engine()
    image = find_image(client, ref)
    if image is None:
        raise InputError(
            f"'{ref.given}': the Docker engine has no image {ref.name}. "
            "Build or pull it first, or name another transport."
        )
    return scan_daemon_image(
        client, image, ref, progress=progress, keep=keep, platform=platform, containerd=containerd
    )


def scan_node_first(
    text: str,
    *,
    platform: str = DEFAULT_PLATFORM,
    keep: Path | None = None,
    containerd: Store,
) -> ScannedImage:
    """REF as the node would run it: a registry (or bare) name is read from the node's
    containerd when it holds that name (what the kubelet starts with an image already
    pulled), else from the registry. Any other containerd error is an error: the
    store was meant to be read (mounted) and is not as expected."""
    from buildmatrix.image.containerd import NotInStore

    ref = parse_ref(text)
    if ref.transport in (Transport.REGISTRY, Transport.BARE):
        name = text.removeprefix("docker://")
        try:
            return scan_image(
                f"{Transport.CONTAINERD.value}:{name}",
                platform=platform,
                keep=keep,
                containerd=containerd,
            )
        except NotInStore:
            pass
    return scan_image(text, platform=platform, keep=keep, containerd=containerd)
