"""The compat note's JSON decoded as Go's ``encoding/json`` decodes it for the NVIDIA
container toolkit (buildmatrix/binary/compat_note.py, ``decode_note``;
docs/compatibility.md, "Forward compatibility").

The oracle is Go itself: tests/gonote/main.go fills the toolkit's ``compatElfHeader``
(``cmd/nvidia-cdi-hook/cudacompat/cuda-elf-header.go``) with ``json.Unmarshal``. For
notes drawn by hypothesis, with the shapes where Python's decoder and Go's part ways
(nesting thousands deep, integer literals past Python's digit limit and Go's int,
keys Go folds, nulls, wrong types), both must read the same fields or both refuse.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buildmatrix.binary.compat_note import UndecodableNote, decode_note


@pytest.fixture(scope="module")
def gonote(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/gonote/main.go built once (standard library only: no network)."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go is not installed (scripts/test installs golang-go): no Go oracle")
    out = tmp_path_factory.mktemp("gonote")
    env = {
        **os.environ,
        "GOFLAGS": "-mod=mod",
        "GOCACHE": str(out / "cache"),
        "GOPATH": str(out / "path"),
        "CGO_ENABLED": "0",
    }
    src = Path(__file__).parent / "gonote" / "main.go"
    subprocess.run(
        [go, "build", "-o", str(out / "gonote"), str(src)],
        check=True,
        env=env,
        cwd=src.parent,
        capture_output=True,
    )
    return out / "gonote"


def _go(gonote: Path, texts: list[bytes]) -> list[dict[str, Any]]:
    lines = "".join(base64.b64encode(t).decode() + "\n" for t in texts)
    proc = subprocess.run([str(gonote)], input=lines, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _ours(text: bytes) -> dict[str, Any]:
    try:
        fields = decode_note(text)
    except UndecodableNote:
        return {"err": True}
    return {
        "err": False,
        "format": fields["format"],
        "cuda": fields["cuda"],
        "driver": fields["driver"],
        "device": fields["device"],
    }


def _nested(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


_KEYS = st.sampled_from(
    [
        "driver",
        "Driver",
        "DRIVER",
        "device",
        "format",
        "CUDA Version",
        "CUDA Ver\u017fion",
        "dr\u0131ver",
        "x",
        "y",
    ]
)
_DEPTHS = st.sampled_from([1, 2, 900, 3000, 9998, 9999, 10000, 12000])
_BIG = st.integers(1, 30).flatmap(
    lambda n: st.tuples(st.sampled_from(["", "-"]), st.just("9" * n)).map("".join)
)
_VALUES = st.one_of(
    st.lists(st.integers(-3, 700).map(str), max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
    _DEPTHS.map(_nested),
    _DEPTHS.map(lambda d: "[535," + _nested(d) + "]"),
    _DEPTHS.map(lambda d: '{"a":' + _nested(d - 1, "1") + "}"),
    _BIG,
    _BIG.map(lambda b: f"[535,{b}]"),
    st.sampled_from(["null", "[null,535]", '"13.1"', "1", "535.0", "true", "{}", "[5e2]"]),
)


@st.composite
def _notes(draw: st.DrawFn) -> bytes:
    pairs = draw(st.lists(st.tuples(_KEYS, _VALUES), max_size=4))
    body = ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs)
    top = draw(st.sampled_from(["{%s}", "[{%s}]", "{%s} x", " {%s}\n"]))
    return (top % body).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(_notes(), min_size=1, max_size=8))
def test_notes_decode_as_go_decodes_them(gonote: Path, texts: list[bytes]) -> None:
    """``json.Unmarshal`` into ``compatElfHeader``: same fields, or both refuse (Go
    refuses nesting past 10,000 levels, ``maxNestingDepth``; Python's decoder, left to
    itself, overflowed its stack at ~1,000 and refused integers of over 4,300 digits
    under any key, both with a traceback)."""
    for text, go in zip(texts, _go(gonote, texts), strict=True):
        ours = _ours(text)
        if go["err"]:
            assert ours == {"err": True}, text[:120]
        else:
            assert ours == go, text[:120]


@pytest.mark.parametrize(
    ("text", "driver"),
    [
        (b'{"x":' + _nested(9999).encode() + b',"driver":[535]}', [535]),  # 10,000 deep
        (b'{"x":' + _nested(10000).encode() + b',"driver":[535]}', None),  # past Go's bound
        (b'{"x":' + b"9" * 5000 + b',"driver":[535]}', [535]),  # Go skips it unread
        (b'{"driver":[535,' + b"9" * 5000 + b"]}", None),  # overflows Go's int
    ],
)
def test_deep_notes_and_long_integers_decode_without_a_traceback(
    text: bytes, driver: list[int] | None
) -> None:
    assert _ours(text) == (
        {"err": True}
        if driver is None
        else {"err": False, "format": 0, "cuda": "", "driver": driver, "device": None}
    )
