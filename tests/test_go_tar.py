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
from buildmatrix.image.layers import (
    clean_member_name,
    forward_members,
    read_as_layer,
    scan_layer,
)
from buildmatrix.image.tarheaders import StrictTarInfo
from buildmatrix.image.tarstream import check_end, member_data, open_tar_stream
from tests.conftest import CliRunner
from tests.images import Image, fixture, scan_in_place, write_archive_blobs
from tests.services import Registry, engine_export

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
    """Each member as the layer readers take them (layers.forward_members, where the
    stream's end is judged), then the end of the archive as they check it."""
    members = []
    for m in forward_members(tar):
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
    check_end(tar)
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
    # A header claiming more than follows: Go stops with "unexpected EOF".
    "size 2^60, the layer ends first": file(b"usr/lib/libok.so", HOPPER)
    + rechecked(header(BAD, b"0"), 124, b"\x80" + (1 << 60).to_bytes(11, "big"))
    + SM80,
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


# ------------------------------------------------------------------ truncated layers

# A layer with a member of every kind a cut can fall in: extension headers (PAX, GNU
# long name and long link), data read by the inspection (an ELF head) and data
# skipped, data ending mid-block and on a block boundary, header-only members, a
# member of no data, then the two end-of-archive blocks.
CUT: bytes = (
    pax((b"path", b"usr/lib/libpax.so"))
    + file(b"x", HOPPER[:700])
    + file(b"usr/share/doc/readme", b"text\n" * 30)
    + long(b"usr/lib/" + b"l" * 120)
    + file(b"y", b"z" * 512)
    + header(b"usr/lib/folder/", b"5")
    + long(b"usr/share/" + b"t" * 110, typ=b"K")
    + header(b"usr/lib/libl.so", b"2")
    + header(b"usr/lib/empty", b"0")
    + header(b"usr/lib/hard.so", b"1", link=b"usr/lib/libpax.so")
    + b"\0" * 1024
)


