"""Benchmark: ``buildmatrix check`` against checking an image by hand, and the streaming floor.

    .venv/bin/python benchmarks/check_vs_export.py [--workdir DIR]

Builds one image of several GB from the CUDA libraries of torch 2.14.1 and the
nvidia-* wheels (fetched as benchmarks/inspect_vs_cuobjdump.py does), one layer
per wheel, in a Docker engine and a registry that it starts on loopback (dockerd
with the vfs driver, docker-registry), then measures in one run:

- ``buildmatrix check docker-daemon:IMG`` against ``docker save IMG > /dev/null``
  (the floor: streaming the image out of the engine) and against the by-hand way:
  ``docker create`` + ``docker export | tar -x`` + ``cuobjdump --list-elf`` on
  every shared library;
- ``buildmatrix check docker://REGISTRY/IMG`` against pulling every layer blob to
  /dev/null, and pulling + gunzip to /dev/null (what any reader of the layers must
  at least do).

Prints a Markdown table. Needs root, dockerd, docker-registry and cuobjdump.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.inspect_vs_cuobjdump import fetch, measure  # noqa: E402
from tests.cuobjdump import find_cuobjdump  # noqa: E402
from tests.services import start_dockerd, start_registry  # noqa: E402

IMAGE = "bm-bench/cuda-libs:1"
REPOSITORY = IMAGE.partition(":")[0]


def start_services(root: Path) -> tuple[list[subprocess.Popen[bytes]], str, str]:
    """dockerd and docker-registry as the tests start them (tests/services.py)."""
    dockerd, host = start_dockerd(root, "--insecure-registry=127.0.0.0/8")
    (root / "registry").mkdir(exist_ok=True)
    registry, address = start_registry(root / "registry")
    return [dockerd, registry], host, address


def docker(host: str, *args: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "DOCKER_HOST": host}
    return subprocess.run(["docker", *args], env=env, check=True, **kw)  # type: ignore[call-overload, no-any-return]


def by_hand(host: str, tool: Path, scratch: Path) -> float:
    """docker create + docker export | tar -x + cuobjdump --list-elf on every .so."""
    start = time.perf_counter()
    cid = docker(host, "create", IMAGE, "/none", capture_output=True).stdout.decode().strip()
    root = scratch / "rootfs"
    root.mkdir()
    env = {**os.environ, "DOCKER_HOST": host}
    export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE, env=env)
    subprocess.run(["tar", "-x", "-C", str(root)], stdin=export.stdout, check=True)
    export.wait()
    for lib in sorted(root.rglob("*.so*")):
        if lib.is_file() and not lib.is_symlink():
            subprocess.run([str(tool), "--list-elf", str(lib)], capture_output=True, check=False)
    seconds = time.perf_counter() - start
    docker(host, "rm", cid, capture_output=True)
    shutil.rmtree(root)
    return seconds


def pull_floor(registry: str, *, gunzip: bool) -> float:
    """GET every layer blob of the image to /dev/null (optionally gunzipped)."""
    accept = "application/vnd.docker.distribution.manifest.v2+json"
    req = urllib.request.Request(
        f"http://{registry}/v2/{REPOSITORY}/manifests/1", headers={"Accept": accept}
    )
    start = time.perf_counter()
    manifest = json.load(urllib.request.urlopen(req))
    for layer in manifest["layers"]:
        url = f"http://{registry}/v2/{REPOSITORY}/blobs/{layer['digest']}"
        with urllib.request.urlopen(url) as response:
            stream = gzip.GzipFile(fileobj=response) if gunzip else response
            while stream.read(1 << 20):
                pass
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/buildmatrix-bench"))
    args = parser.parse_args()
    tool = find_cuobjdump()
    if tool is None or shutil.which("dockerd") is None or shutil.which("docker-registry") is None:
        print("needs cuobjdump, dockerd and docker-registry", file=sys.stderr)
        return 3
    fetch(args.workdir, None)
    corpus = args.workdir / "lib"
    size = sum(p.stat().st_size for p in corpus.rglob("*") if p.is_file()) / 2**30
    bm = [sys.executable, "-m", "buildmatrix", "check", "--family", "hopper", "--json"]
    # The engine's and registry's data stay in WORKDIR/state between runs, so a rerun
    # measures without rebuilding and pushing (delete the folder to start afresh).
    state = args.workdir / "state"
    state.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bm-bench-", dir=args.workdir) as tmp:
        scratch = Path(tmp)
        procs, host, registry = start_services(state)
        try:
            context = corpus
            lines = ["FROM scratch"] + [
                f"COPY {d.name} /opt/{d.name}" for d in sorted(corpus.iterdir())
            ]
            (scratch / "Dockerfile").write_text("\n".join(lines) + "\n")
            t = time.perf_counter()
            docker(
                host,
                "build",
                "-q",
                "-t",
                IMAGE,
                "-f",
                str(scratch / "Dockerfile"),
                str(context),
                capture_output=True,
            )
            built = time.perf_counter() - t
            remote = f"{registry}/{IMAGE}"
            docker(host, "tag", IMAGE, remote)
            t = time.perf_counter()
            docker(host, "push", remote, capture_output=True)
            pushed = time.perf_counter() - t
            env_host = {"DOCKER_HOST": host}
            os.environ.update(env_host)
            measure(["sh", "-c", f"DOCKER_HOST={host} docker save {IMAGE} > /dev/null"])  # warm
            save = measure(["sh", "-c", f"DOCKER_HOST={host} docker save {IMAGE} > /dev/null"])
            ours_engine = measure([*bm, f"docker-daemon:{IMAGE}"], stdout_to_null=True)
            hand = by_hand(host, tool, scratch)
            pull = pull_floor(registry, gunzip=False)
            pull_gz = pull_floor(registry, gunzip=True)
            ours_registry = measure([*bm, f"docker://{remote}"], stdout_to_null=True)
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=60)
    print(
        f"Image: {size:.2f} GiB of CUDA libraries in {len(lines) - 1} layers "
        f"(build {built:.0f} s, push {pushed:.0f} s).\n"
    )
    print(
        "| source | buildmatrix check | by hand (export + cuobjdump) | speed-up | "
        "streaming floor | check / floor |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    print(
        f"| engine (`docker-daemon:`) | {ours_engine.seconds:.1f} s "
        f"(RSS {ours_engine.max_rss_mb:.0f} MiB) | {hand:.1f} s | "
        f"{hand / ours_engine.seconds:.1f}x | `docker save > /dev/null` {save.seconds:.1f} s | "
        f"{ours_engine.seconds / save.seconds:.2f} |"
    )
    print(
        f"| registry (`docker://`) | {ours_registry.seconds:.1f} s "
        f"(RSS {ours_registry.max_rss_mb:.0f} MiB) | - | - | pull blobs {pull:.1f} s; "
        f"pull + gunzip {pull_gz:.1f} s | {ours_registry.seconds / pull:.2f} / "
        f"{ours_registry.seconds / pull_gz:.2f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
