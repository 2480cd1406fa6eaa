"""The ``DT_RPATH``/``DT_RUNPATH`` reader (buildmatrix.binary.dynamic), held to GNU
binutils' ``readelf -d`` on libraries and programs gcc links with each (and both
kinds of tags), and fuzzed: corrupt files give an answer, never an exception."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buildmatrix.binary.dynamic import read_dso
from buildmatrix.binary.source import BytesSource

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("readelf") is None,
    reason="gcc links the files, binutils' readelf is the oracle",
)
SEARCHES = ["$ORIGIN", "$ORIGIN/../lib:/opt/x", "/usr/local/cuda/compat", "${ORIGIN}/a::b", "$LIB"]


def _link(out: Path, name: str, flags: list[str], *, shared: bool) -> Path:
    src = out / "x.c"
    src.write_text(
        "int f(void) { return 0; }\n" + ("" if shared else "int main(void){return f();}\n")
    )
    path = out / name
    kind = ["-shared", "-fPIC"] if shared else []
    subprocess.run(["gcc", *kind, "-o", str(path), str(src), *flags], check=True)
    return path


def _readelf(path: Path) -> list[str]:
    out = subprocess.run(
        ["readelf", "-d", "-W", str(path)], check=True, capture_output=True, text=True
    ).stdout
    return re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library (?:rpath|runpath): \[(.*)\]", out)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("tags", ["--enable-new-dtags", "--disable-new-dtags"])
@pytest.mark.parametrize("search", SEARCHES)
def test_the_search_paths_are_those_readelf_prints(
    tmp_path: Path, shared: bool, tags: str, search: str
) -> None:
    path = _link(tmp_path, "f", [f"-Wl,{tags},-rpath,{search}"], shared=shared)
    expected = _readelf(path)
    assert expected  # the oracle saw one
    assert list(read_dso(BytesSource(path.read_bytes(), name="f")).search) == expected


def test_a_file_without_one_has_none(tmp_path: Path) -> None:
    path = _link(tmp_path, "f", [], shared=True)
    assert _readelf(path) == []
    assert read_dso(BytesSource(path.read_bytes(), name="f")).search == ()


@pytest.fixture(scope="module")
def linked(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    out = tmp_path_factory.mktemp("linked")
    flags = ["-Wl,-soname,libcuda.so.1,--enable-new-dtags,-rpath,$ORIGIN/../lib:/opt/x"]
    return _link(out, "f.so", flags, shared=True).read_bytes()


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_corrupt_file_gives_an_answer_not_an_exception(
    linked: bytes, data: st.DataObject
) -> None:
    blob = bytearray(linked)
    for at, value in data.draw(
        st.lists(st.tuples(st.integers(0, len(blob) - 1), st.integers(0, 255)), max_size=8)
    ):
        blob[at] = value
    cut = data.draw(st.integers(0, len(blob)))
    info = read_dso(BytesSource(bytes(blob[:cut]), name="f.so"))
    assert all(isinstance(s, str) for s in info.search)
