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


# A build whose steps write into folders earlier steps made: BuildKit (the engine's
# builder for API "version=2") commits each step's overlay upper folder as the layer,
# with the copy-up bookkeeping overlayfs left there; the RUN also removes a file (a
# whiteout) and replaces a folder (rm, then mkdir: an opaque folder).
BUILT_DOCKERFILE = """\
FROM scratch
COPY busybox /bin/busybox
COPY old/ /opt/old/
COPY libsass_sm80.so /usr/lib/cuda/libsass_sm80.so
RUN ["/bin/busybox", "sh", "-c", "B=/bin/busybox; D=/usr/lib/cuda; \\
$B cp $D/libsass_sm80.so $D/libcopy.so && $B rm $D/libsass_sm80.so && \\
$B rm -r /opt/old && $B mkdir /opt/old && $B cp $D/libcopy.so /opt/old/new.so"]
COPY libhopper_a.so /usr/lib/cuda/libhopper_a.so
"""


def buildkit_build(host: str, context: dict[str, bytes], tag: str) -> None:
    """``docker build`` of ``context`` (path -> bytes, a Dockerfile among them) by the
    engine's BuildKit: ``POST /build?version=2`` (docker api/swagger.yaml,
    ImageBuild: "version": "2" is BuildKit), the context sent as the request's tar
    body, which the engine serves to BuildKit itself (moby builder/builder-next
    builder.go, ``reqBodyHandler``), so no buildx session is needed."""
    import io
    import tarfile

    import docker

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in context.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    api: Any = docker.APIClient(base_url=host, version="1.41")
    params = {"version": "2", "t": tag, "networkmode": "none", "rm": "1"}
    response = api._post(
        api._url("/build"),
        params=params,
        data=raw.getvalue(),
        headers={"Content-Type": "application/x-tar"},
        stream=True,
    )
    said = [json.loads(line) for line in response.iter_lines() if line]
    errors = [m for m in said if "error" in m or "errorDetail" in m]
    if errors or not any("Successfully tagged" in str(m.get("stream")) for m in said):
        raise RuntimeError(f"the build of {tag} failed: {errors or said[-3:]}")


def _overlay_xattrs_of(folder: Path) -> dict[str, set[str]]:
    """path in the layer -> the overlay xattrs its entry carries ("" for the root)."""
    import os

    found: dict[str, set[str]] = {}
    for entry in [folder, *sorted(folder.rglob("*"))]:
        names = os.listxattr(entry, follow_symlinks=False)
        overlay = {n for n in names if n.startswith("trusted.overlay.")}
        if overlay:
            found[str(entry.relative_to(folder)).removeprefix(".")] = overlay
    return found


