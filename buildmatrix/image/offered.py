"""Which platforms an image offers: the entries of its index, as ``check`` judges and
``affinity`` pins them (docs/check.md, "Platforms").

An index built by buildx also lists attestation manifests (SBOM, provenance) whose
platform is ``unknown/unknown`` (buildx ``docs/reference/buildx_build.md``,
"attestations"): no node has that platform, so they are not offered. Entries are
told apart by platform only, never by annotation: containerd's ``images.Manifest``
(``core/images/image.go``) and the Docker engine's pulls read no annotation when
they pick an entry, so an entry annotated ``vnd.docker.reference.type`` (with any
value) whose platform is a real one is offered and judged like any other.

An entry without a ``platform`` offers its config's (containerd ``images.Manifest``
reads the config of such an entry: ``ConfigPlatform``), a nested index the entries
it holds; a platform is offered only if a node of it finds an image there
(buildmatrix.image.manifests), so every platform offered can be judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from buildmatrix.image.blobs import is_index
from buildmatrix.image.manifests import CONFIG, MAX_DEPTH, Fetch, NoPlatformMatch, pick_manifest
from buildmatrix.image.platform import (
    Platform,
    config_platform,
    descriptor_platform,
    parse_platform,
    rank,
)


def runnable(p: Platform) -> str:
    """``os/arch[/variant]``, or '' for no platform a node has."""
    if "unknown" in (p.os, p.architecture) or not p.os or not p.architecture:
        return ""
    return "/".join(x for x in (p.os, p.architecture, p.variant) if x)


def offered_platforms(
    desc: Mapping[str, Any], doc: dict[str, Any], *, fetch: Fetch, name: str
) -> tuple[str, ...]:
    """The platforms an index (``doc``, named by ``desc``) offers, in index order:
    every entry's, an entry without a platform by its config's, a nested index's
    by its entries'; a platform found only through an entry without a platform is
    left out where its node would find no image (the entry sorts behind another,
    or the one followed is for another platform)."""
    candidates: dict[str, bool] = {}  # platform -> reached through an entry without one
    _collect(doc, fetch, candidates, depth=0)
    return tuple(
        text
        for text, by_config in candidates.items()
        if not by_config
        or not text.startswith("linux/")  # never judged: no target sits behind it
        or _finds(desc, doc, text, fetch=fetch, name=name)
    )


def _collect(doc: dict[str, Any], fetch: Fetch, out: dict[str, bool], *, depth: int) -> None:
    if depth > MAX_DEPTH:
        return  # pick_manifest refuses such a chain where it is followed
    for entry in doc.get("manifests") or []:
        p = descriptor_platform(entry)
        if p is not None:
            if text := runnable(p):  # behind an entry without a platform: to be verified
                out[text] = out.get(text, True) and depth > 0
            continue
        child = fetch(entry, "an index entry without a platform")
        if is_index(child):
            _collect(child, fetch, out, depth=depth + 1)
        elif text := runnable(config_platform(_config(child, fetch))):
            out.setdefault(text, True)


def _config(manifest: dict[str, Any], fetch: Fetch) -> dict[str, Any]:
    return fetch(manifest.get("config") or {}, CONFIG)


def _finds(
    desc: Mapping[str, Any], doc: dict[str, Any], text: str, *, fetch: Fetch, name: str
) -> bool:
    """Whether a node of ``text`` finds an image: either matcher generation picks a
    manifest, reached through a platform or with a config of that platform."""
    for legacy in (False, True):
        try:
            picked = pick_manifest(desc, doc, text, fetch=fetch, name=name, legacy=legacy)
        except NoPlatformMatch:
            continue
        if not picked.unplaced:
            return True
        mine = config_platform(_config(picked.manifest, fetch))
        if rank(parse_platform(text), mine, legacy=True) is not None:
            return True
    return False
