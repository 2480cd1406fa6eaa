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
every manifest and sorts by ``platforms.Only(host)``'s order, the host's amd64
variant taken from its CPU (``hostPlatformSpec``, ``archvariant.AMD64Variant``):
so where no manifest is P's own, ``docker run`` on a P node falls back as ``Only``
does (arm/v7 runs arm/v6 and v5, amd64 runs 386, arm64 runs 32-bit arm/v8 and
below), and that manifest is judged. buildmatrix does not know the host's amd64
level, so the pick of a host of each level ``v1`` to ``v4`` is judged too. Where
no manifest is P's own and a host's pick is not one ``Only(host)`` matches, the
engine would start another CPU's image there: refused (docs/check.md, "Docker's
containerd image store").
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
    config_platform,
    descriptor_platform,
    format_platform,
    matches,
    normalize,
    parse_platform,
    platform_vector,
    rank,
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


def less(order: list[Platform], a: Platform, b: Platform, *, legacy: bool) -> bool:
    """containerd/platforms ``orderedPlatformComparer.Less`` (compare.go) of the
    matchers of ``order``: the first that matches one and not the other decides; where
    one matches both, more OS features first (counted as listed, repeats too:
    ``len(p1.OSFeatures)``); where none matches either, again without their OS
    features. ``legacy`` (v0.2.x to v1.0.0-rc.2): the first that matches either
    decides, features play no part."""
    for want in order:
        a_in, b_in = matches(want, a, legacy=legacy), matches(want, b, legacy=legacy)
        if a_in and not b_in:
            return True
        if a_in or b_in:
            if a_in and b_in and not legacy and len(a.os_features) != len(b.os_features):
                return len(a.os_features) > len(b.os_features)
            return False
    if not legacy and (a.os_features or b.os_features):
        bare_a, bare_b = replace(a, os_features=()), replace(b, os_features=())
        return less(order, bare_a, bare_b, legacy=legacy)
    return False


def best_present(
    found: list[tuple[Picked, Platform]],
    order: list[Platform],
    *,
    legacy: bool,
    match_all: bool = False,
) -> tuple[Picked, Platform] | None:
    """``getBestPresentImageManifest`` (moby ``daemon/containerd/image.go``): in walk
    order, the first manifest the matcher matches, replaced only by a later one that
    ``Less`` puts strictly before it. ``order``: the matcher's platforms
    (``platforms.Ordered``); ``match_all``: ``matchAnyWithPreference`` with no list,
    which matches every manifest and sorts by ``order`` (docker run without
    ``--platform``, ``platform_matchers.go``)."""
    best: tuple[Picked, Platform] | None = None
    for p, have in found:
        if not match_all and not any(matches(w, have, legacy=legacy) for w in order):
            continue
        if best is None or less(order, have, best[1], legacy=legacy):
            best = (p, have)
    return best


def strict_pick(
    found: list[tuple[Picked, Platform]], platform: Platform, *, legacy: bool
) -> tuple[Picked, Platform] | None:
    """``getBestPresentImageManifest`` with ``OnlyStrict(platform)``."""
    return _features(best_present(found, [normalize(platform)], legacy=legacy))


def host_pick(
    found: list[tuple[Picked, Platform]], host: Platform, *, legacy: bool
) -> tuple[tuple[Picked, Platform], bool] | None:
    """What ``docker run`` without ``--platform`` runs on ``host``: every manifest
    matches, ``platforms.Only(host)``'s order decides (a lower arm variant on arm,
    386 on amd64, 32-bit arm on arm64, as ``platformVector`` lists them). With
    whether the host runs it natively: its platform (OS features aside) is one
    ``Only(host)`` matches; else it is another CPU's image, which the engine starts
    anyway, warning that it "does not match the detected host platform" (moby
    ``daemon/create.go``)."""
    best = _features(
        best_present(found, platform_vector(normalize(host)), legacy=legacy, match_all=True)
    )
    if best is None:
        return None
    return best, rank(host, best[1], legacy=True) is not None


def _features(best: tuple[Picked, Platform] | None) -> tuple[Picked, Platform] | None:
    """The pick with the OS features of the entry it was reached through."""
    if best is None:
        return None
    return replace(best[0], features=tuple(sorted(set(best[1].os_features)))), best[1]


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
    """The manifest Docker runs on a node of ``platform`` and the requests that pick
    what else it may run there. ``docker run --platform PLATFORM`` runs
    ``OnlyStrict``'s pick (the newer matcher's, else the older one's); ``docker run``
    alone runs the host's pick for the node's amd64 level (:func:`host_pick`). Where
    ``OnlyStrict`` finds nothing, the host's pick is the one judged: the engine
    falls back as ``platforms.Only`` does. A host whose pick is another CPU's image
    is refused (exit 2): the engine would start an image the node cannot run."""
    requested = parse_platform(platform)
    walked = present_manifests(desc, doc, fetch=fetch, present=present, name=name)
    found = [(p, platform_of(p, fetch)) for p in walked]
    strict = [strict_pick(found, requested, legacy=legacy) for legacy in (False, True)]
    candidates = [p for p in strict if p is not None]
    exact = bool(candidates)  # docker run --platform runs something
    for host in _hosts(requested):
        for legacy in (False, True):
            picked = host_pick(found, host, legacy=legacy)
            if picked is None:
                continue
            if not picked[1] and not exact:
                raise _foreign(name, platform, host, picked[0])
            if picked[1]:
                candidates.append(picked[0])
    if not candidates:
        seen = ", ".join(sorted({str(have) for _, have in found})) or "none"
        raise NoPlatformMatch(
            f"{name}: no image for platform {platform} among the manifests Docker's "
            f"containerd image store holds (their platforms: {seen}); Docker would not "
            "run it for that platform. Pull it for that platform, or pass --platform."
        )
    chosen = candidates[0][0]
    requests: list[str] = []
    for pick, have in candidates[1:]:
        if _digest(pick) != _digest(chosen):
            want = replace(normalize(have), os_features=pick.features)
            requests.append(_request(found, want, pick))
    return chosen, tuple(dict.fromkeys(r for r in requests if r != platform))


def _foreign(name: str, platform: str, host: Platform, pick: tuple[Picked, Platform]) -> InputError:
    """No manifest for ``platform``, and ``docker run`` on ``host`` would start
    another CPU's image."""
    spec, other = format_platform(normalize(host)), format_platform(normalize(pick[1]))
    return NoPlatformMatch(
        f"{name}: no image for platform {platform} among the manifests Docker's containerd "
        f"image store holds: on a {spec} host docker run would start manifest "
        f"{_digest(pick[0])}, an image for {pick[1]}, which platforms.Only({spec}) does "
        "not match (the engine warns that the image's platform does not match the host's), "
        "so the node's CPU does not run it natively. Pull the image for that platform, or "
        f"pass --platform {other} to judge it for the nodes it is built for."
    )


def _request(found: list[tuple[Picked, Platform]], want: Platform, pick: Picked) -> str:
    """A request whose strict pick is ``pick``; refused where there is none."""
    again = strict_pick(found, want, legacy=False) or strict_pick(found, want, legacy=True)
    if again is None or _digest(again[0]) != _digest(pick):
        raise InputError(
            f"Docker may run manifest {_digest(pick)} and buildmatrix finds no platform "
            "request that picks it alone, so it cannot judge it: refused. Give the "
            "index's entries distinct platforms."
        )
    return format_platform(normalize(want))


def _digest(p: Picked) -> str:
    return str(p.desc.get("digest", ""))
