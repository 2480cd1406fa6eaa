"""Two ways an image decides which ``libcuda.so.1`` a process maps before the container
toolkit's choice counts, each held to glibc's own ``ldconfig`` and loader chrooted in
the root (as tests/test_ldconfig.py runs them):

- the order ldconfig scans folders in: a folder the image's configuration names
  before the hook's ``00-compat-*.conf`` is cached first, so the node's driver,
  mounted there, is loaded instead of the compat driver (buildmatrix.ldsoconf,
  buildmatrix.forward_conf). Every placement of such a folder is drawn, against
  both names the hook has given its file (a decimal, a UUID);
- ``LD_PRELOAD`` in the image's environment: glibc maps what it names first, and a
  later ``dlopen("libcuda.so.1")`` returns a preloaded object of that SONAME
  (buildmatrix.ldshadow.preloaded_libcuda).

The node's driver and the compat driver are STAND-INS built by gcc
(tests/standins); the hook's files are written as the toolkit writes them
(``cmd/nvidia-cdi-hook/cudacompat/cudacompat.go`` ``createLdsoconfdFile``;
``internal/ldconfig/ldconfig.go`` ``UpdateLDCache``, ``filterDirectories``).
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from buildmatrix import schema
from buildmatrix.cli import main
from buildmatrix.cuda import parse_driver_version
from buildmatrix.forward import compat_use
from buildmatrix.image.local import scan_directory
from buildmatrix.image.ref import parse_ref
from tests.images import DISTRO_LOADER, Entry, Image, Symlink, write_docker_archive
from tests.test_ldconfig import DIR, LOADER, ROOTED, WHICH_C, _make_root, _place, _real, kit

# A legacy CUDA 13.0 image on older drivers: it starts there only without the container
# toolkit's cuda>=13.0 check (buildmatrix.container_env), as forward compatibility needs.
_NO_REQUIRE = {"CUDA_VERSION": "13.0.0", "NVIDIA_DISABLE_REQUIRE": "1"}

__all__ = ["kit"]
pytestmark = pytest.mark.skipif(not ROOTED, reason="chroot needs root; gcc builds the stand-ins")

NODE = "usr/lib/x86_64-linux-gnu"  # where the runtime mounts the node's driver
COMPAT_LIB = f"{DIR}/libcuda.so.590.44.01"
NODE_LIB = f"{NODE}/libcuda.so.535.54.03"
OLD_HOST = parse_driver_version("535.54.03")  # the hook puts the 590 compat driver in use
APP = Path(__file__).parent / "fixtures/bin/libsass_sm80.so"

# Where the image's configuration names the node's driver folder (None: nowhere).
PLACES: list[tuple[str, str] | None] = [
    None,
    ("top", "before"),  # a line of /etc/ld.so.conf above its include
    ("top", "after"),  # a line below it
    ("00-a.conf", ""),  # sorts before every 00-compat-<R>.conf
    ("00-compat-.conf", ""),  # '.' sorts before any digit
    ("00-compat-5.conf", ""),  # before or after, by the hook's R
    ("00-d.conf", ""),  # after: 'c' < 'd'
    ("x86_64-linux-gnu.conf", ""),  # Debian's own file: after
]
# The names the hook has given its file: os.CreateTemp's decimal, then uuid.NewString.
HOOK_NAMES = [
    "0",
    "4021",
    "4294967295",
    "0a1b2c3d-0000-4000-8000-00000000abcd",
    "f" * 8 + "-ffff" * 3 + "-" + "f" * 12,
]


def _image(root: Path, kit: dict[str, Path], place: tuple[str, str] | None, mount: bool) -> None:
    """The image as it ships: the compat driver and NVIDIA's link, the configuration,
    and (``mount``) the node driver's folder already there."""
    _make_root(root, kit, {"libcuda.so.590.44.01": "A", "libcuda.so.1": "Llibcuda.so.590.44.01"})
    (root / "etc/ld.so.conf.d/00-compat-1.conf").unlink()  # the hook's, written at start
    top = ["include /etc/ld.so.conf.d/*.conf"]
    if place is not None and place[0] == "top":
        top.insert(0 if place[1] == "before" else 1, f"/{NODE}")
    elif place is not None:
        (root / "etc/ld.so.conf.d" / place[0]).write_text(f"/{NODE}\n")
    (root / "etc/ld.so.conf").write_text("\n".join(top) + "\n")
    if mount:
        (root / NODE).mkdir(parents=True, exist_ok=True)


