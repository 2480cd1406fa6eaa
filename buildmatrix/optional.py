"""Which files of an image always load, and which a package loads only where they run.

Pure: the image's files with device code and how each ELF file is loaded
(buildmatrix.binary.report.Links) in, a :class:`Loading` out; per target GPU,
buildmatrix.optional_choice.choose sums the files' verdicts up in two levels (docs/compatibility.md,
"Files a package loads only where they run"):

- the code that always loads decides the verdict;
- an optional file without code for the GPU is named as skipped there, with the
  evidence that makes it optional, never silently and never as a failure.

A file is optional only on evidence a reviewer can check in the image itself:

(a) its device code is all arch- or family-specific (``sm_90a``, ``sm_100f``,
    ``compute_90a``) and it is no program: it runs on one GPU or one family alone,
    so whatever uses it checks the GPU first (CUDA C++ Programming Guide, "Feature
    Set Compiler Targets");
(b) it is one of sibling files whose paths differ only by a CUDA tag (``cuda126``,
    ``cu13``) or an arch tag (``sm90``, ``sm_100a``): the package loads one of them,
    so ONE must run (the group fails where none does; the best counts). A CUDA tag
    is chosen by the CUDA release, not by the GPU: where the image shows its release
    outside the group (buildmatrix.sibling_release), the member built for it counts,
    on every GPU;
(c) it is a standalone cubin, fatbinary or PTX file: data a program hands to the
    driver by name (``cuModuleLoad``), one per GPU, not a file the loader maps;
(d) it is a shared library that nothing links at start: no ELF file that always
    loads names it (by SONAME, file name or a symlink's name) in DT_NEEDED, and it is
    no program and no Python extension module, so only ``dlopen`` loads it. What
    a file that always loads names in DT_NEEDED always loads too (glibc maps every
    DT_NEEDED of an object it loads), and so on down;
(e) the package's own loader uses it only on some GPUs: a module named in
    ``data/loaders.yaml`` (buildmatrix.loaders), for the package versions whose
    source was read, with the file and function that check the capability first.
    Outside its range it is skipped; inside, it counts as a file that always loads.

Where it cannot tell, a file counts: a file whose DT_NEEDED could not be read may
name any library, and an image without any program or Python extension module shows
nothing of what loads its libraries, so (d) is then not used at all; files the
source read without their links (one file given on the command line) all count.
"""

from __future__ import annotations

import posixpath
import re
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from buildmatrix.binary.report import FileReport, Links
from buildmatrix.loaders import Gate, gate_for

DATA_FORMATS = frozenset({"cubin", "fatbin", "ptx"})

# A CUDA tag (cuda126, cuda12x, cu13) or an arch tag (sm90, sm_100a, compute_90a) as a
# whole word of a path: between separators, never inside a longer name (libcudart,
# cutlass_sm90_kernel's "sm90" is a word, "libcublas" holds none).
CUDA_TAG = re.compile(r"(?<![A-Za-z0-9])cu(?:da)?\d{2,3}x?(?![A-Za-z0-9])")
_TAGS = (
    ("CUDA", CUDA_TAG),
    ("arch", re.compile(r"(?<![A-Za-z0-9])(?:sm_?|compute_)\d{2,3}[af]?(?![A-Za-z0-9])")),
)


class Rule(StrEnum):
    """Why a file may be skipped on a GPU it has no code for (the module's rules)."""

    SPECIFIC = "arch-specific code, loaded after a capability check"
    SIBLING = "one of sibling files the package chooses from"
    DATA = "a cubin/fatbinary/PTX file kept as data, loaded by name per GPU"
    DLOPEN = "a library nothing links at start, loaded by dlopen on demand"
    LOADER = "the package's loader uses it only on some GPUs"


@dataclass(frozen=True, kw_only=True)
class Optional:
    """A file that may be skipped, by ``rule``; ``why``: the evidence."""

    path: str
    rule: Rule
    why: str


@dataclass(frozen=True, kw_only=True)
class Siblings:
    """Rule (b): files whose paths differ only by a ``tag`` (CUDA or arch) tag;
    ``pattern``: their path with the tag replaced by ``{tag}``."""

    members: tuple[str, ...]
    tag: str
    pattern: str
    # The members the image's CUDA releases pick (None: any may load; the best
    # counts), of which the worst counts, and why.
    loads: tuple[str, ...] | None = None
    chose: str = ""


