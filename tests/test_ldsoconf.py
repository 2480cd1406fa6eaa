"""The image's own loader configuration (buildmatrix.ldsoconf), held to glibc's own
``ldconfig``: in a root drawn by hypothesis (``/etc/ld.so.conf`` lines, includes
with globs, relative ones, comments, ``hwcap`` lines, files of
``/etc/ld.so.conf.d`` and symlinks), ``ldconfig -v`` chrooted there prints the
folders it scans, in order; buildmatrix's list must be that list, and where it says
the NVIDIA container toolkit's ``00-compat-<N>.conf`` is read, ldconfig must scan
the folder that file names (and not where it says it is not).

Then both ways an image's configuration changes which libcuda.so.1 is loaded, each
shown on glibc's loader (``dlopen`` of ``libcuda.so.1`` in the root, as
tests/test_ldconfig.py does) and checked to fail closed or to count as not in use;
and the files' text carried through layer tars, whiteouts, opaque folders and the
layer cache.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from buildmatrix.binary.ldconf_file import CONF_LIMIT, ConfFile
from buildmatrix.binary.scan import scan_tree
from buildmatrix.cuda import parse_driver_version
from buildmatrix.forward import CompatSetup, compat_use, resolve
from buildmatrix.image.cache_codec import decode, encode
from buildmatrix.image.layer_scan import finish
from buildmatrix.image.local import scan_directory
from buildmatrix.image.ref import parse_ref
from buildmatrix.image.scanned import ImageConfig
from buildmatrix.ldconfig import FolderView
from buildmatrix.ldsoconf import MAX_FILES, read_loader_conf
from tests.images import Dir, Entry, Symlink, layer_tar, scan_in_place
from tests.test_ldconfig import CHROOT, ROOTED, _make_root, _place, _real, kit

__all__ = ["kit"]
rooted = pytest.mark.skipif(not ROOTED, reason="chroot needs root; gcc builds the stand-ins")
COMPAT = "usr/local/cuda-13.1/compat"
OLD_HOST = parse_driver_version("535.54.03")  # the hook uses the 590 compat driver
NEW_HOST = parse_driver_version("600.10")  # the hook does not


# ------------------------------------------------------------------ the folders read

FOLDERS = ["d/a", "d/b", "d/c", "etc/other"]
LINES = [
    "include /etc/ld.so.conf.d/*.conf",
    "include ld.so.conf.d/*.conf",
    "include /etc/other/*.conf",
    "include\t/etc/ld.so.conf.d/b.conf  /etc/ld.so.conf.d/x?.conf",
    "include /etc/ld.so.conf.d/.*.conf",
    "include /etc/ld.so.conf.d/0*",
    "include /etc/ld.so.conf.d/*-*-*-*.conf",  # the hook's UUID names, not its decimal ones
    "include /etc/ld.so.conf.d/??-compat-??????????.conf",  # ten-digit decimal names only
    "#include /etc/ld.so.conf.d/*.conf",
    "/d/a",
    "  /d/b/ # a comment",
    "/d/c=libc6",
    "/d/l",
    "/d/missing",
    "hwcap 1 /d/c",
    "HWCAP 0 x",
    "/d/a\r",
]
CONF_NAMES = ["a.conf", "b.conf", ".h.conf", "x1.conf", "z.txt", "00-x.conf", "00-compat-5.conf"]
# The names the hook has given its file (cmd/nvidia-cdi-hook/cudacompat/cudacompat.go):
# a decimal uint32 (os.CreateTemp, before May 2026), then uuid.NewString().
HOOK_NAMES = st.integers(0, 4294967295).map(str) | st.uuids().map(str)
FILES = st.lists(st.sampled_from(LINES), max_size=4).map(lambda ls: "\n".join(ls) + "\n")


def _write(root: Path, top: str | None, confd: dict[str, str], other: dict[str, str]) -> None:
    for f in FOLDERS:
        (root / f).mkdir(parents=True, exist_ok=True)
    (root / "d/l").symlink_to("a")
    (root / "d/hook").mkdir()
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    if top is not None:
        (root / "etc/ld.so.conf").write_text(top)
    for name, text in confd.items():
        (root / "etc/ld.so.conf.d" / name).write_text(text)
    for name, text in other.items():
        (root / "etc/other" / name).write_text(text)


def _view(root: Path) -> tuple[FolderView, dict[str, ConfFile]]:
    regular: list[str] = []
    links: list[str] = []
    folders: list[str] = []
    symlinks: dict[str, str] = {}
    confs: dict[str, ConfFile] = {}

    def on_link(rel: str, target: str | None) -> None:
        links.append(rel)
        if target is not None:
            symlinks[rel] = target

    for r in scan_tree(
        root,
        compat=True,
        on_file=lambda rel, _c: regular.append(rel),
        on_link=on_link,
        on_folder=folders.append,
    ):
        if isinstance(r, ConfFile):
            confs[r.path] = r
    view = FolderView(
        entries=frozenset(regular + links),
        regular=frozenset(regular),
        symlinks=symlinks,
        folders=frozenset(folders),
        unreadable=frozenset(),
        libraries={},
        resolve=resolve,
    )
    return view, confs


def _scanned(root: Path, symlinks: Mapping[str, str]) -> list[str]:
    """The folders ``ldconfig -v`` scans from the configuration, as final paths."""
    out = subprocess.run(
        [CHROOT, str(root), "/sbin/ldconfig", "-v", "-N", "-X", "-f", "/etc/ld.so.conf"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    found = []
    for line in out.splitlines():
        if line.startswith("/") and "(from " in line and "<builtin>" not in line:
            folder = resolve(line.split(":", 1)[0].lstrip("/"), symlinks)
            if folder is not None and "glibc-hwcaps" not in folder:
                found.append(folder)
    return found


@rooted
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    top=st.none() | FILES,
    confd=st.dictionaries(st.sampled_from(CONF_NAMES), FILES, max_size=4),
    other=st.dictionaries(st.sampled_from(CONF_NAMES), FILES, max_size=2),
    hook=HOOK_NAMES,
)
def test_the_folders_read_are_those_glibcs_ldconfig_scans(
    kit: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    top: str | None,
    confd: dict[str, str],
    other: dict[str, str],
    hook: str,
) -> None:
    # The hook creates its file under a name no file has (os.CreateTemp: O_EXCL), so
    # it never replaces a file of the image.
    assume(f"00-compat-{hook}.conf" not in confd)
    root = tmp_path_factory.mktemp("conf")
    _write(root, top, confd, other)
    view, confs = _view(root)
    got = read_loader_conf(view, confs)
    if got.unknown is not None:  # an include cycle sends ldconfig into endless recursion
        event(f"unknown: {got.unknown.split(' ')[0]}")
        return
    _place(kit, "ldconfig", root / "sbin/ldconfig")
    if top is None:  # what the update-ldcache hook writes (ensureLdsoconfFile)
        (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / f"etc/ld.so.conf.d/00-compat-{hook}.conf").write_text("/d/hook\n")
    scanned = _scanned(root, view.symlinks)
    assert [f for f in scanned if f != "d/hook"] == list(got.folders)
    event(f"hook read: {got.hook_read}")
    if got.hook_read is not None:
        assert ("d/hook" in scanned) == got.hook_read
    if got.hook_read:  # the folders scanned before the hook's are among those said ahead
        before = scanned[: scanned.index("d/hook")]
        assert set(before) <= set(got.ahead), (before, got.ahead)
        assert [f for f in got.ahead if f in got.folders][: len(before)] == before


# ------------------------------------------------ (a) the image names the compat folder


def _compat_root(root: Path, kit: dict[str, Path], top: str, confd: dict[str, str]) -> None:
    _make_root(root, kit, {"libcuda.so.590.44.01": "A", "libcuda.so.1": "Llibcuda.so.590.44.01"})
    (root / "etc/ld.so.conf").write_text(top)
    (root / "etc/ld.so.conf.d/00-compat-1.conf").unlink()  # the hook's, written below
    for name, text in confd.items():
        (root / "etc/ld.so.conf.d" / name).write_text(text)


def _setup(root: Path) -> CompatSetup | None:
    return scan_directory(parse_ref(f"dir:{root}")).compat


@rooted
@pytest.mark.parametrize("named", ["/usr/local/cuda/compat", "/usr/local/cuda-13.1/compat/"])
def test_an_image_conf_naming_the_compat_folder_fails_closed_where_the_hook_would_not_use_it(
    kit: dict[str, Path], tmp_path: Path, named: str
) -> None:
    root = tmp_path / "root"
    _compat_root(root, kit, "include /etc/ld.so.conf.d/*.conf\n", {"cuda.conf": named + "\n"})
    setup = _setup(root)
    # glibc loads the compat driver with no hook file at all: the false pass to avoid.
    assert _real(root) == f"{COMPAT}/libcuda.so.590.44.01"
    assert setup is not None and setup.undetermined is None and setup.named
    use = compat_use(setup, NEW_HOST)
    assert use is not None and not use.in_use and use.undetermined is not None
    assert "names /usr/local/cuda-13.1/compat itself" in use.undetermined
    old = compat_use(setup, OLD_HOST)
    assert old is not None and old.in_use and old.undetermined is None


@rooted
def test_an_image_conf_naming_another_folder_with_a_libcuda_fails_closed(
    kit: dict[str, Path], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    _compat_root(root, kit, "include /etc/ld.so.conf.d/*.conf\n", {"s.conf": "/opt/stubs\n"})
    _place(kit, "B", root / "opt/stubs/libcuda.so.1")
    assert _real(root) == "opt/stubs/libcuda.so.1"
    setup = _setup(root)
    assert setup is not None and setup.undetermined is not None
    assert "names /opt/stubs" in setup.undetermined


# ------------------------------------------ (b) the hook's file is never read at all


@rooted
@pytest.mark.parametrize(
    ("top", "read"),
    [
        ("/usr/lib/x86_64-linux-gnu\n", False),
        ("# include /etc/ld.so.conf.d/*.conf\n", False),
        ("include /etc/ld.so.conf.d/libc*.conf\n", False),
        ("include /etc/ld.so.conf.d/x86*.conf\n", False),  # no name the hook gives starts so
        ("include ld.so.conf.d/*.conf\n", True),
        ("include /etc/ld.so.conf.d/*\n", True),
        ("include /etc/ld.so.conf.d/00-compat-?.conf\n", None),
    ],
)
def test_the_hooks_file_counts_only_where_the_image_includes_it(
    kit: dict[str, Path], tmp_path: Path, top: str, read: bool | None
) -> None:
    root = tmp_path / "root"
    _compat_root(root, kit, top, {})
    setup = _setup(root)
    assert setup is not None and setup.hook_read is read
    use = compat_use(setup, OLD_HOST)
    assert use is not None
    (root / "etc/ld.so.conf.d/00-compat-4021.conf").write_text("/usr/local/cuda/compat\n")
    loaded = _real(root)
    if read is None:
        assert use.undetermined is not None and not use.in_use
    else:
        assert use.in_use is read and use.undetermined is None
        assert (loaded == f"{COMPAT}/libcuda.so.590.44.01") is read


# -------------------------------------------------------------------- bounds


def _pure(entries: dict[str, bytes], links: dict[str, str] | None = None) -> FolderView:
    folders = {p.rpartition("/")[0] for p in entries}
    folders |= {f.rpartition("/")[0] for f in folders}
    return FolderView(
        entries=frozenset({*entries, *(links or {})}),
        regular=frozenset(entries),
        symlinks=links or {},
        folders=frozenset(folders | {"etc", "etc/ld.so.conf.d"}),
        unreadable=frozenset(),
        libraries={},
        resolve=resolve,
    )


def test_what_cannot_be_followed_is_unknown() -> None:
    loop = {"etc/ld.so.conf": b"include /etc/ld.so.conf\n"}
    big = {"etc/ld.so.conf": b"#" * (CONF_LIMIT + 1)}
    for entries, says in [
        (loop, f"more than {MAX_FILES}"),
        (big, "larger than"),
        ({"etc/ld.so.conf": b"include /etc/*/x.conf\n"}, "wildcard in a folder"),
        ({"etc/ld.so.conf": b"include /etc/ld.so.conf.d/[a-z].conf\n"}, "has '['"),
        ({"etc/ld.so.conf": b"lib\n"}, "relative folder"),
    ]:
        confs = {
            p: ConfFile(path=p, size=len(t), text=t if len(t) <= CONF_LIMIT else None)
            for p, t in entries.items()
        }
        got = read_loader_conf(_pure(entries), confs)
        assert got.unknown is not None and says in got.unknown, (entries, got)
    # a file it includes whose text was not kept (out of /etc/ld.so.conf.d)
    entries = {"etc/ld.so.conf": b"include /opt/c/*.conf\n", "opt/c/x.conf": b""}
    top = {
        "etc/ld.so.conf": ConfFile(path="etc/ld.so.conf", size=22, text=entries["etc/ld.so.conf"])
    }
    got = read_loader_conf(_pure(entries), top)
    assert got.unknown is not None and "was not read" in got.unknown


# ------------------------------------------------------- through layers and the cache


def _image(*layers: dict[str, Entry]) -> CompatSetup | None:
    summaries = [
        scan_in_place(layer_tar(layer), name=f"layer{i}") for i, layer in enumerate(layers)
    ]
    again = [
        decode(encode(f"sha256:{i:064x}", s), f"sha256:{i:064x}") for i, s in enumerate(summaries)
    ]
    assert all(s is not None for s in again)
    image = finish(ref="x", digest=None, config=ImageConfig(), layers=[s for s in again if s])
    return image.compat


@pytest.fixture(scope="module")
def compat_lib(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    from tests.standins import NOTE_13_1, compat_library

    return compat_library(tmp_path_factory.mktemp("lib"), "590.44.01", NOTE_13_1).read_bytes()


def test_the_text_is_carried_through_layers_whiteouts_and_the_cache(compat_lib: bytes) -> None:
    base: dict[str, Entry] = {
        "usr/local/cuda-13.1/compat/libcuda.so.590.44.01": compat_lib,
        "usr/local/cuda/compat/libcuda.so.590.44.01": compat_lib,
        "etc/ld.so.conf": b"include /etc/ld.so.conf.d/*.conf\n",
        "etc/ld.so.conf.d/cuda.conf": b"/usr/local/cuda/compat\n",
    }
    setup = _image(base)
    assert setup is not None and setup.named and setup.hook_read is True
    # an opaque /etc/ld.so.conf.d above hides cuda.conf; a short file replaces the top
    hidden = _image(base, {"etc/ld.so.conf.d": Dir(), "etc/ld.so.conf.d/.wh..wh..opq": b""})
    assert hidden is not None and not hidden.named and hidden.hook_read is True
    short = _image(base, {"etc/.wh.ld.so.conf.d": b"", "etc/ld.so.conf": b"/x\n"})
    assert short is not None and not short.named and short.hook_read is False
    gone = _image(base, {"etc/.wh.ld.so.conf": b"", "etc/ld.so.conf.d/.wh.cuda.conf": b""})
    assert gone is not None and not gone.named and gone.hook_read is True


_ODD_LINES = [
    b"include /etc/ld.so.conf",  # a cycle
    b"include ld.so.conf.d/*.conf",
    b"include *",
    b"include /*",
    b"include ../etc/ld.so.conf.d/*",
    b"include /etc/ld.so.conf.d/loop/*.conf",
    b"include /etc/ld.so.conf.d/self",
    b"include\t\t/etc/ld.so.conf.d/a.conf\t",
    b"include ",
    b"include /etc/ld.so.conf.d/.*",
    b"/usr/lib/\xff\xfe=\x00x",
    b"\x7fELF\x02\x01\x01\x00\x00",
    b"=",
    b"/",
    b"   /opt//lib///",
    b"hwcap",
    b"HWCAP\tx",
]


@settings(max_examples=200, deadline=None)
@given(
    files=st.dictionaries(
        st.sampled_from(["etc/ld.so.conf", *(f"etc/ld.so.conf.d/{n}" for n in "ab")]),
        st.lists(st.sampled_from(_ODD_LINES) | st.binary(max_size=40), max_size=6).map(b"\n".join),
        min_size=1,
    )
)
def test_odd_configuration_never_raises(files: dict[str, bytes]) -> None:
    """Garbage, cycles, globs of every shape and symlink loops in /etc/ld.so.conf.d
    give folders or "unknown", never an exception."""
    links = {
        "etc/ld.so.conf.d/loop": "loop",
        "etc/ld.so.conf.d/self": "self.conf",
        "etc/ld.so.conf.d/self.conf": "self",
    }
    confs = {p: ConfFile(path=p, size=len(t), text=t) for p, t in files.items()}
    got = read_loader_conf(_pure(files, links), confs)
    assert set(got.folders) <= set(got.listed)
    assert got.listed[: len(got.ahead)] == got.ahead  # the folders before the hook's file


def test_search_paths_are_carried_through_layers_and_the_cache(
    compat_lib: bytes, tmp_path: Path
) -> None:
    """A program's DT_RUNPATH (it dlopens libcuda) read from a layer tar, through the
    layer cache's codec, to the final view: naming the stubs folder where a libcuda.so.1
    stands, it is found there (buildmatrix.ldshadow.searched_by_rpath); a whiteout of
    that link clears it."""
    import shutil

    if shutil.which("gcc") is None:
        pytest.skip("gcc builds the program")
    stubs = "usr/local/cuda-13.1/targets/x86_64-linux/lib/stubs"
    # It loads libcuda itself, so its DT_RUNPATH is searched (buildmatrix.binary.dynamic).
    (tmp_path / "run.c").write_text(
        '#include <dlfcn.h>\nint main(void) { return dlopen("libcuda.so.1", RTLD_NOW) == 0; }\n'
    )
    program = tmp_path / "run"
    rpath = f"-Wl,--enable-new-dtags,-rpath,$ORIGIN/../../{stubs}"
    subprocess.run(["gcc", "-o", str(program), str(tmp_path / "run.c"), rpath], check=True)
    base: dict[str, Entry] = {
        "usr/local/cuda-13.1/compat/libcuda.so.590.44.01": compat_lib,
        f"{stubs}/libcuda.so": compat_lib,
        f"{stubs}/libcuda.so.1": Symlink("libcuda.so"),
        "opt/app/run": program.read_bytes(),
    }
    setup = _image(base)
    assert setup is not None and setup.preload is not None
    assert setup.preload[0] == stubs and "/opt/app/run" in setup.preload[1]
    gone = _image(base, {f"{stubs}/.wh.libcuda.so.1": b""})
    assert gone is None or gone.preload is None  # nothing for the loader to find there
