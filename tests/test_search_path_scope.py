"""Whose ``DT_RUNPATH`` the loader reads for ``libcuda.so.1``: glibc ``elf/dl-load.c``
``_dl_map_object`` searches the ``DT_RUNPATH`` of the object that asks for the library
only (its own ``DT_NEEDED`` entries and its own ``dlopen`` calls, found by
``_dl_find_dso_for_object``); unlike ``DT_RPATH`` it is not passed to the objects it
loads, and another program's never counts. A stock file of a distribution with a
``DT_RUNPATH`` naming a folder the node's driver is mounted into (Debian 12's
coreutils ``/usr/bin/expr`` and ``/usr/bin/factor``: ``/usr/lib/x86_64-linux-gnu``)
must not fail an image whose CUDA program loads the compat driver through the cache.

Held to glibc's own ``ldconfig`` and loader chrooted in the root, as
tests/test_loader_order.py runs them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from buildmatrix.cli import main
from tests.test_ldconfig import LOADER, ROOTED, WHICH_C, _place, _real, kit
from tests.test_loader_order import APP, COMPAT_LIB, NODE, STUB, UUID, _preload_root

__all__ = ["kit"]
pytestmark = pytest.mark.skipif(not ROOTED, reason="chroot needs root; gcc builds the stand-ins")

NO_DLOPEN_C = "int main(void) { return 0; }\n"


def test_a_runpath_of_a_program_that_never_loads_libcuda_does_not_fail_the_image(
    kit: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The image's CUDA program (``/which``, no search path) maps the compat driver on a
    535 node; ``/usr/bin/expr`` (linked as Debian 12's coreutils is: DT_RUNPATH
    ``/usr/lib/x86_64-linux-gnu``, no libcuda, no dlopen) never asks for libcuda."""
    expr = tmp_path / "expr"
    (tmp_path / "expr.c").write_text(NO_DLOPEN_C)
    link = [
        "gcc",
        "-o",
        str(expr),
        str(tmp_path / "expr.c"),
        f"-Wl,--enable-new-dtags,-rpath,/{NODE}",
    ]
    subprocess.run(link, check=True)
    image, oracle = tmp_path / "image", tmp_path / "oracle"
    for root in (image, oracle):
        _preload_root(root, kit)
        (root / NODE / "libcuda.so.600.10.01").unlink()
        (root / "usr/bin").mkdir(parents=True, exist_ok=True)
        shutil.copy(expr, root / "usr/bin/expr")
    _place(kit, "B", oracle / NODE / "libcuda.so.535.104.05")
    (oracle / NODE / "libcuda.so.1").symlink_to("libcuda.so.535.104.05")
    (oracle / f"etc/ld.so.conf.d/00-compat-{UUID}.conf").write_text("/usr/local/cuda/compat\n")
    mapped = _real(oracle, program=(LOADER, "/which"))
    assert mapped == COMPAT_LIB  # the container uses the compat driver
    shutil.copy(APP, image / "libapp.so")
    (image / "usr/local/cuda-13.1/lib64").mkdir(parents=True)
    (image / "usr/local/cuda-13.1/lib64/libcudart.so.13").write_bytes(b"runtime")
    args = [
        "check",
        f"dir:{image}",
        "--sm",
        "8.0",
        "--driver",
        "535.104.05",
        "--no-cache",
        "--json",
    ]
    code = main(args)
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc["problems"]


