"""Layer semantics on crafted layer tars: whiteouts, opaque folders, links, escapes."""

from __future__ import annotations

import io
import itertools
import posixpath

import pytest

from buildmatrix.binary.report import FileReport, ScanProblem
from buildmatrix.errors import InputError
from buildmatrix.image.layers import clean_member_name, scan_layer
from buildmatrix.image.tree import merge
from tests.binaries import container, elf_with_section, entry
from tests.images import Dir, Entry, Hardlink, Symlink, fixture, layer_tar

SM80 = fixture("libsass_sm80.so")
HOPPER = fixture("libhopper_a.so")


def view(*layers: dict[str, Entry]) -> dict[str, list[str] | str | None]:
    """Final path -> SASS list (device code), 'problem', or None (other files)."""
    summaries = [
        scan_layer(io.BytesIO(layer_tar(layer)), name=f"layer{i}") for i, layer in enumerate(layers)
    ]
    out: dict[str, list[str] | str | None] = {}
    for path, node in merge(summaries).files():
        if isinstance(node.result, FileReport):
            out[path] = node.result.sass
        elif isinstance(node.result, ScanProblem):
            out[path] = "problem"
        else:
            out[path] = None if node.kind in ("file", "other") else node.kind
    return out


def test_files_and_later_layers_replace() -> None:
    got = view({"usr/lib/libx.so": SM80, "etc/hosts": b"127.0.0.1"}, {"usr/lib/libx.so": HOPPER})
    assert got == {"etc/hosts": None, "usr/lib/libx.so": ["sm_90a"]}


def test_whiteout_removes_file_and_folder() -> None:
    got = view(
        {"usr/lib/a.so": SM80, "opt/cuda/lib/b.so": SM80, "opt/keep.so": HOPPER},
        {"usr/lib/.wh.a.so": b"", "opt/.wh.cuda": b""},
    )
    assert got == {"opt/keep.so": ["sm_90a"]}


def test_opaque_folder_hides_lower_content_only() -> None:
    got = view(
        {"opt/cuda/lib/old.so": SM80, "opt/cuda/lib/also-old.so": SM80},
        {"opt/cuda/lib/.wh..wh..opq": b"", "opt/cuda/lib/new.so": HOPPER},
    )
    assert got == {"opt/cuda/lib/new.so": ["sm_90a"]}


def test_paths_are_literal_across_layers() -> None:
    """A later layer never writes through an earlier layer's symlink: its folder
    replaces the symlink (overlayfs; tests/test_layer_semantics.py shows the engine
    agrees). Within one layer, the layer's own symlinks are followed inside its root."""
    got = view(
        {
            "opt/cuda-13/lib/": Dir(),
            "usr/local/cuda": Symlink("/opt/cuda-13"),
            "usr/lib/libh.so": Symlink("../../opt/cuda-13/lib/libh.so"),
        },
        {
            "usr/local/cuda/lib/libh.so": HOPPER,
            "escape": Symlink("../../../../.."),
            "escape/etc/lib.so": SM80,
        },
    )
    assert got["usr/local/cuda/lib/libh.so"] == ["sm_90a"]  # a folder now, not the link
    assert "opt/cuda-13/lib/libh.so" not in got
    assert got["usr/lib/libh.so"] == "symlink"
    # The same layer's link that climbs out of the root resolves at the root, never
    # on the host.
    assert got["etc/lib.so"] == ["sm_80"]
    assert got["escape"] == "symlink"


def test_a_lower_symlink_loop_is_replaced_by_an_upper_folder() -> None:
    got = view({"a": Symlink("b"), "b": Symlink("a")}, {"a/lib.so": SM80})
    assert got == {"a/lib.so": ["sm_80"], "b": "symlink"}


def test_whiteout_under_a_symlinked_folder_does_not_reach_its_target() -> None:
    got = view(
        {"usr/lib/libbad.so": SM80, "lib64": Symlink("usr/lib")},
        {"lib64/.wh.libbad.so": b""},
    )
    assert got == {"usr/lib/libbad.so": ["sm_80"]}  # lib64 is an empty folder now


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"a.so": SM80, "b.so": Hardlink("missing.so")}, "hard link 'b.so' points at"),
        # the target's folder comes later in the tar, or never
        (
            {"b.so": Hardlink("lib/a.so"), "lib/a.so": SM80},
            "hard link 'b.so': 'lib/a.so' is under 'lib', which the layer does not hold",
        ),
        ({"loop": Symlink("loop"), "loop/x.so": SM80}, "written through a symlink loop"),
        ({"d": Symlink("nowhere"), "d/x.so": SM80}, "whose target the layer does not hold"),
        ({"f": b"file", "f/x.so": SM80}, "under 'f', which is not a folder"),
        ({"x.so": SM80, ".wh.x.so": b""}, "whiteout of 'x.so' over an entry of the same layer"),
        ({"l": Symlink("x" * 4096)}, "longer than PATH_MAX"),
    ],
)
def test_what_the_engine_refuses_is_refused(layer: dict[str, Entry], message: str) -> None:
    with pytest.raises(InputError, match="the Docker engine refuses such a layer too") as err:
        view(layer)
    assert message in str(err.value)


