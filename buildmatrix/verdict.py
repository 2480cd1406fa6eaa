"""What every compatibility answer is made of: a verdict and its reasons, for one
piece of device code (docs/compatibility.md)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from packaging.version import Version

from buildmatrix.arch import Arch, CodeKind
from buildmatrix.cuda import major_minor


class Verdict(StrEnum):
    NATIVE = "native"
    JIT = "jit"
    NONE = "none"


RANK = {Verdict.NATIVE: 2, Verdict.JIT: 1, Verdict.NONE: 0}


@dataclass(frozen=True, kw_only=True)
class CodeTarget:
    """One piece of device code: a SASS cubin or a PTX text, as a fatbinary lists it."""

    arch: Arch
    ptx_isa: Version | None = None

    def __str__(self) -> str:
        if self.arch.kind is CodeKind.PTX and self.ptx_isa is not None:
            return f"{self.arch} (PTX ISA {major_minor(self.ptx_isa)})"
        return str(self.arch)


@dataclass(frozen=True, kw_only=True)
class Judgement:
    verdict: Verdict
    reasons: tuple[str, ...]
