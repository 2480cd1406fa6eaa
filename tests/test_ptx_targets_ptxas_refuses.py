"""``.target`` SM names ptxas refuses ("Unsupported .target 'sm_85'"): a PTX text
naming one is no code any JIT compiles, so a check must not judge it runnable.
The oracle is ptxas itself (CUDA 13.0), run on every name tried."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from buildmatrix.binary.ptx import min_isa, ptx_directives
from buildmatrix.cuda import load_cuda_facts
from tests.conftest import CliRunner
from tests.test_ptx_head import needs_ptxas, ptxas

_BODY = b"\n.address_size 64\n.visible .entry k()\n{\nret;\n}\n"
# every two-digit SM and the three-digit ones up to 135, each with no suffix, "a" and "f"
_NAMES = [f"sm_{n:02d}{s}" for n in range(0, 136) for s in ("", "a", "f")]


def _ptxas_knows(tmp_path: Path, name: str) -> bool:
    proc = ptxas(tmp_path, b".version 8.8\n.target " + name.encode() + _BODY, "sm_90")
    return "Unsupported .target" not in proc.stderr


@needs_ptxas
def test_an_sm_ptxas_does_not_know_is_no_target(tmp_path: Path) -> None:
    """What ptxas refuses is no target; what it knows is read, as is every arch of the
    CUDA table (a newer release's SMs, which this ptxas cannot know)."""
    facts = load_cuda_facts()
    wrong, missed = [], []
    for name in _NAMES:
        # each at the oldest ISA it takes (tests/test_ptx_isa_table.py) and at least 8.8
        isa = max(min_isa(name) or Version("8.8"), Version("8.8"))
        text = f".version {isa}\n.target {name}".encode() + _BODY
        read = ptx_directives(text) is not None
        if _ptxas_knows(tmp_path, name) or facts.arch_support(name) is not None:
            missed += [] if read else [name]
        else:
            wrong += [name] if read else []
    assert not wrong, wrong
    assert not missed, missed


@needs_ptxas
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
    proc = ptxas(tmp_path, text, "sm_90")
    assert proc.returncode != 0 and "Debug information not found" in proc.stderr
    root = tmp_path / "img"
    root.mkdir()
    (root / "k.ptx").write_bytes(text)
    result = cli("check", f"dir:{root}", "--sm", "sm_90", "--json")
    assert result.code == 1, result.out
