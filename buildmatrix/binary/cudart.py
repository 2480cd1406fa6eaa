"""Which CUDA runtime a file is, or holds linked in, read from what the file is rather
than from its name.

A runtime may sit in an image under any name: ``auditwheel repair`` vendors
``libcudart.so.13`` into a wheel as ``libcudart-<hash>.so.13`` (``patchelf
--set-soname``, and ``--replace-needed`` in the extensions that load it), and a program
or library linked with ``libcudart_static.a`` (nvcc's default ``-cudart static``, CMake's
``CUDA::cudart_static``; cuBLAS, cuDNN and NCCL are built so) holds the runtime itself.
The driver the process needs follows that runtime (``cudaErrorInsufficientDriver``
where it is older), so ``check`` counts it (buildmatrix.runtime_sources). Read here,
from the bytes NVIDIA's runtime carries in every build (libcudart.so.12 12.4.127 of
the nvidia-cuda-runtime-cu12 wheel, x86-64 and aarch64; libcudart.so.13 and
libcudart_static.a of CUDA 13.0; the runtimes linked into cuBLAS 12.8/13.1, cuDNN 9
and NCCL 2.27):

- the runtime's own message for ``cudaErrorInsufficientDriver`` (:data:`MARK`, in
  its read-only data, shared or static): the file holds a CUDA runtime;
- ``cudaRuntimeGetVersion``'s body, which stores the constant ``CUDART_VERSION``
  (``1000 * major + 10 * minor``, ``cuda_runtime_api.h``) through its argument: on
  x86-64 ``test %rdi,%rdi; je; movl $V,(%rdi); xor %eax,%eax; ret``, on aarch64
  ``cbz x0; mov x1,x0; mov w2,#V; mov w0,#0; str w2,[x1]; ret`` (:data:`_BODIES`);
- the shared runtime's symbol versions: every symbol it exports is versioned
  ``libcudart.so.<major>`` (``.gnu.version_d``, found through ``DT_VERDEF`` in the
  dynamic section), which ``patchelf --set-soname`` does not change, since the
  programs linked against it ask for that version by name.

A file that holds the runtime but whose release cannot be read so (another
compiler's code for the function, several values) is a runtime of unknown release:
``check`` warns, and fails with ``--strict``, as it does for an image whose runtime
cannot be found (docs/check.md).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from buildmatrix.binary.dynrel import dynamic_tags
from buildmatrix.binary.elf import ElfInfo, Layout, read_layout
from buildmatrix.binary.embedded import data_regions
from buildmatrix.binary.source import ByteSource, CorruptBinary, find_each, read_exact

# cudaGetErrorString(cudaErrorInsufficientDriver), in every runtime read above.
MARK = b"CUDA driver version is insufficient for CUDA runtime version"
_BODIES = (
    re.compile(rb"\x48\x85\xff\x74\x0b\xc7\x07(....)\x31\xc0\xc3", re.S),  # x86-64
    re.compile(  # aarch64: the value is bits 5..20 of the mov w2 (0x52800002 | V << 5)
        rb"\xc0\x00\x00\xb4\xe1\x03\x00\xaa(....)\x00\x00\x80\x52\x22\x00\x00\xb9\xc0\x03\x5f\xd6",
        re.S,
    ),
)
_VERDEF_NAME = re.compile(r"libcudart\.so\.(\d+)")
DT_STRTAB, DT_STRSZ, DT_VERDEF, DT_VERDEFNUM = 5, 10, 0x6FFFFFFC, 0x6FFFFFFD
_MAX_VERDEFS = 1 << 12
_CHUNK = 1 << 24


@dataclass(frozen=True, kw_only=True, slots=True)
class CudaRuntime:
    """A file of an image that is a CUDA runtime or holds one linked in: ``release``
    (None: it cannot be read), ``how`` (what shows it), and what the file's other
    readers found (its device code, its search paths: ``inner``)."""

    path: str
    release: Version | None
    how: str
    inner: Any = None  # FileReport | SearchPaths | None (buildmatrix.binary.scan)


def read_runtime(
    src: ByteSource, *, path: str, info: ElfInfo, skip: list[tuple[int, int]], inner: Any = None
) -> CudaRuntime | None:
    """The CUDA runtime ``src`` (an ELF file, ``info`` its headers) is or holds, or
    None. ``skip``: ranges of the file read as device code, not searched for the
    runtime's message. A file whose program headers do not read holds no runtime this
    reader can see unless its data holds the message (then its release is unread)."""
    try:
        layout: Layout | None = read_layout(src)
    except CorruptBinary:
        layout = None
    major = _verdef_major(src, layout) if layout is not None else None
    try:
        data = data_regions(src, info, skip=skip)
        marked = any(next(find_each(src, a, a + n, MARK), -1) >= 0 for a, n in data)
    except CorruptBinary:
        marked = False
    if major is None and not marked:
        return None
    try:
        values = _versions(src, layout) if layout is not None else set()
    except CorruptBinary:
        values = set()
    shared = f"its symbol versions (libcudart.so.{major})" if major is not None else None
    if len(values) == 1:
        (value,) = values
        release = Version(f"{value // 1000}.{value % 1000 // 10}")
        if major is None or release.major == major:
            how = "the constant its cudaRuntimeGetVersion returns" + (
                f" and {shared}" if shared else ""
            )
            return CudaRuntime(path=path, release=release, how=how, inner=inner)
    if major is not None:
        return CudaRuntime(path=path, release=Version(f"{major}.0"), how=shared or "", inner=inner)
    found = ", ".join(str(v) for v in sorted(values)) or "none"
    why = f"the CUDA runtime linked in, whose release cannot be read (CUDART_VERSION: {found})"
    return CudaRuntime(path=path, release=None, how=why, inner=inner)


def _versions(src: ByteSource, layout: Layout) -> set[int]:
    """Each ``CUDART_VERSION`` a ``cudaRuntimeGetVersion`` body in the executable
    segments stores."""
    found: set[int] = set()
    for g in layout.segments:
        if not g.executable:
            continue
        for start in range(g.offset, g.offset + g.filesz, _CHUNK):
            size = min(_CHUNK + 64, g.offset + g.filesz - start)
            chunk = read_exact(src, start, size, what="executable segment")
            for i, body in enumerate(_BODIES):
                for m in body.finditer(chunk):
                    (word,) = struct.unpack("<I", m[1])
                    if i == 1:
                        if word & 0xFFE0001F != 0x52800002:
                            continue
                        word = word >> 5 & 0xFFFF
                    if 1000 <= word < 100_000 and word % 10 == 0:
                        found.add(word)
    return found


def _verdef_major(src: ByteSource, layout: Layout) -> int | None:
    """The major of a ``libcudart.so.<major>`` version the file defines (``DT_VERDEF``:
    ``Elf_Verdef`` records, each naming its ``Elf_Verdaux`` strings in ``DT_STRTAB``;
    System V gABI, "Symbol Versioning"), or None."""
    if layout.dynamic is None or layout.order != "<":
        return None
    try:
        tags = dynamic_tags(src, layout)
        if DT_VERDEF not in tags or DT_STRTAB not in tags:
            return None
        strtab = layout.file_offset(tags[DT_STRTAB], max(1, tags.get(DT_STRSZ, 1)))
        at = layout.file_offset(tags[DT_VERDEF], 20)
        if strtab is None or at is None:
            return None
        for _ in range(min(tags.get(DT_VERDEFNUM, 1), _MAX_VERDEFS)):
            _ver, _flags, _ndx, cnt, _hash, aux, nxt = struct.unpack(
                "<HHHHIII", read_exact(src, at, 20, what="version definition")
            )
            if cnt:
                (name,) = struct.unpack("<I", read_exact(src, at + aux, 4, what="verdaux"))
                raw = src.read_at(strtab + name, 64).split(b"\0", 1)[0]
                m = _VERDEF_NAME.fullmatch(raw.decode("latin-1"))
                if m:
                    return int(m[1])
            if not nxt:
                break
            at += nxt
    except CorruptBinary:
        return None
    return None
