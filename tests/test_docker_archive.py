"""The outer ``docker save`` tar read as ``docker load`` reads it
(buildmatrix.image.savetar, buildmatrix.image.dockerarchive), with the engine as the
oracle: ``docker load`` of the same bytes (moby ``image/tarexport/load.go``),
``docker save`` of what it loaded, and containerd's ``ctr images import`` for the
OCI side of an archive."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from buildmatrix.errors import InputError
from buildmatrix.image.savetar import SavedMember, SaveTree, clean_name
from tests.conftest import CliRunner
from tests.containerd_service import Containerd, containerd  # noqa: F401
from tests.images import Dir, Entry, Image, Symlink, fixture, layer_tar, write_oci_layout
from tests.services import Registry
from tests.test_containerd import oci_archive
from tests.test_image_sources import skopeo

Member = tuple[str, bytes | Symlink | Dir | tuple[str, str]]  # ("hardlink", target): links
HOPPER, SM80 = fixture("libhopper_a.so"), fixture("libsass_sm80.so")


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_outer(path: Path, members: list[Member]) -> Path:
    """A tar of the members exactly as given (names as spelt, in this order)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as out:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if isinstance(data, Dir):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                out.addfile(info)
            elif isinstance(data, Symlink):
                info.type, info.linkname = tarfile.SYMTYPE, data.target
                out.addfile(info)
            elif isinstance(data, tuple):
                info.type, info.linkname = tarfile.LNKTYPE, data[1]
                out.addfile(info)
            else:
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
    return path


def _image(layers: list[bytes], family: str = "hopper") -> tuple[str, bytes]:
    """A config (its member name and bytes) for layer tars given in order."""
    config = Image(layers=[], labels={"io.buildmatrix.family": family}).config(
        [_sha(t) for t in layers]
    )
    return _sha(config).split(":")[1] + ".json", config


def _manifest(config: str, layers: list[str], tag: str = "bmtest/archive:v1") -> bytes:
    return json.dumps([{"Config": config, "RepoTags": [tag], "Layers": layers}]).encode()


def _lib(lib: bytes, mark: str) -> bytes:
    """A layer tar holding one library (and a marker, so that layers differ)."""
    layer: dict[str, Entry] = {"usr/lib/libk.so": lib, f"etc/{mark}": mark.encode()}
    return layer_tar(layer)


