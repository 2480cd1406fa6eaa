"""Which ``libcuda.so.1`` a container loads from its compat folder
(buildmatrix.ldconfig), held to the real thing: glibc's own ``ldconfig`` run in the
folder's root as the container toolkit's ``update-ldcache`` hook runs it (chrooted,
``-f /etc/ld.so.conf -C /etc/ld.so.cache``, the folder named by a
``00-compat-*.conf``), then glibc's own dynamic loader, in the same root, opening
``libcuda.so.1`` with ``dlopen`` and printing the real path of the file it mapped.

The libraries are STAND-INS built by gcc (tests/standins ``compat_library`` and
variants without a SONAME or with another one); the folder shapes are drawn by
hypothesis over regular files, symlinks (to files in the folder, outside it, to
nothing), names that tie by ``_dl_cache_libcmp`` and names ldconfig counts although
they are no library's (``tls``). Where buildmatrix says the choice is unknown, the
test asserts the case is one of the documented ones (a tie, a hwcap name, a SONAME
equal to libcuda.so.1 by ``_dl_cache_libcmp``, a library below the folder, a file
it did not read): never a silent guess.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from buildmatrix import schema
from buildmatrix.binary.compat_note import CompatLibrary
from buildmatrix.binary.report import ScanProblem
from buildmatrix.binary.scan import scan_tree
from buildmatrix.forward import resolve
from buildmatrix.ldconfig import FolderView, libcmp, pick
from tests.standins import NOTE_13_1, compat_library

DIR = "usr/local/cuda-13.1/compat"
OUTSIDE = "opt/x/libcuda.so.600.1.2"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
# The loader, named: a program's $ORIGIN is then its path's folder without
# /proc/self/exe (elf/dl-origin.c), which a chroot lacks and a container has.
LOADER = "/lib64/ld-linux-x86-64.so.2"
ROOTED = os.geteuid() == 0 and shutil.which("gcc") is not None and Path("/sbin/ldconfig").exists()
pytestmark = pytest.mark.skipif(not ROOTED, reason="chroot needs root; gcc builds the stand-ins")

WHICH_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
int main(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) { puts("none"); return 0; }
  Dl_info info; void *f = dlsym(h, "cuInit");
  char real[PATH_MAX];
  if (!f || !dladdr(f, &info) || !realpath(info.dli_fname, real)) { puts("unknown"); return 0; }
  puts(real); return 0;
}
"""


def _library(out: Path, name: str, soname: str | None) -> Path:
    """A STAND-IN shared library defining cuInit, with the SONAME given (or none)."""
    src = out / f"{name}.S"
    src.write_text(
        '    .section .note.GNU-stack,"",@progbits\n'
        "    .text\n    .globl cuInit\ncuInit:\n    xorl %eax, %eax\n    ret\n"
    )
    lib = out / name
    flags = [f"-Wl,-soname,{soname}"] if soname else []
    subprocess.run(["gcc", "-shared", "-fPIC", *flags, "-o", str(lib), str(src)], check=True)
    return lib


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The files every root is made of, in one folder (hard-linked from there)."""
    out = tmp_path_factory.mktemp("kit")
    which = out / "which"
    (out / "which.c").write_text(WHICH_C)
    subprocess.run(["gcc", "-o", str(which), str(out / "which.c")], check=True)
    loader = Path(
        subprocess.run(
            ["gcc", "-print-file-name=ld-linux-x86-64.so.2"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    ).resolve()
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    kit = {
        "A": compat_library(out, "590.44.01", NOTE_13_1),  # SONAME libcuda.so.1
        "B": compat_library(out, "535.54.03", None),  # SONAME libcuda.so.1
        "N": _library(out, "noson.so", None),
        "Z": _library(out, "zero.so", "libcuda.so.01"),
        "T": out / "text",
        "ldconfig": out / "ldconfig",
        "which": which,
        "ld.so": out / "ld.so",
        "libc": out / "libc.so.6",
    }
    kit["T"].write_text("not a library\n")
    shutil.copy("/sbin/ldconfig", kit["ldconfig"])
    shutil.copy(loader, kit["ld.so"])
    shutil.copy(libc, kit["libc"])
    return kit


def _place(kit: dict[str, Path], src: str, dest: Path) -> None:
    """``dest`` as a hard link to the kit's file (a copy across file systems)."""
    if dest.exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(kit[src], dest)
    except OSError:
        shutil.copy(kit[src], dest)


