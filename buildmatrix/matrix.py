"""Matrix expansion: image specs x families x CUDA versions x axes, minus what cannot be.

A combination is dropped, with its reason, when the spec excludes it, when the
family lacks a required feature, or when the CUDA version can build none of the
family's SMs. SMs of a kept family that the CUDA version cannot build (or that
lack a required feature) are left out of that entry, also with a reason.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from buildmatrix.arch import sorted_platforms
from buildmatrix.cuda import CudaFacts, newer_release_hint
from buildmatrix.errors import InputError, did_you_mean
from buildmatrix.image.ref import TAG_PATTERN
from buildmatrix.profiles import Profile, ProfileSet
from buildmatrix.specs import PLATFORM_FIELD, Cuda, ImageSpec
from buildmatrix.variant import Dropped, Entry, Matrix, variant_fields

GITHUB_MATRIX_LIMIT = 256  # jobs per matrix (GitHub Actions usage limits)
# Docker's tag grammar (distribution/reference); Go's \w is ASCII, so re.ASCII
_TAG = re.compile(TAG_PATTERN, re.ASCII)


def _excluded(fields: dict[str, str], rules: tuple[dict[str, str], ...]) -> dict[str, str] | None:
    for rule in rules:
        if all(
            fields.get(k) == v or (k == "cuda" and _same_cuda(fields, v)) for k, v in rule.items()
        ):
            return rule
    return None


def _same_cuda(fields: dict[str, str], value: str) -> bool:
    # An exclusion may name CUDA as MAJOR.MINOR while the spec lists 12.8.1.
    return f"{fields['cuda_major']}.{fields['cuda_minor']}" == value


def _why_not(p: Profile, cuda: Cuda, requires: tuple[str, ...]) -> str | None:
    missing = [f for f in requires if f not in p.features]
    if missing:
        return f"{p.sm} lacks {', '.join(missing)}"
    if not p.supports_cuda(Version(cuda.mm)):
        if Version(cuda.mm) < p.min_cuda:
            return f"{p.sm} needs CUDA {p.min_cuda} or newer"
        return f"CUDA {cuda.mm} no longer targets {p.sm} (last: {p.max_cuda})"
    return None


def _known_cuda(spec: ImageSpec, facts: CudaFacts) -> None:
    """Every CUDA version of the spec must be a release the facts table knows: its
    driver floors and PTX ISA decide the image's labels and NVIDIA_REQUIRE_ARCH."""
    for cuda in spec.cuda:
        if facts.toolkit(Version(cuda.mm)) is None:
            known = ", ".join(str(tk.version) for tk in facts.toolkits)
            raise InputError(
                f"{spec.source}: key 'cuda': {cuda.full} is not a CUDA release buildmatrix "
                f"knows (its driver floor and PTX ISA would be made up). Known releases: "
                f"{known}. {newer_release_hint()}"
            )


def _drop_excluded(
    spec: ImageSpec, fields: dict[str, str], what: str, matrix: Matrix, matched: set[int]
) -> bool:
    """Whether an exclusion rule of the spec matches the variant; the first that does is
    marked matched and the variant goes to ``matrix.dropped``."""
    rule = _excluded(fields, spec.exclude)
    if rule is None:
        return False
    matched.add(next(i for i, r in enumerate(spec.exclude) if r is rule))
    shown = ", ".join(f"{k}={v}" for k, v in rule.items())
    matrix.dropped.append(
        Dropped(image=spec.name, what=what, reason=f"excluded by the spec ({shown})")
    )
    return True


def _no_silent_rules(spec: ImageSpec, matched: set[int], seen: dict[str, set[str]]) -> None:
    """An exclusion that matches nothing is a typo, never intended: exit 2 saying why."""
    for i, rule in enumerate(spec.exclude):
        if i in matched:
            continue
        for key, value in rule.items():
            values = sorted(seen.get(key, set()))
            if value not in values:
                raise InputError(
                    f"{spec.source}: key 'exclude[{i}]' matches no variant: {key} is never "
                    f"'{value}'.{did_you_mean(value, values)} Its values: {', '.join(values)}."
                )
        raise InputError(
            f"{spec.source}: key 'exclude[{i}]' matches no variant: no combination has all "
            f"of {', '.join(f'{k}={v}' for k, v in rule.items())}."
        )


