"""A bearer-token issuer for the registry's token auth (Docker registry token spec).

The registry itself is the real docker-registry; what cannot be had here is an
auth server, so this small one issues RS256 JWTs signed by a self-made key whose
certificate the registry trusts (``rootcertbundle``), with the certificate in the
``x5c`` header. Credentials are checked with HTTP basic auth.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

SERVICE = "buildmatrix-test"
ISSUER = "buildmatrix-test-issuer"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Issuer:
    def __init__(self, folder: Path, user: str, password: str) -> None:
        self.user, self.password = user, password
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.bundle = folder / "token-ca.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def token(self, scope: str, *, authenticated: bool) -> str:
        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        now = int(dt.datetime.now(dt.UTC).timestamp())
        access = []
        if authenticated and scope:
            kind, name, actions = scope.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        claims = {
            "iss": ISSUER,
            "sub": self.user if authenticated else "",
            "aud": SERVICE,
            "exp": now + 600,
            "nbf": now - 60,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64(signature)}"


@contextmanager
def token_server(folder: Path, user: str, password: str) -> Iterator[tuple[str, Issuer]]:
    """Serve ``/token`` on loopback; yields (realm URL, issuer)."""
    issuer = Issuer(folder, user, password)
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)
            given = self.headers.get("Authorization")
            if given is not None and given != expected:
                self.send_response(401)
                self.end_headers()
                return
            token = issuer.token(query.get("scope", [""])[0], authenticated=given is not None)
            body = json.dumps({"token": token, "access_token": token}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/token", issuer
    finally:
        server.shutdown()
        server.server_close()
