"""Image specs: ``images/NAME/image.yaml``, validated on load into frozen dataclasses."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from buildmatrix import schema
from buildmatrix.arch import sorted_platforms
from buildmatrix.cuda import CudaFacts, newer_release_hint
from buildmatrix.errors import InputError, did_you_mean
from buildmatrix.profiles import FEATURE_MIN_CC, ProfileSet

DEFAULT_TAG = "{version}-cu{cuda_major}{cuda_minor}-{family}"
SPEC_FILE = "image.yaml"
# Fields every tag pattern, exclusion and template may use, besides the axes.
BUILTIN_FIELDS = ("name", "version", "family", "cuda", "cuda_major", "cuda_minor")
# An exclusion may also name the platform (linux/amd64, linux/arm64); a tag may not:
# every platform of a variant shares its tag, a multi-platform index (docs/generate.md).
PLATFORM_FIELD = "platform"
_CUDA = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True, kw_only=True)
class Cuda:
    """A CUDA version as a spec names it (``12.8.1``), with its parts."""

    full: str
    major: int
    minor: int

    @property
    def mm(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    name: str
    repository: str
    version: str
    description: str
    template: Path
    context: Path
    cuda: tuple[Cuda, ...]
    families: tuple[str, ...] | None
    requires: tuple[str, ...]
    axes: tuple[tuple[str, tuple[str, ...]], ...]
    exclude: tuple[dict[str, str], ...]
    tag: str
    source: Path
    platforms: tuple[str, ...] | None = None  # None: the families' products' hosts
    emulate: tuple[str, ...] = ()  # platforms built under QEMU on the x86 runner
    # where ``platforms`` comes from, for --explain: the spec's own key, the images
    # folder's fleet file, or (None) the arch profiles' hosts
    platforms_from: str | None = None

    @property
    def folder(self) -> Path:
        return self.source.parent


def _text(value: Any) -> str:
    # YAML gives booleans and numbers for axis values; templates and tags see text.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _not_a_float(value: Any, *, source: Path, key: str) -> None:
    """YAML reads 3.10 as the number 3.1: a version written bare silently changes."""
    if isinstance(value, float):
        raise InputError(
            f"{source}: key '{key}': {value!r} is a number to YAML (3.10 would become 3.1, "
            f'1.20 would become 1.2); quote it as text: "{value}" or the intended value.'
        )


def _check_fields(pattern: str, allowed: list[str], *, source: Path, key: str) -> None:
    try:
        parts = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(pattern)]
    except ValueError as exc:
        raise InputError(
            f"{source}: key '{key}': '{pattern}' is not a valid pattern ({exc})."
        ) from None
    fields = [f for f, _, _ in parts if f is not None]
    for field, spec, conv in parts:
        if field is not None and (spec or conv):
            raise InputError(
                f"{source}: key '{key}': '{{{field}{'!' + conv if conv else ''}"
                f"{':' + spec if spec else ''}}}' has a conversion or format spec; write "
                f"the plain field '{{{field}}}'."
            )
    for field in fields:
        if field not in allowed:
            raise InputError(
                f"{source}: key '{key}' uses unknown field '{{{field}}}'."
                f"{did_you_mean(field, allowed)} Known fields: {', '.join(allowed)}."
            )


def _check_cuda_releases(cudas: list[Cuda], *, tag: str, source: Path, facts: CudaFacts) -> None:
    """Each full CUDA version must be a release NVIDIA publishes as nvidia/cuda images
    (data/cuda.yaml, releases), and two versions of one MAJOR.MINOR need ``{cuda}`` in
    the tag pattern to get tags of their own."""
    for cuda in cudas:
        known = facts.releases.get(cuda.mm)
        if cuda.full == cuda.mm or known is None or cuda.full in known:
            continue  # MAJOR.MINOR, or a toolkit whose releases the facts do not list
        listed = (
            f"the known ones are {', '.join(known)}"
            if known
            else f"no nvidia/cuda image of CUDA {cuda.mm} is published yet"
        )
        raise InputError(
            f"{source}: key 'cuda': '{cuda.full}' is not a released CUDA version: {listed} "
            f"(nvidia/cuda:VERSION-* tags). Use one of them. {newer_release_hint()}"
        )
    if "{cuda}" in tag:
        return
    first: dict[str, Cuda] = {}
    for cuda in cudas:
        if cuda.mm in first:
            raise InputError(
                f"{source}: key 'cuda': '{first[cuda.mm].full}' and '{cuda.full}' are both "
                f"CUDA {cuda.mm}, so their variants get the same tags (the tag pattern "
                f"'{tag}' names CUDA by major and minor). Keep one of them, or put {{cuda}} "
                "into the tag pattern."
            )
        first[cuda.mm] = cuda


def spec_from_data(data: Any, path: Path, profiles: ProfileSet, *, facts: CudaFacts) -> ImageSpec:
    """One image spec from its YAML data, checked against the profiles and the CUDA
    facts (the caller's: the CLI reads them, buildmatrix.cuda.load_cuda_facts)."""
    source = path
    if data is None:
        raise InputError(
            f"{source}: the file is empty; an image spec needs name, repository, "
            "version, template and cuda."
        )
    schema.validate(data, "image-spec", source=str(source))
    folder = path.parent
    template = folder / data["template"]
    if not template.is_file():
        raise InputError(
            f"{source}: key 'template': {template} does not exist; the path is "
            f"relative to {folder}."
        )
    context = folder / data.get("context", ".")
    if not context.is_dir():
        raise InputError(f"{source}: key 'context': {context} is not a folder.")
    cudas = _cudas(data, source=source, facts=facts)
    families, requires = _families_and_requires(data, profiles, source=source)
    axes = _axes(data, source=source)
    fields = [*BUILTIN_FIELDS, *(k for k, _ in axes)]
    tag = data.get("tag", DEFAULT_TAG)
    if "{" + PLATFORM_FIELD + "}" in tag:
        raise InputError(
            f"{source}: key 'tag' uses '{{{PLATFORM_FIELD}}}', but every platform of a "
            "variant shares one tag (a multi-platform image whose entries each node's "
            "runtime picks); leave it out, and narrow the platforms with 'platforms:'."
        )
    _check_fields(tag, fields, source=source, key="tag")
    exclude = _exclude(data, fields, source=source)
    platforms, emulate = _platforms(data, source=source)
    if data["name"] != folder.name:
        raise InputError(
            f"{source}: key 'name' is '{data['name']}' but the folder is "
            f"'{folder.name}'; make them agree."
        )
    return ImageSpec(
        name=data["name"],
        repository=data["repository"],
        version=data["version"],
        description=data.get("description", ""),
        template=template,
        context=context,
        cuda=tuple(cudas),
        families=families,
        requires=requires,
        axes=axes,
        exclude=tuple(exclude),
        tag=tag,
        source=source,
        platforms=platforms,
        emulate=emulate,
        platforms_from=f"{source.name}, key 'platforms'" if platforms is not None else None,
    )


def _cudas(data: Any, *, source: Path, facts: CudaFacts) -> list[Cuda]:
    """The spec's CUDA versions, each a release the facts know (_check_cuda_releases)."""
    cudas = []
    for text in data["cuda"]:
        m = _CUDA.fullmatch(text)
        if m is None:  # pragma: no cover - the schema's pattern is the same
            raise InputError(f"{source}: key 'cuda': '{text}' is not a CUDA version.")
        cudas.append(Cuda(full=text, major=int(m[1]), minor=int(m[2])))
    _check_cuda_releases(cudas, tag=data.get("tag", DEFAULT_TAG), source=source, facts=facts)
    return cudas


def _families_and_requires(
    data: Any, profiles: ProfileSet, *, source: Path
) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """The families the spec names (None: every one) and the features it requires, each
    known to the profiles."""
    known = [f.value for f in profiles.families]
    families = tuple(data["families"]) if "families" in data else None
    for family in families or ():
        if family not in known:
            raise InputError(
                f"{source}: key 'families': no profile has family '{family}'."
                f"{did_you_mean(family, known)} Families: {', '.join(known)}."
            )
    requires = tuple(data.get("requires", ()))
    for feature in requires:
        if feature not in FEATURE_MIN_CC:
            raise InputError(
                f"{source}: key 'requires': unknown feature '{feature}'."
                f"{did_you_mean(feature, list(FEATURE_MIN_CC))} Features: "
                f"{', '.join(FEATURE_MIN_CC)}."
            )
        if not any(feature in p.features for p in profiles):
            raise InputError(
                f"{source}: key 'requires': no arch profile has feature "
                f"'{feature}', so nothing could be built."
            )
    return families, requires


def _axes(data: Any, *, source: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The spec's axes as text, none named as a built-in field."""
    for k, values in (data.get("axes") or {}).items():
        for v in values:
            _not_a_float(v, source=source, key=f"axes.{k}")
    axes = tuple(
        (k, tuple(_text(v) for v in values)) for k, values in (data.get("axes") or {}).items()
    )
    clash = [k for k, _ in axes if k in (*BUILTIN_FIELDS, PLATFORM_FIELD)]
    if clash:
        raise InputError(
            f"{source}: key 'axes': '{clash[0]}' is a built-in field; rename the axis."
        )
    return axes


def _exclude(data: Any, fields: list[str], *, source: Path) -> list[dict[str, str]]:
    """The exclusion rules as text, each naming only known fields."""
    exclude = []
    rule_fields = [*fields, PLATFORM_FIELD]
    for i, rule in enumerate(data.get("exclude") or []):
        for key in rule:
            if key not in rule_fields:
                raise InputError(
                    f"{source}: key 'exclude[{i}]' names unknown field '{key}'."
                    f"{did_you_mean(key, rule_fields)} Known fields: {', '.join(rule_fields)}."
                )
        for k, v in rule.items():
            _not_a_float(v, source=source, key=f"exclude[{i}].{k}")
        exclude.append({k: _text(v) for k, v in rule.items()})
    return exclude


def _platforms(data: Any, *, source: Path) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """The spec's ``platforms`` (None: derived from the profiles) and ``emulate``."""
    platforms = sorted_platforms(data["platforms"]) if "platforms" in data else None
    emulate = sorted_platforms(data.get("emulate", ()))
    for platform in emulate:
        if platforms is not None and platform not in platforms:
            raise InputError(
                f"{source}: key 'emulate' names {platform}, which 'platforms' does not "
                f"build ({', '.join(platforms)}); add it to 'platforms' or drop it here."
            )
    return platforms, emulate


def load_specs(
    images: Path, profiles: ProfileSet, *, facts: CudaFacts, only: str | None = None
) -> list[ImageSpec]:
    """Every ``*/image.yaml`` under ``images`` (sorted by name), or just ``only``."""
    from buildmatrix.yamlio import load_yaml_file

    if not images.is_dir():
        raise InputError(
            f"images folder {images} does not exist; pass --images DIR (a folder "
            "with one sub-folder per image, each holding image.yaml)."
        )
    paths = sorted(images.glob(f"*/{SPEC_FILE}"))
    if only is not None:
        names = [p.parent.name for p in paths]
        if only not in names:
            raise InputError(
                f"no image '{only}' in {images}.{did_you_mean(only, names)} "
                f"Images: {', '.join(names) or '(none)'}."
            )
        paths = [p for p in paths if p.parent.name == only]
    if not paths:
        raise InputError(f"{images} holds no */{SPEC_FILE}; add images/NAME/{SPEC_FILE}.")
    specs = [spec_from_data(load_yaml_file(p), p, profiles, facts=facts) for p in paths]
    fleet = load_fleet(images)
    return specs if fleet is None else [_on_fleet(s, fleet, images / FLEET_FILE) for s in specs]


FLEET_FILE = "fleet.yaml"


def load_fleet(images: Path) -> tuple[str, ...] | None:
    """The platforms ``IMAGES/fleet.yaml`` states for the fleet's GPU nodes, or None
    where there is no such file (each spec then builds what the profiles' hosts need)."""
    from buildmatrix.yamlio import load_yaml_file

    path = images / FLEET_FILE
    if not path.is_file():
        return None
    data = load_yaml_file(path)
    schema.validate(data, "fleet", source=str(path))
    return sorted_platforms(data["platforms"])


def _on_fleet(spec: ImageSpec, fleet: tuple[str, ...], path: Path) -> ImageSpec:
    """A spec without its own ``platforms`` builds the fleet's; ``emulate`` must name
    one of them."""
    if spec.platforms is not None:
        return spec  # the spec's own choice wins over the folder's
    for platform in spec.emulate:
        if platform not in fleet:
            raise InputError(
                f"{spec.source}: key 'emulate' names {platform}, which {path} does not "
                f"list among the fleet's platforms ({', '.join(fleet)}); drop it here, or "
                "add it there."
            )
    return replace(spec, platforms=fleet, platforms_from=f"{path}, key 'platforms'")