@contextmanager
def loaded(docker_host: str, archive: Path) -> Iterator[subprocess.CompletedProcess[str]]:
    """``docker load`` of ``archive``; what it loaded is removed afterwards (else a
    later load of the same layers would not read them: the engine skips a layer
    whose chain it already holds)."""
    docker = ["docker", "-H", docker_host]
    r = subprocess.run(
        [*docker, "load", "-i", str(archive)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        yield r
    finally:
        for line in r.stdout.splitlines():
            if line.startswith(("Loaded image: ", "Loaded image ID: ")):
                name = line.split(": ", 1)[1]
                subprocess.run([*docker, "rmi", "-f", name], capture_output=True, check=False)


# ----------------------------------------------------------------- names, cleaned


@pytest.mark.parametrize(
    ("name", "cleaned"),
    [("X", "X"), ("./X", "X"), ("/X", "X"), ("X//", "X"), ("a/./b/../X", "a/X"), ("/../X", "X")],
)
def test_names_are_cleaned_as_go_does(name: str, cleaned: str) -> None:
    """Go's filepath.Clean, then joined under the extraction folder (Unpack keeps
    '../' but turns '/../' into '/')."""
    assert clean_name(name, source="t") == cleaned


@pytest.mark.parametrize("name", ["..", "../X", "a/../../X"])
def test_names_that_leave_the_folder_are_refused(name: str) -> None:
    with pytest.raises(InputError, match="outside the archive's folder"):
        clean_name(name, source="t")


SPELLINGS = ["./{}", "/{}", "{}//"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_layer_stored_twice_loads_the_later_and_is_refused(
    spelling: str, docker_host: str, cli: CliRunner, tmp_path: Path
) -> None:
    """``X`` (Hopper code) and a later ``./X`` (or ``/X``, ``X//``; sm_80 code) are
    one file to docker load, and the later wins: the config names the later
    layer's diff_id and the engine loads the archive; with the two swapped it
    refuses it (the later one is then not the config's layer). buildmatrix refuses
    both, naming the two members."""
    mark = spelling.replace("/", "s").replace("{}", "x").replace(".", "d")
    good, bad = _lib(HOPPER, f"hopper-{mark}"), _lib(SM80, f"sm80-{mark}")
    name = "abc/layer.tar"
    config_name, config = _image([bad])
    members: list[Member] = [
        (config_name, config),
        (name, good),
        (spelling.format(name), bad),
        ("manifest.json", _manifest(config_name, [name])),
    ]
    archive = write_outer(tmp_path / "twice.tar", members)
    with loaded(docker_host, archive) as r:
        assert r.returncode == 0, r.stderr  # the engine took the later, sm_80 layer
    swapped = [members[0], members[2], members[1], members[3]]
    with loaded(docker_host, write_outer(tmp_path / "swapped.tar", swapped)) as r:
        assert r.returncode != 0 and "invalid diffID" in r.stderr, r.stdout + r.stderr
    result = cli("check", f"docker-archive:{archive}", "--sm", "9.0")
    assert result.code == 2, result.out + result.err
    assert f"'{name}' and '{spelling.format(name)}' name the same file" in result.err


def test_two_spellings_of_the_manifest_are_refused(cli: CliRunner, tmp_path: Path) -> None:
    layer = _lib(SM80, "m")
    config_name, config = _image([layer])
    archive = write_outer(
        tmp_path / "m.tar",
        [
            (config_name, config),
            ("l/layer.tar", layer),
            ("manifest.json", _manifest(config_name, ["l/layer.tar"])),
            ("./manifest.json", _manifest(config_name, [])),
        ],
    )
    result = cli("check", f"docker-archive:{archive}", "--sm", "8.0")
    assert result.code == 2
    assert "'manifest.json' and './manifest.json' name the same file" in result.err


# --------------------------------------------------------- symlinks and hard links


def _repeated_layer_archive(tmp_path: Path, link: str) -> Path:
    """An image whose layers are A, B, A, the third stored as a symlink member as
    Docker 24 and older write it (moby v20.10 ``image/tarexport/save.go``,
    ``saveLayer``: ``<id>/layer.tar -> ../<id0>/layer.tar``)."""
    a, b = _lib(SM80, "a"), _lib(HOPPER, "b")
    config_name, config = _image([a, b, a])
    return write_outer(
        tmp_path / "repeated.tar",
        [
            ("id0/", Dir()),
            ("id0/layer.tar", a),
            ("id1/layer.tar", b),
            ("id2/layer.tar", Symlink(link)),
            (config_name, config),
            ("manifest.json", _manifest(config_name, [f"id{i}/layer.tar" for i in range(3)])),
        ],
    )


@pytest.mark.parametrize("link", ["../id0/layer.tar", "/id0/layer.tar", "../id1/../id0/layer.tar"])
def test_a_layer_stored_as_a_symlink_is_followed(link: str, cli: CliRunner, tmp_path: Path) -> None:
    """The third layer is A again, over B's Hopper library: the image is sm_80."""
    archive = _repeated_layer_archive(tmp_path, link)
    result = cli("check", f"docker-archive:{archive}", "--sm", "9.0", "--json")
    assert result.code == 1, result.out + result.err
    assert [f["sass"] for f in result.json()["files"]] == [["sm_80"]]


@pytest.mark.parametrize(
    ("link", "message"),
    [
        ("../../id0/layer.tar", "leads out of the archive"),
        ("../id2/layer.tar", "symlink loop"),
        ("../id9/layer.tar", "is not in the archive"),
        ("../id0", "a dir, not a regular file"),
    ],
)
def test_links_that_leave_loop_or_dangle_are_refused(
    link: str, message: str, cli: CliRunner, tmp_path: Path
) -> None:
    result = cli("check", f"docker-archive:{_repeated_layer_archive(tmp_path, link)}")
    assert result.code == 2, result.out + result.err
    assert message in result.err


def test_the_engines_own_save_with_a_repeated_layer(
    docker_host: str, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real thing: the engine loads the A, B, A image, and its own ``docker
    save`` writes the repeated layer as a symlink member (Docker 24 and older); the
    saved archive and the engine itself (its save stream, vfs) are read alike."""
    archive = _repeated_layer_archive(tmp_path, "../id0/layer.tar")
    with loaded(docker_host, archive) as r:
        assert r.returncode == 0, r.stderr
        saved = tmp_path / "saved.tar"
        docker = ["docker", "-H", docker_host]
        subprocess.run([*docker, "save", "-o", str(saved), "bmtest/archive:v1"], check=True)
        with tarfile.open(saved) as tar:
            links = [m for m in tar if m.issym()]
        if not links:
            pytest.skip("this engine's docker save writes no symlink members (Docker 25+)")
        assert links[0].name.endswith("/layer.tar"), links[0].name
        monkeypatch.setenv("DOCKER_HOST", docker_host)
        for source in (f"docker-archive:{saved}", "docker-daemon:bmtest/archive:v1"):
            result = cli("check", source, "--sm", "9.0", "--json")
            assert result.code == 1, result.out + result.err
            assert [f["sass"] for f in result.json()["files"]] == [["sm_80"]]


def test_a_hard_link_member_is_the_file_it_names(cli: CliRunner, tmp_path: Path) -> None:
    a, b = _lib(SM80, "a"), _lib(HOPPER, "b")
    config_name, config = _image([b, a])
    archive = write_outer(
        tmp_path / "hard.tar",
        [
            ("id0/layer.tar", a),
            ("id1/layer.tar", b),
            ("id2/layer.tar", ("hardlink", "id0/layer.tar")),
            (config_name, config),
            ("manifest.json", _manifest(config_name, ["id1/layer.tar", "id2/layer.tar"])),
        ],
    )
    result = cli("check", f"docker-archive:{archive}", "--sm", "9.0", "--json")
    assert result.code == 1, result.out + result.err
    assert [f["sass"] for f in result.json()["files"]] == [["sm_80"]]


def test_a_member_under_a_symlink_member_is_refused() -> None:
    tree = SaveTree("t")
    tree.add(SavedMember(name="d", path="d", kind="symlink", target="e"))
    with pytest.raises(InputError, match="lies under 'd', which is a symlink"):
        tree.add(SavedMember(name="d/layer.tar", path="d/layer.tar", kind="file"))


# ------------------------------------------------------------ layers vs diff_ids


def test_a_layer_that_is_not_its_diff_id_is_refused(
    docker_host: str, cli: CliRunner, tmp_path: Path
) -> None:
    """The config names the Hopper layer, the archive holds an sm_80 one: the engine
    refuses the load ("invalid diffID"), or, where it already holds the Hopper
    layer, runs that and never reads the archive's. Either way the sm_80 layer is
    not what runs: refused, for a plain and a gzip layer."""
    good, bad = _lib(HOPPER, "claimed"), _lib(SM80, "held")
    config_name, config = _image([good])
    for layer, stored in ((bad, "l/layer.tar"), (gzip.compress(bad, mtime=0), "l/layer.tar.gz")):
        archive = write_outer(
            tmp_path / "mismatch.tar",
            [
                (config_name, config),
                (stored, layer),
                ("manifest.json", _manifest(config_name, [stored])),
            ],
        )
        with loaded(docker_host, archive) as r:
            assert r.returncode != 0 and "invalid diffID" in r.stderr, r.stdout + r.stderr
        result = cli("check", f"docker-archive:{archive}", "--sm", "9.0")
        assert result.code == 2, result.out + result.err
        assert f"rootfs.diff_ids names {_sha(good)}" in result.err


def test_diff_ids_counted_as_layers(docker_host: str, cli: CliRunner, tmp_path: Path) -> None:
    layer = _lib(SM80, "count")
    config_name, config = _image([layer, layer])
    archive = write_outer(
        tmp_path / "count.tar",
        [
            (config_name, config),
            ("l/layer.tar", layer),
            ("manifest.json", _manifest(config_name, ["l/layer.tar"])),
        ],
    )
    with loaded(docker_host, archive) as r:
        assert r.returncode != 0 and "layers length mismatch" in r.stderr, r.stderr
    result = cli("check", f"docker-archive:{archive}", "--sm", "8.0")
    assert result.code == 2
    assert "rootfs.diff_ids names 2 layers, the manifest 1" in result.err


def _oci_with_claim(path: Path, stored: bytes, claimed: bytes) -> Path:
    """An OCI layout whose one gzip layer holds ``stored`` while the config's
    diff_id names ``claimed``."""
    layout = write_oci_layout(path, Image(layers=[{"etc/x": b"placeholder"}]), tag="v1")
    blobs = layout / "blobs" / "sha256"
    index = json.loads((layout / "index.json").read_text())
    manifest_path = blobs / index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads(manifest_path.read_text())
    config = json.loads((blobs / manifest["config"]["digest"].split(":")[1]).read_text())
    config["rootfs"]["diff_ids"] = [_sha(claimed)]
    config_bytes = json.dumps(config).encode()
    blob = gzip.compress(stored, mtime=0)
    for data in (config_bytes, blob):
        (blobs / _sha(data).split(":")[1]).write_bytes(data)
    manifest["config"].update(digest=_sha(config_bytes), size=len(config_bytes))
    manifest["layers"][0].update(digest=_sha(blob), size=len(blob))
    manifest_bytes = json.dumps(manifest).encode()
    (blobs / _sha(manifest_bytes).split(":")[1]).write_bytes(manifest_bytes)
    index["manifests"][0].update(digest=_sha(manifest_bytes), size=len(manifest_bytes))
    (layout / "index.json").write_text(json.dumps(index))
    return layout


def test_oci_and_registry_layers_are_checked_against_diff_ids(
    registry: Registry, cli: CliRunner, tmp_path: Path
) -> None:
    """Every blob digest verifies, but the gzip layer's content is not the config's
    diff_id: refused from the layout and from the registry (skopeo copies it
    as it is)."""
    good, bad = _lib(HOPPER, "claimed"), _lib(SM80, "held")
    layout = _oci_with_claim(tmp_path / "claim", bad, good)
    dest = f"docker://{registry.host}/bmtest/claim:v1"
    skopeo("copy", "--dest-tls-verify=false", f"oci:{layout}:v1", dest)
    for source in (f"oci:{layout}:v1", dest):
        result = cli("check", source, "--sm", "9.0")
        assert result.code == 2, source + result.out + result.err
        assert f"rootfs.diff_ids names {_sha(good)}" in result.err


def test_a_cached_blob_claimed_for_another_diff_id_is_read_again(
    cli: CliRunner, tmp_path: Path
) -> None:
    """The cache is keyed by diff_id: an image that pairs an already cached (and
    honest) blob with another layer's diff_id is read, and refused, not served the
    cached summary."""
    good, bad = _lib(HOPPER, "claimed"), _lib(SM80, "held")
    honest = _oci_with_claim(tmp_path / "honest", bad, bad)
    cache = tmp_path / "cache"
    assert cli("check", f"oci:{honest}:v1", "--sm", "8.0", "--cache", str(cache)).code == 0
    lying = _oci_with_claim(tmp_path / "lying", bad, good)
    result = cli("check", f"oci:{lying}:v1", "--sm", "9.0", "--cache", str(cache))
    assert result.code == 2, result.out + result.err
    assert "rootfs.diff_ids names" in result.err


# ------------------------------------------------------- index.json vs manifest.json


def _oci_archive(tmp_path: Path, *, index_image: bytes, manifest_image: bytes) -> Path:
    """A Docker 25-style archive (``oci-layout``, ``index.json``, blobs, and a
    ``manifest.json``) whose index names an image of ``index_image`` and whose
    manifest.json one of ``manifest_image`` (layer tars)."""
    members: list[Member] = [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')]
    blobs: dict[str, bytes] = {}

    def put(data: bytes) -> str:
        blobs[_sha(data)] = data
        return _sha(data)

    configs = {}
    for which, layer in (("index", index_image), ("manifest", manifest_image)):
        config = Image(layers=[], labels={"io.buildmatrix.family": "hopper"}).config([_sha(layer)])
        configs[which] = (put(config), len(config), put(layer), len(layer))
    cdigest, csize, ldigest, lsize = configs["index"]
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": cdigest,
                "size": csize,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": ldigest,
                    "size": lsize,
                }
            ],
        }
    ).encode()
    mdigest = put(manifest)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": mdigest,
                "size": len(manifest),
                "annotations": {"io.containerd.image.name": "docker.io/bmtest/archive:v1"},
            }
        ],
    }
    members += [(f"blobs/sha256/{d.split(':')[1]}", data) for d, data in blobs.items()]
    members.append(("index.json", json.dumps(index).encode()))
    cdigest, _, ldigest, _ = configs["manifest"]
    members.append(
        (
            "manifest.json",
            _manifest(
                f"blobs/sha256/{cdigest.split(':')[1]}", [f"blobs/sha256/{ldigest.split(':')[1]}"]
            ),
        )
    )
    return write_outer(tmp_path / "oci-archive.tar", members)


def test_index_and_manifest_naming_other_images_are_refused(
    docker_host: str, containerd_socket: str, cli: CliRunner, tmp_path: Path
) -> None:
    """index.json names a Hopper image, manifest.json an sm_80 one: the classic
    engine loads the manifest.json image (its ID is that config's digest),
    containerd imports the index.json image; buildmatrix refuses the archive."""
    hopper, sm80 = _lib(HOPPER, "index"), _lib(SM80, "manifest")
    archive = _oci_archive(tmp_path, index_image=hopper, manifest_image=sm80)
    sm80_config = Image(layers=[], labels={"io.buildmatrix.family": "hopper"}).config([_sha(sm80)])
    with loaded(docker_host, archive) as r:
        assert r.returncode == 0, r.stderr
        docker = ["docker", "-H", docker_host, "image", "inspect", "bmtest/archive:v1"]
        image = json.loads(subprocess.run(docker, capture_output=True, check=True).stdout)[0]
        assert image["Id"] == _sha(sm80_config)
    ctr = ["ctr", "-a", containerd_socket, "-n", "oci-archive"]
    subprocess.run(
        [*ctr, "images", "import", "--no-unpack", str(archive)], capture_output=True, check=True
    )
    listed = subprocess.run(
        [*ctr, "images", "ls"], capture_output=True, text=True, check=True
    ).stdout
    index = json.loads(next(data for name, data in _members(archive) if name == "index.json"))
    assert index["manifests"][0]["digest"] in listed  # containerd's image: the index's
    result = cli("check", f"docker-archive:{archive}", "--sm", "9.0")
    assert result.code == 2, result.out + result.err
    assert "ambiguous" in result.err
    same = _oci_archive(tmp_path, index_image=sm80, manifest_image=sm80)
    agreed = cli("check", f"docker-archive:{same}", "--sm", "9.0", "--json")
    assert agreed.code == 1, agreed.out + agreed.err  # one image, judged: sm_80 fails 9.0


def _members(archive: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(archive) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar if m.isreg()]  # type: ignore[union-attr]


# ------------------------------------------------------------ sizes past the end


def _base256_size(raw: bytes, name: str, size: int) -> bytes:
    """``raw`` with the ustar header of member ``name`` claiming ``size`` bytes in
    base-256 (GNU), the checksum fixed."""
    data = bytearray(raw)
    at = next(
        i
        for i in range(0, len(data), 512)
        if data[i : i + 100].rstrip(b"\0") == name.encode() and data[i + 156] in b"0\0"
    )
    data[at + 124 : at + 136] = b"\x80" + size.to_bytes(11, "big")
    data[at + 148 : at + 156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\0 " % sum(data[at : at + 512])
    return bytes(data)


def test_an_outer_member_claiming_more_than_the_archive_is_refused(
    docker_host: str, cli: CliRunner, tmp_path: Path
) -> None:
    layer = _lib(SM80, "huge")
    config_name, config = _image([layer])
    members: list[Member] = [
        (config_name, config),
        ("manifest.json", _manifest(config_name, ["l/layer.tar"])),
        ("l/layer.tar", layer),  # last: a reader that skips it sees a clean end
    ]
    raw = write_outer(tmp_path / "plain.tar", members).read_bytes()
    archive = tmp_path / "huge.tar"
    archive.write_bytes(_base256_size(raw, "l/layer.tar", 1 << 60))
    with loaded(docker_host, archive) as r:
        assert r.returncode != 0, r.stdout
    result = cli("check", f"docker-archive:{archive}", "--sm", "8.0")
    assert result.code == 2, result.out + result.err
    assert "past the archive's end" in result.err


@pytest.mark.parametrize("position", ["first", "last"])
def test_a_layer_member_claiming_more_than_the_layer_is_refused(
    position: str, docker_host: str, cli: CliRunner, tmp_path: Path
) -> None:
    """Inside the layer, in place (plain) and streamed (gzip): refused, as the
    engine refuses to load it."""
    files = {"usr/lib/a.so": SM80, "usr/lib/b.so": HOPPER}
    target = "usr/lib/a.so" if position == "first" else "usr/lib/b.so"
    layer = _base256_size(layer_tar(files), target, 1 << 60)  # type: ignore[arg-type]
    config_name, config = _image([layer])
    for stored, data in (("l/layer.tar", layer), ("l/layer.tar.gz", gzip.compress(layer, mtime=0))):
        archive = write_outer(
            tmp_path / "inner.tar",
            [
                (config_name, config),
                (stored, data),
                ("manifest.json", _manifest(config_name, [stored])),
            ],
        )
        with loaded(docker_host, archive) as r:
            assert r.returncode != 0, r.stdout
        result = cli("check", f"docker-archive:{archive}", "--sm", "8.0")
        assert result.code == 2, stored + result.out + result.err
        assert f"the layer ends inside the data of member '{target}'" in result.err, result.err


# ------------------------------------------------------------- compressed archives


def _compress(kind: str, data: bytes) -> bytes:
    import bz2
    import lzma

    import zstandard

    if kind == "gzip":
        return gzip.compress(data, mtime=0)
    if kind == "bzip2":
        return bz2.compress(data)
    if kind == "xz":
        return lzma.compress(data)
    # a skippable frame first, as moby's zstd matcher also accepts
    skippable = (0x184D2A50).to_bytes(4, "little") + (4).to_bytes(4, "little") + b"skip"
    return skippable + zstandard.ZstdCompressor().compress(data)


def _without_ref(doc: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in doc.items() if k not in ("image", "ref")}


@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz", "zstd"])
def test_a_compressed_archive_is_read_as_docker_load_reads_it(
    kind: str, docker_host: str, cli: CliRunner, tmp_path: Path
) -> None:
    """``docker load`` decompresses the archive before it extracts it (moby
    ``chrootarchive.Untar`` -> ``DecompressStream``; Docker's docs load a
    ``busybox.tar.gz``): the engine loads the compressed bytes, and ``check`` gives
    the plain archive's report for them (it used to refuse them, exit 2, as a tar
    header "parsed differently"). The engine here (Docker 20.10) decompresses gzip,
    bzip2 and xz; zstd came with later engines, so for it only the reports compare."""
    layer = _lib(SM80, f"packed-{kind}")
    config_name, config = _image([layer])
    plain = write_outer(
        tmp_path / "plain.tar",
        [
            (config_name, config),
            ("l/layer.tar", layer),
            ("manifest.json", _manifest(config_name, ["l/layer.tar"], f"bmtest/{kind}:v1")),
        ],
    )
    packed = tmp_path / f"image.tar.{kind}"
    packed.write_bytes(_compress(kind, plain.read_bytes()))
    if kind != "zstd":
        with loaded(docker_host, packed) as r:
            assert r.returncode == 0, r.stderr
    want = cli("check", f"docker-archive:{plain}", "--sm", "9.0", "--json")
    got = cli("check", f"docker-archive:{packed}", "--sm", "9.0", "--json")
    assert want.code == got.code == 1, got.out + got.err
    assert _without_ref(got.json()) == _without_ref(want.json())
    cut = tmp_path / f"cut.tar.{kind}"
    cut.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    result = cli("check", f"docker-archive:{cut}", "--sm", "9.0")
    assert result.code == 2 and f"a {kind}-compressed archive that does not" in result.err


@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz", "zstd"])
def test_compressed_layers_are_read_as_docker_load_reads_them(
    kind: str, docker_host: str, cli: CliRunner, tmp_path: Path
) -> None:
    """A layer inside the archive compressed with gzip, bzip2, xz or zstd: ``docker
    load`` inflates it (moby ``image/tarexport/load.go`` ``loadLayer`` ->
    ``DecompressStream``, by magic bytes) and checks it against its diff_id, so the
    engine here (Docker 20.10: gzip, bzip2, xz) loads it with the plain layer's
    diff_id, and ``check`` gives the plain archive's report (bzip2 and xz layers
    were read as plain tars and refused for a tar header "parsed differently"). zstd
    layers came with later engines (moby/go-archive), so for it only the reports
    compare."""
    layer = _lib(SM80, f"layer-{kind}")
    config_name, config = _image([layer])

    def archive(path: Path, stored: bytes) -> Path:
        members = [(config_name, config), ("l/layer.tar", stored)]
        tag = f"bmtest/layer-{kind}:v1"
        return write_outer(
            path, [*members, ("manifest.json", _manifest(config_name, ["l/layer.tar"], tag))]
        )

    plain = archive(tmp_path / "plain.tar", layer)
    packed = archive(tmp_path / "packed.tar", _compress(kind, layer))
    if kind != "zstd":
        with loaded(docker_host, packed) as r:
            assert r.returncode == 0, r.stderr
            inspect = subprocess.run(
                ["docker", "-H", docker_host, "image", "inspect", f"bmtest/layer-{kind}:v1"],
                capture_output=True,
                text=True,
                check=True,
            )
            assert json.loads(inspect.stdout)[0]["RootFS"]["Layers"] == [_sha(layer)]
    want = cli("check", f"docker-archive:{plain}", "--sm", "9.0", "--json")
    got = cli("check", f"docker-archive:{packed}", "--sm", "9.0", "--json")
    assert want.code == got.code == 1, got.out + got.err
    assert _without_ref(got.json()) == _without_ref(want.json())
    cut = archive(tmp_path / "cut.tar", _compress(kind, layer)[:-40])
    result = cli("check", f"docker-archive:{cut}", "--sm", "9.0")
    assert result.code == 2 and "not a readable layer tar" in result.err, result.err


@pytest.mark.parametrize("kind", ["bzip2", "xz"])
def test_bzip2_and_xz_layers_are_refused_where_containerd_unpacks_them(
    kind: str,
    containerd: Containerd,  # noqa: F811
    cli: CliRunner,
    tmp_path: Path,
) -> None:
    """Outside ``docker load``, layers are unpacked by containerd, which tells gzip
    and zstd apart (``pkg/archive/compression`` ``DetectCompression``) and takes
    anything else for a plain tar: the real containerd fails to unpack a bzip2 or xz
    layer of an OCI layout (``ctr images import``), and ``check oci:`` refuses it
    (exit 2) saying so, where it said "not a readable layer tar"."""
    image = Image(layers=[{"usr/lib/libk.so": _lib(SM80, f"oci-{kind}")}])
    layout = write_oci_layout(
        tmp_path / "layout", image, tag="v1", pack=lambda b: _compress(kind, b)
    )
    archive = oci_archive(layout, tmp_path / "layout.tar")
    # containerd: "failed to extract layer …: archive/tar: invalid tar header"
    with pytest.raises(AssertionError, match=r"failed to extract layer .*invalid tar header"):
        containerd.ctr("images", "import", "--base-name", f"bm/{kind}", str(archive))
    result = cli("check", f"oci:{layout}:v1", "--sm", "9.0")
    assert result.code == 2, result.out + result.err
    assert f"the layer is {kind}-compressed. containerd reads gzip and zstd" in result.err
