from __future__ import annotations

from pathlib import Path

import pytest

from buildmatrix.errors import InputError
from buildmatrix.image.ref import Transport, parse_ref
from buildmatrix.image.registry import api_host, is_loopback


@pytest.mark.parametrize(
    ("text", "transport", "host", "repo", "reference"),
    [
        (
            "docker://127.0.0.1:5000/team/train:1.0",
            Transport.REGISTRY,
            "127.0.0.1:5000",
            "team/train",
            "1.0",
        ),
        ("docker://ubuntu", Transport.REGISTRY, "docker.io", "library/ubuntu", "latest"),
        (
            "docker://nvcr.io/nvidia/pytorch@sha256:" + "a" * 64,
            Transport.REGISTRY,
            "nvcr.io",
            "nvidia/pytorch",
            "sha256:" + "a" * 64,
        ),
        ("docker-daemon:train:1.0-hopper", Transport.DAEMON, "", "train", "1.0-hopper"),
        ("train:1.0", Transport.BARE, "", "train", "1.0"),
        ("localhost:5000/train", Transport.BARE, "localhost:5000", "train", "latest"),
        ("[::1]:5000/x/y:z", Transport.BARE, "[::1]:5000", "x/y", "z"),
    ],
)
def test_names(text: str, transport: Transport, host: str, repo: str, reference: str) -> None:
    ref = parse_ref(text)
    assert (ref.transport, ref.host, ref.repository, ref.reference) == (
        transport,
        host,
        repo,
        reference,
    )


def test_paths(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    layout.mkdir()
    assert parse_ref(f"oci:{layout}:v1").path == layout
    assert parse_ref(f"oci:{layout}:v1").tag == "v1"
    assert parse_ref(f"oci:{layout}").tag == ""
    assert parse_ref(f"docker-archive:{tmp_path}/a.tar").transport is Transport.ARCHIVE
    assert parse_ref(f"dir:{layout}").transport is Transport.DIR
    assert parse_ref(str(layout)).transport is Transport.DIR


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("Train:1.0", "not a valid image reference"),
        ("docker://UPPER/case", "not a valid image reference"),
        ("a:b:c", "not a valid image reference"),
        ("oci-archive:/x.tar", "'oci-archive:' transport is not supported"),
        ("foo:/no/such/path", "'/no/such/path' does not exist"),
        ("name@sha256:short", "not a valid image reference"),
    ],
)
def test_bad_refs(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_ref(text)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1:5000", True),
        ("localhost:5000", True),
        ("[::1]:5000", True),
        ("127.9.9.9", True),
        ("registry.example.com", False),
        ("10.0.0.1:5000", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("text", "api"),
    [
        ("docker://ubuntu", "registry-1.docker.io"),
        ("docker://nvidia/cuda:12.8.1-base-ubuntu24.04", "registry-1.docker.io"),
        ("docker://docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04", "registry-1.docker.io"),
        ("docker://index.docker.io/library/ubuntu", "registry-1.docker.io"),
        ("docker://registry-1.docker.io/library/ubuntu", "registry-1.docker.io"),
        ("docker://nvcr.io/nvidia/pytorch:25.01-py3", "nvcr.io"),
        ("docker://127.0.0.1:5000/team/train", "127.0.0.1:5000"),
    ],
)
def test_docker_hub_names_ask_its_api_host(text: str, api: str) -> None:
    """Docker Hub's image names are not its API host: the engine asks
    registry-1.docker.io for them (moby registry/config.go, DefaultRegistryHost)."""
    assert api_host(parse_ref(text).host) == api


@pytest.mark.parametrize(
    ("text", "transport"),
    [
        ("a" * 5000, Transport.BARE),
        ("oci:" + "b" * 5000 + ":tag", Transport.OCI),
        ("dir:" + "c" * 5000, Transport.DIR),
    ],
)
def test_names_too_long_for_the_os_are_not_a_crash(text: str, transport: Transport) -> None:
    """Found by the long fuzz run: Path.exists raised ENAMETOOLONG."""
    assert parse_ref(text).transport is transport