def _started(root: Path, kit: dict[str, Path], hook: str, named: bool) -> None:
    """What the runtime adds at start on an old node: the node's driver, the hook's
    compat file, and update-ldcache's 00-nvcr file for the driver folder where the
    image does not name it (filterDirectories) and zz-nvcr for the system folders."""
    _place(kit, "B", root / NODE_LIB)
    (root / NODE / "libcuda.so.1").symlink_to("libcuda.so.535.54.03")
    confd = root / "etc/ld.so.conf.d"
    (confd / f"00-compat-{hook}.conf").write_text("/usr/local/cuda/compat\n")
    if not named:
        (confd / "00-nvcr-77.conf").write_text(f"/{NODE}\n")
    (confd / "zz-nvcr-78.conf").write_text("/lib\n/usr/lib\n/lib64\n/usr/lib64\n")


@pytest.mark.parametrize(("place", "mount"), list(itertools.product(PLACES, [False, True])))
def test_a_folder_named_before_the_compat_folder_is_never_passed_over(
    kit: dict[str, Path], tmp_path: Path, place: tuple[str, str] | None, mount: bool
) -> None:
    """For every placement, and every name the hook may give its file: where
    buildmatrix says the compat driver is in use, glibc loads it; where it says the
    node's, glibc loads that; anything else is "unknown" (fails closed)."""
    image = tmp_path / "image"
    _image(image, kit, place, mount)
    setup = scan_directory(parse_ref(f"dir:{image}")).compat
    use = compat_use(setup, OLD_HOST)
    assert use is not None
    loaded = set()
    for hook in HOOK_NAMES:
        oracle = tmp_path / f"oracle-{hook}"
        _image(oracle, kit, place, mount)
        _started(oracle, kit, hook, named=place is not None)
        loaded.add(_real(oracle))
    if use.undetermined is None:
        expected = COMPAT_LIB if use.in_use else NODE_LIB
        assert loaded == {expected}, (place, use.why, loaded)
    else:
        assert "before /usr/local/cuda-13.1/compat" in use.undetermined
        assert not use.in_use
    if loaded != {COMPAT_LIB}:  # the false pass this guards against
        assert use.undetermined is not None


