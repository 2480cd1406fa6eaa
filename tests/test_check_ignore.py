"""``check --ignore GLOB``: an ignored file counts for nothing, neither its kernels nor
the CUDA runtime (and so the driver floor) it is a sign of, nor a failure to read it.

Through the CLI, on folders of nvcc-built fixtures (every subset of the files ignored,
against the rules over cuobjdump's lists: tests/compat_oracle.py) and on the real
bitsandbytes wheel, which ships one library per CUDA release and loads only one.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.cli import main
from tests.compat_oracle import (
    MINOR_COMPAT_FLOOR,
    cuobjdump_toolkits,
    driver_tuple,
    file_verdict,
    image_verdict,
)
from tests.conftest import CliRunner
from tests.cuobjdump import cuobjdump_lists, find_cuobjdump
from tests.fixtures.build import BIN
from tests.test_ldconfig import LOADER, ROOTED, WHICH_C, _place, _real, kit
from tests.test_loader_order import APP, NODE, STUB, _preload_root

__all__ = ["kit"]

pytestmark = pytest.mark.integration  # cuobjdump is the oracle

GPU = (9, 0)
HOPPER_FLOOR = (525, 60, 13)  # arch-profiles/sm_90.yaml min_driver
# in the folder as  ->  built fixture
CODE = {
    "usr/lib/libhopper_a.so": "libhopper_a.so",
    "usr/lib/libsass_sm80.so": "libsass_sm80.so",
}
CUDART = "usr/local/cuda/lib64/libcudart.so.12.4.127"  # a sign of CUDA 12.4 by its name
BROKEN = "opt/libbroken.so"  # libsass_ptx.so cut short: unreadable
ALL = (*CODE, CUDART, BROKEN)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ignore-tree")
    for at, name in CODE.items():
        (root / at).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(BIN / name, root / at)
    (root / CUDART).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(BIN / "libhost_only.so", root / CUDART)
    (root / BROKEN).parent.mkdir(parents=True, exist_ok=True)
    (root / BROKEN).write_bytes((BIN / "libsass_ptx.so").read_bytes()[:9000])
    return root


@pytest.fixture(scope="module")
def oracle() -> dict[str, tuple[str, set[tuple[int, int]]]]:
    """Per code file: its verdict on 9.0 and the releases that built it (cuobjdump)."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (the oracle of the fixtures' contents)")
    found = {}
    for at, name in CODE.items():
        sass, ptx = cuobjdump_lists(tool, BIN / name)
        found[at] = (file_verdict(sass, ptx, GPU), cuobjdump_toolkits(tool, BIN / name))
    return found


def _expected(
    kept: set[str], driver: str, oracle: dict[str, tuple[str, set[tuple[int, int]]]]
) -> tuple[bool, set[tuple[int, int]]]:
    """Pass or fail, and the releases the kept files are signs of."""
    code = [oracle[p] for p in CODE if p in kept]
    releases = {r for _, built in code for r in built} | ({(12, 4)} if CUDART in kept else set())
    floors = [HOPPER_FLOOR] + ([MINOR_COMPAT_FLOOR[max(releases)[0]]] if releases else [])
    runs = image_verdict(v for v, _ in code) != "none" and BROKEN not in kept
    return runs and driver_tuple(driver) >= max(floors), releases


@pytest.mark.parametrize("driver", ["550.54.15", "580.65.06"])
def test_every_subset_ignored_counts_for_nothing(
    cli: CliRunner, tree: Path, oracle: Any, driver: str
) -> None:
    """Every subset of the folder's files ignored (by exact path and by glob): the
    verdict, the files judged and the runtime's signs are those of the kept files
    alone. Before ignored files were left out of the runtime's signs, ignoring both
    13.0-built libraries still failed driver 550 on their CUDA 13.0 runtime."""
    for n in range(len(ALL) + 1):
        for ignored in itertools.combinations(ALL, n):
            kept = set(ALL) - set(ignored)
            args = [a for p in ignored for a in ("--ignore", f"*/{Path(p).name}")]
            r = cli("check", str(tree), "--sm", "9.0", "--driver", driver, "--allow-empty",
                    *args, "--json")  # fmt: skip
            doc = r.json()
            passes, releases = _expected(kept, driver, oracle)
            case = (ignored, driver, doc["problems"])
            assert r.code == (0 if passes else 1), case
            assert [f["path"] for f in doc["files"]] == [p for p in CODE if p in kept], case
            assert sorted(doc["ignored"]) == sorted(p for p in CODE if p not in kept), case
            sources = doc["cuda_runtime_sources"]
            assert {driver_tuple(s["version"]) for s in sources} == releases, case
            for s in sources:
                assert not any(Path(p).name in s["source"] for p in ignored), case
            text = " ".join(doc["problems"] + doc["warnings"])
            assert not any(Path(p).name in text for p in ignored), case


