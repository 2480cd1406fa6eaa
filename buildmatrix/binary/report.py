"""What a scan found in one file: its device code, or a problem reading it.

The lowest module of the readers: the file readers (buildmatrix.binary.scan), the
forward-compatibility note reader (buildmatrix.binary.compat_note) and the image
sources all hand these on; the compatibility rules judge them.

A report is immutable (its entries are frozen), so what the rules derive from it
alone (its units, its dispatch signs, its toolkit) is computed once, on first use,
and kept on it: ``check`` judges one image on many GPUs and drivers (``drivers``,
``affinity``, ``smoke``), and none of these depends on the GPU or the driver; nor
does its verdict on one GPU where no PTX JIT-compiles for it (``verdicts``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from buildmatrix.arch import Arch, ComputeCapability, Suffix, serves_wherever
from buildmatrix.binary.archnames import named_for_architecture
from buildmatrix.binary.fatbin import EntryKind, FatbinEntry

if TYPE_CHECKING:
    from packaging.version import Version

    # The rules' types, imported where a report is judged: buildmatrix.verdict brings
    # in the CUDA table's module, which inspect (listing only) never needs.
    from buildmatrix.verdict import CodeTarget, FileJudgement, Lacking, Unit


@dataclass(frozen=True, kw_only=True, slots=True)
class Links:
    """How an ELF file is loaded, as the dynamic loader and Python's importer see it
    (read by buildmatrix.binary.dynamic): its ``DT_SONAME`` and ``DT_NEEDED`` names
    (glibc ``elf/dl-load.c`` ``_dl_map_object_deps`` maps every DT_NEEDED of an
    object it loads), whether it is a program (``ET_EXEC``, or ``ET_DYN`` with a
    ``PT_INTERP``: the kernel runs it through that interpreter, or with ``DF_1_PIE``:
    a static-pie program, which has none), and whether it is a
    Python extension module (its name ends in ``.so`` and it exports
    ``PyInit_<name>``: CPython's ``Python/importdl.c``
    ``_PyImport_LoadDynamicModuleWithSpec`` looks that symbol up). ``unread``: why
    its DT_NEEDED entries could not be read (they may then name any library)."""

    soname: str | None = None
    needed: tuple[str, ...] = ()
    program: bool = False
    python_module: bool = False
    unread: str | None = None


@dataclass(frozen=True, kw_only=True)
class FileReport:
    """The device code of one file. ``path`` is relative to the scanned root."""

    path: str
    format: str
    entries: tuple[FatbinEntry, ...]
    # Where the file's bytes were kept when the scan was asked to keep them (the load
    # test hands them to the driver); not part of the report.
    stored: str | None = field(default=None, compare=False)
    # How an image's ELF file is loaded (None: not read, as for a file given alone);
    # not part of the report either.
    links: Links | None = field(default=None, compare=False)

    def _archs(self, kind: EntryKind) -> list[str]:
        archs: set[Arch] = {e.arch for e in self.entries if e.kind is kind}
        return [str(a) for a in sorted(archs, key=lambda a: a.sort_key)]

    @property
    def sass(self) -> list[str]:
        return self._archs(EntryKind.SASS)

    @property
    def ptx(self) -> list[str]:
        return self._archs(EntryKind.PTX)

    @cached_property
    def toolkit(self) -> Version | None:
        """The newest CUDA release that wrote the file's cubins, where their notes say."""
        return max((e.toolkit for e in self.entries if e.toolkit is not None), default=None)

    @cached_property
    def kernel_less(self) -> bool:
        """Whether the file's device code provably defines no kernel: it holds loadable
        code (cubins, PTX texts), every piece of it was read (buildmatrix.binary.kernels
        reads them all where none read first defines one), and no cubin has an entry
        symbol (cuobjdump's ENTRY) nor any PTX text an ``.entry``. Nothing in such a
        file can be launched (libcufftw's lone sm_52 cubin, sgl-kernel's
        ``spatial_ops``), so no GPU can fail for it: check lists it and judges the
        image as if it held no device code (buildmatrix.check.run_check)."""
        loadable = [e for e in self.entries if e.kind is not EntryKind.LTOIR]
        return bool(loadable) and all(e.kernels == () for e in loadable)

    def code_targets(self) -> list[CodeTarget]:
        """Loadable code only (SASS and PTX; LTO IR needs a device link first)."""
        from buildmatrix.verdict import CodeTarget

        return [
            CodeTarget(arch=e.arch, ptx_isa=e.ptx_isa)
            for e in self.entries
            if e.kind is not EntryKind.LTOIR
        ]

    def units(self) -> list[Unit]:
        """Loadable code per fatbinary container, one unit per translation unit
        (:attr:`code_units`, as a list of its own)."""
        return list(self.code_units)

    @cached_property
    def code_units(self) -> tuple[Unit, ...]:
        """Loadable code per fatbinary container, one unit per translation unit.

        Left out: containers with only LTO IR (linked at build time) and containers
        whose cubins provably define no kernel (nvcc's device-link stub: readable
        cubins without any kernel section, entry symbol or other executable code:
        buildmatrix.binary.cubin.cubin_facts), since nothing in them is ever launched.
        """
        from buildmatrix.verdict import CodeTarget, Unit

        groups: dict[int, list[FatbinEntry]] = {}
        for e in self.entries:
            if e.kind is not EntryKind.LTOIR:
                groups.setdefault(e.container, []).append(e)
        units = []
        for index, entries in sorted(groups.items()):
            # Every cubin read and none defines a kernel (a compressed one not read
            # may hold kernels: it counts).
            if all(e.kind is EntryKind.SASS and e.kernels == () for e in entries):
                continue  # no kernel at all: a link stub
            kernels = tuple(dict.fromkeys(k for e in entries for k in e.kernels or ()))
            codes = tuple(CodeTarget(arch=e.arch, ptx_isa=e.ptx_isa) for e in entries)
            units.append(
                Unit(
                    codes=codes,
                    kernels=kernels,
                    index=index,
                    kernels_known=any(e.kernels is not None for e in entries),
                    embedded=any(e.embedded for e in entries),
                    lacking=_lacking(entries, kernels),
                )
            )
        return tuple(units)

    @cached_property
    def dispatch_signs(self) -> str | None:
        """:func:`dispatch_signs` of :attr:`code_units`."""
        return dispatch_signs(self.code_units)

    @cached_property
    def verdicts(self) -> dict[tuple[ComputeCapability, bool], FileJudgement | None]:
        """The file's verdict per (compute capability, strict) where no driver enters it,
        None where one does (kept by buildmatrix.units.judge_file)."""
        return {}

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "sass": self.sass,
            "ptx": self.ptx,
            "entries": self._entries_json,
        }

    @cached_property
    def _entries_json(self) -> list[dict[str, Any]]:
        """The entries' JSON, made once: check --json prints each file twice (at the
        top and under its platform), and cuFFT 12 alone has 24,454 entries."""
        return [e.to_json() for e in self.entries]


