"""Shared test helpers: run the real CLI in-process and capture what it prints."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.cli import main
from buildmatrix.profile_files import load_profiles
from buildmatrix.profiles import ProfileSet

REPO = Path(__file__).resolve().parent.parent
SHIPPED_PROFILES = REPO / "arch-profiles"
# The user's cache folder as the session found it: each test gets a private
# $XDG_CACHE_HOME (below), but downloads that never change (a CUDA release's wheels)
# are kept here across tests and runs, where CI's cache step finds them.
USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
# The nvcc builds of tests/fixtures/build.py's cached_build, keyed by the commands,
# the tools' versions and the sources: compiled once per compiler, not once per run.
NVCC_CACHE = USER_CACHE / "buildmatrix" / "test-fixtures"


@pytest.fixture(scope="session")
def profiles() -> ProfileSet:
    """The shipped arch profiles (a frozen ProfileSet, loaded once)."""
    return load_profiles(SHIPPED_PROFILES)


# What a test needs, read from the fixtures it uses (directly or through others):
# the marker each fixture adds. Markers for needs that no fixture names (nvcc, the
# package index) are set in the test modules. pyproject.toml registers them all;
# docs/development.md says how to select by them.
FIXTURE_MARKERS = {
    "docker_host": ("docker", "integration"),
    "overlay2_host": ("docker", "integration"),
    "registry": ("registry", "integration"),
    "auth_registry": ("registry", "integration"),
    "token_registry": ("registry", "integration"),
    "containerd_socket": ("containerd", "integration"),
    "containerd": ("containerd", "integration"),
    "gotar": ("go", "integration"),
    "gonote": ("go", "integration"),
    "gojson": ("go", "integration"),
}
# A test that needs one of these needs an external component: it is `integration`
# too, however the need was marked (fixture or test), so that `-m "not integration"`
# is the engine-free set.
NEEDS = ("docker", "registry", "containerd", "go", "nvcc", "index")


@functools.cache
def _validator(schema_text: str) -> Any:
    import jsonschema

    schema = json.loads(schema_text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate(instance: Any, schema: dict[str, Any]) -> None:
    """``jsonschema.validate(instance, schema)``, which checks the schema against its
    metaschema on every call (20-30 ms for check's): here once per schema and run."""
    _validator(json.dumps(schema, sort_keys=True)).validate(instance)


def without_frames(stderr: str) -> str:
    """stderr less what differs between two runs of the same code by where it runs (a
    process, a fork of a prepared one, a thread): a traceback's frames, each a "File"
    line and the indented lines under it (the runner's own frames differ), and object
    addresses."""
    stderr = re.sub(r"^  File .*\n(    .*\n)*", "", stderr, flags=re.M)
    return re.sub(r" at 0x[0-9a-f]+", " at 0x…", stderr)


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


@pytest.fixture(autouse=True, scope="session")
def _child_bytecode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Where PYTHONDONTWRITEBYTECODE is set, every Python a test starts (the CLI in a
    fresh process, a child measuring memory) would compile buildmatrix and its
    dependencies from source again: ~0.3 s of CPU each. Those children write their
    bytecode under the run's base folder instead (PYTHONPYCACHEPREFIX, Python's
    "sys.pycache_prefix"), never into the source tree; one folder for all workers."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        yield
        return
    base = tmp_path_factory.getbasetemp()
    prefix = (base.parent if base.name.startswith("popen-gw") else base) / "pycache"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTHONDONTWRITEBYTECODE")
        mp.setenv("PYTHONPYCACHEPREFIX", str(prefix))
        yield


