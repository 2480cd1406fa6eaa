"""cuda-compat judged exactly as the NVIDIA container toolkit's ``enable-cuda-compat``
hook decides (NVIDIA/nvidia-container-toolkit, ``cmd/nvidia-cdi-hook/cudacompat``).

Each test names the toolkit function whose rule it holds buildmatrix to. The tables
of decisions are the toolkit's own test tables (``cuda-elf-header_test.go``
``TestUseCompat``, ``cudacompat_test.go``), not ours; the images are built by the
project's test helpers and checked through the CLI; the compat libraries are
STAND-INS built by gcc with NVIDIA's note layout (tests/standins ``compat_library``).

The end-to-end cases are ones that passed before these rules were followed although
the toolkit's choice makes the container fail: each asserts the failure and, where
the same image without the divergence passes, that too.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.binary.compat_note import CompatLibrary, decode_note, note_description
from buildmatrix.cuda import parse_driver_version
from buildmatrix.forward import CompatSetup, compat_use
from buildmatrix.forward_semver import parse_semver, semver_newer
from tests.conftest import REPO, CliRunner
from tests.images import (
    DISTRO_LOADER,
    Entry,
    Hardlink,
    Image,
    Symlink,
    fixture,
    write_docker_archive,
)
from tests.standins import NOTE_13_1, compat_library

NODES = REPO / "tests" / "fixtures" / "nodes"
LIB = "libcuda.so.590.44.01"
DIR = "usr/local/cuda-13.1/compat"


# ------------------------------------------------- the decision, by the toolkit's tables

# cuda-elf-header_test.go, TestUseCompat (the rows with a host driver version): the
# note of the 575.57.08 package, the compat and host driver versions, the outcome.
_BRANCHES_12_9 = (535, 550, 560, 565, 570, 575)
USE_COMPAT_WITH_NOTE = [
    ("575.57.08", "590.44.01", False),  # host driver branch not supported
    ("575.57.08", "570.211.01", True),  # branch listed, compat newer
    ("575.57.08", "575.10.10", True),  # same branch, compat newer
    ("575.57.08", "575.57.08", False),  # same version
    ("575.57.08", "575.99.99", False),  # compat older
]
# cudacompat_test.go, TestCompatLibs: files without a note (empty), host 222.55.66.
USE_COMPAT_WITHOUT_NOTE = [
    ("333.88.99", "222.55.66", True),  # compat lib is newer
    ("111.88.99", "222.55.66", False),  # compat lib is older
    ("222.88.99", "222.55.66", False),  # same major
    ("222.88.99", "99.55.66", True),  # numeric comparison is used
]


@pytest.mark.parametrize(("compat", "host", "expected"), USE_COMPAT_WITH_NOTE)
def test_use_compat_follows_the_note_as_the_toolkit_tests_say(
    compat: str, host: str, expected: bool
) -> None:
    """``compatElfHeader.UseCompat``: host branch listed and compat newer."""
    lib = CompatLibrary(path=f"c/libcuda.so.{compat}", note=True, branches=_BRANCHES_12_9)
    use = compat_use(CompatSetup(library=lib, why="t"), parse_driver_version(host))
    assert use is not None
    assert use.in_use is expected, use.why


@pytest.mark.parametrize(("compat", "host", "expected"), USE_COMPAT_WITHOUT_NOTE)
def test_without_a_note_the_majors_decide_as_the_toolkit_tests_say(
    compat: str, host: str, expected: bool
) -> None:
    """``useCompatLibraries``: no ELF header read, so ``hostMajor < compatMajor``."""
    lib = CompatLibrary(path=f"c/libcuda.so.{compat}")
    use = compat_use(CompatSetup(library=lib, why="t"), parse_driver_version(host))
    assert use is not None
    assert use.in_use is expected, use.why


def test_a_note_without_a_driver_list_puts_nothing_in_use() -> None:
    """``UseCompat``: ``slices.Contains(h.Driver, hostMajor)`` is false for a nil list.
    NVIDIA ships such notes (the toolkit's testdata ``libcuda.orin.13.2.1.so.1.1``:
    Format 1 and CUDA Version 13.2 only)."""
    for branches in ((), (550,)):
        lib = CompatLibrary(path="c/libcuda.so.590.44.01", note=True, branches=branches)
        for host in ("470.57.02", "535.104.05", "580.65.06"):
            use = compat_use(CompatSetup(library=lib, why="t"), parse_driver_version(host))
            assert use is not None
            assert use.in_use is False, (branches, host)


def test_versions_are_parsed_and_compared_as_masterminds_semver_does() -> None:
    """``useCompatLibraries`` parses with ``semver.NewVersion`` (loose: ``v`` prefix,
    missing parts, leading zeros) and compares with ``Version.Compare``."""
    assert parse_semver("590.44.01") == (590, 44, 1, "")
    assert parse_semver("v575") == (575, 0, 0, "")
    assert parse_semver("575.57.08.1") is None  # four parts: NewVersion fails, not used
    assert parse_semver("590.44.01-rc.01") is None  # validatePrerelease: leading zero
    rc, final = parse_semver("590.44.01-rc1"), parse_semver("590.44.01")
    assert rc is not None and final is not None
    assert semver_newer(final, rc) and not semver_newer(rc, final)
    a, b = parse_semver("1.0.0-alpha.1"), parse_semver("1.0.0-alpha.beta")
    assert a is not None and b is not None
    assert semver_newer(b, a)  # numbers sort before words
    lib = CompatLibrary(path="c/libcuda.so.590.44.01.7", note=True, branches=(535,))
    use = compat_use(CompatSetup(library=lib, why="t"), parse_driver_version("535.104.05"))
    assert use is not None
    assert use.in_use is False
    assert "cannot parse" in use.why


# ------------------------------------------------------- the note, as Go decodes it


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"format":1,"CUDA Version":"13.1","driver":[535,550]}', [535, 550]),
        ('{"format":1,"CUDA Version":"13.2"}', None),  # no list: nil
        ('{"driver":null}', None),
        ("null", None),  # null into a struct sets nothing, no error
        ('{"DRIVER":[535]}', [535]),  # keys match without regard to case
        ('{"driver":[535],"Driver":[550]}', [550]),  # the last key wins
        ('{"driver":[null,535]}', [0, 535]),  # null element: int zero value
        ('{"dr\u0131ver":[535]}', None),  # dotless i folds to nothing: unknown key
        ('{"x":{"driver":[1]},"driver":[535]}', [535]),  # unknown keys ignored
        ('[{"driver":[535]}]', ValueError),  # not an object
        ('{"format":"1","driver":[535]}', ValueError),  # wrong type anywhere: error
        ('{"CUDA Version":13.1}', ValueError),
        ('{"driver":[535.0]}', ValueError),  # ParseInt of "535.0"
        ('{"driver":[5e2]}', ValueError),
        ('{"driver":535}', ValueError),
        ('{"driver":[true]}', ValueError),
        ('{"driver":[9223372036854775808]}', ValueError),  # overflows int
        ('{"driver":[NaN]}', ValueError),  # not JSON
        ('{"driver":[535]} x', ValueError),
    ],
)
def test_the_note_decodes_as_gos_encoding_json(text: str, expected: Any) -> None:
    """``GetCUDACompatElfHeaderFromReader``: ``json.Unmarshal`` into
    ``compatElfHeader`` (encoding/json: case-insensitive keys, unknown keys ignored,
    null a no-op, any type mismatch an error)."""
    if expected is ValueError:
        with pytest.raises(ValueError):
            decode_note(text.encode())
    else:
        assert decode_note(text.encode())["driver"] == expected
    long_s = decode_note('{"CUDA Ver\u017fion":"13.1"}'.encode())
    assert long_s["cuda"] == "13.1"  # Go folds U+017F onto 's'


def _note(name: bytes, desc: bytes, *, pad: bytes = b"\0") -> bytes:
    padded = name + pad * (-len(name) % 4)
    return struct.pack("<III", len(name), len(desc), 0) + padded + desc


def test_the_note_header_is_cut_as_the_toolkit_cuts_it() -> None:
    """``GetCUDACompatElfHeaderFromReader``: sizes 0 mean no note; the name is
    ``alignUp(NameSize, sh_addralign)`` bytes with NULs trimmed (``trim``); the
    description is clipped to the section, not refused."""
    owner = b"NVIDIA Corporation\0"
    desc = b'{"driver":[535]}\0'
    assert note_description(_note(owner, desc), order="<", align=4) == desc[:-1]
    assert note_description(_note(owner, b""), order="<", align=4) is None
    # sh_addralign 0: alignUp gives 0, the name is empty, no note
    assert note_description(_note(owner, desc), order="<", align=0) is None
    # padding that is not NUL is part of the name: no note
    assert note_description(_note(owner, desc, pad=b"x"), order="<", align=4) is None
    clipped = _note(owner, desc)[:-4]
    assert note_description(clipped, order="<", align=4) == desc[:-4]
    assert note_description(b"\x13\0\0", order="<", align=4) is None


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the stand-in compat libraries (.ci/run has it)")
    made: dict[str, bytes] = {}

    def make(note: dict[str, Any] | str | None, *, section_type: str = "@note") -> bytes:
        key = json.dumps([note, section_type])
        if key not in made:
            out = tmp_path_factory.mktemp("compat")
            lib = compat_library(out, "590.44.01", note, section_type=section_type)
            made[key] = lib.read_bytes()
        return made[key]

    return make


def _image(entries: dict[str, Any]) -> Image:
    """CUDA 13 device code (cubins of CUDA 13.0: the runtime floor is R580) and the
    given entries; ``usr/local/cuda`` points at cuda-13.1 unless the entries say."""
    layer: dict[str, Entry] = {"usr/lib/libsass_ptx.so": fixture("libsass_ptx.so"), **DISTRO_LOADER}
    layer.setdefault("usr/local/cuda", Symlink("cuda-13.1"))
    layer.update(entries)
    # NVIDIA_DISABLE_REQUIRE: a legacy CUDA 13.1 image runs on an older driver only
    # without the container toolkit's cuda>=13.1 check (buildmatrix.container_env)
    return Image(layers=[layer], env={"CUDA_VERSION": "13.1.0", "NVIDIA_DISABLE_REQUIRE": "1"})


def _check(cli: CliRunner, tmp_path: Path, image: Image, *args: str) -> tuple[int, Any]:
    archive = write_docker_archive(tmp_path / "img.tar", image)
    r = cli("check", f"docker-archive:{archive}", "--json", *args)
    assert r.code in (0, 1), r.err
    return r.code, r.json()


R535 = ("--sm", "9.0", "--driver", "535.104.05")


def _geforce_580(tmp_path: Path) -> tuple[str, str]:
    """A GeForce RTX 5090 node on R580: its own driver meets the CUDA 13 floor, so the
    image runs there unless the compat driver (which refuses a GeForce) is put first."""
    node = json.loads((NODES / "rtx-consumer.json").read_text())
    node["driver_version"] = "580.82.07"
    node["cuda_driver_version"] = "13.0"
    path = tmp_path / "rtx-580.json"
    path.write_text(json.dumps(node))
    return "--snapshot", str(path)


def _problems(doc: Any) -> str:
    return " | ".join(doc["problems"])


def test_a_symlink_named_like_the_driver_is_not_a_candidate(
    cli: CliRunner, tmp_path: Path, build: Any
) -> None:
    """``root.globFiles``: only ``dentry.Type().IsRegular()`` entries match. A compat
    folder that holds only a symlink to the driver puts nothing in use, so R535
    cannot run CUDA 13 code."""
    entries = {f"opt/drv/{LIB}": build(NOTE_13_1), f"{DIR}/{LIB}": Symlink(f"/opt/drv/{LIB}")}
    code, doc = _check(cli, tmp_path, _image(entries), *R535)
    assert code == 1
    assert "needs driver >= 580.65.06; node has 535.104.05" in _problems(doc)
    assert doc["forward_compat"]["path"] is None
    # the legacy runtime follows the symlink (buildmatrix.forward_legacy): judged both ways
    assert doc["forward_compat"]["legacy"]["in_use"] is True
    # the same driver as a regular file is used
    code, doc = _check(cli, tmp_path, _image({f"{DIR}/{LIB}": build(NOTE_13_1)}), *R535)
    assert code == 0, _problems(doc)


def test_one_regular_file_beside_a_symlink_is_the_one_candidate(
    cli: CliRunner, tmp_path: Path, build: Any
) -> None:
    """``getContainerForwardCompatDir``: exactly one regular match is used; a symlink
    of the same pattern does not make it two. On a GeForce the driver then refuses."""
    entries = {
        f"{DIR}/{LIB}": build(NOTE_13_1),
        f"{DIR}/libcuda.so.590.1": Symlink(LIB),
        f"{DIR}/libcuda.so.1": Symlink(LIB),
    }
    code, doc = _check(cli, tmp_path, _image(entries), *_geforce_580(tmp_path))
    assert code == 1
    assert "cudaErrorCompatNotSupportedOnDevice" in _problems(doc)
    assert doc["forward_compat"]["in_use"] is True


@pytest.mark.parametrize(
    "note",
    [
        {"format": 1, "CUDA Version": "13.1", "device": [2]},
        {"format": 1, "CUDA Version": "13.1", "driver": None},
        {"format": 1, "CUDA Version": "13.1", "driver": []},
    ],
)
def test_a_note_without_a_driver_list_is_used_nowhere(
    cli: CliRunner, tmp_path: Path, build: Any, note: dict[str, Any]
) -> None:
    """``UseCompat``: a parsed note decides even without a ``driver`` list (nil
    matches no branch); the major rule applies only where no note was read."""
    code, doc = _check(cli, tmp_path, _image({f"{DIR}/{LIB}": build(note)}), *R535)
    assert code == 1
    assert "needs driver >= 580.65.06; node has 535.104.05" in _problems(doc)
    assert doc["forward_compat"]["in_use"] is False
    assert "R535 is not one its note lists" in doc["forward_compat"]["why"]


def test_a_note_over_64_kib_is_read_whole(cli: CliRunner, tmp_path: Path, build: Any) -> None:
    """``s.Data()`` reads the whole section: a large note still decides (here it lists
    R550 only, so R535 does not get the compat driver)."""
    note = {"format": 1, "CUDA Version": "13.1", "driver": [550], "pad": "x" * (80 << 10)}
    code, doc = _check(cli, tmp_path, _image({f"{DIR}/{LIB}": build(note)}), *R535)
    assert code == 1
    assert doc["forward_compat"]["in_use"] is False
    assert "R535 is not one its note lists" in doc["forward_compat"]["why"]
    code, doc = _check(
        cli, tmp_path, _image({f"{DIR}/{LIB}": build(note)}), "--sm", "9.0", "--driver", "550.54.15"
    )
    assert code == 0, _problems(doc)


def test_the_compat_folder_is_found_whatever_its_name(
    cli: CliRunner, tmp_path: Path, build: Any
) -> None:
    """``root.hasPath`` / ``globFiles`` open ``/usr/local/cuda/compat`` through
    symlinks inside the root (the toolkit's test "symlinks are followed"): the folder
    it ends in need not be called compat."""
    entries = {
        "usr/local/cuda": Symlink("/etc/alternatives/cuda"),
        "etc/alternatives/cuda/compat": Symlink("../../../opt/nv-drivers"),
        f"opt/nv-drivers/{LIB}": build(NOTE_13_1),
    }
    code, doc = _check(cli, tmp_path, _image(entries), *R535)
    assert code == 0, _problems(doc)
    assert doc["forward_compat"]["path"] == f"/opt/nv-drivers/{LIB}"
    code, doc = _check(cli, tmp_path, _image(entries), *_geforce_580(tmp_path))
    assert code == 1
    assert "cudaErrorCompatNotSupportedOnDevice" in _problems(doc)


def test_a_hard_link_is_a_regular_file(cli: CliRunner, tmp_path: Path, build: Any) -> None:
    """``globFiles``: a hard link is a regular file; its note is the file's. The
    file's other name lies in another CUDA compat folder, which no stock loader
    configuration names (buildmatrix.ldshadow); under any other name it is a libcuda
    (by SONAME) the loader may take, and the check fails closed naming it."""
    other = "usr/local/cuda-12.8/compat/blob.so"
    entries = {other: build(NOTE_13_1), f"{DIR}/{LIB}": Hardlink(other)}
    code, doc = _check(cli, tmp_path, _image(entries), *_geforce_580(tmp_path))
    assert code == 1
    assert "cudaErrorCompatNotSupportedOnDevice" in _problems(doc)
    code, doc = _check(cli, tmp_path, _image(entries), *R535)
    assert code == 0, _problems(doc)
    entries = {"opt/blob.so": build(NOTE_13_1), f"{DIR}/{LIB}": Hardlink("opt/blob.so")}
    code, doc = _check(cli, tmp_path, _image(entries), *R535)
    assert code == 1
    assert "the image holds /opt/blob.so" in _problems(doc)


def test_a_note_section_of_another_type_is_no_note(
    cli: CliRunner, tmp_path: Path, build: Any
) -> None:
    """``getCUDAFwdCompatibilitySection``: only a ``SHT_NOTE`` section counts. Without
    a note R580 gets the compat driver by the major rule, and a GeForce refuses it."""
    lib = build(NOTE_13_1 | {"driver": [535]}, section_type="@progbits")
    code, doc = _check(cli, tmp_path, _image({f"{DIR}/{LIB}": lib}), *_geforce_580(tmp_path))
    assert code == 1
    assert "cudaErrorCompatNotSupportedOnDevice" in _problems(doc)
    why = doc["forward_compat"]["why"]
    assert "the toolkit ignores its .note.cuda.fwd_compatibility section: it is of type 1" in why
    assert "no forward-compatibility note" not in why


def test_an_unreadable_note_is_named_and_ignored(
    cli: CliRunner, tmp_path: Path, build: Any
) -> None:
    """``useCompatLibraries``: an error from the note's JSON is logged and the note
    ignored; the majors decide. The message says the note is there."""
    lib = build('{"format":"1","driver":[550]}')
    code, doc = _check(cli, tmp_path, _image({f"{DIR}/{LIB}": lib}), *R535)
    assert code == 0, _problems(doc)
    why = doc["forward_compat"]["why"]
    assert "its JSON does not decode" in why
    assert "no forward-compatibility note" not in why


def test_a_candidate_that_is_not_an_elf_library_fails_closed(
    cli: CliRunner, tmp_path: Path
) -> None:
    """The toolkit's own tests use empty files: with no note the majors decide and the
    folder goes first, but whether the loader can use such a file is unknown."""
    code, doc = _check(cli, tmp_path, _image({f"{DIR}/{LIB}": b"not an ELF file"}), *R535)
    assert code == 1
    assert "fail closed" in _problems(doc)
    # on a driver of the same major the toolkit uses nothing, and that is known
    code, doc = _check(
        cli,
        tmp_path,
        _image({f"{DIR}/{LIB}": b"not an ELF file"}),
        "--sm",
        "9.0",
        "--driver",
        "590.48.01",
    )
    assert code == 0, _problems(doc)


@pytest.mark.parametrize(("depth", "in_use"), [(5000, False), (12000, True)])
def test_a_deeply_nested_note_decides_as_go_reads_it(
    cli: CliRunner, tmp_path: Path, build: Any, depth: int, in_use: bool
) -> None:
    """``json.Unmarshal`` reads a note nested up to 10,000 levels (Go's
    ``maxNestingDepth``; tests/test_note_json.py holds the decoder to Go): at 5,000
    its ``driver`` list (R550 only) keeps the compat driver out of use on R535; past
    10,000 the note fails to decode and the majors decide (590 > 535: in use). Both
    ended in a RecursionError traceback before."""
    nested = "[" * (depth - 1) + "]" * (depth - 1)
    note = '{"format":1,"CUDA Version":"13.1","driver":[550],"x":' + nested + "}"
    code, doc = _check(cli, tmp_path, _image({f"{DIR}/{LIB}": build(note)}), *R535)
    assert doc["forward_compat"]["in_use"] is in_use, doc["forward_compat"]
    assert code == (0 if in_use else 1), _problems(doc)
