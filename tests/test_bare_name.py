"""A bare NAME[:TAG] is read from the local engine when it has it, else from the
registry the name points at. When neither serves it, the message says first why the
engine did not (no engine, or no such image there), then what the registry said."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.services import Registry


@pytest.fixture
def silent() -> Iterator[str]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"127.0.0.1:{server.getsockname()[1]}"


def test_no_engine_then_the_registry_says_why(
    cli: CliRunner, silent: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    name = f"{silent}/team/app:1"
    result = cli("check", name, "--timeout", "1")
    assert result.code == 3
    engine_part = f"'{name}': no local Docker engine answers"
    registry_part = f"registry {silent} accepted the connection but sent nothing for 1 s"
    assert engine_part in result.err
    assert registry_part in result.err
    assert result.err.index(engine_part) < result.err.index(registry_part)


@pytest.mark.integration
def test_the_engine_lacks_it_then_the_registry_says_404(
    cli: CliRunner, docker_host: str, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real engine without the image, a real registry without it either."""
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    name = f"{registry.host}/bmtest/never-pushed:1"
    result = cli("check", name)
    assert result.code == 2  # the registry's 404: the name is wrong
    said = " ".join(result.err.split())
    assert f"the local Docker engine has no image {name}, so the registry was asked" in said
    assert f"not found in {registry.host} (404)" in said
    assert said.index("local Docker engine") < said.index("(404)")
