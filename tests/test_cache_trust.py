"""The layer cache never changes a verdict: each test checks an image through the CLI
with ``--cache DIR`` and with ``--no-cache`` and expects the same answer.

The three ways a cache could change one (docs/security.md, "The layer cache"): an
entry another user planted, an entry an older scanner wrote, and a local blob changed
after its summary was cached.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.image.cache import SCANNER_SOURCES, LayerCache, fingerprint
from buildmatrix.image.cache_codec import encode
from buildmatrix.image.layers import scan_layer
from tests.conftest import REPO, CliRunner
from tests.images import Entry, Image, fixture, layer_tar, write_oci_layout

HOPPER = {"io.buildmatrix.family": "hopper"}


def _layout(tmp_path: Path, name: str, *libs: str) -> tuple[str, Path]:
    """An OCI layout of one uncompressed layer holding ``libs``; its blob file."""
    layer: dict[str, Entry] = {f"usr/lib/{lib}": fixture(lib) for lib in libs}
    root = write_oci_layout(tmp_path / name, Image(layers=[layer], labels=HOPPER), compress=False)
    digest = _digest(layer_tar(layer))
    return f"oci:{root}", root / "blobs" / "sha256" / digest.split(":")[1]


def _digest(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


def _check(cli: CliRunner, *args: str) -> tuple[int, Any, str]:
    r = cli("check", "--json", *args)
    assert r.code in (0, 1, 2), r.err
    return r.code, (r.json() if r.code != 2 else None), r.err


def _plant(folder: Path, digest: str, lib: str) -> Path:
    """An entry for ``digest`` that summarises a layer holding ``lib`` instead: what
    another user (or an older scanner) could leave in the folder."""
    summary = scan_layer(io.BytesIO(layer_tar({f"usr/lib/{lib}": fixture(lib)})), name="x")
    algo, _, hexdigest = digest.partition(":")
    path = LayerCache(folder).root / algo / f"{hexdigest}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(digest, summary))
    return path


def _same_as_without_cache(cli: CliRunner, ref: str, cache: Path) -> tuple[Any, str]:
    code, doc, err = _check(cli, ref, "--cache", str(cache))
    plain_code, plain, _ = _check(cli, ref, "--no-cache")
    assert code == plain_code
    assert doc == plain
    return doc, err


# -------------------------------------------------------------- (a) another user's entries


def test_a_folder_others_can_write_is_not_used(cli: CliRunner, tmp_path: Path) -> None:
    """The image fails (sm_80 code only); an entry planted in a world-writable cache
    folder says it holds Hopper code. The folder is not used, with a warning."""
    ref, blob = _layout(tmp_path, "img", "libsass_sm80.so")
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    _plant(cache, _digest(blob.read_bytes()), "libhopper_a.so")
    doc, err = _same_as_without_cache(cli, ref, cache)
    assert doc["verdict"] == "fail"
    assert "warning: the layer cache" in err
    assert "writable by group or others (mode 0777)" in err
    # the same planted entry in a private folder is what would have been served
    cache.chmod(0o700)
    code, trusted, _ = _check(cli, ref, "--cache", str(cache))
    assert (code, trusted["verdict"]) == (0, "pass")


@pytest.mark.parametrize("how", ["group-writable", "another-owner"])
def test_an_entry_another_user_could_write_is_ignored(
    cli: CliRunner, tmp_path: Path, how: str
) -> None:
    ref, blob = _layout(tmp_path, "img", "libsass_sm80.so")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    entry = _plant(cache, _digest(blob.read_bytes()), "libhopper_a.so")
    if how == "group-writable":
        entry.chmod(0o664)
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root (.ci/run runs as root)")
        os.chown(entry, 65534, 65534)
    doc, err = _same_as_without_cache(cli, ref, cache)
    assert doc["verdict"] == "fail"
    assert "warning" not in err  # the folder is fine; the entry is passed over


def test_a_folder_above_the_cache_that_others_can_write_disables_it(
    cli: CliRunner, tmp_path: Path
) -> None:
    """A folder above the cache that others may write (and that is not sticky) lets
    them swap the cache folder itself."""
    ref, _ = _layout(tmp_path, "img", "libhopper_a.so")
    above = tmp_path / "open"
    above.mkdir()
    above.chmod(0o777)
    _, err = _same_as_without_cache(cli, ref, above / "cache")
    assert f"{above} (above it): it is writable by group or others" in err
    above.chmod(0o777 | 0o1000)  # sticky, as /tmp: only an entry's owner may rename it
    _, err = _same_as_without_cache(cli, ref, above / "cache")
    assert "warning" not in err


# -------------------------------------------------------------- (b) an older scanner's entries


def _old_scanner(tmp_path: Path) -> Path:
    """A copy of the package whose scanner misses every file named ``*sm80*``: the
    kind of bug a later commit fixes (same ``__version__``)."""
    copy = tmp_path / "old"
    shutil.copytree(REPO / "buildmatrix", copy / "buildmatrix")
    (copy / "arch-profiles").symlink_to(REPO / "arch-profiles")
    scan = copy / "buildmatrix" / "binary" / "scan.py"
    text = scan.read_text()
    hook = "    if len(head) < 4:\n        return None\n"
    assert hook in text
    scan.write_text(text.replace(hook, hook + '    if "sm80" in path:\n        return None\n'))
    return copy


def test_an_older_scanners_entries_are_not_read(cli: CliRunner, tmp_path: Path) -> None:
    """The old scanner passes the image (it misses the sm_80-only library) and caches
    its summary; the fixed one, same version, must not be served that summary."""
    ref, _ = _layout(tmp_path, "img", "libhopper_a.so", "libsass_sm80.so")
    cache = tmp_path / "cache"
    old = _old_scanner(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "buildmatrix", "check", ref, "--cache", str(cache), "--json"],
        env={**os.environ, "PYTHONPATH": str(old)},
        cwd=old,  # python -m puts the working folder first on the path
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr  # the old scanner's wrong pass
    assert list(cache.rglob("*.json.gz")), "the old scanner wrote its entries"
    doc, _ = _same_as_without_cache(cli, ref, cache)
    assert doc["verdict"] == "fail"


def test_the_fingerprint_covers_every_module_that_shapes_a_summary() -> None:
    """Every buildmatrix module the layer readers and the cache codec import (run in a
    fresh interpreter) is hashed into the fingerprint; a change to any of them starts
    a new cache."""
    code = (
        "import sys, buildmatrix.image.layer_scan, buildmatrix.image.cache_codec;"
        "print('\\n'.join(m.__file__ for n, m in sys.modules.items()"
        " if n.startswith('buildmatrix') and getattr(m, '__file__', None)))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    package = REPO / "buildmatrix"
    hashed = {p for pattern in SCANNER_SOURCES for p in package.glob(pattern)}
    # __init__ holds the version only; schema validates manifests and configs, which
    # are read again on every run and never cached.
    exempt = {package / "__init__.py", package / "schema.py"}
    modules = {Path(line) for line in r.stdout.split()}
    assert modules - hashed - exempt == set()
    assert fingerprint() is not None
    assert re.fullmatch(r"[0-9a-f]{64}", fingerprint() or "")


# -------------------------------------------------------------- (c) a local blob changed


def test_a_local_blob_changed_after_it_was_cached_is_read_again(
    cli: CliRunner, tmp_path: Path
) -> None:
    """An OCI layout's blob altered after its summary was cached: without the cache
    its digest no longer matches (exit 2); with it, the same."""
    ref, blob = _layout(tmp_path, "img", "libhopper_a.so")
    cache = tmp_path / "cache"
    code, doc, _ = _check(cli, ref, "--cache", str(cache))
    assert (code, doc["verdict"]) == (0, "pass")
    data = bytearray(blob.read_bytes())
    data[-2000] ^= 0x01  # same size, one bit
    blob.write_bytes(bytes(data))
    code, _, err = _check(cli, ref, "--cache", str(cache))
    plain_code, _, plain_err = _check(cli, ref, "--no-cache")
    assert code == plain_code == 2
    assert err == plain_err
    assert "digest" in err


def test_a_blob_replaced_by_a_hard_link_to_another_is_read_again(
    cli: CliRunner, tmp_path: Path
) -> None:
    """Another inode under the blob's name (here a Hopper library's blob put where an
    sm_80 one was named): not the file that was verified, so it is checked again."""
    ref, blob = _layout(tmp_path, "img", "libhopper_a.so")
    _, other = _layout(tmp_path, "other", "libsass_sm80.so")
    cache = tmp_path / "cache"
    assert _check(cli, ref, "--cache", str(cache))[0] == 0
    blob.unlink()
    blob.hardlink_to(other)
    code, _, err = _check(cli, ref, "--cache", str(cache))
    assert code == _check(cli, ref, "--no-cache")[0] == 2
    assert "digest" in err


def test_hard_linked_copies_of_a_blob_are_verified_once(cli: CliRunner, tmp_path: Path) -> None:
    """A build matrix whose layouts hard-link one base blob (benchmarks/check_matrix.py)
    reads it once; a separate copy is hashed, not read."""
    a, blob_a = _layout(tmp_path, "a", "libhopper_a.so")
    b, blob_b = _layout(tmp_path, "b", "libhopper_a.so")
    blob_b.unlink()
    blob_b.hardlink_to(blob_a)
    c, _ = _layout(tmp_path, "c", "libhopper_a.so")
    cache = tmp_path / "cache"
    code, doc, _ = _check(cli, a, b, c, "--cache", str(cache))
    assert code == 0
    assert (doc["cache"]["misses"], doc["cache"]["hits"]) == (1, 2)
