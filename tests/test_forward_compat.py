"""CUDA forward compatibility: images that ship cuda-compat's ``libcuda.so``.

The compat libraries here are STAND-INS built by gcc (tests/standins: an empty
shared library with NVIDIA's ``.note.cuda.fwd_compatibility`` note, byte for byte
the layout of the libraries NVIDIA ships). The rule for when a container uses one is
the NVIDIA container toolkit's ``enable-cuda-compat`` hook; the GPUs it works on are
the CUDA Compatibility guide's (buildmatrix/forward.py cites both).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.binary.source import BytesSource
from buildmatrix.cuda import parse_driver_version
from buildmatrix.forward import (
    CompatLibrary,
    CompatSetup,
    compat_use,
    read_compat_library,
    resolve,
)
from buildmatrix.forward_devices import device_refusal
from tests.conftest import REPO, CliRunner
from tests.images import DISTRO_LOADER, Dir, Image, Symlink, fixture, write_docker_archive
from tests.standins import NOTE_13_1, compat_library

NODES = REPO / "tests" / "fixtures" / "nodes"
COMPAT = "usr/local/cuda-13.1/compat"


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The stand-in compat driver 590.44.01 with NVIDIA's note, without a note, and
    with a note whose JSON is broken."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the stand-in compat libraries (.ci/run has it)")
    built = {}
    for name, note in (("note", NOTE_13_1), ("bare", None), ("bad", "{not json")):
        out = tmp_path_factory.mktemp(name)
        built[name] = compat_library(out, "590.44.01", note).read_bytes()
    return built


def _lib(data: bytes, version: str = "590.44.01") -> CompatLibrary:
    path = f"{COMPAT}/libcuda.so.{version}"
    return read_compat_library(BytesSource(data, name=path), path=path)


def test_the_note_is_read_as_nvidia_writes_it(libs: dict[str, bytes]) -> None:
    lib = _lib(libs["note"])
    assert lib.note is True
    assert lib.cuda == "13.1"
    assert lib.branches == (535, 550, 570, 575, 580, 590)
    assert lib.devices == (1, 2, 7, 8, 9, 10, 11, 12, 13, 14)
    assert lib.problem is None
    bare = _lib(libs["bare"])
    assert (bare.note, bare.branches, bare.devices, bare.problem) == (False, (), None, None)
    bad = _lib(libs["bad"])
    assert bad.note is False
    assert bad.problem is not None
    assert "JSON does not decode" in bad.problem


# The container toolkit's decision (cmd/nvidia-cdi-hook/cudacompat): with the note,
# the host branch must be listed and the compat driver newer; without it, the host
# major must be lower. Drivers at and around every listed branch, and outside them.
RULE_WITH_NOTE = {
    "525.60.13": False,  # R525 is not listed
    "535.104.05": True,
    "550.54.15": True,
    "560.35.03": False,  # a feature branch the 13.1 package does not list
    "570.153.02": True,
    "580.65.06": True,
    "590.44.01": False,  # not older than the compat driver
    "590.48.01": False,
    "595.45.04": False,  # newer than the compat driver: the host's own is used
}
RULE_WITHOUT_NOTE = {
    "470.57.02": True,
    "525.60.13": True,
    "580.65.06": True,
    "589.99.99": True,
    "590.10.01": False,  # same major: not used, even though older
    "595.45.04": False,
}


@pytest.mark.parametrize(
    ("which", "table"), [("note", RULE_WITH_NOTE), ("bare", RULE_WITHOUT_NOTE)]
)
def test_when_the_container_toolkit_uses_the_compat_driver(
    libs: dict[str, bytes], which: str, table: dict[str, bool]
) -> None:
    setup = CompatSetup(library=_lib(libs[which]), why="test")
    for driver, expected in table.items():
        use = compat_use(setup, parse_driver_version(driver))
        assert use is not None
        assert use.in_use is expected, (driver, use.why)


def test_which_gpus_the_compat_driver_accepts(libs: dict[str, bytes]) -> None:
    lib = _lib(libs["note"])
    assert device_refusal(lib, products=("NVIDIA H100 80GB HBM3",)) is None
    assert device_refusal(lib, products=("NVIDIA RTX A6000", "Quadro RTX 8000")) is None
    for consumer in ("NVIDIA GeForce RTX 5090", "NVIDIA TITAN RTX", "NVS 510"):
        assert device_refusal(lib, products=(consumer,)) is not None, consumer
    # with NVML's brand, the note's device list decides, whatever the name says
    assert device_refusal(lib, products=("NVIDIA H100",), brand=2) is None
    assert device_refusal(lib, products=("NVIDIA H100",), brand=5) is not None
    bare = _lib(libs["bare"])
    assert device_refusal(bare, products=("x",), brand=5) is not None
    assert device_refusal(bare, products=("x",), brand=14) is None


def test_symlinks_resolve_inside_the_image_root() -> None:
    links = {"usr/local/cuda": "cuda-13.1", "opt/up": "../../..", "loop": "loop"}
    assert resolve("usr/local/cuda/compat", links) == "usr/local/cuda-13.1/compat"
    assert resolve("opt/up/usr/local/cuda/compat", links) == "usr/local/cuda-13.1/compat"
    assert resolve("usr/local/cuda/compat", {"usr/local/cuda": "/opt/cuda"}) == "opt/cuda/compat"
    assert resolve("loop/x", links) is None


# ------------------------------------------------------------------ check, end to end


def _image(compat: dict[str, Any], *more_layers: dict[str, Any]) -> Image:
    """An image with CUDA 13 device code (the fixtures' cubins record CUDA 13.0, so the
    runtime floor is R580) and the given compat folder entries."""
    return Image(
        layers=[
            {"usr/lib/libsass_ptx.so": fixture("libsass_ptx.so"), **DISTRO_LOADER, **compat},
            *more_layers,
        ],
        # without the container toolkit's cuda>=13.1 check (buildmatrix.container_env)
        env={"CUDA_VERSION": "13.1.0", "NVIDIA_DISABLE_REQUIRE": "1"},
    )


def _compat(lib: bytes, *, link: bool = True) -> dict[str, Any]:
    entries: dict[str, Any] = {
        f"{COMPAT}/libcuda.so.590.44.01": lib,
        f"{COMPAT}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
    }
    if link:
        entries["usr/local/cuda"] = Symlink("cuda-13.1")
    return entries


def _check(cli: CliRunner, tmp_path: Path, image: Image, *args: str) -> tuple[int, Any]:
    archive = write_docker_archive(tmp_path / "img.tar", image)
    r = cli("check", f"docker-archive:{archive}", "--json", *args)
    assert r.code in (0, 1), r.err
    return r.code, r.json()


def _failures(doc: Any) -> str:
    return " | ".join(doc["problems"])


def test_compat_driver_runs_a_cuda_13_image_on_r535(
    cli: CliRunner, tmp_path: Path, libs: dict[str, bytes]
) -> None:
    code, doc = _check(
        cli, tmp_path, _image(_compat(libs["note"])), "--sm", "9.0", "--driver", "535.104.05"
    )
    assert code == 0, _failures(doc)
    forward = doc["forward_compat"]
    assert forward["in_use"] is True
    assert forward["path"] == f"/{COMPAT}/libcuda.so.590.44.01"
    assert forward["branches"] == NOTE_13_1["driver"]
    assert any("CUDA forward compatibility" in r for r in doc["targets"][0]["reasons"])
    # without the compat folder the same code needs R580
    code, doc = _check(cli, tmp_path, _image({}), "--sm", "9.0", "--driver", "535.104.05")
    assert code == 1
    assert "needs driver >= 580.65.06; node has 535.104.05" in _failures(doc)
    assert doc["forward_compat"] is None


def test_a_branch_the_compat_driver_does_not_list_still_needs_the_runtime_floor(
    cli: CliRunner, tmp_path: Path, libs: dict[str, bytes]
) -> None:
    code, doc = _check(
        cli, tmp_path, _image(_compat(libs["note"])), "--sm", "9.0", "--driver", "525.60.13"
    )
    assert code == 1
    assert "needs driver >= 580.65.06; node has 525.60.13" in _failures(doc)
    assert doc["forward_compat"]["in_use"] is False
    assert "R525 is not one its note lists" in doc["forward_compat"]["why"]


def test_the_hardware_floor_is_the_kernel_drivers(
    cli: CliRunner, tmp_path: Path, libs: dict[str, bytes]
) -> None:
    """B200 needs a newer kernel driver than R535; a user-mode compat driver is no help."""
    code, doc = _check(
        cli, tmp_path, _image(_compat(libs["note"])), "--sm", "10.0", "--driver", "535.104.05"
    )
    assert code == 1
    assert doc["forward_compat"]["in_use"] is True
    assert "hardware floor" in _failures(doc)
    assert "node has 535.104.05" in _failures(doc)


def test_compat_on_a_geforce_board_fails_even_where_the_driver_is_new_enough(
    cli: CliRunner, tmp_path: Path, libs: dict[str, bytes]
) -> None:
    """R580 meets the CUDA 13 floor by itself, but the toolkit still puts the newer
    compat driver first (R580 is listed), and it refuses a GeForce: CUDA error 804.
    The same image without the compat folder runs there."""
    node = json.loads((NODES / "rtx-consumer.json").read_text())
    node["driver_version"], node["cuda_driver_version"] = "580.82.07", "13.0"
    snapshot = tmp_path / "rtx-580.json"
    snapshot.write_text(json.dumps(node))
    code, doc = _check(cli, tmp_path, _image(_compat(libs["note"])), "--snapshot", str(snapshot))
    assert code == 1
    assert "cudaErrorCompatNotSupportedOnDevice" in _failures(doc)
    assert "NVML brand 5 is not in the library's device list" in _failures(doc)
    code, doc = _check(cli, tmp_path, _image({}), "--snapshot", str(snapshot))
    assert code == 0, _failures(doc)


def test_product_names_decide_without_a_snapshot(
    cli: CliRunner, tmp_path: Path, libs: dict[str, bytes]
) -> None:
    """sm_120 stands for the RTX PRO 6000 boards and the GeForce RTX 5090 alike: with
    the compat driver in use the GeForce cannot run it, so the target fails."""
    code, doc = _check(
        cli, tmp_path, _image(_compat(libs["note"])), "--sm", "12.0", "--driver", "580.82.07"
    )
    assert code == 1
    assert "NVIDIA GeForce RTX 5090 (not data-center GPUs)" in _failures(doc)


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        # the toolkit looks in /usr/local/cuda/compat only
        ("no-link", None),
        # two candidates: the toolkit uses neither
        ("two", "2 compat driver libraries"),
    ],
)
def test_compat_folders_the_toolkit_would_not_use(
    cli: CliRunner, tmp_path: Path, libs: dict[str, bytes], entries: str, why: str | None
) -> None:
    compat = _compat(libs["note"], link=entries != "no-link")
    if entries == "two":
        compat[f"{COMPAT}/libcuda.so.580.65.06"] = libs["note"]
    code, doc = _check(cli, tmp_path, _image(compat), "--sm", "9.0", "--driver", "535.104.05")
    assert code == 1
    assert "needs driver >= 580.65.06" in _failures(doc)
    if why is None:
        assert doc["forward_compat"] is None
    else:
        assert why in doc["forward_compat"]["why"]


def test_a_compat_folder_deleted_by_a_later_layer_is_gone(
    cli: CliRunner, tmp_path: Path, libs: dict[str, bytes]
) -> None:
    image = _image(_compat(libs["note"]), {"usr/local/cuda-13.1/.wh.compat": b""})
    code, doc = _check(cli, tmp_path, image, "--sm", "9.0", "--driver", "535.104.05")
    assert code == 1
    assert doc["forward_compat"] is None
    # and one added by a later layer counts
    image = _image({"usr/local/cuda-13.1": Dir()}, _compat(libs["note"]))
    code, doc = _check(cli, tmp_path, image, "--sm", "9.0", "--driver", "535.104.05")
    assert code == 0, _failures(doc)


def test_a_root_folder_is_read_the_same_way(
    cli: CliRunner, tmp_path: Path, libs: dict[str, bytes]
) -> None:
    root = tmp_path / "rootfs"
    (root / COMPAT).mkdir(parents=True)
    (root / "usr" / "lib").mkdir(parents=True)
    (root / COMPAT / "libcuda.so.590.44.01").write_bytes(libs["note"])
    (root / "usr" / "local" / "cuda").symlink_to("cuda-13.1")
    (root / "usr" / "lib" / "libsass_ptx.so").write_bytes(fixture("libsass_ptx.so"))
    (root / "etc").mkdir()
    for name, data in DISTRO_LOADER.items():
        (root / name).write_bytes(data)
    r = cli("check", f"dir:{root}", "--sm", "9.0", "--driver", "535.104.05", "--json")
    assert r.code == 0, r.out
    assert r.json()["forward_compat"]["in_use"] is True
    r = cli("check", f"dir:{root}", "--sm", "9.0", "--driver", "535.104.05")
    assert "compat   in use:" in r.out


def test_smoke_admits_an_r535_node_for_a_compat_image(
    cli: CliRunner, tmp_path: Path, libs: dict[str, bytes]
) -> None:
    archive = write_docker_archive(tmp_path / "img.tar", _image(_compat(libs["note"])))
    r = cli(
        "smoke",
        "--snapshot",
        str(NODES / "h100-535.json"),
        "--image",
        f"docker-archive:{archive}",
        "--json",
    )
    assert r.code == 0, r.out
    doc = r.json()
    assert doc["labels"]["buildmatrix.io/driver-floor"] == "525.60.13"
    bare = write_docker_archive(tmp_path / "bare.tar", _image({}))
    r = cli(
        "smoke",
        "--snapshot",
        str(NODES / "h100-535.json"),
        "--image",
        f"docker-archive:{bare}",
        "--json",
    )
    assert r.code == 1
