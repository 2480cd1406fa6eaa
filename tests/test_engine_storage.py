"""check reading the local engine's overlay2 storage directly: the same result as
reading the same image as a tar (whose reading tests/test_layer_semantics.py holds to
the engine's own export), on the layer cases that matter (whiteouts, opaque folders,
symlinked folders, hard links, replacements; the review's and generated ones).
And the fallback, with its reason, where the storage cannot be read."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliRunner
from tests.fixtures.build import BIN
from tests.images import Image, Layer, fixture, write_docker_archive
from tests.test_in_place import _in_a_fresh_process
from tests.test_layer_semantics import CASES, _ours

pytestmark = pytest.mark.integration

# The cases the engine accepts (the refused ones never reach its storage), plus a
# layered image with every kind of device-code file.
STORAGE_CASES: dict[str, list[Layer]] = {
    **CASES,
    "opaque-folder": [
        {"d/x.so": fixture("libsass_sm80.so"), "d/y": b"text\n", "d/e/f": b"text\n"},
        {"d/.wh..wh..opq": b"", "d/z.so": fixture("libhopper_a.so")},
    ],
    "whiteout-of-folder": [{"d/x.so": fixture("libsass_sm80.so")}, {".wh.d": b""}],
}
READABLE = [c for c in sorted(STORAGE_CASES) if _ours(STORAGE_CASES[c]) != "refused"]


def _result(cli: CliRunner, ref: str) -> tuple[int, Any]:
    r = cli("check", ref, "--sm", "9.0", "--allow-empty", "--json", "--no-cache")
    assert r.code in (0, 1), r.err
    doc = r.json()
    return r.code, doc


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: doc[k] for k in ("files", "targets", "problems", "verdict", "cuda_runtime")}


@contextmanager
def _loaded(
    host: str, folder: Path, images: dict[str, Image], monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Path]]:
    """The images, by tag, loaded into the engine at ``host`` from docker-archives
    written in ``folder`` (yielded by tag), with DOCKER_HOST set to it; removed after."""
    archives: dict[str, Path] = {}
    for i, (tag, image) in enumerate(images.items()):
        archives[tag] = write_docker_archive(folder / f"image{i}.tar", image, tag=tag)
        subprocess.run(
            ["docker", "-H", host, "load", "-i", str(archives[tag])],
            check=True,
            capture_output=True,
        )
    monkeypatch.setenv("DOCKER_HOST", host)
    try:
        yield archives
    finally:
        subprocess.run(
            ["docker", "-H", host, "rmi", "-f", *images], capture_output=True, check=False
        )


@pytest.mark.parametrize("case", READABLE)
def test_storage_reads_as_the_export_does(
    case: str, overlay2_host: str, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from buildmatrix.image.open import scan_image

    tag = f"bmtest/storage-{case}:v1"
    image = Image(layers=STORAGE_CASES[case])
    with _loaded(overlay2_host, tmp_path, {tag: image}, monkeypatch) as archives:
        _, direct = _result(cli, f"docker-daemon:{tag}")
        _, from_tar = _result(cli, f"docker-archive:{archives[tag]}")
        # the whole final view too: every path, every symlink and its target
        view = scan_image(f"docker-daemon:{tag}")
        tar_view = scan_image(f"docker-archive:{archives[tag]}")
    assert direct["read_from"].startswith("engine storage (overlay2"), direct["read_from"]
    assert _comparable(direct) == _comparable(from_tar)
    assert (view.paths, view.symlinks) == (tar_view.paths, tar_view.symlinks)


def test_a_layered_image_with_every_kind_of_code(
    overlay2_host: str, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = Image(
        layers=[
            {
                "usr/lib/libsass_ptx.so": fixture("libsass_ptx.so"),
                "usr/lib/libtwo.so": fixture("libtwo.so"),
                "usr/lib/libtwo_static.a": fixture("libtwo_static.a"),
                "opt/k.ptx": fixture("kernels_sm90a.ptx"),
                "opt/k.cubin": fixture("kernels_sm90a.cubin"),
                "opt/old/lib.so": fixture("libsass_sm80.so"),
            },
            {"opt/.wh.old": b"", "usr/lib/libhopper_a.so": fixture("libhopper_a.so")},
        ],
        env={"CUDA_VERSION": "12.4.1"},
    )
    tag = "bmtest/storage-all:v1"
    with _loaded(overlay2_host, tmp_path, {tag: image}, monkeypatch) as archives:
        code, direct = _result(cli, f"docker-daemon:{tag}")
        _, from_tar = _result(cli, f"docker-archive:{archives[tag]}")
    assert direct["read_from"] == "engine storage (overlay2, 2 layers)"
    assert _comparable(direct) == _comparable(from_tar)
    assert code == 1  # libtwo's second unit has nothing for 9.0
    assert "opt/old/lib.so" not in {f["path"] for f in direct["files"]}


def test_other_drivers_fall_back_to_the_stream_and_say_why(
    docker_host: str, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = Image(layers=[{"usr/lib/libhopper_a.so": fixture("libhopper_a.so")}])
    tag = "bmtest/storage-vfs:v1"
    with _loaded(docker_host, tmp_path, {tag: image}, monkeypatch):
        _, doc = _result(cli, f"docker-daemon:{tag}")
    assert doc["read_from"].startswith("docker save stream (")
    assert "storage driver is vfs" in doc["read_from"]
    assert doc["verdict"] == "pass"


def test_variants_sharing_a_base_read_its_folder_once(
    overlay2_host: str, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build matrix on the local engine: variants that share a base layer, checked
    in one call, read the base folder once; each still gets its own verdict."""
    from buildmatrix.image import daemon
    from buildmatrix.image.overlay2 import scan_layer_dir

    base: Layer = {"usr/lib/libsass_ptx.so": fixture("libsass_ptx.so")}
    tops: dict[str, Layer] = {
        "bmtest/storage-variant:hopper": {"opt/lib.so": fixture("libhopper_a.so")},
        "bmtest/storage-variant:ampere": {"opt/lib.so": fixture("libsass_sm80.so")},
    }
    images = {tag: Image(layers=[base, top]) for tag, top in tops.items()}
    read: list[Path] = []

    def counting(folder: Path, *, name: str) -> Any:
        read.append(folder)
        return scan_layer_dir(folder, name=name)

    monkeypatch.setattr(daemon, "scan_layer_dir", counting)
    with _loaded(overlay2_host, tmp_path, images, monkeypatch):
        refs = [f"docker-daemon:{tag}" for tag in images]
        r = cli("check", *refs, "--sm", "9.0", "--json", "--cache", str(tmp_path / "cache"))
    assert r.code == 1, r.err  # the ampere variant fails 9.0
    hopper, ampere = r.json()["images"]
    assert (hopper["verdict"], ampere["verdict"]) == ("pass", "fail")
    assert all(doc["read_from"].startswith("engine storage") for doc in (hopper, ampere))
    assert len(read) == 3 and len(set(read)) == 3  # base once, each top layer once
    assert not list((tmp_path / "cache").rglob("*.json.gz"))  # nothing unverified written