@dataclass(frozen=True, kw_only=True)
class Loading:
    """An image's files with device code by how they load. A file neither optional
    nor a sibling always loads. ``deps``: for an optional file or a sibling, the
    files with device code loaded with it alone (its DT_NEEDED, down), which it
    needs to run. ``gates``: the optional files of rule (e), which count on the GPUs
    their package's loader uses them on."""

    optional: Mapping[str, Optional] = field(default_factory=dict)
    groups: tuple[Siblings, ...] = ()
    deps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    holds: Mapping[str, str] = field(default_factory=dict)  # each file's code, by path
    gates: Mapping[str, Gate] = field(default_factory=dict)

    def required(self, path: str) -> bool:
        return path not in self.optional and not any(path in g.members for g in self.groups)

    def to_json(self) -> dict[str, object]:
        return {
            "optional": [
                {"path": o.path, "rule": o.rule.name.lower(), "why": o.why}
                for o in self.optional.values()
            ],
            "groups": [
                {"members": list(g.members), "tag": g.tag, "pattern": g.pattern}
                for g in self.groups
            ],
            "notes": list(self.notes),
        }


EVERY_FILE = Loading(notes=("every file counts",))


def classify(
    files: Iterable[FileReport],
    links: Mapping[str, Links] | None,
    *,
    symlinks: Mapping[str, str] | None = None,
    preload: str = "",
    gates: Sequence[Gate] = (),
    paths: Collection[str] = (),
    preload_file: bool = False,
) -> Loading:
    """Each file with device code (static archives are never loaded, and left out)
    by the rules (a) to (e), from ``links`` (every ELF file of the image that holds
    device code or loads others; None: not read, every file counts), the image's
    ``symlinks`` (a DT_NEEDED name may be a link's), its ``LD_PRELOAD``, whether it
    holds ``/etc/ld.so.preload`` (``preload_file``; its names are not read), and for
    rule (e) the ``gates`` table and every path of the image (``paths``: the
    package's version lies in them)."""
    if links is None:
        return EVERY_FILE
    code = {f.path: f for f in files if f.format != "archive"}
    optional: dict[str, Optional] = {}
    gated: dict[str, Gate] = {}
    notes: list[str] = []
    for path in code:
        gate, why_not = gate_for(path, gates, paths) if gates else (None, "")
        if gate is not None:
            gated[path] = gate
        elif why_not:
            notes.append(why_not)
    for path, f in code.items():
        units = f.code_units
        if path in gated:
            continue  # rule (e): the package's own check decides, not the file's code
        if f.format in DATA_FORMATS:
            what = {"cubin": "a cubin", "fatbin": "a fatbinary", "ptx": "a PTX text"}[f.format]
            optional[path] = Optional(
                path=path,
                rule=Rule.DATA,
                why=f"{what} file, no ELF program or library: a program loads it by name",
            )
        elif units and all(u.specific for u in units) and not _program(links.get(path)):
            # (a) says what imports or opens the file checks the GPU first; a program
            # is run as it is, nothing checks the GPU before its own start.
            why = "all its device code is arch- or family-specific"
            optional[path] = Optional(path=path, rule=Rule.SPECIFIC, why=why)
    groups = _siblings([p for p in code if p not in optional and p not in gated])
    grouped = {m for g in groups for m in g.members}
    names = _names(links, symlinks or {})
    roots = [
        p
        for p, ln in links.items()
        if (ln.program or ln.python_module) and p not in optional and p not in grouped
    ]
    roots += [p for p in code if p not in links and p not in optional and p not in grouped]
    for word in re.split(r"[:\s]+", preload):
        roots += sorted(names.get(word.rpartition("/")[2], ()))
    # a gated module is imported on every GPU (its check comes before its kernels):
    # what it names in DT_NEEDED always loads with it
    roots += [p for p in gated if p in links and p not in roots]
    required = _closure(roots, links, names)
    unread = sorted(p for p, ln in links.items() if ln.unread)
    if unread:
        notes.append(
            f"{unread[0]}: its DT_NEEDED entries cannot be read ({links[unread[0]].unread}), "
            "so it may load any library: no library is taken for one loaded by dlopen"
        )
        required |= {p for p in code if p not in optional and p not in grouped and p not in gated}
    elif preload_file:
        notes.append(
            "the image holds /etc/ld.so.preload, whose libraries glibc's loader maps into "
            "every process (elf/rtld.c dl_main); its names are not read, so no library is "
            "taken for one loaded by dlopen"
        )
        required |= {p for p in code if p not in optional and p not in grouped and p not in gated}
    elif not any(ln.program or ln.python_module for ln in links.values()):
        notes.append(
            "the image holds no program and no Python extension module: what loads its "
            "libraries is not in it, so no library is taken for one loaded by dlopen"
        )
        required |= {p for p in code if p not in optional and p not in grouped and p not in gated}
    # A sibling that a file which always loads names in DT_NEEDED always loads.
    pruned = [tuple(m for m in g.members if m not in required) for g in groups]
    groups = [
        Siblings(members=members, tag=g.tag, pattern=g.pattern)
        for g, members in zip(groups, pruned, strict=True)
        if len(members) > 1
    ]
    grouped = {m for g in groups for m in g.members}
    needers: dict[str, list[str]] = {}  # each file, and the files that name it
    for n, ln in links.items():
        for name in ln.needed:
            for p in names.get(name, ()):
                needers.setdefault(p, []).append(n)
    for path in code:
        if path in required or path in optional or path in grouped or path in gated:
            continue
        by = sorted(set(needers.get(path, ())))
        why = (
            f"only {_few(by)} name{'s' if len(by) == 1 else ''} it in DT_NEEDED, and "
            f"{'it does' if len(by) == 1 else 'they do'} not always load"
            if by
            else "no ELF file of the image names it in DT_NEEDED"
        )
        optional[path] = Optional(
            path=path,
            rule=Rule.DLOPEN,
            why=f"{why}; it is no program and no Python extension module",
        )
    for path, gate in gated.items():
        optional[path] = Optional(
            path=path,
            rule=Rule.LOADER,
            why=f"the package's loader uses it only on compute capability {gate.gpus} "
            f"({gate.cite})",
        )
    deps = {}
    for path in [*optional, *grouped]:
        reach = _closure([path], links, names) - required - {path}
        # arch-specific files loaded with it are launched after a check all the same
        mine = sorted(p for p in reach if p in code and _needs(optional.get(p)))
        if mine:
            deps[path] = tuple(mine)
    holds = {p: _archs(f) for p, f in code.items() if p in optional or p in grouped}
    return Loading(
        optional=optional,
        groups=tuple(groups),
        deps=deps,
        notes=tuple(notes),
        holds=holds,
        gates=gated,
    )


