"""A CUDA-tagged sibling is picked by the image's CUDA release, not by the GPU
(buildmatrix.optional.by_release).

bitsandbytes 0.50.2 ships libbitsandbytes_cudaXYZ.so for CUDA 11.8 to 13.2 and loads
one of them, by the CUDA release torch was built for, on every GPU. Only the 12.8 and
later ones hold sm_100 and sm_120 code, so an image on CUDA 12.6 has no bitsandbytes
kernel for a B200; taking the best sibling per GPU passed it. The oracle is the
wheel's own selection, ``get_cuda_bnb_library_path`` in bitsandbytes/cextension.py,
run from the wheel's source with the release given where torch would give it, and
cuobjdump's list of the library it picks; the image shows its release by a
``libcudart.so.X.Y`` file, as a CUDA toolkit installs one.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import CliRunner
from tests.cuobjdump import cuobjdump_lists, find_cuobjdump

pytestmark = [pytest.mark.integration, pytest.mark.index]

BNB = ("bitsandbytes", "0.50.2")
# The libcudart.so.X.Y files of each image: each names a release the image may run
# with (pip's libcudart.so.12 names none). Not 12.0 to 12.3, which pick the CUDA 12.1
# library: cuobjdump 13 cannot read its ELF.
CASES = (
    ("11.8",), ("12.4",), ("12.5",), ("12.6",), ("12.7",), ("12.8",), ("13.0",), ("13.1",),
    ("13.3",), ("14.0",), ("12.6", "12.8"), ("12.8", "12.9", "12"), ("12.8", "13.0"),
    ("12.8", "14.0"),
)  # fmt: skip
GPUS = ("7.0", "7.5", "8.0", "9.0", "10.0", "12.0")
_CHOOSERS = ("get_cuda_bnb_library_path", "_find_cuda_libs", "_split_cuda_version")


def _bnb_choice(package: Path, release: str) -> Path:
    """The library bitsandbytes' own code loads where torch.version.cuda is
    ``release``: its functions taken from the wheel's cextension.py."""
    tree = ast.parse((package / "cextension.py").read_text())
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in _CHOOSERS]
    assert sorted(f.name for f in funcs) == sorted(_CHOOSERS)
    for f in funcs:
        f.decorator_list = []
    major, minor = (int(x) for x in release.split("."))
    scope: dict[str, object] = {
        "torch": SimpleNamespace(version=SimpleNamespace(hip=None, cuda=release)),
        "os": os,
        "re": re,
        "Path": Path,
        "logger": logging.getLogger("bnb-oracle"),
        "PACKAGE_DIR": package,
        "DYNAMIC_LIBRARY_SUFFIX": ".so",
    }
    body: list[ast.stmt] = list(funcs)
    exec(compile(ast.Module(body=body, type_ignores=[]), "cextension.py", "exec"), scope)
    specs = SimpleNamespace(
        cuda_version_tuple=(major, minor), cuda_version_string=f"{major}{minor}"
    )
    chosen = scope["get_cuda_bnb_library_path"]
    assert callable(chosen)
    path = chosen(specs)
    assert isinstance(path, Path)
    return path


def _runs(sass: set[str], cc: str) -> bool:
    """sm_XY SASS runs on X.Z, Z >= Y (these libraries hold no PTX)."""
    major, minor = (int(x) for x in cc.split("."))
    return any(
        (int(m[1]), int(m[2])) == (major, min(minor, int(m[2]))) and int(m[2]) <= minor
        for m in (re.fullmatch(r"sm_(\d+)(\d)", a) for a in sass)
        if m is not None
    )


def test_the_library_the_release_picks_counts_on_every_gpu(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.wheels import extracted

    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump (pip nvidia-cuda-cuobjdump) is needed as the reference")
    monkeypatch.delenv("BNB_CUDA_VERSION", raising=False)
    package = extracted(*BNB) / "bitsandbytes"
    libs = sorted(package.glob("libbitsandbytes_cuda*.so"))
    assert len(libs) == 7, libs
    lists: dict[str, set[str]] = {}
    for lib in libs:
        if lib.name != "libbitsandbytes_cuda121.so":
            sass, ptx = cuobjdump_lists(tool, lib)
            assert not ptx
            lists[lib.name] = set(sass)
    failed = 0
    for case in CASES:
        releases = [r for r in case if "." in r]
        chosen = [_bnb_choice(package, r) for r in releases]
        assert all(c.name in lists or not c.exists() for c in chosen), chosen
        root = tmp_path / "-".join(case)
        (root / "bitsandbytes").mkdir(parents=True)
        for lib in libs:
            (root / "bitsandbytes" / lib.name).hardlink_to(lib)
        folder = root / "usr/local/cuda/lib64"
        folder.mkdir(parents=True)
        for release in case:
            (folder / f"libcudart.so.{release}").touch()
        args = ["check", f"dir:{root}", "--json"]
        for cc in GPUS:
            args += ["--sm", cc]
        doc = cli(*args).json()
        assert isinstance(doc, dict)
        got = {t["compute_capability"]: t["verdict"] for t in doc["targets"]}
        # Any release shown may be the one the package runs with: the worst of their
        # libraries counts; a release whose major bitsandbytes ships none for loads
        # nothing, and where none loads anything, the image fails.
        loaded = [lists[c.name] for c in chosen if c.exists()]
        want = {
            cc: "native" if loaded and all(_runs(sass, cc) for sass in loaded) else "none"
            for cc in GPUS
        }
        assert got == want, (case, [c.name for c in chosen], doc["loading"]["notes"])
        failed += "none" in want.values()
        shutil.rmtree(root)
    assert failed  # the releases before 12.8 have no code for 10.0
