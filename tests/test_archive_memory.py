"""Peak memory of ``check docker-archive:`` on an archive whose layer is far bigger
than the bound docs/check.md ("Memory bound") and docs/security.md give: the layer is
read in place with ``pread`` in bounded blocks (its diff_id hash, its candidate
files), never held or mapped whole. Mapping the archive to hash the layer made the
peak RSS as big as the layer (1.07 GiB for a 1.03 GiB layer: page-cache pages of a
mapping count in RSS), which this test catches.

The archive is written sparse (its zero runs are holes), so a 384 MiB layer costs
little disk; its candidates are real ELF files with device code (the ``app``
fixture) followed by zeros, so they are read, not skipped by their first bytes.
The peak is the checking process's and its workers' (``os.wait4``: a child's
``ru_maxrss`` is the largest of it and the children it waited for, Linux
``kernel/exit.c``, ``wait_task_zombie``, ``cmaxrss``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import pytest

from tests.fixtures.build import BIN
from tests.images import fixture

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
MEMBER = 192 * MIB  # each candidate file of the layer (two: worker processes read them)
BOUND = 128 * MIB  # well below one member: no member, let alone the layer, is held

# A part of a file: bytes as they are, or a run of that many zero bytes (a hole).
Part = bytes | int


def _tar(members: list[tuple[str, list[Part]]]) -> Iterator[Part]:
    """A ustar/PAX tar of ``members`` (name, parts of its bytes), as parts."""
    for name, parts in members:
        info = tarfile.TarInfo(name)
        info.size = sum(p if isinstance(p, int) else len(p) for p in parts)
        info.mode, info.mtime = 0o755, 0
        yield info.tobuf(tarfile.PAX_FORMAT)
        yield from parts
        yield -info.size % tarfile.BLOCKSIZE
    yield 2 * tarfile.BLOCKSIZE


def _sha256(parts: list[Part]) -> str:
    digest, zeros = hashlib.sha256(), bytes(MIB)
    for part in parts:
        if isinstance(part, bytes):
            digest.update(part)
            continue
        for at in range(0, part, MIB):
            digest.update(zeros[: min(MIB, part - at)])
    return digest.hexdigest()


def _write(path: Path, parts: list[Part]) -> None:
    """Write the parts, zero runs as holes."""
    with path.open("wb") as f:
        for part in parts:
            if isinstance(part, bytes):
                f.write(part)
            else:
                f.seek(part, os.SEEK_CUR)
        f.truncate(f.tell())


def _big_archive(path: Path) -> list[str]:
    """A ``docker save`` archive of one layer holding two large ELF files with
    device code; the files' paths."""
    elf = fixture("app")
    files = [f"usr/lib/libbig{i}.so" for i in range(2)]
    layer = list(_tar([(name, [elf, MEMBER - len(elf)]) for name in files]))
    diff_id = _sha256(layer)
    config = json.dumps(
        {
            "os": "linux",
            "architecture": "amd64",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = f"{diff_id}/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": ["bmtest/big:1"], "Layers": [layer_name]}]
    _write(
        path,
        list(
            _tar(
                [
                    (config_name, [config]),
                    (layer_name, layer),
                    ("manifest.json", [json.dumps(manifest).encode()]),
                ]
            )
        ),
    )
    return files


# Runs its arguments as a child and writes the child's peak RSS (KiB; the child's and
# its waited-for workers', os.wait4) and exit code to stderr. A process's ru_maxrss
# keeps the high-water mark of the memory it replaced at execve (Linux fs/exec.c,
# exec_mmap -> setmax_mm_hiwater_rss), and a child started straight from a long-lived
# test process would inherit that process's peak: the fresh interpreter in between
# is small, so what is measured is the checking process's own.
_MEASURE = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
print(usage.ru_maxrss, os.waitstatus_to_exitcode(status), file=sys.stderr)
"""


def _peak_rss(argv: list[str]) -> tuple[int, bytes, int]:
    """Exit code, stdout and peak RSS in bytes of ``argv`` and its workers."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, *argv], check=True, cwd=REPO, env=env, capture_output=True
    )
    peak, code = proc.stderr.decode().split()[-2:]
    return int(code), proc.stdout, int(peak) * 1024  # Linux: KiB


