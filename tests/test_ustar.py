"""tests/ustar.py, the fast writer of many-member layers, held to two writers and
readers it did not write: CPython's tarfile (the same bytes as its ustar writer,
the same members as its reader) and Go's archive/tar (tests/gotar/main.go, the
reader the Docker engine and containerd unpack layers with)."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.ustar import BLOCK, NAME_MAX, RECORD, empty_files


def tarfile_writes(names: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in names:
            tar.addfile(tarfile.TarInfo(name))
    return buf.getvalue()


def layer_names(count: int) -> list[str]:
    return [f"d{i // 1000}/f{i}" for i in range(count)]


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_same_bytes_as_tarfile_for_every_count_across_records(batch: int) -> None:
    """0 to 60 members: the end blocks land on every offset of a record
    (18 members fill one exactly), and chunks split anywhere."""
    for count in range(61):
        names = layer_names(count)
        assert b"".join(empty_files(names, batch=batch)) == tarfile_writes(names), count


def test_same_bytes_as_tarfile_for_every_name_length() -> None:
    """Names of 1 to 100 bytes (each byte value 0x21-0x7e in some name: every
    checksum digit moves), and UTF-8 names, counted in bytes."""
    names = ["".join(chr(0x21 + (n + k) % 94) for k in range(n)) for n in range(1, NAME_MAX + 1)]
    names += ["é/ü" * 20, "ß" * 50]
    assert b"".join(empty_files(names)) == tarfile_writes(names)


def test_tarfile_reads_the_members_written() -> None:
    raw = b"".join(empty_files(layer_names(2500)))
    assert len(raw) % RECORD == 0 and len(raw) >= (2500 + 2) * BLOCK
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        members = [(m.name, m.type, m.size, m.mode, m.mtime) for m in tar]
    assert members == [(n, tarfile.REGTYPE, 0, 0o644, 0) for n in layer_names(2500)]


def test_go_reads_the_members_written(gotar: Path, tmp_path: Path) -> None:
    layer = tmp_path / "layer.tar"
    layer.write_bytes(b"".join(empty_files(layer_names(2500), batch=333)))
    out = subprocess.run([str(gotar), str(layer)], check=True, capture_output=True, text=True)
    members = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(m.get("name"), m.get("type"), m.get("size")) for m in members] == [
        (n, "0", 0) for n in layer_names(2500)
    ]


@pytest.mark.parametrize("name", ["", "x" * (NAME_MAX + 1), "é" * 51])
def test_names_the_name_field_cannot_hold_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="1 to 100 bytes"):
        b"".join(empty_files([name]))
