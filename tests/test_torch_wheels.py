"""inspect against cuobjdump on real third-party CUDA libraries: the torch and
torchvision wheels from the configured package index (``pip download``).

Skipped only when the wheels cannot be had. ``libtorch_cuda.so`` is ~500 MB and
cuobjdump needs ~20 s and ~5.7 GB of memory on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from buildmatrix.binary.fatbin import EntryKind
from buildmatrix.binary.scan import inspect_file
from tests.cuobjdump import cuobjdump_lists, find_cuobjdump

pytestmark = [pytest.mark.integration, pytest.mark.index]

WHEELS = {"torch": "2.14.1", "torchvision": "0.29.1"}
LIBRARIES = {
    "torch": ["torch/lib/libtorch_cuda_linalg.so", "torch/lib/libtorch_cuda.so"],
    "torchvision": ["torchvision/_C_stable.so", "torchvision.libs/libnvjpeg.*.so.13"],
}


def download(name: str, version: str, dest: Path) -> Path:
    """``pip download --no-deps name==version``; skip the test if the index lacks it."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "-q",
            "-d",
            str(dest),
            f"{name}=={version}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    wheels = sorted(dest.glob(f"{name.replace('-', '_')}-{version}-*.whl"))  # wheel names
    if proc.returncode != 0 or not wheels:
        pytest.skip(f"{name}=={version} cannot be downloaded here: {proc.stderr.strip()[-300:]}")
    return wheels[0]


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wheels")
    found: dict[str, Path] = {}
    for name, version in WHEELS.items():
        wheel = download(name, version, root)
        with zipfile.ZipFile(wheel) as zf:
            for pattern in LIBRARIES[name]:
                members = [m for m in zf.namelist() if Path(m).match(pattern)]
                assert members, f"{pattern} is not in {wheel.name}"
                found[Path(members[0]).name] = Path(zf.extract(members[0], root / "x"))
        wheel.unlink()  # the extracted libraries are all the tests need
    return found


def _ours(path: Path) -> tuple[Counter[str], Counter[str]]:
    report = inspect_file(path)
    assert report is not None, f"{path.name} has no device code?"
    sass = Counter(
        str(e.arch).removesuffix("f") for e in report.entries if e.kind is EntryKind.SASS
    )
    ptx = Counter(str(e.arch) for e in report.entries if e.kind is EntryKind.PTX)
    return sass, ptx


@pytest.mark.parametrize(
    "name", ["libtorch_cuda_linalg.so", "_C_stable.so", "libnvjpeg", "libtorch_cuda.so"]
)
def test_agrees_with_cuobjdump(libraries: dict[str, Path], name: str) -> None:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    path = next(p for n, p in libraries.items() if n.startswith(name))
    ours = _ours(path)
    assert ours == cuobjdump_lists(tool, path)
    assert sum(ours[0].values()) > 0


def test_libtorch_cuda_contents(libraries: dict[str, Path]) -> None:
    """What a user asks: which GPUs can torch 2.14.1's CUDA build run on natively?"""
    report = inspect_file(libraries["libtorch_cuda.so"])
    assert report is not None
    assert {"sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"} <= set(report.sass)
    assert len(report.entries) > 2000


@pytest.mark.parametrize("sm", ["8.0", "8.6", "9.0", "10.0", "12.0"])
def test_libtorch_cuda_passes_per_translation_unit(
    libraries: dict[str, Path], sm: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """All 475 containers count; torch's specialised ones (sm_90a, sm_100a/sm_103f,
    sm_120a, sm_121a, sm_89) are reported, not failed, where they have no code."""
    from buildmatrix.cli import main

    code = main(["check", str(libraries["libtorch_cuda.so"]), "--sm", sm, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc["problems"]
    assert doc["targets"][0]["verdict"] == "native"
    strict = main(["check", str(libraries["libtorch_cuda.so"]), "--sm", sm, "--strict"])
    capsys.readouterr()
    # Every container holds sm_75..sm_120: even counting all, these GPUs run natively.
    assert strict == 0
