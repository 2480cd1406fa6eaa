"""Which compressed cubins of a file are decompressed, for their kernels and toolkit,
and which PTX texts are read for their kernels.

An uncompressed cubin is read in place for its kernels (``.text.NAME`` sections, or
entry symbols: buildmatrix.binary.cubin.cubin_facts) and
the release that built it (``.note.nv.tkinfo``); a compressed one must first be
decompressed whole (buildmatrix.binary.decompress), which costs what its
uncompressed size costs (an ELF names its sections only at its end): torch 2.14.1's
``libtorch_cuda.so`` holds 2,975 compressed cubins, 33 s to decompress all against
0.4 s to list them. So a file's compressed cubins are read where the verdict needs
them, and nowhere else (docs/check.md, "Per translation unit"):

- **kernels of a unit that may lack code**, where the per-translation-unit rule looks
  at them (buildmatrix.units.judge_units): in a file whose targets do not show
  capability dispatch (no arch- or family-specific code, no container adding
  targets), each registered container that lacks SASS somewhere the file's most
  frequent target set (several tied: their union) has it; its smallest compressed
  cubin is read (nvcc compiles a translation unit's source once per arch);
- **kernels of every image of a unit of several** (cubins and PTX texts of
  different archs), where the image the driver loads on one GPU lacking a kernel
  another image defines would change the verdict (units.py,
  ``_with_kernels_lacking``): an uncompressed PTX text is read wherever its unit
  has another image (its ``.entry`` directives: buildmatrix.binary.ptx.ptx_kernels,
  at memory speed); compressed cubins and PTX texts in a file of one registered
  unit, or of several that shows no sign of dispatch (:func:`_dispatches`; in a
  file that shows one, such a unit is left out as specialised code, so the default
  verdict does not change, and ``--strict`` does not see it: docs/check.md);
- **toolkit**, the one sign of a statically linked CUDA runtime and the runtime's
  driver floor: notes are read, smallest compressed cubin first (registered ones
  first), until one of the newest CUDA major the CUDA table knows
  (buildmatrix/data/cuda.yaml) is read, or every compressed cubin was. The floor
  follows the major (minor version compatibility), so no unread cubin can raise it;
  one file may hold cubins of two releases (cuBLAS 13.1.1.3: one cubin of CUDA 12.7
  among those of 13.0), and a file of CUDA 12.x cubins is read whole.

- **whether the file defines any kernel**, where a cubin read above defines none and
  none defines one: the rest of its compressed cubins (smallest first) and its PTX
  texts are read until one defines a kernel or cannot be read. A file none of whose code defines a
  kernel launches nothing (buildmatrix.binary.report.FileReport.kernel_less); one
  kernel anywhere ends the search (a real library's first read cubin has kernels).

Each cubin or PTX text read is marked on its entry (``kernels``, ``toolkit``). A unit none of
whose cubins was read has unknown kernels (``Unit.kernels_known``), which the rule
never exempts on names; a unit is taken for a link stub only when every one of its
cubins was read and none defines a kernel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from buildmatrix.arch import Arch, Suffix, serves_wherever
from buildmatrix.binary.archnames import named_for_architecture
from buildmatrix.binary.cubin import cubin_arch, cubin_facts
from buildmatrix.binary.elf import ElfInfo
from buildmatrix.binary.fatbin import EntryKind, FatbinEntry, decompressed_cubin, ptx_text
from buildmatrix.binary.ptx import ptx_kernels
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


def _several_images(entries: Sequence[FatbinEntry]) -> set[int]:
    """Containers of two or more loadable images (SASS cubins and PTX texts of
    different archs): the driver loads one of them per GPU (the cubin of the highest
    SM that runs there, else the PTX it JIT-compiles), and each must define every
    kernel the others do (buildmatrix.units, ``_with_kernels_lacking``)."""
    images: dict[int, set[Arch]] = {}
    for e in entries:
        if e.kind is not EntryKind.LTOIR:
            images.setdefault(e.container, set()).add(e.arch)
    return {c for c, archs in images.items() if len(archs) > 1}


def _dispatches(entries: Sequence[FatbinEntry]) -> bool:
    """Whether the file shows that it picks kernels by compute capability and has
    several registered units, so that a unit with nothing for a GPU is left out of
    the default verdict (buildmatrix.binary.report.dispatch_signs; units.py, ``_registered``): its
    targets (:func:`units_needing_kernels`' tests) or a unit whose every kernel, read,
    is named for a GPU architecture."""
    groups: dict[int, list[FatbinEntry]] = {}
    for e in entries:
        if not e.embedded and e.kind is not EntryKind.LTOIR:
            groups.setdefault(e.container, []).append(e)
    units = [
        g
        for g in groups.values()
        if not all(e.kind is EntryKind.SASS and e.kernels == () for e in g)
    ]
    if len(units) < 2:
        return False  # one registered unit is judged as it is
    sets = _registered_sets(entries)
    if any(a.suffix is not Suffix.NONE for names in sets.values() for a in names):
        return True
    counts = Counter(sets.values())
    top = max(counts.values())
    common = frozenset().union(*(s for s, n in counts.items() if n == top))
    if any(not serves_wherever(common, s) for s in sets.values()):
        return True
    for g in units:
        kernels = [k for e in g for k in e.kernels or ()]
        if kernels and all(named_for_architecture(k) for k in kernels):
            return True
    return False


def _newest_major() -> int:
    """The newest CUDA major of the CUDA table (buildmatrix/data/cuda.yaml)."""
    from buildmatrix.cuda import load_cuda_facts  # the table's module: only where read

    return max(tk.version.major for tk in load_cuda_facts().toolkits)


def read_compressed(src: ByteSource, entries: list[FatbinEntry]) -> list[FatbinEntry]:
    """``entries`` with the compressed cubins the verdict needs decompressed and
    read for their kernels and toolkit, and the PTX texts it needs read for their
    kernels (see the module's docstring)."""
    several = _several_images(entries)
    out = [
        _read_ptx(src, e)
        if e.kind is EntryKind.PTX and not e.compressed and e.container in several
        else e
        for e in entries
    ]
    packed = [i for i, e in enumerate(out) if e.compressed and e.kind is EntryKind.SASS]
    smallest: dict[int, int] = {}
    for i in packed:
        c = out[i].container
        if not out[i].embedded and (c not in smallest or out[i].size < out[smallest[c]].size):
            smallest[c] = i
    chosen = {smallest[c] for c in units_needing_kernels(out) if c in smallest}
    for i in sorted(chosen):
        out[i] = _read(src, out[i])
    # every compressed image of a registered container of several images
    whole = [
        i
        for i, e in enumerate(out)
        if e.compressed
        and not e.embedded
        and e.container in several
        and e.kind is not EntryKind.LTOIR
        and i not in chosen
    ]
    if whole and not _dispatches(out):
        for i in whole:
            if out[i].kind is EntryKind.SASS:
                out[i] = _read(src, out[i])
                chosen.add(i)
            else:
                out[i] = _read_ptx(src, out[i])
    rest = sorted(
        (i for i in packed if i not in chosen), key=lambda i: (out[i].embedded, out[i].size)
    )
    # The toolkit: notes read, smallest cubin first, until one shows the newest major.
    newest = _newest_major()
    seen = max((e.toolkit.major for e in out if e.toolkit is not None), default=0)
    for i in rest:
        if seen >= newest:
            break
        out[i] = _read(src, out[i])
        toolkit = out[i].toolkit
        seen = max(seen, toolkit.major if toolkit is not None else 0)
    if any(e.kernels == () for e in out) and not any(e.kernels for e in out):
        _read_until_a_kernel(src, out)
    return out


def _read_until_a_kernel(src: ByteSource, out: list[FatbinEntry]) -> None:
    """Read ``out``'s unread PTX texts and compressed cubins (in place, PTX and the
    smallest first) until one defines a kernel or cannot be read (kernels None):
    what proves, where nothing does, that the file defines no kernel at all."""
    unread = sorted(
        (i for i, e in enumerate(out) if e.kernels is None and e.kind is not EntryKind.LTOIR),
        key=lambda i: (out[i].kind is EntryKind.SASS, out[i].size),
    )
    for i in unread:
        e = out[i]
        if e.kind is EntryKind.PTX:
            out[i] = _read_ptx(src, e)
        elif e.compressed:
            out[i] = _read(src, e)
        if out[i].kernels != ():
            return


def _read_ptx(src: ByteSource, entry: FatbinEntry) -> FatbinEntry:
    """``entry`` (a PTX text, compressed or not) with its kernels read."""
    return replace(entry, kernels=ptx_kernels(ptx_text(src, entry, name=src.name)))


def _read(src: ByteSource, entry: FatbinEntry) -> FatbinEntry:
    """``entry`` (a compressed cubin) with its kernels and toolkit note read."""
    cubin = decompressed_cubin(src, entry, name=src.name)
    kernels, toolkit = cubin_facts(cubin, header=entry.arch)
    return replace(entry, kernels=kernels, toolkit=toolkit)