BNB = ("bitsandbytes", "0.50.2")
_BNB_CUDA = re.compile(r"libbitsandbytes_cuda(\d+)(\d)\.so$")


@pytest.mark.index
def test_bitsandbytes_one_cuda_library_kept(cli: CliRunner) -> None:
    """bitsandbytes ships libbitsandbytes_cudaXYZ.so for CUDA 11.8 to 13.2 and loads
    the one its CUDA runtime names (bitsandbytes/cextension.py). With one kept and the
    others ignored, the runtime's signs are that library's alone (its name says the
    release); with only the CUDA 12.6 one on driver 550.54.15 the check passes, which
    failed on the ignored cuda132 library's 13.2 runtime before."""
    from tests.wheels import extracted

    tree = extracted(*BNB)
    libs = sorted(p.name for p in (tree / "bitsandbytes").glob("libbitsandbytes_cuda*.so"))
    assert len(libs) == 7, libs
    for keep in libs:
        m = _BNB_CUDA.search(keep)
        assert m is not None
        others = [a for lib in libs if lib != keep for a in ("--ignore", f"*/{lib}")]
        r = cli("check", str(tree), "--sm", "9.0", "--driver", "550.54.15", *others, "--json")
        doc = r.json()
        assert [f["path"] for f in doc["files"]] == [f"bitsandbytes/{keep}"]
        assert len(doc["ignored"]) == 6
        signs = {s["version"] for s in doc["cuda_runtime_sources"]}
        assert signs <= {f"{m[1]}.{m[2]}"}, (keep, doc["cuda_runtime_sources"])
        major = int(m[1])
        # a 13.x library on R550 fails only on its own runtime's floor
        assert (r.code == 1) is (major >= 13 and bool(signs)), (keep, doc["problems"])
        if keep == "libbitsandbytes_cuda126.so":
            assert r.code == 0, doc["problems"]
            assert doc["targets"][0]["verdict"] == "native"


@pytest.mark.skipif(not ROOTED, reason="chroot needs root; gcc builds the stand-ins")
def test_an_ignored_programs_search_path_asks_for_no_libcuda(
    kit: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A program whose DT_RUNPATH names the CUDA toolkit's stubs folder maps the stub
    (glibc's loader, chrooted in the root, is the oracle), so check fails closed; the
    user who ignores that program (never run) is left with the image's CUDA program,
    which maps the node's driver through the cache: the search path counts for
    nothing, and the image passes. Before, the ignored program still failed it."""
    program = tmp_path / "run"
    (tmp_path / "run.c").write_text(WHICH_C)
    link = ["gcc", "-o", str(program), str(tmp_path / "run.c"),
            f"-Wl,--enable-new-dtags,-rpath,/{STUB}"]  # fmt: skip
    subprocess.run(link, check=True)
    image, oracle = tmp_path / "image", tmp_path / "oracle"
    for root in (image, oracle):
        _preload_root(root, kit)
        (root / NODE / "libcuda.so.600.10.01").unlink()
        (root / "opt/app").mkdir(parents=True)
        shutil.copy(program, root / "opt/app/run")
        (root / STUB / "libcuda.so.1").symlink_to("libcuda.so")
    _place(kit, "B", oracle / NODE / "libcuda.so.600.10.01")
    assert _real(oracle, program=(LOADER, "/opt/app/run")) == f"{STUB}/libcuda.so"
    assert _real(oracle, program=(LOADER, "/which")) == f"{NODE}/libcuda.so.600.10.01"
    shutil.copy(APP, image / "libapp.so")
    (image / "usr/local/cuda-13.1/lib64").mkdir(parents=True)
    (image / "usr/local/cuda-13.1/lib64/libcudart.so.13").write_bytes(b"runtime")
    args = ["check", f"dir:{image}", "--sm", "8.0", "--driver", "600.10.01", "--no-cache"]
    assert main([*args, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert any("DT_RPATH/DT_RUNPATH" in p for p in doc["problems"]), doc["problems"]
    assert main([*args, "--ignore", "/opt/app/*", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["problems"] == []
    assert "opt/app/run" not in json.dumps(doc["forward_compat"])
