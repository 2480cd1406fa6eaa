"""inspect on the committed nvcc-built fixtures, on folders, and through the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from buildmatrix.binary.report import FileReport, ScanProblem
from buildmatrix.binary.scan import inspect_file, scan_tree
from tests import agent_site
from tests.binaries import container, elf_with_section, entry
from tests.conftest import REPO, CliRunner, validate
from tests.fixtures.build import BIN, FIXTURES, Fixture, expected

INSPECT_SCHEMA = json.loads((REPO / "buildmatrix/schemas/inspect.schema.json").read_text())
CODE_FIXTURES = [fx for fx in FIXTURES if fx.kind != "host"]


@pytest.mark.parametrize("fx", CODE_FIXTURES, ids=lambda fx: fx.name)
def test_committed_fixture_matches_its_gencode(fx: Fixture) -> None:
    report = inspect_file(BIN / fx.name)
    assert report is not None
    sass, ptx = expected(fx)
    assert (report.sass, report.ptx) == (sass, ptx)


def test_details_of_entries() -> None:
    compressed = inspect_file(BIN / "libcompressed.so")
    assert compressed is not None
    assert all(e.compressed for e in compressed.entries)
    ptx = inspect_file(BIN / "libsass_ptx.so")
    assert ptx is not None
    isas = {str(e.ptx_isa) for e in ptx.entries if e.ptx_isa is not None}
    assert isas == {"9.0"}  # nvcc 13.0 emits PTX ISA 9.0
    lto = inspect_file(BIN / "kernels_lto.fatbin")
    assert lto is not None
    assert [e.arch_name for e in lto.entries] == ["lto_90"]
    assert lto.code_targets() == []
    assert inspect_file(BIN / "libhost_only.so") is None


def test_scan_tree_lists_only_cuda_files_in_order() -> None:
    reports = list(scan_tree(BIN))
    assert all(isinstance(r, FileReport) for r in reports)
    paths = [r.path for r in reports]
    assert paths == sorted(fx.name for fx in CODE_FIXTURES)


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "usr/lib/cuda").mkdir(parents=True)
    (root / "opt").mkdir()
    (root / "usr/lib/cuda/libsass_ptx.so").write_bytes((BIN / "libsass_ptx.so").read_bytes())
    (root / "usr/lib/libhost.so").write_bytes((BIN / "libhost_only.so").read_bytes())
    (root / "usr/lib/README").write_text("not a binary")
    (root / "usr/lib/empty").write_bytes(b"")
    bad = elf_with_section(".nv_fatbin", container(entry(header_size=0)))
    (root / "opt/broken.so").write_bytes(bad)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "libmulti.so").write_bytes((BIN / "libmulti.so").read_bytes())
    (root / "opt/link-out.so").symlink_to(outside / "libmulti.so")
    (root / "opt/dir-out").symlink_to(outside)
    (root / "usr/lib/libsass_ptx.so.1").symlink_to("cuda/libsass_ptx.so")
    return root


def test_scan_tree_follows_no_symlink_and_reports_corrupt_files(tmp_path: Path) -> None:
    results = list(scan_tree(_tree(tmp_path)))
    reports = [r for r in results if isinstance(r, FileReport)]
    problems = [r for r in results if isinstance(r, ScanProblem)]
    assert [r.path for r in reports] == ["usr/lib/cuda/libsass_ptx.so"]
    assert [p.path for p in problems] == ["opt/broken.so"]
    assert "has header size 0" in problems[0].message


def test_inspect_cli_json(tmp_path: Path, cli: CliRunner) -> None:
    root = _tree(tmp_path)
    result = cli("inspect", "--json", str(root), str(BIN / "kernels_sm90a.cubin"))
    assert result.code == 0
    doc = result.json()
    validate(doc, INSPECT_SCHEMA)
    assert [f["path"] for f in doc["files"]] == [
        "usr/lib/cuda/libsass_ptx.so",
        str(BIN / "kernels_sm90a.cubin"),
    ]
    first = doc["files"][0]
    assert first["sass"] == ["sm_80", "sm_90"]
    assert first["ptx"] == ["compute_90"]
    assert {"kind": "ptx", "arch": "compute_90", "ptx_isa": "9.0"}.items() <= next(
        e for e in first["entries"] if e["kind"] == "ptx"
    ).items()
    assert len(doc["problems"]) == 1
    assert "warning:" in result.err


def test_inspect_cli_table(cli: CliRunner) -> None:
    result = cli("inspect", str(BIN))
    assert result.code == 0
    lines = result.out.splitlines()
    assert lines[0].split() == ["FILE", "SASS", "PTX"]
    multi = next(line for line in lines if line.startswith("libmulti.so"))
    assert "sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, sm_103, sm_120" in multi
    assert "compute_120 (ISA 9.0)" in multi
    assert lines[-1] == f"{len(CODE_FIXTURES)} file(s) with device code of {len(FIXTURES)} scanned"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect"], "Missing argument"),
        (["inspect", "/nonexistent/lib.so"], "/nonexistent/lib.so: no such file or folder"),
        (["inspect", "BAD"], "has header size 0"),
    ],
)
def test_inspect_cli_bad_input_exits_2(
    tmp_path: Path, cli: CliRunner, args: list[str], message: str
) -> None:
    if "BAD" in args:
        bad = tmp_path / "bad.so"
        bad.write_bytes(elf_with_section(".nv_fatbin", container(entry(header_size=0))))
        args = ["inspect", str(bad)]
    result = cli(*args)
    assert result.code == 2
    assert message in result.err


def test_inspect_truncated_library(tmp_path: Path, cli: CliRunner) -> None:
    data = (BIN / "libmulti.so").read_bytes()
    cut = tmp_path / "libmulti.so"
    cut.write_bytes(data[: len(data) // 2])
    result = cli("inspect", str(cut))
    assert result.code == 2
    assert "truncated" in result.err or "past the end" in result.err


@pytest.mark.parametrize("name", ["kernels.PTX", "kernels", "kernels.txt"])
def test_ptx_is_found_by_content_not_by_name(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes((BIN / "kernels_sm90a.ptx").read_bytes())
    report = inspect_file(path, display=name)
    assert report is not None and report.ptx == ["compute_90a"]


def test_hand_written_ptx_and_c_comments(tmp_path: Path) -> None:
    ptx = tmp_path / "hand"
    ptx.write_text(".version 8.4\n.target sm_90\n.address_size 64\n")
    report = inspect_file(ptx, display="hand")
    assert report is not None and report.ptx == ["compute_90"]
    c = tmp_path / "notes.c"
    c.write_text("// a comment, not PTX\nint x;\n")
    assert inspect_file(c, display="notes.c") is None


def _renamed(data: bytes) -> bytes:
    """.nv_fatbin renamed in the section-name table (same length, the loader cares not)."""
    out = data.replace(b".nv_fatbin\0", b".xx_fatbin\0")
    assert out != data
    return out


def _stripped(data: bytes) -> bytes:
    """Section headers removed from the ELF header (e_shoff, e_shnum, e_shstrndx = 0):
    the dynamic loader uses program headers only, so the library still loads."""
    out = bytearray(data)
    out[0x28:0x30] = b"\0" * 8
    out[0x3C:0x40] = b"\0" * 4
    return bytes(out)


@pytest.mark.parametrize("hide", [_renamed, _stripped])
@pytest.mark.parametrize("name", ["libsass_ptx.so", "libmulti.so", "libtwo.so"])
def test_device_code_behind_hidden_sections_is_found(
    tmp_path: Path, name: str, hide: Callable[[bytes], bytes]
) -> None:
    """The runtime registers the fatbinary through its wrapper, whatever the sections
    are called: buildmatrix follows the same wrapper and finds the same code."""
    original = inspect_file(BIN / name)
    path = tmp_path / name
    path.write_bytes(hide((BIN / name).read_bytes()))
    found = inspect_file(path, display=name)
    assert original is not None and found is not None
    assert (found.sass, found.ptx) == (original.sass, original.ptx)
    assert [[str(c.arch) for c in u.codes] for u in found.units()] == [
        [str(c.arch) for c in u.codes] for u in original.units()
    ]


def test_a_stripped_library_cannot_hide_a_failure(cli: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "libgood.so").write_bytes((BIN / "libmulti.so").read_bytes())
    (root / "libold.so").write_bytes(_stripped((BIN / "libsass_sm80.so").read_bytes()))
    result = cli("check", f"dir:{root}", "--sm", "9.0")
    assert result.code == 1
    assert "libold.so: sm_80 SASS runs only on compute capability 8.x, not 9.0" in result.out


def _as_unprivileged(args: list[str], base: Path) -> tuple[list[str], dict[str, str]]:
    """``python -m buildmatrix ARGS`` as nobody when the tests run as root (root reads
    a mode-000 folder, so the case could not happen), with the package copied under
    ``base`` where nobody can read it wherever the checkout lies; skips where that is
    impossible."""
    if os.geteuid() != 0:
        return [sys.executable, "-m", "buildmatrix", *args], dict(os.environ)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is needed to run as a non-root user")
    prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    env = {**os.environ, "PYTHONPATH": agent_site.stage(base), "HOME": "/nonexistent"}
    env["XDG_CACHE_HOME"] = str(base / "cache")
    (base / "cache").mkdir(mode=0o777)
    (base / "cache").chmod(0o777)
    for python in agent_site.interpreters():
        probe = [*prefix, python, "-c", "import buildmatrix"]
        if subprocess.run(probe, check=False, capture_output=True, cwd="/", env=env).returncode:
            continue
        return [*prefix, python, "-m", "buildmatrix", *args], env
    pytest.skip("no Python interpreter here that user nobody may run")


@pytest.mark.other_user
def test_a_folder_that_cannot_be_listed_fails_closed() -> None:
    """dir: on a tree with a mode-000 folder, as a non-root user: the folder is a
    problem (exit 1), not silently skipped, and --ignore names it explicitly."""
    top = Path(tempfile.mkdtemp(prefix="bm-unlisted-"))  # not under the 0700 tmp_path
    try:
        top.chmod(0o755)
        tree = top / "tree"
        (tree / "usr/lib").mkdir(parents=True)
        (tree / "opt/secret").mkdir(parents=True)
        (tree / "usr/lib/libsass_ptx.so").write_bytes((BIN / "libsass_ptx.so").read_bytes())
        (tree / "opt/secret/libsass_sm80.so").write_bytes((BIN / "libsass_sm80.so").read_bytes())
        (tree / "opt/secret").chmod(0)
        argv, env = _as_unprivileged(["check", f"dir:{tree}", "--json", "--sm", "9.0"], top / "py")

        def check(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*argv, *extra], check=False, capture_output=True, text=True, cwd="/", env=env
            )

        failed = check()
        assert failed.returncode == 1, failed.stderr
        problems = json.loads(failed.stdout)["problems"]
        assert any("opt/secret: cannot list folder: Permission denied" in p for p in problems)
        passed = check("--ignore", "opt/secret")
        assert passed.returncode == 0, passed.stdout
    finally:
        (top / "tree/opt/secret").chmod(0o755)
        shutil.rmtree(top)
