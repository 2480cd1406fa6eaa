"""Image documents held to Go's ``encoding/json`` (buildmatrix.image.gokeys).

Go matches JSON keys to struct fields without regard to case (Unicode folding
included) and keeps the last; Python's ``json`` keeps each spelling and buildmatrix
reads the exact one. Oracles: Go's encoding/json itself (tests/gojson/main.go, with
the JSON tags of the image-spec and moby structs) over every combination of
spellings below, and the Docker engine (``docker load`` + ``docker export`` /
``docker inspect``) for the ``docker save`` manifest and the image config, where the
old reading passed an sm_80 library the engine runs.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.errors import InputError
from buildmatrix.image.gokeys import check_keys, loads
from tests.conftest import CliRunner
from tests.images import Image, fixture, layer_tar, write_oci_layout
from tests.services import engine_export

SM80, HOPPER = fixture("libsass_sm80.so"), fixture("libhopper_a.so")

# Spellings of a key: itself, other cases, and Unicode letters Go folds to ASCII ones.
LONG_S, KELVIN = "\u017f", "\u212a"


def spellings(key: str) -> list[str]:
    variants = [key, key.upper(), key.lower(), key[:1].upper() + key[1:]]
    variants += [key.replace("s", LONG_S), key.replace("k", KELVIN)]
    return list(dict.fromkeys(v for v in variants if v))


def combos(key: str) -> list[tuple[str, ...]]:
    """The key absent, once in any spelling, or twice (two spellings, in order)."""
    one = [(s,) for s in spellings(key)]
    return [(), *one, *itertools.permutations(spellings(key), 2)]


def go_read(gojson: Path, kind: str, doc: str) -> Any:
    out = subprocess.run(
        [str(gojson), kind], input=doc, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)


def _object(pairs: list[tuple[str, str]]) -> str:
    """A JSON object with the keys in this order (repeated keys kept: json.dumps of a
    dict could not write them)."""
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs) + "}"


def _ours(doc: str, kind: str) -> Any:
    try:
        check_keys(json.loads(doc), shape=kind, name="doc")
    except InputError:
        return "refused"
    return json.loads(doc)


def _compare(gojson: Path, kind: str, docs: list[str], read: Any) -> tuple[int, int]:
    refused = agreed = 0
    for doc in docs:
        ours, go = _ours(doc, kind), go_read(gojson, kind, doc)
        if ours == "refused":
            refused += 1
            continue
        assert read(ours) == read(go), (doc, go)
        agreed += 1
    return refused, agreed


def test_manifest_keys_read_as_go_reads_them(gojson: Path) -> None:
    """``layers`` and a descriptor's ``size`` in every spelling: buildmatrix refuses
    the manifest, or reads the layers and sizes Go reads."""
    docs = []
    for layers, size in itertools.product(combos("layers"), combos("size")):
        pairs = [("schemaVersion", "2")]
        pairs += [(k, f'[{{"digest": "sha256:{i}"}}]') for i, k in enumerate(layers)]
        config = _object([("digest", '"c"'), *[(k, str(10 + i)) for i, k in enumerate(size)]])
        docs.append(_object([*pairs, ("config", config)]))

    def read(doc: dict[str, Any]) -> Any:
        return (
            [d.get("digest") for d in doc.get("layers") or []],
            (doc.get("config") or {}).get("size") or 0,
        )

    refused, agreed = _compare(gojson, "manifest", docs, read)
    assert refused and agreed, (refused, agreed)


def test_config_keys_read_as_go_reads_them(gojson: Path) -> None:
    """``config.Env`` (CUDA_VERSION, NVIDIA_REQUIRE_CUDA) and ``os`` in every spelling."""
    docs = []
    for env, os_ in itertools.product(combos("Env"), combos("os")):
        run = _object([(k, f'["CUDA_VERSION=1{i}.0"]') for i, k in enumerate(env)])
        docs.append(_object([*[(k, f'"os{i}"') for i, k in enumerate(os_)], ("config", run)]))

    def read(doc: dict[str, Any]) -> Any:
        return ((doc.get("config") or {}).get("Env") or [], doc.get("os") or "")

    refused, agreed = _compare(gojson, "config", docs, read)
    assert refused and agreed, (refused, agreed)


def test_save_manifest_keys_read_as_go_reads_them(gojson: Path) -> None:
    """A ``docker save`` manifest.json entry's ``Config`` and ``Layers``."""
    docs = []
    for config, layers in itertools.product(combos("Config"), combos("Layers")):
        pairs = [(k, f'"c{i}.json"') for i, k in enumerate(config)]
        pairs += [(k, f'["l{i}/layer.tar"]') for i, k in enumerate(layers)]
        docs.append("[" + _object(pairs) + "]")

    def read(doc: list[dict[str, Any]]) -> Any:
        return [(e.get("Config") or "", e.get("Layers") or []) for e in doc]

    refused, agreed = _compare(gojson, "saveentry", docs, read)
    assert refused and agreed, (refused, agreed)


