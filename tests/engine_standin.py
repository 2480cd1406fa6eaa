"""STAND-IN for a Docker Engine that keeps its images in containerd's image store.

The machine's Docker 20.10 cannot run that store (it arrived as an option in Docker
24 and is the default of fresh Docker Engine 29 installs), so the engine's side is
this small HTTP server on a unix socket answering the endpoints buildmatrix
asks, with the shapes of the Engine API (moby api/swagger.yaml, API 1.51):

- ``GET /_ping``, ``GET /version``: what the docker SDK asks before anything;
- ``GET /info``: ``SystemInfo`` as moby daemon/info.go fills it with the containerd
  image service: ``Driver`` the snapshotter (``overlayfs``), ``DriverStatus``
  ``[["driver-type", "io.containerd.snapshotter.v1"]]`` (daemon/containerd/
  service.go ``LayerStoreStatus``), ``Containerd.Address`` and
  ``Containerd.Namespaces`` (daemon/info.go ``fillContainerdInfo``, API >= 1.46);
- ``GET /images/NAME/json``: ``ImageInspect`` as daemon/containerd/image_inspect.go
  answers: ``Id`` the containerd image's target digest, ``Descriptor`` that target,
  the config's fields, ``GraphDriver.Name`` the snapshotter; NAME resolved as
  daemon/containerd/image.go ``resolveImage`` does for the forms the tests use
  (``name:tag`` normalised by Docker's rules, a full or short ID);
- ``GET /images/ID/get``: the ``docker save`` stream, here the archive the image was
  imported from (for the fallback path).

Everything else is 404. The images it knows are those the test registers, each
with the digest ``ctr images ls`` reports for it in the real containerd.
"""

from __future__ import annotations

import http.server
import json
import re
import socketserver
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

API_VERSION = "1.51"
SNAPSHOTTER = "overlayfs"


@dataclass
class StandinImage:
    names: list[str]  # as the engine lists RepoTags: docker.io/library/x:1 → x:1
    target: dict[str, Any]  # the containerd image's target descriptor
    config: dict[str, Any]  # the image config
    save: Path  # what GET /images/ID/get streams


@dataclass
class StandinEngine:
    socket: Path
    docker_root: Path
    containerd_address: str
    namespace: str = "moby"
    images: list[StandinImage] = field(default_factory=list)
    saves: int = 0  # save streams served
    _server: Any = None

    def info(self) -> dict[str, Any]:
        return {
            "ID": "7TRN:IPZB:QYBB:VPBQ:UWYQ:KHXN:FQYQ:AVDE:RHHB:VPOU:FIIV:CYKT",
            "Containers": 0,
            "Images": len(self.images),
            "Driver": SNAPSHOTTER,
            "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]],
            "DockerRootDir": str(self.docker_root),
            "OSType": "linux",
            "Architecture": "x86_64",
            "ServerVersion": "29.0.0",
            "Containerd": {
                "Address": self.containerd_address,
                "Namespaces": {"Containers": self.namespace, "Plugins": "plugins.moby"},
            },
        }

    def find(self, name: str) -> StandinImage | None:
        for image in self.images:
            digest = image.target["digest"]
            if name in (digest, digest[7:]) or (
                re.fullmatch(r"[0-9a-f]{4,64}", name) and digest[7:].startswith(name)
            ):
                return image
            if _normalised(name) in (_normalised(n) for n in image.names):
                return image
        return None

    def inspect(self, image: StandinImage) -> dict[str, Any]:
        config = image.config
        return {
            "Id": image.target["digest"],
            "Descriptor": image.target,
            "RepoTags": image.names,
            "RepoDigests": [],
            "Architecture": config.get("architecture"),
            "Os": config.get("os"),
            "Config": config.get("config") or {},
            "RootFS": {"Type": "layers", "Layers": config["rootfs"]["diff_ids"]},
            "GraphDriver": {"Name": SNAPSHOTTER, "Data": None},
        }

    def __enter__(self) -> StandinEngine:
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                path = re.sub(r"^/v[0-9.]+", "", urllib.parse.urlsplit(self.path).path)
                path = urllib.parse.unquote(path)
                if path == "/_ping":
                    return self.send(200, b"OK", "text/plain")
                if path == "/version":
                    return self.json({"ApiVersion": API_VERSION, "MinAPIVersion": "1.24"})
                if path == "/info":
                    return self.json(engine.info())
                m = re.fullmatch(r"/images/(.+)/(json|get)", path)
                image = engine.find(m[1]) if m else None
                if m is None:
                    return self.json({"message": "page not found"}, 404)
                if image is None:
                    return self.json({"message": f"No such image: {m[1]}"}, 404)
                if m[2] == "json":
                    return self.json(engine.inspect(image))
                engine.saves += 1
                return self.send(200, image.save.read_bytes(), "application/x-tar")

            def json(self, doc: Any, code: int = 200) -> None:
                self.send(code, json.dumps(doc).encode(), "application/json")

            def send(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Api-Version", API_VERSION)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.socket.unlink(missing_ok=True)
        self._server = Server(str(self.socket), Handler)
        self.socket.chmod(0o666)  # a non-root user's check reaches it too
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.socket.unlink(missing_ok=True)


def _normalised(name: str) -> str:
    """Docker's normalisation (distribution/reference ParseNormalizedNamed +
    TagNameOnly): docker.io/library/ for one-component names, :latest by default."""
    first, _, rest = name.partition("/")
    if not rest or not ("." in first or ":" in first or first == "localhost"):
        name = f"docker.io/{name if rest else 'library/' + name}"
    if "@" not in name and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name