def _archs(f: FileReport) -> str:
    return ", ".join(dict.fromkeys([*f.sass, *f.ptx])) + " only"


def _program(ln: Links | None) -> bool:
    return ln is not None and ln.program


def _needs(o: Optional | None) -> bool:
    """Whether a file loaded with another is needed to run: not where it is data or
    holds only arch-specific code (launched after a check)."""
    return o is None or o.rule not in (Rule.SPECIFIC, Rule.DATA)


def _few(paths: list[str]) -> str:
    more = f" and {len(paths) - 2} more" if len(paths) > 2 else ""
    return ", ".join(paths[:2]) + more


def _siblings(paths: list[str]) -> list[Siblings]:
    """Rule (b): the paths that differ from another only by one kind of tag."""
    found: list[Siblings] = []
    for tag, pattern in _TAGS:
        by_key: dict[str, list[str]] = {}
        for p in paths:
            key = pattern.sub("{" + tag + "}", p)
            if key != p:
                by_key.setdefault(key, []).append(p)
        for key, members in sorted(by_key.items()):
            taken = {m for g in found for m in g.members}
            free = [m for m in members if m not in taken]
            if len(free) > 1:
                found.append(Siblings(members=tuple(sorted(free)), tag=tag, pattern=key))
    return found


def _names(links: Mapping[str, Links], symlinks: Mapping[str, str]) -> dict[str, set[str]]:
    """Each name a DT_NEEDED entry may use for a file of ``links``: its file name, its
    SONAME and the name of each symlink to it (followed through other symlinks)."""
    names: dict[str, set[str]] = {}
    for path, ln in links.items():
        names.setdefault(path.rpartition("/")[2], set()).add(path)
        if ln.soname:
            names.setdefault(ln.soname, set()).add(path)
    for link in symlinks:
        target = _resolve(link, symlinks)
        if target is not None and target in links:
            names.setdefault(link.rpartition("/")[2], set()).add(target)
    return names


def _resolve(link: str, symlinks: Mapping[str, str]) -> str | None:
    """Where ``link`` leads inside the image (relative to the root), or None."""
    path = link
    for _ in range(40):  # Linux's MAXSYMLINKS
        target = symlinks.get(path)
        if target is None:
            return path
        base = "" if target.startswith("/") else posixpath.dirname(path)
        path = posixpath.normpath(posixpath.join("/", base, target)).lstrip("/")
    return None


def _closure(
    start: Iterable[str], links: Mapping[str, Links], names: Mapping[str, set[str]]
) -> set[str]:
    """``start`` and every file their DT_NEEDED names, down (every file of a name: the
    loader takes one of them; counting all is the safe side)."""
    seen = set(start)
    todo = deque(seen)
    while todo:
        ln = links.get(todo.popleft())
        for name in ln.needed if ln is not None else ():
            for p in names.get(name, ()):
                if p not in seen:
                    seen.add(p)
                    todo.append(p)
    return seen