@dataclass(frozen=True, kw_only=True)
class _Variant:
    """One kept combination of family, CUDA and axes, before its platforms."""

    spec: ImageSpec
    what: str
    fields: dict[str, str]
    kept: tuple[Profile, ...]
    tag: str


def _platform_variants(
    v: _Variant,
    profiles: ProfileSet,
    matrix: Matrix,
    matched: set[int],
    seen: dict[str, set[str]],
) -> list[tuple[str, tuple[Profile, ...]]]:
    """The platforms a variant is built for, each with the SMs it holds there: those
    whose products come with a host of that platform (profiles' ``hosts``). The spec's
    ``platforms`` where given, else every platform some kept SM's product sits behind.
    What is left out goes to ``matrix.dropped`` with its reason."""
    spec = v.spec
    kept = []
    for platform in spec.platforms or profiles.platforms(v.kept):
        fields = {**v.fields, PLATFORM_FIELD: platform}
        seen.setdefault(PLATFORM_FIELD, set()).add(platform)
        what = f"{v.what} {platform}"
        if _drop_excluded(spec, fields, what, matrix, matched):
            continue
        arch = platform.split("/")[1]
        on = tuple(p for p in v.kept if platform in p.platforms)
        if not on:
            sms = ", ".join(p.sm for p in v.kept)
            matrix.dropped.append(
                Dropped(
                    image=spec.name,
                    what=what,
                    reason=f"no product of {sms} comes with an {arch} host (the arch "
                    "profiles' 'hosts'), so no node of that platform could run it",
                )
            )
            continue
        for p in v.kept:
            if p not in on:
                matrix.dropped.append(
                    Dropped(
                        image=spec.name,
                        what=f"{what}: {p.sm}",
                        reason=f"left out of the {platform} variant: no {p.sm} product "
                        f"comes with an {arch} host",
                        sm_only=True,
                    )
                )
        kept.append((platform, on))
        matrix.platforms_built.append(f"{spec.name}: {what}: {_why_built(spec, on, arch)}")
    return kept


def _why_built(spec: ImageSpec, on: tuple[Profile, ...], arch: str) -> str:
    """Why a variant is built for a platform: the spec's or the fleet file's list, or
    the products of its SMs that come with that CPU (the arch profiles' ``hosts``)."""
    if spec.platforms_from is not None:
        return f"listed in {spec.platforms_from}"
    products = [f"{name} ({p.sm})" for p in on for name in p.products if arch in p.hosts(name)]
    shown = ", ".join(products[:3]) + (
        f" and {len(products) - 3} more" if len(products) > 3 else ""
    )
    return (
        f"{shown} come{'s' if len(products) == 1 else ''} with {arch} hosts (arch profiles' "
        f"'hosts'); a fleet without {arch} GPU nodes says so once, in IMAGES/fleet.yaml"
    )


def _kept_profiles(
    spec: ImageSpec, members: Sequence[Profile], cuda: Cuda, what: str, matrix: Matrix
) -> tuple[Profile, ...]:
    """The family's SMs a variant holds (those the CUDA version builds and that have every
    required feature); each one left out, or the whole variant, goes to
    ``matrix.dropped`` with its reason."""
    reasons = {p.sm: _why_not(p, cuda, spec.requires) for p in members}
    kept = tuple(p for p in members if reasons[p.sm] is None)
    if not kept:
        matrix.dropped.append(
            Dropped(image=spec.name, what=what, reason="; ".join(r for r in reasons.values() if r))
        )
        return kept
    for sm, reason in reasons.items():
        if reason is not None:
            matrix.dropped.append(
                Dropped(
                    image=spec.name,
                    what=f"{what}: {sm}",
                    reason=f"left out of the variant: {reason}",
                    sm_only=True,
                )
            )
    return kept


def _checked_tag(spec: ImageSpec, fields: dict[str, str], what: str) -> str:
    """The variant's tag from the spec's pattern, or an input error if it is not a
    Docker tag."""
    tag = spec.tag.format(**fields)
    if not _TAG.fullmatch(tag):
        raise InputError(
            f"{spec.source}: key 'tag': the pattern '{spec.tag}' gives '{tag}' for {what}, "
            "which is not a Docker tag (letters, digits, '_', '.', '-'; at most 128; "
            "not starting with '.' or '-'). The tag also names the Dockerfile, so it "
            "must not hold '/', ':' or '..'."
        )
    return tag


