"""The CUDA release an image's code needs, from every sign of it the image carries.

Pure: a scanned image in, its signs out. check (buildmatrix.check) sets the runtime's
driver floor by the newest sign, and affinity the same way; docs/check.md says where
each sign comes from.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import cache

from packaging.version import Version

from buildmatrix.cuda import major_minor
from buildmatrix.image.scanned import ScannedImage

_CUDART = re.compile(r"(?:^|/)libcudart\.so\.(\d+)(?:\.(\d+))?")
_CUDA_ENV = re.compile(r"(\d+)\.(\d+)")

CUDA_VERSION_SOURCE = "CUDA_VERSION in the image config"


def runtime_sources(
    image: ScannedImage, *, ignored: Callable[[str], bool] | None = None
) -> list[tuple[Version, str]]:
    """Every sign of the CUDA release the image's code needs, with where it comes from:
    CUDA_VERSION in the config, each ``libcudart.so.X[.Y]`` it ships, each file that is
    or links in a CUDA runtime by its content (buildmatrix.binary.cudart: a runtime
    renamed as auditwheel renames it, a static runtime), and the release whose
    ptxas/nvlink wrote each file's cubins (``.note.nv.tkinfo``; a driver must support
    that major, and it is the only sign of a statically linked runtime without the
    runtime's own marks). A path ``ignored`` holds (check --ignore: never loaded) is
    no sign: a package that ships one library per CUDA release (bitsandbytes'
    libbitsandbytes_cudaXYZ.so) loads only the one its runtime matches; so is an
    optional file skipped on every target (buildmatrix.optional), which check passes
    in the same predicate."""
    skip = ignored or (lambda _: False)
    found: list[tuple[Version, str]] = []
    m = _CUDA_ENV.match(image.config.env.get("CUDA_VERSION", ""))
    if m:
        found.append((_release(m[1], m[2]), CUDA_VERSION_SOURCE))
    for hit in image.paths_found(_CUDART):
        if not skip(hit.string):
            found.append((_release(hit[1], hit[2] or "0"), hit.string))
    for r in image.runtimes:
        if r.release is not None and not skip(r.path):
            found.append((r.release, f"{r.path}, a CUDA runtime by {r.how}"))
    for f in image.files:
        if f.toolkit is not None and f.format != "archive" and not skip(f.path):
            found.append((f.toolkit, f"device code of {f.path} (built by CUDA {f.toolkit})"))
    return found


@cache  # a pure parse, asked for on every check of an image
def _release(major: str, minor: str) -> Version:
    return Version(f"{major}.{minor}")


def cuda_runtime(image: ScannedImage) -> tuple[Version, str] | None:
    """The newest CUDA release any source shows (runtime_sources): the floors follow it."""
    return newest_runtime(runtime_sources(image))


def newest_runtime(sources: Iterable[tuple[Version, str]]) -> tuple[Version, str] | None:
    """The newest of ``sources`` (the first of equals), or None: :func:`cuda_runtime`
    of sources read once."""
    return max(sources, key=lambda x: x[0], default=None)


def runtime_note(sources: list[tuple[Version, str]]) -> str | None:
    """Where the image's CUDA_VERSION names an older release than its code needs (kernels
    built by nvcc 13.5 in a CUDA_VERSION=12.8.1 image): say that the two disagree and
    which one the floors follow. None where they agree or there is no CUDA_VERSION."""
    declared = [v for v, s in sources if s == CUDA_VERSION_SOURCE]
    winner = max(sources, key=lambda x: x[0], default=None)
    if not declared or winner is None or winner[0] <= declared[0]:
        return None
    return (
        f"the image's CUDA_VERSION says CUDA {major_minor(declared[0])}, but "
        f"{winner[1]} needs CUDA {major_minor(winner[0])}: the driver floors follow "
        f"{major_minor(winner[0])}"
    )
