"""Which platforms an image offers: the entries of its index, as ``check`` judges and
``affinity`` pins them (docs/check.md, "Platforms").

An index built by buildx also lists attestation manifests (SBOM, provenance) whose
platform is ``unknown/unknown`` (buildx ``docs/reference/buildx_build.md``,
"attestations"; the manifests carry ``vnd.docker.reference.type:
attestation-manifest``): those are no image a node runs, so they are not offered.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from buildmatrix.image.platform import descriptor_platform, is_attestation


def index_platforms(manifests: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """``os/arch[/variant]`` of every runnable entry of an index, in index order,
    each once; entries without a platform and attestation manifests are left out."""
    found: dict[str, None] = {}
    for desc in manifests:
        if is_attestation(desc):
            continue
        p = descriptor_platform(desc)
        if p is None or "unknown" in (p.os, p.architecture) or not p.architecture:
            continue
        found["/".join(x for x in (p.os, p.architecture, p.variant) if x)] = None
    return tuple(found)
