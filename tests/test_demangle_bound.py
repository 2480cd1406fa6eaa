"""The demangler's bound (buildmatrix.binary.demangle, buildmatrix.binary.mangled_size):
names whose back-references nest (the demangled text doubles per level) are never
handed to ``__cxa_demangle`` and read as unread, which the per-translation-unit rule
treats as "not named" (docs/check.md); every real name demangles exactly as
``__cxa_demangle`` alone demangles it, and its text is within the bound.

The real names are libstdc++'s own exported symbols and the kernel names nvcc
mangled into the fixture binaries (tests/fixtures/bin), as found in their bytes."""

from __future__ import annotations

import ctypes.util
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from buildmatrix.arch import parse_arch
from buildmatrix.binary import demangle as dm
from buildmatrix.binary.archnames import named_for_architecture
from buildmatrix.binary.mangled_size import TooLarge, Unreadable, demangled_bound
from buildmatrix.units import dispatch_signs
from buildmatrix.verdict import CodeTarget, Unit
from tests.conftest import REPO

_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _seq(i: int) -> str:
    """The i-th substitution: ``S_``, then ``S<base-36 of i-1>_``."""
    if i == 0:
        return "S_"
    n, text = i - 1, ""
    while True:
        text, n = _DIGITS[n % 36] + text, n // 36
        if n == 0:
            return f"S{text}_"


def nested(levels: int, ident: str = "sm") -> str:
    """A kernel template whose arguments are ``ident<a, a>``, then ``ident<X, X>`` of
    the previous one, ``levels`` times: its text doubles per level (an outside
    review's reproducer of the demangler's cost)."""
    args = f"{len(ident)}{ident}I1aS1_E" + "".join(
        f"S0_I{_seq(k)}{_seq(k)}E" for k in range(3, 3 + levels)
    )
    return f"_Z6kernelI{args}EvT_"


def _real(name: str) -> str | None:
    funcs = dm._cxa_demangle()
    assert funcs is not None
    return dm._call(funcs, name.encode())


