"""Registry credentials from the Docker config file, found the way the Docker CLI does.

The file is ``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``: one file,
never both (docker/cli ``cli/config/config.go``, ``Dir`` and ``Load``). For a
registry host the credentials come from, in this order (docker/cli
``cli/config/configfile/file.go``, ``getConfiguredCredentialStore``):

1. ``credHelpers[host]``: the program ``docker-credential-<name>``;
2. ``credsStore``: the same, for every registry;
3. ``auths``: the entry whose key is the host, or whose key is a URL of that host
   (``https://host/v1/``; docker/cli ``credentials/file_store.go``,
   ``ConvertToHostname``). ``auth`` is base64 of ``user:password`` and wins over the
   entry's ``username``/``password`` (docker/cli ``ConfigFile.LoadFromReader`` and
   ``decodeAuth``; Kubernetes ``pkg/credentialprovider/config.go``,
   ``DockerConfigEntry.UnmarshalJSON``).

That last form is exactly a Kubernetes Secret of type ``kubernetes.io/dockerconfigjson``
(key ``.dockerconfigjson``), as ``kubectl create secret docker-registry`` writes it;
mounted as ``config.json`` in the folder ``$DOCKER_CONFIG`` names, it is read as is.
A helper speaks the docker-credential-helpers protocol: the server address on
stdin to ``get``, ``{"Username", "Secret"}`` on stdout.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from buildmatrix.errors import EnvironmentUnavailable, InputError

# Docker Hub's credentials are stored under the index server's URL (docker/cli
# ``registry.IndexServer``); images name it docker.io.
DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")
INDEX_SERVER = "https://index.docker.io/v1/"
HELPER_TIMEOUT = 30  # seconds; a helper that hangs must not stall a node's admission


@dataclass(frozen=True, kw_only=True)
class Credentials:
    username: str
    password: str


@dataclass(frozen=True, kw_only=True)
class Lookup:
    """What the config file says for one host: credentials, or why there are none."""

    credentials: Credentials | None
    source: str  # the file (and key or helper) they come from, for messages
    note: str = ""  # why none were found, where that is not just "no entry"


def config_file(environ: Mapping[str, str] | None = None) -> Path:
    """The one config file the Docker CLI reads."""
    env = os.environ if environ is None else environ
    folder = env.get("DOCKER_CONFIG")
    if folder:
        return Path(folder) / "config.json"
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".docker" / "config.json"


def hostname(key: str) -> str:
    """An ``auths`` key as the host it is for (docker/cli ``ConvertToHostname``)."""
    if "://" in key:
        parts = urlsplit(key)
        if parts.hostname:
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            return f"{host}:{parts.port}" if parts.port else host
    return key.split("/", 1)[0]


def _names(host: str) -> tuple[str, ...]:
    return (INDEX_SERVER, *DOCKER_HUB) if host in DOCKER_HUB else (host,)


def _decode_auth(value: str, *, where: str) -> Credentials:
    """``auth``: base64 (standard alphabet) of ``user:password``; the user not empty."""
    try:
        text = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        text = ""
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise InputError(
            f"{where}: not base64 of 'user:password'. Write it as "
            "`printf %s USER:PASSWORD | base64 -w0`, or give 'username' and 'password' "
            "instead, or recreate it with `docker login` / `kubectl create secret "
            "docker-registry`."
        )
    return Credentials(username=user, password=password.strip("\0"))


def _entry(entry: Any, *, where: str) -> Credentials | None:
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected an object with 'auth' or 'username'/'password'.")
    auth = entry.get("auth")
    if auth:
        if not isinstance(auth, str):
            raise InputError(f"{where}.auth: expected a base64 string.")
        return _decode_auth(auth, where=f"{where}.auth")
    user, password = entry.get("username"), entry.get("password")
    if isinstance(user, str) and user and isinstance(password, str):
        return Credentials(username=user, password=password)
    return None  # an empty entry: docker login with a credential store leaves these


def _object(doc: Mapping[str, Any], key: str, *, source: str) -> dict[str, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{source}: key '{key}': expected an object, got {type(value).__name__}.")
    return value


def lookup(doc: Any, host: str, *, source: str) -> tuple[Credentials | None, str | None, str]:
    """Pure: (credentials from ``auths``, credential helper to ask, where) for ``host``.

    A helper, when one applies, wins: Docker asks it and ignores ``auths``.
    """
    if not isinstance(doc, dict):
        raise InputError(f"{source}: expected a JSON object (a Docker config file).")
    helpers = _object(doc, "credHelpers", source=source)
    names = _names(host)
    for name in names:
        helper = helpers.get(name)
        if isinstance(helper, str) and helper:
            return None, helper, f"{source} (credHelpers.{name})"
    store = doc.get("credsStore")
    if isinstance(store, str) and store:
        return None, store, f"{source} (credsStore)"
    auths = _object(doc, "auths", source=source)
    exact = [key for key in names if key in auths]
    by_host = [key for key in auths if hostname(key) in names and key not in exact]
    for key in (*exact, *sorted(by_host)):
        found = _entry(auths[key], where=f"{source}: key 'auths.{key}'")
        if found is not None:
            return found, None, f"{source} (auths.{key})"
    return None, None, source


def ask_helper(helper: str, server: str) -> tuple[Credentials | None, str]:
    """``docker-credential-<helper> get`` for ``server``: (credentials, why none).

    A helper that is missing or fails is not an error by itself: an anonymous
    registry needs no credentials. The reason is kept for the message shown when
    the registry then refuses access.
    """
    program = f"docker-credential-{helper}"
    try:
        proc = subprocess.run(
            [program, "get"],
            input=server.encode(),
            capture_output=True,
            timeout=HELPER_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        return None, f"the credential helper {program} named there is not on PATH"
    except subprocess.TimeoutExpired:
        return None, f"{program} did not answer within {HELPER_TIMEOUT} s"
    if proc.returncode != 0:  # "credentials not found in native keychain"
        said = proc.stdout.decode(errors="replace").strip()[:200]
        return None, f"{program} has no credentials for {server} ({said or 'no answer'})"
    try:
        answer = json.loads(proc.stdout)
        user, secret = answer["Username"], answer["Secret"]
    except (ValueError, KeyError, TypeError):
        return None, f'{program} answered something other than {{"Username", "Secret"}}'
    if not isinstance(user, str) or not isinstance(secret, str) or not user:
        return None, f"{program} answered an empty user name"
    if user == "<token>":
        return None, f"{program} holds an identity token, which buildmatrix cannot use"
    return Credentials(username=user, password=secret), ""


def find_credentials(host: str, environ: Mapping[str, str] | None = None) -> Lookup:
    """The credentials the Docker config holds for ``host`` (I/O: the file, a helper)."""
    path = config_file(environ)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Lookup(credentials=None, source=str(path), note=f"{path} does not exist")
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvironmentUnavailable(
            f"{path}: cannot read the Docker config file ({exc}). Check its permissions "
            "(a Secret mounted into a Pod must be readable by the container's user)."
        ) from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InputError(
            f"{path}: not valid JSON ({exc}). A Docker config file is "
            '{"auths": {"HOST": {"auth": "BASE64(user:password)"}}}, as `docker login` and '
            "a Secret of type kubernetes.io/dockerconfigjson (key .dockerconfigjson) hold."
        ) from None
    found, helper, source = lookup(doc, host, source=str(path))
    if helper is not None:
        server = INDEX_SERVER if host in DOCKER_HUB else host
        credentials, note = ask_helper(helper, server)
        return Lookup(credentials=credentials, source=source, note=note)
    note = "" if found is not None else f"{path} holds no credentials for {host}"
    return Lookup(credentials=found, source=source, note=note)
