"""Benchmark: check reading the local engine's overlay2 storage directly, against the
engine's ``docker save`` stream and the floor of reading the same files.

    sudo .venv/bin/python benchmarks/check_engine_storage.py [--workdir DIR]

Starts a Docker engine with the overlay2 driver, loads one image holding the torch
2.14.1 and nvidia-* CUDA libraries (the corpus of benchmarks/inspect_vs_cuobjdump.py,
~3 GiB, one layer), and measures in one run, page cache warm, best of two:

- ``check docker-daemon:IMG``: the layers read from the engine's storage;
- the same check forced onto the ``docker save`` stream (the fallback path);
- ``docker save IMG > /dev/null``: what the stream costs by itself;
- reading every file of the layer folders (the floor of the direct path).

Prints a Markdown table. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.check_matrix import _base_tar, _digest  # noqa: E402
from benchmarks.embedded_scan import best  # noqa: E402
from benchmarks.inspect_vs_cuobjdump import fetch  # noqa: E402
from tests.services import start_dockerd  # noqa: E402

TAG = "bmbench/corpus:overlay2"


def _archive(base: Path, digest: str, out: Path) -> None:
    """A docker-save archive of one layer (the base tar), written as a stream."""
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": {"io.buildmatrix.family": "hopper"}},
            "rootfs": {"type": "layers", "diff_ids": [digest]},
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = f"{digest[7:]}/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [TAG], "Layers": [layer_name]}])
    with tarfile.open(out, "w") as tar:
        for name, data in ((config_name, config), ("manifest.json", manifest.encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.add(base, arcname=layer_name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/buildmatrix-bench"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root: the engine's storage is readable by root only", file=sys.stderr)
        return 3
    libs = fetch(args.workdir, None)
    work = Path(tempfile.mkdtemp(prefix="bm-storage-", dir=args.workdir))
    proc = None
    try:
        base = work / "base.tar"
        _base_tar(libs, base)
        archive = work / "image.tar"
        _archive(base, _digest(base), archive)
        base.unlink()
        engine = work / "engine"
        engine.mkdir()
        proc, host = start_dockerd(engine, storage_driver="overlay2")
        os.environ["DOCKER_HOST"] = host
        subprocess.run(["docker", "load", "-i", str(archive)], check=True, capture_output=True)
        archive.unlink()

        from buildmatrix.image import daemon
        from buildmatrix.image.open import scan_image

        def direct() -> None:
            image = scan_image(f"docker-daemon:{TAG}")
            assert image.read_from and image.read_from.startswith("engine storage")

        def stream() -> None:
            saved = daemon.storage_folders
            daemon.storage_folders = lambda *a: (None, "benchmark")
            try:
                image = scan_image(f"docker-daemon:{TAG}")
                assert image.read_from and image.read_from.startswith("docker save")
            finally:
                daemon.storage_folders = saved

        def save() -> None:
            with Path(os.devnull).open("wb") as null:
                subprocess.run(["docker", "save", TAG], stdout=null, check=True)

        attrs = json.loads(
            subprocess.run(
                ["docker", "image", "inspect", TAG], capture_output=True, check=True
            ).stdout
        )[0]
        upper = Path(attrs["GraphDriver"]["Data"]["UpperDir"])

        def cat() -> None:
            for root, _dirs, files in os.walk(upper):
                for name in files:
                    with (Path(root) / name).open("rb") as f:
                        while f.read(8 << 20):
                            pass

        cat()  # warm the page cache
        results = [
            ("check, engine storage (direct)", best(direct, runs=2)),
            ("check, docker save stream (fallback)", best(stream, runs=2)),
            ("docker save > /dev/null", best(save, runs=2)),
            ("read every file of the layer folder (floor)", best(cat, runs=2)),
        ]
        floor = results[-1][1]
        save_t = results[2][1]
        size = sum(p.stat().st_size for p in upper.rglob("*") if p.is_file()) / 2**30
        print(f"one image, {size:.2f} GiB in one layer, overlay2 engine\n")
        print("| run | time (s) | vs reading the files | vs docker save |")
        print("| --- | ---: | ---: | ---: |")
        for name, t in results:
            print(f"| {name} | {t:.1f} | {t / floor:.2f}x | {t / save_t:.2f}x |")
    finally:
        if proc is not None:
            subprocess.run(["docker", "rmi", "-f", TAG], capture_output=True, check=False)
            proc.terminate()
            proc.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