def test_nesting_is_refused_before_the_demangler_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to the level whose text fits the limit the name demangles as
    ``__cxa_demangle`` alone does; past it the bound stops the name before the
    demangler is called (a spy counts the calls), whatever the depth."""
    calls: list[bytes] = []
    real_call = dm._call

    def spy(funcs: tuple[Any, Any], raw: bytes) -> str | None:
        calls.append(raw)
        return real_call(funcs, raw)

    monkeypatch.setattr(dm, "_call", spy)
    sizes = []
    for levels in range(0, 10):
        name = nested(levels)
        text = _real(name)
        assert text is not None
        sizes.append(len(text))
        limit = dm.output_limit(len(name))
        if len(text) <= limit // 128:  # far within the limit: demangled exactly
            dm.demangle.cache_clear()
            assert dm.demangle(name) == text
    assert sizes[-1] > 2**9 * sizes[0] // 4  # the text really doubles per level
    for levels in (16, 20, 24, 40, 400, 4000):
        name = nested(levels)
        calls.clear()
        dm.demangle.cache_clear()
        assert dm.demangle(name) is None
        assert calls == []  # never handed to __cxa_demangle
        with pytest.raises(TooLarge):
            demangled_bound(name, dm.output_limit(len(name)))
        assert not named_for_architecture(nested(levels, "sm_90"))


def test_a_refused_name_never_leaves_a_container_out() -> None:
    """Fail closed: a container whose one kernel is ``cutlass_80<...>`` nested past the
    limit is not "named for an architecture", so it gives no dispatch sign, where
    the same kernel nested within the limit does."""
    code = CodeTarget(arch=parse_arch("sm_80"))
    small, huge = nested(1, "cutlass_80"), nested(24, "cutlass_80")
    assert named_for_architecture(small)
    assert not named_for_architecture(huge)
    sign = dispatch_signs([Unit(codes=(code,), kernels=(small,), index=1)])
    assert sign is not None and "named for a GPU architecture" in sign
    assert dispatch_signs([Unit(codes=(code,), kernels=(huge,), index=1)]) is None


def _corpus() -> list[str]:
    files = [Path(p) for p in (ctypes.util.find_library("stdc++"),) if p]
    files = [Path("/lib/x86_64-linux-gnu") / f.name if not f.is_absolute() else f for f in files]
    files += sorted((REPO / "tests" / "fixtures" / "bin").iterdir())
    names: set[str] = set()
    for f in files:
        if f.is_file():
            names |= {m.decode() for m in re.findall(rb"_Z[A-Za-z0-9_.$]{2,4000}", f.read_bytes())}
    return sorted(names)


def test_real_names_demangle_as_the_demangler_alone_does() -> None:
    """Every real name ``__cxa_demangle`` reads (thousands: libstdc++'s symbols, the
    fixture kernels) demangles the same through the bound, within it; the only names
    the bound's reader does not read are special names (vtables, typeinfo), which
    are no kernels."""
    names = _corpus()
    read = unread = 0
    kernels = 0
    for name in names:
        text = _real(name)
        if text is None:
            continue
        try:
            bound = demangled_bound(name, 1 << 40)
        except Unreadable:
            assert name[2] in "TG", name  # special names only
            unread += 1
            continue
        assert bound >= len(text), name
        assert bound <= dm.output_limit(len(name)), name
        assert dm.demangle(name) == text, name
        kernels += "kernel" in text or "sm" in text
        read += 1
    assert read > 1000 and kernels > 0, (read, unread, kernels)


_IDENTS = ("cutlass", "gemm", "kernel", "Sm90", "sm80_xmma", "float", "Shape", "epilogue")
_LEAF = st.one_of(
    st.sampled_from([*"ifdhbcj", "PKf", "Li128E", "Lb1E", "T_", "T0_", "S_", "S0_", "S1_"]),
    st.sampled_from(_IDENTS).map(lambda w: f"{len(w)}{w}"),
    st.integers(0, 20).map(_seq),
)


def _compose(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    args = st.lists(children, min_size=1, max_size=4).map(lambda xs: "I" + "".join(xs) + "E")
    scoped = st.lists(st.sampled_from(_IDENTS), min_size=1, max_size=3).map(
        lambda ws: "N" + "".join(f"{len(w)}{w}" for w in ws)
    )
    return st.one_of(
        st.tuples(scoped, args).map(lambda t: t[0] + t[1] + "E"),
        st.tuples(st.sampled_from(_IDENTS), args).map(lambda t: f"{len(t[0])}{t[0]}{t[1]}"),
        children.map(lambda c: "P" + c),
        children.map(lambda c: "K" + c),
    )


@settings(max_examples=400, deadline=None)
@given(
    name=st.tuples(
        st.sampled_from(_IDENTS),
        st.recursive(_LEAF, _compose, max_leaves=24),
        st.lists(st.recursive(_LEAF, _compose, max_leaves=8), min_size=1, max_size=3),
    ).map(lambda t: f"_ZN7cutlass{len(t[0])}{t[0]}I{t[1]}EEv" + "".join(t[2]))
)
def test_cutlass_like_names_are_bounded_and_unchanged(name: str) -> None:
    """Template names of CUTLASS's shape, with references drawn at random (those
    ``__cxa_demangle`` reads): the bound is never below the text, and the name
    demangles as the demangler alone demangles it wherever the text fits the limit."""
    text = _real(name)
    assume(text is not None)
    assert text is not None
    try:
        bound = demangled_bound(name, 1 << 40)
    except Unreadable:
        bound = None
    if bound is not None:
        assert bound >= len(text), name
    dm.demangle.cache_clear()
    got = dm.demangle(name)
    assert got in (text, None)
    if bound is not None and bound <= dm.output_limit(len(name)):
        assert got == text, name
