"""``buildmatrix generate`` and ``buildmatrix matrix``: builds from the arch profiles."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import click

from buildmatrix.cli._common import (
    JSON_VERSION,
    Command,
    echo_error,
    json_text,
    load,
    profiles_option,
)
from buildmatrix.errors import InputError


def images_option(func: Any) -> Any:
    return click.option(
        "--images",
        "images_dir",
        default="images",
        show_default=True,
        metavar="DIR",
        help="Folder of image specs (DIR/NAME/image.yaml).",
    )(func)


def out_option(func: Any) -> Any:
    return click.option(
        "--out",
        "out_dir",
        default="build",
        show_default=True,
        metavar="DIR",
        help="Where the generated Dockerfiles go.",
    )(func)


def explain_option(func: Any) -> Any:
    return click.option(
        "--explain", is_flag=True, help="List every combination left out, and why (on stderr)."
    )(func)


def _matrix(
    images_dir: str,
    profiles_dir: str | None,
    out_dir: str,
    image: str | None,
    registry: str | None = None,
) -> Any:
    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.matrix import expand_all
    from buildmatrix.specs import load_specs
    from buildmatrix.variant import check_registry

    if registry:
        registry = check_registry(registry, what="--registry")
    profiles = load(profiles_dir)
    facts = load_cuda_facts()
    specs = load_specs(Path(images_dir), profiles, facts=facts, only=image)
    return expand_all(specs, profiles, facts=facts, out=Path(out_dir), registry=registry)


def _over_limit(entries: list[dict[str, Any]], limit: int) -> str:
    """How to split a GitHub matrix over the job limit: by image where each image
    fits, else by naming the axes of the image that alone is too large."""
    per_image = Counter(e["image"] for e in entries)
    counts = ", ".join(f"{k}: {v}" for k, v in per_image.items())
    head = (
        f"the matrix has {len(entries)} entries, over GitHub's limit of {limit} jobs per "
        f"matrix ({counts})."
    )
    too_large = [name for name, n in per_image.items() if n > limit]
    if not too_large:
        return f"{head} Split it: one matrix job per image with --image NAME."
    parts = []
    for name in too_large:
        mine = [e for e in entries if e["image"] == name]
        dims = {
            "families": {e["family"] for e in mine},
            "CUDA versions": {e["cuda"] for e in mine},
            "platforms": {e["platform"] for e in mine},
        }
        for e in mine:
            for axis, value in e["axes"].items():
                dims.setdefault(f"'{axis}' values", set()).add(value)
        shape = " x ".join(f"{len(v)} {k}" for k, v in dims.items())
        parts.append(f"{name} alone has {len(mine)} ({shape})")
    return (
        f"{head} {'; '.join(parts)}, so --image cannot split it. Narrow that spec: fewer "
        "axis values, CUDA versions or platforms, 'exclude' rules, or one spec per family group "
        "(each spec is its own matrix)."
    )


def _left_out(dropped: list[Any]) -> str:
    """'3 combinations left out, 2 SMs left out of their variants', counted apart."""
    sms = sum(1 for d in dropped if d.sm_only)
    n = len(dropped) - sms
    text = f"{n} combination{'' if n == 1 else 's'} left out"
    if sms:
        what = "SM left out of its variant" if sms == 1 else "SMs left out of their variants"
        text += f", {sms} {what}"
    return text


def _explain(matrix: Any) -> None:
    for line in matrix.platforms_built:
        click.echo(f"platform  {line}", err=True)
    if not matrix.dropped:
        click.echo("nothing left out", err=True)
    for d in matrix.dropped:
        click.echo(f"left out  {d}", err=True)


def _rendered(matrix: Any, images: Path, bases: Any) -> dict[Path, str]:
    """Each variant's Dockerfile text, its FROM images pinned and mirrored as
    ``bases`` says. The header names the spec relative to the images folder's parent
    (images/NAME/image.yaml), so it does not depend on where generate runs."""
    from buildmatrix.render import render

    base = images.resolve().parent
    files: dict[Path, str] = {}
    environments: dict[Path, Any] = {}
    for entry in matrix.entries:
        source = Path(os.path.relpath(entry.spec.source.resolve(), base)).as_posix()
        files[entry.dockerfile] = render(
            entry, source=source, bases=bases, environments=environments
        )
    return files


def _generated(text: str, marker: str) -> bool:
    """Whether a file is one generate wrote: its header, after any parser directives."""
    from buildmatrix.render import split_directives

    return split_directives(text)[1].startswith(marker)


def _stale(out: Path, expected: dict[Path, str]) -> list[Path]:
    """Generated Dockerfiles under ``out`` that the matrix no longer produces."""
    from buildmatrix.render import HEADER

    marker = HEADER.split("{", 1)[0]
    stale = []
    # Every image folder under out, not only those of specs still there: the files of a
    # removed image are stale too (only files generate wrote are ever listed).
    folders = sorted(p for p in out.iterdir() if p.is_dir()) if out.is_dir() else []
    for folder in folders:
        for path in sorted(folder.glob("*.Dockerfile")):
            if path not in expected and _generated(path.read_text(errors="replace"), marker):
                stale.append(path)
    return stale


@click.command("generate", cls=Command)
@images_option
@profiles_option
@out_option
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Write nothing; exit 1 if the files on disk differ from what would be written.",
)
@click.option(
    "--check-pins",
    is_flag=True,
    help="Also ask the registries whether each digest pinned in IMAGES/bases.yaml is "
    "still what its tag names (network); exit 1 when one is stale. Never done otherwise.",
)
@explain_option
def generate(  # noqa: PLR0917 - one parameter per option, as click passes them
    images_dir: str,
    profiles_dir: str | None,
    out_dir: str,
    check_only: bool,
    check_pins: bool,
    explain: bool,
) -> int:
    """Write one Dockerfile per matrix entry: OUT/IMAGE/TAG.Dockerfile.

    Each carries io.buildmatrix.* and OCI labels and an NVIDIA_REQUIRE_ARCH
    constraint derived from the SMs the variant holds; base images are pinned and
    mirrored as IMAGES/bases.yaml says.
    """
    from buildmatrix.bases import load_bases

    matrix = _matrix(images_dir, profiles_dir, out_dir, None)
    if explain:
        _explain(matrix)
    bases = load_bases(Path(images_dir))
    expected = _rendered(matrix, Path(images_dir), bases)
    failed = None
    if check_only:
        failed = _drift(Path(out_dir), expected)
    else:
        _write(Path(out_dir), expected, matrix.dropped, explain=explain)
    if check_pins and failed is None:
        failed = _check_pins(bases, list(expected.values()))
    if failed is not None:  # a check that said no: exit 1, as every command's
        echo_error(failed)
        return 1
    return 0


def _drift(out: Path, expected: dict[Path, str]) -> str | None:
    """``generate --check``: why the files differ (missing, changed and stale ones
    listed), or None when they are up to date."""
    stale = _stale(out, expected)
    missing = [p for p in expected if not p.is_file()]
    changed = [
        p for p, text in expected.items() if p.is_file() and p.read_text(errors="replace") != text
    ]
    if missing or changed or stale:
        lines = (
            [f"  missing  {p}" for p in missing]
            + [f"  changed  {p}" for p in changed]
            + [f"  stale    {p}" for p in stale]
        )
        return "generated files are out of date; run `buildmatrix generate`:\n" + "\n".join(lines)
    click.echo(f"{len(expected)} Dockerfiles in {out} are up to date")
    return None


def _write(out: Path, expected: dict[Path, str], dropped: list[Any], *, explain: bool) -> None:
    stale = _stale(out, expected)
    written = 0
    for path, text in expected.items():
        if path.is_file() and path.read_text(errors="replace") == text:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError as exc:
            raise InputError(f"--out {out}: cannot write {path}: {exc.strerror}.") from None
        written += 1
    for path in stale:
        path.unlink()
    click.echo(
        f"{len(expected)} Dockerfiles in {out}: {written} written, "
        f"{len(expected) - written} unchanged, {len(stale)} stale removed; "
        f"{_left_out(dropped)}" + (" (--explain says why)" if dropped and not explain else "")
    )


def _check_pins(bases: Any, texts: list[str]) -> str | None:
    """``--check-pins``: each pin a generated Dockerfile uses against what its tag
    names now (the only network step of generate); why it fails, naming the stale
    ones, or None."""
    from dataclasses import replace

    from buildmatrix.bases import unused_pins
    from buildmatrix.pins import pin_states

    where = bases.source or "bases.yaml"
    unused = unused_pins(bases, texts)
    for ref in unused:
        click.echo(f"{where}: pin {ref} is used by no generated Dockerfile", err=True)
    used = {ref: digest for ref, digest in bases.pins.items() if ref not in unused}
    states = pin_states(replace(bases, pins=used))
    stale = [s for s in states if s.stale]
    if stale:
        return (
            f"{where}: {len(stale)} pinned base digest{'s are' if len(stale) > 1 else ' is'} "
            "stale; update the pins (and run `buildmatrix generate`):\n"
            + "\n".join(f"  stale    {s}" for s in stale)
        )
    click.echo(f"{len(states)} pinned base digests in {where} are current")
    return None


@click.command("matrix", cls=Command)
@images_option
@profiles_option
@out_option
@click.option(
    "--image", metavar="NAME", help="Only this image (also a way to split large matrices)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["github", "merge", "bake", "json"]),
    default="github",
    show_default=True,
)
@click.option(
    "--registry",
    metavar="PREFIX",
    envvar="BUILDMATRIX_REGISTRY",
    help="Registry (and path) for spec repositories that name no host, e.g. "
    "ghcr.io/my-org: the one setting a workflow's login shares. Default: "
    "$BUILDMATRIX_REGISTRY, else the repositories as written.",
)
@click.option(
    "--source",
    "oci_source",
    metavar="URL",
    help="org.opencontainers.image.source for the entries' labels and annotations. "
    "Default: $GITHUB_SERVER_URL/$GITHUB_REPOSITORY where both are set.",
)
@click.option(
    "--revision",
    metavar="SHA",
    help="org.opencontainers.image.revision. Default: $GITHUB_SHA where set.",
)
@click.option(
    "--created",
    metavar="TIME",
    help="org.opencontainers.image.created: an ISO 8601 time or 'now'. Default: "
    "$SOURCE_DATE_EPOCH where set, else now inside GitHub Actions, else left out.",
)
@explain_option
def matrix(  # noqa: PLR0917 - one parameter per option, as click passes them
    images_dir: str,
    profiles_dir: str | None,
    out_dir: str,
    image: str | None,
    fmt: str,
    registry: str | None,
    oci_source: str | None,
    revision: str | None,
    created: str | None,
    explain: bool,
) -> int:
    """Print the build matrix: GitHub Actions strategy.matrix (one job per variant and
    platform), the merge matrix (one job per family tag, publishing its multi-platform
    index), docker buildx bake, or JSON. Every entry carries its content key and
    immutable tag, its build cache settings and the run's OCI labels."""
    from buildmatrix.bake import bake_file
    from buildmatrix.bases import load_bases
    from buildmatrix.matrix import GITHUB_MATRIX_LIMIT, merges
    from buildmatrix.pipeline import entry_extras, keys, merge_extras, run_info

    m = _matrix(images_dir, profiles_dir, out_dir, image, registry)
    if explain:
        _explain(m)
    run = run_info(oci_source, revision, created, env=os.environ)
    k = keys(m.entries, _rendered(m, Path(images_dir), load_bases(Path(images_dir))))
    entries = [
        e.to_json() | entry_extras(e, key=key, tag_key=k.tags[e.image_ref], run=run)
        for e, key in zip(m.entries, k.entries, strict=True)
    ]
    first = {e.image_ref: e for e in reversed(m.entries)}
    merged = [
        d | merge_extras(first[d["tags"][0]], tag_key=k.tags[d["tags"][0]], run=run)
        for d in merges(m.entries)
    ]
    if fmt == "github":
        if len(entries) > GITHUB_MATRIX_LIMIT:
            raise InputError(_over_limit(entries, GITHUB_MATRIX_LIMIT))
        doc: dict[str, Any] = {"include": [{k: e[k] for k in GITHUB_KEYS} for e in entries]}
    elif fmt == "merge":
        doc = {"include": merged}
    elif fmt == "bake":
        doc = bake_file(m.entries, keys=k, run=run)
    else:
        doc = {
            "version": JSON_VERSION,
            "entries": entries,
            "dropped": [{"image": d.image, "what": d.what, "reason": d.reason} for d in m.dropped],
            "merges": merged,
        }
    # github and merge: one line for $GITHUB_OUTPUT; json and bake as every JSON is
    click.echo(
        json_text(doc) if fmt in ("json", "bake") else json.dumps(doc, separators=(",", ":"))
    )
    return 0


GITHUB_KEYS = (
    "image",
    "family",
    "cuda",
    "tag",
    "tags",
    "dockerfile",
    "context",
    "gencode",
    "torch_arch_list",
    "sm",
    "platform",
    "arch",
    "runner",
    "qemu",
    "key",
    "repository",
    "content_key",
    "content_tag",
    "cache_from",
    "cache_to",
    "oci_labels",
    "annotations",
)
