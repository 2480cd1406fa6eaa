"""The per-translation-unit rule and the CUDA runtime of compressed binaries, through
the CLI, on nvcc-built fixtures (tests/fixtures/build.py): each library below has a
translation unit whose kernels cannot run on 9.0, and must fail there, compressed
or not, whatever else the file holds; each runs where its code does.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from buildmatrix.binary.scan import inspect_file
from buildmatrix.cli import main
from tests.conftest import NVCC_CACHE
from tests.cuobjdump import cuobjdump_kernels, find_cuobjdump
from tests.fixtures.build import Fixture, cached_build, have_nvcc

BIN = Path(__file__).parent / "fixtures" / "bin"


def _check(capsys: pytest.CaptureFixture[str], path: Path, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["check", str(path), "--no-cache", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("name", "kernel", "runs_on"),
    [
        ("libshort_sm86.so", "_Z2kbPfPKfi", ["8.6", "8.9"]),  # a plain sm_86 unit
        ("libtwo.so", "_Z2kbPfPKfi", ["8.0", "8.6"]),
        ("libtwo_compressed.so", "_Z2kbPfPKfi", ["8.0", "8.6"]),  # -Xfatbin -compress-all
    ],
)
def test_a_short_unit_fails_where_its_kernels_cannot_run(
    capsys: pytest.CaptureFixture[str], name: str, kernel: str, runs_on: list[str]
) -> None:
    code, doc = _check(capsys, BIN / name, "--sm", "9.0")
    assert code == 1, doc
    assert doc["targets"][0]["specialised"] == []
    assert (
        f"container 2 (sm_{'86' if '86' in name else '80'}; kernels {kernel})" in doc["problems"][0]
    )
    for sm in runs_on:
        code, doc = _check(capsys, BIN / name, "--sm", sm)
        assert code == 0, (sm, doc["problems"])
    # --strict agrees: there was nothing to leave out
    assert _check(capsys, BIN / name, "--sm", "9.0", "--strict")[0] == 1


@pytest.mark.skipif(shutil.which("objcopy") is None, reason="objcopy (binutils) adds the section")
def test_code_kept_as_data_does_not_stand_in_for_a_registered_unit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A compressed sm_80-only library with an unrelated sm_90 cubin in its read-only
    data: the runtime registers the sm_80 container and finds nothing for 9.0."""
    lib = tmp_path / "libsass_sm80_compressed.so"
    subprocess.run(
        [
            "objcopy",
            "--add-section",
            f".rodata.kernels={BIN / 'kernels_sm90.cubin'}",
            "--set-section-flags",
            ".rodata.kernels=alloc,readonly,data,contents",
            str(BIN / "libsass_sm80_compressed.so"),
            str(lib),
        ],
        check=True,
    )
    code, doc = _check(capsys, lib, "--sm", "9.0")
    assert code == 1
    assert any(e.get("embedded") and e["arch"] == "sm_90" for e in doc["files"][0]["entries"])
    assert "sm_80 SASS runs only on compute capability 8.x, not 9.0" in doc["problems"][0]
    assert _check(capsys, lib, "--sm", "8.0")[0] == 0


