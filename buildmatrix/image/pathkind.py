"""What a plain path given as an image reference holds: files to judge one by one, or a
whole image (a ``docker save`` archive, an OCI layout) that must be read as one.

A ``docker save`` tar read as a single file holds no device code, and the check would
fail it as a CPU-only build ("0 with device code"), never judging the image inside.
So a plain path is looked at first: an OCI layout folder is read as ``oci:PATH``, a
``docker save`` archive as ``docker-archive:PATH``, and any other archive is refused
with the reference to use. Only ``buildmatrix.image.ref`` asks.
"""

from __future__ import annotations

import posixpath
import tarfile
from enum import StrEnum
from pathlib import Path

from buildmatrix.errors import InputError

# The file an OCI image layout has at its root (OCI image-spec image-layout.md,
# "oci-layout file"), beside index.json.
OCI_LAYOUT_FILE = "oci-layout"
# What docker save writes at the root of its tar, which docker load reads (moby
# image/tarexport/load.go: manifestFileName); Docker 25 and later write an OCI layout
# beside it in the same tar.
SAVE_MANIFEST = "manifest.json"
# Compressed streams by their magic bytes, as docker load detects them (moby/go-archive
# compression/compression_detect.go); a zstd frame may open with a skippable frame.
_COMPRESSED = {b"\x1f\x8b\x08": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE = 0x184D2A50
_TAR_MAGIC_AT = 257  # POSIX ustar "magic" field (GNU tar: "ustar  \0")


class PathKind(StrEnum):
    FILES = "files"  # a folder or single file: judged file by file
    OCI_LAYOUT = "oci"
    DOCKER_ARCHIVE = "docker-archive"


def path_kind(path: Path, *, given: str) -> PathKind:
    """What ``path`` (an existing path given without a transport) holds; an archive
    that is not a ``docker save`` archive is an :class:`InputError` naming the way to
    read it."""
    if path.is_dir():
        return PathKind.OCI_LAYOUT if (path / OCI_LAYOUT_FILE).is_file() else PathKind.FILES
    if not path.is_file():
        return PathKind.FILES  # a FIFO or device: never opened here (the scan refuses it)
    try:
        with path.open("rb") as f:
            head = f.read(_TAR_MAGIC_AT + 8)
    except OSError:
        return PathKind.FILES  # the file scan says why it cannot be read
    compressed = _compression(head)
    if compressed is not None:
        raise InputError(
            f"'{given}' is a {compressed}-compressed file, not a binary with device code. "
            f"If it is a docker save archive, pass docker-archive:{given} (read compressed "
            "too, as docker load reads it); a compressed root filesystem must be "
            "extracted and the folder given."
        )
    if head[_TAR_MAGIC_AT : _TAR_MAGIC_AT + 5] != b"ustar":
        return PathKind.FILES
    names = _members(path)
    if names is None or SAVE_MANIFEST in names:
        return PathKind.DOCKER_ARCHIVE  # never judged as one file
    if OCI_LAYOUT_FILE in names and "index.json" in names:
        raise InputError(
            f"'{given}' is an OCI archive (a tar of an OCI layout, without the "
            f"{SAVE_MANIFEST} of docker save), which buildmatrix does not read as a file. "
            f"Extract it (mkdir DIR && tar -xf {given} -C DIR) and pass oci:DIR, or "
            f"convert it: skopeo copy oci-archive:{given} docker-archive:OUT.tar."
        )
    raise InputError(
        f"'{given}' is a tar archive without the {SAVE_MANIFEST} of docker save, so it is "
        "not an image buildmatrix reads, and a tar is never judged as one file. A docker "
        f"save archive is read as docker-archive:{given}; a root filesystem (docker "
        "export) must be extracted and the folder given (dir:FOLDER)."
    )


def _compression(head: bytes) -> str | None:
    kind = next((k for magic, k in _COMPRESSED.items() if head.startswith(magic)), None)
    if kind is None and len(head) >= 4:
        magic = int.from_bytes(head[:4], "little")
        if magic == _ZSTD_MAGIC or magic & 0xFFFFFFF0 == _ZSTD_SKIPPABLE:
            kind = "zstd"
    return kind


def _members(path: Path) -> set[str] | None:
    """The top-level names of the tar's members, cleaned as docker load cleans them
    (``X``, ``./X`` and ``/X`` are one: buildmatrix.image.savetar), from the headers
    only (tarfile seeks over a regular file's data); None where Python's tar reader
    cannot read them (the docker-archive reader then says why)."""
    names: set[str] = set()
    try:
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                name = posixpath.normpath(member.name).lstrip("/")
                if "/" not in name:
                    names.add(name)
    except (tarfile.TarError, OSError, EOFError, UnicodeError):
        return None
    return names
