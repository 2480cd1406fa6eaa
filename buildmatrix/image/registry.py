"""OCI distribution registries, through oras-py.

oras-py (``oras.provider.Registry``) brings the parts worth not writing again:
the token flow (anonymous and with credentials) and basic auth. Credentials come
from the Docker config file as the Docker CLI reads it (image/dockerconfig.py).
buildmatrix adds what a checker needs on top: manifest lists and OCI indexes
resolved to one platform, Docker v2 and OCI manifests, layers streamed (never
stored) and every manifest and blob verified against its digest.
"""

from __future__ import annotations

import contextvars
import hashlib
import io
import ipaddress
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from buildmatrix.errors import EnvironmentUnavailable, InputError
from buildmatrix.image.blobs import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    MAX_JSON,
    check_manifest,
    is_index,
    manifest_layers,
    read_json_blob,
)
from buildmatrix.image.dockerconfig import Lookup, find_credentials
from buildmatrix.image.layer_scan import finish, scan_blobs
from buildmatrix.image.manifests import CONFIG, choose, memo
from buildmatrix.image.offered import offered_platforms
from buildmatrix.image.platform import (
    DEFAULT_PLATFORM,
    require_config_platform,
)
from buildmatrix.image.ref import ImageRef
from buildmatrix.image.scanned import ImageConfig, LayerBlob, Progress, ScannedImage

if TYPE_CHECKING:
    import oras.provider
    import requests

ACCEPT = ", ".join((*INDEX_TYPES, *MANIFEST_TYPES))
# How long a request waits for the registry to accept the connection (connect
# time-out), and then for each next bytes of its answer (read time-out): a CI step
# that reads a registry which never answers fails within this, and says which wait
# ran out (docs/check.md, "Time-outs"). --timeout SECONDS sets it.
DEFAULT_TIMEOUT = 30.0
# Docker Hub's names (docker.io, index.docker.io) are not where its registry API
# answers: the Docker engine sends /v2/ requests for them to registry-1.docker.io
# (moby registry/config.go, DefaultRegistryHost / IndexHostname).
DOCKER_HUB_NAMES = frozenset({"docker.io", "index.docker.io"})
DOCKER_HUB_API = "registry-1.docker.io"
_WAIT: contextvars.ContextVar[float] = contextvars.ContextVar(
    "buildmatrix_registry_timeout", default=DEFAULT_TIMEOUT
)


@contextmanager
def waiting(seconds: float) -> Iterator[None]:
    """Make ``seconds`` the connect and read time-out of the registry clients made in
    this context (``--timeout``), as ``image.cache.use`` does for the layer cache."""
    token = _WAIT.set(seconds)
    try:
        yield
    finally:
        _WAIT.reset(token)


