"""Which manifest of a multi-platform image a node runs: containerd's platform matcher.

A Kubernetes node pulls through containerd's CRI plugin, whose matcher is
``platforms.Default()`` = ``platforms.Only(DefaultSpec())`` (github.com/containerd/
platforms, ``defaults_unix.go``; the CRI image service, containerd
``internal/cri/server/images/service.go``); ``ctr images pull --platform P`` and the
Docker engine's pull (moby ``daemon/internal/distribution/pull_v2_unix.go``,
``filterManifests``) use ``platforms.Only(P)``. This module follows that code:

- a platform string is parsed and normalised as ``platforms.Parse`` and
  ``normalizeArch`` do (``platforms.go``, ``database.go``): ``x86_64`` is ``amd64``,
  ``amd64/v1`` is plain ``amd64``, ``aarch64`` is ``arm64``, ``arm64/v8`` is plain
  ``arm64``, ``arm`` without a variant is ``arm/v7``;
- ``Only(P)`` matches the platforms of ``platformVector(P)`` (``compare.go``), in
  that order of preference: ``amd64/vN`` then ``amd64/vN-1`` … ``amd64``, then
  ``386``; ``arm/vN`` down to ``arm/v5``; ``arm64/v9.x`` the lower v9 and the
  v8.(x+5) line, ``arm64/v8.x`` down to ``arm64``, then 32-bit ``arm/v8`` and below.
  A variant is matched exactly: a plain ``amd64`` request does **not** match an
  ``amd64/v3`` entry (amd64 hosts report no variant: ``DefaultSpec``);
- an entry matches when OS, architecture and variant are equal after normalising
  both sides and its OS features are a subset of the request's (``matcher.Match``,
  containerd/platforms v1.0.0-rc.3 and later: containerd 2.3 on); among entries of
  one rank, more OS features first (``orderedPlatformComparer.Less``);
- the **legacy** matcher (containerd/platforms v0.2.x to v1.0.0-rc.2: containerd
  1.6 to 2.2, whose ``matcher.Match`` compares OS, architecture and variant only,
  and whose ``Less`` compares ranks only) ignores OS features on both sides. Nodes
  run both generations, so :mod:`buildmatrix.image.manifests` judges the entry each
  one picks;
- among the entries of an index that match, or have no platform at all, the first by
  preference wins, ties in index order, entries without a platform last
  (containerd ``core/images/image.go``, ``Manifest``: a stable sort by ``Less``,
  then the first); an entry without a platform counts only if its image config's
  platform matches (``ConfigPlatform``);
- annotations play no part: ``Manifest`` filters an index's entries by platform
  only, and so do the Docker engine's pulls (moby ``filterManifests``; its
  containerd image store's ``getBestPresentImageManifest``, ``daemon/containerd/
  image.go``, by the entry's platform or else its config's). buildx's attestation
  manifests are never run because their platform is ``unknown/unknown``; an entry
  annotated ``vnd.docker.reference.type`` with a real platform runs like any other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from buildmatrix.errors import InputError

DEFAULT_PLATFORM = "linux/amd64"  # containerd's DefaultSpec() on a Linux amd64 node

_SPECIFIER = re.compile(r"[A-Za-z0-9_.-]+")
_OS = re.compile(r"([A-Za-z0-9_-]+)(?:\(([A-Za-z0-9_.%-]*)((?:\+[A-Za-z0-9_.%-]+)*)\))?")
# arm64 variant -> (majors, first minors) whose lines it also runs (compare.go,
# arm64variantToVersion): v9.x runs v9.0..v9.x and v8.0..v8.(x+5), capped at v8.9.
_ARM64 = {f"v8.{m}": ((8,), (m,)) for m in range(10)} | {
    f"v9.{m}": ((9, 8), (m, min(m + 5, 9))) for m in range(8)
}
_ARM64 |= {"v8": _ARM64["v8.0"], "v9": _ARM64["v9.0"]}


@dataclass(frozen=True, kw_only=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""
    os_features: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = "/".join(p for p in (self.os, self.architecture, self.variant) if p)
        return text + (f" (+{'+'.join(self.os_features)})" if self.os_features else "")


def normalize_arch(arch: str, variant: str) -> tuple[str, str]:
    """containerd/platforms ``normalizeArch`` (database.go)."""
    arch, variant = arch.lower(), variant.lower()
    if arch == "i386":
        return "386", ""
    if arch in ("x86_64", "x86-64", "amd64"):
        return "amd64", "" if variant == "v1" else variant
    if arch in ("aarch64", "arm64"):
        variant = {"8": "", "v8": "", "v8.0": "", "9": "v9", "9.0": "v9", "v9.0": "v9"}.get(
            variant, variant
        )
        return "arm64", variant
    if arch == "armhf":
        return "arm", "v7"
    if arch == "armel":
        return "arm", "v6"
    if arch == "arm":
        return "arm", {"": "v7", "7": "v7", "5": "v5", "6": "v6", "8": "v8"}.get(variant, variant)
    return arch, variant


def normalize(p: Platform) -> Platform:
    """``platforms.Normalize``: OS lower-cased, architecture and variant normalised,
    OS features sorted and de-duplicated."""
    arch, variant = normalize_arch(p.architecture, p.variant)
    os = {"macos": "darwin"}.get(p.os.lower(), p.os.lower())
    return Platform(
        os=os, architecture=arch, variant=variant, os_features=tuple(sorted(set(p.os_features)))
    )


def parse_platform(spec: str) -> Platform:
    """``OS[(VERSION+FEATURE…)]/ARCH[/VARIANT]`` as ``platforms.Parse`` reads it; an
    OS alone (the host's architecture) is not enough to pick an image for a node."""
    parts = spec.split("/", 3)
    head = _OS.fullmatch(parts[0])
    if "*" in spec or head is None or len(parts) not in (2, 3):
        raise InputError(
            f"--platform '{spec}': expected OS/ARCH or OS/ARCH/VARIANT, e.g. linux/amd64 "
            "or linux/arm64/v8 (containerd's platform syntax)."
        )
    for part in parts[1:]:
        if not _SPECIFIER.fullmatch(part):
            raise InputError(
                f"--platform '{spec}': '{part}' is not a valid component (letters, digits, "
                "'_', '.', '-')."
            )
    features = tuple(unquote(f) for f in (head.group(3) or "").split("+") if f)
    os = normalize(Platform(os=head.group(1), architecture="")).os
    if os == "windows":
        raise InputError(
            f"--platform '{spec}': buildmatrix checks Linux images; give a linux platform."
        )
    arch, variant = normalize_arch(parts[1], parts[2] if len(parts) == 3 else "")
    if len(parts) == 2 and arch == "arm" and variant == "v7":
        variant = ""
    if len(parts) == 3 and arch == "arm64" and not variant:
        variant = "v8"
    return Platform(os=os, architecture=arch, variant=variant, os_features=features)


def platform_vector(p: Platform) -> list[Platform]:
    """The platforms ``Only(p)`` matches, most preferred first (compare.go,
    ``platformVector``)."""

    def with_arch(arch: str, variant: str) -> Platform:
        return Platform(os=p.os, architecture=arch, variant=variant, os_features=p.os_features)

    vector = [p]
    version = _version(p.variant)
    if p.architecture == "amd64":
        if version is not None and version > 1:
            vector += [with_arch("amd64", f"v{v}") for v in range(version - 1, 0, -1)]
        vector.append(with_arch("386", ""))
    elif p.architecture == "arm":
        if version is not None and version > 5:
            vector += [with_arch("arm", f"v{v}") for v in range(version - 1, 4, -1)]
    elif p.architecture == "arm64":
        variant = p.variant or "v8"
        vector = []
        if variant in _ARM64:
            majors, minors = _ARM64[variant]
            for major, top in zip(majors, minors, strict=True):
                vector += [
                    with_arch("arm64", f"v{major}" if m == 0 else f"v{major}.{m}")
                    for m in range(top, -1, -1)
                ]
        if variant.startswith(("v8", "v9")):
            variant = "v8"  # every arm64 runs 32-bit arm/v8 and below
        vector += platform_vector(with_arch("arm", variant))
    return vector


def _version(variant: str) -> int | None:
    """Go's ``strconv.Atoi(strings.TrimPrefix(variant, "v"))``."""
    digits = variant.removeprefix("v")
    if re.fullmatch(r"[+-]?[0-9]+", digits) is None:
        return None
    return int(digits)


def matches(want: Platform, have: Platform, *, legacy: bool = False) -> bool:
    """``NewMatcher(want).Match(have)`` (``matcher.Match``): both sides normalised; OS
    version is not compared on Linux; OS features a subset of the request's, or
    (``legacy``) not compared at all."""
    want, have = normalize(want), normalize(have)
    return (
        (want.os, want.architecture, want.variant) == (have.os, have.architecture, have.variant)
    ) and (legacy or set(have.os_features) <= set(want.os_features))


def rank(requested: Platform, have: Platform, *, legacy: bool = False) -> tuple[int, int] | None:
    """Where ``have`` sorts among the platforms ``Only(requested)`` matches (lower is
    preferred: the first matcher that matches it, then more OS features first,
    ``orderedPlatformComparer.Less``, which counts them as the entry lists them,
    repeats too: ``len(p1.OSFeatures)`` of the platform as given; ``legacy``: the
    matcher only), or None if it does not match."""
    for i, want in enumerate(platform_vector(normalize(requested))):
        if matches(want, have, legacy=legacy):
            return i, 0 if legacy else -len(have.os_features)
    return None


def format_platform(p: Platform) -> str:
    """containerd/platforms ``FormatAll`` (OS version aside): ``os(+f1+f2)/arch[/v]``,
    features sorted, each percent-encoded where :func:`parse_platform` would not
    read it back."""
    head = p.os
    if p.os_features:
        head += "(+" + "+".join(quote(f, safe="_.-") for f in sorted(set(p.os_features))) + ")"
    return "/".join(x for x in (head, p.architecture, p.variant) if x)


def descriptor_platform(desc: dict[str, Any]) -> Platform | None:
    p = desc.get("platform")
    if not isinstance(p, dict):
        return None
    return config_platform(p)


def config_platform(doc: dict[str, Any]) -> Platform:
    """The platform of an index entry's ``platform`` or of an image config (the OCI
    image spec keys; ``os.features`` in a descriptor, ``os.features`` in a config)."""
    features = doc.get("os.features") or []
    return Platform(
        os=str(doc.get("os") or ""),
        architecture=str(doc.get("architecture") or ""),
        variant=str(doc.get("variant") or ""),
        os_features=tuple(str(f) for f in features) if isinstance(features, list) else (),
    )


def select_platform(
    manifests: Iterable[dict[str, Any]], platform: str, *, name: str, legacy: bool = False
) -> dict[str, Any]:
    """The index entry containerd pulls for ``platform`` (``images.Manifest``): of
    the entries ``Only(platform)`` matches, the most preferred, ties in index order;
    an entry without a platform comes last (its config must match:
    :func:`require_config_platform`). Entries are told apart by platform alone, as
    containerd's ``Manifest`` and moby's ``filterManifests`` do (neither reads an
    entry's annotations): an attestation manifest is left out because its platform,
    ``unknown/unknown``, matches no node, never for its
    ``vnd.docker.reference.type`` annotation. ``legacy``: as containerd 1.6 to 2.2
    match."""
    requested = parse_platform(platform)
    entries = list(manifests)
    ranked = []
    for i, desc in enumerate(entries):
        have = descriptor_platform(desc)
        r = rank(requested, have, legacy=legacy) if have is not None else None
        where = (0, *r) if r is not None else None
        if have is None:
            where = (1, 0, 0)
        if where is not None:
            ranked.append((where, i))
    if not ranked:
        found = [  # unknown/unknown (buildx's attestations) is no platform to pass
            str(p)
            for d in entries
            if (p := descriptor_platform(d)) is not None and "unknown" not in (p.os, p.architecture)
        ]
        raise InputError(
            f"{name}: no image for platform {platform} (containerd's matcher takes "
            f"{', '.join(str(p) for p in platform_vector(requested))}); the index has "
            f"{', '.join(found) or 'no platforms'}. Pass --platform."
        )
    return entries[min(ranked)[1]]


def require_config_platform(
    config: dict[str, Any], platform: str, *, name: str, entry: bool = True
) -> None:
    """The image config's platform must be one ``Only(platform)`` matches.

    For an index entry without a platform (``entry``) containerd pulls it only then
    (containerd ``core/images/image.go``, ``Manifest``, ``ConfigPlatform``). For a
    single manifest (no index) or a ``docker save`` archive, containerd's unpacker
    unpacks an image only for a platform of its own that matches the config's
    (containerd ``core/unpack/unpacker.go``, ``Unpacker.unpack``: no match, no
    snapshot), so a node of ``platform`` cannot run it either."""
    have = config_platform(config)
    # either matcher generation may run it (os.features: containerd 1.6 to 2.2 ignore them)
    if rank(parse_platform(platform), have, legacy=True) is not None:
        return
    if not have.os or not have.architecture:
        raise InputError(
            f"'{name}': the image config names no os/architecture (the OCI image spec "
            "requires both), so no node's container runtime matches it to a platform; "
            "rebuild the image (docker buildx and docker build write both)."
        )
    if entry:
        raise InputError(
            f"'{name}': no image for platform {platform}: no index entry names it, and the "
            f"one without a platform is an image for {have or 'no platform'} (its config), "
            "which containerd would not pull. Pass --platform."
        )
    raise InputError(
        f"'{name}': no image for platform {platform}: the image is for "
        f"{have or 'no platform'} (its config's os/architecture), which containerd "
        f"does not unpack on a {platform} node. Pass --platform "
        f"{have or 'OS/ARCH'} to judge it for the nodes it is built for."
    )
