"""A STAND-IN for the kube-apiserver's Node endpoints, for tests (no API server can be
installed here). Driven by the real ``kubernetes`` client through a kubeconfig file.

What it reproduces of the real server, for ``/api/v1/nodes/{name}`` only:

- bearer-token authentication: no or an unknown token is 401; a token whose role
  lacks the verb (``get``, ``patch``) is 403, with the Status body the server sends;
- GET returns the Node; an unknown node is 404;
- PATCH with ``application/strategic-merge-patch+json`` (maps merged key by key,
  ``null`` deletes a key, lists replaced whole: ``spec.taints`` has no merge key, so
  a patch replaces the list), ``application/merge-patch+json`` (RFC 7386) and
  ``application/json-patch+json`` (RFC 6902: add, remove, replace, test);
- ``metadata.resourceVersion`` goes up on every write; a patch that carries a
  ``metadata.resourceVersion`` other than the current one is 409 Conflict (the
  optimistic-concurrency precondition Kubernetes' own taint helpers rely on);
- ``between_get_and_patch``: a callback run once after the next GET, as a second
  controller writing the node in between;
- TLS (``serve(tls=...)``): served over HTTPS with a certificate for 127.0.0.1, as
  every real API server is; the kubeconfig names the CA as ``kubectl`` writes it
  (``certificate-authority-data``), or does not, and the client refuses the server;
- ``policies``: ValidatingAdmissionPolicies (as ``k8s manifests`` renders them) run
  on every PATCH, by the stand-in policy plugin of tests/admission_policy.py, with the
  identity a token stands for (``identities``: user name and the ``extra`` a bound
  service-account token carries, such as its node name); a denial is 403 with the
  API server's message (``ValidatingAdmissionPolicy 'P' with binding 'B' denied
  request: ...``) and the node is not written.

- ``nodeclaims``: Karpenter's cluster-scoped NodeClaims, for DELETE only
  (``/apis/karpenter.sh/v1/nodeclaims/{name}``): the ``delete`` verb, 404, a
  ``preconditions.uid`` other than the object's is 409 Conflict ("Precondition
  failed: UID in precondition: ..., UID in object meta: ..."), the policies run with
  the old object and operation DELETE; deleted, the object is answered (200).

It is not an API server: no watch, no other resources, no other admission plugins,
no validation beyond what the tests need.
"""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.admission_policy import UserInfo, denials, request

Json = Any
POLL = 0.01  # seconds: serve_forever's poll interval
PREFIX = "/api/v1/nodes/"
CLAIMS = "/apis/karpenter.sh/v1/nodeclaims/"


