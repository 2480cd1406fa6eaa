"""NVIDIA's cuobjdump as the reference reader (pip package nvidia-cuda-cuobjdump)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.(sm_\d+[af]?)\.(cubin|ptx)$")


def find_cuobjdump() -> Path | None:
    """cuobjdump on PATH, else the one the nvidia-cuda-cuobjdump wheel installs."""
    on_path = shutil.which("cuobjdump")
    if on_path:
        return Path(on_path)
    spec = importlib.util.find_spec("nvidia")
    for folder in spec.submodule_search_locations or [] if spec else []:
        for candidate in sorted(Path(folder).glob("cu*/bin/cuobjdump"), reverse=True):
            return candidate
    return None


def cuobjdump_lists(tool: Path, path: Path) -> tuple[Counter[str], Counter[str]]:
    """(SASS, PTX) entries as cuobjdump lists them, with multiplicity.

    cuobjdump names SASS ``sm_XY[a]`` (an ``f`` cubin reads as plain) and PTX
    ``sm_XY[a|f]``; PTX is returned as ``compute_XY[a|f]`` to match buildmatrix.
    """
    sass: Counter[str] = Counter()
    ptx: Counter[str] = Counter()
    # Both lists in one call: cuobjdump reads the file once and prints the ELF lines,
    # then the PTX lines, as two calls would (the same lines on every fixture and on
    # the torch and NVIDIA libraries the tests read); on libtorch_cuda.so (480 MiB)
    # each pass takes about 10 s.
    proc = subprocess.run(
        [str(tool), "--list-elf", "--list-ptx", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode not in (0, 255):  # 255: the file holds no device code
        raise RuntimeError(f"cuobjdump --list-elf --list-ptx {path} failed: {proc.stderr}")
    for line in proc.stdout.splitlines():
        m = _LINE.match(line.strip())
        if m and m[1] == "ELF":
            sass[m[2]] += 1
        elif m:
            ptx["compute_" + m[2].removeprefix("sm_")] += 1
    return sass, ptx


_BLOCK = re.compile(r"^Fatbin (elf|ptx) code:\n=+\narch = (sm_\d+[af]?)$", re.M)
# -elf's symbol table: a kernel is a FUNC symbol cuobjdump marks ENTRY (STO_CUDA_ENTRY);
# with -G a __device__ function kept out of line has a .text section too, and no ENTRY
_ENTRY_SYMBOL = re.compile(r"\sFUNC\s+\S+\s+\S+\s+ENTRY\s+\S+\s+(\S+)$", re.M)
_PTX_ENTRY = re.compile(r"^\s*(?:\.(?:visible|weak)\s+)*\.entry\s+([\w$%]+)", re.M)


def cuobjdump_kernels(tool: Path, path: Path) -> Counter[tuple[str, frozenset[str]]]:
    """Each image of ``path`` with the kernels it defines, as cuobjdump prints them:
    ``-elf``'s ENTRY functions per cubin (named ``sm_XY``) and ``-ptx``'s
    ``.entry`` directives per PTX text (named ``compute_XY`` to match buildmatrix)."""
    images: Counter[tuple[str, frozenset[str]]] = Counter()
    for option, kind in (("-elf", "elf"), ("-ptx", "ptx")):
        out = subprocess.run(
            [str(tool), option, str(path)], capture_output=True, text=True, check=True
        ).stdout
        blocks = list(_BLOCK.finditer(out))
        for m, after in zip(blocks, [*blocks[1:], None], strict=True):
            if m[1] != kind:
                continue  # -elf names the PTX entries too, with nothing below
            body = out[m.end() : after.start() if after is not None else len(out)]
            found = _ENTRY_SYMBOL if kind == "elf" else _PTX_ENTRY
            arch = m[2] if kind == "elf" else "compute_" + m[2].removeprefix("sm_")
            images[(arch, frozenset(found.findall(body)))] += 1
    return images
