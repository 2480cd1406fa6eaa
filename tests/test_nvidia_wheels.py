"""check on NVIDIA's own CUDA libraries (the nvidia-cublas, nvidia-cudnn-cu13 and
nvidia-cufft wheels of the configured package index): third-party truth for the
per-translation-unit rule and for code kept as data.

These libraries run on every data-centre GPU of their release, so any "fail" here
is a false fail of buildmatrix's. They are also where the rule is hardest: cuDNN's
libcudnn_cnn holds two sm_75-only containers beside its sm_75..sm_120f ones, cuBLAS
one among 194, cuBLASLt keeps Blackwell-only kernels as data, and cuFFT keeps all its
kernels as data (it registers only a small sm_75 container with the runtime).
"""

from __future__ import annotations

import json
import os
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from buildmatrix.binary.cubin import cubin_facts
from buildmatrix.binary.fatbin import EntryKind, decompressed_cubin
from buildmatrix.binary.scan import inspect_file
from buildmatrix.binary.source import FileSource
from tests.test_torch_wheels import download

pytestmark = [pytest.mark.integration, pytest.mark.index]

WHEELS = {
    "nvidia-cublas": ("13.1.1.3", ["libcublas.so.13", "libcublasLt.so.13"]),
    "nvidia-cudnn-cu13": ("9.24.0.43", ["libcudnn_cnn.so.9"]),
    "nvidia-cufft": ("12.0.0.61", ["libcufft.so.12"]),
}
GPUS = ["8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "12.0"]


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nvidia")
    found: dict[str, Path] = {}
    for name, (version, wanted) in WHEELS.items():
        wheel = download(name, version, root)
        with zipfile.ZipFile(wheel) as zf:
            for lib in wanted:
                member = next(m for m in zf.namelist() if Path(m).name == lib)
                found[lib] = Path(zf.extract(member, root / "x"))
        wheel.unlink()
    return found


def _check(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    from buildmatrix.cli import main

    code = main(["check", str(path), "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def _every_gpu() -> list[str]:
    """``--sm`` for each of GPUS: one check judges the file on all of them (each target
    is judged on its own; the file is read once)."""
    return [arg for sm in GPUS for arg in ("--sm", sm)]


@pytest.mark.parametrize("lib", ["libcublas.so.13", "libcublasLt.so.13", "libcudnn_cnn.so.9"])
def test_nvidia_libraries_run_on_every_gpu_of_their_release(
    libraries: dict[str, Path], lib: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = _check(libraries[lib], capsys, *_every_gpu())
    assert code == 0, (lib, doc["problems"])
    assert [t["compute_capability"] for t in doc["targets"]] == GPUS
    assert all(t["verdict"] != "none" for t in doc["targets"]), doc["targets"]


def test_cudnn_short_looking_containers_are_specialisations(
    libraries: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """libcudnn_cnn's sm_75-only containers (Volta_* kernels) have nothing for 9.0; the
    library's sm_90a/sm_100f/sm_120f code shows that it picks kernels by capability,
    so they are reported; --strict counts them and fails the file."""
    code, doc = _check(libraries["libcudnn_cnn.so.9"], capsys, "--sm", "9.0")
    assert code == 0
    specialised = doc["targets"][0]["specialised"]
    assert len(specialised) == 2
    assert all("(sm_75" in s and "chooses kernels by compute capability" in s for s in specialised)
    code, doc = _check(libraries["libcudnn_cnn.so.9"], capsys, "--sm", "9.0", "--strict")
    assert code == 1


def test_cublas_containers_named_for_an_architecture_are_specialisations(
    libraries: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """cuBLAS 13 holds no arch-specific code; its sm_75-only container (cutlass_70_*
    kernels, read from their compressed cubins) and its sm_120-only one
    (cutlass_80_*_forwardCompat_*) are named for their GPUs."""
    code, doc = _check(libraries["libcublas.so.13"], capsys, "--sm", "9.0")
    assert code == 0
    specialised = doc["targets"][0]["specialised"]
    assert len(specialised) == 2
    assert all("named for a GPU architecture" in s for s in specialised)
    assert any("(sm_75; kernels _ZN7cutlass" in s and "cutlass_70_simt" in s for s in specialised)
    assert _check(libraries["libcublas.so.13"], capsys, "--sm", "9.0", "--strict")[0] == 1


def test_cufft_keeps_its_kernels_as_data(
    libraries: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """cuobjdump and a section reader see one 592-byte sm_75 container in libcufft
    (compressed: decompressed, a link stub that defines no kernel); its kernels are
    fatbinaries in its data, loaded by cuFFT itself."""
    path = libraries["libcufft.so.12"]
    shallow = inspect_file(path, deep=False)
    assert shallow is not None
    assert [e.arch_name for e in shallow.entries] == ["sm_75"]
    report = inspect_file(path)
    assert report is not None
    stub = next(e for e in report.entries if not e.embedded)
    assert stub.compressed and stub.kernels == ()
    assert not any(not u.embedded for u in report.units())
    assert len(report.units()) > 10_000
    assert sum(not e.embedded for e in report.entries) == 1
    assert {"sm_80", "sm_90", "sm_100", "sm_120"} <= set(report.sass)
    code, doc = _check(path, capsys, *_every_gpu())
    assert code == 0, doc["problems"]
    assert [(t["compute_capability"], t["verdict"]) for t in doc["targets"]] == [
        (sm, "native") for sm in GPUS
    ]


def test_cublaslt_blackwell_kernels_kept_as_data_are_reported(
    libraries: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = libraries["libcublasLt.so.13"]
    deep, shallow = inspect_file(path), inspect_file(path, deep=False)
    assert deep is not None
    assert shallow is not None
    extra = [e for e in deep.entries if e.embedded]
    assert len(deep.entries) - len(shallow.entries) == len(extra) > 0
    assert {str(e.arch) for e in extra} <= {"sm_100a", "sm_100f", "sm_103f", "sm_120f"}
    code, doc = _check(path, capsys, "--sm", "9.0")
    assert code == 0
    assert any("kept as data" in s for s in doc["targets"][0]["specialised"])


def test_cublas_links_cubins_of_two_releases(
    libraries: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """cuBLAS 13.1.1.3's compressed cubins carry the notes of two releases: one says
    12.7, the rest 13.0 (and four, ELF ABI 7, none): a file's release is the newest
    note of every cubin, never the note of the one that happened to be read. On a
    CUDA 12.x driver (575, hardware floor of 12.0 met) the CUDA 13.0 runtime floor
    (R580) fails it; on R580 it passes."""
    path = libraries["libcublas.so.13"]
    report = inspect_file(path)
    assert report is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        src = FileSource(fd, name=str(path))
        notes = Counter(
            str(cubin_facts(decompressed_cubin(src, e, name=src.name), header=e.arch)[1])
            for e in report.entries
            if e.compressed and e.kind is EntryKind.SASS
        )
    finally:
        os.close(fd)
    assert notes["12.7"] == 1 and notes["13.0"] > 1000 and set(notes) == {"12.7", "13.0", "None"}
    assert str(report.toolkit) == "13.0"
    code, doc = _check(path, capsys, "--sm", "12.0", "--driver", "575.51.03")
    assert code == 1
    assert any("CUDA 13.0 runtime" in p for p in doc["problems"]), doc["problems"]
    assert _check(path, capsys, "--sm", "12.0", "--driver", "580.65.06")[0] == 0
