"""A STAND-IN for ``python:3.11-slim``, for building buildmatrix's own image offline.

No base image can be pulled here, so one is assembled from this machine's Python: the
interpreter, its standard library (without tests, IDLE and Tk) and pip, at the same
paths as on the host (so its library search paths hold), the shared libraries they
load (found with ldd), and busybox as ``/bin/sh``. It runs what the real base runs
for buildmatrix: ``python3 -m pip install`` of wheels, then ``buildmatrix``.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

_SKIP = {
    "test",
    "tests",
    "idlelib",
    "tkinter",
    "turtledemo",
    "__pycache__",
    "site-packages",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
}
# Libraries the Debian base of python:3.11-slim has that wheels' extension modules load
# (rpds and other Rust or C++ extensions: libgcc_s, libstdc++).
_SYSTEM = (
    "libgcc_s.so.1",
    "libstdc++.so.6",
    "libz.so.1",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libutil.so.1",
    "libm.so.6",
)


def _system_libraries() -> set[Path]:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    found = set()
    for name in _SYSTEM:
        m = re.search(rf"^\s*{re.escape(name)} \(libc6,x86-64\) => (\S+)$", out, re.M)
        if m:
            found.add(Path(m[1]))
    return found


def _shared_libraries(paths: list[Path]) -> set[Path]:
    found: set[Path] = set()
    for path in paths:
        out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False)
        for line in out.stdout.splitlines():
            m = re.search(r"(/\S+)", line.split("=>")[-1])
            if m and Path(m[1]).exists():
                found.add(Path(m[1]))
    return found


def rootfs_tar() -> bytes:
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = Path(sysconfig.get_paths(vars={"base": str(prefix)})["stdlib"])
    executable = prefix / "bin" / version
    if not executable.exists():
        executable = Path(os.path.realpath(sys.executable))
    files: list[Path] = [executable]
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in _SKIP and not d.startswith("config-")]
        files += [Path(root) / n for n in names]
    import pip as pip_module

    pip = Path(str(pip_module.__file__)).parent
    pip_files = [
        Path(root) / n
        for root, _d, names in os.walk(pip)
        for n in names
        if "__pycache__" not in root
    ]
    # libpython, the loader and what the extension modules load, wherever ldd finds them
    libs = _shared_libraries([executable, *(f for f in files if f.suffix == ".so")])
    libs |= _system_libraries()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted({*files, *libs}):
            tar.add(str(os.path.realpath(path)), arcname=str(path).lstrip("/"), recursive=False)
        site = stdlib / "site-packages"
        for folder in ("tmp", str(site).lstrip("/"), "usr/local/bin", "bin"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        # pip lives in the site-packages of the image's Python, as in python:3.11-slim
        for path in pip_files:
            arc = site / "pip" / path.relative_to(pip)
            tar.add(str(path), arcname=str(arc).lstrip("/"), recursive=False)
        for name in ("python3", "python", version):
            info = tarfile.TarInfo(f"usr/local/bin/{name}")
            info.type, info.linkname = tarfile.SYMTYPE, str(executable)
            tar.addfile(info)
        busybox = shutil.which("busybox")
        if busybox is not None:
            tar.add(busybox, arcname="bin/busybox")
            for tool in ("sh", "sleep", "cat"):
                info = tarfile.TarInfo(f"bin/{tool}")
                info.type, info.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(info)
    return buf.getvalue()


def build(client: object, tag: str) -> str:
    """Build the stand-in base into the engine ``client`` talks to; returns ``tag``."""
    context = io.BytesIO()
    rootfs = rootfs_tar()
    # pip puts console scripts next to the interpreter, as /usr/local/bin in the real base
    scripts = Path(sys.base_prefix) / "bin"
    dockerfile = (
        f"FROM scratch\nADD rootfs.tar /\nENV PATH={scripts}:/usr/local/bin:/usr/bin:/bin\n"
    ).encode()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile), ("rootfs.tar", rootfs)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True)  # type: ignore[attr-defined]
    return tag
