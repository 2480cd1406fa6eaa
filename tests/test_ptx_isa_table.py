"""The PTX head as ptxas 13.0 reads it: which ``.version`` each ``.target`` takes, which
ISA versions exist, and ``.address_size``. A head ptxas refuses is PTX no driver's JIT
compiles (the driver's JIT is the same compiler), so the check must not judge it
runnable (docs/security.md). The oracle is ptxas, asked for every target it knows and
every version ``X.Y`` (tests/toolchain_tables.py caches its answers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from buildmatrix.binary.ptx import _PTXAS_13_0, ISA_VERSIONS, MIN_ISA, head_refusal, ptx_directives
from tests.conftest import CliRunner
from tests.test_ptx_head import needs_ptxas, ptxas
from tests.toolchain_tables import isa_table

_KERNEL = b"\n.visible .entry k()\n{\nret;\n}\n"
# Where buildmatrix is stricter than ptxas 13.0, and why (fail closed): the PTX ISA
# release notes introduce sm_70 with ISA 6.0 and sm_88 with 9.0, which ptxas 13.0
# takes from .version 5.1 and 7.3 on.
_STRICTER = {"sm_70": Version("6.0"), "sm_88": Version("9.0")}


def _head(version: str, target: str, rest: bytes = b"") -> bytes:
    return f".version {version}\n.target {target}\n".encode() + rest + _KERNEL


@needs_ptxas
def test_every_target_takes_the_versions_ptxas_takes() -> None:
    """For every ``.target`` ptxas knows and every ISA version: read exactly where
    ptxas takes the pair, but for the documented stricter cells."""
    names = sorted(_PTXAS_13_0)
    known, takes = isa_table(names)
    assert {Version(v) for v in known} == ISA_VERSIONS
    wrong = []
    for name in names:
        taken = {Version(v) for v in takes[name]}
        assert taken == {Version(v) for v in known if Version(v) >= min(taken)}, name
        want_min = max(min(taken), _STRICTER.get(name, min(taken)))
        if MIN_ISA[name] != want_min:
            wrong.append((name, str(MIN_ISA[name]), str(want_min)))
        for v in known:
            read = ptx_directives(_head(v, name)) is not None
            if read != (Version(v) >= want_min):
                wrong.append((name, v, str(read)))
    assert not wrong, wrong
    assert set(MIN_ISA) == set(names)


@needs_ptxas
@pytest.mark.parametrize(
    ("rest", "reads"),
    [
        (b".address_size 64", True),
        (b".address_size 0x40", True),
        (b".address_size 0X40U", True),
        (b".address_size 0b1000000", True),
        (b".address_size 0100", True),  # octal 64
        (b".address_size /* c */ 64 // c", True),
        (b"", True),
        (b".address_size 32", False),
        (b".address_size 0x20", False),
        (b".address_size 064", False),  # octal 52
        (b".address_size 16", False),
        (b".address_size", False),
        (b".address_size 64;", False),
        (b".address_size 64\n.address_size 64", False),
        (b".address_size 64\n.target sm_90", False),
        (b".address_size 64\n.version 9.0", False),
        (b".version 9.0", False),
    ],
)
def test_address_size_as_ptxas_reads_it(tmp_path: Path, rest: bytes, reads: bool) -> None:
    """ptxas 13.0 compiles no 32-bit PTX, for any GPU ("32-Bit compilation is no longer
    supported"; from sm_90 on "not supported on sm_90 or higher architectures")."""
    for sm in ("sm_80", "sm_90", "sm_100"):
        text = _head("9.0", sm, rest)
        assert (ptxas(tmp_path, text, sm).returncode == 0) is reads, (sm, rest)
        assert (ptx_directives(text) is not None) is reads, (sm, rest, head_refusal(text))
    assert ptx_directives(_head("2.2", "sm_20", b".address_size 64")) is None
    assert ptx_directives(_head("2.3", "sm_20", b".address_size 64")) is not None


@needs_ptxas
@pytest.mark.parametrize(
    ("version", "target", "sm", "why"),
    [
        ("7.0", "sm_90", "sm_90", "does not support .target sm_90"),
        ("8.4", "sm_100", "sm_100", "does not support .target sm_100"),
        ("8.7", "sm_100f", "sm_100", "does not support .target sm_100f"),
        ("8.9", "sm_90", "sm_90", "does not exist"),
    ],
)
def test_a_ptx_file_ptxas_refuses_fails_check_with_the_reason(
    cli: CliRunner, tmp_path: Path, version: str, target: str, sm: str, why: str
) -> None:
    """The review's heads, through the CLI: refused by ptxas, so the file has no code
    that runs (exit 1, the reason in the problems), never judged runnable by JIT."""
    text = _head(version, target, b".address_size 64")
    assert ptxas(tmp_path, text, target).returncode != 0
    root = tmp_path / "img"
    root.mkdir()
    (root / "k.ptx").write_bytes(text)
    result = cli("check", f"dir:{root}", "--sm", sm, "--json")
    assert result.code == 1, result.out
    assert why in result.out, result.out


@needs_ptxas
def test_a_module_that_is_a_head_alone_is_read(tmp_path: Path) -> None:
    """cuBLAS 12.8 holds compressed compute_120 PTX that is a head and its NUL alone:
    the driver takes PTX as a NUL-terminated string, and ptxas compiles the text before
    the NUL; a head followed by anything but a directive or the end is refused."""
    text = b"//\n.version 8.7\n.target sm_120\n.address_size 64\n\n\n"
    assert ptxas(tmp_path, text, "sm_120").returncode == 0
    assert ptx_directives(text) is not None and ptx_directives(text + b"\0") is not None
    assert ptxas(tmp_path, text + b"x", "sm_120").returncode != 0
    assert ptx_directives(text + b"x") is None


@needs_ptxas
def test_address_size_32_fails_check(cli: CliRunner, tmp_path: Path) -> None:
    text = _head("9.0", "sm_80", b".address_size 32")
    assert ptxas(tmp_path, text, "sm_80").returncode != 0
    root = tmp_path / "img"
    root.mkdir()
    (root / "k.ptx").write_bytes(text)
    result = cli("check", f"dir:{root}", "--sm", "sm_80", "--json")
    assert result.code == 1 and "address_size 32" in result.out, result.out