def test_workers_read_a_layer_folder_as_one_process_does(
    overlay2_host: str, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large layer folders are read by worker processes (buildmatrix.image.workers):
    files, verdicts and problems are those of one process."""
    layer: Layer = {f"usr/lib/{p.name}": p.read_bytes() for p in sorted(BIN.iterdir())}
    tag = "bmtest/storage-workers:v1"
    with _loaded(overlay2_host, tmp_path, {tag: Image(layers=[layer])}, monkeypatch):
        _, serial = _result(cli, f"docker-daemon:{tag}")
        pooled = json.loads(_in_a_fresh_process(POOLED_CHECK, f"docker-daemon:{tag}"))
    assert pooled["read_from"].startswith("engine storage")
    assert _comparable(pooled) == _comparable(serial)
    assert len(serial["files"]) >= 15


# check with every layer read by two workers, which must run elsewhere
POOLED_CHECK = """
import os, sys
from tests.test_in_place import pool_everything

pids = pool_everything()
from buildmatrix.cli import main
code = main(["check", sys.argv[1], "--sm", "9.0", "--allow-empty", "--json", "--no-cache"])
assert code in (0, 1) and pids and os.getpid() not in pids, (code, pids)
"""


@pytest.mark.parametrize(
    ("xattr", "refused_by"),
    [
        ("trusted.overlay.redirect", "in the engine's layer folder"),
        ("trusted.overlay.metacopy", "in the engine's layer folder"),
        ("user.overlay.opaque", "it sets the overlay xattr 'user.overlay.opaque'"),
    ],
)
def test_overlay_xattrs_set_through_a_layer_are_refused(
    xattr: str,
    refused_by: str,
    overlay2_host: str,
    cli: CliRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A layer tar that sets an overlay xattr on a folder: the overlay2 engine copies
    it into its layer folder (checked there), where overlayfs follows it. The
    folder reader refuses trusted.overlay.* redirects and metacopy itself, never
    falling back to a reader that passes; user.overlay.* counts only on userxattr
    mounts, so that folder is left to the export, whose layer tar is refused too."""
    import hashlib
    import os

    from tests.images import layer_tar, write_archive_blobs
    from tests.test_go_tar import header, pax

    base = layer_tar({"opt/hidden/libbad.so": fixture("libsass_sm80.so"), "usr/lib/ok": b"x"})
    top = (
        pax((b"SCHILY.xattr." + xattr.encode(), b"/opt/hidden"))
        + header(b"usr/lib/cuda", b"5")
        + b"\0" * 1024
    )
    tars = [base, top]
    diff_ids = ["sha256:" + hashlib.sha256(t).hexdigest() for t in tars]
    tag = f"bmtest/overlay-xattr:{xattr.rsplit('.', maxsplit=1)[-1]}"
    config = Image(layers=[], labels={"io.buildmatrix.family": "hopper"}).config(diff_ids)
    blobs = [(f"{i}/layer.tar", t) for i, t in enumerate(tars)]
    archive = write_archive_blobs(tmp_path / "image.tar", config, blobs, tag=tag)
    docker = ["docker", "-H", overlay2_host]
    subprocess.run([*docker, "load", "-i", str(archive)], check=True, capture_output=True)
    monkeypatch.setenv("DOCKER_HOST", overlay2_host)
    try:
        upper = json.loads(
            subprocess.run(
                [*docker, "image", "inspect", tag], check=True, capture_output=True, text=True
            ).stdout
        )[0]["GraphDriver"]["Data"]["UpperDir"]
        folder = Path(upper) / "usr" / "lib" / "cuda"
        assert os.getxattr(folder, xattr, follow_symlinks=False) == b"/opt/hidden"
        r = cli("check", f"docker-daemon:{tag}", "--sm", "9.0", "--no-cache")
    finally:
        subprocess.run([*docker, "rmi", "-f", tag], capture_output=True, check=False)
    assert r.code == 2, r.out + r.err
    assert refused_by in r.err and "usr/lib/cuda" in r.err, r.err