def test_deep_folders_do_not_exhaust_the_stack() -> None:
    deep = "/".join(["d"] * 1500) + "/lib.so"
    assert view({"x": b"1"}, {deep: SM80})[deep] == ["sm_80"]


def test_hardlink_carries_the_inspection() -> None:
    got = view({"opt/lib.so": HOPPER, "usr/lib/lib.so": Hardlink("opt/lib.so")})
    assert got == {"opt/lib.so": ["sm_90a"], "usr/lib/lib.so": ["sm_90a"]}


def test_corrupt_library_is_a_problem_not_a_pass() -> None:
    bad = elf_with_section(".nv_fatbin", container(entry(header_size=0)))
    assert view({"usr/lib/bad.so": bad}) == {"usr/lib/bad.so": "problem"}


@pytest.mark.parametrize("name", ["../etc/passwd", "a/../../b", "/../x"])
def test_names_escaping_the_root_are_refused(name: str) -> None:
    with pytest.raises(InputError, match="escapes the image root"):
        view({name: b"x"})


def test_not_a_tar() -> None:
    with pytest.raises(InputError, match="not a readable layer tar"):
        scan_layer(io.BytesIO(b"\x1f\x8b" + b"not gzip at all" * 50), name="blob")


def test_large_candidates_are_spooled(monkeypatch: pytest.MonkeyPatch) -> None:
    from buildmatrix.image import spool as layers

    monkeypatch.setattr(layers, "SPOOL_LIMIT", 1024)
    assert view({"big.so": fixture("libmulti.so")})["big.so"] == [
        "sm_75",
        "sm_80",
        "sm_86",
        "sm_89",
        "sm_90",
        "sm_100",
        "sm_103",
        "sm_120",
    ]


def test_memory_per_entry_stays_bounded() -> None:
    """A gzip layer of 200,000 empty files, read in a fresh process: the peak memory
    the read adds stays under 300 bytes per entry (measured: ~190; it was ~830 while
    tarfile kept every TarInfo). docs/security.md, Bounds.

    The layer is written by tests/ustar.py (what tarfile writes for these members,
    byte for byte: tests/test_ustar.py), streamed into gzip at zlib's default level,
    so that writing it neither costs tarfile's CPU nor raises the peak measured
    before the read."""
    import subprocess
    import sys

    code = (
        "import gzip, io, resource\n"
        "from buildmatrix.image.layers import scan_layer\n"
        "from tests.ustar import empty_files\n"
        "buf = io.BytesIO()\n"
        "names = (f'd{i // 1000}/f{i}' for i in range(200_000))\n"
        "with gzip.GzipFile(fileobj=buf, mode='wb', mtime=0, compresslevel=6) as gz:\n"
        "    for chunk in empty_files(names, batch=64):\n"
        "        gz.write(chunk)\n"
        "blob = buf.getvalue()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "scan_layer(io.BytesIO(blob), name='layer')\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print((after - before) * 1024 // 200_000)\n"
    )
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True
    )
    assert int(out.stdout) < 300, out.stdout


def test_member_names_clean_as_posix_normpath_cleans_them() -> None:
    """Every name of up to seven characters from "a", "." and "/": the cleaned name
    is POSIX normpath's (posixpath.normpath) under the root, and a name whose
    normpath climbs above the root ("..", "../...") is refused, whichever way the
    name is cleaned (names already normal skip normpath)."""
    for length in range(1, 8):
        for chars in itertools.product("a./", repeat=length):
            name = "".join(chars)
            raw = posixpath.normpath(name.lstrip("/") or ".")
            if raw == ".." or raw.startswith("../"):
                with pytest.raises(InputError, match="escapes the image root"):
                    clean_member_name(name, layer="layer")
                continue
            want = posixpath.normpath("/" + name).lstrip("/")
            assert clean_member_name(name, layer="layer") == want, name
