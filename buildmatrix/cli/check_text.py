"""The text outputs of ``buildmatrix check``: the table per image and platform, the
skipped modules, the answer to "where does it run?", and the --summary's Markdown.
Printing only; buildmatrix.cli.check_cmd parses the options and calls these."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from buildmatrix.cli._common import table

if TYPE_CHECKING:
    from buildmatrix.check import CheckResult
    from buildmatrix.multiplatform import PlatformResults


def markdown(result: CheckResult) -> str:
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


def print_platforms(judged: PlatformResults, *, verbose: bool) -> None:
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
