"""Registry credentials from the Docker config file (buildmatrix/image/dockerconfig.py).

The files are written by the real tools wherever one runs here: ``kubectl create
secret docker-registry`` (a Secret of type kubernetes.io/dockerconfigjson) and
``docker login`` against the real registry with htpasswd auth; the rules they are
read by are docker/cli's (``cli/config/configfile/file.go``,
``credentials/file_store.go``) and Kubernetes' (``pkg/credentialprovider/config.go``).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest

from buildmatrix.errors import InputError
from buildmatrix.image.dockerconfig import Credentials, find_credentials, hostname, lookup
from tests.conftest import CliRunner
from tests.pool_registry import FITS_HOPPER, push, registry_secret, secret_file
from tests.services import Registry

HOST = "registry.example.com:5000"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _creds(doc: object, host: str = HOST) -> Credentials | None:
    found, helper, _ = lookup(doc, host, source="config.json")
    assert helper is None
    return found


@pytest.mark.parametrize(
    ("scheme", "path"),
    list(itertools.product(["", "http://", "https://"], ["", "/", "/v1/", "/v2/"])),
)
@pytest.mark.parametrize("host", ["registry.example.com", HOST, "127.0.0.1:5000", "[::1]:5000"])
def test_an_auths_key_is_found_by_its_host(scheme: str, path: str, host: str) -> None:
    """Every form ``docker login`` and ``kubectl --docker-server`` leave a key in."""
    key = f"{scheme}{host}{path}"
    assert hostname(key) == host
    doc = {"auths": {key: {"auth": _b64("u:p")}}}
    assert _creds(doc, host) == Credentials(username="u", password="p")
    assert _creds(doc, "other.example.com") is None


def test_auth_wins_over_username_and_password() -> None:
    """docker/cli LoadFromReader and Kubernetes DockerConfigEntry.UnmarshalJSON both
    decode ``auth`` over the entry's own fields; without it those fields are used."""
    both = {"username": "old", "password": "x", "auth": _b64("ci:pa:ss")}
    assert _creds({"auths": {HOST: both}}) == Credentials(username="ci", password="pa:ss")
    plain = {"username": "ci", "password": "s3cret", "email": "ci@example.com"}
    assert _creds({"auths": {HOST: plain}}) == Credentials(username="ci", password="s3cret")
    assert _creds({"auths": {HOST: {}}}) is None  # left by `docker login` with a store
    # decodeAuth trims NUL padding from the password
    padded = {"auth": base64.b64encode(b"ci:pw\0\0").decode()}
    assert _creds({"auths": {HOST: padded}}) == Credentials(username="ci", password="pw")


def test_an_exact_key_wins_over_a_url_of_the_same_host() -> None:
    doc = {"auths": {f"https://{HOST}/v1/": {"auth": _b64("a:1")}, HOST: {"auth": _b64("b:2")}}}
    assert _creds(doc) == Credentials(username="b", password="2")


def test_docker_hub_is_stored_under_the_index_server() -> None:
    doc = {"auths": {"https://index.docker.io/v1/": {"auth": _b64("hub:pw")}}}
    assert _creds(doc, "docker.io") == Credentials(username="hub", password="pw")


def test_a_helper_wins_over_auths() -> None:
    auths = {HOST: {"auth": _b64("u:p")}}
    assert lookup({"auths": auths, "credHelpers": {HOST: "ecr-login"}}, HOST, source="c")[1] == (
        "ecr-login"
    )
    assert lookup({"auths": auths, "credsStore": "pass"}, HOST, source="c")[1] == "pass"
    other = {"auths": auths, "credHelpers": {"elsewhere.example.com": "gcr"}}
    assert lookup(other, HOST, source="c")[:2] == (Credentials(username="u", password="p"), None)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "expected a JSON object"),
        ({"auths": []}, "key 'auths': expected an object"),
        ({"auths": {HOST: "x"}}, f"key 'auths.{HOST}': expected an object"),
        ({"auths": {HOST: {"auth": "%%%"}}}, f"key 'auths.{HOST}'.auth: not base64"),
        ({"auths": {HOST: {"auth": _b64("no-colon")}}}, "not base64 of 'user:password'"),
        ({"auths": {HOST: {"auth": _b64(":pw")}}}, "not base64 of 'user:password'"),
    ],
)
def test_a_malformed_config_is_bad_input_naming_the_key(doc: object, message: str) -> None:
    with pytest.raises(InputError, match=r"config\.json") as err:
        lookup(doc, HOST, source="config.json")
    assert message in str(err.value)