def _make_root(root: Path, kit: dict[str, Path], shape: dict[str, str]) -> None:
    (root / "usr/local").mkdir(parents=True)
    (root / "usr/local/cuda").symlink_to("cuda-13.1")
    (root / DIR).mkdir(parents=True)
    _place(kit, "ldconfig", root / "sbin/ldconfig")
    _place(kit, "which", root / "which")
    _place(kit, "ld.so", root / LOADER.lstrip("/"))
    _place(kit, "libc", root / "lib/x86_64-linux-gnu/libc.so.6")
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.cache").write_bytes(b"")  # a distribution image has one
    (root / "etc/ld.so.conf.d/00-compat-1.conf").write_text("/usr/local/cuda/compat\n")
    for name, kind in shape.items():
        where = root / DIR / name
        where.parent.mkdir(parents=True, exist_ok=True)
        if kind.startswith("L"):
            where.symlink_to(kind[1:])
        elif kind == "O":
            _place(kit, "A", root / OUTSIDE)
            where.symlink_to("/" + OUTSIDE)
        elif kind == "D":
            where.symlink_to("missing.so")
        else:
            _place(kit, kind, where)


def _real(
    root: Path,
    *,
    ldconfig: bool = True,
    env: dict[str, str] | None = None,
    program: tuple[str, ...] = ("/which",),
) -> str | None:
    """The file glibc's loader maps for libcuda.so.1 after glibc's ldconfig (unless
    ``ldconfig`` is False: the hook did not name the folder), in ROOT, with ``env``:
    what ``program`` (a command in ROOT printing the path it mapped) prints."""
    if ldconfig:
        subprocess.run(
            [
                "chroot",
                str(root),
                "/sbin/ldconfig",
                "-f",
                "/etc/ld.so.conf",
                "-C",
                "/etc/ld.so.cache",
            ],
            check=True,
            capture_output=True,
        )
    out = subprocess.run(
        [CHROOT, str(root), *program], check=True, capture_output=True, text=True, env=env or {}
    ).stdout.strip()
    return None if out == "none" else out.lstrip("/")


def _model(root: Path) -> tuple[str | None, str | None]:
    """buildmatrix's reading of the same root, before ldconfig ran: (path, unknown)."""
    libraries: dict[str, CompatLibrary] = {}
    unreadable: list[str] = []
    regular: list[str] = []
    links: list[str] = []
    folders: list[str] = []
    symlinks: dict[str, str] = {}

    def on_link(rel: str, target: str | None) -> None:
        links.append(rel)
        if target is not None:
            symlinks[rel] = target

    walk = scan_tree(
        root,
        compat=True,
        on_file=lambda rel, _code: regular.append(rel),
        on_link=on_link,
        on_folder=folders.append,
    )
    for r in walk:
        if isinstance(r, CompatLibrary):
            libraries[r.path] = r
        elif isinstance(r, ScanProblem):
            unreadable.append(r.path)
    view = FolderView(
        entries=frozenset(regular + links),
        regular=frozenset(regular),
        symlinks=symlinks,
        folders=frozenset(folders),
        unreadable=frozenset(unreadable),
        libraries=libraries,
        resolve=resolve,
    )
    got = pick(DIR, view)
    return got.path, got.unknown


