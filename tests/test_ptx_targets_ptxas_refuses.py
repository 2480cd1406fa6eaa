"""``.target`` SM names ptxas refuses ("Unsupported .target 'sm_85'"): a PTX text
naming one is no code any JIT compiles, so a check must not judge it runnable.
The oracle is ptxas itself (CUDA 13.0), run on every name tried."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from buildmatrix.binary.ptx import ptx_directives
from tests.conftest import CliRunner
from tests.test_ptx_head import needs_ptxas

_BODY = b"\n.address_size 64\n.visible .entry k()\n{\nret;\n}\n"
# every two-digit SM, each with no suffix, "a" and "f"
_NAMES = [f"sm_{n:02d}{s}" for n in range(0, 100) for s in ("", "a", "f")]


def _ptxas_knows(tmp_path: Path, name: str) -> bool:
    source = tmp_path / f"{name}.ptx"
    source.write_bytes(b".version 8.8\n.target " + name.encode() + _BODY)
    proc = subprocess.run(
        ["ptxas", "-arch=sm_90", str(source), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
        check=False,
    )
    return "Unsupported .target" not in proc.stderr


@needs_ptxas
@pytest.mark.xfail(strict=True, reason="any sm_NN[af] is read as an SM")
def test_an_sm_ptxas_does_not_know_is_no_target(tmp_path: Path) -> None:
    wrong = [
        name
        for name in _NAMES
        if not _ptxas_knows(tmp_path, name)
        and ptx_directives(b".version 8.8\n.target " + name.encode() + _BODY) is not None
    ]
    assert not wrong, wrong


@needs_ptxas
@pytest.mark.xfail(strict=True, reason="compute_85 PTX is judged to run on sm_86")
def test_a_ptx_file_for_an_sm_that_does_not_exist_fails(cli: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "img"
    root.mkdir()
    (root / "k.ptx").write_bytes(b".version 8.8\n.target sm_85" + _BODY)
    assert not _ptxas_knows(tmp_path, "sm_85")
    result = cli("check", f"dir:{root}", "--sm", "sm_86", "--json")
    assert result.code == 1, result.out


@needs_ptxas
@pytest.mark.xfail(strict=True, reason="'debug' is read past without its debug sections")
def test_a_debug_target_without_debug_sections_fails(cli: CliRunner, tmp_path: Path) -> None:
    """ptxas: "Debug information not found in presence of .target debug"."""
    text = b".version 8.8\n.target sm_90, debug" + _BODY
    source = tmp_path / "k.ptx"
    source.write_bytes(text)
    proc = subprocess.run(
        ["ptxas", "-arch=sm_90", str(source), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "Debug information not found" in proc.stderr
    root = tmp_path / "img"
    root.mkdir()
    (root / "k.ptx").write_bytes(text)
    result = cli("check", f"dir:{root}", "--sm", "sm_90", "--json")
    assert result.code == 1, result.out
