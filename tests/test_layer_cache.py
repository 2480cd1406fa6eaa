"""The layer-summary cache: a matrix of images sharing base layers reads them once,
gives the same verdicts as without the cache, and never trusts a damaged entry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from buildmatrix.binary.cudart import CudaRuntime
from buildmatrix.image.cache import LayerCache, use
from buildmatrix.image.tree import WHITED_OUT, LayerSummary, Leaf
from buildmatrix.image.tree import Dir as TreeDir
from tests.conftest import CliRunner
from tests.images import (
    Dir,
    Entry,
    Hardlink,
    Image,
    Layer,
    Symlink,
    fixture,
    write_oci_layout,
)

BASE: Layer = {
    "usr/lib/libsass_ptx.so": fixture("libsass_ptx.so"),
    "usr/lib/libtwo_static.a": fixture("libtwo_static.a"),
    "usr/lib/link.so": Symlink("libsass_ptx.so"),
    "usr/lib/hard.so": Hardlink("usr/lib/libsass_ptx.so"),
    "opt/gone": Dir(),
    "etc/x.ptx": fixture("kernels_sm90a.ptx"),
}


def _variant(tmp_path: Path, name: str, top: dict[str, Entry]) -> str:
    image = Image(
        layers=[BASE, {"opt/.wh.gone": b"", **top}],
        labels={"io.buildmatrix.family": "hopper"},
    )
    return f"oci:{write_oci_layout(tmp_path / name, image)}"


def _json(cli: CliRunner, *args: str) -> tuple[int, Any]:
    r = cli("check", "--json", *args)
    assert r.code in (0, 1), r.err
    return r.code, r.json()


def test_a_matrix_reads_shared_layers_once_with_the_same_verdicts(
    cli: CliRunner, tmp_path: Path
) -> None:
    variants = [
        _variant(tmp_path, f"v{i}", {f"app/lib{i}.so": fixture(lib)})
        for i, lib in enumerate(
            ["libhopper_a.so", "libmulti.so", "libsass_sm80.so", "libsass_ptx.so", "libtwo.so"]
        )
    ]
    cache = tmp_path / "cache"
    code, doc = _json(cli, *variants, "--cache", str(cache))
    assert code == 1  # libsass_sm80 has nothing for Hopper
    verdicts = [i["verdict"] for i in doc["images"]]
    assert verdicts == ["pass", "pass", "fail", "pass", "fail"]
    # 5 images x 2 layers; the shared base read once
    assert doc["cache"]["misses"] == 6
    assert doc["cache"]["hits"] == 4
    # each image's result equals the one a cacheless single check gives
    for variant, cached in zip(variants, doc["images"], strict=True):
        _, alone = _json(cli, variant, "--no-cache")
        alone.pop("version")
        assert cached == alone
    # a second run reads nothing
    _, again = _json(cli, *variants, "--cache", str(cache))
    assert again["cache"]["hits"] == 10
    assert again["images"] == doc["images"]


def test_one_ref_keeps_the_single_image_shape(cli: CliRunner, tmp_path: Path) -> None:
    _, doc = _json(cli, _variant(tmp_path, "one", {}), "--cache", str(tmp_path / "c"))
    assert "images" not in doc
    assert doc["verdict"] == "pass"


def test_a_damaged_entry_is_discarded_and_the_layer_read_again(
    cli: CliRunner, tmp_path: Path
) -> None:
    ref = _variant(tmp_path, "v", {"app/lib.so": fixture("libhopper_a.so")})
    cache = tmp_path / "cache"
    _, first = _json(cli, ref, "--cache", str(cache))
    first.pop("version")
    entries = sorted(cache.rglob("*.json.gz"))
    assert len(entries) == 2
    for entry in entries:
        data = bytearray(entry.read_bytes())
        data[-5] ^= 0xFF  # a flipped bit in the payload: the checksum no longer matches
        entry.write_bytes(bytes(data))
    _, second = _json(cli, ref, ref, "--cache", str(cache))
    assert second["cache"] == {
        "folder": second["cache"]["folder"],
        "hits": 2,
        "misses": 2,
        "disabled": None,
    }
    assert second["images"][0] == first == second["images"][1]


def test_the_cache_is_bounded(tmp_path: Path) -> None:
    cache = LayerCache(tmp_path, max_bytes=1)  # smaller than any entry: keeps the newest only
    with use(cache):
        for i in range(3):
            cache.put(f"sha256:{i:064x}", LayerSummary(name=str(i)))
        assert len(list(cache.root.rglob("*.json.gz"))) == 3  # bounded once the run ends
    assert len(list(cache.root.rglob("*.json.gz"))) <= 1
    later = LayerCache(tmp_path)  # another run: only what is on disk
    assert later.get("sha256:" + "0" * 64) is None
    assert cache.get("not-a-digest") is None


def test_text_output_of_several_images(cli: CliRunner, tmp_path: Path) -> None:
    a = _variant(tmp_path, "a", {})
    b = _variant(tmp_path, "b", {"app/x.so": fixture("libsass_sm80.so")})
    r = cli("check", a, b, "--cache", str(tmp_path / "c"))
    assert r.code == 1
    assert f"2 images: 1 fail ({b})" in r.out
    assert json.dumps(r.out).count("PASS") == 1


def test_every_kind_of_entry_survives_the_cache(tmp_path: Path) -> None:
    """Files with device code, a corrupt one, a cuda-compat driver, links, a whiteout
    and an opaque folder: the summary read back is the summary written."""
    import io

    from buildmatrix.image.layers import scan_layer
    from buildmatrix.image.tree import merge
    from tests.images import layer_tar
    from tests.standins import compat_library

    compat = compat_library(tmp_path, "590.44.01", {"CUDA version": "13.1", "driver": [535]})
    layer = layer_tar(
        {
            "usr/lib/libtwo.so": fixture("libtwo.so"),
            "usr/bin/app": fixture("app_static"),  # a static CUDA runtime (binary.cudart)
            "usr/lib/broken.so": fixture("libsass_ptx.so")[:3000],
            "usr/local/cuda-13.1/compat/libcuda.so.590.44.01": compat.read_bytes(),
            "usr/local/cuda": Symlink("cuda-13.1"),
            "usr/lib/hard.so": Hardlink("usr/lib/libtwo.so"),
            "etc/.wh.gone": b"",
            "var/.wh..wh..opq": b"",
        }
    )
    summary = scan_layer(io.BytesIO(layer), name="layer")
    cache = LayerCache(tmp_path / "cache")
    cache.put("sha256:" + "a" * 64, summary)
    back = cache.get("sha256:" + "a" * 64)
    assert back is not None
    assert list(merge([back]).files()) == list(merge([summary]).files())
    # whiteouts and the opaque mark too, which only show over a lower layer
    assert _shape(back.root) == _shape(summary.root)
    assert _shape(back.root)["etc"][2] == {"gone": "whiteout"}
    assert back.root.children["var"].opaque  # type: ignore[union-attr]
    app = dict(merge([back]).files())["usr/bin/app"].result
    assert isinstance(app, CudaRuntime) and str(app.release) == "13.0" and app.inner is not None
    assert [p for p, _ in merge([back]).files()] == [
        "usr/bin/app",
        "usr/lib/broken.so",
        "usr/lib/hard.so",
        "usr/lib/libtwo.so",
        "usr/local/cuda",
        "usr/local/cuda-13.1/compat/libcuda.so.590.44.01",
    ]


def test_a_local_blob_without_an_entry_is_not_hashed_before_it_is_read(tmp_path: Path) -> None:
    """An uncompressed blob of an OCI layout is its own layer (blob digest = diff_id): on
    a cold cache it is read and verified once, not first hashed to vouch for an entry
    that does not exist; a later run serves it on the stamp the first run kept of the
    file, unhashed, with the same summary."""
    from buildmatrix.image.layer_scan import scan_blobs
    from buildmatrix.image.scanned import LayerBlob

    layout = write_oci_layout(tmp_path / "oci", Image(layers=[BASE]), compress=False)
    index = json.loads((layout / "index.json").read_text())
    manifest_blob = layout / "blobs/sha256" / index["manifests"][0]["digest"].split(":")[1]
    layer = json.loads(manifest_blob.read_text())["layers"][0]
    path = layout / "blobs/sha256" / layer["digest"].split(":")[1]
    blob = LayerBlob(
        name="layer 0",
        open=lambda: path.open("rb"),
        digest=layer["digest"],
        diff_id=layer["digest"],
        local=path,
    )
    cold = LayerCache(tmp_path / "cache")
    with use(cold):
        (first,) = scan_blobs([blob])
    assert (cold.hits, cold.misses, cold.hashed) == (0, 1, 0)
    warm = LayerCache(tmp_path / "cache")
    with use(warm):
        (again,) = scan_blobs([blob])
    assert (warm.hits, warm.misses, warm.hashed) == (1, 0, 0)
    assert _shape(again.root) == _shape(first.root)


def _shape(folder: TreeDir) -> dict[str, Any]:
    """A layer tree as plain data: folders with their opaque mark, whiteouts, and
    each leaf's kind, target and result."""
    shape: dict[str, Any] = {}
    for name, entry in folder.children.items():
        if entry is WHITED_OUT:
            shape[name] = "whiteout"
        elif isinstance(entry, TreeDir):
            shape[name] = ("dir", entry.opaque, _shape(entry))
        else:
            assert isinstance(entry, Leaf)
            shape[name] = (entry.inode.kind, entry.inode.target, entry.inode.result)
    return shape