def _lacking(entries: list[FatbinEntry], kernels: tuple[str, ...]) -> tuple[Lacking, ...]:
    """Each read image of a container (a cubin or a PTX text) that lacks kernels
    another read image of it defines, with those kernels and the images that define
    them: nvcc compiles a kernel whose definition sits under ``#if __CUDA_ARCH__ >=
    900`` into the sm_90 cubin alone, and one under ``__CUDA_ARCH__ < 900`` into the
    compute_80 PTX and not the sm_90 cubin."""
    from buildmatrix.verdict import Lacking

    read = [e for e in entries if e.kind is not EntryKind.LTOIR and e.kernels is not None]
    out = []
    for e in read:
        have = set(e.kernels or ())
        if missing := tuple(k for k in kernels if k not in have):
            others = (o.arch for o in read if not have.issuperset(o.kernels or ()))
            by = tuple(dict.fromkeys(others))
            out.append(Lacking(image=e.arch, kernels=missing, defined_by=by))
    return tuple(out)


def _named(unit: Unit) -> bool:
    """Every kernel of the unit, read, is named for a GPU architecture."""
    return (
        unit.kernels_known
        and bool(unit.kernels)
        and all(named_for_architecture(k) for k in unit.kernels)
    )


def dispatch_signs(units: Sequence[Unit]) -> str | None:
    """What shows that a file chooses its kernels by the GPU's compute capability, or
    None. Read from its registered containers: arch- or family-specific code (it runs
    on one GPU or family alone, so whatever launches it checks first); a container
    that adds targets the file's most frequent target set (several tied: their union)
    does not serve (cuSOLVER 12's per-arch ``compute_90``, ``compute_100``, ... units);
    a container whose every kernel is named for an architecture (cuBLAS 13's
    ``cutlass_70_*``). The per-translation-unit rule (buildmatrix.units.judge_units)
    leaves a container out on such a sign."""
    registered = [u for u in units if not u.embedded]
    if any(c.arch.suffix is not Suffix.NONE for u in registered for c in u.codes):
        return "the file holds arch- or family-specific code"
    sets = [frozenset(c.arch for c in u.codes) for u in registered]
    counts = Counter(sets)
    top = max(counts.values(), default=0)
    common: frozenset[Arch] = frozenset().union(*(s for s, n in counts.items() if n == top))
    for s in sets:
        added = sorted(str(a) for a in s if not serves_wherever(common, frozenset({a})))
        if added:
            targets = ", ".join(added)
            return f"the file holds units for targets its common ones do not serve ({targets})"
    named = next((u for u in registered if _named(u)), None)
    if named is not None:
        return f"the kernels of its container {named.index} are named for a GPU architecture"
    return None


@dataclass(frozen=True, kw_only=True)
class ScanProblem:
    path: str
    message: str
