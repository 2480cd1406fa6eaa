"""Image references in skopeo's transport syntax (docs/check.md, the reference table).

``docker-daemon:NAME[:TAG]``, ``docker://HOST/NAME[:TAG|@DIGEST]``,
``oci:PATH[:TAG]``, ``docker-archive:PATH``, ``dir:PATH``, a plain existing path
(files, or the OCI layout or docker save archive it holds: buildmatrix.image.pathkind),
``containerd:NAME[:TAG|@DIGEST]`` (containerd's stores on this machine),
or a bare ``NAME[:TAG]`` (the local engine if it has it, else the registry).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from buildmatrix.errors import InputError


class Transport(StrEnum):
    DAEMON = "docker-daemon"
    REGISTRY = "docker"
    OCI = "oci"
    ARCHIVE = "docker-archive"
    DIR = "dir"
    CONTAINERD = "containerd"
    BARE = "bare"


@dataclass(frozen=True, kw_only=True)
class ImageRef:
    """A parsed reference. ``name`` is NAME[:TAG] or repository; ``path`` for files."""

    transport: Transport
    given: str
    path: Path | None = None
    host: str = ""
    repository: str = ""
    tag: str = ""
    digest: str = ""
    # A plain path whose transport was read from what it holds (image.pathkind): an
    # OCI layout folder or a docker save archive, judged as the image, saying so.
    plain: bool = False

    @property
    def reference(self) -> str:
        """The tag or digest to ask a registry for."""
        return self.digest or self.tag or "latest"

    @property
    def name(self) -> str:
        """``host/repository:tag`` (or ``@digest``), as an engine names it."""
        base = f"{self.host}/{self.repository}" if self.host else self.repository
        return f"{base}@{self.digest}" if self.digest else f"{base}:{self.tag or 'latest'}"


# Docker's reference grammar (distribution/reference), simplified where it
# does not change the outcome for valid names.
COMPONENT_PATTERN = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
HOST_PATTERN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9-]+)*|\[[0-9a-fA-F:]+\])"
    r"(?::[0-9]+)?"
)
TAG_PATTERN = r"[\w][\w.-]{0,127}"
_DIGEST = r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-fA-F0-9]{32,}"
_HOST_RE = re.compile(HOST_PATTERN)
_NAME_RE = re.compile(
    rf"(?P<repo>{COMPONENT_PATTERN}(?:/{COMPONENT_PATTERN})*)(?::(?P<tag>{TAG_PATTERN}))?(?:@(?P<digest>{_DIGEST}))?"
)
DEFAULT_HOST = "docker.io"
# skopeo transports buildmatrix does not read; named so that the error is clear.
_UNSUPPORTED = {"oci-archive", "containers-storage", "ostree", "sif", "tarball", "docker-archive-"}


def is_host(component: str) -> bool:
    # As Docker decides: a first component with '.' or ':' or 'localhost' is a host.
    return (
        "." in component
        or ":" in component
        or component == "localhost"
        or component.startswith("[")
    )


def parse_name(text: str, *, given: str, transport: Transport) -> ImageRef:
    """Parse ``[HOST/]NAME[:TAG][@DIGEST]``."""
    first, _, rest = text.partition("/")
    host = first if rest and is_host(first) else ""
    path = rest if host else text
    m = _NAME_RE.fullmatch(path)
    if not m or (host and not _HOST_RE.fullmatch(host)):
        raise InputError(
            f"'{given}' is not a valid image reference: expected [HOST/]NAME[:TAG][@DIGEST] "
            "with a lower-case name, e.g. registry.example.com/team/train:1.0-cu124-hopper."
        )
    repo = m["repo"]
    if not host and transport is Transport.REGISTRY:
        host = DEFAULT_HOST
    if host == DEFAULT_HOST and "/" not in repo:
        repo = f"library/{repo}"
    return ImageRef(
        transport=transport,
        given=given,
        host=host,
        repository=repo,
        tag=m["tag"] or "",
        digest=m["digest"] or "",
    )


def _path_and_tag(rest: str) -> tuple[Path, str]:
    """``oci:PATH[:TAG]``: the tag is what follows the last ':' if PATH exists without it."""
    path, sep, tag = rest.rpartition(":")
    if sep and path and "/" not in tag and _exists(path):
        return Path(path), tag
    return Path(rest), ""


def parse_ref(text: str) -> ImageRef:
    """Parse a REF of the CLI contract; an unknown form is an :class:`InputError`."""
    given = text
    if not text.strip():
        raise InputError("the image reference is empty; give NAME[:TAG] or TRANSPORT:...")
    if text.startswith("docker://"):
        return parse_name(text.removeprefix("docker://"), given=given, transport=Transport.REGISTRY)
    if text.startswith("docker-daemon:"):
        return parse_name(
            text.removeprefix("docker-daemon:"), given=given, transport=Transport.DAEMON
        )
    if text.startswith("containerd:"):
        return parse_name(
            text.removeprefix("containerd:"), given=given, transport=Transport.CONTAINERD
        )
    if text.startswith("oci:"):
        path, tag = _path_and_tag(text.removeprefix("oci:"))
        return ImageRef(transport=Transport.OCI, given=given, path=path, tag=tag)
    if text.startswith("docker-archive:"):
        return ImageRef(
            transport=Transport.ARCHIVE,
            given=given,
            path=Path(text.removeprefix("docker-archive:")),
        )
    if text.startswith("dir:"):
        return ImageRef(transport=Transport.DIR, given=given, path=Path(text.removeprefix("dir:")))
    if _exists(text):
        return _plain_path(text)
    prefix, sep, rest = text.partition(":")
    if prefix == "oci-archive" and sep:
        raise InputError(
            f"'{given}': the 'oci-archive:' transport is not supported. Extract the archive "
            f"(mkdir DIR && tar -xf {rest} -C DIR) and pass oci:DIR, or convert it: skopeo "
            f"copy {text} docker-archive:OUT.tar."
        )
    if sep and (prefix in _UNSUPPORTED or rest.startswith(("/", "./", "../"))):
        known = ", ".join(f"{t.value}:" for t in Transport if t is not Transport.BARE)
        what = (
            f"the '{prefix}:' transport is not supported"
            if prefix in _UNSUPPORTED
            else f"'{rest}' does not exist"
        )
        raise InputError(
            f"'{given}': {what}. Use one of {known} or a bare NAME[:TAG]; a path must exist."
        )
    return parse_name(text, given=given, transport=Transport.BARE)


def _plain_path(text: str) -> ImageRef:
    """An existing path without a transport: files to judge, or the image it holds
    (an OCI layout folder, a docker save archive; image.pathkind)."""
    from buildmatrix.image.pathkind import PathKind, path_kind

    kind = path_kind(Path(text), given=text)
    transport = {
        PathKind.FILES: Transport.DIR,
        PathKind.OCI_LAYOUT: Transport.OCI,
        PathKind.DOCKER_ARCHIVE: Transport.ARCHIVE,
    }[kind]
    return ImageRef(
        transport=transport, given=text, path=Path(text), plain=kind is not PathKind.FILES
    )


def _exists(text: str) -> bool:
    """Whether ``text`` names an existing path; a name the OS refuses (too long, a NUL)
    is not one, and then the text is read as an image name."""
    try:
        return Path(text).exists()
    except (OSError, ValueError):
        return False
