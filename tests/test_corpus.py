"""check on real GPU software: 19 packages of the corpus (tests/corpus.py), each laid
out as installed and judged on every GPU of the shipped profiles with driver R580,
held to what each package documents (tests/corpus_expected.py, the source cited per
row) and to NVIDIA's cuobjdump.

Three properties:
- every (package, GPU) cell is what the package documents, or the truth where its
  files say otherwise; a mismatch prints the whole table, actual beside expected;
- the files' listing (SASS and PTX per file) equals cuobjdump's, on a sample of files
  of every package sized to keep the test short;
- no false pass: a cell passes only where some file of the package that the verdict
  counts has, by cuobjdump's own listing and NVIDIA's rule restated in the test, code
  that runs on that GPU.

Wheels are downloaded once (tests/wheels.py; about 5 GB, cached under
~/.cache/buildmatrix/wheels with the laid-out images beside them).
"""

from __future__ import annotations

import struct
import subprocess
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from tests import corpus
from tests.corpus_expected import DOCUMENTED, runs_on
from tests.cuobjdump import _LINE, cuobjdump_lists, find_cuobjdump

pytestmark = [pytest.mark.integration, pytest.mark.index]

# cuobjdump reads about 1 GB/s from the page cache but needs GBs of memory on a 1 GB
# library (torch's libtorch_cuda.so: ~20 s, ~6 GB): the sample stays below this size.
SAMPLE_LIMIT = 500 << 20
# cuobjdump 13.0 stops on this file with "Invalid ELF" after its sm_86 cubin and its
# compute_90 PTX (exit 1): its listing is not compared, and what it printed before it
# stopped is still evidence of code (no false pass).
NOT_REFEREED = {"onnxruntime/capi/libonnxruntime_providers_cuda.so"}


@pytest.fixture(scope="module")
def images() -> dict[str, Path]:
    return {p.name: corpus.image(p) for p in corpus.PACKAGES}


@pytest.fixture(scope="module")
def verdicts(images: dict[str, Path]) -> dict[str, dict]:  # type: ignore[type-arg]
    return corpus.check_all(images, corpus.gpus())


def test_every_cell_is_what_the_package_documents(
    verdicts: dict[str, dict],  # type: ignore[type-arg]
) -> None:
    gpus = corpus.gpus()
    actual: dict[str, dict[str, str]] = {}
    expected: dict[str, dict[str, str]] = {}
    wrong = []
    for name, doc in verdicts.items():
        cells = corpus.cells(doc)
        assert sorted(cells, key=gpus.index) == gpus, (name, sorted(cells))
        actual[name] = {cc: cells[cc].text for cc in gpus}
        expected[name] = {}
        for cc in gpus:
            status, why = DOCUMENTED[name].expected(cc)
            mark = "" if status == cells[cc].status else "MISMATCH "
            expected[name][cc] = mark + status
            if mark:
                wrong.append(
                    f"{name} on {cc}: expected {status}"
                    + (f" ({why})" if why else "")
                    + f", got {cells[cc].text}"
                )
    if wrong:
        pytest.fail(
            f"{len(wrong)} of {len(gpus) * len(verdicts)} cells differ from what the "
            f"packages document (driver {corpus.DRIVER}).\n\nActual:\n"
            + corpus.render(actual, gpus)
            + "\n\nExpected:\n"
            + corpus.render(expected, gpus)
            + "\n\nDifferences:\n"
            + "\n".join(wrong),
            pytrace=False,
        )


