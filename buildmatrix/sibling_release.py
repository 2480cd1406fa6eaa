"""Which of a package's CUDA-tagged sibling files loads: the one its CUDA release picks.

Pure. Rule (b) of buildmatrix.optional groups files whose paths differ only by a CUDA
tag (bitsandbytes' ``libbitsandbytes_cuda126.so`` … ``_cuda132.so``). Such a package
picks its file by the CUDA release it runs with (bitsandbytes by ``torch.version.cuda``,
``cextension.py`` ``get_cuda_bnb_library_path``), the same on every GPU: where the
image shows its release outside the group, the file built for it counts on every GPU,
never the best of the group per GPU (a CUDA 12.6 image loads the 12.6 library, with
no sm_100 code, on a B200 too).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from packaging.version import Version

from buildmatrix.optional import CUDA_TAG, Loading, Siblings


def by_release(
    loading: Loading, release: Callable[[Collection[str]], tuple[Version, str] | None]
) -> Loading:
    """``loading`` with each CUDA-tag group narrowed to the members the image's CUDA
    release picks: ``release(members)`` is that release and its source, from the
    image but for those members (None: unknown; the group stays as it is). The
    member tagged with the release counts; else the newest older one of its major,
    else the oldest newer one, the order bitsandbytes' ``cextension.py``
    ``get_cuda_bnb_library_path`` loads by (a library of another major needs another
    runtime and driver floor: none of them loads, and the group fails)."""
    groups: list[Siblings] = []
    notes = list(loading.notes)
    for g in loading.groups:
        tags = {m: _release_tag(m) for m in g.members}
        found = release(g.members) if g.tag == "CUDA" else None
        if found is None or any(t is None for t in tags.values()):
            groups.append(g)
            continue
        at = (found[0].major, found[0].minor)
        same = {m: t for m, t in tags.items() if t is not None and t[0] == at[0]}
        exact = [m for m, t in same.items() if t[1] in (None, at[1])]
        older = sorted((t[1] or 0, m) for m, t in same.items() if (t[1] or 0) < at[1])
        newer = sorted((t[1] or 0, m) for m, t in same.items() if (t[1] or 0) > at[1])
        loads = tuple(exact or [m for _, m in older[-1:]] or [m for _, m in newer[:1]])
        runtime = f"the image's CUDA release is {at[0]}.{at[1]} ({found[1]})"
        chose = (
            f"{runtime}: the package loads {', '.join(loads)}"
            if loads
            else f"{runtime}: none of them is built for CUDA {at[0]}"
        )
        groups.append(replace(g, loads=loads, chose=chose))
        notes.append(f"{g.pattern}: {chose}")
    return replace(loading, groups=tuple(groups), notes=tuple(notes))


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