@pytest.mark.parametrize("name", ["app_static", "app_static_compressed"])
def test_a_static_runtime_is_found_in_compressed_cubins(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """nvcc links the CUDA runtime statically by default; without CUDA_VERSION or a
    libcudart.so, the release that built the cubins is the runtime's. Compressed or
    not, the CUDA 13.0 program needs R580 and fails on 535."""
    code, doc = _check(capsys, BIN / name, "--sm", "9.0", "--driver", "535.54.03")
    assert code == 1
    assert doc["cuda_runtime"]["version"] == "13.0"
    assert doc["warnings"] == []
    assert any("needs driver >= 580.65.06" in p for p in doc["problems"])
    assert _check(capsys, BIN / name, "--sm", "9.0", "--driver", "580.65.06")[0] == 0


def test_a_static_runtime_in_a_rootfs_without_cuda_version(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The image as a folder (no config, so no CUDA_VERSION; no libcudart.so)."""
    (tmp_path / "usr" / "local" / "bin").mkdir(parents=True)
    shutil.copy(BIN / "app_static_compressed", tmp_path / "usr" / "local" / "bin" / "app")
    code, doc = _check(capsys, Path(f"dir:{tmp_path}"), "--sm", "9.0", "--driver", "535.54.03")
    assert code == 1
    # The runtime linked into the program is read in it (buildmatrix.binary.cudart);
    # its cubins' toolkit note says the same release.
    assert doc["cuda_runtime"] == {
        "version": "13.0",
        "source": "usr/local/bin/app, a CUDA runtime by the constant its "
        "cudaRuntimeGetVersion returns",
    }
    sources = {s["source"]: s["version"] for s in doc["cuda_runtime_sources"]}
    assert sources["device code of usr/local/bin/app (built by CUDA 13.0)"] == "13.0"
    main(["check", f"dir:{tmp_path}", "--sm", "9.0", "--driver", "535.54.03"])
    out = capsys.readouterr().out
    assert "no CUDA runtime found" not in out and "FAIL" in out


def test_no_runtime_found_with_a_driver_is_said_loudly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PTX alone records no toolkit: the runtime floor cannot be checked. The check
    says so in --json (warnings) and in its text, and --strict fails it."""
    code, doc = _check(capsys, BIN / "libptx_only.so", "--sm", "9.0", "--driver", "580.65.06")
    assert code == 0
    assert doc["cuda_runtime"] is None
    assert len(doc["warnings"]) == 1 and "no CUDA runtime found" in doc["warnings"][0]
    main(["check", str(BIN / "libptx_only.so"), "--sm", "9.0", "--driver", "580.65.06"])
    assert "WARNING: no CUDA runtime found" in capsys.readouterr().out
    code, doc = _check(
        capsys, BIN / "libptx_only.so", "--sm", "9.0", "--driver", "580.65.06", "--strict"
    )
    assert code == 1 and "--strict fails it" in doc["problems"][-1]
    # without a driver there is no floor to check, so nothing to warn of
    assert _check(capsys, BIN / "libptx_only.so", "--sm", "9.0")[1]["warnings"] == []


def _renamed_kernel_sections(tmp_path: Path, *, clear_entry: bool) -> Path:
    """libtwo.so with its sm_80-only unit's ``.text._Z2kb...`` cubin section renamed
    ``.TEXT._Z2kb...`` (and, with ``clear_entry``, the ``STO_CUDA_ENTRY`` bit of its
    kernel symbol cleared), found with pyelftools: the unit still holds sm_80 code."""
    from io import BytesIO

    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    data = bytearray((BIN / "libtwo.so").read_bytes())
    fatbin = ELFFile(BytesIO(bytes(data))).get_section_by_name(".nv_fatbin")
    assert fatbin is not None
    lo, hi = fatbin["sh_offset"], fatbin["sh_offset"] + fatbin["sh_size"]
    assert data[lo:hi].count(b".text._Z2kb") >= 1  # in the section-name table
    data[lo:hi] = data[lo:hi].replace(b".text._Z2kb", b".TEXT._Z2kb")
    if clear_entry:
        start = data.rfind(b"\x7fELF", lo, data.find(b".TEXT._Z2kb", lo, hi))
        cubin = ELFFile(BytesIO(bytes(data[start:hi])))
        symtab = cubin.get_section_by_name(".symtab")
        assert isinstance(symtab, SymbolTableSection)
        cleared = 0
        for i, sym in enumerate(symtab.iter_symbols()):
            if sym["st_info"]["type"] == "STT_FUNC":
                at = start + symtab["sh_offset"] + i * symtab["sh_entsize"] + 5  # st_other
                data[at] &= ~0x10 & 0xFF
                cleared += 1
        assert cleared == 1
    out = tmp_path / "libtwo.so"
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("clear_entry", [False, True], ids=["entry symbol", "no entry symbol"])
def test_a_unit_is_not_a_link_stub_by_its_section_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, clear_entry: bool
) -> None:
    """A unit's kernels come from its cubin's executable code and entry symbols
    (cuobjdump lists them as ENTRY), not from ``.text.NAME`` section names alone: a
    renamed section does not make the sm_80-only unit a device-link stub. Where no
    entry symbol names the code either, its kernels are unknown and it still counts."""
    lib = _renamed_kernel_sections(tmp_path, clear_entry=clear_entry)
    cuobjdump = find_cuobjdump()
    if cuobjdump is not None and not clear_entry:
        listing = subprocess.run(
            [cuobjdump, "-elf", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        assert re.search(r"FUNC\s+GLOBAL\s+\S+\s+ENTRY\s+\S+\s+_Z2kbPfPKfi", listing)
    code, doc = _check(capsys, lib, "--sm", "9.0")
    assert code == 1, doc
    assert doc["targets"][0]["specialised"] == []
    unit = "container 2 (sm_80)" if clear_entry else "container 2 (sm_80; kernels _Z2kbPfPKfi)"
    assert unit in doc["problems"][0]
    assert _check(capsys, lib, "--sm", "8.0")[0] == 0


_GUARDED = """
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__global__ void only90(float *x) { x[threadIdx.x] *= 2.0f; }
#endif
__global__ void every(float *x) { x[threadIdx.x] += 1.0f; }
extern "C" void launch(float *x) {
#if !defined(__CUDA_ARCH__)
    only90<<<1, 32>>>(x);
#endif
    every<<<1, 32>>>(x);
}
"""


@pytest.mark.nvcc
@pytest.mark.parametrize("compress", ["-compress=false", "-compress-all"])
@pytest.mark.parametrize("guarded", [True, False])
def test_a_cubin_without_a_kernel_of_its_unit_fails_where_it_is_loaded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, guarded: bool, compress: str
) -> None:
    """One translation unit built for sm_80 and sm_90 whose kernel ``only90`` is
    defined for 9.0 and newer alone (``#if __CUDA_ARCH__ >= 900``): its sm_80 cubin
    lacks it (cuobjdump -elf lists ``.text._Z6only90Pf`` in the sm_90 cubin only), so
    8.0 and 8.6, which load that cubin, cannot launch it ("invalid device function").
    It passed on both before. Unguarded, the same library runs everywhere. Built with
    ``-Xfatbin -compress-all`` (nvcc 13: Zstandard) the same holds: the kernels of
    every cubin of the container are read from the decompressed cubins."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc builds the library")
    source = _GUARDED if guarded else _GUARDED.replace("900", "0")
    (tmp_path / "guard.cu").write_text(source)
    lib = tmp_path / "lib" / "libguard.so"
    lib.parent.mkdir()
    subprocess.run(
        [
            *("nvcc", "-shared", "-Xcompiler", "-fPIC", "-Xfatbin", compress),
            *("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"),
            *("guard.cu", "-o", str(lib)),
        ],
        cwd=tmp_path,
        check=True,
    )
    tool = find_cuobjdump()
    if tool is not None:
        elf = subprocess.run(
            [str(tool), "-elf", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        cubins = re.split(r"\n(?=.*arch = sm_)", elf)
        with_kernel = {
            m[0] for c in cubins if ".text._Z6only90Pf" in c and (m := re.search(r"sm_\d+", c))
        }
        assert with_kernel == ({"sm_90"} if guarded else {"sm_80", "sm_90"})
    for sm in ("8.0", "8.6"):
        code, doc = _check(capsys, lib.parent, "--sm", sm)
        assert code == (1 if guarded else 0), doc["problems"]
        if guarded:
            assert "lacks kernels its sm_90 cubin defines (_Z6only90Pf)" in doc["problems"][0]
    code, doc = _check(capsys, lib.parent, "--sm", "9.0")
    assert code == 0, doc["problems"]


# One translation unit as PTX for older GPUs and SASS for newer ones, or the other
# way round, from tests/fixtures/src; each stored uncompressed and compressed.
_PTX80_SM90 = ("arch=compute_80,code=compute_80", "arch=compute_90,code=sm_90")
_SHAPES = {
    "libguard_ptx80_sm90": Fixture(
        name="", kind="shared", source="guard_ge90.cu", gencode=_PTX80_SM90
    ),
    "libguard_sm90_ptx80": Fixture(
        name="", kind="shared", source="guard_lt90.cu", gencode=_PTX80_SM90[::-1]
    ),
    # -G (device debug): a __device__ function kept out of line gets a .text section of
    # its own in the cubin, beside the kernel's, and is no kernel
    "libdebug_ptx80_sm90": Fixture(
        name="", kind="shared", source="device_call.cu", gencode=_PTX80_SM90, extra=("-G",)
    ),
}
_COMPRESS = {"plain": "-compress=false", "compressed": "-compress-all"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shapes of :data:`_SHAPES`, built by nvcc (cached: tests/fixtures/build.py)."""
    if not have_nvcc():
        pytest.skip("nvcc and gcc build these libraries")
    out = tmp_path_factory.mktemp("guarded")
    fixtures = [
        replace(fx, name=f"{shape}_{how}.so", extra=(*fx.extra, "-Xfatbin", flag))
        for shape, fx in _SHAPES.items()
        for how, flag in _COMPRESS.items()
    ]
    cached_build(out, fixtures, NVCC_CACHE, jobs=1)
    return out


def _images(path: Path) -> Counter[tuple[str, frozenset[str]]]:
    """Each image buildmatrix read, with its kernels (cuobjdump_kernels's form)."""
    report = inspect_file(path)
    assert report is not None
    read = [e for e in report.entries if e.kernels is not None]
    return Counter((e.arch_name, frozenset(e.kernels or ())) for e in read)


@pytest.mark.nvcc
@pytest.mark.parametrize("how", list(_COMPRESS))
def test_ptx_without_a_kernel_of_its_unit_fails_where_it_is_jit_compiled(
    capsys: pytest.CaptureFixture[str], guarded: Path, how: str
) -> None:
    """``-gencode arch=compute_80,code=compute_80 -gencode arch=compute_90,code=sm_90``
    with ``only90`` under ``#if __CUDA_ARCH__ >= 900``: cuobjdump -ptx shows only
    ``.entry _Z5everyPf``, the sm_90 cubin has both. On 8.0 and 8.6 the driver
    JIT-compiles the PTX (CUDA C++ Programming Guide, "Application Compatibility"),
    which cannot launch ``only90``; this passed as ``jit`` before. 9.0 loads the
    complete sm_90 cubin."""
    lib = guarded / f"libguard_ptx80_sm90_{how}.so"
    images = _images(lib)
    assert images[("compute_80", frozenset({"_Z5everyPf"}))] == 1
    assert images[("sm_90", frozenset({"_Z5everyPf", "_Z6only90Pf"}))] == 1
    tool = find_cuobjdump()
    if tool is not None:
        assert images == cuobjdump_kernels(tool, lib)
    for sm in ("8.0", "8.6"):
        code, doc = _check(capsys, lib, "--sm", sm, "--driver", "580.65.06")
        assert code == 1, doc
        assert (
            f"its compute_80 PTX, the one {sm} JIT-compiles, lacks kernels its sm_90 cubin "
            "defines (_Z6only90Pf)" in doc["problems"][0]
        )
    code, doc = _check(capsys, lib, "--sm", "9.0", "--driver", "580.65.06", "--require-sass")
    assert code == 0, doc["problems"]


@pytest.mark.nvcc
@pytest.mark.parametrize("how", list(_COMPRESS))
def test_a_cubin_without_a_kernel_of_its_units_ptx_fails_where_it_is_loaded(
    capsys: pytest.CaptureFixture[str], guarded: Path, how: str
) -> None:
    """``-gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=compute_80``
    with ``pre90`` under ``#if __CUDA_ARCH__ < 900``: the PTX defines ``pre90`` and
    ``every``, the sm_90 cubin ``every`` alone. 9.0 loads the cubin and cannot launch
    ``pre90``; this passed even with ``--strict --require-sass``. 8.0 JIT-compiles
    the complete PTX, and 10.0 too (no SASS of its major)."""
    lib = guarded / f"libguard_sm90_ptx80_{how}.so"
    images = _images(lib)
    assert images[("compute_80", frozenset({"_Z5everyPf", "_Z5pre90Pf"}))] == 1
    assert images[("sm_90", frozenset({"_Z5everyPf"}))] == 1
    tool = find_cuobjdump()
    if tool is not None:
        assert images == cuobjdump_kernels(tool, lib)
    for strict in ((), ("--strict", "--require-sass")):
        code, doc = _check(capsys, lib, "--sm", "9.0", "--driver", "580.65.06", *strict)
        assert code == 1, doc
        assert (
            "its sm_90 cubin, the one 9.0 loads, lacks kernels its compute_80 PTX defines "
            "(_Z5pre90Pf)" in doc["problems"][0]
        )
    for sm in ("8.0", "10.0"):
        code, doc = _check(capsys, lib, "--sm", sm, "--driver", "580.65.06")
        assert code == 0, (sm, doc["problems"])


@pytest.mark.nvcc
@pytest.mark.parametrize("how", list(_COMPRESS))
def test_a_device_function_of_a_debug_build_is_no_kernel(
    capsys: pytest.CaptureFixture[str], guarded: Path, how: str
) -> None:
    """``nvcc -G`` with ``compute_80`` PTX and ``sm_90`` SASS: the cubin has
    ``.text._Z6helperi`` beside ``.text._Z4kernPi``, but only the kernel is an entry
    function (cuobjdump -elf: ENTRY), and the PTX defines it as ``.entry``; the
    helper is a ``.func`` in both. 8.0 JIT-compiles the PTX, which launches ``kern``
    as well as the cubin does: no kernel is lacking (this failed 8.0 while kernels
    were read from section names)."""
    lib = guarded / f"libdebug_ptx80_sm90_{how}.so"
    images = _images(lib)
    assert images[("compute_80", frozenset({"_Z4kernPi"}))] == 1
    assert images[("sm_90", frozenset({"_Z4kernPi"}))] == 1
    assert not any("_Z6helperi" in kernels for _, kernels in images)
    tool = find_cuobjdump()
    if tool is not None:
        assert images == cuobjdump_kernels(tool, lib)
        elf = subprocess.run(
            [str(tool), "-elf", str(lib)], check=True, capture_output=True, text=True
        )
        assert ".text._Z6helperi" in elf.stdout  # the section that is no kernel's
    for sm in ("8.0", "8.6", "9.0", "10.0"):
        code, doc = _check(capsys, lib, "--sm", sm, "--driver", "580.65.06")
        assert code == 0, (sm, doc["problems"])


@pytest.mark.nvcc
def test_a_kernel_an_object_only_declares_is_no_kernel_of_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``nvcc -rdc=true -c`` of a kernel that launches one defined elsewhere: the
    cubin's symbol table lists ``other`` as ENTRY in no section (undefined), the PTX
    declares it ``.extern .entry``; neither defines it, so the PTX JIT-compiled on
    10.0 lacks nothing (this failed, naming ``other``)."""
    if not have_nvcc():
        pytest.skip("nvcc builds this object")
    fixture = Fixture(
        name="launch_extern.o",
        kind="object",
        rdc=True,
        source="launch_extern.cu",
        gencode=("arch=compute_90,code=[sm_90,compute_90]",),
    )
    (obj,) = cached_build(tmp_path / "out", [fixture], NVCC_CACHE, jobs=1)
    images = _images(obj)
    assert images[("sm_90", frozenset({"_Z8launcherPi"}))] == 1
    assert images[("compute_90", frozenset({"_Z8launcherPi"}))] == 1
    tool = find_cuobjdump()
    if tool is not None:
        elf = subprocess.run(
            [str(tool), "-elf", str(obj)], check=True, capture_output=True, text=True
        )
        assert "_Z5otherPi" in elf.stdout  # listed, in no section
    for sm in ("9.0", "10.0"):
        code, doc = _check(capsys, obj, "--sm", sm, "--driver", "580.65.06")
        assert code == 0, (sm, doc["problems"])
