"""Malformed and hostile input: exit 2 with the file and field named, never a traceback,
never a hang, never a pass."""

from __future__ import annotations

import io
import json
import os
import struct
import tarfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.binaries import container, elf_with_section, entry
from tests.conftest import CliRunner
from tests.fixtures.build import BIN
from tests.images import Image, fixture, write_oci_layout


def _archive(path: Path, manifest: object, config: bytes = b'{"config": {}}') -> str:
    with tarfile.open(path, "w") as tar:
        for name, data in (("manifest.json", json.dumps(manifest).encode()), ("c.json", config)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return f"docker-archive:{path}"


@pytest.mark.parametrize(
    ("manifest", "config", "message"),
    [
        (["x"], b"{}", "manifest.json: key '[0]': expected object"),
        ([{"Layers": []}], b"{}", "'Config' is a required property"),
        ([{"Config": 5, "Layers": []}], b"{}", "key '[0].Config': expected string"),
        ([{"Config": "c.json", "Layers": [5]}], b"{}", "key '[0].Layers[0]': expected string"),
        ([{"Config": "c.json", "Layers": "abc"}], b"{}", "key '[0].Layers': expected array"),
        ([{"Config": "c.json", "Layers": []}], b'{"config": "x"}', "c.json: key 'config'"),
        (
            [{"Config": "c.json", "Layers": []}],
            b'{"config": {"Labels": ["a"]}}',
            "key 'config.Labels'",
        ),
        ([{"Config": "c.json", "Layers": []}], b'{"config": {"Env": 5}}', "key 'config.Env'"),
        ([{"Config": "c.json", "Layers": []}], b"[1]", "expected a JSON object"),
        ({"not": "a list"}, b"{}", "manifest.json: top level: expected array"),
    ],
)
def test_malformed_archive_documents(
    cli: CliRunner, tmp_path: Path, manifest: object, config: bytes, message: str
) -> None:
    result = cli("check", _archive(tmp_path / "a.tar", manifest, config), "--sm", "9.0")
    assert result.code == 2
    assert message in result.err


def test_archive_members_linked_in_a_loop_are_refused(cli: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "loop.tar"
    with tarfile.open(path, "w") as tar:
        for name, target in (("manifest.json", "m2"), ("m2", "manifest.json")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    result = cli("check", f"docker-archive:{path}", "--sm", "9.0")
    assert result.code == 2
    assert "'manifest.json' goes through a symlink loop" in result.err


def test_oci_descriptor_without_digest(cli: CliRunner, tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_oci_layout(layout, Image(layers=[{"usr/lib/a.so": fixture("libsass_sm80.so")}]))
    index = json.loads((layout / "index.json").read_text())
    del index["manifests"][0]["digest"]
    (layout / "index.json").write_text(json.dumps(index))
    result = cli("check", f"oci:{layout}", "--sm", "8.0")
    assert result.code == 2
    assert "index.json: key 'manifests[0]': 'digest' is a required property" in result.err


def test_a_fifo_is_refused_not_waited_on(cli: CliRunner, tmp_path: Path) -> None:
    fifo = tmp_path / "kernels.so"
    os.mkfifo(fifo)
    for args in (("inspect", str(fifo)), ("check", str(fifo), "--sm", "9.0")):
        result = cli(*args)
        assert result.code == 2
        assert "not a regular file" in result.err


def test_targets_are_checked_before_any_io(cli: CliRunner) -> None:
    """An unreachable registry would be exit 3; the bad --sm is found first (exit 2)."""
    result = cli("check", "docker://127.0.0.1:1/team/x:1", "--sm", "10.1")
    assert result.code == 2
    assert "The nearest older one of its major is 'sm_100'" in result.err
    result = cli("check", "docker://127.0.0.1:1/team/x:1", "--family", "hoper")
    assert result.code == 2
    assert "Did you mean 'hopper'" in result.err


def test_ignore_covers_unreadable_files_and_lines_name_the_path_once(
    cli: CliRunner, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    (root / "opt").mkdir(parents=True)
    (root / "opt" / "broken.so").write_bytes(
        elf_with_section(".nv_fatbin", container(entry(header_size=0)))
    )
    (root / "opt" / "good.so").write_bytes(fixture("libsass_ptx.so"))
    failed = cli("check", f"dir:{root}", "--sm", "9.0", "--json")
    assert failed.code == 1
    problem = next(p for p in failed.json()["problems"] if "broken.so" in p)
    assert problem.count("opt/broken.so") == 1, problem
    passed = cli("check", f"dir:{root}", "--sm", "9.0", "--ignore", "opt/broken.so")
    assert passed.code == 0, passed.out


def test_an_oversized_registry_manifest_is_refused_while_streaming(cli: CliRunner) -> None:
    """A loopback stand-in registry serves a 20 MiB 'manifest'; it is cut at the cap."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            self.end_headers()
            if "/manifests/" in self.path:
                chunk = b" " * (1 << 20)
                try:
                    for _ in range(20):
                        self.wfile.write(chunk)
                except OSError:  # the client stopped reading: what the test wants
                    return
            else:
                self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host = f"127.0.0.1:{server.server_address[1]}"
        result = cli("check", f"docker://{host}/team/big:1", "--sm", "9.0")
    finally:
        server.shutdown()
    assert result.code == 2, result.err
    assert "is over 16 MiB" in result.err


def _ar(name: bytes, data: bytes) -> bytes:
    """A static archive (ar format) of one member."""
    head = b"%-16s%-12d%-6d%-6d%-8o%-10d`\n" % (name, 0, 0, 0, 0o644, len(data))
    return b"!<arch>\n" + head + data + b"\n" * (len(data) % 2)


def _nested_archive(depth: int) -> bytes:
    blob = fixture("libtwo_static.a")
    for _ in range(depth):
        blob = _ar(b"inner.a/", blob)
    return blob


@pytest.mark.parametrize("command", ["inspect", "check"])
def test_archives_nested_deep_are_refused_not_a_traceback(
    command: str, cli: CliRunner, tmp_path: Path
) -> None:
    """400 archives deep once exhausted the stack (RecursionError): refused, exit 2,
    with the limit named; 15 deep (under the limit) still reads its code."""
    from buildmatrix.binary.scan import MAX_ARCHIVE_NESTING

    root = tmp_path / "root"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / "libdeep.a").write_bytes(_nested_archive(400))
    args = ["check", f"dir:{root}", "--sm", "9.0"] if command == "check" else ["inspect", str(root)]
    r = cli(*args)
    assert r.code == 2, r.out + r.err
    assert f"nested more than {MAX_ARCHIVE_NESTING} deep" in r.err and "Traceback" not in r.err
    (root / "usr" / "lib" / "libdeep.a").write_bytes(_nested_archive(MAX_ARCHIVE_NESTING - 1))
    r = cli("inspect", str(root), "--json")
    assert r.code == 0, r.err
    assert "sm_80" in r.out


# Decompression bombs (buildmatrix.binary.decompress; docs/security.md, "Bounds"): a
# fatbinary whose one cubin is a Zstandard frame under a header that claims its size.
_ENTRY_HEADER = struct.Struct("<HHIQI4xHHI8xQ8xQ")  # docs/inspect.md's entry header


def _zstd_fatbin(chunks: Iterator[bytes], *, packed: int = 0, claim: int = 0) -> bytes:
    """A fatbinary of one sm_80 SASS entry: the Zstandard frame of ``chunks``, padded
    to ``packed`` compressed bytes (the header's +16) where more, claiming ``claim``
    uncompressed bytes (+56; default: what the frame holds)."""
    import zstandard

    out = io.BytesIO()
    size = 0
    with zstandard.ZstdCompressor(level=1).stream_writer(out, closefd=False) as writer:
        for chunk in chunks:
            writer.write(chunk)
            size += len(chunk)
    frame = out.getvalue()
    payload = frame.ljust(packed, b"\0")
    payload += b"\0" * (-len(payload) % 8)
    head = _ENTRY_HEADER.pack(
        2, 0x101, 64, len(payload), max(packed, len(frame)), 0, 0, 80, 0x8011, claim or size
    )
    return container(head + payload)


def _zeros(total: int) -> Iterator[bytes]:
    block = b"\0" * (16 << 20)
    for at in range(0, total, len(block)):
        yield block[: total - at]


@pytest.mark.parametrize("claim", [0, 1 << 40])  # what it holds (1 GiB), and 1 TiB
def test_a_decompression_bomb_is_refused_within_bounded_memory(
    cli: CliRunner, tmp_path: Path, claim: int
) -> None:
    """A 1 GiB frame of zeros in a few kilobytes: past the 1024:1 ratio bound, refused
    (exit 2) before anything is decompressed, whatever size the header claims."""
    path = tmp_path / "bomb.fatbin"
    path.write_bytes(_zstd_fatbin(_zeros(1 << 30), claim=claim))
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    result = cli("check", str(path), "--sm", "8.0")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.code == 2, result.out
    assert "decompression bomb" in result.err and "bomb.fatbin" in result.err
    assert peak < 16 << 20


def test_a_cubin_past_the_memory_budget_is_read_as_a_stream(cli: CliRunner, tmp_path: Path) -> None:
    """An sm_80 cubin followed by zeros to 300 MiB (past the 256 MiB an entry may take
    in memory; its compressed bytes padded to 1:1000, within the ratio bound): read
    from the frame as asked, never held, and judged by its own ELF header."""
    cubin = (BIN / "kernels_sm80.cubin").read_bytes()
    size = 300 << 20
    path = tmp_path / "big.fatbin"
    path.write_bytes(_zstd_fatbin(iter([cubin, *_zeros(size - len(cubin))]), packed=size // 1000))
    tracemalloc.start()
    passed = cli("check", str(path), "--sm", "8.0", "--json")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert passed.code == 0, passed.out + passed.err
    assert peak < 64 << 20
    failed = cli("check", str(path), "--sm", "9.0", "--json")
    assert failed.code == 1, failed.out