def test_maps_are_not_structs() -> None:
    """Labels and annotations are maps to Go: two keys that differ in case are two
    labels, and nothing is refused for them."""
    config = {"config": {"Labels": {"a": "1", "A": "2"}, "Env": []}, "os": "linux"}
    check_keys(config, shape="config", name="c")
    manifest = {"annotations": {"k": "1", "K": "2"}, "layers": [{"annotations": {"x": ""}}]}
    check_keys(manifest, shape="manifest", name="m")


# ---------------------------------------------------------------- the engine's view


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _archive(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as out:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return path


def _engine_env(
    docker_host: str, tmp_path: Path, config: bytes, layer: bytes, tag: str
) -> tuple[Path, list[str]]:
    """A docker save archive of ``config`` and ``layer``, and the Env the engine gives
    its containers once it has loaded it (``docker load``, ``docker inspect``)."""
    manifest = [{"Config": f"{_sha(config)}.json", "RepoTags": [tag], "Layers": ["l/layer.tar"]}]
    archive = _archive(
        tmp_path / "image.tar",
        [
            (f"{_sha(config)}.json", config),
            ("l/layer.tar", layer),
            ("manifest.json", json.dumps(manifest).encode()),
        ],
    )
    docker = ["docker", "-H", docker_host]
    subprocess.run([*docker, "load", "-i", str(archive)], capture_output=True, check=True)
    try:
        env = subprocess.run(
            [*docker, "inspect", "--format", "{{json .Config.Env}}", tag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        subprocess.run([*docker, "rmi", "-f", tag], capture_output=True, check=False)
    return archive, json.loads(env)


def _engine_files(host: str, archive: Path, tag: str) -> set[str]:
    exported = engine_export(host, archive, tag)
    assert isinstance(exported, bytes), f"docker load refused the archive: {exported}"
    with tarfile.open(fileobj=io.BytesIO(exported)) as tar:
        return {m.name for m in tar if m.isreg()}


def test_a_save_manifest_with_two_spellings_is_refused(
    docker_host: str, cli: CliRunner, tmp_path: Path
) -> None:
    """``Config``/``Layers`` name a Hopper image, the later ``config``/``layers`` an
    sm_80 one: docker load runs the sm_80 one (it used to pass on 9.0 here)."""
    good, bad = layer_tar({"usr/lib/libgood.so": HOPPER}), layer_tar({"usr/lib/libbad.so": SM80})
    cg = Image(layers=[]).config([f"sha256:{_sha(good)}"])
    cb = Image(layers=[]).config([f"sha256:{_sha(bad)}"])
    tag = "bmtest/go-json-save:v1"
    entry = _object(
        [
            ("Config", json.dumps(f"{_sha(cg)}.json")),
            ("RepoTags", json.dumps([tag])),
            ("Layers", '["g/layer.tar"]'),
            ("config", json.dumps(f"{_sha(cb)}.json")),
            ("layers", '["b/layer.tar"]'),
        ]
    )
    archive = _archive(
        tmp_path / "image.tar",
        [
            (f"{_sha(cg)}.json", cg),
            (f"{_sha(cb)}.json", cb),
            ("g/layer.tar", good),
            ("b/layer.tar", bad),
            ("manifest.json", f"[{entry}]".encode()),
        ],
    )
    assert "usr/lib/libbad.so" in _engine_files(docker_host, archive, tag)
    result = cli("check", f"docker-archive:{archive}", "--sm", "9.0")
    assert result.code == 2, result.out + result.err
    assert "'Config', 'config'" in result.err and "encoding/json" in result.err


def test_a_config_with_two_spellings_of_env_is_refused(
    docker_host: str, cli: CliRunner, tmp_path: Path
) -> None:
    """``Env`` then ``env``: the engine's container gets the later one (``docker
    inspect``), which buildmatrix would not have read."""
    layer = layer_tar({"usr/lib/libgood.so": HOPPER})
    doc = json.loads(Image(layers=[]).config([f"sha256:{_sha(layer)}"]))
    run = _object([("Env", '["CUDA_VERSION=12.0"]'), ("env", '["CUDA_VERSION=13.0"]')])
    pairs = [(k, json.dumps(v)) for k, v in doc.items() if k != "config"]
    config = _object([*pairs, ("config", run)]).encode()
    archive, env = _engine_env(docker_host, tmp_path, config, layer, "bmtest/go-json-env:v1")
    assert env == ["CUDA_VERSION=13.0"]
    result = cli("check", f"docker-archive:{archive}", "--sm", "9.0")
    assert result.code == 2, result.out + result.err
    assert "'Env', 'env'" in result.err


@pytest.mark.parametrize("kind", ["manifest", "config", "saveentry"])
def test_an_ordinary_document_passes(kind: str) -> None:
    """What docker save, buildx and the registries write: one exact spelling each."""
    docs = {
        "manifest": {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "x", "digest": "sha256:0", "size": 1},
            "layers": [{"mediaType": "x", "digest": "sha256:1", "size": 2}],
        },
        "config": json.loads(Image(layers=[]).config(["sha256:" + "0" * 64])),
        "saveentry": [{"Config": "c.json", "RepoTags": ["a:b"], "Layers": ["l/layer.tar"]}],
    }
    check_keys(docs[kind], shape=kind, name="doc")


@pytest.mark.parametrize(
    ("escape", "refused"),
    [("\\udc80", True), ("\\ud800", True), ("\\ud83d\\ude00", False), ("\\u00e9", False)],
)
def test_lone_surrogate_escapes_are_refused(escape: str, refused: bool, gojson: Path) -> None:
    """Go reads a lone surrogate escape as U+FFFD, Python keeps the surrogate (and
    tarfile names a member with the byte 0x80 so): refused; a pair, or any other
    escape, reads alike and passes."""
    doc = f'[{{"Config": "c{escape}.json", "Layers": []}}]'
    go = go_read(gojson, "saveentry", doc)[0]["Config"]
    python = json.loads(doc)[0]["Config"]
    assert (go != python) == refused, (go, python)
    if refused:
        with pytest.raises(InputError, match="lone UTF-16 surrogate"):
            check_keys(json.loads(doc), shape="saveentry", name="m")
    else:
        check_keys(json.loads(doc), shape="saveentry", name="m")


def test_a_save_manifest_naming_members_by_a_lone_surrogate_is_refused(
    docker_host: str, cli: CliRunner, tmp_path: Path
) -> None:
    """``c\\udc80.json`` and ``g\\udc80/layer.tar``: tarfile reads the members whose
    names hold the byte 0x80 (a Hopper image), docker load the ones named U+FFFD (an
    sm_80 one). The old reading passed the image on 9.0."""
    good, bad = layer_tar({"usr/lib/libgood.so": HOPPER}), layer_tar({"usr/lib/libbad.so": SM80})
    cg = Image(layers=[]).config([f"sha256:{_sha(good)}"])
    cb = Image(layers=[]).config([f"sha256:{_sha(bad)}"])
    tag = "bmtest/go-json-surrogate:v1"
    manifest = f'[{{"Config": "c\\udc80.json", "RepoTags": ["{tag}"], "Layers": ["g\\udc80/l"]}}]'
    archive = tmp_path / "image.tar"
    with tarfile.open(
        archive, "w", format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as out:
        for name, data in [
            ("c\udc80.json", cg),
            ("c\ufffd.json", cb),
            ("g\udc80/l", good),
            ("g\ufffd/l", bad),
            ("manifest.json", manifest.encode()),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    assert "usr/lib/libbad.so" in _engine_files(docker_host, archive, tag)
    result = cli("check", f"docker-archive:{archive}", "--sm", "9.0")
    assert result.code == 2, result.out + result.err
    assert "lone UTF-16 surrogate" in result.err


def test_a_repeated_object_field_is_refused(gojson: Path) -> None:
    """Go decodes a repeated object-valued field into the one it holds (the two
    merge), Python keeps the last: the config's Env is Go's only."""
    doc = '{"os": "linux", "config": {"Env": ["CUDA_VERSION=13.0"]}, "config": {"Labels": {}}}'
    assert go_read(gojson, "config", doc)["config"]["Env"] == ["CUDA_VERSION=13.0"]
    assert "Env" not in json.loads(doc)["config"]
    with pytest.raises(InputError, match="appears twice"):
        loads(doc.encode(), name="c")
    assert loads(b'{"config": {"Env": []}}', name="c") == {"config": {"Env": []}}


def test_a_config_with_a_repeated_config_object_is_refused(
    docker_host: str, cli: CliRunner, tmp_path: Path
) -> None:
    """The engine's container gets the first object's Env (CUDA_VERSION=13.0, which
    the NVIDIA toolkit turns into a cuda>=13.0 requirement); buildmatrix read none."""
    layer = layer_tar({"usr/lib/libgood.so": HOPPER})
    doc = json.loads(Image(layers=[]).config([f"sha256:{_sha(layer)}"]))
    pairs = [(k, json.dumps(v)) for k, v in doc.items() if k != "config"]
    pairs += [("config", '{"Env": ["CUDA_VERSION=13.0"]}'), ("config", '{"Labels": {}}')]
    config = _object(pairs).encode()
    archive, env = _engine_env(docker_host, tmp_path, config, layer, "bmtest/go-json-twice:v1")
    assert "CUDA_VERSION=13.0" in env
    result = cli("check", f"docker-archive:{archive}", "--sm", "9.0")
    assert result.code == 2, result.out + result.err
    assert "appears twice" in result.err


def test_deep_nesting_is_refused_not_a_traceback(cli: CliRunner, tmp_path: Path) -> None:
    """Python's decoder recurses per level: a manifest.json nested 200,000 deep raised
    RecursionError (a traceback); it is refused (exit 2)."""
    deep = b"[" * 200_000 + b"]" * 200_000
    with pytest.raises(InputError, match="nested deeper"):
        loads(deep, name="m")
    archive = _archive(tmp_path / "deep.tar", [("manifest.json", deep)])
    result = cli("check", f"docker-archive:{archive}", "--sm", "9.0")
    assert result.code == 2 and "nested deeper" in result.err, result.err


@pytest.mark.parametrize("kind", ["twice", "deep"])
def test_an_oci_index_read_as_a_blob_is_held_to_the_same_rules(
    kind: str, cli: CliRunner, tmp_path: Path
) -> None:
    """Documents fetched as blobs (an OCI layout's index and manifests, a registry's, a
    content store's) are read by the same reader: a key twice in one object (Go
    merges a repeated ``platform`` object, so the two readers could pick different
    manifests) and nesting past Python's reader (a RecursionError traceback) are
    refused with exit 2."""
    layout = write_oci_layout(tmp_path / "oci", Image(layers=[{"usr/lib/libgood.so": HOPPER}]))
    index = json.loads((layout / "index.json").read_text())
    digest = index["manifests"][0]["digest"]
    blob = layout / "blobs" / "sha256" / digest.split(":")[1]
    manifest = blob.read_bytes()
    if kind == "twice":
        bad = manifest[:-1] + b', "schemaVersion": 2}'
        needle = "appears twice"
    else:
        bad = manifest[:-1] + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        needle = "nested deeper"
    (layout / "blobs" / "sha256" / _sha(bad)).write_bytes(bad)
    index["manifests"][0].update(digest=f"sha256:{_sha(bad)}", size=len(bad))
    (layout / "index.json").write_text(json.dumps(index))
    result = cli("check", f"oci:{layout}", "--sm", "9.0")
    assert result.code == 2, result.out + result.err
    assert needle in result.err and "Traceback" not in result.err
