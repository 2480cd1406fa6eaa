"""Which compressed cubins of a file are decompressed, for their kernels and toolkit.

An uncompressed cubin is read in place for its kernels (``.text.NAME`` sections, or
entry symbols: buildmatrix.binary.cubin.cubin_facts) and
the release that built it (``.note.nv.tkinfo``); a compressed one must first be
decompressed whole (buildmatrix.binary.decompress), which costs what its
uncompressed size costs: torch 2.14.1's ``libtorch_cuda.so`` holds 2,975 compressed
cubins, 33 s to decompress all against 0.4 s to list them. So a file's compressed
cubins are read where the verdict needs them, and nowhere else
(docs/check.md, "Per translation unit"):

- **kernels**, where the per-translation-unit rule looks at them
  (buildmatrix.units.judge_units): in a file whose targets do not show capability
  dispatch (no arch- or family-specific code, no container adding targets), each
  registered container that lacks SASS somewhere the file's most frequent
  target set (several tied: their union) has it (a container that may lack code
  where the rest of the file runs); its smallest compressed cubin is read: nvcc
  compiles a translation unit's source once per arch, so its cubins define the
  same kernels (cuBLAS 13: 7 cubins, one for each of 7 such units, where all their
  cubins would be 30 and ~0.3 s);
- **toolkit**, the one sign of a statically linked CUDA runtime: where none was read
  for kernels, the file's smallest compressed cubin (a registered one if any).

Each cubin read is marked on its entry (``kernels``, ``toolkit``). A unit none of
whose cubins was read has unknown kernels (``Unit.kernels_known``), which the rule
never exempts on names; a unit is taken for a link stub only when every one of its
cubins was read and none defines a kernel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from buildmatrix.arch import Arch, Suffix, serves_wherever
from buildmatrix.binary.cubin import cubin_arch, cubin_facts
from buildmatrix.binary.elf import ElfInfo
from buildmatrix.binary.fatbin import EntryKind, FatbinEntry, decompressed_cubin
from buildmatrix.binary.source import ByteSource


def cubin_entry(src: ByteSource, info: ElfInfo) -> FatbinEntry:
    """A CUDA cubin file (an ELF file of machine EM_CUDA) as one SASS entry, with the
    kernels it defines and the release that built it: a cubin on its own or one found
    in a library's data (buildmatrix.binary.embedded)."""
    kernels, toolkit = cubin_facts(src)
    return FatbinEntry(
        kind=EntryKind.SASS,
        arch=cubin_arch(src, info),
        ptx_isa=None,
        compressed=False,
        size=src.size,
        offset=0,
        kernels=kernels,
        toolkit=toolkit,
    )


def _registered_sets(entries: Sequence[FatbinEntry]) -> dict[int, frozenset[Arch]]:
    """The loadable targets (SASS and PTX) of each registered container."""
    sets: dict[int, set[Arch]] = {}
    for e in entries:
        if not e.embedded and e.kind is not EntryKind.LTOIR:
            sets.setdefault(e.container, set()).add(e.arch)
    return {c: frozenset(s) for c, s in sets.items()}


def units_needing_kernels(entries: Sequence[FatbinEntry]) -> set[int]:
    """Registered containers whose kernels the per-translation-unit rule may use: in a
    file whose targets do not already show that it chooses kernels by capability (no
    arch- or family-specific code, no container adding targets the file's most
    frequent set does not serve), those that lack code somewhere that set has it."""
    sets = _registered_sets(entries)
    if any(a.suffix is not Suffix.NONE for names in sets.values() for a in names):
        return set()  # the file chooses its kernels by capability (units.judge_units)
    if len(set(sets.values())) < 2:
        return set()  # every container has the same targets: none lacks code alone
    counts = Counter(sets.values())
    top = max(counts.values())
    common = frozenset().union(*(s for s, n in counts.items() if n == top))
    if any(not serves_wherever(common, s) for s in sets.values()):
        return set()  # a container adds targets: the file dispatches (units.judge_units)
    return {c for c, s in sets.items() if not serves_wherever(s, common)}


def read_compressed(src: ByteSource, entries: list[FatbinEntry]) -> list[FatbinEntry]:
    """``entries`` with the compressed cubins the verdict needs decompressed and
    read for their kernels and toolkit (see the module's docstring)."""
    packed = [i for i, e in enumerate(entries) if e.compressed and e.kind is EntryKind.SASS]
    if not packed:
        return entries
    smallest: dict[int, int] = {}
    for i in packed:
        c = entries[i].container
        if not entries[i].embedded and (
            c not in smallest or entries[i].size < entries[smallest[c]].size
        ):
            smallest[c] = i
    chosen = {smallest[c] for c in units_needing_kernels(entries) if c in smallest}
    if not chosen:
        registered = [i for i in packed if not entries[i].embedded] or packed
        chosen.add(min(registered, key=lambda i: entries[i].size))
    out = list(entries)
    for i in sorted(chosen):
        cubin = decompressed_cubin(src, entries[i], name=src.name)
        kernels, toolkit = cubin_facts(cubin, header=entries[i].arch)
        out[i] = replace(entries[i], kernels=kernels, toolkit=toolkit)
    return out