def test_docker_config_replaces_the_home_file(tmp_path: Path) -> None:
    """$DOCKER_CONFIG/config.json is read instead of ~/.docker/config.json, never both
    (docker/cli cli/config/config.go)."""
    home = tmp_path / "home"
    (home / ".docker").mkdir(parents=True)
    (home / ".docker" / "config.json").write_text(
        json.dumps({"auths": {HOST: {"auth": _b64("home:1")}}})
    )
    assert find_credentials(HOST, {"HOME": str(home)}).credentials is not None
    folder = tmp_path / "cfg"
    folder.mkdir()
    env = {"HOME": str(home), "DOCKER_CONFIG": str(folder)}
    found = find_credentials(HOST, env)
    assert found.credentials is None
    assert "does not exist" in found.note
    (folder / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        find_credentials(HOST, env)


def test_a_credential_helper_is_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A STAND-IN helper speaking the docker-credential-helpers protocol (the server
    on stdin to ``get``; ``{"Username", "Secret"}`` out; exit 1 with "credentials
    not found in native keychain" when it has none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-bmtest"
    helper.write_text(
        "#!/bin/sh\n"
        '[ "$1" = get ] || exit 2\n'
        "read -r server\n"
        f'if [ "$server" = "{HOST}" ]; then\n'
        '  printf \'{"ServerURL":"%s","Username":"ci","Secret":"from-helper"}\' "$server"\n'
        "else\n  echo 'credentials not found in native keychain'; exit 1\nfi\n"
    )
    helper.chmod(0o755)
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps({"credsStore": "bmtest"}))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    env = {"DOCKER_CONFIG": str(cfg)}
    found = find_credentials(HOST, env)
    assert found.credentials == Credentials(username="ci", password="from-helper")
    none = find_credentials("other.example.com", env)
    assert none.credentials is None
    assert "credentials not found in native keychain" in none.note
    (cfg / "config.json").write_text(json.dumps({"credsStore": "absent"}))
    assert "docker-credential-absent" in find_credentials(HOST, env).note


def test_kubectls_dockerconfigjson_secret_is_read() -> None:
    """What ``kubectl create secret docker-registry`` writes (username, password and
    auth), for a server given with or without a scheme."""
    registry = Registry(HOST, "ci", "pa:ss")
    for server in (HOST, f"https://{HOST}", f"http://{HOST}/v2/"):
        secret = registry_secret(registry, server=server)
        assert secret["type"] == "kubernetes.io/dockerconfigjson"
        doc = json.loads(secret_file(secret))
        assert _creds(doc) == Credentials(username="ci", password="pa:ss")


@pytest.mark.integration
def test_the_secret_opens_the_auth_registry(
    cli: CliRunner, auth_registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read only from the ``username``/``password`` of a dockerconfigjson (no ``auth``):
    a form oras-py's own lookup does not read."""
    ref = push(auth_registry, FITS_HOPPER, "bmtest/cfg:v1", tmp_path)
    folder = tmp_path / "cfg"
    folder.mkdir()
    entry = {"username": auth_registry.user, "password": auth_registry.password}
    (folder / "config.json").write_text(json.dumps({"auths": {auth_registry.host: entry}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    r = cli("check", ref, "--sm", "sm_90")
    assert r.code == 0, r.err + r.out
    entry["password"] = "wrong"
    (folder / "config.json").write_text(json.dumps({"auths": {auth_registry.host: entry}}))
    r = cli("check", ref, "--sm", "sm_90")
    assert r.code == 3
    assert f"the credentials of {folder / 'config.json'} (auths.{auth_registry.host})" in r.err


@pytest.mark.integration
def test_docker_login_writes_what_is_read(
    cli: CliRunner,
    auth_registry: Registry,
    docker_host: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real ``docker login`` (through the engine) writes the config file."""
    ref = push(auth_registry, FITS_HOPPER, "bmtest/login:v1", tmp_path)
    folder = tmp_path / "docker-config"
    folder.mkdir()
    env = {**os.environ, "DOCKER_CONFIG": str(folder), "DOCKER_HOST": docker_host}
    proc = subprocess.run(
        ["docker", "login", auth_registry.host, "-u", auth_registry.user, "--password-stdin"],
        input=auth_registry.password,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"docker login does not work here: {proc.stderr.strip()[-200:]}")
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    r = cli("check", ref, "--sm", "sm_90")
    assert r.code == 0, r.err + r.out
