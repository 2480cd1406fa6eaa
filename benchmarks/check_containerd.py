"""Benchmark: ``buildmatrix check containerd:NAME`` against ``ctr images export``.

    sudo .venv/bin/python benchmarks/check_containerd.py [--gib 3] [--compression zstd]...
        [--workdir DIR]

Builds an image of about ``--gib`` GiB of real CUDA libraries (torch 2.14.1 and the
nvidia-* wheels, fetched as benchmarks/inspect_vs_cuobjdump.py does; the biggest
libraries first, one layer per wheel), once per ``--compression`` of the layers
containerd holds (``zstd``, the default, and ``gzip``: what registries serve;
``none``: what ``ctr images import`` keeps from a ``docker save`` archive), starts
a containerd of its own (tests/containerd_service.py), imports the image with ``ctr
images import`` (streamed as an OCI archive, never a second copy of the layout) and
measures, page cache warm, each as wall time and peak RSS (``os.wait4``; where
check's workers run, the larger of that and its process tree's summed Pss):

- ``buildmatrix check containerd:NAME --no-cache``: the name looked up, every blob
  hashed, every layer decompressed and parsed, device code read;
- the same with a warm layer cache (a second run): every blob's digest is vouched
  for by the cache entry of the same file (image/cache.py), nothing is read;
- ``ctr images export``, to /dev/null and to a file: containerd copying the same
  blobs into one tar, the least a tool that reads the image through ``ctr`` pays
  before it reads anything;
- the floor: every blob read (``cat``) or decompressed (``zstd -dc``, ``gzip -dc``)
  to /dev/null, one at a time and two at a time (``xargs -P2``, as check reads
  two layers at once).

Each image is removed (``ctr images rm --sync``, garbage collected) before the next
is built, so the disk holds one image and its archive at most (about twice its
blobs). Prints a Markdown table per compression. Needs root, containerd, zstd and
gzip. About 2 minutes per compression on an idle 2-core machine, several times that
on a loaded one. Nothing asserts on time.
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.inspect_vs_cuobjdump import Run, fetch  # noqa: E402
from tests.containerd_service import Containerd, start_containerd, stop_containerd  # noqa: E402

NAME = "bm-bench/cuda-libs"
MEDIA = "application/vnd.oci.image.layer.v1.tar"
SUFFIX = {"none": "", "gzip": "+gzip", "zstd": "+zstd"}
FLOOR = {"none": "cat", "gzip": "gzip -dc", "zstd": "zstd -dcq"}
# Linux counts the forked copy of the parent in a child's peak RSS (exec keeps the
# old mm's high-water mark, fs/exec.c exec_mmap), so each command is started by a
# small Python process rather than by this one.
# Where check reads layers in worker processes, the peak is that of its process tree:
# each process's proportional set size (Pss, /proc/PID/smaps_rollup: a page shared by
# a worker and the parent it was forked from counts once in all), summed, sampled
# every 20 ms; the larger of that and the command's own peak RSS is shown.
LAUNCHER = """
import os, subprocess, sys, threading, time

