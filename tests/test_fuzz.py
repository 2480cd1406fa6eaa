"""Fuzzing the parsers of untrusted input: no exception but the project's own.

Structured mutations of real inputs (nvcc-built libraries, fatbinaries, cubins, PTX,
layer tars, image documents, references): size and offset fields set to 0, huge,
backwards or self-pointing; truncations; bit flips; random bytes. Every parser must
return or raise a ``BuildmatrixError`` (which the CLI turns into exit 2), within a
deadline. A longer run: ``BUILDMATRIX_FUZZ_EXAMPLES=20000 pytest tests/test_fuzz.py``
(docs/security.md has the counts of the last long run).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import struct
import tarfile
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buildmatrix.binary.decompress import FLAG_LZ4, FLAG_ZSTD, MAX_IN_MEMORY, decompress_payload
from buildmatrix.binary.ptx import ptx_target
from buildmatrix.binary.scan import inspect_image_file, inspect_source
from buildmatrix.binary.source import BytesSource, CorruptBinary
from buildmatrix.errors import BuildmatrixError
from buildmatrix.image.blobs import check_manifest
from buildmatrix.image.layers import scan_layer
from buildmatrix.image.ref import parse_ref
from buildmatrix.image.scanned import ImageConfig
from buildmatrix.image.tree import LayerSummary, merge
from tests.images import Hardlink, Image, Symlink, fixture, layer_tar, scan_in_place

EXAMPLES = int(os.environ.get("BUILDMATRIX_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=2000,  # ms per example: a parser that loops or blows up fails here
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize="BUILDMATRIX_FUZZ_EXAMPLES" not in os.environ,  # the suite is reproducible
)

SEEDS = {
    "libsass_ptx.so": fixture("libsass_ptx.so"),
    "libtwo.so": fixture("libtwo.so"),
    "kernels.fatbin": fixture("kernels.fatbin"),
    "kernels_sm90a.cubin": fixture("kernels_sm90a.cubin"),
    "libcompressed.so": fixture("libcompressed.so"),
    "libtwo_compressed.so": fixture("libtwo_compressed.so"),
    "libcompressed_speed.so": fixture("libcompressed_speed.so"),
    "libtwo_static.a": fixture("libtwo_static.a"),
}
FIELDS = [0, 1, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 2**31, 64, 16]


@st.composite
def mutated(draw: st.DrawFn, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "field", "truncate", "splice", "zero"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "field":
            width = draw(st.sampled_from([2, 4, 8]))
            value = draw(st.sampled_from(FIELDS)) % (1 << (8 * width))
            data[at : at + width] = value.to_bytes(width, "little")
        elif kind == "truncate":
            del data[at:]
        elif kind == "splice":
            data[at:at] = draw(st.binary(max_size=64))
        else:
            data[at : at + draw(st.integers(1, 512))] = b""
    return bytes(data)


def _inspect(data: bytes, name: str) -> None:
    with contextlib.suppress(BuildmatrixError):
        inspect_source(BytesSource(data, name=name), path=name)


@FUZZ
@given(st.sampled_from(sorted(SEEDS)), st.data())
def test_binaries(name: str, data: st.DataObject) -> None:
    _inspect(data.draw(mutated(SEEDS[name])), name)


@FUZZ
@given(st.sampled_from(["app_static", "libsass_ptx.so"]), st.data())
def test_image_files(name: str, data: st.DataObject) -> None:
    """As an image's file: the CUDA runtime reader (binary.cudart: version definitions,
    the runtime's message, cudaRuntimeGetVersion's body) and the relocations that may
    rewrite device code (binary.dynrel.relocation_into) too. app_static links the
    CUDA 13.0 runtime in."""
    blob = data.draw(mutated(fixture(name)))
    with contextlib.suppress(BuildmatrixError):
        inspect_image_file(BytesSource(blob, name=name), path=name, head=blob[:64])


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes_as_any_binary(blob: bytes) -> None:
    for prefix in (
        b"",
        b"\x7fELF\x02\x01\x01",
        struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 64),
        b"!<arch>\n",
    ):
        _inspect(prefix + blob, "random.so")


def _compressed(data: bytes, flags: int) -> bytes:
    import lz4.block
    import zstandard

    if flags == FLAG_LZ4:
        return bytes(lz4.block.compress(data, store_size=False))
    return bytes(zstandard.ZstdCompressor().compress(data))


@FUZZ
@given(
    st.sampled_from([FLAG_LZ4, FLAG_ZSTD, FLAG_LZ4 | FLAG_ZSTD, 0]),
    st.binary(max_size=2048),
    st.one_of(st.integers(-1, 1 << 16), st.sampled_from([MAX_IN_MEMORY, 1 << 40])),
    st.booleans(),
    st.data(),
)
def test_decompressor(flags: int, body: bytes, size: int, wrap: bool, data: st.DataObject) -> None:
    """Random and mutated LZ4 blocks and Zstandard frames under any claimed size: the
    output is exactly the claimed size (never more), or CorruptBinary."""
    payload = body
    if wrap and flags in (FLAG_LZ4, FLAG_ZSTD):  # a real block or frame, then damaged
        payload = data.draw(mutated(_compressed(body, flags)))
    try:
        out = decompress_payload(payload, flags=flags, size=size, name="x")
    except CorruptBinary:
        return
    assert len(out) == size <= MAX_IN_MEMORY


@FUZZ
@given(st.sampled_from(["libtwo_compressed.so", "libcompressed_speed.so"]), st.data())
def test_compressed_entry_headers(name: str, data: st.DataObject) -> None:
    """The size fields a decompression trusts (+8 payload, +16 compressed, +56
    uncompressed) of the first compressed entry, set to hostile values."""
    seed = bytearray(SEEDS[name])
    at = seed.find(b"\x02\x00\x01\x01")  # a SASS entry header: kind 2, version 0x101
    assert at > 0
    for field, width in data.draw(
        st.lists(st.sampled_from([(8, 8), (16, 4), (56, 8)]), min_size=1)
    ):
        value = data.draw(st.sampled_from(FIELDS)) % (1 << (8 * width))
        seed[at + field : at + field + width] = value.to_bytes(width, "little")
    _inspect(bytes(seed), name)


@FUZZ
@given(st.text(max_size=400))
def test_ptx_text(text: str) -> None:
    with contextlib.suppress(BuildmatrixError):
        ptx_target(BytesSource(text.encode("utf-8", "surrogatepass"), name="k.ptx"))


LAYER = layer_tar(
    {
        "usr/lib/libsass_ptx.so": SEEDS["libsass_ptx.so"],
        "usr/lib/link.so": Symlink("libsass_ptx.so"),
        "opt/hard.so": Hardlink("usr/lib/libsass_ptx.so"),
        "opt/.wh.gone": b"",
        "etc/.wh..wh..opq": b"",
    }
)


def _layer_outcome(read: Callable[[], LayerSummary]) -> object:
    """The final view a layer makes, or the message it is refused with."""
    try:
        return list(merge([read()]).files())
    except BuildmatrixError as exc:
        return f"refused: {exc}"


@FUZZ
@given(st.data())
def test_layer_tars(data: st.DataObject) -> None:
    """Both readers of a layer (the stream, and in place in a docker-archive file)
    read every mutation alike: the same view, or the same refusal."""
    blob = data.draw(mutated(LAYER))
    streamed = _layer_outcome(lambda: scan_layer(io.BytesIO(blob), name="layer"))
    assert _layer_outcome(lambda: scan_in_place(blob)) == streamed


@FUZZ
@given(st.data())
def test_compressed_layers(data: st.DataObject) -> None:
    import gzip

    blob = data.draw(mutated(gzip.compress(LAYER, mtime=0)))
    with contextlib.suppress(BuildmatrixError):
        scan_layer(io.BytesIO(blob), name="layer.gz")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from(
    [
        "config",
        "Config",
        "Labels",
        "Env",
        "manifests",
        "layers",
        "digest",
        "mediaType",
        "platform",
        "annotations",
        "schemaVersion",
    ]
)
DOCS = st.dictionaries(KEYS, JSON, max_size=6)


@FUZZ
@given(DOCS)
def test_image_documents(doc: dict[str, object]) -> None:
    for read in (
        lambda: ImageConfig.from_json(doc),
        lambda: check_manifest(doc, name="manifest"),
    ):
        with contextlib.suppress(BuildmatrixError):
            read()


@FUZZ
@given(st.text(max_size=300))
def test_references(text: str) -> None:
    with contextlib.suppress(BuildmatrixError):
        parse_ref(text)


def test_a_real_tar_member_survives_the_fuzzer_setup() -> None:
    """The seeds are valid: the fuzzing starts from inputs that parse."""
    with tarfile.open(fileobj=io.BytesIO(LAYER)) as tar:
        assert "usr/lib/libsass_ptx.so" in tar.getnames()
    assert inspect_source(BytesSource(SEEDS["libtwo.so"], name="x"), path="x") is not None


@functools.cache
def _compat_seed() -> bytes:
    import tempfile
    from pathlib import Path

    from tests.standins import compat_library

    note = {"format": 1, "CUDA version": "13.1", "driver": [535, 580], "device": [2, 14]}
    with tempfile.TemporaryDirectory() as tmp:
        return compat_library(Path(tmp), "590.44.01", note).read_bytes()


@FUZZ
@given(st.data())
def test_compat_driver_notes(data: st.DataObject) -> None:
    """The cuda-compat note parser: a broken note is a problem on the library, never
    an exception (the container toolkit ignores such a note too)."""
    from buildmatrix.forward import read_compat_library

    blob = data.draw(mutated(_compat_seed()))
    path = "usr/local/cuda/compat/libcuda.so.590.44.01"
    with contextlib.suppress(BuildmatrixError):
        read_compat_library(BytesSource(blob, name=path), path=path)


# ------------------------------------------- docker save archives and platforms

NAMES = st.sampled_from(
    [
        "manifest.json",
        "./manifest.json",
        "c.json",
        "/c.json",
        "l/layer.tar",
        "l//layer.tar",
        "l",
        "m/layer.tar",
        "../x",
        "oci-layout",
        "index.json",
        "blobs/sha256/ab",
        "/",
        ".",
    ]
)


@st.composite
def outer_archives(draw: st.DrawFn) -> bytes:
    """A docker save tar of members drawn from spellings, kinds and contents that
    docker load reads differently (duplicates, links, folders, layers, documents)."""
    layer = layer_tar({"usr/lib/libsass_ptx.so": SEEDS["libsass_ptx.so"]})
    config = Image(layers=[]).config(["sha256:" + hashlib.sha256(layer).hexdigest()])
    manifest = json.dumps([{"Config": "c.json", "Layers": ["l/layer.tar"]}]).encode()
    contents = [layer, config, manifest, b'{"imageLayoutVersion": "1.0.0"}', b"{}", b"x"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for _ in range(draw(st.integers(1, 8))):
            info = tarfile.TarInfo(draw(NAMES))
            kind = draw(st.sampled_from(["file", "file", "symlink", "hardlink", "dir"]))
            if kind == "file":
                data = draw(st.sampled_from(contents))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}.get(
                kind, tarfile.DIRTYPE
            )
            info.linkname = draw(NAMES) if kind != "dir" else ""
            tar.addfile(info)
    return draw(st.one_of(st.just(buf.getvalue()), mutated(buf.getvalue())))


@FUZZ
@given(outer_archives())
def test_docker_archives(blob: bytes) -> None:
    import tempfile

    from buildmatrix.image.dockerarchive import scan_docker_archive

    with tempfile.NamedTemporaryFile(prefix="bm-fuzz-", suffix=".tar") as f:
        f.write(blob)
        f.flush()
        with contextlib.suppress(BuildmatrixError):
            scan_docker_archive(parse_ref(f"docker-archive:{f.name}"))


PLATFORM_PARTS = st.sampled_from(["linux", "amd64", "arm64", "arm", "v3", "v8", "v9.4", "x", ""])


@FUZZ
@given(
    st.lists(PLATFORM_PARTS, min_size=1, max_size=4).map("/".join) | st.text(max_size=30),
    st.lists(st.dictionaries(st.sampled_from(["os", "architecture", "variant"]), PLATFORM_PARTS)),
)
def test_platforms(requested: str, entries: list[dict[str, str]]) -> None:
    from buildmatrix.image.platform import select_platform

    descs = [{"digest": f"sha256:{i}", "platform": p} for i, p in enumerate(entries)]
    with contextlib.suppress(BuildmatrixError):
        select_platform(descs, requested, name="fuzz")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["driver", "DRIVER", "Device", "format", "CUDA Version", "x"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@FUZZ
@given(st.one_of(st.binary(max_size=256), _JSON.map(lambda d: json.dumps(d).encode())))
def test_compat_note_json(raw: bytes) -> None:
    """The note's JSON as Go decodes it: a field the toolkit would read, or ValueError
    (the toolkit ignores the note), never another exception."""
    from buildmatrix.binary.compat_note import decode_note

    try:
        fields = decode_note(raw)
    except ValueError:
        return
    for key in ("driver", "device"):
        assert fields[key] is None or all(type(v) is int for v in fields[key])
    assert isinstance(fields["cuda"], str)


# ------------------------------------------------- tar extension headers, held to Go's reader

_PAX_KEYS = [
    b"path", b"linkpath", b"size", b"mtime", b"uid", b"comment", b"hdrcharset",
    b"GNU.sparse.size", b"GNU.sparse.realsize", b"GNU.sparse.name", b"GNU.sparse.map",
    b"GNU.sparse.numblocks", b"GNU.sparse.major", b"GNU.sparse.minor",
    b"GNU.sparse.offset", b"GNU.sparse.numbytes",
    b"SCHILY.xattr.user.note", b"SCHILY.xattr.trusted.overlay.redirect",
    b"SCHILY.xattr.user.overlay.opaque",
]  # fmt: skip
_PAX_VALUES = [
    b"", b"0", b"1", b"4", b"10", b"1_0", b" 5", b"-1", b"y", b"BINARY",
    b"usr/lib/libbad.so", b"usr/share/x", b"usr/lib/", b"0,4", b"0,4,8,2",
]  # fmt: skip


@st.composite
def _extension_headers(draw: st.DrawFn) -> bytes:
    """PAX (x, g) and GNU (L, K) headers in any order and number, with records from
    the forms that Go's reader and Python's read differently."""
    from tests.test_go_tar import long, pax

    out = b""
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from([b"x", b"x", b"g", b"L", b"K"]))
        if kind in (b"L", b"K"):
            out += long(draw(st.sampled_from([b"", *_PAX_VALUES[10:]])), typ=kind)
            continue
        pairs = draw(
            st.lists(
                st.tuples(st.sampled_from(_PAX_KEYS), st.sampled_from(_PAX_VALUES)), max_size=4
            )
        )
        out += pax(*pairs, typ=kind)
    return out


# Edits of a member's own header block (offset, bytes): base-256 numbers with first
# bytes both readers take (0x80, 0xFF) and ones only Go takes, one past 63 bits, a
# ustar prefix and an empty name field (with type NUL, Go's folder test differs).
_BLOCK_EDITS = [
    (329, b"\x81" + b"\0" * 7),
    (337, b"\xff" * 8),
    (108, b"\x80" + b"\0" * 6 + b"\x07"),
    (136, b"\xc1" + b"\xff" * 11),
    (124, b"\x80\x80" + b"\0" * 10),
    (345, b"opt\0"),
    (0, b"\0"),
]


@settings(FUZZ, max_examples=EXAMPLES if "BUILDMATRIX_FUZZ_EXAMPLES" in os.environ else 60)
@given(st.data())
def test_tar_headers_read_as_go_reads_them(gotar: object, data: st.DataObject) -> None:
    """Every generated header form: buildmatrix refuses the layer, or sees exactly
    what Go's archive/tar sees (tests/test_go_tar.py, the oracle)."""
    import tempfile
    from pathlib import Path

    from tests.test_go_tar import buildmatrix_view, file, go_view, header, layer, rechecked

    parts = []
    for _ in range(data.draw(st.integers(1, 3))):
        ext = data.draw(_extension_headers())
        kind = data.draw(st.sampled_from([b"0", b"5", b"2", b"\0"]))
        name = data.draw(st.sampled_from([b"usr/lib/libbad.so", b"x", b"usr/lib/"]))
        size = data.draw(st.sampled_from([0, 4, 10, 600]))
        member = (
            file(name, SEEDS["libtwo.so"][:size], typ=kind)
            if kind in (b"0", b"\0")
            else (header(name, kind, link=b"libok.so" if kind == b"2" else b""))
        )
        for at, value in data.draw(st.lists(st.sampled_from(_BLOCK_EDITS), max_size=2)):
            member = rechecked(member[:512], at, value) + member[512:]
        parts.append(ext + member)
    raw = layer(*parts)
    ours = buildmatrix_view(raw)
    with tempfile.TemporaryDirectory() as tmp:
        go = go_view(Path(str(gotar)), raw, Path(tmp))
    assert isinstance(ours, str) or ours == go, (ours, go)
