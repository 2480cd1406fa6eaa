"""Whether the images a node must run fit it: each one read (any REF check takes),
judged on the node's GPUs by check's rules (buildmatrix/check.py) and, with
``--load-test``, its device code loaded by the driver (node/loadtest.py).

An image that cannot be read is a failed check, not an abort: the node must still be
reported (and marked failed) when the registry is down (docs/smoke.md).
"""

from __future__ import annotations

import platform as host
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from buildmatrix.check import CheckResult, Options, run_check
from buildmatrix.cuda import CudaFacts
from buildmatrix.errors import BuildmatrixError
from buildmatrix.image.containerd_store import Store
from buildmatrix.image.open import scan_image, scan_node_first
from buildmatrix.image.platform import DEFAULT_PLATFORM
from buildmatrix.node.labels import VerifiedImage
from buildmatrix.node.loadtest import load_test as run_load_test
from buildmatrix.node.poolimages import node_platform
from buildmatrix.node.results import LoadResult
from buildmatrix.profiles import ProfileSet
from buildmatrix.snapshot import Snapshot


@dataclass(frozen=True, kw_only=True)
class ImageOutcome:
    """One image on the node: its check, its load tests, or why it could not be read
    (``result`` stays set when only the load test failed to run)."""

    ref: str
    result: CheckResult | None = None
    loads: tuple[LoadResult, ...] = ()
    error: BuildmatrixError | None = None


@dataclass(frozen=True, kw_only=True)
class ImageChecks:
    """How each image is read and judged (smoke's options, docs/smoke.md)."""

    require_sass: bool = False
    load_test: bool = False
    platform: str = DEFAULT_PLATFORM  # the variant of a multi-platform image
    prefer_containerd: bool = False  # a registry name from the node's containerd first
    containerd: Store


def images_platform(given: str | None, *, live: bool, recorded: str | None = None) -> str:
    """The variant of a multi-platform image a node is judged by: ``given`` (--platform)
    where given; on the node itself, the one this machine runs (linux/arm64 on a Grace
    node); for a recorded snapshot, the CPU it recorded (its ``cpu``); else
    linux/amd64."""
    if given is not None:
        return given
    if not live:
        return recorded or DEFAULT_PLATFORM
    return node_platform(host.machine()) or DEFAULT_PLATFORM


def check_image_on_node(
    ref: str, snap: Snapshot, profiles: ProfileSet, facts: CudaFacts, how: ImageChecks
) -> ImageOutcome:
    """One image judged on the node's GPUs (and loaded by the driver with --load-test)."""
    result: CheckResult | None = None
    loads: tuple[LoadResult, ...] = ()
    keep = Path(tempfile.mkdtemp(prefix="buildmatrix-load-")) if how.load_test else None
    try:
        scan = scan_node_first if how.prefer_containerd else scan_image
        image = scan(ref, platform=how.platform, keep=keep, containerd=how.containerd)
        opts = Options(snapshot=snap, require_sass=how.require_sass)
        result = run_check(image, profiles, opts, facts)
        if how.load_test:
            loads = tuple(run_load_test(ref, result.files, facts))
        # what another containerd generation runs on this node instead (os.features,
        # docs/check.md "Platforms"): the image is proven only if that passes too
        for request in image.also:
            other = run_check(
                scan(ref, platform=request, containerd=how.containerd), profiles, opts, facts
            )
            if result.passed and not other.passed:
                result = other
    except BuildmatrixError as exc:
        return ImageOutcome(ref=ref, result=result, loads=loads, error=exc)
    finally:
        if keep is not None:
            shutil.rmtree(keep, ignore_errors=True)
    return ImageOutcome(ref=ref, result=result, loads=loads)


def check_images(
    refs: Sequence[str], snap: Snapshot, profiles: ProfileSet, facts: CudaFacts, how: ImageChecks
) -> list[ImageOutcome]:
    """Each image judged on the node's GPUs, in the order given."""
    return [check_image_on_node(ref, snap, profiles, facts, how) for ref in refs]


def verified_images(outcomes: Sequence[ImageOutcome]) -> list[VerifiedImage]:
    """Images proven on the node, named by their spec (io.buildmatrix.image) label."""
    found = []
    for o in outcomes:
        if o.result is None or not o.result.passed:
            continue
        labels = o.result.image.config.labels
        name = labels.get("io.buildmatrix.image") or o.ref.rsplit("/", 1)[-1].split(":")[0]
        found.append(VerifiedImage(name=name))
    return found
