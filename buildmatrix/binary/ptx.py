"""PTX text files: the ``.version`` (PTX ISA) and ``.target`` directives."""

from __future__ import annotations

import re

from packaging.version import Version

from buildmatrix.arch import Arch, CodeKind, ComputeCapability, Suffix
from buildmatrix.binary.source import ByteSource, CorruptBinary

# Both directives precede any code (PTX ISA reference, "PTX Module Directives").
_HEAD = 1 << 16
_VERSION = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", re.M)
_TARGET = re.compile(rb"^\s*\.target\s+sm_(\d{2,3})([af]?)\b", re.M)


def looks_like_ptx(head: bytes) -> bool:
    return b".version" in head or head.lstrip().startswith(b"//")


def ptx_target(src: ByteSource) -> tuple[Arch, Version]:
    """The ``compute_XY`` arch and PTX ISA version of a PTX text file."""
    head = src.read_at(0, min(src.size, _HEAD))
    version, target = _VERSION.search(head), _TARGET.search(head)
    if version is None or target is None:
        raise CorruptBinary(
            f"{src.name}: PTX file without '.version' and '.target sm_XY' directives in its "
            f"first {_HEAD // 1024} KiB."
        )
    arch = Arch(
        ComputeCapability.from_number(int(target[1])),
        CodeKind.PTX,
        Suffix(target[2].decode()),
    )
    return arch, Version(f"{int(version[1])}.{int(version[2])}")