def is_loopback(host: str) -> bool:
    """Registries on loopback may speak plain HTTP (as Docker allows for them)."""
    bracketed = host.startswith("[")  # [::1]:5000
    name = host[1:].partition("]")[0] if bracketed else host.rsplit(":", 1)[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _timed_session(session: requests.Session, timeout: float) -> None:
    """Give every request of ``session`` the connect and read time-outs.

    oras-py sends its requests (``Registry.do_request``, the token flow of
    ``oras.auth.token``) on its session without a ``timeout``, which requests takes as
    waiting for ever; an adapter is where a session's requests can get one.
    """
    import requests.adapters

    class TimedAdapter(requests.adapters.HTTPAdapter):
        # the same call, every argument passed on
        def send(  # type: ignore[override]
            self, request: requests.PreparedRequest, **kwargs: Any
        ) -> requests.Response:
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = (timeout, timeout)
            return super().send(request, **kwargs)

    for prefix in ("http://", "https://"):
        session.mount(prefix, TimedAdapter())


def api_host(host: str) -> str:
    """Where a registry named ``host`` answers the distribution API."""
    return DOCKER_HUB_API if host in DOCKER_HUB_NAMES else host


class NotFound(InputError):
    """The registry answered 404: it has no such manifest or blob (exit 2 as any bad
    reference; ``generate --check-pins`` reads it as a tag that is gone)."""


class RegistryClient:
    def __init__(self, ref: ImageRef, *, timeout: float | None = None) -> None:
        import oras.provider

        self.ref = ref
        self.api_host = api_host(ref.host)
        self.timeout = _WAIT.get() if timeout is None else timeout
        self.credentials = Lookup(credentials=None, source="")
        insecure = is_loopback(ref.host)
        self.registry: oras.provider.Registry = oras.provider.Registry(
            self.api_host, insecure=insecure, tls_verify=True, auth_backend=self._scheme(insecure)
        )
        _timed_session(self.registry.session, self.timeout)
        self.container = self.registry.get_container(f"{self.api_host}/{ref.repository}")
        # Credentials as the Docker CLI finds them (image/dockerconfig.py), not with
        # oras-py's own lookup: that one merges $DOCKER_CONFIG's file with
        # ~/.docker/config.json and reads only an entry's "auth", not the
        # "username"/"password" a dockerconfigjson Secret may hold instead.
        self.credentials = find_credentials(ref.host)
        found = self.credentials.credentials
        if found is not None:
            self.registry.auth.set_basic_auth(found.username, found.password)
        elif self.basic:
            raise self._refused("the registry asks for a user name and password")
        # oras-py wraps do_request in a retry loop that sleeps 2 + 3**n seconds on any
        # error, five times (~2 minutes for a refused connection). A check in CI must
        # fail fast and say why, so the undecorated method is called.
        self._request = oras.provider.Registry.do_request.__wrapped__

    def _scheme(self, insecure: bool) -> str:
        """oras-py's auth backend for this registry: 'basic' or 'token', from ``/v2/``.

        Its token backend takes any challenge for a token realm, so a registry that
        asks for Basic auth (htpasswd) needs the basic backend.
        """
        import requests

        url = f"{'http' if insecure else 'https'}://{self.api_host}/v2/"
        try:
            response = requests.get(url, timeout=(self.timeout, self.timeout))
        except requests.exceptions.RequestException as exc:
            raise self._unreachable(exc) from None
        challenge = response.headers.get("WWW-Authenticate", "")
        self.basic = challenge.lower().startswith("basic")
        return "basic" if self.basic else "token"

    def _refused(self, why: str) -> EnvironmentUnavailable:
        lookup = self.credentials
        used = (
            f"the credentials of {lookup.source} were sent"
            if lookup.credentials is not None
            else f"no credentials were sent: {lookup.note or lookup.source}"
        )
        return EnvironmentUnavailable(
            f"registry {self.ref.host} refused access to {self.ref.repository} ({why}; "
            f"{used}). Log in with 'docker login {self.ref.host}' (buildmatrix reads the "
            "Docker config file $DOCKER_CONFIG/config.json, else ~/.docker/config.json) or "
            "check the credentials there."
        )

    def _unreachable(self, exc: Exception) -> EnvironmentUnavailable:
        import requests
        import urllib3.exceptions

        waited = f"{self.timeout:g} s"
        if isinstance(exc, requests.exceptions.ConnectTimeout):
            return EnvironmentUnavailable(
                f"registry {self.ref.host} did not accept a connection within {waited} "
                "(connect time-out). Check the address and the network path to it, or wait "
                "longer with --timeout SECONDS."
            )
        if isinstance(exc, requests.exceptions.ReadTimeout | urllib3.exceptions.ReadTimeoutError):
            return EnvironmentUnavailable(
                f"registry {self.ref.host} accepted the connection but sent nothing for "
                f"{waited} (read time-out). Check that the registry is healthy, or wait "
                "longer with --timeout SECONDS."
            )
        return EnvironmentUnavailable(
            f"registry {self.ref.host} is unreachable ({type(exc).__name__}: {exc}). Check "
            "the address and that the registry is running; loopback registries are "
            "spoken to over plain HTTP, all others over HTTPS."
        )

    def _get(
        self, url: str, *, accept: str | None = None, stream: bool = False, what: str
    ) -> requests.Response:
        import oras.auth
        import requests

        headers = {"Accept": accept} if accept else {}
        try:
            response = self._request(self.registry, url, "GET", headers=headers, stream=stream)
        except requests.exceptions.RequestException as exc:
            raise self._unreachable(exc) from None
        except (ValueError, oras.auth.AuthenticationException) as exc:  # auth flow failed
            raise self._refused(str(exc)) from None
        if response.status_code in (401, 403):
            raise self._refused(f"{response.status_code} for {what}")
        if response.status_code == 404:
            raise NotFound(
                f"'{self.ref.given}': {what} not found in {self.ref.host} "
                f"(404). Check the name and tag."
            )
        if response.status_code != 200:
            raise EnvironmentUnavailable(
                f"registry {self.ref.host} answered {response.status_code} for {what}."
            )
        return cast("requests.Response", response)

    def _url(self, kind: str, reference: str) -> str:
        return (
            f"{self.registry.prefix}://{self.api_host}/v2/{self.ref.repository}/{kind}/{reference}"
        )

    def manifest(self, reference: str, *, digest: str | None) -> tuple[dict[str, Any], str]:
        """A manifest (or index) and its digest, verified when the digest is known."""
        what = f"manifest {reference}"
        response = self._get(
            self._url("manifests", reference), accept=ACCEPT, stream=True, what=what
        )
        # Fetched by tag, the registry's Docker-Content-Digest header is the digest
        # to verify against (as containerd does), so that a proxy or a corrupted
        # store cannot hand over other content under the registry's digest.
        served = response.headers.get("Docker-Content-Digest", "")
        import urllib3.exceptions

        try:  # read at most the cap, whatever Content-Length claims
            body = response.raw.read(MAX_JSON + 1, decode_content=True)
        except urllib3.exceptions.ReadTimeoutError as exc:
            raise self._unreachable(exc) from None
        finally:
            response.close()
        if len(body) > MAX_JSON:
            raise InputError(
                f"'{self.ref.given}': {what} is over {MAX_JSON >> 20} MiB; no image manifest "
                "is that large, so it is refused."
            )
        computed = "sha256:" + hashlib.sha256(body).hexdigest()
        expected = digest or (reference if reference.startswith("sha256:") else None)
        if expected is None and served.startswith("sha256:"):
            expected = served
        if expected is not None and computed != expected:
            raise InputError(
                f"'{self.ref.given}': {what} has digest {computed}, expected "
                f"{expected}; the registry returned other content."
            )
        doc = read_json_blob(io.BytesIO(body), name=f"{self.ref.host} {what}", digest=None)
        return doc, computed

    @contextmanager
    def blob(self, digest: str) -> Iterator[IO[bytes]]:
        import urllib3.exceptions

        response = self._get(self._url("blobs", digest), stream=True, what=f"blob {digest[:19]}")
        try:
            yield cast(IO[bytes], response.raw)
        except urllib3.exceptions.ReadTimeoutError as exc:  # the answer stopped mid-blob
            raise self._unreachable(exc) from None
        finally:
            response.close()

    def json_blob(self, digest: str) -> dict[str, Any]:
        with self.blob(digest) as f:
            return read_json_blob(f, name=f"{self.ref.host} blob {digest[:19]}", digest=digest)


def scan_registry(
    ref: ImageRef,
    *,
    platform: str = DEFAULT_PLATFORM,
    progress: Progress | None = None,
    keep: Path | None = None,
    timeout: float | None = None,
) -> ScannedImage:
    client = RegistryClient(ref, timeout=timeout)
    doc, digest = client.manifest(ref.reference, digest=ref.digest or None)
    where = f"{ref.host}/{ref.repository} manifest"
    if is_index(doc):
        check_manifest(doc, name=where)
    fetch = memo(partial(_fetch, client))
    top = {"digest": digest}
    offered = offered_platforms(top, doc, fetch=fetch, name=ref.given) if is_index(doc) else ()
    index_digest = digest if is_index(doc) else None
    picked, also = choose(top, doc, platform, fetch=fetch, name=ref.given)
    doc, digest = picked.manifest, str(picked.desc.get("digest") or digest)
    unplaced, single = picked.unplaced, picked.single
    if doc.get("schemaVersion") != 2 or "layers" not in doc:
        raise InputError(
            f"'{ref.given}': unsupported manifest (schema {doc.get('schemaVersion')}, "
            f"media type {doc.get('mediaType')}); only OCI and Docker v2 images."
        )
    check_manifest(doc, name=where)
    config_digest = str((doc.get("config") or {}).get("digest", ""))
    config_doc = client.json_blob(config_digest)
    if unplaced or single:
        require_config_platform(config_doc, platform, name=ref.given, entry=unplaced)
    config = ImageConfig.from_json(
        config_doc,
        image_id=config_digest,
        source=f"{ref.host}/{ref.repository} image config",
    )
    pairs = manifest_layers(doc, config_doc, source=f"{ref.host}/{ref.repository} image config")
    blobs = [
        LayerBlob(
            name=f"{ref.host}/{ref.repository} layer {i} ({layer['digest'][:19]})",
            open=partial(client.blob, str(layer["digest"])),
            digest=str(layer["digest"]),
            diff_id=diff_id,
        )
        for i, (layer, diff_id) in enumerate(pairs)
    ]
    layers = scan_blobs(blobs, progress, keep=keep)
    image = finish(ref=ref.given, digest=digest, config=config, layers=layers)
    image = replace(image, offered=offered or image.offered, also=also)
    return replace(image, index_digest=index_digest) if index_digest else image


def _fetch(client: RegistryClient, desc: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A config (a blob) or a manifest or index (from the manifests endpoint) by its
    descriptor, verified against its digest."""
    digest = str(desc.get("digest", ""))
    if what == CONFIG:
        return client.json_blob(digest)
    return client.manifest(digest, digest=digest)[0]
