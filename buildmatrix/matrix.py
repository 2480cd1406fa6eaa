"""Matrix expansion: image specs x families x CUDA versions x axes, minus what cannot be.

A combination is dropped, with its reason, when the spec excludes it, when the
family lacks a required feature, or when the CUDA version can build none of the
family's SMs. SMs of a kept family that the CUDA version cannot build (or that
lack a required feature) are left out of that entry, also with a reason.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from packaging.version import Version

from buildmatrix.arch import CodeKind, Family, parse_arch, sorted_platforms
from buildmatrix.compat import CodeTarget
from buildmatrix.constraint import Segment, admitted, nvidia_require_arch
from buildmatrix.cuda import CudaFacts
from buildmatrix.errors import InputError, did_you_mean
from buildmatrix.image.ref import COMPONENT_PATTERN, HOST_PATTERN, TAG_PATTERN, is_host
from buildmatrix.profiles import Profile, ProfileSet
from buildmatrix.specs import PLATFORM_FIELD, Cuda, ImageSpec

GITHUB_MATRIX_LIMIT = 256  # jobs per matrix (GitHub Actions usage limits)
# Docker's tag grammar (distribution/reference); Go's \w is ASCII, so re.ASCII
_TAG = re.compile(TAG_PATTERN, re.ASCII)


def variant_fields(
    spec: ImageSpec, family: str, cuda: Cuda, axes: tuple[tuple[str, str], ...]
) -> dict[str, str]:
    """The fields a tag pattern, an exclusion and a template see for one variant."""
    return {
        "name": spec.name,
        "version": spec.version,
        "family": family,
        "cuda": cuda.full,
        "cuda_major": str(cuda.major),
        "cuda_minor": str(cuda.minor),
        **dict(axes),
    }


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One image variant to build."""

    spec: ImageSpec
    family: Family
    profiles: tuple[Profile, ...]
    cuda: Cuda
    axes: tuple[tuple[str, str], ...]
    tag: str
    dockerfile: Path
    catalogue: ProfileSet = field(compare=False)  # every profile: floors of any GPU admitted
    facts: CudaFacts = field(compare=False)
    registry: str | None = None  # prefix for a spec repository without a registry host
    platform: str = "linux/amd64"  # the entry of the tag's multi-platform index
    emulated: bool = False  # built under QEMU on the x86 runner (the spec's 'emulate')

    @property
    def arch(self) -> str:
        """The platform's CPU architecture (``amd64``, ``arm64``)."""
        return self.platform.split("/")[1]

    @property
    def runner(self) -> str:
        """The GitHub-hosted runner that builds the entry natively: ``ubuntu-24.04-arm``
        for arm64 (GitHub's Linux arm64 hosted runners, changelog 2025-01-16), else
        ``ubuntu-24.04`` (which emulates arm64 with QEMU where the spec asks)."""
        return "ubuntu-24.04-arm" if self.arch == "arm64" and not self.emulated else "ubuntu-24.04"

    @property
    def key(self) -> str:
        """A name for the tag's artifacts: the image and tag, safe in artifact names."""
        return f"{self.spec.name}-{self.tag}"

    @property
    def fields(self) -> dict[str, str]:
        return variant_fields(self.spec, self.family.value, self.cuda, self.axes)

    @property
    def repository(self) -> str:
        """The spec's repository, under ``registry`` where the spec names no host."""
        return qualified_repository(self.spec.repository, self.registry)

    @property
    def image_ref(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def sms(self) -> list[str]:
        return [p.sm for p in self.profiles]

    def _cuda_version(self) -> Version:
        return Version(self.cuda.mm)

    @property
    def gencode(self) -> list[str]:
        return [g for p in self.profiles for g in p.gencode(self._cuda_version())]

    @property
    def torch_arch_list(self) -> str:
        return ";".join(e for p in self.profiles for e in p.torch_arch_list(self._cuda_version()))

    @property
    def cmake_architectures(self) -> str:
        return ";".join(
            e for p in self.profiles for e in p.cmake_architectures(self._cuda_version())
        )

    def codes(self) -> list[CodeTarget]:
        """The device code the variant's gencode flags produce (SASS and PTX)."""
        tk = self.facts.toolkit(self._cuda_version())
        isa = tk.ptx_isa if tk is not None else None
        found = []
        for flag in self.gencode:
            code = flag.rsplit("code=", 1)[1]
            kind = CodeKind.SASS if code.startswith("sm_") else CodeKind.PTX
            arch = parse_arch(code)
            found.append(CodeTarget(arch=arch, ptx_isa=isa if kind is CodeKind.PTX else None))
        return found

    @cached_property
    def segments(self) -> list[Segment]:
        """Where the variant runs, with the driver each range needs (constraint.py)."""
        return admitted(
            self.codes(),
            runtime=self._cuda_version(),
            profiles=self.catalogue,
            facts=self.facts,
        )

    @property
    def min_driver(self) -> str:
        """The lowest driver on which the variant runs on some GPU it admits: the CUDA
        runtime floor, the hardware floor, and the JIT floor where only PTX runs."""
        return str(min(s.driver for s in self.segments))

    @property
    def nvidia_require_arch(self) -> str:
        """The ``NVIDIA_REQUIRE_ARCH`` value: exactly the (GPU, driver) pairs on which
        ``check`` passes the variant's code (constraint.py)."""
        return nvidia_require_arch(self.segments)

    @property
    def labels(self) -> dict[str, str]:
        return {
            "io.buildmatrix.family": self.family.value,
            "io.buildmatrix.sm": ",".join(self.sms),
            "io.buildmatrix.cuda": self.cuda.full,
            "io.buildmatrix.min-driver": self.min_driver,
            "io.buildmatrix.image": self.spec.name,
            "org.opencontainers.image.title": self.spec.name,
            "org.opencontainers.image.version": self.spec.version,
            "org.opencontainers.image.description": self.spec.description
            or f"{self.spec.name} for {self.family.value} GPUs",
        }

    def to_json(self, *, relative_to: Path | None = None) -> dict[str, Any]:
        def rel(path: Path) -> str:
            base = relative_to or Path.cwd()
            return Path(os.path.relpath(path, base)).as_posix()

        return {
            "image": self.spec.name,
            "family": self.family.value,
            "platform": self.platform,
            "arch": self.arch,
            "runner": self.runner,
            "qemu": self.emulated,
            "key": self.key,
            "repository": self.repository,
            "sm": self.sms,
            "cuda": self.cuda.full,
            "axes": dict(self.axes),
            "tag": self.tag,
            "tags": [self.image_ref],
            "dockerfile": rel(self.dockerfile),
            "context": rel(self.spec.context),
            "gencode": " ".join(self.gencode),
            "torch_arch_list": self.torch_arch_list,
            "cmake_architectures": self.cmake_architectures,
            "min_driver": self.min_driver,
            "nvidia_require_arch": self.nvidia_require_arch,
            "labels": self.labels,
        }


@dataclass(frozen=True, kw_only=True)
class Dropped:
    image: str
    what: str
    reason: str
    sm_only: bool = False  # one SM left out of a variant that is still built

    def __str__(self) -> str:
        return f"{self.image}: {self.what}: {self.reason}"


@dataclass
class Matrix:
    entries: list[Entry] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)


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
                f"{known}."
            )


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
        rule = _excluded(fields, spec.exclude)
        what = f"{v.what} {platform}"
        if rule is not None:
            matched.add(next(i for i, r in enumerate(spec.exclude) if r is rule))
            shown = ", ".join(f"{k}={val}" for k, val in rule.items())
            matrix.dropped.append(
                Dropped(image=spec.name, what=what, reason=f"excluded by the spec ({shown})")
            )
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
    return kept


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
        rule = _excluded(fields, spec.exclude)
        if rule is not None:
            matched.add(next(i for i, r in enumerate(spec.exclude) if r is rule))
            shown = ", ".join(f"{k}={v}" for k, v in rule.items())
            matrix.dropped.append(
                Dropped(image=spec.name, what=what, reason=f"excluded by the spec ({shown})")
            )
            continue
        reasons = {p.sm: _why_not(p, cuda, spec.requires) for p in members}
        kept = tuple(p for p in members if reasons[p.sm] is None)
        if not kept:
            matrix.dropped.append(
                Dropped(
                    image=spec.name, what=what, reason="; ".join(r for r in reasons.values() if r)
                )
            )
            continue
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
        tag = spec.tag.format(**fields)
        if not _TAG.fullmatch(tag):
            raise InputError(
                f"{spec.source}: key 'tag': the pattern '{spec.tag}' gives '{tag}' for {what}, "
                "which is not a Docker tag (letters, digits, '_', '.', '-'; at most 128; "
                "not starting with '.' or '-'). The tag also names the Dockerfile, so it "
                "must not hold '/', ':' or '..'."
            )
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


_REGISTRY = re.compile(rf"{HOST_PATTERN}(?:/{COMPONENT_PATTERN})*")


def qualified_repository(repository: str, registry: str | None) -> str:
    """``registry/repository`` when the repository names no registry host (its first
    component has no '.' or ':' and is not 'localhost', as Docker decides), else the
    repository as written: a host in the spec is deliberate."""
    first = repository.split("/", 1)[0]
    return repository if is_host(first) or not registry else f"{registry}/{repository}"


def check_registry(registry: str, *, what: str) -> str:
    """A registry prefix (``ghcr.io/org``, ``127.0.0.1:5000``), or an input error."""
    registry = registry.rstrip("/")
    if not _REGISTRY.fullmatch(registry):
        raise InputError(
            f"{what}: '{registry}' is not a registry prefix; expected HOST[:PORT][/PATH] "
            "with a lower-case path, e.g. ghcr.io/my-org or registry.example.com:5000/ml."
        )
    return registry


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
