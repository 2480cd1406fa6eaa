"""Shared test helpers: run the real CLI in-process and capture what it prints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.cli import main

REPO = Path(__file__).resolve().parent.parent
SHIPPED_PROFILES = REPO / "arch-profiles"


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class CliRunner:
    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys

    def __call__(self, *args: str) -> Result:
        self._capsys.readouterr()
        code = main(list(args))
        captured = self._capsys.readouterr()
        assert "Traceback" not in captured.err, captured.err
        return Result(code, captured.out, captured.err)


@pytest.fixture(autouse=True)
def _private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check's default layer cache goes under $XDG_CACHE_HOME: never the user's, and a
    fresh one per test (a test that damages a blob must not be served from the cache)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.delenv("BUILDMATRIX_PROFILES", raising=False)
    # the run's OCI labels come from these where set (docs/generate.md, "Labels of the run")
    for var in ("GITHUB_ACTIONS", "GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_SHA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    return CliRunner(capsys)


@pytest.fixture(scope="session")
def standin_libs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The STAND-IN libnvidia-ml.so.1 and libcuda.so.1, built once (tests/standins/)."""
    from tests.standins import build

    try:
        return build(tmp_path_factory.mktemp("standins"))
    except FileNotFoundError:
        pytest.skip("gcc is needed to build the stand-in libraries")


from tests.services import (  # noqa: E402, F401
    auth_registry,
    containerd_socket,
    docker_host,
    overlay2_host,
    registry,
    token_registry,
)


@pytest.fixture(scope="session")
def gotar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/gotar/main.go (the oracle of tests/test_go_tar.py) built once per session
    (standard library only: no network)."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go is not installed (scripts/test installs golang-go): no Go tar oracle")
    out = tmp_path_factory.mktemp("gotar")
    env = {
        **os.environ,
        "GOFLAGS": "-mod=mod",
        "GOCACHE": str(out / "cache"),
        "GOPATH": str(out / "path"),
        "CGO_ENABLED": "0",
    }
    src = Path(__file__).parent / "gotar" / "main.go"
    subprocess.run(
        [go, "build", "-o", str(out / "gotar"), str(src)],
        check=True,
        env=env,
        cwd=src.parent,
        capture_output=True,
    )
    return out / "gotar"
