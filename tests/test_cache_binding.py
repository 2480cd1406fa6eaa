"""The layer cache serves an entry only for a blob proven to be that entry's layer.

Entries are kept under a layer's diff_id, but a manifest may pair any blob with any
diff_id; the engine refuses a blob that does not decompress to the diff_id its config
names (moby ``image/tarexport/load.go``: "invalid diffID for layer"; containerd
``core/unpack/unpacker.go``: "wrong diff id calculated on extraction"), and so does
``check --no-cache``. Each test here first fills a cache from honest images, then
checks images whose manifests pair a foreign blob (one whose own digest verifies)
with an already cached diff_id, with the cache and with ``--no-cache``, from an OCI
layout on disk, the tests' registry (skopeo pushes the layout as it is) and a real
containerd's content store (``ctr images import --no-unpack``, which does not unpack
and so does not check diff_ids): the verdict, exit code and message must be the same
(docs/check.md, "Several images, and the layer cache").
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.image.cache import LayerCache
from tests.conftest import CliRunner
from tests.containerd_service import containerd  # noqa: F401
from tests.images import layer_tar, write_oci_layout
from tests.test_image_sources import LAYERED, MISLABELED, skopeo

pytestmark = pytest.mark.integration

Publish = Callable[[Path, str], str]  # an OCI layout and a name -> the REF to check
Descriptor = tuple[dict[str, Any], Path]  # a manifest's layer descriptor, its blob file


def _sha(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


def _manifest(layout: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    index = json.loads((layout / "index.json").read_text())
    blob = layout / "blobs" / "sha256" / index["manifests"][0]["digest"][7:]
    return index, json.loads(blob.read_text())


def _layers(layout: Path) -> list[Descriptor]:
    _, manifest = _manifest(layout)
    blobs = layout / "blobs" / "sha256"
    return [(dict(d), blobs / d["digest"][7:]) for d in manifest["layers"]]


def _tampered(base: Path, out: Path, swaps: dict[int, Descriptor]) -> Path:
    """A copy of the layout ``base`` whose manifest names, for each layer index in
    ``swaps``, another blob (copied in); its config, hence its diff_ids, unchanged."""
    shutil.copytree(base, out)
    index, manifest = _manifest(out)
    blobs = out / "blobs" / "sha256"
    for i, (desc, blob) in swaps.items():
        manifest["layers"][i] = desc
        shutil.copyfile(blob, blobs / desc["digest"][7:])
    body = json.dumps(manifest).encode()
    index["manifests"][0].update(digest=_sha(body), size=len(body))
    (blobs / _sha(body)[7:]).write_bytes(body)
    (out / "index.json").write_text(json.dumps(index))
    return out


def _variants(tmp: Path, *, compress: bool) -> list[tuple[str, Path, int | None]]:
    """The fixture images (LAYERED passes on sm_90, MISLABELED fails) and every
    tampered variant of them whose manifest pairs a blob of a cached layer with
    another cached layer's diff_id: (name, layout, the exit code they must give;
    None: 2 and a diff_id refusal)."""
    images = {"layered": LAYERED, "mislabeled": MISLABELED}
    bases = {
        n: write_oci_layout(tmp / n, i, tag="v1", compress=compress) for n, i in images.items()
    }
    out: list[tuple[str, Path, int | None]] = [
        ("layered", bases["layered"], 0),
        ("mislabeled", bases["mislabeled"], 1),
    ]
    layered, mislabeled = _layers(bases["layered"]), _layers(bases["mislabeled"])
    for i in range(len(layered)):
        for j, desc in enumerate(layered):
            if j != i:
                name = f"layered-{i}-as-{j}"
                out.append((name, _tampered(bases["layered"], tmp / name, {i: desc}), None))
        name = f"layered-{i}-as-mislabeled"
        out.append((name, _tampered(bases["layered"], tmp / name, {i: mislabeled[0]}), None))
        name = f"mislabeled-as-layered-{i}"
        swap = {0: layered[i]}
        out.append((name, _tampered(bases["mislabeled"], tmp / name, swap), None))
    return out


def _outcome(cli: CliRunner, ref: str, *args: str) -> tuple[int, Any]:
    r = cli("check", "--json", "--sm", "9.0", ref, *args)
    assert r.code in (0, 1, 2), r.err
    return r.code, (r.json() if r.code != 2 else r.err)


@pytest.fixture(params=["oci", "registry", "containerd"])
def publish(request: pytest.FixtureRequest, tmp_path: Path) -> Publish:
    """How a layout reaches the source under test; each asks for its real component
    only when used (the registry and containerd of tests/services.py and
    tests/containerd_service.py)."""
    if request.param == "oci":
        return lambda layout, name: f"oci:{layout}:v1"
    if request.param == "registry":
        host = request.getfixturevalue("registry").host

        def push(layout: Path, name: str) -> str:
            dest = f"docker://{host}/bmtest/bind-{tmp_path.name[-12:]}-{name}:v1"
            skopeo("copy", "--dest-tls-verify=false", f"oci:{layout}:v1", dest)
            return dest

        return push
    from tests.test_containerd import import_oci

    store = request.getfixturevalue("containerd")
    monkeypatch = request.getfixturevalue("monkeypatch")
    for key, value in store.env().items():
        monkeypatch.setenv(key, value)

    def imported(layout: Path, name: str) -> str:
        image = f"bmtest/bind-{tmp_path.name[-12:]}-{name}"
        import_oci(store, layout, image)
        return f"containerd:{image}:v1"

    return imported


@pytest.mark.parametrize("compress", [True, False], ids=["gzip", "plain"])
def test_the_cache_never_changes_a_verdict_over_tampered_variants(
    publish: Publish, cli: CliRunner, tmp_path: Path, compress: bool
) -> None:
    """Property over the fixture images and every variant that pairs one cached
    layer's blob with another cached layer's diff_id: the verdict with a warm cache is
    the verdict without one, and a tampered image is refused (exit 2) both ways."""
    variants = [(n, publish(p, n), code) for n, p, code in _variants(tmp_path, compress=compress)]
    cache = str(tmp_path / "cache")
    honest = [ref for _, ref, code in variants if code is not None]
    warm = cli("check", "--json", "--sm", "9.0", *honest, "--cache", cache)
    assert warm.code == 1, warm.err  # MISLABELED fails
    warm = cli("check", "--json", "--sm", "9.0", *honest, "--cache", cache)
    assert warm.json()["cache"]["misses"] == 0  # every layer's entry is there
    assert len(variants) == 2 + 3 * 4
    for name, ref, expected in variants:
        with_cache = _outcome(cli, ref, "--cache", cache)
        assert with_cache == _outcome(cli, ref, "--no-cache"), name
        if expected is None:
            assert with_cache[0] == 2, name
            assert "rootfs.diff_ids names" in with_cache[1], name
        else:
            assert with_cache[0] == expected, name


def _honest_and_foreign(tmp_path: Path) -> tuple[str, str, str, Path]:
    """A cached-to-be layout of LAYERED, and the diff_id of its layer 1 (the one
    whose whiteouts hide layer 0's sm_80 libraries), that layer's blob digest, and a
    layout whose manifest puts layer 0's blob there."""
    base = write_oci_layout(tmp_path / "honest", LAYERED, tag="v1")
    config = LAYERED.config([_sha(layer_tar(layer)) for layer in LAYERED.layers])
    diff_id = json.loads(config)["rootfs"]["diff_ids"][1]
    layers = _layers(base)
    lying = _tampered(base, tmp_path / "lying", {1: layers[0]})
    return str(base), diff_id, str(layers[1][0]["digest"]), lying


def test_an_entry_is_served_only_for_a_bound_blob(cli: CliRunner, tmp_path: Path) -> None:
    """What the CLI relies on, in the cache itself: after a read of the honest image,
    its layer's entry is served for that layer's blob, and not for another blob."""
    base, diff_id, blob, lying = _honest_and_foreign(tmp_path)
    foreign = str(_layers(lying)[1][0]["digest"])
    folder = tmp_path / "cache"
    assert cli("check", f"oci:{base}:v1", "--sm", "9.0", "--cache", str(folder)).code == 0
    cache = LayerCache(folder)
    assert cache.get(diff_id, blob=blob) is not None
    assert cache.get(diff_id, blob=foreign) is None
    assert (cache.hits, cache.misses, cache.unbound) == (1, 1, 1)


@pytest.mark.parametrize("plant", ["group-writable", "another-pair"])
def test_a_binding_not_written_by_a_verified_read_is_not_trusted(
    cli: CliRunner, tmp_path: Path, plant: str
) -> None:
    """A binding is tamper-evident as entries are (tests/test_cache_trust.py): one
    that others could have written, or one whose content names another pair, proves
    nothing, and the foreign blob is still read and refused, as without the cache."""
    base, diff_id, blob, lying = _honest_and_foreign(tmp_path)
    foreign = str(_layers(lying)[1][0]["digest"])
    folder = tmp_path / "cache"
    assert cli("check", f"oci:{base}:v1", "--sm", "9.0", "--cache", str(folder)).code == 0
    cache = LayerCache(folder)
    honest_binding = cache.binding_path(diff_id, blob)
    assert honest_binding.is_file()
    planted = cache.binding_path(diff_id, foreign)
    if plant == "group-writable":
        planted.write_bytes(json.dumps({"diff_id": diff_id, "blob": foreign}).encode())
        planted.chmod(0o664)
    else:
        shutil.copyfile(honest_binding, planted)
        planted.chmod(0o600)
    ref = f"oci:{lying}:v1"
    with_cache = _outcome(cli, ref, "--cache", str(folder))
    assert with_cache == _outcome(cli, ref, "--no-cache")
    assert with_cache[0] == 2 and "rootfs.diff_ids names" in with_cache[1]
