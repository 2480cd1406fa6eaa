"""Craft image layers and images byte by byte: docker-archive tars and OCI layouts.

Real formats, written here so that tests control every entry (whiteouts, opaque
folders, links, names that escape the root) that ``docker build`` would not emit.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.fixtures.build import BIN

if TYPE_CHECKING:
    from buildmatrix.image.tree import LayerSummary


# The loader's files every Debian or Ubuntu image ships (the stock /etc/ld.so.conf and
# the cache built with the image). Without them the container toolkit releases 1.17.5
# to 1.18.0 never use a compat driver (buildmatrix.forward_conf.older_releases).
DISTRO_LOADER: dict[str, bytes] = {
    "etc/ld.so.conf": b"include /etc/ld.so.conf.d/*.conf\n",
    "etc/ld.so.cache": b"",
}


@dataclass(frozen=True)
class Symlink:
    target: str


@dataclass(frozen=True)
class Hardlink:
    target: str


@dataclass(frozen=True)
class Dir:
    pass


Entry = bytes | Symlink | Hardlink | Dir
# A layer: a mapping in archive order, or pairs where a name may repeat.
Layer = dict[str, Entry] | list[tuple[str, Entry]]


def fixture(name: str) -> bytes:
    return (BIN / name).read_bytes()


def scan_in_place(raw: bytes, *, name: str = "layer") -> LayerSummary:
    """``scan_layer_at`` over ``raw`` written into a file between other bytes, as a
    layer lies inside a ``docker save`` archive."""
    import tempfile

    from buildmatrix.image.inplace import scan_layer_at

    with tempfile.NamedTemporaryFile(prefix="bm-layer-") as f:
        f.write(b"\xa5" * 1536 + raw + b"\x5a" * 1536)
        f.flush()
        return scan_layer_at(Path(f.name), 1536, len(raw), name=name)


def layer_tar(entries: Layer) -> bytes:
    """A layer tar with the entries in the given order (whiteouts are plain names)."""
    buf = io.BytesIO()
    pairs = list(entries.items()) if isinstance(entries, dict) else entries
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, entry in pairs:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if isinstance(entry, bytes):
                info.size = len(entry)
                info.mode = 0o755
                tar.addfile(info, io.BytesIO(entry))
                continue
            if isinstance(entry, Symlink):
                info.type, info.linkname = tarfile.SYMTYPE, entry.target
            elif isinstance(entry, Hardlink):
                info.type, info.linkname = tarfile.LNKTYPE, entry.target
            else:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
    return buf.getvalue()


@dataclass
class Image:
    layers: list[Layer]
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    platform: dict[str, str] = field(
        default_factory=lambda: {"os": "linux", "architecture": "amd64"}
    )

    def config(self, diff_ids: list[str]) -> bytes:
        env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        env += [f"{k}={v}" for k, v in self.env.items()]
        doc = {
            **self.platform,
            "config": {"Labels": self.labels, "Env": env},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created_by": "buildmatrix test"} for _ in diff_ids],
        }
        return json.dumps(doc).encode()


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_docker_archive(path: Path, image: Image, *, tag: str = "bmtest/crafted:latest") -> Path:
    """A legacy ``docker save`` tar: manifest.json, <id>.json, <layer>/layer.tar."""
    tars = [layer_tar(layer) for layer in image.layers]
    layers = [(f"{_sha(t).split(':')[1]}/layer.tar", t) for t in tars]
    return write_archive_blobs(path, image.config([_sha(t) for t in tars]), layers, tag=tag)


def write_archive_blobs(
    path: Path, config: bytes, layers: list[tuple[str, bytes]], *, tag: str
) -> Path:
    """A ``docker save`` tar of a config and layer members (name, blob) as given."""
    config_name = _sha(config).split(":")[1] + ".json"
    names = [name for name, _ in layers]
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": names}]
    with tarfile.open(path, "w") as out:
        for name, data in [
            (config_name, config),
            *layers,
            ("manifest.json", json.dumps(manifest).encode()),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return path


def write_oci_layout(
    path: Path,
    image: Image,
    *,
    tag: str = "latest",
    compress: bool = True,
    pack: Callable[[bytes], bytes] | None = None,
) -> Path:
    """An OCI image layout with gzip (or plain) layers, tagged ``tag``; ``pack``:
    how each layer tar is compressed instead of gzip (the media type stays
    ``tar+gzip``)."""
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        digest = _sha(data)
        (blobs / digest.split(":")[1]).write_bytes(data)
        return digest

    tars = [layer_tar(layer) for layer in image.layers]
    layers = []
    for t in tars:
        data = (pack or (lambda b: gzip.compress(b, mtime=0)))(t) if compress else t
        kind = "tar+gzip" if compress else "tar"
        layers.append(
            {
                "mediaType": f"application/vnd.oci.image.layer.v1.{kind}",
                "digest": put(data),
                "size": len(data),
            }
        )
    config = image.config([_sha(t) for t in tars])
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": put(config),
            "size": len(config),
        },
        "layers": layers,
    }
    manifest_bytes = json.dumps(manifest).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": manifest["mediaType"],
                "digest": put(manifest_bytes),
                "size": len(manifest_bytes),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (path / "index.json").write_text(json.dumps(index))
    return path


def write_platform_layout(
    path: Path, entries: list[tuple[dict[str, str] | None, Image]], *, tag: str = "multi"
) -> Path:
    """An OCI layout tagged ``tag`` whose image is an index of the given images, in
    the given order, each entry with its ``platform`` (None: an entry without one)."""
    descs = []
    for i, (platform, image) in enumerate(entries):
        single = write_oci_layout(path.parent / f"{path.name}-entry{i}", image, tag="one")
        blobs = path / "blobs" / "sha256"
        blobs.mkdir(parents=True, exist_ok=True)
        for blob in (single / "blobs" / "sha256").iterdir():
            (blobs / blob.name).write_bytes(blob.read_bytes())
        desc = json.loads((single / "index.json").read_text())["manifests"][0]
        del desc["annotations"]
        if platform is not None:
            desc["platform"] = platform
        descs.append(desc)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": descs,
    }
    body = json.dumps(index).encode()
    digest = _sha(body)
    (path / "blobs" / "sha256" / digest.split(":")[1]).write_bytes(body)
    top = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": index["mediaType"],
                "digest": digest,
                "size": len(body),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (path / "index.json").write_text(json.dumps(top))
    return path