@pytest.fixture(autouse=True)
def _private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check's default layer cache goes under $XDG_CACHE_HOME: never the user's, and a
    fresh one per test (a test that damages a blob must not be served from the cache).
    pip's cache, which would follow it, stays the user's: what pip downloads for a test
    (NVIDIA's wheels, the build backend) is fetched once, not once per test."""
    if "PIP_CACHE_DIR" not in os.environ:
        monkeypatch.setenv("PIP_CACHE_DIR", str(USER_CACHE / "pip"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.delenv("BUILDMATRIX_PROFILES", raising=False)
    # the run's OCI labels come from these where set (docs/generate.md, "Labels of the run")
    for var in ("GITHUB_ACTIONS", "GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_SHA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    return CliRunner(capsys)


@pytest.fixture
def tls_api(tmp_path: Path) -> Iterator[Any]:
    """The kube-apiserver stand-in of tests/test_kube_apply.py (``standin_with_nodes``)
    served over HTTPS: (stand-in, URL, its certificate). Used there and by
    tests/test_kube_client_versions.py."""
    from tests.kube_standin import self_signed
    from tests.test_kube_apply import standin_with_nodes

    cert = self_signed(tmp_path / "pki")
    standin = standin_with_nodes()
    server, url = standin.serve(tls=cert)
    try:
        yield standin, url, cert
    finally:
        server.shutdown()
        server.server_close()


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
    return _go_program(tmp_path_factory, "gotar")


@pytest.fixture(scope="session")
def gojson(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/gojson/main.go (the oracle of tests/test_go_json.py: Go's encoding/json),
    built once per session."""
    return _go_program(tmp_path_factory, "gojson")


def _go_program(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip(f"Go is not installed (scripts/test installs golang-go): no {name} oracle")
    out = tmp_path_factory.mktemp(name)
    env = {
        **os.environ,
        "GOFLAGS": "-mod=mod",
        "GOCACHE": str(out / "cache"),
        "GOPATH": str(out / "path"),
        "CGO_ENABLED": "0",
    }
    src = Path(__file__).parent / name / "main.go"
    subprocess.run(
        [go, "build", "-o", str(out / name), str(src)],
        check=True,
        env=env,
        cwd=src.parent,
        capture_output=True,
    )
    return out / name


@pytest.hookimpl(tryfirst=True)  # before pytest's own cleanup (_pytest.tmpdir)
def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.old_basetemps import remove_in_background

    remove_in_background(session.config)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial-phase",
        action="store_true",
        help="run only the tests marked serial (scripts/test runs them after the parallel phase)",
    )


# Seconds each of the slowest modules took (its tests' setup, call and teardown summed,
# `scripts/test --durations=0` on the 2-core development machine, 2026-12-02, in one
# of its slow hours). A parallel run hands the modules to the workers in this order,
# slowest first, the rest after them as collected (scripts/test passes
# --no-loadscope-reorder: pytest-xdist would otherwise order them by their number of
# tests), so that no long module starts last while the other worker has run out of
# work (docs/development.md, "The order of the modules"). Approximate by nature: it
# only orders, it never selects.
SLOWEST = {
    "test_corpus.py": 150,  # measured alone, 2026-12-07, wheels cached
    "test_workflow.py": 89,
    "test_tool_image.py": 64,
    "test_torch_wheels.py": 33,
    "test_layer_semantics.py": 33,
    "test_release.py": 28,
    "test_engine_storage.py": 28,
    "test_build_end_to_end.py": 26,
    "test_adopt.py": 26,
    "test_nvidia_wheels.py": 24,
    "test_containerd.py": 18,
    "test_mobypick.py": 17,
    "test_platform.py": 17,
    "test_cuda_facts_compilers.py": 15,
    "test_go_tar.py": 13,
    "test_kube_apply.py": 13,
    "test_kube_client_versions.py": 13,
    "test_arm64_wheels.py": 12,
    "test_cache_binding.py": 11,
    "test_image_sources.py": 10,
    "test_fuzz.py": 8,
    "test_translation_units.py": 8,
    "test_drivers.py": 8,
    "test_engine_containerd.py": 7,
    "test_ptx_targets_ptxas_refuses.py": 7,
    "test_ldconfig.py": 7,
    "test_docker_archive.py": 7,
    # measured alone on 2026-12-07 with the machine shared by other runs: each of these
    # runs the DaemonSet's loop or smoke in fresh processes, round after round
    "test_source_outage.py": 68,
    "test_driver_change.py": 42,
    "test_busy_gpus.py": 20,
}


def _slowest_first(items: list[pytest.Item]) -> None:
    """Sort the items by their module's seconds in SLOWEST, largest first; a stable
    sort, so each module's items stay together and in their order."""
    items.sort(key=lambda item: -SLOWEST.get(item.path.name, 0))


def _external_engine() -> bool:
    """Whether the tests are given an engine (one for all pytest-xdist workers)."""
    return bool(os.environ.get("BUILDMATRIX_TEST_DOCKER_HOST") or os.environ.get("DOCKER_HOST"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the markers of FIXTURE_MARKERS, and `integration` to every test with one of
    NEEDS; then keep the serial tests out of a parallel
    run (pytest -n N) and only them under --serial-phase. A test is serial when marked
    so, and every Docker test is when the engine is given from outside: workers that
    start their own engines share nothing, but one given engine's tags would be shared."""
    shared_engine = _external_engine()
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            for marker in FIXTURE_MARKERS.get(name, ()):
                item.add_marker(marker)
        if any(item.get_closest_marker(m) for m in NEEDS):
            item.add_marker("integration")
        if shared_engine and item.get_closest_marker("docker"):
            item.add_marker("serial")
    parallel = hasattr(config, "workerinput") or config.getoption("numprocesses", None)
    if parallel:
        _slowest_first(items)
    serial_phase = config.getoption("serial_phase")
    if not parallel and not serial_phase:
        return
    keep = [i for i in items if bool(i.get_closest_marker("serial")) == serial_phase]
    dropped = [i for i in items if bool(i.get_closest_marker("serial")) != serial_phase]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    left = os.environ.get("BUILDMATRIX_TEST_SERIAL_LEFT")
    if left and dropped and not serial_phase:
        # scripts/test runs the serial phase only when a parallel run left it tests
        Path(left).write_text(f"{len(dropped)}\n")
