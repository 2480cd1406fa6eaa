"""The outer ``docker save`` tar read as ``docker load`` reads it
(buildmatrix.image.savetar, buildmatrix.image.dockerarchive), with the engine as the
oracle: ``docker load`` of the same bytes (moby ``image/tarexport/load.go``),
``docker save`` of what it loaded, and containerd's ``ctr images import`` for the
OCI side of an archive."""

from __future__ import annotations

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
from tests.images import Dir, Entry, Image, Symlink, fixture, layer_tar

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