NAMES = [
    "libcuda.so.1",
    "libcuda.so.590.44.01",
    "libcuda.so.590.44.1",  # ties with 590.44.01 by _dl_cache_libcmp
    "libcuda.so.535.54.03",
    "libcuda.so.999",
    "libcuda.so",
    "libcudart.so.13",
    "tls",  # a hwcap platform's name: ldconfig counts a symlink so named
    "glibc-hwcaps/x86-64-v2/libcuda.so.1",
    # prelink temporaries (search_dir skips ".#prelink#" and ".#prelink#.XXXXXX" only)
    "libcuda.so.999.#prelink#",
    "libcuda.so.999.#prelink#.abcdef",
    "libcuda.so.999.#prelink#.x",
    "libzz.so.#prelink#.abcdefg",
]
KINDS = ["A", "B", "N", "Z", "T", "O", "D", *(f"L{n}" for n in NAMES[:6])]
# Reasons buildmatrix may give for not knowing; each names a case the docstring lists.
ALLOWED_UNKNOWN = (
    "depends on the order the file system lists them",
    "hwcap platform",
    "which the loader's cache lookup takes for",
    "lies in a subfolder",
    "was not read as a libcuda",
    "is not a readable regular file after ldconfig",
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(shape=st.dictionaries(st.sampled_from(NAMES), st.sampled_from(KINDS), max_size=5))
def test_the_loaded_libcuda_is_the_one_glibc_loads(
    kit: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, shape: dict[str, str]
) -> None:
    if "tls" in shape and shape["tls"] not in ("O", "D") and not shape["tls"].startswith("L"):
        shape["tls"] = "Llibcuda.so.590.44.01"  # a regular file so named is no DSO: skipped
    root = tmp_path_factory.mktemp("root")
    _make_root(root, kit, shape)
    path, unknown = _model(root)
    real = _real(root)
    event("unknown" if unknown else "none in the folder" if path is None else "a file loaded")
    if unknown is None:
        assert _same(root, path, real), (shape, path, real)
        return
    assert any(why in unknown for why in ALLOWED_UNKNOWN), (shape, unknown)
    if path is not None and real is not None:  # the file is known, only its use is not
        assert _same(root, path, real), (shape, path, real)


def _same(root: Path, a: str | None, b: str | None) -> bool:
    """The same file: one path, or hard links to one inode (ldconfig's create_links
    compares inodes, so a link to a hard link of the winner is left as it is)."""
    if a is None or b is None:
        return a == b
    sa, sb = (root / a).stat(), (root / b).stat()
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


@pytest.mark.parametrize(
    ("shape", "loaded"),
    [
        # NVIDIA's layout: the SONAME link to the versioned file
        ({"libcuda.so.1": "Llibcuda.so.590.44.01", "libcuda.so.590.44.01": "A"}, "A"),
        # no link yet: ldconfig makes it
        ({"libcuda.so.590.44.01": "A"}, "A"),
        # a regular libcuda.so.1 of another driver stays ("is not a symbolic link")
        ({"libcuda.so.1": "B", "libcuda.so.590.44.01": "A"}, "libcuda.so.1"),
        # a newer name of the same SONAME takes the link (review: libcuda.so.999)
        (
            {
                "libcuda.so.1": "Llibcuda.so.590.44.01",
                "libcuda.so.590.44.01": "A",
                "libcuda.so.999": "B",
            },
            "libcuda.so.999",
        ),
        # a symlink of another name counts as a file of that name
        ({"libcuda.so.590.44.01": "A", "libcuda.so.999": "O"}, OUTSIDE),
        # without a SONAME, a file is its own name's: no libcuda.so.1 at all
        ({"libcuda.so.590.44.01": "N"}, None),
    ],
)
def test_shapes_from_the_review(
    kit: dict[str, Path], tmp_path: Path, shape: dict[str, str], loaded: str | None
) -> None:
    _make_root(tmp_path, kit, shape)
    path, unknown = _model(tmp_path)
    real = _real(tmp_path)
    expected = None if loaded is None else loaded if "/" in loaded else f"{DIR}/{loaded}"
    if loaded == "A":
        expected = f"{DIR}/libcuda.so.590.44.01"
    assert real == expected
    assert _same(tmp_path, path, expected)
    assert unknown is None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("libcuda.so.1", "libcuda.so.590.44.01"),
        ("libcuda.so.590.44.01", "libcuda.so.590.44.1"),
        ("libcuda.so.999", "libcuda.so.1000"),
        ("libcuda.so.1", "libcuda.so.01"),
        ("libcuda.so.4294967297", "libcuda.so.1"),  # C int wraps: equal
        ("libcuda.so.1a", "libcuda.so.1"),
        ("libcuda.so", "libcuda.so.1"),
        ("libcuda.so.2147483648", "libcuda.so.1"),
    ],
)
def test_libcmp_orders_names_as_the_loader_cache_does(
    kit: dict[str, Path], tmp_path: Path, a: str, b: str
) -> None:
    """``ldconfig -p`` lists the cache in ``_dl_cache_libcmp`` order, newest first
    (elf/cache.c ``compare``): two libraries of these SONAMEs come out in the order
    buildmatrix.ldconfig.libcmp gives, and equal names side by side."""
    folder = tmp_path / "lib"
    folder.mkdir()
    for name in (a, b):
        lib = _library(tmp_path, f"src-{name}", name)
        shutil.copy(lib, folder / name)
    conf = tmp_path / "ld.so.conf"
    conf.write_text(f"{folder}\n")
    cache = tmp_path / "ld.so.cache"
    subprocess.run(
        ["/sbin/ldconfig", "-X", "-f", str(conf), "-C", str(cache)], check=True, capture_output=True
    )
    listed = [
        line.split()[0]
        for line in subprocess.run(
            ["/sbin/ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True, check=True
        ).stdout.splitlines()[1:]
        if "=>" in line and line.split()[0].startswith("libcuda")  # not the system's
    ]
    assert sorted(listed) == sorted([a, b])
    if libcmp(a, b) != 0:
        newest_first = [a, b] if libcmp(a, b) > 0 else [b, a]
        assert listed == newest_first


# ------------------------------------------------------ through check, both toolkit paths


@pytest.mark.parametrize(
    ("shape", "loaded"),
    [
        ({"libcuda.so.1": "B", "libcuda.so.590.44.01": "A"}, "libcuda.so.1"),
        (
            {
                "libcuda.so.1": "Llibcuda.so.590.44.01",
                "libcuda.so.590.44.01": "A",
                "libcuda.so.999": "B",
            },
            "libcuda.so.999",
        ),
    ],
)
def test_check_fails_where_the_loader_takes_another_libcuda(
    kit: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shape: dict[str, str],
    loaded: str,
) -> None:
    """The hook judges libcuda.so.590.44.01 (its note lists R535) and names the folder;
    glibc then loads an older driver's libcuda (a regular libcuda.so.1, or a
    libcuda.so.999 of SONAME libcuda.so.1), whose version no name gives: fail closed.
    Without the extra file the same image passes through the compat driver."""
    import json

    from buildmatrix.cli import main

    oracle, root = tmp_path / "oracle", tmp_path / "image"
    _make_root(oracle, kit, shape)
    assert _real(oracle) == f"{DIR}/{loaded}"  # glibc's loader agrees on the file
    _make_root(root, kit, shape)  # the image as it ships, before ldconfig runs
    shutil.copy(Path(__file__).parent / "fixtures/bin/libsass_sm80.so", root / "libapp.so")
    args = ["check", f"dir:{root}", "--sm", "8.0", "--driver", "535.104.05", "--no-cache"]
    code = main([*args, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1, doc
    problem = doc["problems"][0]
    assert f"the loader takes /{DIR}/{loaded}" in problem and "fail closed" in problem
    assert doc["forward_compat"]["in_use"] is False
    schema.validate(doc, "check", source="check --json")  # the documented shape
    # the same image with the compat driver alone passes through it
    (root / DIR / loaded).unlink()
    (root / DIR / "libcuda.so.1").unlink(missing_ok=True)
    (root / DIR / "libcuda.so.1").symlink_to("libcuda.so.590.44.01")
    code = main([*args, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc["problems"]
    assert doc["forward_compat"]["in_use"] is True


def test_ld_library_path_puts_the_compat_driver_first_whatever_the_hook_chooses(
    kit: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a driver newer than the compat one (R600, a branch its note does not list)
    the hook leaves the node's driver in use; but an image whose LD_LIBRARY_PATH names
    the compat folder has glibc's loader take the older compat libcuda.so.1 from it
    first (no ldconfig run at all): fail closed. The same image without that
    variable passes on the node's driver."""
    import json

    from buildmatrix.cli import main
    from tests.images import DISTRO_LOADER, Entry, Image, Symlink, write_docker_archive

    shape = {"libcuda.so.1": "Llibcuda.so.590.44.01", "libcuda.so.590.44.01": "A"}
    root = tmp_path / "root"
    _make_root(root, kit, shape)
    (root / "etc/ld.so.conf.d/00-compat-1.conf").unlink()  # the hook names no folder
    env = {"LD_LIBRARY_PATH": "/usr/local/cuda/compat"}
    assert _real(root) is None  # the root holds no other libcuda.so.1
    assert _real(root, ldconfig=False, env=env) == f"{DIR}/libcuda.so.590.44.01"
    layer: dict[str, Entry] = {
        "usr/local/cuda": Symlink("cuda-13.1"),
        f"{DIR}/libcuda.so.590.44.01": kit["A"].read_bytes(),
        f"{DIR}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
        "usr/lib/libapp.so": (Path(__file__).parent / "fixtures/bin/libsass_sm80.so").read_bytes(),
        **DISTRO_LOADER,
    }
    for extra, expected in ((env, 1), ({}, 0)):
        archive = write_docker_archive(
            tmp_path / f"img{expected}.tar",
            Image(
                layers=[layer],
                env={"CUDA_VERSION": "13.0.0", "NVIDIA_DISABLE_REQUIRE": "1", **extra},
            ),
        )
        args = ["check", f"docker-archive:{archive}", "--sm", "8.0", "--driver", "600.10.01"]
        code = main([*args, "--no-cache", "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert code == expected, doc["problems"]
        assert doc["forward_compat"]["in_use"] is False
        if expected:
            assert "LD_LIBRARY_PATH names /usr/local/cuda/compat" in doc["problems"][0]
            schema.validate(doc, "check", source="check --json")
    # where the hook puts that same folder in use (R535 is listed), the file is the same
    args = ["check", f"docker-archive:{tmp_path / 'img1.tar'}", "--sm", "8.0"]
    code = main([*args, "--driver", "535.104.05", "--no-cache", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc["problems"]
    assert doc["forward_compat"]["in_use"] is True


def test_a_compat_driver_for_another_machine_is_not_taken_for_the_hosts(
    kit: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An amd64 image whose compat libcuda is an Arm build (e_machine 183: the stand-in
    with its machine field changed): the hook, which reads no machine, names the folder;
    glibc's ldconfig on an x86-64 host skips the file ("unknown machine") and the node's
    own libcuda is loaded. check must not credit the compat driver: it fails closed."""
    import json

    from buildmatrix.cli import main
    from tests.images import Entry, Image, Symlink, write_docker_archive

    arm = bytearray(kit["A"].read_bytes())
    arm[18:20] = (183).to_bytes(2, "little")  # e_machine: EM_AARCH64
    root = tmp_path / "root"
    _make_root(root, kit, {})
    (root / DIR / "libcuda.so.590.44.01").write_bytes(bytes(arm))
    assert _real(root) is None  # glibc loads no libcuda.so.1 from the folder
    layer: dict[str, Entry] = {
        "usr/local/cuda": Symlink("cuda-13.1"),
        f"{DIR}/libcuda.so.590.44.01": bytes(arm),
        f"{DIR}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
        "usr/lib/libapp.so": (Path(__file__).parent / "fixtures/bin/libsass_sm80.so").read_bytes(),
    }
    archive = write_docker_archive(
        tmp_path / "img.tar",
        Image(layers=[layer], env={"CUDA_VERSION": "13.0.0", "NVIDIA_DISABLE_REQUIRE": "1"}),
    )
    args = ["check", f"docker-archive:{archive}", "--sm", "8.0", "--driver", "535.104.05"]
    code = main([*args, "--no-cache", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1, doc["problems"]
    assert "several ELF classes or machines on a ELF64 LSB machine 62 host" in doc["problems"][0]


def test_the_compat_folder_goes_before_the_nodes_driver_folder(
    kit: dict[str, Path], tmp_path: Path
) -> None:
    """What the whole model rests on: with the hook's ``00-compat-*.conf`` beside the
    ``00-nvcr-*.conf`` and ``zz-nvcr-*.conf`` the update-ldcache hook writes for the
    node's driver folder (``internal/ldconfig/ldconfig.go``), glibc's loader takes the
    compat folder's libcuda.so.1; without the compat conf, the node's."""
    _make_root(tmp_path, kit, {"libcuda.so.590.44.01": "A"})
    _place(kit, "B", tmp_path / "usr/lib/x86_64-linux-gnu/libcuda.so.535.54.03")
    conf = tmp_path / "etc/ld.so.conf.d"
    (conf / "00-nvcr-2.conf").write_text("/usr/lib/x86_64-linux-gnu\n")
    (conf / "zz-nvcr-3.conf").write_text("/usr/lib/x86_64-linux-gnu\n")
    assert _real(tmp_path) == f"{DIR}/libcuda.so.590.44.01"
    (conf / "00-compat-1.conf").unlink()
    assert _real(tmp_path) == "usr/lib/x86_64-linux-gnu/libcuda.so.535.54.03"


NODE = "usr/lib/x86_64-linux-gnu"  # where the runtime mounts the node's driver (ldshadow)


def _with_node_driver(root: Path, kit: dict[str, Path]) -> None:
    """The node's driver as the runtime adds it (a STAND-IN, kit "B"), and the
    multiarch folder named as Debian's stock ``x86_64-linux-gnu.conf`` names it."""
    _place(kit, "B", root / NODE / "libcuda.so.580.65.06")
    if not (root / NODE / "libcuda.so.1").exists():
        (root / NODE / "libcuda.so.1").symlink_to("libcuda.so.580.65.06")
    (root / "etc/ld.so.conf.d/x86_64-linux-gnu.conf").write_text(f"/{NODE}\n")


# An image's own libcuda (kit "A": SONAME libcuda.so.1) where glibc's loader takes it
# before the node's driver (the review's shapes); "stub" is where it does not.
IMAGE_SHAPES = {
    # Debian/Ubuntu's stock libc.conf names /usr/local/lib, and sorts first
    "local-lib": {"usr/local/lib/libcuda.so.550.54.15": "A", "@libc.conf": "/usr/local/lib"},
    # the node's driver folder itself: the newer name wins the SONAME
    "newer-name": {f"{NODE}/libcuda.so.999": "A"},
    # a regular libcuda.so.1 stays ("is not a symbolic link")
    "regular-soname": {f"{NODE}/libcuda.so.1": "A"},
    # /etc/ld.so.preload maps it before anything else, from a folder no conf names
    "preload": {"opt/old/libcuda.so.550.54.15": "A", "@preload": "/opt/old/libcuda.so.550.54.15"},
}
STUB = "usr/local/cuda-13.1/targets/x86_64-linux/lib"


def _image_root(root: Path, kit: dict[str, Path], shape: dict[str, str]) -> None:
    _make_root(root, kit, {})
    (root / "etc/ld.so.conf.d/00-compat-1.conf").unlink()  # no compat driver: no hook
    for where, what in shape.items():
        if where == "@libc.conf":
            (root / "etc/ld.so.conf.d/libc.conf").write_text(what + "\n")
        elif where == "@preload":
            (root / "etc/ld.so.preload").write_text(what + "\n")
        elif where == "@cuda.conf":
            (root / "etc/ld.so.conf.d/988_cuda-13.conf").write_text(what + "\n")
        else:
            _place(kit, what, root / where)


@pytest.mark.parametrize("name", sorted(IMAGE_SHAPES))
def test_an_image_libcuda_the_loader_takes_fails_closed(
    kit: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """glibc's ldconfig and loader, with the node's driver added as the runtime adds
    it, load the image's own libcuda: check on driver 580.65.06 must not judge the
    image on the node's driver; it fails closed, naming the file. Without that file
    the same image passes."""
    import json

    from buildmatrix.cli import main

    shape = IMAGE_SHAPES[name]
    mine = next(k for k in shape if not k.startswith("@"))
    oracle, image = tmp_path / "oracle", tmp_path / "image"
    _image_root(oracle, kit, shape)
    _with_node_driver(oracle, kit)
    assert _real(oracle) == mine  # glibc maps the image's file, not the node's
    _image_root(image, kit, shape)  # the image as it ships
    shutil.copy(Path(__file__).parent / "fixtures/bin/libsass_sm80.so", image / "libapp.so")
    args = ["check", f"dir:{image}", "--sm", "8.0", "--driver", "580.65.06", "--no-cache"]
    code = main([*args, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1, doc
    named = "/etc/ld.so.preload" if name == "preload" else f"/{mine}"
    assert any(named in p and "fail closed" in p for p in doc["problems"]), doc["problems"]
    schema.validate(doc, "check", source="check --json")
    (image / mine).unlink()
    (image / "etc/ld.so.preload").unlink(missing_ok=True)
    code = main([*args, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc["problems"]


def test_the_cuda_toolkits_stub_is_not_taken_for_the_driver(
    kit: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CUDA images ship the link-time stub ``targets/<arch>/lib/stubs/libcuda.so``
    (SONAME libcuda.so.1) and name ``targets/<arch>/lib`` in a ``988_cuda-*.conf``;
    ldconfig does not descend into ``stubs``, so glibc loads the node's driver, and
    check passes on it."""
    import json

    from buildmatrix.cli import main

    shape = {f"{STUB}/stubs/libcuda.so": "A", "@cuda.conf": f"/{STUB}"}
    oracle, image = tmp_path / "oracle", tmp_path / "image"
    _image_root(oracle, kit, shape)
    _with_node_driver(oracle, kit)
    assert _real(oracle) == f"{NODE}/libcuda.so.580.65.06"
    _image_root(image, kit, shape)
    shutil.copy(Path(__file__).parent / "fixtures/bin/libsass_sm80.so", image / "libapp.so")
    args = ["check", f"dir:{image}", "--sm", "8.0", "--driver", "580.65.06", "--no-cache"]
    code = main([*args, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc["problems"]


@pytest.mark.parametrize(
    "name",
    [
        "libcuda.so.999.#prelink#",
        "libcuda.so.999.#prelink#.",
        *(f"libcuda.so.999.#prelink#.{'x' * n}" for n in (1, 5, 6, 7, 12)),
        "libcuda.so.999.#prelink#.abcdef.so",
        "libzz.so.#prelink#.x",  # the review's name
        ".#prelink#.abcdef",
        "libcuda.so.#prelink#x.abcdef",
    ],
)
def test_only_glibcs_prelink_names_are_skipped(
    kit: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """``search_dir`` skips a name ending in ``.#prelink#`` or in ``.#prelink#.``
    and six more characters, and no other: a libcuda of SONAME libcuda.so.1 under
    each name, beside nothing else, is loaded by glibc exactly where the model says."""
    _make_root(tmp_path, kit, {name: "A"})
    path, unknown = _model(tmp_path)
    assert unknown is None
    assert path == _real(tmp_path), name