@dataclass
class ApiStandIn:
    nodes: dict[str, Json] = field(default_factory=dict)
    # token -> verbs it may use on nodes
    tokens: dict[str, set[str]] = field(default_factory=dict)
    between_get_and_patch: Callable[[ApiStandIn, str], None] | None = None
    identities: dict[str, UserInfo] = field(default_factory=dict)  # token -> user
    policies: list[Json] = field(default_factory=list)
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, type
    conflicts: int = 0
    nodeclaims: dict[str, Json] = field(default_factory=dict)
    _version: int = 100
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_node(
        self, name: str, *, labels: dict[str, str] | None = None, taints: Json = None
    ) -> None:
        self._version += 1
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": dict(labels or {}),
                "annotations": {},
                "resourceVersion": str(self._version),
            },
            "spec": {"taints": list(taints or [])},
            "status": {},
        }

    def write(self, name: str, change: Callable[[Json], None]) -> None:
        """A write by someone else (another controller): bumps the resourceVersion."""
        with self._lock:
            change(self.nodes[name])
            self._bump(self.nodes[name])

    def _bump(self, node: Json) -> None:
        self._version += 1
        node["metadata"]["resourceVersion"] = str(self._version)

    def admit(
        self,
        token: str | None,
        old: Json,
        new: Json,
        *,
        resource: str = "nodes",
        operation: str = "UPDATE",
    ) -> str | None:
        """The first denial of the admission policies, as the API server words it."""
        user = self.identities.get(token or "", UserInfo("system:serviceaccount:test:smoke", {}))
        for policy in self.policies:
            review = request(user, old, new, resource=resource, operation=operation)
            refused = denials(policy, review)
            if refused:
                name = policy["metadata"]["name"]
                return (
                    f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied "
                    f"request: {refused[0]}"
                )
        return None

    # ---------------------------------------------------------------- the server

    def serve(self, tls: Certificate | None = None) -> tuple[ThreadingHTTPServer, str]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Json) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(
                    code,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": message,
                        "reason": reason,
                        "code": code,
                    },
                )

            def _token(self) -> str | None:
                header = self.headers.get("Authorization", "")
                return header.removeprefix("Bearer ") if header.startswith("Bearer ") else None

            def _authorised(self, verb: str, name: str) -> bool:
                token = self._token()
                if token is None or token not in standin.tokens:
                    self._status(401, "Unauthorized", "Unauthorized")
                    return False
                if verb not in standin.tokens[token]:
                    self._status(
                        403,
                        "Forbidden",
                        f'nodes "{name}" is forbidden: User "system:serviceaccount:test:smoke" '
                        f'cannot {verb} resource "nodes" in API group "" at the cluster scope',
                    )
                    return False
                return True

            def _name(self) -> str | None:
                path = self.path.split("?", 1)[0]
                return path[len(PREFIX) :] if path.startswith(PREFIX) else None

            def do_GET(self) -> None:
                name = self._name()
                standin.requests.append(("GET", self.path, ""))
                if name is None:
                    self._status(
                        404, "NotFound", "the server could not find the requested resource"
                    )
                    return
                if not self._authorised("get", name):
                    return
                with standin._lock:
                    node = copy.deepcopy(standin.nodes.get(name))
                if node is None:
                    self._status(404, "NotFound", f'nodes "{name}" not found')
                    return
                # The other controller writes once this GET has been answered: run before
                # the answer is sent (the client has the copy above), so that no PATCH the
                # answer lets the client send can come first.
                hook, standin.between_get_and_patch = standin.between_get_and_patch, None
                if hook is not None:
                    hook(standin, name)
                self._send(200, node)

            def do_PATCH(self) -> None:
                name = self._name()
                kind = self.headers.get("Content-Type", "").split(";")[0].strip()
                standin.requests.append(("PATCH", self.path, kind))
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if name is None:
                    self._status(
                        404, "NotFound", "the server could not find the requested resource"
                    )
                    return
                if not self._authorised("patch", name):
                    return
                with standin._lock:
                    node = standin.nodes.get(name)
                    if node is None:
                        self._status(404, "NotFound", f'nodes "{name}" not found')
                        return
                    try:
                        patched = apply_patch(node, body, kind)
                    except PatchError as exc:
                        self._status(exc.code, exc.reason, str(exc))
                        return
                    want = (
                        (body.get("metadata") or {}).get("resourceVersion")
                        if isinstance(body, dict)
                        else None
                    )
                    if want is not None and want != node["metadata"]["resourceVersion"]:
                        standin.conflicts += 1
                        self._status(
                            409,
                            "Conflict",
                            f'Operation cannot be fulfilled on nodes "{name}": the object has '
                            "been modified; please apply your changes to the latest version "
                            "and try again",
                        )
                        return
                    patched["metadata"]["resourceVersion"] = node["metadata"]["resourceVersion"]
                    refused = standin.admit(self._token(), node, patched)
                    if refused is not None:
                        self._status(403, "Forbidden", f'nodes "{name}" is forbidden: {refused}')
                        return
                    standin._bump(patched)
                    standin.nodes[name] = patched
                    out = copy.deepcopy(patched)
                self._send(200, out)

            def do_DELETE(self) -> None:
                path = self.path.split("?", 1)[0]
                standin.requests.append(("DELETE", self.path, ""))
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length)) if length else {}
                if not path.startswith(CLAIMS):
                    self._status(405, "MethodNotAllowed", "the server does not allow this method")
                    return
                name = path[len(CLAIMS) :]
                if not self._authorised("delete", name):
                    return
                with standin._lock:
                    claim = standin.nodeclaims.get(name)
                    if claim is None:
                        self._status(404, "NotFound", f'nodeclaims.karpenter.sh "{name}" not found')
                        return
                    uid = ((body or {}).get("preconditions") or {}).get("uid")
                    if uid is not None and uid != claim["metadata"]["uid"]:
                        self._status(
                            409,
                            "Conflict",
                            f"Precondition failed: UID in precondition: {uid}, UID in object "
                            f"meta: {claim['metadata']['uid']}",
                        )
                        return
                    refused = standin.admit(
                        self._token(), claim, None, resource="nodeclaims", operation="DELETE"
                    )
                    if refused is not None:
                        self._status(
                            403,
                            "Forbidden",
                            f'nodeclaims.karpenter.sh "{name}" is forbidden: {refused}',
                        )
                        return
                    del standin.nodeclaims[name]
                self._send(200, claim)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls.cert, tls.key)
            server.socket = context.wrap_socket(server.socket, server_side=True)
            scheme = "https"
        # shutdown() waits for serve_forever's loop to wake, every poll_interval
        # (socketserver.BaseServer.serve_forever; 0.5 s by default): a short one so
        # that stopping the stand-in does not cost each test half a second.
        threading.Thread(target=server.serve_forever, args=(POLL,), daemon=True).start()
        return server, f"{scheme}://127.0.0.1:{server.server_address[1]}"

    def kubeconfig(self, path: Path, server: str, token: str, ca: Path | None = None) -> Path:
        cluster: dict[str, str] = {"server": server}
        if ca is not None:
            cluster["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": cluster}],
            "users": [{"name": "smoke", "user": {"token": token}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "smoke"}}],
            "current-context": "standin",
        }
        path.write_text(json.dumps(doc))
        return path


