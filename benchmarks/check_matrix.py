"""Benchmark: checking a matrix of variants that share a large base, in one run.

    .venv/bin/python benchmarks/check_matrix.py [--workdir DIR] [--variants 6]

Builds OCI layouts of VARIANTS images that share one base layer (the torch 2.14.1 and
nvidia-* CUDA libraries of benchmarks/inspect_vs_cuobjdump.py, ~3 GiB, as a plain tar
layer) and differ in a small top layer, then measures in one run, each a fresh
process, page cache warm:

- ``check`` of one variant, empty layer cache (what one image costs);
- ``check`` of all variants in one call, empty cache (the matrix);
- the same call again, the cache filled by the previous one (a later CI run);
- ``check`` of each variant on its own with ``--no-cache`` (what it cost before).

Prints a Markdown table with each time as a multiple of the single check and each
run's peak RSS (the largest process for the separate runs). Nothing here asserts on
time.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.inspect_vs_cuobjdump import fetch  # noqa: E402
from tests.images import Image, fixture, write_oci_layout  # noqa: E402

LIBS = ["libhopper_a.so", "libmulti.so", "libsass_ptx.so", "libtwo.so", "libsass_sm80.so"]


def _base_tar(libs: list[Path], out: Path) -> None:
    with tarfile.open(out, "w") as tar:
        for lib in libs:
            tar.add(lib, arcname=f"usr/lib/python3/dist-packages/{lib.parent.name}/{lib.name}")


def _digest(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"


def _layout(folder: Path, base: Path, digest: str, index: int) -> Path:
    """An OCI layout whose first layer is the (shared) base blob."""
    lib = LIBS[index % len(LIBS)]
    image = Image(
        layers=[{"app/placeholder": b"x"}, {f"app/lib{index}.so": fixture(lib)}],
        labels={"io.buildmatrix.family": "hopper"},
    )
    write_oci_layout(folder, image, compress=False)
    # swap the placeholder layer for the base: same blob in every variant
    import hashlib
    import json

    blob = folder / "blobs" / "sha256" / digest.split(":")[1]
    if not blob.exists():
        blob.hardlink_to(base)
    index_doc = json.loads((folder / "index.json").read_text())
    manifest_path = folder / "blobs" / "sha256" / index_doc["manifests"][0]["digest"][7:]
    manifest = json.loads(manifest_path.read_text())
    config_path = folder / "blobs" / "sha256" / manifest["config"]["digest"][7:]
    config = json.loads(config_path.read_text())
    manifest["layers"][0]["digest"] = digest
    manifest["layers"][0]["size"] = base.stat().st_size
    config["rootfs"]["diff_ids"][0] = digest
    config_bytes = json.dumps(config).encode()
    config_digest = hashlib.sha256(config_bytes).hexdigest()
    (folder / "blobs" / "sha256" / config_digest).write_bytes(config_bytes)
    manifest["config"]["digest"] = f"sha256:{config_digest}"
    manifest["config"]["size"] = len(config_bytes)
    manifest_bytes = json.dumps(manifest).encode()
    manifest_digest = hashlib.sha256(manifest_bytes).hexdigest()
    (folder / "blobs" / "sha256" / manifest_digest).write_bytes(manifest_bytes)
    index_doc["manifests"][0]["digest"] = f"sha256:{manifest_digest}"
    index_doc["manifests"][0]["size"] = len(manifest_bytes)
    (folder / "index.json").write_text(json.dumps(index_doc))
    return folder


def _time(args: list[str]) -> tuple[float, float]:
    """Wall time and peak RSS (MiB) of one ``buildmatrix check`` process."""
    import os

    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "buildmatrix", "check", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, _, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - start, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/buildmatrix-bench"))
    parser.add_argument("--variants", type=int, default=6)
    args = parser.parse_args()
    libs = fetch(args.workdir, None)
    work = Path(tempfile.mkdtemp(prefix="bm-matrix-", dir=args.workdir))
    try:
        base = work / "base.tar"
        _base_tar(libs, base)
        digest = _digest(base)
        refs = [f"oci:{_layout(work / f'v{i}', base, digest, i)}" for i in range(args.variants)]
        subprocess.run(["cat", str(base)], stdout=subprocess.DEVNULL, check=True)  # warm
        size = base.stat().st_size / 2**30
        cache = work / "cache"
        one = _time([refs[0], "--cache", str(work / "cache-one")])
        matrix = _time([*refs, "--cache", str(cache)])
        again = _time([*refs, "--cache", str(cache)])
        alone = [_time([r, "--no-cache"]) for r in refs]
        separate = (sum(t for t, _ in alone), max(m for _, m in alone))
        print(f"{args.variants} variants sharing a {size:.2f} GiB base layer\n")
        print("| run | time (s) | vs one image | peak RSS (MiB) |")
        print("| --- | ---: | ---: | ---: |")
        for name, (t, rss) in (
            ("one variant, empty cache", one),
            (f"all {args.variants} in one call, empty cache", matrix),
            (f"all {args.variants} in one call, cache filled", again),
            (f"each of the {args.variants} on its own, --no-cache", separate),
        ):
            print(f"| {name} | {t:.1f} | {t / one[0]:.2f}x | {rss:.0f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
