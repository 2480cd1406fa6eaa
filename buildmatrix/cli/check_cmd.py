"""``buildmatrix check REF``: can this image run on these GPUs and this driver?

The checking is buildmatrix/check_refs.py; this command parses options, calls it and
prints (text, --format json, the --summary and --digest-file lines)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from buildmatrix.cli._common import (
    ByteProgress,
    Command,
    containerd_options,
    containerd_store,
    echo_json,
    json_option,
    load,
    profiles_option,
    timeout_option,
)
from buildmatrix.cli.check_text import markdown, print_platforms

if TYPE_CHECKING:
    from buildmatrix.check import CheckResult
    from buildmatrix.check_refs import CheckRun
    from buildmatrix.image.cache import LayerCache
    from buildmatrix.profiles import ProfileSet


@click.command("check", cls=Command)
@click.argument("refs", nargs=-1, required=True, metavar="REF...")
@click.option(
    "--family",
    "families",
    multiple=True,
    metavar="F",
    help="Target GPU family from the profiles (repeatable); 'all': every profile, each "
    "of which must pass.",
)
@click.option(
    "--sm",
    "sms",
    multiple=True,
    metavar="SM",
    help="Target SM: sm_90, sm_90a, 9.0 or 90 (repeatable).",
)
@click.option("--driver", metavar="VER", help="Node driver version, e.g. 535.104.05.")
@click.option(
    "--snapshot",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Node snapshot JSON (smoke --record): its driver, and its GPUs as targets "
    "when no target is given.",
)
@click.option("--require-sass", is_flag=True, help="Fail when a target runs only by PTX JIT.")
@click.option(
    "--ignore",
    "ignore",
    multiple=True,
    metavar="GLOB",
    help="Leave out files matching GLOB (repeatable), e.g. '*/libnvrtc-builtins*'.",
)
@click.option("--allow-empty", is_flag=True, help="Pass an image without any CUDA device code.")
@click.option(
    "--strict",
    is_flag=True,
    help="Count every file and every fatbinary container (translation unit): optional "
    "files and specialised code too.",
)
@click.option(
    "--platform",
    metavar="OS/ARCH",
    help="Judge only this entry of a multi-platform image (e.g. linux/arm64). Default: "
    "every entry the image offers behind which a target GPU can sit (the profiles' "
    "hosts), starting with linux/amd64.",
)
@containerd_options
@timeout_option
@click.option(
    "--cache",
    "cache_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Layer summaries by digest, reused across images and runs "
    "(default: $XDG_CACHE_HOME/buildmatrix/layers).",
)
@click.option("--no-cache", is_flag=True, help="Read every layer; keep no summaries.")
@click.option(
    "--summary",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Append a Markdown summary to FILE (e.g. $GITHUB_STEP_SUMMARY).",
)
@click.option(
    "--digest-file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Append one line per judged entry to FILE: DIGEST PLATFORM VERDICT REF, DIGEST "
    "the manifest judged ('-' where the source has none).",
)
@click.option(
    "--attest",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write an in-toto Statement v1 of the verdicts to FILE (predicateType "
    "https://buildmatrix.io/check/v1; subject: the digests judged). One image only, and "
    "one with a digest.",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="List every file, every piece of specialised code and every failure line; by "
    "default one summary line each (--format json always has them all).",
)
@profiles_option
@json_option
# Over 60 lines only by its signature (one parameter per option) and help text: the
# work is check_refs, the printing the functions below.
def check(  # noqa: PLR0917 - one parameter per option, as click passes them
    refs: tuple[str, ...],
    families: tuple[str, ...],
    sms: tuple[str, ...],
    driver: str | None,
    snapshot: Path | None,
    require_sass: bool,
    ignore: tuple[str, ...],
    allow_empty: bool,
    strict: bool,
    platform: str | None,
    cache_dir: Path | None,
    no_cache: bool,
    summary: Path | None,
    digest_file: Path | None,
    attest: Path | None,
    profiles_dir: str | None,
    as_json: bool,
    verbose: bool,
) -> int:
    """Check which GPUs images can run on, from the binaries inside them.

    REF: docker-daemon:NAME[:TAG], docker://HOST/NAME[:TAG|@DIGEST], oci:PATH[:TAG],
    docker-archive:PATH, dir:PATH, an existing path, or a bare NAME[:TAG] (the local
    engine if it has it, else the registry). Without --family/--sm each image's
    io.buildmatrix.family label sets its targets; without the label every profile is
    judged, to say where the image runs: it passes if it runs on at least one
    profile's GPU, and fails only where it runs on none. Several REFs are checked in
    one run, sharing the layers they share (the layer cache). Exit 0 all pass, 1 any
    fails.
    """
    from buildmatrix.check import Options, validate_targets
    from buildmatrix.cuda import load_cuda_facts, parse_driver_version
    from buildmatrix.snapshot import load_snapshot

    if attest is not None:  # before any I/O
        from buildmatrix.attest import require_one

        require_one(len(refs))
    profiles = load(profiles_dir)
    drv = None if driver is None else parse_driver_version(driver, what="--driver")
    snap = None if snapshot is None else load_snapshot(snapshot)
    validate_targets(profiles, Options(families=families, sms=sms))  # before any I/O
    opts = Options(
        families=families,
        sms=sms,
        driver=drv,
        snapshot=snap,
        require_sass=require_sass,
        ignore=ignore,
        allow_empty=allow_empty,
        strict=strict,
    )
    from buildmatrix.check_refs import check_refs

    cache = _layer_cache(cache_dir, no_cache=no_cache)
    run = check_refs(
        refs,
        profiles=profiles,
        options=opts,
        facts=load_cuda_facts(),
        platform=platform,
        cache=cache,
        containerd=containerd_store(),
        progress=ByteProgress,
    )
    if summary is not None:
        _append(summary, "--summary", [markdown(r) for pr in run.results for _, r in pr.results])
    if digest_file is not None:
        _append(
            digest_file,
            "--digest-file",
            [_digest_line(p, r) for pr in run.results for p, r in pr.results],
        )
    if attest is not None:
        _write_attestation(attest, run, profiles)
    if as_json:
        _echo_run_json(run, cache)
    else:
        _print_run(run, cache, verbose=verbose)
    return 0 if run.passed else 1


def _write_attestation(path: Path, run: CheckRun, profiles: ProfileSet) -> None:
    """--attest: the Statement (buildmatrix.attest) to ``path`` and nowhere else; an
    image without a digest is refused before anything is written."""
    import json
    from datetime import UTC, datetime

    from buildmatrix import installed_version
    from buildmatrix.attest import statement
    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.errors import InputError

    doc = statement(
        run.results,
        facts=load_cuda_facts(),
        profiles=profiles,
        version=installed_version(),
        time=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    try:
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--attest {path}: cannot write: {exc.strerror}.") from None


def _layer_cache(cache_dir: Path | None, *, no_cache: bool) -> LayerCache | None:
    """The layer cache --cache names (default folder without), None with --no-cache;
    one another user could write is not used, with a warning."""
    from buildmatrix.image.cache import LayerCache, default_folder

    cache = None if no_cache else LayerCache(cache_dir or default_folder())
    if cache is not None and cache.disabled:
        # As pip does with a cache folder another user could write: warn, go on without.
        click.echo(
            f"buildmatrix: warning: the layer cache {cache.folder} is not used: "
            f"{cache.disabled}. Every layer is read. Fix: make it yours and private "
            f"(chown $(id -u) DIR; chmod 700 DIR), or pass --cache with such a folder.",
            err=True,
        )
    return cache


def _echo_run_json(run: CheckRun, cache: LayerCache | None) -> None:
    """One image: its object (docs/check.md, --json); several: the images' list."""
    if len(run.results) == 1:
        echo_json(run.results[0].to_json())
        return
    echo_json(
        {
            "verdict": "pass" if run.passed else "fail",
            "images": [r.to_json() for r in run.results],
            "cache": _cache_json(cache),
        }
    )


