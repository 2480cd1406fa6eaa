"""What every compatibility answer is made of: a verdict and its reasons, for one
piece of device code (docs/compatibility.md) or one file, and the code they judge: a
target, and one translation unit's targets (buildmatrix.units judges those)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from packaging.version import Version

from buildmatrix.arch import Arch, CodeKind, Suffix
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


@dataclass(frozen=True, kw_only=True)
class FileJudgement:
    """One file's verdict on one GPU (buildmatrix.units.judge_units)."""

    verdict: Verdict
    reasons: tuple[str, ...]
    specialised: tuple[str, ...] = ()  # containers left out of the verdict, and why


@dataclass(frozen=True, kw_only=True)
class Lacking:
    """An image of a translation unit (a cubin or a PTX text, both read) that lacks
    kernels other images of it define, and those images."""

    image: Arch
    kernels: tuple[str, ...]
    defined_by: tuple[Arch, ...]

    def describe(self) -> str:
        """``sm_80 cubin`` or ``compute_80 PTX``: what the message calls the image."""
        return _image(self.image)

    def definers(self) -> str:
        """The images that define the kernels, as the message names them."""
        return " and ".join(_image(a) for a in self.defined_by)


def _image(arch: Arch) -> str:
    return f"{arch} {'cubin' if arch.kind is CodeKind.SASS else 'PTX'}"


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One translation unit's loadable code (a fatbinary container) and the kernels
    its cubins and PTX texts define (compressed ones decompressed:
    buildmatrix.binary.kernels)."""

    codes: tuple[CodeTarget, ...]
    kernels: tuple[str, ...] = ()
    index: int = 0  # the container's place in the file
    # Whether its kernels were read: False where no image of it was (a compressed
    # cubin or PTX text the scan did not decompress, a PTX text alone); the rule
    # never exempts on names it has not read.
    kernels_known: bool = True
    # Kept as data and loaded by the program itself (cuModuleLoadData), which picks
    # one per GPU: found by content (buildmatrix.binary.embedded).
    embedded: bool = False
    # Images of the container (cubins, PTX texts) that lack kernels another of its
    # images defines (both read): a GPU that loads such an image cannot launch those
    # kernels.
    lacking: tuple[Lacking, ...] = ()

    @property
    def specific(self) -> bool:
        """Only arch- or family-specific code (``sm_90a``, ``sm_100f``, ...). A unit
        left with no code the driver may load (buildmatrix.jit_env) is not."""
        return bool(self.codes) and all(c.arch.suffix is not Suffix.NONE for c in self.codes)

    def describe(self) -> str:
        archs = ", ".join(sorted({str(c.arch) for c in self.codes})) or "no code it may load"
        if not self.kernels:
            return archs
        more = f" and {len(self.kernels) - 3} more" if len(self.kernels) > 3 else ""
        return f"{archs}; kernels {', '.join(self.kernels[:3])}{more}"
