"""Which of a package's CUDA-tagged sibling files loads: the one its CUDA release picks.

Pure. Rule (b) of buildmatrix.optional groups files whose paths differ only by a CUDA
tag (bitsandbytes' ``libbitsandbytes_cuda126.so`` … ``_cuda132.so``). Such a package
picks its file by the CUDA release it runs with (bitsandbytes by ``torch.version.cuda``,
``cextension.py`` ``get_cuda_bnb_library_path``), the same on every GPU: where the
image shows its release outside the group, the file built for it counts on every GPU,
never the best of the group per GPU (a CUDA 12.6 image loads the 12.6 library, with
no sm_100 code, on a B200 too). Where the image shows several releases, any may be
the one the package runs with, and the worst of their files counts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from packaging.version import Version

from buildmatrix.optional import CUDA_TAG, Loading, Siblings


def by_release(
    loading: Loading, signs: Callable[[Collection[str]], Sequence[tuple[Version, str]]]
) -> Loading:
    """``loading`` with each CUDA-tag group narrowed to the members the image's CUDA
    release may pick: ``signs(members)`` are the releases the image shows, with their
    sources, but for those members' own (none: unknown; the group stays as it is).
    Per release, the member tagged with it; else the newest older one of its major,
    else the oldest newer one: the order bitsandbytes' ``cextension.py``
    ``get_cuda_bnb_library_path`` loads by. An image's signs may disagree (a library
    built by a newer release than the one its package was built for): each one's
    member may be the one loaded, and the worst of them counts (choose). Signs of a
    major no member is built for pick none; where no sign picks one, none loads (a
    library of another major needs another runtime), and the group fails."""
    groups: list[Siblings] = []
    notes = list(loading.notes)
    for g in loading.groups:
        tags = {m: _release_tag(m) for m in g.members}
        found = sorted(set(signs(g.members))) if g.tag == "CUDA" else []
        if not found or any(t is None for t in tags.values()):
            groups.append(g)
            continue
        picks = {_pick(tags, (v.major, v.minor)): (v, source) for v, source in found}
        loads = tuple(sorted(m for m in picks if m is not None))
        why = "; ".join(
            f"CUDA {v.major}.{v.minor} ({source}) loads {m or 'none of them'}"
            for m, (v, source) in sorted(picks.items(), key=lambda x: x[1])
        )
        chose = f"by the CUDA releases the image shows, the package loads one of them: {why}"
        groups.append(replace(g, loads=loads, chose=chose))
        notes.append(f"{g.pattern}: {chose}")
    return replace(loading, groups=tuple(groups), notes=tuple(notes))


def _pick(tags: dict[str, tuple[int, int | None] | None], at: tuple[int, int]) -> str | None:
    """The member the release ``at`` loads (bitsandbytes' order), or None."""
    same = {m: t for m, t in tags.items() if t is not None and t[0] == at[0]}
    exact = sorted(m for m, t in same.items() if t[1] in (None, at[1]))
    older = sorted((t[1] or 0, m) for m, t in same.items() if (t[1] or 0) < at[1])
    newer = sorted((t[1] or 0, m) for m, t in same.items() if (t[1] or 0) > at[1])
    if exact:
        return exact[0]
    if older:
        return older[-1][1]
    return newer[0][1] if newer else None


def _release_tag(path: str) -> tuple[int, int | None] | None:
    """The CUDA release a path's CUDA tags name: ``cuda126`` 12.6, ``cu118`` 11.8,
    ``cu92`` 9.2, ``cuda12x`` and ``cu13`` a major alone; None where its tags differ."""
    found: set[tuple[int, int | None]] = set()
    for tag in CUDA_TAG.findall(path):
        digits = tag.lstrip("cuda").rstrip("x")
        if len(digits) == 3 or int(digits) > 20:  # cu118, cu126; cu92 (CUDA 9.2)
            found.add((int(digits[:-1]), int(digits[-1])))
        else:  # cu12, cuda13x
            found.add((int(digits), None))
    return found.pop() if len(found) == 1 else None