def test_check_fails_closed_where_the_node_driver_folder_comes_first(
    kit: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The false pass as check met it: a CUDA 13 runtime on driver 535 passed through
    the compat driver, while glibc maps the node's R535 libcuda from the folder the
    image's /etc/ld.so.conf names above its include."""
    for place, expected in ((None, 0), (("top", "before"), 1)):
        image = tmp_path / f"image{expected}"
        _image(image, kit, place, mount=False)
        (image / "usr/local/cuda-13.1/lib64").mkdir(parents=True)
        (image / "usr/local/cuda-13.1/lib64/libcudart.so.13").write_bytes(b"runtime")
        shutil.copy(APP, image / "libapp.so")
        args = ["check", f"dir:{image}", "--sm", "8.0", "--driver", "535.104.05", "--no-cache"]
        code = main([*args, "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert code == expected, doc["problems"]
        schema.validate(doc, "check", source="check --json")
        if expected:
            problem = doc["problems"][0]
            assert f"names /{NODE} before /{DIR}" in problem and "fail closed" in problem


# ------------------------------------------------------------------------ LD_PRELOAD

STUB = "usr/local/cuda-13.1/targets/x86_64-linux/lib/stubs"


def _preload_root(root: Path, kit: dict[str, Path]) -> None:
    """The compat driver (not named by the hook: a new node), the CUDA toolkit's stub
    (SONAME libcuda.so.1), and the node's driver, cached by ldconfig."""
    _make_root(root, kit, {"libcuda.so.590.44.01": "A", "libcuda.so.1": "Llibcuda.so.590.44.01"})
    (root / "etc/ld.so.conf.d/00-compat-1.conf").unlink()
    _place(kit, "A", root / STUB / "libcuda.so")
    _place(kit, "B", root / NODE / "libcuda.so.600.10.01")
    (root / "etc/ld.so.conf.d/zz-nvcr-1.conf").write_text(f"/{NODE}\n")


# (LD_PRELOAD, LD_LIBRARY_PATH, the file glibc maps, whether check must fail closed)
PRELOADS = [
    ("", "", f"{NODE}/libcuda.so.600.10.01", False),
    ("/usr/local/cuda/compat/libcuda.so.1", "", COMPAT_LIB, True),
    (f"/{STUB}/libcuda.so", "", f"{STUB}/libcuda.so", True),
    (f"/lib/x86_64-linux-gnu/libc.so.6 /{STUB}/libcuda.so", "", f"{STUB}/libcuda.so", True),
    ("libcuda.so", f"/{STUB}", f"{STUB}/libcuda.so", True),
    ("libcuda.so.1", "", f"{NODE}/libcuda.so.600.10.01", False),
    ("/lib/x86_64-linux-gnu/libc.so.6", "", f"{NODE}/libcuda.so.600.10.01", False),
    ("/opt/missing/libcuda.so.1", "", f"{NODE}/libcuda.so.600.10.01", False),
]


@pytest.mark.parametrize(("preload", "path", "loaded", "fails"), PRELOADS)
def test_ld_preload_of_a_libcuda_fails_closed(
    kit: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    preload: str,
    path: str,
    loaded: str,
    fails: bool,
) -> None:
    """On driver 600 the hook leaves the node's driver in use; an image whose
    LD_PRELOAD names the compat driver or the stub has glibc use that instead (the
    oracle shows which); check must fail closed there, and pass elsewhere."""
    oracle = tmp_path / "oracle"
    _preload_root(oracle, kit)
    env = {k: v for k, v in (("LD_PRELOAD", preload), ("LD_LIBRARY_PATH", path)) if v}
    assert _real(oracle, env=env) == loaded
    layer: dict[str, Entry] = {
        "usr/local/cuda": Symlink("cuda-13.1"),
        COMPAT_LIB: kit["A"].read_bytes(),
        f"{DIR}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
        f"{STUB}/libcuda.so": kit["A"].read_bytes(),
        "usr/lib/libapp.so": APP.read_bytes(),
        **DISTRO_LOADER,
    }
    archive = write_docker_archive(
        tmp_path / "img.tar", Image(layers=[layer], env={**_NO_REQUIRE, **env})
    )
    args = ["check", f"docker-archive:{archive}", "--sm", "8.0", "--driver", "600.10.01"]
    code = main([*args, "--no-cache", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == (1 if fails else 0), doc["problems"]
    if fails:
        assert any("LD_PRELOAD" in p and "fail closed" in p for p in doc["problems"])
        schema.validate(doc, "check", source="check --json")


# --------------------------------------------- LD_LIBRARY_PATH and the node's driver

# (LD_LIBRARY_PATH, whether glibc maps the node's driver rather than the compat one)
LIBRARY_PATHS = [
    (f"/{NODE}", True),
    (f"/usr/local/cuda/compat:/{NODE}", False),
    (f"/{NODE}:/usr/local/cuda/compat", True),
    (f"/opt/none:/{NODE}/", True),
    ("/usr/local/nvidia/lib64", False),
]


@pytest.mark.parametrize(("path", "node_first"), LIBRARY_PATHS)
def test_ld_library_path_through_the_node_driver_folder_fails_closed(
    kit: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    path: str,
    node_first: bool,
) -> None:
    """On driver 535 the hook puts the compat driver in use, through the cache; an
    LD_LIBRARY_PATH entry naming the folder the node's driver is mounted into is
    searched first, so glibc maps the node's R535 libcuda and a CUDA 13 runtime
    cannot start: check must not pass it through the compat driver."""
    oracle = tmp_path / "oracle"
    _image(oracle, kit, None, mount=False)
    _started(oracle, kit, "4021", named=False)
    assert _real(oracle, env={"LD_LIBRARY_PATH": path}) == (NODE_LIB if node_first else COMPAT_LIB)
    layer: dict[str, Entry] = {
        "usr/local/cuda": Symlink("cuda-13.1"),
        COMPAT_LIB: kit["A"].read_bytes(),
        f"{DIR}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
        "usr/lib/libapp.so": APP.read_bytes(),
        **DISTRO_LOADER,
    }
    env = {**_NO_REQUIRE, "LD_LIBRARY_PATH": path}
    archive = write_docker_archive(tmp_path / "img.tar", Image(layers=[layer], env=env))
    args = ["check", f"docker-archive:{archive}", "--sm", "8.0", "--driver", "535.104.05"]
    code = main([*args, "--no-cache", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == (1 if node_first else 0), doc["problems"]
    if node_first:
        assert any("the node's driver is mounted into" in p for p in doc["problems"])


# ------------------------------------------------------------ in a real container

START_C = r"""
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
/* What the toolkit's update-ldcache hook runs in the container root before the
   process starts (internal/ldconfig/ldconfig.go UpdateLDCache), then the process. */
int main(void) {
  pid_t pid = fork();
  if (pid == 0) {
    execl("/sbin/ldconfig", "ldconfig", "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache",
          (char *)0);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  execl("/which", "which", (char *)0);
  return 127;
}
"""
UUID = "0a1b2c3d-0000-4000-8000-00000000abcd"

# (name, the image's /etc/ld.so.conf, its env, the node's driver, whether the hook
# names the compat folder, the file glibc maps in the container, check's exit code)
CONTAINER_CASES = [
    ("stock", None, {}, "535.104.05", True, COMPAT_LIB, 0),
    ("node folder first", f"/{NODE}\n", {}, "535.104.05", True, NODE_LIB, 1),
    ("ld_library_path", None, {"LD_LIBRARY_PATH": f"/{NODE}"}, "535.104.05", True, NODE_LIB, 1),
    (
        "ld_preload stub",
        None,
        {"LD_PRELOAD": f"/{STUB}/libcuda.so"},
        "600.10.01",
        False,
        f"{STUB}/libcuda.so",
        1,
    ),
]


def test_the_container_loads_what_check_assumes_or_check_fails_closed(
    kit: dict[str, Path], tmp_path: Path, docker_host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same docker-archive that check reads, loaded into a real Docker engine and
    run: the engine applies the image's environment, the node's driver and the
    hook's 00-compat/00-nvcr files are bind-mounted where the toolkit puts them, and
    ldconfig runs in the container before the process. Where glibc maps another
    libcuda than the one check credits, check fails; elsewhere it passes."""
    import subprocess

    start = tmp_path / "start"
    (tmp_path / "start.c").write_text(START_C)
    subprocess.run(["gcc", "-o", str(start), str(tmp_path / "start.c")], check=True)
    hook = tmp_path / "hook.conf"
    hook.write_text("/usr/local/cuda/compat\n")
    nvcr = tmp_path / "nvcr.conf"
    nvcr.write_text(f"/{NODE}\n")
    docker = ["docker", "-H", docker_host]
    for name, top, env, driver, named, loaded, code in CONTAINER_CASES:
        layer: dict[str, Entry] = {
            "usr/local/cuda": Symlink("cuda-13.1"),
            COMPAT_LIB: kit["A"].read_bytes(),
            f"{DIR}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
            f"{STUB}/libcuda.so": kit["A"].read_bytes(),
            "usr/lib/libapp.so": APP.read_bytes(),
            "etc/ld.so.conf": (top or "").encode() + b"include /etc/ld.so.conf.d/*.conf\n",
            "etc/ld.so.cache": b"",
            "etc/ld.so.conf.d/x86_64-linux-gnu.conf": b"/lib/x86_64-linux-gnu\n",
            "sbin/ldconfig": kit["ldconfig"].read_bytes(),
            "which": kit["which"].read_bytes(),
            "start": start.read_bytes(),
            "lib64/ld-linux-x86-64.so.2": kit["ld.so"].read_bytes(),
            "lib/x86_64-linux-gnu/libc.so.6": kit["libc"].read_bytes(),
        }
        tag = f"bmtest/loader:{name.replace(' ', '-')}"
        image = Image(layers=[layer], env={**_NO_REQUIRE, **env})
        archive = write_docker_archive(tmp_path / f"{name}.tar", image, tag=tag)
        subprocess.run([*docker, "load", "-i", str(archive)], check=True, capture_output=True)
        mounts = ["-v", f"{kit['B']}:/{NODE_LIB}:ro"]
        if top is None:  # the update-ldcache hook names the driver folder only where
            mounts += ["-v", f"{nvcr}:/etc/ld.so.conf.d/00-nvcr-77.conf:ro"]  # not named
        if named:
            mounts += ["-v", f"{hook}:/etc/ld.so.conf.d/00-compat-{UUID}.conf:ro"]
        run = [*docker, "run", "--rm", "--network=none", *mounts, tag, "/start"]
        out = subprocess.run(run, check=True, capture_output=True, text=True, timeout=120)
        mapped = out.stdout.strip().lstrip("/")
        assert mapped == loaded, (name, out.stdout, out.stderr)
        args = ["check", f"docker-archive:{archive}", "--sm", "8.0", "--driver", driver]
        got = main([*args, "--no-cache", "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert got == code, (name, doc["problems"])
        subprocess.run([*docker, "rmi", "-f", tag], check=False, capture_output=True)


# ------------------------------------------- the toolkit releases before 1.18.1


def _released(root: Path, *, old: bool) -> str | None:
    """What a node's update-ldcache hook does, then the file glibc maps: the current
    releases create a missing /etc/ld.so.conf (ensureLdsoconfFile) and always write
    the cache; 1.17.5 to 1.18.0-rc.5 (cmd/nvidia-cdi-hook/update-ldcache runLdconfig)
    do neither, and pass -N where the image has no /etc/ld.so.cache."""
    import subprocess

    conf, cache = root / "etc/ld.so.conf", root / "etc/ld.so.cache"
    if not old and not conf.exists():
        conf.write_text("include /etc/ld.so.conf.d/*.conf\n")
    args = [
        "-f",
        "/etc/ld.so.conf",
        *(["-C", "/etc/ld.so.cache"] if cache.exists() or not old else ["-N"]),
    ]
    subprocess.run(["chroot", str(root), "/sbin/ldconfig", *args], check=True, capture_output=True)
    return _real(root, ldconfig=False)


@pytest.mark.parametrize("lacks", [None, "etc/ld.so.cache", "etc/ld.so.conf"])
def test_an_image_the_older_toolkit_releases_run_without_the_compat_driver(
    kit: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    lacks: str | None,
) -> None:
    """An image without /etc/ld.so.cache or /etc/ld.so.conf gets the compat driver on
    the current toolkit but the node's R535 driver on releases 1.17.5 to 1.18.0: check
    judges both states, and the CUDA 13 runtime fails on the second."""
    loaded = {}
    for old in (False, True):
        oracle = tmp_path / f"oracle-{old}"
        _image(oracle, kit, None, mount=False)
        _started(oracle, kit, UUID, named=False)
        (oracle / "etc/ld.so.cache").write_bytes(b"")
        if lacks is not None:
            (oracle / lacks).unlink()
        loaded[old] = _released(oracle, old=old)
    assert loaded[False] == COMPAT_LIB
    assert loaded[True] == (COMPAT_LIB if lacks is None else NODE_LIB)
    layer: dict[str, Entry] = {
        "usr/local/cuda": Symlink("cuda-13.1"),
        COMPAT_LIB: kit["A"].read_bytes(),
        f"{DIR}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
        "usr/lib/libapp.so": APP.read_bytes(),
        **{k: v for k, v in DISTRO_LOADER.items() if k != lacks},
    }
    archive = write_docker_archive(tmp_path / "img.tar", Image(layers=[layer], env=_NO_REQUIRE))
    args = ["check", f"docker-archive:{archive}", "--sm", "8.0", "--driver", "535.104.05"]
    code = main([*args, "--no-cache", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == (0 if lacks is None else 1), doc["problems"]
    assert doc["forward_compat"]["in_use"] is True  # the current releases' choice
    if lacks is not None:
        reasons = " ".join(doc["targets"][0]["reasons"] + doc["problems"])
        assert "older toolkit releases" in reasons, reasons


# ------------------------------------------------------------ DT_RPATH, DT_RUNPATH

# (where the program lies, how it is linked, its search path, a stub libcuda.so.1 beside
# the toolkit's libcuda.so, the node's driver: glibc's file, check's exit code)
ORIGIN_STUB = "$ORIGIN/../local/cuda-13.1/targets/x86_64-linux/lib/stubs"
SEARCHES = [
    ("opt/app/run", "rpath", "/usr/local/cuda/compat", False, "600.10.01", COMPAT_LIB, 1),
    ("opt/app/run", "rpath", "/usr/local/cuda/compat", False, "535.104.05", COMPAT_LIB, 0),
    ("opt/app/run", "runpath", f"/{STUB}", True, "600.10.01", f"{STUB}/libcuda.so", 1),
    ("opt/app/run", "runpath", f"/{STUB}", False, "600.10.01", f"{NODE}/libcuda.so.600.10.01", 0),
    ("usr/bin/run", "runpath", ORIGIN_STUB, True, "600.10.01", f"{STUB}/libcuda.so", 1),
    ("opt/app/run", "runpath", "/opt/none", True, "600.10.01", f"{NODE}/libcuda.so.600.10.01", 0),
    ("opt/app/run", "runpath", "$LIB/none", True, "600.10.01", f"{NODE}/libcuda.so.600.10.01", 1),
    # the node's driver folder, on the node whose hook puts the compat driver in use
    ("opt/app/run", "runpath", f"/{NODE}", False, "535.104.05", f"{NODE}/libcuda.so.600.10.01", 1),
]


@pytest.mark.parametrize(("where", "kind", "search", "stub", "driver", "loaded", "code"), SEARCHES)
def test_a_search_path_to_a_libcuda_fails_closed_unless_it_is_the_hooks_folder(
    kit: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    where: str,
    kind: str,
    search: str,
    stub: bool,
    driver: str,
    loaded: str,
    code: int,
) -> None:
    """A program linked with a DT_RPATH or DT_RUNPATH naming the compat folder or the
    toolkit's stubs (where a libcuda.so.1 stands beside libcuda.so, as build recipes
    leave it): glibc's loader finds libcuda.so.1 there before its cache. check must
    fail unless that is the folder the hook puts in use (R535), and pass where the
    folder holds no libcuda.so.1; a search path it cannot place ($LIB) fails closed."""
    import subprocess

    program = tmp_path / "run"
    (tmp_path / "run.c").write_text(WHICH_C)
    tags = "--enable-new-dtags" if kind == "runpath" else "--disable-new-dtags"
    link = ["gcc", "-o", str(program), str(tmp_path / "run.c"), f"-Wl,{tags},-rpath,{search}"]
    subprocess.run(link, check=True)
    image, oracle = tmp_path / "image", tmp_path / "oracle"
    for root in (image, oracle):
        _preload_root(root, kit)
        (root / NODE / "libcuda.so.600.10.01").unlink()  # the node's: the oracle's only
        (root / where).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(program, root / where)
        if stub:
            (root / STUB / "libcuda.so.1").symlink_to("libcuda.so")
    shutil.copy(APP, image / "libapp.so")
    _place(kit, "B", oracle / NODE / "libcuda.so.600.10.01")
    if driver.startswith("535"):  # the hook puts the compat folder in use
        (oracle / f"etc/ld.so.conf.d/00-compat-{UUID}.conf").write_text("/usr/local/cuda/compat\n")
    assert _real(oracle, program=(LOADER, f"/{where}")) == loaded
    (image / "usr/local/cuda-13.1/lib64").mkdir(parents=True)
    (image / "usr/local/cuda-13.1/lib64/libcudart.so.13").write_bytes(b"runtime")
    args = ["check", f"dir:{image}", "--sm", "8.0", "--driver", driver, "--no-cache", "--json"]
    got = main(args)
    doc = json.loads(capsys.readouterr().out)
    assert got == code, doc["problems"]
    if code:
        assert any("DT_RPATH/DT_RUNPATH" in p for p in doc["problems"]), doc["problems"]