def _cuts() -> list[int]:
    """Where :data:`CUT` is cut: both sides of every block boundary and of the end
    of every member's data (where the outcome can change), and every 37th byte
    between; every byte with BUILDMATRIX_CUT_EVERY=1 (~9,000 cuts, a minute)."""
    import os

    if os.environ.get("BUILDMATRIX_CUT_EVERY") == "1":
        return list(range(len(CUT) + 1))
    edges = {b * 512 for b in range(len(CUT) // 512 + 1)}
    with tarfile.open(fileobj=io.BytesIO(CUT)) as tar:
        edges |= {m.offset_data + m.size for m in tar if m.size}
    edges |= {512 + len(records((b"path", b"usr/lib/libpax.so")))}  # the PAX data
    near = {e + d for e in edges for d in (-1, 0, 1)} | set(range(0, len(CUT), 37))
    return sorted(n for n in near if 0 <= n <= len(CUT))


def go_views(gotar: Path, raws: list[bytes], folder: Path) -> list[View]:
    """:func:`go_view` of many layers, in one run of the oracle."""
    folder.mkdir()
    paths = []
    for i, raw in enumerate(raws):
        paths.append(folder / f"{i}.tar")
        paths[-1].write_bytes(raw)
    (folder / "last.tar").write_bytes(b"")  # several files: each one's lines end
    out = subprocess.run(
        [str(gotar), *map(str, paths), str(folder / "last.tar")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    views: list[View] = []
    members: list[dict[str, Any]] = []
    error = ""
    for line in out.splitlines():
        doc = json.loads(line)
        if "file" in doc:
            views.append(f"go: {error}" if error else members)
            members, error = [], ""
        elif "error" in doc:
            error = doc["error"]
        else:
            members.append({"name": doc["name"], "type": doc["type"], "sha256": doc["sha256"]})
    return views[: len(raws)]


def _refusal(read: Callable[[], object]) -> str:
    try:
        read()
    except InputError as exc:
        return str(exc)
    return ""


def test_a_layer_cut_anywhere_is_read_iff_go_reads_it_to_the_end(
    gotar: Path, tmp_path: Path
) -> None:
    """The layer above cut at every byte (in a header, an extension header's data, a
    member's data or padding, the end-of-archive blocks): buildmatrix's readers (the
    stream, gzip-compressed as a registry or OCI blob is, and in place as in a
    docker-archive) accept exactly the cuts Go's archive/tar reads to the end, with
    Go's members; the others are refused naming the member, as Go stops with
    "unexpected EOF". Go ends the archive without an error where the cut falls on a
    header's boundary or in the padding after a member's data, and so may a layer."""
    import gzip

    cuts = _cuts()
    go = go_views(gotar, [CUT[:n] for n in cuts], tmp_path / "cuts")
    assert len(go) == len(cuts)
    accepted = []
    for n, theirs in zip(cuts, go, strict=True):
        raw = CUT[:n]
        refusals = {
            "stream": _refusal(lambda: scan_layer(io.BytesIO(raw), name="layer 0")),  # noqa: B023
            "gzip": _refusal(
                lambda: scan_layer(io.BytesIO(gzip.compress(raw, mtime=0)), name="layer 0")  # noqa: B023
            ),
            "in place": _refusal(lambda: scan_in_place(raw, name="layer 0")),  # noqa: B023
        }
        if isinstance(theirs, str):
            assert theirs == "go: unexpected EOF", (n, theirs)
            for how, said in refusals.items():
                assert said.startswith("layer 0: the layer ends inside "), (n, how, said)
                assert 'stops there with "unexpected EOF"' in said, (n, how, said)
            continue
        assert refusals == {"stream": "", "gzip": "", "in place": ""}, (n, refusals)
        ours = buildmatrix_view(raw)
        assert isinstance(ours, list), (n, ours)
        assert [{k: m[k] for k in ("name", "type", "sha256")} for m in ours] == [
            {**m, "name": clean_member_name(m["name"], layer="layer")} for m in theirs
        ], n
        accepted.append(n)
    # Both outcomes at every kind of place: block boundaries, padding, the end.
    assert 0 in accepted and len(CUT) in accepted and len(CUT) - 512 in accepted
    x_end = 3 * 512 + 700  # x's data: after the PAX header, its data and x's header
    assert x_end in accepted and x_end + 1 in accepted  # in the padding after it
    assert x_end - 1 not in accepted and len(CUT) - 1 not in accepted
    assert len(accepted) < len(cuts) // 2, len(accepted)


def test_a_zstd_layer_cut_anywhere_is_read_iff_zstd_and_go_read_it(
    gotar: Path, tmp_path: Path
) -> None:
    """The layer above as containerd may get it: zstd frames one after another, a
    skippable frame among them, cut at both sides of every frame's end and every
    29th byte. The oracles: the zstd tool (``zstd -t``: a stream cut inside a frame
    is "truncated"; python-zstandard's reader took it for the end of the layer),
    then Go's archive/tar on what ``zstd -dc`` decompresses."""
    import zstandard

    if shutil.which("zstd") is None:
        pytest.skip("no zstd tool here (Debian package zstd)")
    half = len(CUT) // 2
    packed = (
        zstandard.ZstdCompressor(write_checksum=True).compress(CUT[:half])
        + b"\x50\x2a\x4d\x18"
        + (5).to_bytes(4, "little")
        + b"notes"
        + zstandard.ZstdCompressor(write_content_size=False).compress(CUT[half:])
    )
    cuts = sorted(set(range(1, len(packed) + 1, 29)) | {len(packed) - 1, len(packed)})
    frames = [n for n in range(1, len(packed) + 1) if _zstd_whole(packed[:n], tmp_path)]
    cuts = sorted(
        set(cuts) | {f + d for f in frames for d in (-1, 0, 1) if 0 < f + d <= len(packed)}
    )
    plains = [_unzstd(packed[:n], tmp_path) for n in cuts]
    go = go_views(gotar, [p or b"" for p in plains], tmp_path / "zstd-cuts")
    for n, plain, theirs in zip(cuts, plains, go, strict=True):
        said = _refusal(lambda: scan_layer(io.BytesIO(packed[:n]), name="layer 0"))  # noqa: B023
        if plain is None and n < 4:  # no whole magic number: read as a plain tar
            assert said.startswith("layer 0: the layer ends inside "), (n, said)
        elif plain is None:  # zstd: truncated
            assert "the zstd stream ends inside a frame" in said, (n, said)
        elif isinstance(theirs, str):
            assert said.startswith("layer 0: the layer ends inside "), (n, said)
        else:
            assert said == "", (n, said)
    assert frames[-1] == len(packed) and len(frames) == 3, frames


def _zstd_whole(data: bytes, tmp_path: Path) -> bool:
    path = tmp_path / "probe.zst"
    path.write_bytes(data)
    return (
        subprocess.run(["zstd", "-tq", str(path)], capture_output=True, check=False).returncode == 0
    )


def _unzstd(data: bytes, tmp_path: Path) -> bytes | None:
    """What ``zstd -dc`` decompresses, or None where it says the stream is cut."""
    path = tmp_path / "cut.zst"
    path.write_bytes(data)
    done = subprocess.run(["zstd", "-dcq", str(path)], capture_output=True, check=False)
    return done.stdout if done.returncode == 0 else None


@pytest.mark.parametrize("where", ["in the data", "in the padding", "in the end marker"])
def test_a_cut_layer_through_every_source(
    where: str, gotar: Path, docker_host: str, registry: Registry, cli: CliRunner, tmp_path: Path
) -> None:
    """A layer cut inside the data of its sm_80-only library, in the padding after it
    or inside the end-of-archive marker, read through each source: docker-archive
    (in place, and the engine's own ``docker load``), an OCI layout (a gzip blob)
    and the registry (``docker://``). Where Go reads it to the end, the engine loads
    it and check sees the library (a failed verdict on 9.0, never a pass); where
    Go fails, the engine refuses it and check too (exit 2), naming the member."""
    import gzip

    from tests.buildx_standin import OCI_MANIFEST, _manifest, put_manifest
    from tests.images import write_oci_layout

    whole = file(b"usr/lib/libhopper_a.so", HOPPER) + file(BAD, SM80) + b"\0" * 1024
    data_end = 512 + len(padded(HOPPER)) + 512 + len(SM80)
    raw = {
        "in the data": whole[: data_end - 100],
        "in the padding": whole[: data_end + 1],
        "in the end marker": whole[:-700],
    }[where]
    reads = not isinstance(go_view(gotar, raw, tmp_path), str)
    assert reads == (where == "in the padding")
    tag = f"bmtest/cut-layer:{where.rsplit(maxsplit=1)[-1]}"
    config = Image(layers=[]).config(["sha256:" + hashlib.sha256(raw).hexdigest()])
    archive = write_archive_blobs(tmp_path / "image.tar", config, [("l/layer.tar", raw)], tag=tag)
    loaded = subprocess.run(
        ["docker", "-H", docker_host, "load", "-i", str(archive)],
        capture_output=True,
        text=True,
        check=False,
    )
    subprocess.run(
        ["docker", "-H", docker_host, "rmi", "-f", tag], capture_output=True, check=False
    )
    assert (loaded.returncode == 0) == reads, loaded.stderr
    layout = write_oci_layout(tmp_path / "layout", Image(layers=[]), tag="v1")
    blob = gzip.compress(raw, mtime=0)
    _replace_layers(layout, config, blob)
    doc = _manifest(registry.host, "bmtest/cut", config, [(blob, OCI_LAYER_GZIP, {})])
    put_manifest(registry.host, "bmtest/cut", "v1", doc, OCI_MANIFEST)
    for ref in (
        f"docker-archive:{archive}",
        f"oci:{layout}:v1",
        f"docker://{registry.host}/bmtest/cut:v1",
    ):
        r = cli("check", ref, "--sm", "9.0", "--no-cache")
        if reads:
            assert r.code == 1, (ref, r.out, r.err)
            assert "libbad.so: sm_80 SASS runs only on compute capability 8.x" in r.out
        else:
            assert r.code == 2, (ref, r.out, r.err)
            assert "the layer ends inside " in r.err and "unexpected EOF" in r.err, r.err
            if where == "in the data":
                assert f"member '{BAD.decode()}'" in r.err, r.err


OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


def _replace_layers(layout: Path, config: bytes, blob: bytes) -> None:
    """The OCI layout's one image made of ``config`` and the one layer ``blob``."""
    blobs = layout / "blobs" / "sha256"

    def put(data: bytes) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **put(config)},
        "layers": [{"mediaType": OCI_LAYER_GZIP, **put(blob)}],
    }
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0].update(put(json.dumps(manifest).encode()))
    (layout / "index.json").write_text(json.dumps(index))
