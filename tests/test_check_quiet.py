"""check's text report: one summary line per kind by default (files, specialised code),
the detail with -v; failure lines of several targets with one cause merged; a
toolchain newer than the image's CUDA_VERSION said, and every runtime source in the
JSON, which always has everything."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import REPO, CliRunner, validate
from tests.fixtures.build import BIN
from tests.images import write_docker_archive
from tests.test_check_cli import HOPPER_IMAGE

SCHEMA = json.loads((REPO / "buildmatrix" / "schemas" / "check.schema.json").read_text())
FAMILIES = ["--family", "ampere", "--family", "hopper", "--family", "blackwell", "--no-cache"]


def _bullets(out: str) -> list[str]:
    return [x.removeprefix("  - ") for x in out.splitlines() if x.startswith("  - ")]


def test_specialised_code_is_one_line_unless_verbose(cli: CliRunner) -> None:
    # an sm_80 + sm_90 unit beside an sm_90a-only one: specialised on every other GPU
    lib = str(BIN / "libarch_unit.so")
    families = ["--family", "ampere", "--family", "hopper", "--no-cache"]
    doc = cli("check", lib, *families, "--format", "json").json()
    notes = sorted({s for t in doc["targets"] for s in t["specialised"]})
    assert notes
    quiet = cli("check", lib, *families)
    assert quiet.code == 0
    assert f"specialised code: {len(notes)} container(s) not counted" in quiet.out
    assert "-v lists them" in quiet.out
    assert not _bullets(quiet.out)
    assert "FILE" not in quiet.out.split()
    loud = cli("check", lib, *families, "-v")
    assert _bullets(loud.out) == notes
    assert loud.out.splitlines().count("specialised code, not counted (--strict counts it):") == 1
    assert "FILE" in loud.out.split()


def test_failures_with_one_cause_are_one_line(cli: CliRunner) -> None:
    """sm_80-only SASS against Hopper and Blackwell on an R470 driver: 5 targets, 10
    failure lines in the JSON; the text names each cause once, with every target."""
    lib = str(BIN / "libsass_sm80.so")
    args = ["check", lib, "--family", "hopper", "--family", "blackwell", "--driver",
            "470.57.02", "--no-cache"]  # fmt: skip
    doc = cli(*args, "--format", "json").json()
    problems = doc["problems"]
    assert len(problems) == 10
    assert _bullets(cli(*args, "--verbose").out) == problems  # -v: every line as in JSON
    grouped = _bullets(cli(*args).out)
    assert len(grouped) == 4
    code = next(x for x in grouped if "no runnable code" in x)
    assert code.startswith("hopper (sm_90), blackwell (sm_100, sm_103, sm_120, sm_121): ")
    assert code.endswith("not 9.0/10.0/10.3/12.0/12.1")
    # every target of every JSON line is named in a grouped line of the same kind
    for problem in problems:
        sm = re.match(r"\w+ \((sm_\d+)\): (no runnable code|driver)", problem)
        assert sm, problem
        assert any(sm[1] in line and sm[2] in line for line in grouped), problem


def test_a_toolchain_newer_than_cuda_version_is_said(cli: CliRunner, tmp_path: Path) -> None:
    """CUDA_VERSION=12.4.1, a library whose cubins CUDA 13.0 wrote: the floors follow
    13.0 (as before); now the report says the two disagree, and the JSON lists both."""
    archive = f"docker-archive:{write_docker_archive(tmp_path / 'img.tar', HOPPER_IMAGE)}"
    text = cli("check", archive, "--driver", "580.65.06")
    assert text.code == 0, text.err
    assert (
        "runtime  note: the image's CUDA_VERSION says CUDA 12.4, but device code of "
        "usr/lib/libhopper_a.so (built by CUDA 13.0) needs CUDA 13.0: the driver floors "
        "follow 13.0"
    ) in text.out
    doc = cli("check", archive, "--driver", "580.65.06", "--format", "json").json()
    validate(doc, SCHEMA)
    assert doc["cuda_runtime"]["version"] == "13.0"
    sources = {(s["version"], s["source"]) for s in doc["cuda_runtime_sources"]}
    assert ("12.4", "CUDA_VERSION in the image config") in sources
    assert ("13.0", "device code of usr/lib/libhopper_a.so (built by CUDA 13.0)") in sources
    assert "12.4" in doc["cuda_runtime_note"] and "13.0" in doc["cuda_runtime_note"]


def test_no_note_where_cuda_version_is_the_newest(cli: CliRunner) -> None:
    doc = cli("check", str(BIN / "libmulti.so"), "--family", "hopper", "--format", "json").json()
    assert doc["cuda_runtime_note"] is None
    assert isinstance(doc["cuda_runtime_sources"], list)
