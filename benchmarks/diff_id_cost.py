"""Benchmark: what checking layers against their diff_ids costs, one commit against
another, on the paths it touches, beside the floors of that check.

    .venv/bin/python benchmarks/diff_id_cost.py --before /path/to/old/checkout \
        [--libs torch,cublas,cufft] [--runs 3] [--workdir DIR]

Builds the CUDA libraries of the named wheels (the corpus of
benchmarks/inspect_vs_cuobjdump.py) into three images: a ``docker save`` archive
with them as one layer (read in place, its candidates by worker processes), the
same with one layer per library (layers read two at a time, each in place in this
process, its hash on a thread beside it) and an OCI layout with one gzip layer
(streamed). Then runs ``buildmatrix check --sm 9.0 --no-cache --json`` on each, a
fresh process per run, runs interleaved, best of ``--runs``, with:

- **before**: the ``--before`` checkout (one from before the check existed);
- **unverified**: this checkout with the check taken out (each layer's diff_id
  dropped before it is read: a measuring aid only), so that what the check costs
  is told apart from what other changes since ``--before`` cost;
- **after**: this checkout as it is;

and, in this process, the floors of the check: reading the layer's bytes once
(in place: ``pread`` from the page cache; gzip: decompressing the blob with ISA-L,
which the stream reader does anyway) and SHA-256 over them on one core (what
hashing costs at the least, in CPU; beside a free core it need not add to the
wall). Wall time and CPU time (the process and its workers; the steadier figure on
a shared machine) are printed as a Markdown table, with ratios. Nothing here
asserts on time.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.inspect_vs_cuobjdump import fetch  # noqa: E402


def _sha_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _add(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    out.addfile(info, io.BytesIO(data))


def _layer(work: Path, name: str, libs: list[Path]) -> Path:
    layer = work / name
    with tarfile.open(layer, "w") as tar:
        for lib in libs:
            tar.add(lib, arcname=f"usr/lib/{lib.name}")
    return layer


def _config(layers: list[Path]) -> tuple[str, bytes]:
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": {"io.buildmatrix.family": "hopper"}},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha_file(p)}" for p in layers]},
        }
    ).encode()
    return hashlib.sha256(config).hexdigest() + ".json", config


def _docker_archive(archive: Path, layers: list[Path]) -> Path:
    """A ``docker save`` archive of ``layers`` (plain tars, in order)."""
    config_name, config = _config(layers)
    names = [f"l{i}/layer.tar" for i in range(len(layers))]
    with tarfile.open(archive, "w") as out:
        _add(out, config_name, config)
        for layer, name in zip(layers, names, strict=True):
            out.add(layer, arcname=name)
        manifest = [{"Config": config_name, "RepoTags": ["bench/c:v"], "Layers": names}]
        _add(out, "manifest.json", json.dumps(manifest).encode())
    return archive


def build(work: Path, libs: list[Path]) -> tuple[Path, Path, Path, Path]:
    """The docker-archive files (one layer of ``libs``; one layer per library), the
    OCI layout with ``libs`` as one gzip layer, and that layer's gzip blob."""
    each = [_layer(work, f"layer{i}.tar", [lib]) for i, lib in enumerate(libs)]
    layered = _docker_archive(work / "layered.tar", each)
    for p in each:
        p.unlink()
    layer = _layer(work, "layer.tar", libs)
    _, config = _config([layer])
    archive = _docker_archive(work / "image.tar", [layer])
    oci = work / "oci"
    shutil.rmtree(oci, ignore_errors=True)  # no blobs of an earlier run
    blobs = oci / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    from isal import igzip

    gz = work / "layer.tar.gz"
    with layer.open("rb") as src, igzip.open(gz, "wb", compresslevel=1) as dst:  # type: ignore[no-untyped-call]
        while chunk := src.read(8 << 20):
            dst.write(chunk)
    layer_digest = _sha_file(gz)
    layer_size = gz.stat().st_size
    gz.rename(blobs / layer_digest)

    def put(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}"

    manifest_doc = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": put(config),
            "size": len(config),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": f"sha256:{layer_digest}",
                "size": layer_size,
            }
        ],
    }
    body = json.dumps(manifest_doc).encode()
    (oci / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    desc = {
        "mediaType": manifest_doc["mediaType"],
        "digest": put(body),
        "size": len(body),
        "annotations": {"org.opencontainers.image.ref.name": "v1"},
    }
    (oci / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    layer.unlink()
    return archive, layered, oci, blobs / layer_digest


CHECK = ["--sm", "9.0", "--no-cache", "--json"]
# The check taken out: each layer read with no diff_id (a measuring aid, run from
# this checkout only).
UNVERIFIED = """
import dataclasses, sys
from buildmatrix.image import layer_scan
read = layer_scan.scan_blob
layer_scan.scan_blob = lambda blob, *a, **k: read(dataclasses.replace(blob, diff_id=None), *a, **k)
from buildmatrix.cli import main
sys.exit(main())
"""
RUNS = {
    "before": ["-m", "buildmatrix"],
    "unverified": ["-c", UNVERIFIED],
    "after": ["-m", "buildmatrix"],
}


def measure(checkout: Path, how: list[str], source: str) -> tuple[float, float]:
    """Wall and CPU seconds (the process and its workers) of one check."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *how, "check", source, *CHECK],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{checkout}: check {source} failed: {done.stderr[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _regions(archive: Path) -> list[tuple[int, int]]:
    """Where each layer of a docker-archive file lies: (offset, size)."""
    with tarfile.open(archive) as tar:
        return [(m.offset_data, m.size) for m in tar if m.name.endswith("/layer.tar")]


def floor(
    path: Path, regions: list[tuple[int, int]] | None, *, hashed: bool
) -> tuple[float, float]:
    """Wall and CPU seconds, in this process, of reading the layers' bytes once —
    ``regions`` of ``path`` with ``pread``, or (None) the gzip blob ``path``
    decompressed — and with ``hashed``, SHA-256 over them on this one core."""
    from isal import igzip

    digest = hashlib.sha256()
    view = memoryview(bytearray(4 << 20))
    cpu, start = time.process_time(), time.perf_counter()
    with path.open("rb") as f:
        if regions is None:
            with igzip.IGzipFile(fileobj=f, mode="rb") as gz:  # type: ignore[no-untyped-call]
                while n := gz.readinto(view):
                    if hashed:
                        digest.update(view[:n])
        for offset, size in regions or []:
            at, end = offset, offset + size
            while at < end:
                n = os.preadv(f.fileno(), [view[: min(len(view), end - at)]], at)
                if hashed:
                    digest.update(view[:n])
                at += n
    return time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", type=Path, required=True, help="the checkout to compare to")
    parser.add_argument("--libs", default="cublas,cufft,torch")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/buildmatrix-bench/diff-id"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    libs = [
        p
        for p in fetch(args.workdir, set(args.libs.split(",")))
        if p.is_file() and p.stat().st_size > 5 << 20
    ]
    archive, layered, oci, blob = build(args.workdir, libs)
    size = sum(p.stat().st_size for p in libs) / 2**30
    print(f"corpus: {len(libs)} libraries, {size:.2f} GiB", flush=True)
    sources = {
        "`docker-archive:`, one layer, read in place (workers)": (
            f"docker-archive:{archive}",
            archive,
            _regions(archive),
        ),
        f"`docker-archive:`, {len(libs)} layers, read in place (two at a time)": (
            f"docker-archive:{layered}",
            layered,
            _regions(layered),
        ),
        "`oci:` layout, one gzip layer, streamed": (f"oci:{oci}:v1", blob, None),
    }
    checkouts = {"before": args.before.resolve(), "unverified": REPO, "after": REPO}
    best: dict[tuple[str, str], tuple[float, float]] = {}

    def keep(key: tuple[str, str], wall: float, cpu: float) -> None:
        old = best.get(key, (1e9, 1e9))
        best[key] = (min(old[0], wall), min(old[1], cpu))

    for _ in range(args.runs):  # interleaved: the machine's load hits all alike
        for label, (source, path, regions) in sources.items():
            for which, checkout in checkouts.items():
                keep((label, which), *measure(checkout, RUNS[which], source))
            keep((label, "read"), *floor(path, regions, hashed=False))
            keep((label, "read + SHA-256"), *floor(path, regions, hashed=True))
    columns = [*checkouts, "after ÷ before", "after ÷ unverified", "read", "read + SHA-256"]
    for i, what in ((0, "wall"), (1, "CPU")):
        print(f"\n{what} (s): | source | " + " | ".join(columns) + " |")
        print("| --- |" + " ---: |" * len(columns))
        for label in sources:
            b, u, a = (best[(label, w)][i] for w in checkouts)
            floors = [best[(label, w)][i] for w in ("read", "read + SHA-256")]
            cells = [f"{b:.2f}", f"{u:.2f}", f"{a:.2f}", f"{a / b:.2f}", f"{a / u:.2f}"]
            cells += [f"{x:.2f}" for x in floors]
            print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