def expand(
    spec: ImageSpec,
    profiles: ProfileSet,
    *,
    facts: CudaFacts,
    out: Path,
    registry: str | None = None,
) -> Matrix:
    """The variants of one spec, in a stable order: family (by SM), CUDA, axes; the
    CUDA facts are the caller's (the CLI reads them, buildmatrix.cuda.load_cuda_facts)."""
    _known_cuda(spec, facts)
    matrix = Matrix()
    families = spec.families or tuple(f.value for f in profiles.families)
    axis_names = [k for k, _ in spec.axes]
    combos = [
        (family_name, cuda, values)
        for family_name in families
        for cuda in spec.cuda
        for values in itertools.product(*(v for _, v in spec.axes))
    ]
    matched: set[int] = set()
    seen: dict[str, set[str]] = {}
    for family_name, cuda, values in combos:
        axes = tuple(zip(axis_names, values, strict=True))
        what = " ".join([family_name, f"cuda {cuda.full}", *(f"{k}={v}" for k, v in axes)])
        members = profiles.family(family_name)
        fields = variant_fields(spec, family_name, cuda, axes)
        for key, value in fields.items():
            seen.setdefault(key, set()).add(value)
        seen["cuda"].add(cuda.mm)
        if _drop_excluded(spec, fields, what, matrix, matched):
            continue
        kept = _kept_profiles(spec, members, cuda, what, matrix)
        if not kept:
            continue
        tag = _checked_tag(spec, fields, what)
        variant = _Variant(spec=spec, what=what, fields=fields, kept=kept, tag=tag)
        per_platform = _platform_variants(variant, profiles, matrix, matched, seen)
        shared = len({on for _, on in per_platform}) == 1
        for platform, on in per_platform:
            name = f"{tag}.Dockerfile" if shared else f"{tag}.{platform.split('/')[1]}.Dockerfile"
            matrix.entries.append(
                Entry(
                    spec=spec,
                    family=kept[0].family,
                    profiles=on,
                    cuda=cuda,
                    axes=axes,
                    tag=tag,
                    dockerfile=out / spec.name / name,
                    catalogue=profiles,
                    facts=facts,
                    registry=registry,
                    platform=platform,
                    emulated=platform in spec.emulate,
                )
            )
    _no_silent_rules(spec, matched, seen)
    if not matrix.entries:
        raise InputError(
            f"{spec.source}: the spec yields no variant: every combination is left out "
            "(run with --explain to see why). A workflow's matrix must not be empty."
        )
    return matrix


def expand_all(
    specs: list[ImageSpec],
    profiles: ProfileSet,
    *,
    facts: CudaFacts,
    out: Path,
    registry: str | None = None,
) -> Matrix:
    total = Matrix()
    seen: dict[tuple[str, str], Entry] = {}
    for spec in specs:
        m = expand(spec, profiles, facts=facts, out=out, registry=registry)
        for e in m.entries:
            if (e.image_ref, e.platform) in seen:
                raise InputError(
                    f"{spec.source}: two variants get the same tag {e.image_ref}; put every "
                    "axis and the family into the tag pattern."
                )
            seen[e.image_ref, e.platform] = e
        total.entries += m.entries
        total.dropped += m.dropped
        total.platforms_built += m.platforms_built
    return total


def merges(entries: list[Entry]) -> list[dict[str, Any]]:
    """One merge job per family tag: the platforms its entries build, which the
    workflow's merge step publishes as one multi-platform index
    (``docker buildx imagetools create``), in the matrix's order."""
    by_ref: dict[str, list[Entry]] = {}
    for e in entries:
        by_ref.setdefault(e.image_ref, []).append(e)
    return [
        {
            "image": group[0].spec.name,
            "family": group[0].family.value,
            "tag": group[0].tag,
            "tags": [ref],
            "key": group[0].key,
            "repository": group[0].repository,
            "platforms": list(sorted_platforms(e.platform for e in group)),
        }
        for ref, group in by_ref.items()
    ]
