"""The CLI as users run it: version, profiles table and JSON, exit codes, packaging."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from buildmatrix import __version__
from tests.conftest import REPO, CliRunner

PROFILE_KEYS = {
    "sm", "compute_capability", "family", "products", "min_cuda", "max_cuda", "min_driver",
    "features", "ptx", "arch_specific", "gencode", "torch_arch_list",
}  # fmt: skip


def test_version(cli: CliRunner) -> None:
    result = cli("--version")
    assert result.code == 0
    assert result.out.strip() == f"buildmatrix, version {__version__}"


def test_profiles_table(cli: CliRunner) -> None:
    result = cli("profiles")
    assert result.code == 0
    lines = result.out.splitlines()
    assert lines[0].split() == ["SM", "CC", "FAMILY", "FEATURES", "CUDA", "MIN", "DRIVER", "HOSTS",
                                "PRODUCTS"]  # fmt: skip
    hopper = next(line for line in lines if line.startswith("sm_90 "))
    assert hopper.split()[:6] == ["sm_90", "9.0", "hopper", "fp16,bf16,tf32,int8,fp8", "11.8+",
                                  "525.60.13"]  # fmt: skip
    assert "H100 80GB HBM3" in hopper


def test_profiles_json_contract(cli: CliRunner) -> None:
    result = cli("profiles", "--json")
    assert result.code == 0
    doc = result.json()
    assert doc["version"] == 1
    by_sm = {p["sm"]: p for p in doc["profiles"]}
    for p in doc["profiles"]:
        assert set(p) >= PROFILE_KEYS, p["sm"]
    assert by_sm["sm_90"]["compute_capability"] == "9.0"
    assert by_sm["sm_90"]["family"] == "hopper"
    assert by_sm["sm_90"]["min_cuda"] == "11.8"
    assert by_sm["sm_90"]["min_driver"] == "525.60.13"
    assert "fp8" in by_sm["sm_90"]["features"]
    assert "fp8" not in by_sm["sm_80"]["features"]
    assert by_sm["sm_90"]["torch_arch_list"] == ["9.0+PTX", "9.0a"]
    ccs = [tuple(map(int, p["compute_capability"].split("."))) for p in doc["profiles"]]
    assert ccs == sorted(ccs)


@pytest.mark.parametrize("sm", ["sm_90", "9.0", "90"])
def test_profiles_show(cli: CliRunner, sm: str) -> None:
    result = cli("profiles", "show", sm)
    assert result.code == 0
    assert "-gencode=arch=compute_90a,code=sm_90a" in result.out
    as_json = cli("profiles", "show", sm, "--json").json()
    assert as_json["version"] == 1
    assert as_json["profile"]["sm"] == "sm_90"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["profiles", "show", "sm_99"], "no arch profile for 'sm_99'"),
        (["profiles", "show", "hopper"], "'hopper' is not an SM"),
        (["profiles", "--bogus"], "No such option"),
        (["nope"], "No such command"),
    ],
)
def test_usage_errors_exit_2(cli: CliRunner, args: list[str], message: str) -> None:
    result = cli(*args)
    assert result.code == 2
    assert message in result.err


def test_python_dash_m() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "buildmatrix", "profiles", "show", "sm_80"],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ampere" in proc.stdout


def test_wheel_ships_profiles_and_schemas(tmp_path: Path) -> None:
    """Build the wheel, unpack it alone on sys.path and run from the packaged data."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("buildmatrix_gpu-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "buildmatrix/arch_profiles/sm_90.yaml" in names
    assert "buildmatrix/schemas/arch-profile.schema.json" in names
    assert "buildmatrix/data/cuda.yaml" in names
    assert "buildmatrix/data/validated.txt" in names
    assert "buildmatrix/data/loaders.yaml" in names
    assert "buildmatrix/schemas/loaders.schema.json" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if k != "BUILDMATRIX_PROFILES"}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run(
        [sys.executable, "-c", "from buildmatrix.cli import main; raise SystemExit(main())",
         "profiles"],
        capture_output=True, text=True, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"from {site / 'buildmatrix' / 'arch_profiles'}" in proc.stdout
    # the wheel's copies are the files tests/test_schema.py validated and recorded:
    # read without jsonschema (buildmatrix/schema.py, recorded_digests)
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from buildmatrix.cli import main; main(['profiles']); "
         "print('jsonschema' in sys.modules)"],
        capture_output=True, text=True, check=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout.splitlines()[-1] == "False"


# What a fresh process must not import for a command that does not use it
# (docs/development.md, "Start-up time"): each of these costs every run of the command
# tens of milliseconds, and every test that starts one.
_NOT_FOR_EVERY_COMMAND = ("buildmatrix.binary", "buildmatrix.check", "buildmatrix.check_refs")
_NOT_IMPORTED = {
    # the version is read from the installed distribution's metadata, here only
    "--version": ("yaml", "jsonschema", "buildmatrix.profile_files", "buildmatrix.image"),
    "--help": ("importlib.metadata", "yaml", "jsonschema", "buildmatrix.profile_files"),
    # the shipped profiles and CUDA facts: recorded as validated (tests/test_schema.py)
    "profiles --json": ("importlib.metadata", "jsonschema", "buildmatrix.image"),
    # without --image the DaemonSet's image is this version's: the metadata is read
    # (0.83 s against 0.72 s with --image, best of 5 on the 2-core machine)
    "k8s manifests --image registry.example.com/bm:1": (
        "importlib.metadata",
        "jsonschema",
        "buildmatrix.affinity",
    ),
    "k8s manifests": ("jsonschema", "buildmatrix.affinity"),
    # a snapshot is the user's file: validated (jsonschema); no image to read
    "smoke --snapshot tests/fixtures/nodes/a40.json --json": (
        "importlib.metadata",
        "buildmatrix.image.containerd",
        "buildmatrix.image.open",
        "buildmatrix.node.image_fit",
        "kubernetes",
        "docker",
    ),
}


@pytest.mark.parametrize("command", list(_NOT_IMPORTED))
def test_a_fresh_process_imports_only_what_its_command_uses(command: str) -> None:
    code = (
        "import contextlib, io, sys\n"
        "from buildmatrix.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    code = main({command.split()!r})\n"
        "print(code, *sorted(sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "BUILDMATRIX_PROFILES"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=REPO
    )
    code_, *modules = proc.stdout.split()
    assert code_ == "0", proc.stderr
    assert "buildmatrix.cli" in modules  # the list is the child's own
    unwanted = _NOT_FOR_EVERY_COMMAND + _NOT_IMPORTED[command]
    assert [m for m in modules if any(m == u or m.startswith(f"{u}.") for u in unwanted)] == []
