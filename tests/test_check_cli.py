"""check through the CLI: output forms, the summary file, exit codes for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.fixtures.build import BIN
from tests.images import Image, fixture, write_docker_archive

HOPPER_IMAGE = Image(
    layers=[{"usr/lib/libhopper_a.so": fixture("libhopper_a.so")}],
    labels={"io.buildmatrix.family": "hopper"},
    env={"CUDA_VERSION": "12.4.1"},
)


@pytest.fixture
def archive(tmp_path: Path) -> str:
    return f"docker-archive:{write_docker_archive(tmp_path / 'img.tar', HOPPER_IMAGE)}"


def test_table_output_pass(cli: CliRunner, archive: str) -> None:
    result = cli("check", archive, "--driver", "580.65.06")
    assert result.code == 0, result.err
    assert "targets  from label (io.buildmatrix.family=hopper)" in result.out
    # CUDA_VERSION says 12.4, but the library's cubins were built by CUDA 13.0
    assert (
        "runtime  CUDA 13.0 (device code of usr/lib/libhopper_a.so (built by CUDA 13.0))"
        in result.out
    )
    lines = result.out.splitlines()
    target = lines[lines.index(next(x for x in lines if x.startswith("TARGET"))) + 1]
    assert target.split() == ["hopper", "sm_90", "native", "ok"]
    assert lines[-1] == "PASS"


def test_table_output_fail_names_file_and_reason(cli: CliRunner, archive: str) -> None:
    result = cli("check", archive, "--family", "ampere")
    assert result.code == 1
    assert "FAIL" in result.out
    # one line for the targets of one cause (-v: one per target, as in the JSON)
    assert (
        "ampere (sm_80, sm_86): no runnable code: usr/lib/libhopper_a.so: sm_90a is "
        "arch-specific SASS and runs only on 9.0, not 8.0/8.6"
    ) in result.out
    verbose = cli("check", archive, "--family", "ampere", "-v")
    assert (
        "ampere (sm_80): no runnable code: usr/lib/libhopper_a.so: sm_90a is arch-specific "
        "SASS and runs only on 9.0, not 8.0"
    ) in verbose.out


def test_summary_is_appended(cli: CliRunner, archive: str, tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    assert cli("check", archive, "--summary", str(summary)).code == 0
    assert cli("check", archive, "--family", "ampere", "--summary", str(summary)).code == 1
    text = summary.read_text()
    assert text.startswith("# earlier step\n")
    assert ": PASS" in text
    assert ": FAIL" in text
    assert "| hopper | sm_90 | native | not checked |" in text
    assert "| ampere | sm_86 | none | not checked |" in text


def test_driver_too_old(cli: CliRunner, archive: str) -> None:
    result = cli("check", archive, "--driver", "520.61.05", "--json")
    assert result.code == 1
    doc = result.json()
    assert doc["targets"][0]["driver_ok"] is False
    assert doc["driver"] == "520.61.05"


def test_require_sass(cli: CliRunner, tmp_path: Path) -> None:
    """sm_80 and sm_90 SASS plus compute_90 PTX: sm_100 runs it by JIT, which
    --require-sass refuses; Hopper runs its SASS."""
    image = Image(layers=[{"usr/lib/libsass_ptx.so": fixture("libsass_ptx.so")}])
    ref = f"docker-archive:{write_docker_archive(tmp_path / 'ptx.tar', image)}"
    jit = cli("check", ref, "--sm", "10.0", "--json")
    assert jit.code == 0, jit.err
    assert [t["verdict"] for t in jit.json()["targets"]] == ["jit"]
    refused = cli("check", ref, "--sm", "10.0", "--require-sass")
    assert refused.code == 1
    assert "--require-sass" in refused.out
    native = cli("check", ref, "--family", "hopper", "--require-sass")
    assert native.code == 0, native.out


def test_allow_empty(cli: CliRunner, tmp_path: Path) -> None:
    """An image without device code fails unless --allow-empty says it is intended."""
    image = Image(layers=[{"usr/bin/tool": b"#!/bin/sh\n", "etc/os-release": b"ID=x\n"}])
    ref = f"docker-archive:{write_docker_archive(tmp_path / 'cpu.tar', image)}"
    empty = cli("check", ref, "--family", "hopper")
    assert empty.code == 1
    assert "holds no CUDA device code at all" in empty.out
    allowed = cli("check", ref, "--family", "hopper", "--allow-empty", "--json")
    assert allowed.code == 0, allowed.out
    assert allowed.json()["verdict"] == "pass"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["check", "Bad:Ref"], 2, "not a valid image reference"),
        (["check", "oci:/no/such/layout"], 2, "is not an OCI image layout"),
        (["check", "docker-archive:/no/such.tar"], 2, "is not a file"),
        (["check", "ARCHIVE", "--sm", "sm_99"], 2, "no arch profile for 'sm_99'"),
        (["check", "ARCHIVE", "--family", "hoper"], 2, "Did you mean 'hopper'"),
        (["check", "ARCHIVE", "--driver", "R535"], 2, "--driver: 'R535' is not a driver version"),
        (["check", "ARCHIVE", "--snapshot", "SNAP"], 2, "not valid JSON"),
        (["check", "ARCHIVE", "--summary", "/no/such/dir/x.md"], 2, "cannot write"),
    ],
)
def test_bad_input_exits_2(
    cli: CliRunner, archive: str, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    snap = tmp_path / "snap.json"
    snap.write_text("{not json")
    args = [archive if a == "ARCHIVE" else str(snap) if a == "SNAP" else a for a in args]
    result = cli(*args)
    assert result.code == code, result.err
    assert message in result.err


def test_snapshot_schema_errors_name_the_key(cli: CliRunner, archive: str, tmp_path: Path) -> None:
    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps({"version": 1, "driver_version": "535", "gpus": []}))
    result = cli("check", archive, "--snapshot", str(snap))
    assert result.code == 2
    assert "key 'driver_version'" in result.err


def test_not_a_docker_archive(cli: CliRunner, tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\0" * 1024)
    result = cli("check", f"docker-archive:{junk}", "--family", "hopper")
    assert result.code == 2
    assert "manifest.json" in result.err


def test_a_translation_unit_without_code_fails_the_library(cli: CliRunner) -> None:
    """libtwo.so: kernels.cu built for sm_80 + sm_90, second.cu (kernel kb) for sm_80
    only, and the link step's stub container (sm_75, no kernel), which is left out."""
    lib = str(BIN / "libtwo.so")
    failed = cli("check", lib, "--sm", "9.0")
    assert failed.code == 1
    assert "container 2 (sm_80; kernels _Z2kbPfPKfi): sm_80 SASS runs only" in failed.out
    assert cli("check", lib, "--sm", "8.0").code == 0
    assert cli("check", lib, "--sm", "8.6", "--strict").code == 0  # the stub has no kernel