def _print_run(run: CheckRun, cache: LayerCache | None, *, verbose: bool) -> None:
    results, passed = run.results, run.passed
    for i, judged in enumerate(results):
        if i:
            click.echo("")
        print_platforms(judged, verbose=verbose)
    if len(results) > 1:
        failed = [r.primary.image.ref for r in results if not r.passed]
        click.echo(
            f"\n{len(results)} images: "
            + ("all pass" if passed else f"{len(failed)} fail ({', '.join(failed)})")
            + (f"; {cache.hits} layer(s) from the cache" if cache is not None else "")
        )


def _append(path: Path, option: str, chunks: list[str]) -> None:
    try:
        with path.open("a", encoding="utf-8") as f:
            f.writelines(chunks)
    except OSError as exc:
        from buildmatrix.errors import InputError

        raise InputError(f"{option} {path}: cannot write: {exc.strerror}.") from None


def _digest_line(platform: str, result: CheckResult) -> str:
    """``DIGEST PLATFORM VERDICT REF``: the manifest judged for ``platform``, so that
    what signs or promotes it names the artifact the verdict is about (docs/check.md,
    "Digests")."""
    verdict = "pass" if result.passed else "fail"
    return f"{result.image.digest or '-'} {platform} {verdict} {result.image.ref}\n"


def _cache_json(cache: LayerCache | None) -> dict[str, object] | None:
    if cache is None:
        return None
    return {
        "folder": str(cache.root),
        "hits": cache.hits,
        "misses": cache.misses,
        "disabled": cache.disabled,
    }
