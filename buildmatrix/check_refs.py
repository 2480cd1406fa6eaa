"""``check`` over the references it is given: each image read (buildmatrix/image/),
judged on every platform entry behind which a target GPU can sit
(buildmatrix/multiplatform.py) by check's rules (buildmatrix/check.py), the images
sharing the layer cache. :func:`check_refs` returns one :class:`CheckRun`; the CLI
prints it and nothing here prints (bytes read go to a progress callback).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from buildmatrix.check import CheckResult, Options, run_check
from buildmatrix.cuda import CudaFacts
from buildmatrix.image.cache import LayerCache, use
from buildmatrix.image.containerd_store import Store
from buildmatrix.image.open import scan_image
from buildmatrix.image.platform import DEFAULT_PLATFORM
from buildmatrix.image.scanned import ScannedImage
from buildmatrix.multiplatform import PlatformResults, behind, serves, to_judge
from buildmatrix.profiles import ProfileSet


class Progress(Protocol):
    """What shows the bytes read of one image: called with the bytes read since the
    last call (buildmatrix.image.scanned.Progress), then ``done`` once."""

    def __call__(self, n: int) -> None: ...

    def done(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class CheckRun:
    """Every reference judged, in the order given."""

    results: tuple[PlatformResults, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)


@dataclass(frozen=True, kw_only=True)
class _Reading:
    """How one run reads and judges (the same for every reference)."""

    profiles: ProfileSet
    options: Options
    facts: CudaFacts
    containerd: Store
    progress: Callable[[], Progress] | None


def check_refs(
    refs: Sequence[str],
    *,
    profiles: ProfileSet,
    options: Options,
    facts: CudaFacts,
    platform: str | None = None,
    cache: LayerCache | None = None,
    containerd: Store | None = None,
    progress: Callable[[], Progress] | None = None,
) -> CheckRun:
    """Judge each of ``refs``: the entry ``platform`` (--platform) names, else (with a
    snapshot that recorded its CPU) the entry that node pulls, else every entry the
    image offers behind which a target GPU can sit. ``progress`` makes a fresh display
    for each image read."""
    how = _Reading(
        profiles=profiles,
        options=options,
        facts=facts,
        containerd=containerd or Store.from_env(),
        progress=progress,
    )
    node_platform = None
    snap = options.snapshot
    if platform is None and snap is not None and snap.platform is not None:
        platform = node_platform = snap.platform  # the entry the node pulls, only that
    results = []
    with use(cache):
        for ref in refs:
            judged = _check_one(ref, platform, how)
            results.append(_not_pulled(judged, node_platform) if node_platform else judged)
    return CheckRun(results=tuple(results))


def _judge(
    ref: str, p: str, asked: str | None, how: _Reading
) -> tuple[str, ScannedImage, CheckResult]:
    """The entry of ``ref`` for platform ``p``, named by the platform asked for or
    picked from an index; a lone image judged by default, by its config's own."""
    shown = how.progress() if how.progress is not None else None
    try:
        image = scan_image(ref, platform=p, progress=shown, containerd=how.containerd)
    finally:
        if shown is not None:
            shown.done()
    lone = len(image.offered) <= 1 and asked is None
    name = (image.config.platform or p) if lone else p
    return name, image, run_check(image, how.profiles, how.options, how.facts)


def _check_one(ref: str, platform: str | None, how: _Reading) -> PlatformResults:
    """Check one REF: the entry ``platform`` names, else the default platform's
    entry and every other the image offers behind which a target GPU can sit
    (buildmatrix.multiplatform)."""
    first, image, result = _judge(ref, platform or DEFAULT_PLATFORM, platform, how)
    judged = [(first, result)]
    also = list(image.also)  # what another containerd generation runs instead
    if platform is None:
        platforms = behind([t.target for t in result.targets], how.profiles)
        more = to_judge(image.offered, first, platforms)
        if more and not serves(first, platforms):
            judged, also = [], []  # judged for its targets only: no target GPU sits behind it
        for p in more:
            name, other_image, other = _judge(ref, p, platform, how)
            judged.append((name, other))
            also += other_image.also
    for request in dict.fromkeys(also):
        _, _, other = _judge(ref, request, platform, how)
        judged.append((request, other))
    return PlatformResults(results=tuple(judged))


def _not_pulled(judged: PlatformResults, node: str) -> PlatformResults:
    """A single-platform image of another CPU than the snapshot's node is a failure:
    the node's runtime finds nothing to pull (containerd ``images.Manifest`` matches
    a lone manifest's config platform too)."""
    platform, result = judged.results[0]
    offered = result.image.offered
    if len(offered) != 1 or serves(offered[0], [node]):
        return judged
    why = (
        f"the image is for {offered[0]} only; the node ({node}, the snapshot's cpu) "
        "would find no image to pull"
    )
    return PlatformResults(results=((platform, replace(result, problems=[*result.problems, why])),))
