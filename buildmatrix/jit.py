"""PTX JIT: which PTX a GPU can JIT-compile, and which driver can (docs/compatibility.md).

Sources: CUDA C++ Programming Guide, "PTX Compatibility"; the PTX ISA reference
(each release's ISA version, and a driver JITs its own ISA and every older one); the
CUDA toolkit release notes (each release's driver), as ``buildmatrix/data/cuda.yaml``
holds them. Minor version compatibility does not cover JIT (CUDA Compatibility guide).
"""

from __future__ import annotations

from collections.abc import Iterable

from packaging.version import Version

from buildmatrix.arch import Arch, CodeKind, ComputeCapability, Suffix
from buildmatrix.cuda import CudaFacts, DriverVersion, Toolkit, major_minor
from buildmatrix.verdict import CodeTarget, Judgement, Verdict


def ptx_targets(arch: Arch, cc: ComputeCapability) -> bool:
    """Whether PTX for ``arch`` can be JIT-compiled for ``cc`` (ignoring the driver).

    ``compute_XY`` JITs for any CC >= X.Y; ``compute_XYa`` only for X.Y;
    ``compute_XYf`` for X.Z with Z >= Y (its family).
    """
    if arch.suffix is Suffix.ARCH:
        return cc == arch.cc
    if arch.suffix is Suffix.FAMILY:
        return cc.major == arch.cc.major and cc.minor >= arch.cc.minor
    return cc >= arch.cc


def ptx_toolkit(ptx_isa: Version, facts: CudaFacts) -> Toolkit | None:
    """The oldest toolkit whose PTX ISA is at least ``ptx_isa`` (None: newer than known)."""
    return facts.ptx_toolkit(ptx_isa)


def _judge_ptx_by_cuda(
    arch: Arch, ptx_isa: Version, cc: ComputeCapability, driver_cuda: Version, facts: CudaFacts
) -> Judgement:
    """PTX judged by the CUDA version the driver itself reports (NVML
    ``nvmlSystemGetCudaDriverVersion``): the authority on what it can JIT.

    A driver that supports CUDA X.Y JITs the PTX ISA of every release up to X.Y (the
    PTX ISA reference: a driver compiles PTX of its own ISA and of every older one).
    The ISA of a release comes from the table; for a release the table does not know
    (a newer minor or major) only the ISA of the newest known release at or below it
    is assumed (ISA versions never decrease from one release to the next, which the
    table's loader checks), never a guess at the new release's own ISA.
    """
    isa, have = major_minor(ptx_isa), major_minor(driver_cuda)
    tk = ptx_toolkit(ptx_isa, facts)
    if tk is None:
        newest = facts.newest
        return Judgement(
            verdict=Verdict.NONE,
            reasons=(
                f"{arch} PTX ISA {isa} is newer than every toolkit buildmatrix knows (CUDA "
                f"{major_minor(newest.version)} emits ISA {major_minor(newest.ptx_isa)}); "
                f"whether the node's driver (CUDA {have}) JITs it cannot be shown. Update "
                "buildmatrix's CUDA table",
            ),
        )
    if (tk.version.major, tk.version.minor) > (driver_cuda.major, driver_cuda.minor):
        return Judgement(
            verdict=Verdict.NONE,
            reasons=(
                f"{arch} PTX ISA {isa} needs a driver of CUDA {major_minor(tk.version)} or "
                f"newer to JIT; the node's driver reports CUDA {have}",
            ),
        )
    return Judgement(
        verdict=Verdict.JIT,
        reasons=(
            f"{arch} PTX ISA {isa} (CUDA {major_minor(tk.version)}) is JIT-compiled for {cc} "
            f"by the node's driver, which reports CUDA {have}",
        ),
    )


def judge_ptx(
    arch: Arch,
    ptx_isa: Version | None,
    cc: ComputeCapability,
    *,
    driver: DriverVersion | None,
    facts: CudaFacts,
    driver_cuda: Version | None = None,
) -> Judgement:
    """Whether the PTX of ``arch`` and ISA ``ptx_isa`` JITs for ``cc``: by the CUDA
    version the driver reports where it is known (``driver_cuda``), else by the
    driver's number against the table's drivers, failing closed where the table
    names none (CUDA 13.4 and 13.5 ship no driver)."""
    if not ptx_targets(arch, cc):
        return _not_a_target(arch, cc)
    if ptx_isa is None:
        return Judgement(
            verdict=Verdict.JIT,
            reasons=(f"{arch} PTX can be JIT-compiled for {cc} (PTX ISA version unknown)",),
        )
    if driver_cuda is not None:
        return _judge_ptx_by_cuda(arch, ptx_isa, cc, driver_cuda, facts)
    return _judge_ptx_by_driver_number(arch, ptx_isa, cc, driver, facts)


