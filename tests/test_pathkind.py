"""A plain path to an image (``check image.tar``, ``check LAYOUT``) is judged as that
image, never as one file: archives and layouts written by the real engine (``docker
build`` + ``docker save``) and by skopeo (``oci:``, ``oci-archive:``), through the CLI.

Before, ``check saved.tar`` read the tar as one plain file: "0 with device code",
exit 1, as if the image were a CPU-only build.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliRunner
from tests.fixtures.build import BIN
from tests.services import engine_export

pytestmark = pytest.mark.integration

TAG = "bmtest/pathkind:v1"
DOCKERFILE = """FROM scratch
COPY libhopper_a.so libsass_ptx.so /usr/lib/
LABEL io.buildmatrix.family=hopper
"""


def _docker(host: str, *args: str) -> None:
    subprocess.run(["docker", "-H", host, *args], check=True, capture_output=True)


def _skopeo(*args: str) -> None:
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed (Debian package skopeo)")
    subprocess.run(["skopeo", "--insecure-policy", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def saved(docker_host: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine's own build of two fixture libraries, saved by ``docker save``."""
    root = tmp_path_factory.mktemp("pathkind")
    context = root / "context"
    context.mkdir()
    for name in ("libhopper_a.so", "libsass_ptx.so"):
        shutil.copyfile(BIN / name, context / name)
    (context / "Dockerfile").write_text(DOCKERFILE)
    _docker(docker_host, "build", "-q", "-t", TAG, str(context))
    archive = root / "saved.tar"
    try:
        _docker(docker_host, "save", "-o", str(archive), TAG)
    finally:
        subprocess.run(
            ["docker", "-H", docker_host, "rmi", "-f", TAG], check=False, capture_output=True
        )
    return archive


def _judged(doc: dict[str, Any]) -> tuple[object, ...]:
    """What a check says about an image, apart from how its REF was spelled."""
    return (
        doc["verdict"],
        doc["digest"],
        doc["declared"],
        [(t["sm"], t["verdict"]) for t in doc["targets"]],
        doc["files"],
    )


def test_a_docker_save_archive_as_a_path_is_the_image(cli: CliRunner, saved: Path) -> None:
    explicit = cli("check", f"docker-archive:{saved}", "--json")
    plain = cli("check", str(saved), "--json")
    assert explicit.code == plain.code == 0, (explicit.out, plain.out)
    assert _judged(plain.json()) == _judged(explicit.json())
    paths = [f["path"] for f in plain.json()["files"]]
    assert paths == ["usr/lib/libhopper_a.so", "usr/lib/libsass_ptx.so"]
    assert plain.json()["declared"] == {"family": "hopper", "source": "label"}
    assert plain.json()["read_from"] == f"docker-archive:{saved} (a docker save archive)"
    assert explicit.json()["read_from"] is None
    text = cli("check", str(saved))
    assert f"read     docker-archive:{saved} (a docker save archive)" in text.out
    assert "files    2 with device code" in text.out


def test_an_oci_layout_folder_as_a_path_is_the_image(
    cli: CliRunner, saved: Path, tmp_path: Path
) -> None:
    layout = tmp_path / "layout"
    _skopeo("copy", f"docker-archive:{saved}", f"oci:{layout}:v1")
    explicit = cli("check", f"oci:{layout}:v1", "--json")
    plain = cli("check", str(layout), "--json")
    assert explicit.code == plain.code == 0, plain.out
    assert _judged(plain.json()) == _judged(explicit.json())
    assert plain.json()["read_from"] == f"oci:{layout} (an OCI layout)"
    # dir: still reads the folder's files as they are (the blobs are no ELF files)
    files = cli("check", f"dir:{layout}", "--sm", "9.0", "--json")
    assert files.code == 1
    assert files.json()["files"] == []


def test_an_oci_archive_as_a_path_is_refused(cli: CliRunner, saved: Path, tmp_path: Path) -> None:
    archive = tmp_path / "oci.tar"
    _skopeo("copy", f"docker-archive:{saved}", f"oci-archive:{archive}:v1")
    r = cli("check", str(archive), "--sm", "9.0")
    assert r.code == 2, r.out
    assert f"'{archive}' is an OCI archive" in r.err
    assert f"tar -xf {archive} -C DIR) and pass oci:DIR" in " ".join(r.err.split())
    transport = cli("check", f"oci-archive:{archive}", "--sm", "9.0")
    assert transport.code == 2
    assert "pass oci:DIR" in " ".join(transport.err.split())
    # as that advice says: extracted, it is the image
    folder = tmp_path / "extracted"
    folder.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(folder)], check=True)
    assert cli("check", f"oci:{folder}").code == 0


def test_a_compressed_archive_as_a_path_names_docker_archive(
    cli: CliRunner, saved: Path, tmp_path: Path
) -> None:
    packed = tmp_path / "saved.tar.gz"
    packed.write_bytes(gzip.compress(saved.read_bytes(), compresslevel=1))
    r = cli("check", str(packed), "--sm", "9.0")
    assert r.code == 2, r.out
    assert f"pass docker-archive:{packed}" in " ".join(r.err.split())
    assert cli("check", f"docker-archive:{packed}").code == 0  # as docker load reads it


def test_a_root_filesystem_tar_is_refused(
    cli: CliRunner, docker_host: str, saved: Path, tmp_path: Path
) -> None:
    """``docker export`` (a container's files as one tar) holds no image: refused,
    naming docker-archive: and the folder to extract it to, never judged as one file."""
    exported = engine_export(docker_host, saved, TAG)
    assert isinstance(exported, bytes), exported
    tar = tmp_path / "rootfs.tar"
    tar.write_bytes(exported)
    r = cli("check", str(tar), "--sm", "9.0")
    assert r.code == 2, r.out
    flat = " ".join(r.err.split())
    assert "without the manifest.json of docker save" in flat
    assert f"docker-archive:{tar}" in flat
    assert "extracted and the folder given" in flat


def test_a_tar_whose_headers_do_not_read_goes_to_the_archive_reader(
    cli: CliRunner, saved: Path, tmp_path: Path
) -> None:
    """A file that opens as a tar (ustar magic) but whose header checksum is wrong is
    still no single file: the docker-archive reader refuses it, naming why (exit 2)."""
    data = bytearray(saved.read_bytes())
    data[148:156] = b"0000000\0"  # the first header's checksum field (POSIX ustar)
    broken = tmp_path / "broken.tar"
    broken.write_bytes(bytes(data))
    r = cli("check", str(broken), "--sm", "9.0")
    assert r.code == 2, r.out
    assert "a header's checksum" in r.err  # the docker-archive reader's own words
