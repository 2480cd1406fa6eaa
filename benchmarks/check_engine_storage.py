"""Benchmark: check reading the local engine's overlay2 storage directly, against the
engine's ``docker save`` stream, a ``docker save`` archive read in place, and the
floors of reading the same bytes.

    sudo .venv/bin/python benchmarks/check_engine_storage.py [--workdir DIR]

Starts a Docker engine with the overlay2 driver, loads one image holding the torch
2.14.1 and nvidia-* CUDA libraries (the corpus of benchmarks/inspect_vs_cuobjdump.py,
~3 GiB, one layer), and measures in one run, page cache warm, best of two, each
``check`` a fresh ``buildmatrix check --sm 9.0 --no-cache`` process (wall time and
its peak RSS):

- ``check docker-daemon:IMG``: the layers read from the engine's storage;
- the same check forced onto the ``docker save`` stream (the fallback path);
- ``check docker-archive:FILE`` on the engine's own ``docker save -o`` archive
  (layers read in place);
- ``docker save IMG > /dev/null``: what the stream costs by itself;
- reading every file of the layer folder (the floor of the direct path) and
  ``cat`` of the archive (the floor of the archive path);
- ``buildmatrix --version``: the fixed cost of starting the tool.

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
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.check_matrix import _base_tar, _digest  # noqa: E402
from benchmarks.inspect_vs_cuobjdump import fetch  # noqa: E402
from tests.services import start_dockerd, stop_dockerd  # noqa: E402

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


def _check(ref: str, read_from: str | None, *, force_stream: bool = False) -> float:
    """One fresh ``buildmatrix check`` process; returns its peak RSS in MiB (of its
    process tree, workers included) and checks it read the image the way it was
    meant to."""
    code = "from buildmatrix.cli import main; import sys; sys.exit(main(sys.argv[1:]))"
    if force_stream:  # as when the storage cannot be read: the engine's save stream
        code = (
            "from buildmatrix.image import daemon; "
            "daemon.storage_folders = lambda *a: (None, 'benchmark'); " + code
        )
    args = ["check", ref, "--sm", "9.0", "--no-cache", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    peak = [0]
    sampler = threading.Thread(target=_sample_tree, args=(proc.pid, peak), daemon=True)
    sampler.start()
    out = proc.stdout.read() if proc.stdout is not None else b""
    _, status, usage = os.wait4(proc.pid, 0)
    sampler.join()
    doc = json.loads(out)
    if os.waitstatus_to_exitcode(status) not in (0, 1) or (
        read_from is not None and not str(doc.get("read_from", "")).startswith(read_from)
    ):
        raise SystemExit(f"check {ref} did not run as meant: {doc.get('read_from')}")
    # the larger of the process's own peak and its tree's summed peak (workers)
    return float(max(usage.ru_maxrss, peak[0]) / 1024)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the worker server and its workers)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                continue
    return found


def _sample_tree(pid: int, peak: list[int]) -> None:
    """Sum the RSS (KiB) of the process tree every 20 ms while ``pid`` runs; an upper
    bound, since pages the workers share with their server count once per process."""
    while Path(f"/proc/{pid}/status").exists():
        total = 0
        for member in _tree(pid):
            try:
                status = Path(f"/proc/{member}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        peak[0] = max(peak[0], total)
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return
        except OSError:
            return
        time.sleep(0.02)


def _best(fn: Callable[[], float | None], runs: int = 2) -> tuple[float, float]:
    """(best wall time, peak RSS of that run) of ``fn``."""
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        rss = fn() or 0.0
        timings.append((time.perf_counter() - start, rss))
    return min(timings)


def _read_file(path: Path) -> None:
    with path.open("rb") as f:
        while f.read(8 << 20):
            pass


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

        attrs = json.loads(
            subprocess.run(
                ["docker", "image", "inspect", TAG], capture_output=True, check=True
            ).stdout
        )[0]
        upper = Path(attrs["GraphDriver"]["Data"]["UpperDir"])
        saved = work / "saved.tar"
        subprocess.run(["docker", "save", "-o", str(saved), TAG], check=True)

        def direct() -> float:
            return _check(f"docker-daemon:{TAG}", "engine storage")

        def stream() -> float:
            return _check(f"docker-daemon:{TAG}", "docker save", force_stream=True)

        def archive_in_place() -> float:
            return _check(f"docker-archive:{saved}", None)

        def save() -> None:
            with Path(os.devnull).open("wb") as null:
                subprocess.run(["docker", "save", TAG], stdout=null, check=True)

        def cat_layer() -> None:
            for root, _dirs, files in os.walk(upper):
                for name in files:
                    _read_file(Path(root) / name)

        def cat_archive() -> None:
            _read_file(saved)

        def start() -> None:
            subprocess.run(
                [sys.executable, "-m", "buildmatrix", "--version"], check=True, capture_output=True
            )

        cat_layer()  # warm the page cache
        cat_archive()
        results = [
            ("check, engine storage (direct)", *_best(direct), "layer files"),
            ("check, docker save stream (fallback)", *_best(stream), "docker save"),
            ("check, docker-archive file (in place)", *_best(archive_in_place), "archive"),
            ("docker save > /dev/null", *_best(save), "docker save"),
            ("read every file of the layer folder", *_best(cat_layer), "layer files"),
            ("read the docker-archive file", *_best(cat_archive), "archive"),
            ("buildmatrix --version (start-up)", *_best(start), "layer files"),
        ]
        floors = {
            "layer files": results[4][1],
            "archive": results[5][1],
            "docker save": results[3][1],
        }
        size = sum(p.stat().st_size for p in upper.rglob("*") if p.is_file()) / 2**30
        print(f"one image, {size:.2f} GiB in one layer, overlay2 engine\n")
        print("| run | time (s) | peak RSS (MiB) | vs its floor | floor |")
        print("| --- | ---: | ---: | ---: | --- |")
        for name, t, rss, floor in results:
            shown = f"{rss:.0f}" if rss else "-"
            print(f"| {name} | {t:.2f} | {shown} | {t / floors[floor]:.2f}x | {floor} |")
        print(
            "\npeak RSS: the check process, or its process tree summed where workers ran "
            "(pages they share counted once per process: an upper bound)"
        )
        print(f"\ndirect vs docker save alone: {floors['docker save'] / results[0][1]:.1f}x faster")
    finally:
        if proc is not None:
            subprocess.run(["docker", "rmi", "-f", TAG], capture_output=True, check=False)
            stop_dockerd(proc, engine)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
