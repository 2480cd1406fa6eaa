"""The kernels a PTX text defines, read as ptxas reads them (buildmatrix/binary/ptx.py,
``ptx_kernels``): ``.entry`` directives after any linkage directives (PTX ISA
reference, "Kernel and Function Directives: .entry"), none inside a comment or a
string, none only declared ``.extern``. ptxas is the oracle: the cubin it compiles
from the text defines exactly the kernels read (buildmatrix.binary.cubin, whose
kernels tests/test_kernels.py holds to cuobjdump).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildmatrix.binary import ptx
from buildmatrix.binary.cubin import cubin_facts
from buildmatrix.binary.ptx import ptx_kernels
from buildmatrix.binary.source import BytesSource

_TEXT = b"""//
// .visible .entry fake_line(
.version 9.0
.target sm_80
.address_size 64
.extern .entry declared_elsewhere
(
\t.param .u64 p
);
.visible .entry a_visible(
\t.param .u64 p
)
{
\tret;
}
.weak // linkage, then a comment
 .entry b_weak()
{
\tret;
}
.extern .global .u32 g;
.entry c_plain()
{
\t.pragma "nounroll .entry fake_string";
\tret;
}
.func (.reg .b32 r) not_a_kernel()
{
\tmov.b32 r, 0;
\tret;
}
"""
_READ = {"a_visible", "b_weak", "c_plain"}
_BLOCK = b"""/* .visible .entry fake_block( ) { ret; } */
.entry/* a comment */d_plain()
{
\tret;
}
"""


@pytest.mark.parametrize("block", [False, True], ids=["line comments", "block comments"])
def test_kernels_are_the_entry_directives_outside_comments_and_strings(block: bool) -> None:
    text = _TEXT + (_BLOCK if block else b"")
    assert set(ptx_kernels(text)) == _READ | ({"d_plain"} if block else set())
    # an unterminated block comment runs to the end of the text
    assert set(ptx_kernels(text + b"/* .entry e_unterminated() { ret; }\n")) == set(
        ptx_kernels(text)
    )


class _Counting:
    """``_NOT_CODE`` that counts the bytes it is asked to search."""

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        self.pattern = pattern
        self.searched = 0

    def finditer(self, text: bytes, start: int, end: int) -> Iterator[re.Match[bytes]]:
        self.searched += end - start
        return self.pattern.finditer(text, start, end)

    def sub(self, repl: bytes, text: bytes) -> bytes:
        self.searched += len(text)
        return self.pattern.sub(repl, text)


@pytest.mark.parametrize(
    "text",
    [
        # nvcc's text: a // comment every few lines, no block comment, few directives
        _TEXT + b"\tld.global.f32 \t%f1, [%rd4];\n\tadd.f32 %f2, %f1, 0f3F800000;\n// c\n" * 50_000,
        # a whole module on one line (ptxas takes it), a string before its directives
        b'.version 8.0 .target sm_80 .address_size 64 .pragma "nounroll"; '
        + b" ".join(b".visible .entry k%d() { ret; }" % i for i in range(20_000)),
    ],
    ids=["nvcc", "one line"],
)
def test_the_text_is_searched_for_comments_once(
    monkeypatch: pytest.MonkeyPatch, text: bytes
) -> None:
    """Linear time (docs/security.md): each line's comments and strings are looked for
    once, however many directives it holds; a module on one line with 20,000
    kernels was searched once per directive, quadratic in its length."""
    counting = _Counting(ptx._NOT_CODE)
    monkeypatch.setattr(ptx, "_NOT_CODE", counting)
    found = ptx_kernels(text)
    assert len(found) == (len(_READ) if text.startswith(_TEXT) else 20_000)
    assert counting.searched <= len(text)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is the oracle")
@pytest.mark.parametrize("block", [False, True], ids=["line comments", "block comments"])
def test_ptxas_compiles_the_kernels_read(tmp_path: Path, block: bool) -> None:
    source = tmp_path / "k.ptx"
    source.write_bytes(_TEXT + (_BLOCK if block else b""))
    cubin = tmp_path / "k.cubin"
    subprocess.run(
        ["ptxas", "-arch=sm_80", str(source), "-o", str(cubin)], check=True, capture_output=True
    )
    kernels, _ = cubin_facts(BytesSource(cubin.read_bytes(), name=str(cubin)))
    assert kernels is not None
    assert set(kernels) == set(ptx_kernels(source.read_bytes()))


_HEADER = b".version 8.0\n.target sm_80\n.address_size 64\n"
# ptxas ends a string at any quote, a backslash before it included: no escapes (it warns
# "Pragma 'x\\' unsupported" for the first)
_STRINGS = {
    "pragma": (b'.visible .entry k1(){ .pragma "x\\", ".entry ghost(){ret;}"; ret;}', ("k1",)),
    "file-comment": (b'.file 1 "a\\" //" .visible .entry k1(){ret;}', ()),
    "file-entry": (
        b'.file 1 "a\\" .visible .entry k1(){ret;} //"\n.visible .entry k0(){ret;}',
        ("k1", "k0"),
    ),
}


@pytest.mark.parametrize("case", list(_STRINGS))
def test_strings_end_at_the_next_quote(case: str) -> None:
    text, kernels = _STRINGS[case]
    assert ptx_kernels(_HEADER + text) == kernels


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is the oracle")
@pytest.mark.parametrize("case", list(_STRINGS))
def test_strings_end_where_ptxas_ends_them(tmp_path: Path, case: str) -> None:
    source = tmp_path / "k.ptx"
    source.write_bytes(_HEADER + _STRINGS[case][0])
    cubin = tmp_path / "k.cubin"
    subprocess.run(
        ["ptxas", "-arch=sm_80", str(source), "-o", str(cubin)], check=True, capture_output=True
    )
    kernels, _ = cubin_facts(BytesSource(cubin.read_bytes(), name=str(cubin)))
    assert set(kernels or ()) == set(ptx_kernels(source.read_bytes()))
