"""cuda-compat on the NVIDIA container toolkit's legacy path (libnvidia-container,
``cuda-compat-mode=ldconfig``, the default of legacy mode): its rules one by one,
and images judged both ways where its choice differs from the CDI hook's.

Sources: NVIDIA/libnvidia-container ``src/nvc_container.c`` ``find_library_paths``,
``src/cli/compat_mode.c`` ``filter_by_major_version`` and
``get_compat_library_path``; NVIDIA/nvidia-container-toolkit
``cmd/nvidia-container-runtime-hook/hook_config.go``
``nvidiaContainerCliCUDACompatModeFlags``. The compat libraries are STAND-INS built
by gcc with NVIDIA's note layout (tests/standins ``compat_library``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from buildmatrix import schema
from buildmatrix.forward_legacy import _excluded
from tests.conftest import REPO, CliRunner
from tests.images import DISTRO_LOADER, Entry, Image, Symlink, fixture, write_docker_archive
from tests.standins import compat_library

NODES = REPO / "tests" / "fixtures" / "nodes"
DIR = "usr/local/cuda-13.1/compat"


@pytest.mark.parametrize(
    ("library", "host", "dropped"),
    [
        ("libcuda.so.590.44.01", "535.104.05", False),  # compat major above the host's
        ("libcuda.so.590.44.01", "590.10.01", True),  # equal major: strncmp == 0
        ("libcuda.so.580.65.06", "590.44.01", True),
        ("libnvidia-nvvm.so.4", "535.104.05", True),  # "5" >= "4" over one digit
        ("libfoo.so.x", "535.104.05", True),  # no digits: strncmp over 0 bytes is 0
        ("blob", "535.104.05", False),  # no ".so.": never dropped
        ("libfoo.so.\udcff1", "535.104.05", True),  # a name of bytes not UTF-8: no digits
        ("libcuda.so.999.1", "1000.1", False),  # a string comparison: "100" < "999"
    ],
)
def test_filter_by_major_version(library: str, host: str, dropped: bool) -> None:
    """``filter_by_major_version`` (ldconfig mode): dropped when
    ``strncmp(nvrm_version, major, strspn(major, digits)) >= 0``."""
    assert _excluded(f"x/{library}", host) is dropped


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the stand-in compat libraries (.ci/run has it)")

    def make(version: str, note: dict[str, Any] | None) -> bytes:
        out = tmp_path_factory.mktemp("compat")
        return compat_library(out, version, note).read_bytes()

    return make


def _geforce_580(tmp_path: Path) -> str:
    node = json.loads((NODES / "rtx-consumer.json").read_text())
    node["driver_version"], node["cuda_driver_version"] = "580.82.07", "13.0"
    path = tmp_path / "rtx-580.json"
    path.write_text(json.dumps(node))
    return str(path)


def _check(cli: CliRunner, tmp_path: Path, entries: dict[str, Entry], *args: str) -> Any:
    layer: dict[str, Entry] = {
        "usr/lib/libsass_ptx.so": fixture("libsass_ptx.so"),
        "usr/local/cuda": Symlink("cuda-13.1"),
        **DISTRO_LOADER,
        **entries,
    }
    archive = write_docker_archive(
        tmp_path / "img.tar",
        # without the container toolkit's cuda>=13.0 check (buildmatrix.container_env)
        Image(layers=[layer], env={"CUDA_VERSION": "13.0.0", "NVIDIA_DISABLE_REQUIRE": "1"}),
    )
    r = cli("check", f"docker-archive:{archive}", "--json", *args)
    assert r.code in (0, 1), r.err
    return r.code, r.json()


def test_a_branch_the_note_leaves_out_still_gets_the_compat_driver_on_the_legacy_path(
    cli: CliRunner, tmp_path: Path, lib: Any
) -> None:
    """The note lists R535 only: the hook leaves R580 on its own driver (which runs the
    image), but libnvidia-container reads no note and puts the newer-major compat
    driver first, which a GeForce refuses. A node in legacy mode fails it."""
    note = {"format": 1, "CUDA Version": "13.1", "driver": [535], "device": [2]}
    entries: dict[str, Entry] = {f"{DIR}/libcuda.so.590.44.01": lib("590.44.01", note)}
    code, doc = _check(cli, tmp_path, entries, "--snapshot", _geforce_580(tmp_path))
    assert code == 1
    problems = " | ".join(doc["problems"])
    assert "cudaErrorCompatNotSupportedOnDevice" in problems
    assert doc["forward_compat"]["in_use"] is False
    assert doc["forward_compat"]["legacy"]["in_use"] is True
    assert "the legacy runtime (libnvidia-container" in doc["forward_compat"]["legacy"]["why"]
    schema.validate(doc, "check", source="check --json")  # the documented shape
    # a compat driver of the node's own major: both paths leave it out, and it passes
    entries = {f"{DIR}/libcuda.so.580.95.05": lib("580.95.05", note)}
    code, doc = _check(cli, tmp_path, entries, "--snapshot", _geforce_580(tmp_path))
    assert code == 0, doc["problems"]
    assert doc["forward_compat"]["legacy"] is None


def test_libraries_in_two_folders_stop_the_container(
    cli: CliRunner, tmp_path: Path, lib: Any
) -> None:
    """``get_compat_library_path`` fails when the libraries kept lie in different
    folders (a symlink into another one): the container does not start."""
    entries: dict[str, Entry] = {
        f"{DIR}/libcuda.so.590.44.01": lib("590.44.01", None),
        f"{DIR}/libnvidia-ptxjitcompiler.so.1": Symlink(
            "/opt/jit/libnvidia-ptxjitcompiler.so.590.44.01"
        ),
        # a readable library (an unreadable one in reach of the compat folder would
        # leave ldconfig's libcuda.so.1 unknown: tests/test_ldconfig.py)
        "opt/jit/libnvidia-ptxjitcompiler.so.590.44.01": fixture("libsass_ptx.so"),
    }
    code, doc = _check(cli, tmp_path, entries, "--sm", "9.0", "--driver", "535.104.05")
    assert code == 1
    assert "refuses to start the container" in " | ".join(doc["problems"])


def test_where_both_paths_agree_one_judgement(cli: CliRunner, tmp_path: Path, lib: Any) -> None:
    """NVIDIA's own layout (the 13.1 package on R535): both paths use the driver."""
    note = {"format": 1, "CUDA Version": "13.1", "driver": [535, 550, 570, 575, 580, 590]}
    entries: dict[str, Entry] = {
        f"{DIR}/libcuda.so.590.44.01": lib("590.44.01", note),
        f"{DIR}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
        f"{DIR}/libcuda.so": Symlink("libcuda.so.1"),
    }
    code, doc = _check(cli, tmp_path, entries, "--sm", "9.0", "--driver", "535.104.05")
    assert code == 0, doc["problems"]
    assert doc["forward_compat"]["in_use"] is True
    assert doc["forward_compat"]["legacy"] is None


def test_a_compat_file_name_of_bytes_not_utf8_is_judged_not_a_traceback(
    cli: CliRunner, tmp_path: Path
) -> None:
    """A tar member name that is not UTF-8 (``compat/libx.so.<0xff>``) reaches the
    legacy rule as surrogate escapes; strncmp over its zero digits drops it, so the
    image is judged on the node's driver (it passes on R580, fails on R535)."""
    app = (REPO / "tests/fixtures/bin/libsass_sm80.so").read_bytes()
    layer: dict[str, Entry] = {"usr/local/cuda/compat/libx.so.\udcff": app, "usr/lib/a.so": app}
    archive = write_docker_archive(tmp_path / "img.tar", Image(layers=[layer]))
    for driver, code in (("580.65.06", 0), ("535.104.05", 1)):
        r = cli("check", f"docker-archive:{archive}", "--sm", "8.0", "--driver", driver)
        assert r.code == code, r.out + r.err
