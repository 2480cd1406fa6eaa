"""Base images: a mirror registry and digest pins for the ``FROM`` lines of every
generated Dockerfile, from ``IMAGES/bases.yaml`` (docs/generate.md, "Bases").

NVIDIA removes the ``nvidia/cuda`` tags of end-of-life releases, and a tag can be
re-pushed; a pinned digest keeps a build reproducible, a mirror keeps it working
where Docker Hub is not reachable (hermetic builds). Both are applied when the
Dockerfile is rendered, so the committed Dockerfiles, and hence the content keys,
name exactly what is pulled. Pure: data in, text out (the registry look-up for
stale pins lives in the CLI).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildmatrix.errors import InputError
from buildmatrix.image.ref import DEFAULT_HOST, Transport, is_host, parse_name

BASES_FILE = "bases.yaml"
# A FROM instruction: flags (--platform=...), the image, an optional stage name.
# Dockerfile reference, "FROM": FROM [--platform=<platform>] <image> [AS <name>]
_FROM = re.compile(
    r"[ \t\v\f\r]*FROM[ \t\v\f\r]+(?:--\S+\s+)*(?P<ref>[^\s-]\S*)(?P<tail>.*)", re.I | re.S
)
_AS = re.compile(r"\s+AS\s+(?P<name>\S+)", re.IGNORECASE)
# Dockerfile reference, "Parser directives": at the very top, ``# key=value`` lines
# (BuildKit knows syntax, escape and check; an unknown key, or any other line, ends
# them); "Here-Documents": in RUN, COPY and ADD, a shell word <<WORD or <<-WORD
# (BuildKit: ``^(\d*)<<(-?)([^<]*)$``, WORD with its quotes removed) opens a body that
# runs to the line that is WORD (after leading tabs, with <<-).
_DIRECTIVE = re.compile(r"#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*")
_KNOWN_DIRECTIVES = ("syntax", "escape", "check")
_HEREDOC_WORD = re.compile(r"\d*<<(-?)([^<]+)")
_HEREDOC_INSTRUCTIONS = ("RUN", "COPY", "ADD")
_BOM = "\ufeff"


@dataclass(frozen=True, kw_only=True)
class _From:
    ref: str
    start: int  # where ``ref`` is in the text (one physical line)
    stage: str | None  # the stage it names (AS NAME), lower-case


def _escape_char(lines: list[str]) -> str:
    escape = "\\"
    for line in lines:
        m = _DIRECTIVE.fullmatch(line.strip().removeprefix(_BOM))
        if m is None or m[1].lower() not in _KNOWN_DIRECTIVES:
            break  # the first line that is no known directive ends them
        if m[1].lower() == "escape" and m[2] in ("\\", "`"):
            escape = m[2]
    return escape


def _heredocs(body: str) -> list[tuple[bool, str]]:
    """(strip tabs, WORD) of each heredoc an instruction opens, in order."""
    keyword = body.split(None, 1)[0].upper() if body.split() else ""
    if keyword not in _HEREDOC_INSTRUCTIONS:
        return []
    found = []
    for word in body.split():
        if m := _HEREDOC_WORD.fullmatch(word):
            name = m[2].replace('"', "").replace("'", "")
            if name:
                found.append((m[1] == "-", name))
    return found


def _instructions(text: str) -> list[tuple[str, list[int]]]:
    """The Dockerfile's instructions as BuildKit joins them: lines split at ``\\n``
    alone, a leading byte order mark dropped, continued lines (ending in the escape
    character, a backslash or a ``# escape=`` directive's) joined, comment lines inside
    them dropped, heredoc bodies skipped; each with the text offset of every character
    it keeps."""
    lines = text.split("\n")
    escape = _escape_char(lines)
    starts, offset = [], 0
    for line in lines:
        starts.append(offset)
        offset += len(line) + 1
    if lines and lines[0].startswith(_BOM):
        lines[0], starts[0] = lines[0][1:], 1
    out: list[tuple[str, list[int]]] = []
    i = 0
    while i < len(lines):
        body, where = "", list[int]()
        while i < len(lines):
            line = lines[i].removesuffix("\r")
            i += 1
            if not line.strip() or line.lstrip().startswith("#"):
                if body:
                    continue  # an empty or comment line inside a continued instruction
                break  # a comment (or directive) line of its own, never continued
            stripped = line.rstrip()
            continued = stripped.endswith(escape)
            kept = stripped[:-1] if continued else line
            body += kept
            where += range(starts[i - 1], starts[i - 1] + len(kept))
            if not continued:
                break
        if not body.strip():
            continue
        out.append((body, where))
        for strip, word in _heredocs(body):
            while i < len(lines):
                closing = lines[i].removesuffix("\r")
                i += 1
                if (closing.lstrip("\t") if strip else closing) == word:
                    break
    return out


def _froms(text: str) -> list[_From]:
    out = []
    for body, where in _instructions(text):
        m = _FROM.match(body)
        if m is None:
            continue
        named = _AS.match(m["tail"])
        ref, at = m["ref"], m.start("ref")
        if len(ref) > 2 and ref[0] == ref[-1] and ref[0] in "\"'":
            ref, at = ref[1:-1], at + 1  # BuildKit unquotes FROM's image
        start, end = where[at], where[at + len(ref) - 1] + 1
        if end - start != len(ref):
            raise InputError(
                f"FROM {m['ref']}: the image reference is split over lines; write it on one."
            )
        out.append(_From(ref=ref, start=start, stage=named["name"].lower() if named else None))
    return out


@dataclass(frozen=True, kw_only=True)
class Bases:
    """Where base images come from: ``registry`` (a mirror of Docker Hub) and
    ``pins`` (reference as the template writes it -> ``sha256:`` digest)."""

    registry: str | None = None
    pins: dict[str, str] = field(default_factory=dict)
    source: Path | None = None


NO_BASES = Bases()


def _docker_hub_path(ref: str) -> str | None:
    """The repository path of a Docker Hub reference (``library/`` added for official
    images, as Docker resolves them), or None for a reference that names a host."""
    first, _, rest = ref.partition("/")
    if rest and first in (DEFAULT_HOST, "index.docker.io", "registry-1.docker.io"):
        ref = rest
    elif rest and is_host(first):
        return None
    name = re.split(r"[:@]", ref, maxsplit=1)[0]
    return ref if "/" in name else f"library/{ref}"


def external_refs(text: str) -> list[str]:
    """The images a Dockerfile's FROM lines pull, in order: not ``scratch``, not an
    earlier stage's name, not one built from an ARG (``$``)."""
    return [f.ref for f in _pulling(text)]


def _pulling(text: str) -> list[_From]:
    """The FROM instructions of :func:`external_refs`."""
    stages: set[str] = set()
    pulling = []
    for f in _froms(text):
        if f.ref.lower() not in stages and f.ref.lower() != "scratch" and "$" not in f.ref:
            pulling.append(f)
        if f.stage:
            stages.add(f.stage)
    return pulling


# NVIDIA's CUDA images on Docker Hub: every tag is VERSION-FLAVOUR-OS, VERSION a full
# MAJOR.MINOR.PATCH (gitlab.com/nvidia/container-images/cuda, doc/supported-tags.md).
NVIDIA_CUDA = "nvidia/cuda"


def nvidia_cuda_tags(text: str) -> list[tuple[str, str]]:
    """``(reference, tag)`` of each FROM line that pulls ``nvidia/cuda`` from Docker Hub
    by tag (a reference with a digest pulls the digest, whatever its tag says)."""
    out = []
    for ref in external_refs(text):
        path = _docker_hub_path(ref)
        if path is None or "@" in ref:
            continue
        name, _, tag = path.partition(":")
        if name == NVIDIA_CUDA and tag:
            out.append((ref, tag))
    return out


def apply(text: str, bases: Bases) -> str:
    """``text`` with each external FROM reference pinned (``REF@sha256:...``, the tag
    kept for readers; the digest is what Docker pulls) and, for Docker Hub
    references, pulled through ``bases.registry`` (``MIRROR/library/ubuntu:24.04``).
    References that name another registry are kept: a mirror stands in for Docker
    Hub, as the engine's ``registry-mirrors`` setting does."""
    if not bases.registry and not bases.pins:
        return text
    for f in reversed(_pulling(text)):  # from the end: earlier offsets stay right
        ref = f.ref
        if "@" not in ref and ref in bases.pins:
            ref = f"{ref}@{bases.pins[ref]}"
        path = _docker_hub_path(ref)
        if bases.registry and path is not None:
            ref = f"{bases.registry}/{path}"
        text = text[: f.start] + ref + text[f.start + len(f.ref) :]
    return text


def unused_pins(bases: Bases, texts: list[str]) -> list[str]:
    """Pinned references that no generated Dockerfile pulls (a removed base, a typo):
    a pin is used where its rewritten form (pinned, mirrored) is a FROM image."""
    used = {r for t in texts for r in external_refs(t)}
    return sorted(
        ref for ref in bases.pins if external_refs(apply(f"FROM {ref}\n", bases))[0] not in used
    )


def bases_from_data(data: Any, path: Path) -> Bases:
    """Validate a loaded ``bases.yaml`` into ``Bases`` (exit 2 naming the key)."""
    from buildmatrix import schema
    from buildmatrix.variant import check_registry

    if data is None:
        return Bases(source=path)
    schema.validate(data, "bases", source=str(path))
    registry = data.get("registry")
    if registry is not None:
        registry = check_registry(registry, what=f"{path}: key 'registry'")
    pins = {}
    for ref, digest in (data.get("pins") or {}).items():
        parsed = parse_name(ref, given=f"{path}: key 'pins.{ref}'", transport=Transport.BARE)
        if parsed.digest or not parsed.tag:
            raise InputError(
                f"{path}: key 'pins.{ref}': write the reference as the template's FROM "
                "line does, NAME:TAG without a digest (e.g. "
                "nvidia/cuda:12.9.1-devel-ubuntu24.04); the digest is the value."
            )
        pins[ref] = digest
    return Bases(registry=registry, pins=pins, source=path)


def load_bases(images: Path) -> Bases:
    """``IMAGES/bases.yaml`` where it exists, else no mirror and no pins."""
    from buildmatrix.yamlio import load_yaml_file

    path = images / BASES_FILE
    if not path.is_file():
        return NO_BASES
    return bases_from_data(load_yaml_file(path), path)
