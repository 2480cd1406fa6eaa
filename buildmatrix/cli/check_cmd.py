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
    table,
    timeout_option,
)

if TYPE_CHECKING:
    from buildmatrix.check import CheckResult
    from buildmatrix.check_refs import CheckRun
    from buildmatrix.image.cache import LayerCache
    from buildmatrix.multiplatform import PlatformResults
    from buildmatrix.profiles import ProfileSet


def _markdown(result: CheckResult) -> str:
    status = "PASS" if result.passed else "FAIL"
    lines = [f"### buildmatrix check `{result.image.ref}`: {status}", ""]
    if result.image.digest:
        lines += [f"Digest `{result.image.digest}`", ""]
    if result.image.index_digest:
        lines += [f"Index `{result.image.index_digest}`", ""]
    lines += ["| target | SM | verdict | driver |", "|---|---|---|---|"]
    for t in result.targets:
        driver = "ok" if t.driver_ok else "**too old**"
        if result.driver is None:
            driver = "not checked"
        lines.append(f"| {t.target.name} | {t.sm} | {t.verdict.value} | {driver} |")
    if _asks_where(result):
        lines += ["", _where(result).replace("runs on  ", "Runs on ")]
    lines += ["", f"{len(result.files)} file(s) with device code."]
    skipped = {s.path for t in result.targets for s in t.skipped}
    if skipped:
        lines.append(
            f"{len(skipped)} optional file(s) skipped where they have no code "
            "(`--format json` lists them with their reasons; `--strict` counts them)."
        )
    if result.problems:
        lines += ["", "Problems:", ""] + [f"- {p}" for p in result.problems]
    if result.warnings:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"


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
        _append(summary, "--summary", [_markdown(r) for pr in run.results for _, r in pr.results])
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
        _print_platforms(judged, verbose=verbose)
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


def _print_platforms(judged: PlatformResults, *, verbose: bool) -> None:
    """One image: each judged entry in full, then the verdict over all of them."""
    if len(judged.results) == 1:
        _print_result(judged.primary, verbose=verbose)
        return
    for i, (platform, result) in enumerate(judged.results):
        click.echo(("\n" if i else "") + f"== platform {platform}")
        _print_result(result, verbose=verbose)
    click.echo("\nplatforms  " + ", ".join(
        f"{p} {'pass' if r.passed else 'FAIL'}" for p, r in judged.results
    ))  # fmt: skip
    click.echo("PASS" if judged.passed else "FAIL (every platform's entry must pass)")


def _print_result(result: CheckResult, *, verbose: bool) -> None:
    from buildmatrix.causes import group_by_cause

    _print_about(result)
    click.echo(
        f"files    {len(result.files)} with device code"
        + (f", {len(result.ignored)} ignored" if result.ignored else "")
        + (" (-v lists them)" if result.files and not verbose else "")
    )
    if result.files and verbose:
        rows = [
            [
                f.path
                + (" (static archive: reported, not judged)" if f.format == "archive" else ""),
                ", ".join(f.sass) or "-",
                ", ".join(f.ptx) or "-",
            ]
            for f in result.files
        ]
        click.echo("\n" + table(["FILE", "SASS", "PTX"], rows))
    rows = [
        [
            t.target.name,
            t.sm,
            t.verdict.value,
            "-" if result.driver is None else ("ok" if t.driver_ok else "TOO OLD"),
        ]
        for t in result.targets
    ]
    click.echo("\n" + table(["TARGET", "SM", "VERDICT", "DRIVER"], rows))
    if _asks_where(result):
        click.echo("\n" + _where(result))
    notes = sorted({s for t in result.targets for s in t.specialised})
    if notes and verbose:
        click.echo("\nspecialised code, not counted (--strict counts it):")
        for line in notes:
            click.echo(f"  - {line}")
    elif notes:
        click.echo(
            f"\nspecialised code: {len(notes)} container(s) not counted (--strict counts "
            "them; -v lists them)"
        )
    _print_skipped(result, verbose=verbose)
    for warning in result.warnings:
        click.echo(f"\nWARNING: {warning}")
    if result.passed:
        click.echo("\nPASS")
        return
    click.echo("\nFAIL")
    targets = [(t.target.name, t.sm, str(t.target.cc)) for t in result.targets]
    for problem in result.problems if verbose else group_by_cause(result.problems, targets):
        click.echo(f"  - {problem}")