def _not_a_target(arch: Arch, cc: ComputeCapability) -> Judgement:
    """Why PTX of ``arch`` never JIT-compiles for ``cc`` (ptx_targets is false)."""
    if arch.suffix is Suffix.ARCH:
        why = f"{arch} PTX is arch-specific and JIT-compiles only for {arch.cc}"
    elif arch.suffix is Suffix.FAMILY:
        why = (
            f"{arch} PTX is family-specific and JIT-compiles only for {arch.cc}+ of "
            f"{arch.cc.major}.x"
        )
    else:
        why = f"{arch} PTX needs compute capability {arch.cc} or newer"
    return Judgement(verdict=Verdict.NONE, reasons=(f"{why}, not {cc}",))


def _judge_ptx_by_driver_number(
    arch: Arch,
    ptx_isa: Version,
    cc: ComputeCapability,
    driver: DriverVersion | None,
    facts: CudaFacts,
) -> Judgement:
    """judge_ptx where the driver's CUDA version is not known: the driver's number
    against the table's drivers, failing closed where the table names none."""
    isa = major_minor(ptx_isa)
    tk = ptx_toolkit(ptx_isa, facts)
    if tk is None:
        return _newer_than_known(arch, isa, driver, facts)
    if tk.driver is None:
        unbundled = (
            f"{arch} PTX ISA {isa} is CUDA {major_minor(tk.version)}'s, which ships no driver; "
            "NVIDIA names none that is known to JIT it"
        )
        if driver is None:
            return Judgement(verdict=Verdict.JIT, reasons=(unbundled,))
        return Judgement(
            verdict=Verdict.NONE,
            reasons=(
                f"{unbundled}, so driver {driver} cannot be shown to by its number (fail "
                "closed); the CUDA version the driver itself reports decides where it is "
                "known (a node snapshot: check --snapshot, smoke)",
            ),
        )
    need = f"CUDA {major_minor(tk.version)}, driver >= {tk.driver}"
    if driver is None:
        return Judgement(
            verdict=Verdict.JIT,
            reasons=(
                f"{arch} PTX ISA {isa} can be JIT-compiled for {cc} by a driver that knows it "
                f"({need})",
            ),
        )
    if driver < tk.driver:
        have = facts.driver_cuda(driver)
        have_text = f"CUDA {major_minor(have)}" if have else "older than any known CUDA"
        return Judgement(
            verdict=Verdict.NONE,
            reasons=(
                f"{arch} PTX ISA {isa} needs {need} to JIT; driver {driver} supports only "
                f"{have_text}",
            ),
        )
    return Judgement(
        verdict=Verdict.JIT,
        reasons=(f"{arch} PTX ISA {isa} is JIT-compiled for {cc} by driver {driver}",),
    )


def _newer_than_known(
    arch: Arch, isa: str, driver: DriverVersion | None, facts: CudaFacts
) -> Judgement:
    """PTX of an ISA no toolkit in the table emits."""
    newest = facts.newest
    unknown = (
        f"{arch} PTX ISA {isa} is newer than every toolkit buildmatrix knows (CUDA "
        f"{major_minor(newest.version)} emits ISA {major_minor(newest.ptx_isa)})"
    )
    if driver is None:
        return Judgement(
            verdict=Verdict.JIT,
            reasons=(f"{unknown}; only a driver newer than any buildmatrix knows can JIT it",),
        )
    return Judgement(
        verdict=Verdict.NONE,
        reasons=(
            f"{unknown}; driver {driver} cannot be shown to JIT it. "
            "Update buildmatrix's CUDA table",
        ),
    )


def jit_floor(
    codes: Iterable[CodeTarget], cc: ComputeCapability, facts: CudaFacts
) -> DriverVersion | None:
    """The lowest driver that can JIT some PTX entry for ``cc`` (None: none can be shown)."""
    drivers = [
        tk.driver
        for c in codes
        if c.arch.kind is CodeKind.PTX and c.ptx_isa is not None and ptx_targets(c.arch, cc)
        if (tk := ptx_toolkit(c.ptx_isa, facts)) is not None and tk.driver is not None
    ]
    return min(drivers, default=None)