def test_a_built_image_reads_as_the_engine_exports_it(
    overlay2_host: str, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image made by a real build on the overlay2 engine: its layer folders carry
    the copy-up bookkeeping (trusted.overlay.origin on the folders the steps wrote
    into, impure and uuid), which changes nothing a container sees, beside a real
    whiteout and opaque folder. check reads the folders (it used to refuse the image
    over trusted.overlay.origin); the oracle is the engine's export of a container:
    every file of the final view, and the device code of each, as check found them."""
    import io
    import shutil
    import tarfile

    from buildmatrix.image.open import scan_image
    from tests.test_layer_semantics import ENGINE_OWN

    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("no busybox here for the build's RUN step (Debian package busybox-static)")
    sm80, hopper = fixture("libsass_sm80.so"), fixture("libhopper_a.so")
    context = {
        "Dockerfile": BUILT_DOCKERFILE.encode(),
        "busybox": Path(busybox).read_bytes(),
        "old/a.so": sm80,
        "old/b": b"text\n",
        "libsass_sm80.so": sm80,
        "libhopper_a.so": hopper,
    }
    tag = "bmtest/storage-built:v1"
    docker = ["docker", "-H", overlay2_host]
    monkeypatch.setenv("DOCKER_HOST", overlay2_host)
    buildkit_build(overlay2_host, context, tag)
    try:
        data = json.loads(
            subprocess.run(
                [*docker, "image", "inspect", tag], check=True, capture_output=True, text=True
            ).stdout
        )[0]["GraphDriver"]["Data"]
        folders = [data["UpperDir"], *data["LowerDir"].split(":")]
        marks = [_overlay_xattrs_of(Path(f)) for f in folders]
        view = scan_image(f"docker-daemon:{tag}")
        r = cli("check", f"docker-daemon:{tag}", "--sm", "8.0", "--json", "--no-cache")
        cid = subprocess.run(
            [*docker, "create", tag, "x"], capture_output=True, text=True, check=True
        ).stdout.strip()
        exported = subprocess.run([*docker, "export", cid], capture_output=True, check=True)
        subprocess.run([*docker, "rm", cid], capture_output=True, check=True)
    finally:
        subprocess.run([*docker, "rmi", "-f", tag], capture_output=True, check=False)
    # the build left what the reader must tell apart, in the folders it reads
    assert any("trusted.overlay.origin" in m.get("usr/lib/cuda", ()) for m in marks), marks
    assert any(
        {"trusted.overlay.uuid", "trusted.overlay.impure"} <= m.get("", set()) for m in marks
    )
    assert any(m.get("opt/old") == {"trusted.overlay.opaque"} for m in marks), marks
    code = {sm80: ["sm_80"], hopper: ["sm_90a"]}
    engine: dict[str, list[str]] = {}
    with tarfile.open(fileobj=io.BytesIO(exported.stdout)) as tar:
        for member in tar:
            name = member.name.rstrip("/")
            if member.isdir() or name in ENGINE_OWN or name.startswith(("dev/", "proc/", "sys/")):
                continue
            content = tar.extractfile(member)
            engine[name] = code.get(content.read() if content else b"", [])
    assert view.read_from is not None and view.read_from.startswith("engine storage (overlay2")
    assert sorted(view.paths) == sorted(engine)
    assert {f.path: f.sass for f in view.files} == {p: s for p, s in engine.items() if s}
    assert set(engine) == {
        "bin/busybox",
        "opt/old/new.so",
        "usr/lib/cuda/libcopy.so",
        "usr/lib/cuda/libhopper_a.so",
    }
    # libhopper_a holds sm_90a alone: arch-specific code, skipped on 8.0 where the rest
    # runs (docs/compatibility.md, rule a); counted, as --strict counts it, it fails
    doc = r.json()["images"][0] if "images" in r.json() else r.json()
    assert r.code == 0 and doc["verdict"] == "pass", r.err
    (target,) = doc["targets"]
    assert [s["path"] for s in target["skipped"]] == ["usr/lib/cuda/libhopper_a.so"]
    assert doc["strict_verdict"] == "fail"


@pytest.mark.parametrize(
    ("xattrs", "outcome"),
    [
        ({"trusted.overlay.origin": b"\0\xfb"}, "read"),
        ({"trusted.overlay.impure": b"y", "trusted.overlay.origin": b"\0\xfb"}, "read"),
        ({"trusted.overlay.uuid": b"0123456789abcdef"}, "read"),
        ({"user.overlay.origin": b"\0\xfb", "user.overlay.impure": b"y"}, "read"),
        ({"trusted.overlay.origin": b"\0\xfb", "trusted.overlay.opaque": b"y"}, "opaque"),
        ({"trusted.overlay.origin": b"\0\xfb", "trusted.overlay.redirect": b"/x"}, "refused"),
        ({"trusted.overlay.impure": b"y", "trusted.overlay.metacopy": b""}, "refused"),
        ({"trusted.overlay.whiteout": b""}, "refused"),
        ({"trusted.overlay.nlink": b"U+1"}, "refused"),
        ({"trusted.overlay.overlay.origin": b"\0\xfb"}, "refused"),
    ],
)
def test_only_the_copy_up_bookkeeping_is_passed_over(
    xattrs: dict[str, bytes], outcome: str, tmp_path: Path
) -> None:
    """Each overlay xattr on a folder of a layer read in place: the bookkeeping a
    copy-up leaves (origin, impure, uuid: overlayfs.rst) is passed over, an opaque
    mark still applies beside it, and anything else (a redirect, metacopy, a whiteout
    by xattr, an escaped name overlayfs would show as an xattr) is refused, whatever
    bookkeeping comes with it."""
    import os

    from buildmatrix.errors import InputError
    from buildmatrix.image.overlay2 import scan_layer_dir
    from buildmatrix.image.tree import Dir, merge

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"text\n")
    try:
        for name, value in xattrs.items():
            os.setxattr(tmp_path / "d", name, value, follow_symlinks=False)
    except OSError as exc:
        pytest.skip(f"cannot set overlay xattrs here ({exc.strerror}): needs root on ext4/xfs")
    if outcome == "refused":
        with pytest.raises(InputError, match="'d' carries the overlayfs xattr"):
            scan_layer_dir(tmp_path, name="layer")
        return
    summary = scan_layer_dir(tmp_path, name="layer")
    folder = summary.root.children["d"]
    assert isinstance(folder, Dir) and folder.opaque is (outcome == "opaque")
    assert [path for path, _ in merge([summary]).files()] == ["d/f"]