@cache
def _cuobjdump(path: Path) -> tuple[Counter[str], Counter[str]]:
    """(SASS, PTX) entries as ``cuobjdump --list-elf --list-ptx`` lists them, with
    multiplicity; of a file it stops on (NOT_REFEREED), what it printed before."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    if str(path).endswith(tuple(NOT_REFEREED)):
        out = subprocess.run(
            [str(tool), "--list-elf", "--list-ptx", str(path)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        found = [m for m in (_LINE.match(line.strip()) for line in out.splitlines()) if m]
        return (
            Counter(m[2] for m in found if m[1] == "ELF"),
            Counter("compute_" + m[2].removeprefix("sm_") for m in found if m[1] == "PTX"),
        )
    return cuobjdump_lists(tool, path)


def _site(root: Path, path: str) -> str:
    return path.removeprefix(corpus.SITE + "/")


def _refereed(doc: dict, root: Path) -> list[str]:  # type: ignore[type-arg]
    """The sample of one package: its smallest and its largest file with device code
    under SAMPLE_LIMIT (no static archives: never loaded), and every file check
    refused to read."""
    paths = [
        f["path"]
        for f in doc["files"]
        if not f["path"].endswith(".a") and _site(root, f["path"]) not in NOT_REFEREED
    ]
    refused = {
        r.removeprefix("unreadable: ").split(" (")[0]
        for t in doc["targets"]
        for r in t["reasons"]
        if r.startswith("unreadable: ")
    }
    sized = sorted(
        (p for p in paths if (root / p).stat().st_size <= SAMPLE_LIMIT),
        key=lambda p: ((root / p).stat().st_size, p),
    )
    picked = {*sized[:1], *sized[-1:]}
    return sorted(picked | {p for p in refused if (root / p).stat().st_size <= SAMPLE_LIMIT})


def test_listing_is_cuobjdumps(
    images: dict[str, Path],
    verdicts: dict[str, dict],  # type: ignore[type-arg]
) -> None:
    differ = []
    seen = 0
    for name, doc in verdicts.items():
        root = images[name]
        listed = {f["path"]: f for f in doc["files"]}
        for path in _refereed(doc, root):
            seen += 1
            sass, ptx = _cuobjdump(root / path)
            ours = listed.get(path)
            if ours is None:
                differ.append(f"{name}: {path}: not listed; cuobjdump: {sorted(sass | ptx)}")
                continue
            # cuobjdump lists the registered fatbinaries, not code kept as data (listed
            # as embedded), and names an sm_XYf cubin sm_XY; PTX keeps its suffix
            registered = [e for e in ours["entries"] if not e.get("embedded")]
            got_sass = Counter(
                e["arch"].removesuffix("f") for e in registered if e["kind"] == "sass"
            )
            got_ptx = Counter(e["arch"] for e in registered if e["kind"] == "ptx")
            if got_sass != sass or got_ptx != ptx:
                differ.append(
                    f"{name}: {path}: ours {sorted(got_sass.items())} "
                    f"{sorted(got_ptx.items())}, cuobjdump {sorted(sass.items())} "
                    f"{sorted(ptx.items())}"
                )
    assert seen >= len(verdicts)
    assert not differ, "\n".join(differ)


# A fatbinary container's header (the CUDA runtime's layout, as clang's CGCUDANV.cpp
# writes it): magic 0xBA55ED50, version 1, header size 16, then the size of what follows.
_FATBIN = struct.Struct("<IHHQ")
# Containers of code kept as data tried per file before a cell counts as not shown
# (cuFFT finds code for every GPU within its first few).
_BLOBS_TRIED = 200


def _kept_as_data(path: Path, dest: Path) -> list[Path]:
    """Each fatbinary container in the file's bytes, found by its header alone and
    written to a file of its own: cuobjdump lists only a file's registered fatbinaries,
    and reads a container given as a file (``cuobjdump x.fatbin``). What is not a
    container cuobjdump refuses, and lists nothing."""
    data = path.read_bytes()
    blobs: list[Path] = []
    at = data.find(b"\x50\xed\x55\xba")
    while at >= 0 and len(blobs) < _BLOBS_TRIED:
        if at + _FATBIN.size <= len(data):
            _, version, header, size = _FATBIN.unpack_from(data, at)
            end = at + header + size
            if version == 1 and header == _FATBIN.size and end <= len(data):
                blob = dest / f"{len(blobs)}.fatbin"
                blob.write_bytes(data[at:end])
                blobs.append(blob)
        at = data.find(b"\x50\xed\x55\xba", at + 4)
    return blobs


def _lists_any(path: Path) -> tuple[Counter[str], Counter[str]]:
    """cuobjdump's lists of a file it may refuse (then nothing)."""
    try:
        return _cuobjdump(path)
    except RuntimeError:
        return Counter(), Counter()


def test_no_false_pass(
    images: dict[str, Path],
    verdicts: dict[str, dict],  # type: ignore[type-arg]
    tmp_path: Path,
) -> None:
    """A cell passes only where a file the verdict counts holds code for the GPU by
    cuobjdump's listing: of its registered fatbinaries, else of the fatbinaries it
    keeps as data (cuFFT registers only a stub), each cut out by its header and given
    to cuobjdump. Files are asked smallest first, so most cells cost one small file; a
    file over SAMPLE_LIMIT is never asked, and a cell whose only such files are over it
    counts as not shown (the test fails: raise the limit or add a file)."""
    unproven = []
    blobs: dict[Path, list[Path]] = {}

    def has_code(path: Path, cc: str) -> bool:
        sass, ptx = _lists_any(path)
        if any(runs_on(a, cc) for a in (*sass, *ptx)):
            return True
        if path not in blobs:
            dest = tmp_path / str(len(blobs))
            dest.mkdir()
            blobs[path] = _kept_as_data(path, dest)
        return any(
            runs_on(a, cc) for blob in blobs[path] for lists in _lists_any(blob) for a in lists
        )

    for name, doc in verdicts.items():
        root = images[name]
        files = sorted(
            (
                f["path"]
                for f in doc["files"]
                if not f["path"].endswith(".a")
                and (root / f["path"]).stat().st_size <= SAMPLE_LIMIT
            ),
            key=lambda p: ((root / p).stat().st_size, p),
        )
        for cc, cell in corpus.cells(doc).items():
            if cell.status != "pass":
                continue
            target = next(t for t in doc["targets"] if t["compute_capability"] == cc)
            skipped = corpus.skipped_paths(target)
            if not any(has_code(root / p, cc) for p in files if p not in skipped):
                unproven.append(f"{name} passes {cc}, but no counted file has code for it")
    assert not unproven, "\n".join(unproven)
