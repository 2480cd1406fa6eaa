"""buildmatrix's tar reading held to Go's archive/tar, the reader the Docker engine,
containerd and ``docker load`` unpack layers with (the oracle: tests/gotar/main.go,
built with the system's Go, which prints each member as Go reads it).

Every header form here hid an sm_80-only library from an earlier ``check``, or is an
ordinary form that must keep reading. For each, buildmatrix must refuse the layer
(exit 2, the member named) or see exactly what Go sees: names, types, sizes, links,
xattrs and each member's data.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.errors import InputError
from buildmatrix.image.layers import clean_member_name, read_as_layer, scan_layer
from buildmatrix.image.tarheaders import StrictTarInfo
from buildmatrix.image.tarstream import member_data, open_tar_stream
from tests.images import Image, fixture, scan_in_place, write_archive_blobs
from tests.services import engine_export

SM80 = fixture("libsass_sm80.so")
HOPPER = fixture("libhopper_a.so")
BAD = b"usr/lib/libbad.so"

View = list[dict[str, Any]] | str  # members as read, or the refusal


def go_view(gotar: Path, raw: bytes, tmp_path: Path) -> View:
    layer = tmp_path / "layer.tar"
    layer.write_bytes(raw)
    out = subprocess.run([str(gotar), str(layer)], check=True, capture_output=True, text=True)
    members: list[dict[str, Any]] = []
    for line in out.stdout.splitlines():
        doc = json.loads(line)
        if "error" in doc:
            return f"go: {doc['error']}"
        members.append(
            {
                "name": clean_member_name(doc["name"], layer="layer"),
                "type": doc["type"],
                "size": doc["size"],
                "linkname": doc["linkname"],
                "xattrs": doc["xattrs"],
                "sha256": doc["sha256"],
            }
        )
    return members


def _members(tar: tarfile.TarFile) -> list[dict[str, Any]]:
    members = []
    for m in tar:
        data = member_data(tar, m).read() if m.isreg() else b""
        members.append(
            {
                "name": clean_member_name(m.name, layer="layer"),
                "type": "0" if m.type == tarfile.AREGTYPE else m.type.decode(),  # as Go
                "size": m.size if m.isreg() else 0,
                "linkname": m.linkname,
                "xattrs": {
                    k[len("SCHILY.xattr.") :]: v
                    for k, v in m.pax_headers.items()
                    if k.startswith("SCHILY.xattr.")
                },
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    return members


def buildmatrix_view(raw: bytes) -> View:
    """The members as buildmatrix's stream reader and its seekable (in-place) reader
    read them; both must agree, on the view or on the refusal."""
    views: list[View] = []
    readers: list[Callable[[], tarfile.TarFile]] = [
        lambda: open_tar_stream(io.BytesIO(raw), name="layer"),
        lambda: tarfile.open(fileobj=io.BytesIO(raw), mode="r:", tarinfo=StrictTarInfo),  # noqa: SIM115
    ]
    for open_tar in readers:
        try:
            with read_as_layer("layer"), open_tar() as tar:
                views.append(_members(tar))
        except InputError as exc:
            views.append(f"refused: {exc}")
    assert views[0] == views[1]
    return views[0]


# ------------------------------------------------------------------ writing tars by hand


def header(name: bytes, typ: bytes = b"0", size: int = 0, link: bytes = b"") -> bytes:
    h = bytearray(512)
    h[0 : len(name[:100])] = name[:100]
    h[100:108] = b"0000644\0"
    h[108:116] = h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"%011o\0" % 0
    h[156:157] = typ
    h[157 : 157 + len(link)] = link
    h[257:265] = b"ustar\x0000"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def file(name: bytes, data: bytes, typ: bytes = b"0") -> bytes:
    return header(name, typ, len(data)) + padded(data)


def records(*pairs: tuple[bytes, bytes]) -> bytes:
    out = b""
    for key, value in pairs:
        body = b" %s=%s\n" % (key, value)
        n = len(body) + 1
        while len(b"%d" % n) + len(body) != n:
            n += 1
        out += b"%d" % n + body
    return out


def pax(*pairs: tuple[bytes, bytes], typ: bytes = b"x") -> bytes:
    data = records(*pairs)
    return header(b"PaxHeaders/x", typ, len(data)) + padded(data)


def long(name: bytes, typ: bytes = b"L") -> bytes:
    return header(b"././@LongLink", typ, len(name) + 1) + padded(name + b"\0")


def rechecked(block: bytes, at: int, value: bytes) -> bytes:
    """A header block with ``value`` written at ``at`` and its checksum made right."""
    h = bytearray(block)
    h[at : at + len(value)] = value
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def layer(*parts: bytes) -> bytes:
    return file(b"usr/lib/libok.so", HOPPER) + b"".join(parts) + b"\0" * 1024


HOSTILE: dict[str, bytes] = {
    "lone GNU.sparse.size": layer(pax((b"GNU.sparse.size", b"%d" % len(SM80))), file(BAD, SM80)),
    "lone GNU.sparse.realsize": layer(pax((b"GNU.sparse.realsize", b"4")), file(BAD, SM80)),
    "GNU.sparse.name without a map": layer(
        pax((b"GNU.sparse.name", b"usr/share/doc/readme")), file(BAD, SM80)
    ),
    "empty PAX path": layer(pax((b"path", b"")), file(BAD, SM80)),
    "empty PAX size": layer(pax((b"size", b"")), file(BAD, SM80)),
    "PAX path then GNU L": layer(
        pax((b"path", b"usr/share/doc/readme")), long(BAD), file(b"x", SM80)
    ),
    "GNU L then PAX path": layer(
        long(b"usr/share/doc/readme"), pax((b"path", BAD)), file(b"x", SM80)
    ),
    "PAX global header": layer(pax((b"path", b"usr/share/doc/g"), typ=b"g"), file(BAD, SM80)),
    "two GNU L headers": layer(long(b"usr/share/doc/readme"), long(BAD), file(b"x", SM80)),
    "two PAX x headers": layer(
        pax((b"path", BAD)), pax((b"path", b"usr/share/doc/readme")), file(b"x", SM80)
    ),
    "PAX record without newline": layer(
        header(b"PaxHeaders/x", b"x", 12) + padded(b"12 path=abcd"), file(BAD, SM80)
    ),
    "PAX size with an underscore": layer(pax((b"size", b"1_0")), file(BAD, SM80)),
    "GNU sparse 0.0": layer(
        pax(
            (b"GNU.sparse.size", b"10"),
            (b"GNU.sparse.numblocks", b"1"),
            (b"GNU.sparse.offset", b"0"),
            (b"GNU.sparse.numbytes", b"10"),
        ),
        file(BAD, SM80[:10]),
    ),
    "GNU sparse 0.1 map too short": layer(
        pax(
            (b"GNU.sparse.size", b"%d" % len(SM80)),
            (b"GNU.sparse.numblocks", b"2"),
            (b"GNU.sparse.map", b"0,%d" % len(SM80)),
        ),
        file(BAD, SM80),
    ),
    "contiguous type 7": layer(file(BAD, SM80, typ=b"7")),
    # Found by tests/test_fuzz.py: tarfile makes a folder of type NUL + "NAME/" before
    # it applies the long name; Go decides on the long name (a file).
    "type NUL folder name with GNU L": layer(long(BAD), file(b"usr/lib/", SM80, typ=b"\0")),
    # Go applies a GNU long name or link only where it is not empty; Python takes it.
    "empty GNU L": layer(header(b"././@LongLink", b"L", 0), file(BAD, SM80)),
    "GNU L of NULs": layer(long(b"\0\0\0"), file(BAD, SM80)),
    "empty GNU K": layer(
        header(b"././@LongLink", b"K", 0), header(b"usr/lib/libl.so", b"2", link=b"libbad.so")
    ),
    # Type NUL is a folder when the name ends in "/": Go asks the whole name (prefix +
    # "/" + name), Python the name field, so Go reads the "file's" data as headers.
    "type NUL, empty name, ustar prefix": layer(
        rechecked(header(b"", b"\0", 512 + len(padded(SM80))), 345, b"opt"), file(BAD, SM80)
    ),
    # Base-256 numbers: Go takes any first byte with the top bit set, Python's tarfile
    # only 0x80 and 0xFF and stops at the header as at the end of the archive.
    "base-256 devmajor 0x81": layer(
        rechecked(header(BAD, b"0", len(SM80)), 329, b"\x81" + b"\0" * 7) + padded(SM80)
    ),
    "base-256 devminor 0xc1, then a zero block": layer(
        rechecked(header(b"usr/share/zeros", b"0", 512), 337, b"\xc1" + b"\xff" * 7) + b"\0" * 512,
        file(BAD, SM80),
    ),
    "base-256 negative size": layer(
        rechecked(header(BAD, b"0"), 124, b"\xff" * 10 + b"\xfe\x00"), file(BAD, SM80)
    ),
    "base-256 size past 63 bits": layer(
        rechecked(header(BAD, b"0"), 124, b"\x80\x80" + b"\0" * 10) + padded(SM80)
    ),
    "overlay redirect xattr": layer(
        pax((b"SCHILY.xattr.trusted.overlay.redirect", b"/opt/hidden")),
        header(b"usr/lib/cuda", b"5"),
    ),
    "overlay opaque xattr": layer(
        pax((b"SCHILY.xattr.trusted.overlay.opaque", b"y")), header(b"usr/lib", b"5")
    ),
    "user overlay xattr": layer(
        pax((b"SCHILY.xattr.user.overlay.redirect", b"/opt/hidden")), header(b"usr/lib2", b"5")
    ),
}

ORDINARY: dict[str, bytes] = {
    "PAX long path": layer(
        pax((b"path", b"usr/lib/" + b"d" * 150 + b"/libbad.so")), file(b"x", SM80)
    ),
    "GNU long name": layer(long(b"usr/lib/" + b"d" * 150 + b"/libbad.so"), file(b"x", SM80)),
    "GNU long link": layer(
        long(b"usr/lib/" + b"t" * 150, typ=b"K"), header(b"usr/lib/libl.so", b"2")
    ),
    "PAX times, ids and an xattr": layer(
        pax((b"mtime", b"1700000000.5"), (b"uid", b"1000"), (b"SCHILY.xattr.user.note", b"kept")),
        file(BAD, SM80),
    ),
    "PAX without a path, then GNU L": layer(pax((b"mtime", b"1")), long(BAD), file(b"x", SM80)),
    "GNU sparse 0.1": layer(
        pax(
            (b"GNU.sparse.size", b"%d" % (len(SM80) + 4096)),
            (b"GNU.sparse.numblocks", b"2"),
            (b"GNU.sparse.map", b"0,%d,%d,0" % (len(SM80), len(SM80) + 4096)),
            (b"GNU.sparse.name", BAD),
        ),
        file(b"GNUSparseFile.0/libbad.so", SM80),
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_are_refused_or_read_as_go_reads_them(
    case: str, gotar: Path, tmp_path: Path
) -> None:
    raw = HOSTILE[case]
    ours, go = buildmatrix_view(raw), go_view(gotar, raw, tmp_path)
    assert isinstance(ours, str) or ours == go, (ours, go)
    # Each of these forms is refused, naming a member, by every reader of layers.
    assert isinstance(ours, str) and "member '" in ours, (ours, go)
    with pytest.raises(InputError, match="the image is refused"):
        scan_layer(io.BytesIO(raw), name="layer")
    with pytest.raises(InputError, match="the image is refused"):
        scan_in_place(raw)


@pytest.mark.parametrize("case", sorted(ORDINARY))
def test_ordinary_headers_read_as_go_reads_them(case: str, gotar: Path, tmp_path: Path) -> None:
    raw = ORDINARY[case]
    ours, go = buildmatrix_view(raw), go_view(gotar, raw, tmp_path)
    assert ours == go


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar writes the sparse member")
def test_gnu_tar_sparse_reads_as_go_reads_it(gotar: Path, tmp_path: Path) -> None:
    """GNU tar's PAX sparse output (format 1.0): data and holes as Go expands them."""
    root = tmp_path / "root" / "usr" / "lib"
    root.mkdir(parents=True)
    with (root / "libbad.so").open("wb") as f:
        f.write(SM80)
        f.seek(1 << 20)
        f.write(SM80)
    out = tmp_path / "layer.tar"
    subprocess.run(
        ["tar", "--sparse", "--format=pax", "-cf", str(out), "-C", str(tmp_path / "root"), "usr"],
        check=True,
    )
    raw = out.read_bytes()
    ours = buildmatrix_view(raw)
    assert ours == go_view(gotar, raw, tmp_path)
    assert any(m["name"] == "usr/lib/libbad.so" for m in ours)  # type: ignore[index]


