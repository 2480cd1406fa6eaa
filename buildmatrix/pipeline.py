"""What a CI pipeline needs per matrix entry beside the Dockerfile: its content key
and immutable tag, its build cache settings, and the OCI labels and annotations of
the run (docs/generate.md, "Content keys", "Caching", "Labels of the run").

Everything here is data from data, except ``keys``, which reads the build context's
files (buildmatrix.content_key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from buildmatrix.content_key import SHORT, combined_key, content_key, context_files, used_sources
from buildmatrix.errors import InputError
from buildmatrix.variant import Entry

_TAG_MAX = 128  # distribution/reference: a tag is at most 128 characters


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """The run's OCI values, as docker/metadata-action writes them (src/meta.ts,
    ``getOCIAnnotationsWithCustoms``): ``source`` the repository's web URL,
    ``revision`` the commit SHA, ``created`` the build time as JavaScript's
    ``toISOString()`` (``2026-12-01T17:30:00.000Z``). A value not known is left out."""

    source: str | None = None
    revision: str | None = None
    created: str | None = None

    def pairs(self) -> list[tuple[str, str]]:
        """``(key, value)`` sorted by key, as metadata-action sorts its labels."""
        values = {"created": self.created, "revision": self.revision, "source": self.source}
        return [(f"org.opencontainers.image.{k}", v) for k, v in sorted(values.items()) if v]

    def labels(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.pairs()]

    def annotations(self, *levels: str) -> list[str]:
        """``LEVEL:KEY=VALUE`` per level, as metadata-action's annotations output
        with ``DOCKER_METADATA_ANNOTATIONS_LEVELS`` set to those levels."""
        return [f"{level}:{label}" for level in levels for label in self.labels()]


def iso_created(moment: datetime) -> str:
    """A time as JavaScript's ``Date.toISOString()`` writes it (UTC, milliseconds)."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


@dataclass(frozen=True, kw_only=True)
class Keys:
    """Content keys: per entry (its platform's build) and per family tag (the index)."""

    entries: tuple[str, ...]  # in the matrix's order
    tags: Mapping[str, str]  # image_ref -> the key of its multi-platform index


def keys(entries: Sequence[Entry], texts: Mapping[Path, str]) -> Keys:
    """Each entry's content key from its Dockerfile text and the context files it
    reads; each family tag's from its platforms' keys. Reads the contexts once."""
    seen: dict[tuple[Path, tuple[str, ...] | None], dict[str, str]] = {}
    found = []
    per_tag: dict[str, dict[str, str]] = {}
    for entry in entries:
        text = texts[entry.dockerfile]
        sources = used_sources(text)
        memo = (entry.spec.context.resolve(), None if sources is None else tuple(sources))
        if memo not in seen:
            seen[memo] = context_files(entry.spec.context, sources)
        key = content_key(dockerfile=text, platform=entry.platform, files=seen[memo])
        found.append(key)
        per_tag.setdefault(entry.image_ref, {})[entry.platform] = key
    return Keys(entries=tuple(found), tags={ref: combined_key(k) for ref, k in per_tag.items()})


def content_tag(entry: Entry, key: str) -> str:
    """The immutable tag of a family tag's index: ``REPO:TAG-KEY16``."""
    tag = f"{entry.tag}-{key[:SHORT]}"
    if len(tag) > _TAG_MAX:
        raise InputError(
            f"{entry.spec.source}: key 'tag': '{entry.tag}' leaves no room for the content "
            f"key: '{tag}' is over {_TAG_MAX} characters (a Docker tag's limit). Shorten "
            f"the tag pattern to at most {_TAG_MAX - SHORT - 1} characters."
        )
    return f"{entry.repository}:{tag}"


def cache_scope(entry: Entry) -> str:
    """A GitHub Actions cache scope of its own per entry and platform: entries that
    share a scope overwrite each other's cache (docker docs, "GitHub Actions cache",
    ``scope``)."""
    return f"{entry.key}-{entry.arch}"


def gha_cache(scope: str) -> tuple[str, str]:
    """``cache-from`` and ``cache-to`` for BuildKit's ``gha`` cache; ``mode=max``
    exports every stage's layers (the nvcc build stage too), not only the final's."""
    return f"type=gha,scope={scope}", f"type=gha,scope={scope},mode=max"


def entry_extras(entry: Entry, *, key: str, tag_key: str, run: RunInfo) -> dict[str, Any]:
    """The pipeline keys of one build entry (json and github formats)."""
    cache_from, cache_to = gha_cache(cache_scope(entry))
    return {
        "content_key": key,
        "content_tag": content_tag(entry, tag_key),
        "cache_from": cache_from,
        "cache_to": cache_to,
        "oci_labels": run.labels(),
        "annotations": run.annotations("manifest"),
    }


def merge_extras(entry: Entry, *, tag_key: str, run: RunInfo) -> dict[str, Any]:
    """The pipeline keys of one family tag's merge entry: its index's key and tag,
    and the index annotations for ``docker buildx imagetools create --annotation``."""
    return {
        "content_key": tag_key,
        "content_tag": content_tag(entry, tag_key),
        "annotations": run.annotations("index"),
    }


def run_info(
    source: str | None, revision: str | None, created: str | None, *, env: Mapping[str, str]
) -> RunInfo:
    """The run's OCI values from the options, else from the environment GitHub
    Actions sets (``GITHUB_SERVER_URL``, ``GITHUB_REPOSITORY``, ``GITHUB_SHA``) and
    ``SOURCE_DATE_EPOCH`` (reproducible-builds.org's variable for a build's time)."""
    if source is None and env.get("GITHUB_SERVER_URL") and env.get("GITHUB_REPOSITORY"):
        source = f"{env['GITHUB_SERVER_URL']}/{env['GITHUB_REPOSITORY']}"
    revision = revision or env.get("GITHUB_SHA") or None
    epoch = env.get("SOURCE_DATE_EPOCH")
    when: datetime | None = None
    if created == "now" or (created is None and not epoch and env.get("GITHUB_ACTIONS") == "true"):
        when = datetime.now(UTC)
    elif created is not None:
        try:
            when = datetime.fromisoformat(created)
        except ValueError:
            raise InputError(
                f"--created: '{created}' is not an ISO 8601 time; give e.g. "
                "2026-12-01T17:30:00Z, or 'now'."
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
    elif epoch:
        if not epoch.isdigit():
            raise InputError(
                f"$SOURCE_DATE_EPOCH: '{epoch}' is not a number of seconds since 1970; "
                "set it to an integer (e.g. $(git log -1 --format=%ct)) or unset it."
            )
        when = datetime.fromtimestamp(int(epoch), UTC)
    return RunInfo(
        source=source or None,
        revision=revision,
        created=iso_created(when) if when is not None else None,
    )