def test_in_place_archive_layer_is_read_in_bounded_memory(tmp_path: Path) -> None:
    archive = tmp_path / "big.tar"
    files = _big_archive(archive)
    assert archive.stat().st_size > 2 * MEMBER  # (its holes read as zeros)
    argv = [sys.executable, "-m", "buildmatrix", "check", "--no-cache", "--sm", "9.0"]
    code, out, peak = _peak_rss([*argv, "--json", f"docker-archive:{archive}"])
    report = json.loads(out)
    # The layer was read (its diff_id matched: no refusal) and both files inspected.
    assert code == 0, out
    assert sorted(f["path"] for f in report["files"]) == files
    assert all(f["sass"] for f in report["files"]), report["files"]
    assert peak < BOUND, f"peak RSS {peak / MIB:.0f} MiB for a {2 * MEMBER // MIB} MiB layer"


class _Trickle(io.RawIOBase):
    """A raw stream that gives at most ``most`` bytes per read, as a pipe or socket
    may (``io.RawIOBase.read``: "fewer than size bytes may be returned")."""

    def __init__(self, data: bytes, most: int) -> None:
        super().__init__()
        self._data, self._most, self._at = data, most, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._most, len(self._data) - self._at)
        buffer[:n] = self._data[self._at : self._at + n]
        self._at += n
        return n


@pytest.mark.parametrize("most", [1, 7, 4096])
def test_member_read_from_a_raw_stream_in_short_reads_is_read_whole(most: int) -> None:
    # Every fixture binary (in memory: under SPOOL_LIMIT), its body handed over a few
    # bytes at a time, gives the report the same bytes give from one buffered read.
    from buildmatrix.binary.scan import might_hold_code
    from buildmatrix.image.spool import inspect_member

    read = 0
    for path in sorted(p for p in BIN.iterdir() if p.is_file()):
        data = path.read_bytes()
        head = data[:64]
        if len(data) < 4 or not might_hold_code(head, path.name):
            continue
        if most == 1 and len(data) > 64 << 10:
            continue  # byte by byte, the small ones; 7 bytes at a time reads them all
        read += 1
        whole = inspect_member(io.BytesIO(data[64:]), len(data), path.name, head, None)
        trickled = cast(IO[bytes], _Trickle(data[64:], most))
        assert inspect_member(trickled, len(data), path.name, head, None) == whole, path.name
    assert read >= 5  # the fixtures with device code were read


ENTRIES = 1_000_000
ENTRIES_BOUND = 300 * MIB  # for the whole check of such a layer: ~300 B an entry at most


def _many_entries_layout(path: Path) -> None:
    """An OCI layout of one gzip layer (~6 MiB) of ENTRIES empty files in 1,000
    folders, written header by header (tarfile's writer would keep every member)."""
    raw = io.BytesIO()
    for i in range(ENTRIES):
        raw.write(tarfile.TarInfo(f"d{i // 1000}/f{i}").tobuf(tarfile.USTAR_FORMAT))
    raw.write(b"\0" * 2 * tarfile.BLOCKSIZE)
    layer = raw.getvalue()
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes, media_type: str) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    config = {
        "os": "linux",
        "architecture": "amd64",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }
    oci_manifest = "application/vnd.oci.image.manifest.v1+json"
    manifest = {
        "schemaVersion": 2,
        "mediaType": oci_manifest,
        "config": put(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [
            put(gzip.compress(layer, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
        ],
    }
    top = put(json.dumps(manifest).encode(), oci_manifest)
    top["annotations"] = {"org.opencontainers.image.ref.name": "t"}
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))


def test_a_layer_of_a_million_entries_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """A layer of a million empty files (a ~6 MiB gzip blob): check's peak RSS stays
    under ENTRIES_BOUND as the layer is read and its summary written to the layer
    cache, and as it is read back from there. It peaked at 517 MiB (429 MiB without
    the cache): the codec built the whole summary as JSON objects, the summary kept a
    set of every path's hash for good, the run held every summary it made, and the
    final view's lookup copied the view's paths into sets over and over."""
    layout = tmp_path / "layout"
    _many_entries_layout(layout)
    cache = tmp_path / "cache"
    argv = [sys.executable, "-m", "buildmatrix", "check", "--sm", "9.0", "--allow-empty"]
    for run in ("read, and written to the layer cache", "read back from the cache"):
        code, out, peak = _peak_rss([*argv, "--json", "--cache", str(cache), f"oci:{layout}:t"])
        assert code == 0, out
        assert json.loads(out)["files"] == []
        assert list(cache.rglob("*.json.gz")), "the summary was not cached"
        assert peak < ENTRIES_BOUND, f"{run}: peak RSS {peak / MIB:.0f} MiB"