def _engine_files(host: str, raw: bytes, tmp_path: Path, tag: str) -> dict[str, str] | str:
    """The regular files (path -> sha256) the engine unpacks from a one-layer image
    (``docker load`` + ``docker export``), or 'refused' where ``docker load`` fails."""
    config = Image(layers=[]).config(["sha256:" + hashlib.sha256(raw).hexdigest()])
    archive = write_archive_blobs(tmp_path / "image.tar", config, [("l/layer.tar", raw)], tag=tag)
    exported = engine_export(host, archive, tag)
    if isinstance(exported, str):
        return f"refused: {exported}"
    files = {}
    with tarfile.open(fileobj=io.BytesIO(exported)) as tar:
        for m in tar:
            data = tar.extractfile(m) if m.isreg() else None
            if data is not None:
                files[m.name] = hashlib.sha256(data.read()).hexdigest()
    return files


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_the_engine_unpacks_what_go_reads(
    case: str, gotar: Path, docker_host: str, tmp_path: Path
) -> None:
    """The oracle's oracle: the engine unpacks the files Go's reader names, with Go's
    contents (or refuses the image where Go's reader fails). So each refused form
    above is one where the engine would run a library the old reading missed."""
    raw = HOSTILE[case]
    go = go_view(gotar, raw, tmp_path)
    engine = _engine_files(docker_host, raw, tmp_path, f"bmtest/gotar-{len(case)}:{case[:3]}x")
    if isinstance(go, str):
        assert str(engine).startswith("refused"), engine
        return
    if case == "contiguous type 7":  # Go reads it; moby's createTarFile does not unpack it
        assert "unhandled tar header type 55" in str(engine), engine
        return
    assert isinstance(engine, dict), engine
    for member in go:
        if member["type"] == "0":
            assert engine.get(member["name"]) == member["sha256"], (member, sorted(engine))
