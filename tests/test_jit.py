"""PTX JIT judged by the CUDA version the node's driver reports.

NVML's ``nvmlSystemGetCudaDriverVersion`` (a snapshot's ``cuda_driver_version``) is
the driver's own statement of the newest CUDA it supports, so of the newest PTX ISA
it JITs: where it is known (``smoke``, ``check --snapshot``) it decides; where only a
driver number is known (``check --driver``) the table of drivers does, failing closed
for releases that ship none (13.4, 13.5). The PTX is real nvcc output
(tests/fixtures/newest, written by the 13.3 and 13.5 nvcc wheels).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from buildmatrix.arch import parse_arch
from buildmatrix.compat import Verdict
from buildmatrix.cuda import load_cuda_facts, parse_driver_version
from buildmatrix.jit import judge_ptx
from tests.conftest import REPO, CliRunner
from tests.images import Entry, Image, write_docker_archive

NEWEST = REPO / "tests" / "fixtures" / "newest"
NODES = REPO / "tests" / "fixtures" / "nodes"


def test_the_reported_cuda_version_decides_for_every_release_of_the_table() -> None:
    """Exhaustively over the table: PTX of release R's ISA JITs on a driver reporting
    CUDA C iff R <= C; for a release the table does not know (a newer minor, a newer
    major), only the newest known ISA at or below it is assumed."""
    facts = load_cuda_facts()
    cc = parse_arch("sm_90").cc
    arch = parse_arch("compute_90")
    newest = facts.newest.version
    reported = [tk.version for tk in facts.toolkits] + [
        Version(f"{newest.major}.{newest.minor + 2}"),
        Version(f"{newest.major + 1}.0"),
    ]
    for tk in facts.toolkits:
        for cuda in reported:
            j = judge_ptx(arch, tk.ptx_isa, cc, driver=None, facts=facts, driver_cuda=cuda)
            # several releases share an ISA (12.5, 12.6): the first that emits it counts
            first = next(t.version for t in facts.toolkits if t.ptx_isa >= tk.ptx_isa)
            expected = Verdict.JIT if first <= cuda else Verdict.NONE
            assert j.verdict is expected, (tk.version, cuda, j.reasons)
    # an ISA newer than the table: no reported version can be shown to JIT it
    beyond = Version(f"{facts.newest.ptx_isa.major}.{facts.newest.ptx_isa.minor + 2}")
    for cuda in reported:
        j = judge_ptx(arch, beyond, cc, driver=None, facts=facts, driver_cuda=cuda)
        assert j.verdict is Verdict.NONE
        assert "Update buildmatrix's CUDA table" in j.reasons[0]


def test_a_driver_number_alone_still_fails_closed_for_releases_without_a_driver() -> None:
    facts = load_cuda_facts()
    cc = parse_arch("sm_90").cc
    j = judge_ptx(
        parse_arch("compute_90"),
        Version("9.5"),
        cc,
        driver=parse_driver_version("700.10.01"),
        facts=facts,
    )
    assert j.verdict is Verdict.NONE
    assert "ships no driver" in j.reasons[0]
    assert "check --snapshot" in j.reasons[0]


def _node(tmp_path: Path, driver: str, cuda: str) -> str:
    node: dict[str, Any] = json.loads((NODES / "h100-535.json").read_text())
    node["driver_version"], node["cuda_driver_version"] = driver, cuda
    path = tmp_path / f"node-{cuda}.json"
    path.write_text(json.dumps(node))
    return str(path)


def _image(tmp_path: Path, ptx: str = "kernels_cuda135.ptx") -> str:
    text = (NEWEST / "kernels_cuda135.ptx").read_text()
    if ptx != "kernels_cuda135.ptx":
        text = text.replace("\n.version 9.5\n", f"\n.version {ptx}\n")
    layer: dict[str, Entry] = {"usr/lib/kernels.ptx": text.encode()}
    archive = write_docker_archive(tmp_path / "img.tar", Image(layers=[layer]))
    return f"docker-archive:{archive}"


@pytest.mark.parametrize(
    ("cuda", "passes", "says"),
    [
        ("13.5", True, "PTX ISA 9.5 (CUDA 13.5) is JIT-compiled for 9.0 by the node's driver"),
        ("13.7", True, "which reports CUDA 13.7"),  # a minor the table does not know
        ("13.4", False, "needs a driver of CUDA 13.5 or newer to JIT; the node's driver reports"),
    ],
)
def test_check_snapshot_uses_the_cuda_version_the_node_reports(
    cli: CliRunner, tmp_path: Path, cuda: str, passes: bool, says: str
) -> None:
    """The issue's node: its driver reports CUDA 13.5 and is failed for PTX ISA 9.5
    only because the release notes name no driver for 13.5."""
    ref = _image(tmp_path)
    r = cli("check", ref, "--snapshot", _node(tmp_path, "615.20.01", cuda), "--json")
    assert r.code == (0 if passes else 1), r.out
    doc = r.json()
    text = " ".join(doc["problems"] + doc["targets"][0]["reasons"])
    assert says in text
    # the same driver number alone (--driver) still fails closed, and says why
    r = cli("check", ref, "--sm", "9.0", "--driver", "615.20.01", "--json")
    assert r.code == 1
    problems = " ".join(r.json()["problems"])
    assert "PTX ISA 9.5 is CUDA 13.5's, which ships no driver" in problems
    assert "the CUDA version the driver itself reports decides" in problems


def test_smoke_admits_a_node_whose_driver_reports_cuda_13_5(cli: CliRunner, tmp_path: Path) -> None:
    ref = _image(tmp_path)
    snapshot = _node(tmp_path, "615.20.01", "13.5")
    r = cli("smoke", "--snapshot", snapshot, "--image", ref, "--json")
    assert r.code == 0, r.out
    r = cli("smoke", "--snapshot", _node(tmp_path, "615.20.01", "13.4"), "--image", ref, "--json")
    assert r.code == 1


def test_ptx_newer_than_the_table_fails_even_on_a_newer_reported_version(
    cli: CliRunner, tmp_path: Path
) -> None:
    """ISA 9.7 on a driver reporting 13.7: the table cannot say which release emits
    9.7, so nothing is assumed (fail closed)."""
    r = cli(
        "check",
        _image(tmp_path, "9.7"),
        "--snapshot",
        _node(tmp_path, "615.20.01", "13.7"),
        "--json",
    )
    assert r.code == 1
    assert "Update buildmatrix's CUDA table" in " ".join(r.json()["problems"])
