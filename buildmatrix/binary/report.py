"""What a scan found in one file: its device code, or a problem reading it.

The lowest module of the readers: the file readers (buildmatrix.binary.scan), the
forward-compatibility note reader (buildmatrix.binary.compat_note) and the image
sources all hand these on; the compatibility rules judge them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from buildmatrix.arch import Arch
from buildmatrix.binary.fatbin import EntryKind, FatbinEntry
from buildmatrix.verdict import CodeTarget, Unit

if TYPE_CHECKING:
    from packaging.version import Version


@dataclass(frozen=True, kw_only=True)
class FileReport:
    """The device code of one file. ``path`` is relative to the scanned root."""

    path: str
    format: str
    entries: tuple[FatbinEntry, ...]
    # Where the file's bytes were kept when the scan was asked to keep them (the load
    # test hands them to the driver); not part of the report.
    stored: str | None = field(default=None, compare=False)

    def _archs(self, kind: EntryKind) -> list[str]:
        archs: set[Arch] = {e.arch for e in self.entries if e.kind is kind}
        return [str(a) for a in sorted(archs, key=lambda a: a.sort_key)]

    @property
    def sass(self) -> list[str]:
        return self._archs(EntryKind.SASS)

    @property
    def ptx(self) -> list[str]:
        return self._archs(EntryKind.PTX)

    @property
    def toolkit(self) -> Version | None:
        """The newest CUDA release that wrote the file's cubins, where their notes say."""
        return max((e.toolkit for e in self.entries if e.toolkit is not None), default=None)

    def code_targets(self) -> list[CodeTarget]:
        """Loadable code only (SASS and PTX; LTO IR needs a device link first)."""
        return [
            CodeTarget(arch=e.arch, ptx_isa=e.ptx_isa)
            for e in self.entries
            if e.kind is not EntryKind.LTOIR
        ]

    def units(self) -> list[Unit]:
        """Loadable code per fatbinary container, one unit per translation unit.

        Left out: containers with only LTO IR (linked at build time) and containers
        whose cubins provably define no kernel (nvcc's device-link stub: readable
        cubins without any kernel section, entry symbol or other executable code:
        buildmatrix.binary.cubin.cubin_facts), since nothing in them is ever launched.
        """
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
        return units

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "sass": self.sass,
            "ptx": self.ptx,
            "entries": [e.to_json() for e in self.entries],
        }


def _lacking(
    entries: list[FatbinEntry], kernels: tuple[str, ...]
) -> tuple[tuple[Arch, tuple[str, ...]], ...]:
    """Each read cubin of a container that lacks kernels another read cubin of it
    defines (nvcc compiles a kernel whose definition sits under ``#if __CUDA_ARCH__
    >= 900`` into the sm_90 cubin alone), with those kernels."""
    out = []
    for e in entries:
        if e.kind is EntryKind.SASS and e.kernels is not None:
            have = set(e.kernels)
            if missing := tuple(k for k in kernels if k not in have):
                out.append((e.arch, missing))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class ScanProblem:
    path: str
    message: str
