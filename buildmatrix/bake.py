"""The ``docker buildx bake`` file of a matrix (``matrix --format bake``). Pure."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from buildmatrix.errors import InputError
from buildmatrix.pipeline import Keys, RunInfo, content_tag, gha_cache
from buildmatrix.variant import Entry


def bake_file(entries: Sequence[Entry], *, keys: Keys, run: RunInfo) -> dict[str, Any]:
    """One target per family tag, with the platforms it is built for. A tag whose
    platforms hold different SMs (the arch profiles' hosts) has a Dockerfile per
    platform, which one target cannot build: it gets a target per platform, tagged
    ``REF-ARCH``, for ``docker buildx imagetools create`` to merge (docs/generate.md).
    Each target also carries the tag's immutable content tag (``-ARCH`` likewise),
    a ``gha`` cache scope of its own (the target's name), and the run's OCI labels
    and annotations. Paths are relative to the current directory, so run ``docker
    buildx bake -f FILE`` from where ``matrix`` ran."""
    by_ref: dict[str, list[Entry]] = {}
    for entry in entries:
        by_ref.setdefault(entry.image_ref, []).append(entry)
    targets: dict[str, Any] = {}
    for ref, group in by_ref.items():
        shared = len({e.dockerfile for e in group}) == 1
        immutable = content_tag(group[0], keys.tags[ref])
        parts = (
            [(group[0], ref, immutable, "")]
            if shared
            else [(e, f"{ref}-{e.arch}", f"{immutable}-{e.arch}", e.arch) for e in group]
        )
        for entry, tag, fixed, suffix in parts:
            # bake target names allow [A-Za-z0-9_-]: '.' becomes '-', so two tags can meet
            base = f"{entry.spec.name}-{entry.tag}" + (f"-{suffix}" if suffix else "")
            name = re.sub(r"[^A-Za-z0-9_-]", "-", base)
            if name in targets:
                raise InputError(
                    f"{entry.spec.source}: tags '{targets[name]['tags'][0]}' and "
                    f"'{tag}' both become the bake target '{name}' (bake names "
                    "allow letters, digits, '_' and '-'); make the tags differ in more than "
                    "'.' against '-'."
                )
            context = Path(os.path.relpath(entry.spec.context))
            cache_from, cache_to = gha_cache(name)
            targets[name] = {
                "context": context.as_posix(),
                "dockerfile": Path(os.path.relpath(entry.dockerfile, context)).as_posix(),
                "tags": [tag, fixed],
                "labels": entry.labels | dict(run.pairs()),
                "annotations": run.annotations("manifest", "index"),
                "platforms": [e.platform for e in group] if shared else [entry.platform],
                "cache-from": [cache_from],
                "cache-to": [cache_to],
            }
    return {"group": {"default": {"targets": list(targets)}}, "target": targets}
