"""Where does this image run? ``check REF`` on an image without an io.buildmatrix.family
label and without a target judges every profile and prints the table; it passes where
the image runs on at least one profile's GPU and fails (1) where it runs on none.
``--family all`` judges every profile too, as a requirement (each must pass).

Every nvcc-built fixture library, in an OCI layout, over every shipped profile, through
the CLI, against the compatibility rules stated over cuobjdump's lists
(tests/compat_oracle.py) and the profiles' own driver floors (``profiles --json``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.compat_oracle import (
    MINOR_COMPAT_FLOOR,
    cuobjdump_ptx_isas,
    cuobjdump_toolkits,
    driver_tuple,
    file_verdict,
)
from tests.conftest import REPO, CliRunner, validate
from tests.cuobjdump import cuobjdump_lists, find_cuobjdump
from tests.fixtures.build import BIN
from tests.images import Image, fixture, write_oci_layout

pytestmark = pytest.mark.integration  # cuobjdump is the oracle
CHECK_SCHEMA = json.loads((REPO / "buildmatrix/schemas/check.schema.json").read_text())

LIBRARIES = (
    "libsass_sm80.so",
    "libptx_only.so",
    "libsass_ptx.so",
    "libmulti.so",
    "libhopper_a.so",
    "libblackwell_f.so",
)
# The release of each PTX ISA (PTX ISA reference, "Release Notes": ISA 9.0 is CUDA
# 13.0), and the driver of that release, the oldest that JIT-compiles it (CUDA Toolkit
# release notes, "CUDA Toolkit and Corresponding Driver Versions").
ISA_DRIVER = {(9, 0): (580, 65, 6)}


@pytest.fixture(scope="module")
def listed() -> dict[str, Lists]:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (the oracle of the fixtures' contents)")
    found = {}
    for name in LIBRARIES:
        sass, ptx = cuobjdump_lists(tool, BIN / name)
        found[name] = Lists(
            sass=list(sass),
            ptx=list(ptx),
            built=cuobjdump_toolkits(tool, BIN / name),
            isas=cuobjdump_ptx_isas(tool, BIN / name),
        )
    return found


@pytest.fixture(scope="module")
def profiles() -> list[dict[str, Any]]:
    """The shipped profiles as ``profiles --json`` lists them."""
    proc = subprocess.run(
        [sys.executable, "-m", "buildmatrix", "profiles", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return list(json.loads(proc.stdout)["profiles"])


@dataclass(frozen=True, kw_only=True)
class Lists:
    """What cuobjdump says a fixture holds."""

    sass: list[str]
    ptx: list[str]
    built: set[tuple[int, int]]  # the releases that wrote its cubins
    isas: set[tuple[int, int]]  # its PTX's ISA versions


def _floors(lib: Lists, profile: dict[str, Any]) -> list[tuple[int, ...]]:
    """The profile's driver floor, and the runtime's (the releases that built it)."""
    return [driver_tuple(profile["min_driver"])] + [MINOR_COMPAT_FLOOR[r[0]] for r in lib.built]


def _expected(lib: Lists, profile: dict[str, Any], driver: str | None) -> tuple[str, bool]:
    """(verdict, runs) on the profile's GPU: cuobjdump's lists by the rules, and the
    driver against the floors."""
    ptx = lib.ptx
    if driver is not None and any(driver_tuple(driver) < ISA_DRIVER[i] for i in lib.isas):
        ptx = []  # the driver cannot JIT the PTX of a newer release
    major, minor = (int(x) for x in profile["compute_capability"].split("."))
    verdict = file_verdict(lib.sass, ptx, (major, minor))
    driver_ok = driver is None or driver_tuple(driver) >= max(_floors(lib, profile))
    return verdict, verdict != "none" and driver_ok


def _table(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("TARGET"))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


@pytest.mark.parametrize("driver", [None, "580.65.06", "550.54.15"])
@pytest.mark.parametrize("library", LIBRARIES)
def test_where_the_image_runs(
    cli: CliRunner,
    tmp_path: Path,
    listed: Any,
    profiles: list[dict[str, Any]],
    library: str,
    driver: str | None,
) -> None:
    layout = write_oci_layout(
        tmp_path / "img", Image(layers=[{f"usr/lib/{library}": fixture(library)}])
    )
    extra = ["--driver", driver] if driver else []
    want = {p["sm"]: _expected(listed[library], p, driver) for p in profiles}
    runs = [sm for sm, (_, ok) in want.items() if ok]

    r = cli("check", f"oci:{layout}", *extra, "--json")
    doc = r.json()
    assert r.code == (0 if runs else 1), (library, driver, doc["problems"])
    validate(doc, CHECK_SCHEMA)
    assert doc["declared"] == {"family": None, "source": "profiles"}
    assert [(t["sm"], t["verdict"]) for t in doc["targets"]] == [
        (sm, v) for sm, (v, _) in want.items()
    ]
    assert doc["runs_on"] == runs
    assert (doc["verdict"] == "pass") is bool(runs)

    text = cli("check", f"oci:{layout}", *extra)
    assert text.code == r.code
    rows = _table(text.out)
    assert [row[1:3] for row in rows] == [[sm, v] for sm, (v, _) in want.items()]
    assert [row[0] for row in rows] == [p["family"] for p in profiles]
    for row, p in zip(rows, profiles, strict=True):
        floors = _floors(listed[library], p)
        status = (
            "-" if driver is None else "ok" if driver_tuple(driver) >= max(floors) else "TOO OLD"
        )
        assert " ".join(row[3:]) == status, (row, floors)
    answer = next(x for x in text.out.splitlines() if x.startswith("runs on  "))
    if runs:
        assert answer.startswith(f"runs on  {', '.join(runs)} ({len(runs)} of {len(want)} ")
    else:
        assert answer == f"runs on  no profile's GPU (none of {len(want)} profiles)"
    assert ("\nPASS\n" in text.out) is bool(runs)
    assert ("\nFAIL\n" in text.out) is not bool(runs)

    every = cli("check", f"oci:{layout}", "--family", "all", *extra, "--json")
    assert every.code == (0 if len(runs) == len(want) else 1)
    assert [(t["sm"], t["verdict"]) for t in every.json()["targets"]] == [
        (sm, v) for sm, (v, _) in want.items()
    ]
    assert every.json()["declared"]["source"] == "flags"


def test_a_label_still_sets_the_targets(cli: CliRunner, tmp_path: Path) -> None:
    image = Image(
        layers=[{"usr/lib/libsass_sm80.so": fixture("libsass_sm80.so")}],
        labels={"io.buildmatrix.family": "hopper"},
    )
    r = cli("check", f"oci:{write_oci_layout(tmp_path / 'img', image)}", "--json")
    assert r.code == 1
    assert r.json()["declared"] == {"family": "hopper", "source": "label"}
    assert [t["sm"] for t in r.json()["targets"]] == ["sm_90"]


def test_a_snapshot_without_gpus_is_still_no_target(cli: CliRunner, tmp_path: Path) -> None:
    """No targets at all is exit 2, never a pass: a node snapshot that lists no GPU is
    not turned into 'every profile'."""
    snap = tmp_path / "node.json"
    snap.write_text(
        json.dumps(
            {"version": 1, "hostname": "cpu-node", "driver_version": "580.65.06",
             "cuda_driver_version": "13.0", "gpus": [], "errors": []}
        )
    )  # fmt: skip
    layout = write_oci_layout(
        tmp_path / "img", Image(layers=[{"usr/lib/libmulti.so": fixture("libmulti.so")}])
    )
    r = cli("check", f"oci:{layout}", "--snapshot", str(snap))
    assert r.code == 2, r.out
    assert "no target GPU to check against" in " ".join(r.err.split())


def test_family_all_with_help(cli: CliRunner) -> None:
    """--help says what a check without targets answers, and what --family all means."""
    flat = " ".join(cli("check", "--help").out.split())
    assert "without the label every profile is judged" in flat
    assert "it passes if it runs on at least one profile's GPU" in flat
    assert "'all': every profile, each of which must pass" in flat