@dataclass(frozen=True)
class Certificate:
    cert: Path  # PEM, self-signed: also the CA a client must be given
    key: Path


def self_signed(folder: Path) -> Certificate:
    """A certificate for 127.0.0.1 (subjectAltName IP, as the API server's serving
    certificate names its addresses), valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver stand-in")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    out = Certificate(folder / "apiserver.crt", folder / "apiserver.key")
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return out


class PatchError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


def apply_patch(node: Json, body: Json, kind: str) -> Json:
    if kind == "application/strategic-merge-patch+json":
        return _merge(copy.deepcopy(node), body, strategic=True)
    if kind == "application/merge-patch+json":
        return _merge(copy.deepcopy(node), body, strategic=False)
    if kind == "application/json-patch+json":
        return _json_patch(copy.deepcopy(node), body)
    raise PatchError(
        415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {kind}"
    )


def _merge(target: Json, patch: Json, *, strategic: bool) -> Json:
    """RFC 7386 merge; for a Node, strategic merge differs only where a list has a
    merge key, and the lists patched here (spec.taints) have none: replaced whole."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if strategic and key.startswith("$"):
            raise PatchError(422, "Invalid", f"directive {key} is not supported by the stand-in")
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge(target.get(key), value, strategic=strategic)
    return target


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise PatchError(422, "Invalid", f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch(doc: Json, ops: Json) -> Json:
    if not isinstance(ops, list):
        raise PatchError(400, "BadRequest", "a JSON patch is a list of operations")
    for op in ops:
        parts = _pointer(op["path"])
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.get(part)
            if parent is None:
                raise PatchError(422, "Invalid", f"path {op['path']} does not exist")
        last = parts[-1]
        kind = op["op"]
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op["value"]:
                raise PatchError(422, "Invalid", f"test of {op['path']} failed")
        elif kind == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif kind == "replace":
            if isinstance(parent, list):
                parent[int(last)] = op["value"]
            elif last not in parent:
                raise PatchError(422, "Invalid", f"path {op['path']} does not exist")
            else:
                parent[last] = op["value"]
        elif kind == "remove":
            try:
                del parent[int(last) if isinstance(parent, list) else last]
            except (KeyError, IndexError):
                raise PatchError(422, "Invalid", f"path {op['path']} does not exist") from None
        else:
            raise PatchError(422, "Invalid", f"op {kind} is not supported by the stand-in")
    return doc
