"""From an image's top document to the manifest a node of a platform runs, as
containerd's ``images.Manifest`` walks it (containerd ``core/images/image.go``).

At an index, the entries the platform matcher matches, and those without a
platform, are sorted stably (matching entries by ``Less``, platform-less ones last)
and only the first is followed (``limit = 1``); a nested index is walked the same
way; a manifest reached through an entry without a platform runs only if its
config's platform matches (``ConfigPlatform``; the sources check that with
:func:`buildmatrix.image.platform.require_config_platform`).

Two generations of the matcher run on nodes today (buildmatrix.image.platform):
containerd 1.6 to 2.2 ignore ``os.features``, containerd 2.3 on (containerd/
platforms v1.0.0-rc.3) match them as a subset of the request's and prefer more of
them. Where the two pick different manifests for a platform, both may run, so both
are judged (docs/check.md, "Platforms"): :func:`choose` returns the one the newer
matcher picks (else the older one's) and a request, in containerd's own syntax
(``linux(+FEATURE)/amd64``), that picks the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from buildmatrix.errors import InputError
from buildmatrix.image.blobs import check_manifest, is_index
from buildmatrix.image.gokeys import check_keys
from buildmatrix.image.platform import (
    descriptor_platform,
    format_platform,
    parse_platform,
    select_platform,
)

# (descriptor, what it is for messages) -> the JSON document it names, verified
Fetch = Callable[[Mapping[str, Any], str], dict[str, Any]]
CONFIG = "an image config"  # the ``what`` a Fetch is given for a config, not a manifest
MAX_DEPTH = 16  # nested indexes followed; digests make a loop impossible, not a long chain


class NoPlatformMatch(InputError):
    """No entry of an index is for the requested platform."""


@dataclass(frozen=True, kw_only=True)
class Picked:
    """The manifest a node of ``platform`` runs and how it was reached."""

    desc: Mapping[str, Any]  # its descriptor (the top one when there was no index)
    manifest: dict[str, Any]
    unplaced: bool  # reached through an index entry without a platform
    single: bool  # the image is one manifest, no index
    features: tuple[str, ...] = ()  # OS features of the entries followed


def pick_manifest(
    desc: Mapping[str, Any],
    doc: dict[str, Any],
    platform: str,
    *,
    fetch: Fetch,
    name: str,
    legacy: bool = False,
) -> Picked:
    """Follow index entries from ``doc`` (the document ``desc`` names) as
    ``images.Manifest`` does for ``platform`` (``legacy``: containerd 1.6 to 2.2)."""
    single, unplaced, features = not is_index(doc), False, set[str]()
    for _ in range(MAX_DEPTH + 1):
        check_keys(doc, shape="manifest", name=name)
        if not is_index(doc):
            return Picked(
                desc=desc,
                manifest=doc,
                unplaced=unplaced,
                single=single,
                features=tuple(sorted(features)),
            )
        check_manifest(doc, name=name)
        try:
            desc = select_platform(doc.get("manifests") or [], platform, name=name, legacy=legacy)
        except InputError as exc:
            raise NoPlatformMatch(str(exc)) from None
        have = descriptor_platform(desc)
        unplaced = have is None
        features |= set(have.os_features if have is not None else ())
        doc = check_manifest(fetch(desc, f"the {platform} manifest"), name=name)
    raise InputError(
        f"'{name}': indexes nested more than {MAX_DEPTH} deep; containerd would follow them, "
        "buildmatrix does not: refused."
    )


def choose(
    desc: Mapping[str, Any], doc: dict[str, Any], platform: str, *, fetch: Fetch, name: str
) -> tuple[Picked, tuple[str, ...]]:
    """The manifest to judge for ``platform``, and the requests (none or one) that
    pick what the other matcher generation runs instead."""
    try:
        current: Picked | None = pick_manifest(desc, doc, platform, fetch=fetch, name=name)
    except NoPlatformMatch:
        current = None
    try:
        older = pick_manifest(desc, doc, platform, fetch=fetch, name=name, legacy=True)
    except NoPlatformMatch:
        if current is None:
            raise
        return current, ()
    if current is None:
        return older, ()  # containerd 2.3 finds nothing; 1.6 to 2.2 run this one
    if _digest(current) == _digest(older):
        return current, ()
    # the request's platform with exactly the features of the entries the older
    # generation followed: of the newer matcher's matches, those sort first
    other = format_platform(replace(parse_platform(platform), os_features=older.features))
    again = pick_manifest(desc, doc, other, fetch=fetch, name=name)
    if _digest(again) != _digest(older):
        raise InputError(
            f"'{name}': for {platform}, containerd 1.6 to 2.2 run manifest {_digest(older)} "
            f"and containerd 2.3 and later {_digest(current)}, and buildmatrix finds no "
            "request that picks the first alone, so it cannot judge both: refused. Give "
            "the index's entries distinct platforms (os.features aside)."
        )
    return current, (other,)


def _digest(p: Picked) -> str:
    return str(p.desc.get("digest", ""))


def memo(fetch: Fetch) -> Fetch:
    """``fetch`` that reads each digest once."""
    seen: dict[str, dict[str, Any]] = {}

    def get(desc: Mapping[str, Any], what: str) -> dict[str, Any]:
        key = str(desc.get("digest", ""))
        if key not in seen:
            seen[key] = fetch(desc, what)
        return seen[key]

    return get
