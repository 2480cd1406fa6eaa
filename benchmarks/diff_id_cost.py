"""Benchmark: what checking layers against their diff_ids costs, one commit against
another, on the two paths it touches.

    .venv/bin/python benchmarks/diff_id_cost.py --before /path/to/old/checkout \
        [--libs torch,cublas,cufft] [--runs 3] [--workdir DIR]

Builds one layer of the CUDA libraries of the named wheels (the corpus of
benchmarks/inspect_vs_cuobjdump.py), writes it as a ``docker save`` archive (its
layer read in place) and as an OCI layout with a gzip layer (streamed), then runs
``buildmatrix check --sm 9.0 --no-cache --json`` on each with both checkouts,
interleaved, best of ``--runs``: wall time and the CPU time of the process and its
workers (the steadier figure on a shared machine). Prints a Markdown table. Nothing
here asserts on time.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import resource
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


def build(work: Path, libs: list[Path]) -> tuple[Path, Path]:
    """The docker-archive file and the OCI layout of one layer of ``libs``."""
    layer = work / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        for lib in libs:
            tar.add(lib, arcname=f"usr/lib/{lib.name}")
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": {"io.buildmatrix.family": "hopper"}},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha_file(layer)}"]},
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    archive = work / "image.tar"
    with tarfile.open(archive, "w") as out:
        _add(out, config_name, config)
        out.add(layer, arcname="l0/layer.tar")
        manifest = [{"Config": config_name, "RepoTags": ["bench/c:v"], "Layers": ["l0/layer.tar"]}]
        _add(out, "manifest.json", json.dumps(manifest).encode())
    oci = work / "oci"
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
    return archive, oci


CHECK = ["--sm", "9.0", "--no-cache", "--json"]


def measure(checkout: Path, source: str) -> tuple[float, float]:
    """Wall and CPU seconds (the process and its workers) of one check."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "buildmatrix", "check", source, *CHECK],
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
    archive, oci = build(args.workdir, libs)
    size = sum(p.stat().st_size for p in libs) / 2**30
    print(f"corpus: {len(libs)} libraries, {size:.2f} GiB in one layer", flush=True)
    sources = {
        "`docker-archive:` file, layer read in place": f"docker-archive:{archive}",
        "`oci:` layout, gzip layer streamed": f"oci:{oci}:v1",
    }
    checkouts = {"before": args.before.resolve(), "after": REPO}
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for _ in range(args.runs):  # interleaved: the machine's load hits both alike
        for label, source in sources.items():
            for which, checkout in checkouts.items():
                wall, cpu = measure(checkout, source)
                old = best.get((label, which), (1e9, 1e9))
                best[(label, which)] = (min(old[0], wall), min(old[1], cpu))
    print("| source | CPU before (s) | CPU after (s) | CPU change | wall before (s) |", end="")
    print(" wall after (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label in sources:
        (wb, cb), (wa, ca) = best[(label, "before")], best[(label, "after")]
        change = 100 * (ca - cb) / cb
        print(f"| {label} | {cb:.2f} | {ca:.2f} | {change:+.0f}% | {wb:.2f} | {wa:.2f} |")


if __name__ == "__main__":
    main()
