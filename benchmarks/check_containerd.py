"""Benchmark: ``buildmatrix check containerd:NAME`` against ``ctr images export``.

    sudo .venv/bin/python benchmarks/check_containerd.py [--only cufft]... [--workdir DIR]

Builds an OCI image of CUDA libraries (torch 2.14.1 and the nvidia-* wheels, fetched
as benchmarks/inspect_vs_cuobjdump.py does; one gzip layer per wheel, as a registry
serves them), starts a containerd of its own (tests/containerd_service.py), imports
the image with ``ctr images import``, and measures with the page cache warm:

- ``buildmatrix check containerd:NAME --no-cache``: name lookup, every blob hashed,
  every layer gunzipped and parsed, device code read;
- ``ctr images export FILE NAME``: containerd copying the same blobs into one tar,
  the least a tool that reads the image through ``ctr`` does before reading anything;
- ``gzip -dc`` of every layer blob to /dev/null: the decompression floor any reader
  of these layers pays.

Prints a Markdown table: wall time and peak RSS (``os.wait4``) of each. Needs root
and containerd.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.inspect_vs_cuobjdump import WHEELS, Run, fetch  # noqa: E402
from tests.containerd_service import start_containerd, stop_containerd  # noqa: E402

NAME = "bm-bench/cuda-libs:containerd"
# Linux counts the forked copy of the parent in a child's peak RSS (exec keeps the
# old mm's high-water mark, fs/exec.c exec_mmap), so each command is started by a
# small Python process rather than by this one, which held the image being built.
LAUNCHER = """
import os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(time.perf_counter() - start, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def measure(cmd: list[str]) -> Run:
    """Wall time and the peak RSS of ``cmd`` alone (os.wait4 in a small launcher)."""
    done = subprocess.run(
        [sys.executable, "-S", "-c", LAUNCHER, *cmd], capture_output=True, text=True, check=True
    )
    out = done.stdout.split()
    if int(out[2]) not in (0, 1):  # check's 1 is a verdict; anything else is a failure
        raise RuntimeError(f"{cmd[:6]} exited {out[2]}: {done.stderr[-600:]}")
    return Run(float(out[0]), int(out[1]) / 1024, b"")


def _put(blobs: Path, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (blobs / digest[7:]).write_bytes(data)
    return digest


class _Tee(io.RawIOBase):
    """What tarfile writes: hashed uncompressed (the diff_id), then gzipped to a file."""

    def __init__(self, gz: gzip.GzipFile) -> None:
        super().__init__()
        self.gz, self.sha = gz, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.sha.update(data)
        return self.gz.write(data)


def _gzip_layer(files: list[Path], wheel: str, blobs: Path) -> tuple[dict[str, Any], str]:
    """One gzip layer streamed to the blob folder (never whole in memory)."""
    scratch = blobs / "layer.tmp"
    with (
        scratch.open("wb") as out,
        gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0) as gz,
    ):
        tee = _Tee(gz)
        with tarfile.open(fileobj=tee, mode="w|") as tar:
            for f in files:
                tar.add(f, arcname=f"usr/local/lib/{wheel}/{f.name}", recursive=False)
    sha = hashlib.sha256()
    with scratch.open("rb") as blob:
        while chunk := blob.read(1 << 20):
            sha.update(chunk)
    scratch.rename(blobs / sha.hexdigest())
    desc = {
        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        "digest": f"sha256:{sha.hexdigest()}",
        "size": (blobs / sha.hexdigest()).stat().st_size,
    }
    return desc, f"sha256:{tee.sha.hexdigest()}"


def build_layout(libs: list[Path], workdir: Path, layout: Path) -> int:
    """One gzip layer per wheel folder under workdir/lib; returns the layers' bytes."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layers: list[dict[str, Any]] = []
    diff_ids = []
    by_wheel: dict[str, list[Path]] = {}
    for lib in libs:
        by_wheel.setdefault(lib.relative_to(workdir / "lib").parts[0], []).append(lib)
    for wheel, files in sorted(by_wheel.items()):
        desc, diff_id = _gzip_layer(files, wheel, blobs)
        layers.append(desc)
        diff_ids.append(diff_id)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["CUDA_VERSION=13.0.0"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _put(blobs, config),
                "size": len(config),
            },
            "layers": layers,
        }
    ).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": _put(blobs, manifest),
                "size": len(manifest),
                "annotations": {"org.opencontainers.image.ref.name": "containerd"},
            }
        ],
    }
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps(index))
    return sum(int(layer["size"]) for layer in layers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/buildmatrix-bench"))
    parser.add_argument("--only", action="append", choices=sorted(WHEELS))
    args = parser.parse_args()
    libs = fetch(args.workdir, set(args.only) if args.only else None)
    base = Path(tempfile.mkdtemp(prefix="bm-ctd-bench-", dir="/tmp"))
    proc, ctd = start_containerd(base)
    try:
        layout = base / "oci"
        size = build_layout(libs, args.workdir, layout)
        archive = base / "oci.tar"
        with tarfile.open(archive, "w") as tar:
            for path in sorted(layout.rglob("*")):
                tar.add(path, arcname=str(path.relative_to(layout)), recursive=False)
        shutil.rmtree(layout)
        ctd.ctr(
            "images",
            "import",
            "--no-unpack",
            "--base-name",
            NAME.split(":", maxsplit=1)[0],
            str(archive),
        )
        archive.unlink()
        env = ["env", *(f"{k}={v}" for k, v in ctd.env().items())]
        check = [*env, sys.executable, "-m", "buildmatrix", "check", f"containerd:{NAME}"]
        check += ["--sm", "sm_90", "--no-cache", "--allow-empty", "--json"]
        export = ["ctr", "-a", ctd.address, "-n", "k8s.io", "images", "export"]
        blobs = sorted((ctd.root / "io.containerd.content.v1.content/blobs/sha256").iterdir())
        gunzip = [
            "sh",
            "-c",
            f"for f in {' '.join(map(str, blobs))}; do gzip -dc $f 2>/dev/null; done",
        ]
        measure(["sh", "-c", f"cat {' '.join(map(str, blobs))} > /dev/null"])  # warm
        rows = []
        for label, cmd in (
            ("`buildmatrix check containerd:` (--no-cache)", check),
            ("`ctr images export` to a file", [*export, str(base / "out.tar"), NAME]),
            ("`ctr images export` to /dev/null", [*export, "/dev/null", NAME]),
            ("`gzip -dc` every blob (floor)", gunzip),
        ):
            run = min((measure(cmd) for _ in range(2)), key=lambda r: r.seconds)
            rows.append((label, run))
            (base / "out.tar").unlink(missing_ok=True)
        ours = rows[0][1].seconds
        print(f"Image: {len(libs)} libraries, {size / 2**30:.2f} GiB of gzip layers ({NAME}).\n")
        print("| what | seconds | peak RSS MiB | export / check |")
        print("|---|---:|---:|---:|")
        for label, run in rows:
            print(
                f"| {label} | {run.seconds:.2f} | {run.max_rss_mb:.0f} | {run.seconds / ours:.2f} |"
            )
    finally:
        stop_containerd(proc)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
