"""The manifest Docker Engine runs from an image in containerd's image store.

moby does not use containerd's ``images.Manifest`` (buildmatrix.image.manifests)
for that. ``docker run`` / ``docker create`` resolve the image through moby
``daemon/containerd/image.go`` ``GetImage``, which calls
``getBestPresentImageManifest`` with ``matchRequestedOrDefault(platforms.OnlyStrict,
platform)`` (``daemon/containerd/platform_matchers.go``):

- only manifests whose blob the namespace holds are looked at: ``walkImageManifests``
  (``daemon/containerd/image_manifest.go``) walks the index depth-first, in index
  order, through ``walkPresentChildren`` / ``presentChildrenHandler``
  (``daemon/containerd/handlers.go``: a child whose ``content.Info`` is not found
  is skipped), nested indexes included whatever platform their entry names;
- each manifest's platform is its entry's ``platform``, else its config's
  (``ImageManifest.ImagePlatform``): an entry without a platform is not put last;
- the first manifest the matcher matches is kept and replaced only by a later one
  the matcher's ``Less`` puts strictly before it.

With ``--platform P`` the matcher is ``platforms.OnlyStrict(P)``: P alone, no
fallback variants; its ``Less`` (containerd/platforms ``orderedPlatformComparer``,
v1.0.0-rc.3 on) prefers more OS features, older versions (moby before the
platforms module v1.0.0-rc.3) keep the first. Without ``--platform`` it matches
every manifest and prefers ``platforms.Only(host)``'s order, the host's amd64
variant taken from its CPU (``hostPlatformSpec``, ``archvariant.AMD64Variant``):
that is ``OnlyStrict`` of the first platform of ``Only(host)``'s vector that some
present manifest matches. buildmatrix does not know the host's amd64 level, so
each such platform, for hosts ``v1`` to ``v4``, is judged too (docs/check.md,
"Docker's containerd image store").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from buildmatrix.errors import InputError
from buildmatrix.image.gokeys import check_keys
from buildmatrix.image.manifests import CONFIG, MAX_DEPTH, Fetch, NoPlatformMatch, Picked
from buildmatrix.image.platform import (
    Platform,
    _matches,
    config_platform,
    descriptor_platform,
    format_platform,
    normalize,
    parse_platform,
    platform_vector,
)

# containerd core/images/mediatypes.go IsManifestType / IsIndexType
MANIFEST_TYPES = frozenset(
    {
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    }
)
INDEX_TYPES = frozenset(
    {
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    }
)
AMD64_LEVELS = ("v1", "v2", "v3", "v4")  # what archvariant.AMD64Variant answers


def present_manifests(
    desc: Mapping[str, Any],
    doc: dict[str, Any],
    *,
    fetch: Fetch,
    present: Callable[[str], bool],
    name: str,
) -> list[Picked]:
    """The manifests ``walkImageManifests`` hands on, in its order, each with the
    platform moby gives it in ``features`` / ``unplaced`` (see :func:`platform_of`)."""
    out: list[Picked] = []
    single = str(desc.get("mediaType", "")) in MANIFEST_TYPES

    def walk(d: Mapping[str, Any], body: dict[str, Any] | None, depth: int) -> Iterator[Picked]:
        if depth > MAX_DEPTH:
            raise InputError(f"'{name}': indexes nested more than {MAX_DEPTH} deep: refused.")
        kind = str(d.get("mediaType", ""))
        if kind in MANIFEST_TYPES:
            manifest = body if body is not None else fetch(d, "a manifest")
            check_keys(manifest, shape="manifest", name=name)
            unplaced = descriptor_platform(dict(d)) is None
            yield Picked(desc=d, manifest=manifest, unplaced=unplaced, single=single)
        elif kind in INDEX_TYPES:
            index = body if body is not None else fetch(d, "an index")
            check_keys(index, shape="manifest", name=name)
            for child in index.get("manifests") or []:
                if isinstance(child, dict) and present(str(child.get("digest", ""))):
                    yield from walk(child, None, depth + 1)

    out.extend(walk(desc, doc, 0))
    return out


def platform_of(p: Picked, fetch: Fetch) -> Platform:
    """``ImagePlatform``: the entry's platform, else the config's."""
    have = descriptor_platform(dict(p.desc))
    if have is not None:
        return have
    config = fetch(p.manifest.get("config") or {}, CONFIG)
    check_keys(config, shape="config", name=CONFIG)
    return config_platform(config)


def strict_pick(
    found: list[tuple[Picked, Platform]], platform: Platform, *, legacy: bool
) -> Picked | None:
    """``getBestPresentImageManifest`` with ``OnlyStrict(platform)``."""
    best: tuple[Picked, Platform] | None = None
    for p, have in found:
        if not _matches(normalize(platform), have, legacy=legacy):
            continue
        if best is None or (
            not legacy and len(set(have.os_features)) > len(set(best[1].os_features))
        ):
            best = (p, have)
    if best is None:
        return None
    return replace(best[0], features=tuple(sorted(set(best[1].os_features))))


def _hosts(requested: Platform) -> list[Platform]:
    """The hosts a node of ``requested`` may be, as ``hostPlatformSpec`` sees them."""
    if normalize(requested).architecture == "amd64" and normalize(requested).variant == "":
        return [replace(requested, variant=v) for v in AMD64_LEVELS]
    return [requested]


def moby_choose(
    desc: Mapping[str, Any],
    doc: dict[str, Any],
    platform: str,
    *,
    fetch: Fetch,
    present: Callable[[str], bool],
    name: str,
) -> tuple[Picked, tuple[str, ...]]:
    """The manifest ``docker run --platform PLATFORM`` runs (the newer matcher's,
    else the older one's), and the requests that pick what else Docker may run for
    such a node: the older matcher's pick, and what ``docker run`` without
    ``--platform`` runs on a host of each amd64 level."""
    requested = parse_platform(platform)
    walked = present_manifests(desc, doc, fetch=fetch, present=present, name=name)
    found = [(p, platform_of(p, fetch)) for p in walked]
    current = strict_pick(found, requested, legacy=False)
    older = strict_pick(found, requested, legacy=True)
    chosen = current or older
    if chosen is None:
        seen = ", ".join(sorted({str(have) for _, have in found})) or "none"
        raise NoPlatformMatch(
            f"{name}: no image for platform {platform} among the manifests Docker's "
            f"containerd image store holds (their platforms: {seen}); Docker would not "
            "run it for that platform. Pull it for that platform, or pass --platform."
        )
    requests: list[str] = []
    if older is not None and _digest(older) != _digest(chosen):
        requests.append(_request(found, replace(requested, os_features=older.features), older))
    for host in _hosts(requested):
        for legacy in (False, True):
            for tier in platform_vector(normalize(host)):
                pick = strict_pick(found, tier, legacy=legacy)
                if pick is not None:
                    if _digest(pick) != _digest(chosen):
                        want = replace(tier, os_features=pick.features)
                        requests.append(_request(found, want, pick))
                    break
    return chosen, tuple(dict.fromkeys(r for r in requests if r != platform))


def _request(found: list[tuple[Picked, Platform]], want: Platform, pick: Picked) -> str:
    """A request whose strict pick is ``pick``; refused where there is none."""
    again = strict_pick(found, want, legacy=False) or strict_pick(found, want, legacy=True)
    if again is None or _digest(again) != _digest(pick):
        raise InputError(
            f"Docker may run manifest {_digest(pick)} and buildmatrix finds no platform "
            "request that picks it alone, so it cannot judge it: refused. Give the "
            "index's entries distinct platforms."
        )
    return format_platform(normalize(want))


def _digest(p: Picked) -> str:
    return str(p.desc.get("digest", ""))
