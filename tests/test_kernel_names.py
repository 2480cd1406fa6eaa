"""The per-translation-unit rule's "named for an architecture" sign
(buildmatrix.units.named_for_architecture): whole name tokens only.

Names are demangled by libstdc++'s ``__cxa_demangle`` (the demangler c++filt uses);
the mangled forms below follow the Itanium C++ ABI's ``<source-name>`` rule
(``<length><identifier>``), and the nvcc-built library holds the kernel names nvcc
itself mangled, as cuobjdump lists them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from buildmatrix.binary.archnames import named_for_architecture
from buildmatrix.binary.demangle import demangle
from buildmatrix.cli import main
from tests.cuobjdump import find_cuobjdump

ARCH_WORDS = ["volta", "Volta", "VOLTA", "turing", "Turing", "ampere", "Ampere", "hopper",
              "Hopper", "blackwell", "Blackwell"]  # fmt: skip
LOWER = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6)


def _mangled(ident: str) -> list[str]:
    """``ident(float*)`` and ``ns::ident()`` as an Itanium ABI compiler mangles them."""
    return [f"_Z{len(ident)}{ident}Pf", f"_ZN2ns{len(ident)}{ident}Ev"]


@settings(max_examples=300, deadline=None)
@given(word=st.sampled_from(ARCH_WORDS), before=LOWER, after=LOWER, digits=st.integers(0, 999))
def test_an_architecture_inside_a_longer_word_names_nothing(
    word: str, before: str, after: str, digits: int
) -> None:
    """voltage, capturing, chopper, xampere: the name only contains the word."""
    for ident in (
        f"{word.lower()}{after}_update",
        f"{before}{word.lower()}_k",
        f"{before}{word.lower()}{after}{digits}",
        f"k_{before}sm{digits:02d}",  # prism100, parallelism64
        f"sm{before}{digits}",  # smem128
    ):
        for name in (ident, *_mangled(ident)):
            assert demangle(name) is not None, name
            assert not named_for_architecture(name), name


@settings(max_examples=300, deadline=None)
@given(
    word=st.sampled_from(ARCH_WORDS),
    rest=LOWER,
    number=st.integers(10, 999),
    suffix=st.sampled_from(["", "a", "f"]),
    sep=st.sampled_from(["", "_"]),
)
def test_an_architecture_as_a_whole_token_names_the_kernel(
    word: str, rest: str, number: int, suffix: str, sep: str
) -> None:
    """cuBLAS's ampere_sgemm_*, cuDNN's Volta_*, sm80_xmma_*, cutlass_70_*, myHopperKernel."""
    for ident in (
        f"{word}_{rest}",
        f"{rest}_{word}",
        f"{rest}{word.capitalize()}Kernel",
        f"{rest}_sm{sep}{number}{suffix}_x",
        f"SM{number}{suffix}_{rest}",
        f"cutlass_{number}_{rest}",
    ):
        for name in (ident, *_mangled(ident)):
            assert named_for_architecture(name), name


@pytest.mark.parametrize(
    "name",
    [
        "_ZN2sm10kernel_fooEv",  # namespace sm, then a 10-character name: no sm10
        "_ZN7cutlass6KernelILi80EEEvv",  # cutlass::Kernel<80>: a template argument, no tag
        "_Z3runILi90EEvv",
        "_Zbogus_volta",  # does not demangle: its tokens are unknown
    ],
)
def test_tokens_do_not_run_across_identifiers(name: str) -> None:
    assert not named_for_architecture(name)


@pytest.mark.integration
@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc builds the library")
def test_a_short_unit_is_not_named_by_a_substring(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An sm_90 unit and an sm_80-only unit whose one kernel is ``voltage_update``
    fails 9.0; the same library with the kernel renamed ``volta_g_update`` (a whole
    token, bytes of equal length) passes it as a specialisation."""
    (tmp_path / "a.cu").write_text(
        "__global__ void scale(float *v) { v[threadIdx.x] *= 2.0f; }\n"
        'extern "C" void run_a(float *d) { scale<<<1, 32>>>(d); }\n'
    )
    (tmp_path / "b.cu").write_text(
        "__global__ void voltage_update(float *v) { v[threadIdx.x] *= 0.5f; }\n"
        'extern "C" void run_b(float *d) { voltage_update<<<1, 32>>>(d); }\n'
    )
    for src, arch in (("a", "90"), ("b", "80")):
        subprocess.run(
            ["nvcc", "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{arch},code=sm_{arch}",
             "-c", f"{src}.cu", "-o", f"{src}.o"],
            cwd=tmp_path, check=True,
        )  # fmt: skip
    lib = tmp_path / "libvolt.so"
    subprocess.run(
        ["nvcc", "-shared", "-o", lib.name, "a.o", "b.o", "-cudart", "static"],
        cwd=tmp_path,
        check=True,
    )
    cuobjdump = find_cuobjdump()
    if cuobjdump is not None:
        listing = subprocess.run(
            [cuobjdump, "-elf", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        assert "_Z14voltage_updatePf" in listing
    code = main(["check", str(lib), "--no-cache", "--json", "--sm", "9.0"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1, doc
    assert doc["targets"][0]["specialised"] == []
    assert "kernels _Z14voltage_updatePf" in doc["problems"][0]
    renamed = tmp_path / "libvolta.so"
    renamed.write_bytes(lib.read_bytes().replace(b"voltage_update", b"volta_g_update"))
    code = main(["check", str(renamed), "--no-cache", "--json", "--sm", "9.0"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    (specialised,) = doc["targets"][0]["specialised"]
    assert "named for a GPU architecture" in specialised