@pytest.mark.parametrize("kind", ["--enable-new-dtags", "--disable-new-dtags"])
def test_a_search_path_of_a_program_not_built_as_pie_counts(
    kit: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A program linked ``-no-pie`` (ELF type ``ET_EXEC``) whose DT_RPATH/DT_RUNPATH names
    the CUDA toolkit's stubs folder, where a ``libcuda.so.1`` stands beside
    ``libcuda.so``: glibc's loader maps the stub whatever the container toolkit
    chooses, so check must fail, as it does for the same program built as PIE
    (tests/test_loader_order.py)."""
    program = tmp_path / "run"
    (tmp_path / "run.c").write_text(WHICH_C)
    link = [
        "gcc",
        "-no-pie",
        "-o",
        str(program),
        str(tmp_path / "run.c"),
        f"-Wl,{kind},-rpath,/{STUB}",
    ]
    subprocess.run(link, check=True)
    image, oracle = tmp_path / "image", tmp_path / "oracle"
    for root in (image, oracle):
        _preload_root(root, kit)
        (root / NODE / "libcuda.so.600.10.01").unlink()
        (root / "opt/app").mkdir(parents=True)
        shutil.copy(program, root / "opt/app/run")
        (root / STUB / "libcuda.so.1").symlink_to("libcuda.so")
    _place(kit, "B", oracle / NODE / "libcuda.so.600.10.01")
    mapped = _real(oracle, program=(LOADER, "/opt/app/run"))
    assert mapped == f"{STUB}/libcuda.so"  # the stub, not the node's driver
    shutil.copy(APP, image / "libapp.so")
    (image / "usr/local/cuda-13.1/lib64").mkdir(parents=True)
    (image / "usr/local/cuda-13.1/lib64/libcudart.so.13").write_bytes(b"runtime")
    args = ["check", f"dir:{image}", "--sm", "8.0", "--driver", "600.10.01", "--no-cache", "--json"]
    code = main(args)
    doc = json.loads(capsys.readouterr().out)
    assert code == 1, doc
    assert any("DT_RPATH/DT_RUNPATH" in p for p in doc["problems"]), doc["problems"]


BODIES = {
    "plain": "int main(void) { return 0; }\n",
    "dlopen": '#include <dlfcn.h>\nint main(void) { return dlopen("libcuda.so.1", 2) == 0; }\n',
    "dlsym": '#include <dlfcn.h>\nint main(void) { return dlsym(RTLD_DEFAULT, "x") == 0; }\n',
}


def _asks_per_readelf(path: Path) -> bool:
    """binutils' readelf: the file imports a dl* entry point that loads or finds by name,
    or has a DT_NEEDED of a libcuda."""
    dyn = subprocess.run(
        ["readelf", "-d", "-W", str(path)], check=True, capture_output=True, text=True
    ).stdout
    syms = subprocess.run(
        ["readelf", "--dyn-syms", "-W", str(path)], check=True, capture_output=True, text=True
    ).stdout
    imported = {
        line.split()[7].split("@")[0]
        for line in syms.splitlines()
        if " UND " in line and len(line.split()) > 7
    }
    needed = "Shared library: [libcuda" in dyn
    return needed or bool(imported & {"dlopen", "dlmopen", "dlsym", "dlvsym"})


@pytest.mark.parametrize("pie", ["-pie", "-no-pie"])
@pytest.mark.parametrize("body", sorted(BODIES))
@pytest.mark.parametrize("kind", ["--enable-new-dtags", "--disable-new-dtags"])
@pytest.mark.parametrize("needed", [False, True])
def test_the_search_paths_kept_for_libcuda_follow_glibcs_scope(
    kit: dict[str, Path], tmp_path: Path, pie: str, body: str, kind: str, needed: bool
) -> None:
    """Every DT_RPATH counts; a DT_RUNPATH only where readelf shows the file asking for a
    library by name itself (a dl* import, a DT_NEEDED of libcuda). Programs of both ELF
    types (PIE: ET_DYN, -no-pie: ET_EXEC) are read."""
    from buildmatrix.binary.dynamic import read_dso
    from buildmatrix.binary.source import BytesSource

    (tmp_path / "x.c").write_text(BODIES[body])
    path = tmp_path / "x"
    link = ["gcc", pie, "-o", str(path), str(tmp_path / "x.c"), f"-Wl,{kind},-rpath,/opt/s"]
    if needed:
        (tmp_path / "libcuda.so.1").symlink_to(kit["A"])
        link += [f"-L{tmp_path}", "-l:libcuda.so.1", "-Wl,--no-as-needed"]
        link.insert(1, "-Wl,--no-as-needed")
    subprocess.run(link, check=True)
    info = read_dso(BytesSource(path.read_bytes(), name="x"))
    assert info.search == ("/opt/s",)
    runpath = kind == "--enable-new-dtags"
    expected = ("/opt/s",) if not runpath or _asks_per_readelf(path) else ()
    assert info.libcuda_search == expected