def tree_rss(pid):
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next(int(l.split()[1]) for l in f if l.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
    return total

start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
peak, done = [0], threading.Event()
def sample():
    while not done.wait(0.02):
        peak[0] = max(peak[0], tree_rss(proc.pid))
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
_, status, usage = os.wait4(proc.pid, 0)
seconds = time.perf_counter() - start
done.set()
sampler.join()
print(seconds, max(usage.ru_maxrss, peak[0]), os.waitstatus_to_exitcode(status))
"""


def measure(cmd: list[str], *, runs: int = 1) -> Run:
    """The fastest of ``runs``: wall time and the peak RSS of ``cmd`` (os.wait4)."""
    best: Run | None = None
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-S", "-c", LAUNCHER, *cmd], capture_output=True, text=True, check=True
        )
        out = done.stdout.split()
        if int(out[2]) not in (0, 1):  # check's 1 is a verdict; anything else is a failure
            raise RuntimeError(f"{cmd[:6]} exited {out[2]}: {done.stderr[-600:]}")
        run = Run(float(out[0]), int(out[1]) / 1024, b"")
        best = run if best is None or run.seconds < best.seconds else best
    assert best is not None
    return best


class _Tee(io.RawIOBase):
    """What tarfile writes: hashed uncompressed (the diff_id), then to the sink."""

    def __init__(self, sink: Callable[[bytes], object]) -> None:
        super().__init__()
        self.sink, self.sha = sink, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.sha.update(data)
        self.sink(bytes(data))
        return len(data)


def _layer(files: list[Path], wheel: str, scratch: Path, compression: str) -> tuple[Path, str]:
    """One layer streamed to a file (never whole in memory): (file, diff_id)."""
    path = scratch / f"{wheel}.layer"
    with path.open("wb") as out:
        closer: Callable[[], object] = lambda: None  # noqa: E731
        sink: Callable[[bytes], object] = out.write
        if compression == "gzip":
            gz = gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0)
            sink, closer = gz.write, gz.close
        elif compression == "zstd":
            import zstandard

            zw = zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False)
            sink, closer = zw.write, zw.close
        tee = _Tee(sink)
        with tarfile.open(fileobj=tee, mode="w|") as tar:
            for f in files:
                tar.add(f, arcname=f"usr/local/lib/{wheel}/{f.name}", recursive=False)
        closer()
    return path, f"sha256:{tee.sha.hexdigest()}"


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(4 << 20):
            sha.update(chunk)
    return f"sha256:{sha.hexdigest()}"


def _add(tar: tarfile.TarFile, name: str, data: bytes | Path) -> None:
    if isinstance(data, Path):
        tar.add(data, arcname=name, recursive=False)
        return
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _put(tar: tarfile.TarFile, doc: dict[str, Any], media: str) -> dict[str, Any]:
    body = json.dumps(doc).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    _add(tar, f"blobs/sha256/{digest[7:]}", body)
    return {"mediaType": media, "digest": digest, "size": len(body)}


def build_archive(
    by_wheel: dict[str, list[Path]], scratch: Path, archive: Path, compression: str
) -> list[dict[str, Any]]:
    """An OCI archive of one layer per wheel (two built at a time); each layer file is
    deleted once it is in the archive. Returns the layers' descriptors."""
    with ThreadPoolExecutor(2) as pool:  # zlib and zstd release the GIL
        built = list(
            pool.map(lambda kv: _layer(kv[1], kv[0], scratch, compression), by_wheel.items())
        )
    layers: list[dict[str, Any]] = []
    diff_ids = [diff_id for _, diff_id in built]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    with tarfile.open(archive, "w") as tar:
        _add(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        for path, _ in built:
            digest, size = _digest(path), path.stat().st_size
            _add(tar, f"blobs/sha256/{digest[7:]}", path)
            path.unlink()
            media = MEDIA + SUFFIX[compression]
            layers.append({"mediaType": media, "digest": digest, "size": size})
        config_desc = _put(tar, config, "application/vnd.oci.image.config.v1+json")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": layers,
        }
        entry = _put(tar, manifest, "application/vnd.oci.image.manifest.v1+json")
        entry["annotations"] = {"org.opencontainers.image.ref.name": compression}
        _add(tar, "index.json", json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode())
    return layers


def bench(
    ctd: Containerd, compression: str, base: Path, layers: list[dict[str, Any]]
) -> list[tuple[str, Run]]:
    image = f"{NAME}:{compression}"
    env = ["env", *(f"{k}={v}" for k, v in ctd.env().items())]
    check = [*env, sys.executable, "-m", "buildmatrix", "check", f"containerd:{image}"]
    check += ["--sm", "sm_90", "--allow-empty", "--json"]
    export = ["ctr", "-a", ctd.address, "-n", "k8s.io", "images", "export"]
    store = ctd.root / "io.containerd.content.v1.content/blobs/sha256"
    blobs = [str(store / str(layer["digest"])[7:]) for layer in layers]
    floor = FLOOR[compression]
    serial = ["sh", "-c", f"for f in {' '.join(blobs)}; do {floor} $f >/dev/null; done"]
    two = ["sh", "-c", f"printf '%s\\n' {' '.join(blobs)} | xargs -P2 -n1 {floor} >/dev/null"]
    measure(["sh", "-c", f"cat {' '.join(blobs)} > /dev/null"])  # page cache warm
    cache = base / "cache"
    rows = [
        ("`check containerd:` (--no-cache)", measure([*check, "--no-cache"])),
        ("`ctr images export` to /dev/null", measure([*export, "/dev/null", image])),
        ("`ctr images export` to a file", measure([*export, str(base / "out.tar"), image])),
    ]
    (base / "out.tar").unlink(missing_ok=True)
    measure([*check, "--cache", str(cache)])  # fills the cache
    rows.append(
        ("`check containerd:` (warm layer cache)", measure([*check, "--cache", str(cache)]))
    )
    shutil.rmtree(cache, ignore_errors=True)
    rows.append((f"`{floor}` every blob, one at a time (floor)", measure(serial)))
    rows.append((f"`{floor}` every blob, two at a time (floor)", measure(two)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/buildmatrix-bench"))
    parser.add_argument("--gib", type=float, default=3.0, help="image size (uncompressed)")
    parser.add_argument("--compression", action="append", choices=sorted(SUFFIX))
    args = parser.parse_args()
    libs = fetch(args.workdir, None)
    by_wheel: dict[str, list[Path]] = {}
    total = 0
    for lib in sorted(libs, key=lambda p: -p.stat().st_size):  # the biggest libraries first
        if total >= args.gib * 2**30:
            break
        by_wheel.setdefault(lib.relative_to(args.workdir / "lib").parts[0], []).append(lib)
        total += lib.stat().st_size
    base = Path(tempfile.mkdtemp(prefix="bm-ctd-bench-", dir="/tmp"))
    proc, ctd = start_containerd(base)
    try:
        count = sum(len(v) for v in by_wheel.values())
        print(f"Image: {count} libraries from {len(by_wheel)} wheels, {total / 2**30:.2f} GiB.")
        for compression in args.compression or ["zstd"]:
            archive = base / "oci.tar"
            layers = build_archive(by_wheel, base, archive, compression)
            size = sum(int(layer["size"]) for layer in layers)
            ctd.ctr("images", "import", "--no-unpack", "--base-name", NAME, str(archive))
            archive.unlink()
            rows = bench(ctd, compression, base, layers)
            ctd.ctr("images", "rm", "--sync", f"{NAME}:{compression}")
            ours = rows[0][1].seconds
            print(f"\n{compression} layers: {size / 2**30:.2f} GiB of blobs\n")
            print("| what | seconds | peak RSS MiB | ÷ check --no-cache |")
            print("|---|---:|---:|---:|")
            for label, run in rows:
                print(
                    f"| {label} | {run.seconds:.2f} | {run.max_rss_mb:.0f} "
                    f"| {run.seconds / ours:.2f} |"
                )
            sys.stdout.flush()
    finally:
        stop_containerd(proc)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