def _asks_where(result: CheckResult) -> bool:
    """Whether every profile was judged to say where the image runs (no target given)."""
    from buildmatrix.check import EVERY_PROFILE

    return result.declared["source"] == EVERY_PROFILE


def _where(result: CheckResult) -> str:
    """The answer of a check over every profile: the SMs the image runs on, and not."""
    runs = {t.sm for t in result.runs_on}
    sms = list(dict.fromkeys(t.sm for t in result.targets))
    yes, no = [s for s in sms if s in runs], [s for s in sms if s not in runs]
    if not yes:
        return f"runs on  no profile's GPU (none of {len(sms)} profiles)"
    return f"runs on  {', '.join(yes)} ({len(yes)} of {len(sms)} profiles)" + (
        f"; not on {', '.join(no)}" if no else ""
    )


def _print_skipped(result: CheckResult, *, verbose: bool) -> None:
    """The optional files left out per target (buildmatrix.optional), grouped: the
    targets that skip the same files by the same rule share a line, with a count and
    a few of them (-v: every one with its reason; the JSON lists all)."""
    shared: dict[tuple[str, frozenset[str]], list[str]] = {}
    for t in result.targets:
        by_rule: dict[str, set[str]] = {}
        for s in t.skipped:
            by_rule.setdefault(str(s.rule), set()).add(s.path)
        for rule, paths in by_rule.items():
            shared.setdefault((rule, frozenset(paths)), []).append(t.sm)
    if not shared:
        return
    click.echo("\nskipped  optional files without code for the GPU (--strict counts them):")
    for (rule, group), sms in shared.items():
        names = sorted(group)
        more = f" and {len(names) - 3} more" if len(names) > 3 and not verbose else ""
        shown = names if verbose else names[:3]
        click.echo(
            f"  {', '.join(dict.fromkeys(sms))}: {len(names)} file(s), {rule}: "
            + ", ".join(shown)
            + more
        )
    if verbose:
        for line in sorted({f"{s.path}: {s.reason}" for t in result.targets for s in t.skipped}):
            click.echo(f"  - {line}")


def _print_about(result: CheckResult) -> None:
    """What was judged: the image, its targets, CUDA runtime, driver, compat libraries."""
    from buildmatrix.runtime_sources import runtime_note

    runtime = result.cuda_runtime
    click.echo(
        f"image    {result.image.ref}"
        + (f"  ({result.image.digest})" if result.image.digest else "")
    )
    if result.image.index_digest:
        click.echo(f"index    {result.image.index_digest}")
    declared = result.declared
    click.echo(
        "targets  every profile (no target given and no io.buildmatrix.family label: "
        "where does the image run?)"
        if _asks_where(result)
        else f"targets  from {declared['source']}"
        + (f" (io.buildmatrix.family={declared['family']})" if declared["family"] else "")
    )
    click.echo(
        f"runtime  CUDA {runtime[0]} ({runtime[1]})"
        if runtime
        else "runtime  no CUDA runtime found"
    )
    note = runtime_note(list(result.runtime_sources))
    if note:
        click.echo(f"runtime  note: {note}")
    if result.image.read_from:
        click.echo(f"read     {result.image.read_from}")
    click.echo(f"driver   {result.driver}" if result.driver else "driver   not given")
    forward = result.to_json()["forward_compat"]
    if forward is not None:
        state = "in use" if forward["in_use"] else "not used"
        click.echo(f"compat   {state}: {forward['why']}")
        legacy = forward.get("legacy")
        if legacy is not None:
            state = "in use" if legacy["in_use"] else "not used"
            click.echo(f"compat   {state}: {legacy['why']}")
