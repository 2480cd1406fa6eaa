"""Layer semantics on crafted layer tars: whiteouts, opaque folders, links, escapes."""

from __future__ import annotations

import io

import pytest

from buildmatrix.binary.scan import FileReport, ScanProblem
from buildmatrix.errors import InputError
from buildmatrix.image.layers import merge, scan_layer
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


def test_writes_through_symlinked_folders_land_inside_the_root() -> None:
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
    assert got["opt/cuda-13/lib/libh.so"] == ["sm_90a"]
    assert got["usr/lib/libh.so"] == "symlink"
    # A link that climbs out of the root resolves at the root, never on the host.
    assert got["etc/lib.so"] == ["sm_80"]
    assert "usr/local/cuda/lib/libh.so" not in got


def test_symlink_loop_is_not_followed_forever() -> None:
    got = view({"a": Symlink("b"), "b": Symlink("a")}, {"a/lib.so": SM80})
    assert got == {"a": "symlink", "b": "symlink"}


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
    from buildmatrix.image import layers

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
