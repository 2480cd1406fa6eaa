"""``buildmatrix inspect PATH...``: which SASS and PTX each CUDA file holds."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from buildmatrix.cli._common import Command, echo_json, json_option, table
from buildmatrix.errors import InputError

if TYPE_CHECKING:
    from buildmatrix.binary.report import FileReport, ScanProblem


class Progress:
    """A one-line counter on stderr, only when stderr is a terminal."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.files = 0
        self.with_code = 0
        self._last = 0.0

    def __call__(self, path: str, has_code: bool) -> None:
        self.files += 1
        self.with_code += has_code
        now = time.monotonic()
        if self.enabled and now - self._last > 0.1:
            self._last = now
            click.echo(
                f"\rscanned {self.files} files, {self.with_code} with device code",
                err=True,
                nl=False,
            )

    def done(self) -> None:
        if self.enabled and self.files:
            click.echo("\r\033[K", err=True, nl=False)


def _ptx_cell(report: FileReport) -> str:
    isas: dict[str, set[str]] = {}
    for e in report.entries:
        if e.ptx_isa is not None:
            isas.setdefault(e.arch_name, set()).add(f"{e.ptx_isa.major}.{e.ptx_isa.minor}")
    return ", ".join(f"{arch} (ISA {'/'.join(sorted(isas[arch]))})" for arch in report.ptx) or "-"


def collect(
    paths: tuple[str, ...], progress: Progress, *, deep: bool = False
) -> tuple[list[FileReport], list[ScanProblem]]:
    """Inspect named files (errors are fatal) and walk named folders (errors are problems)."""
    # the readers only here: every other command's process starts without them
    from buildmatrix.binary.report import FileReport, ScanProblem
    from buildmatrix.binary.scan import inspect_file, scan_tree

    reports: list[FileReport] = []
    problems: list[ScanProblem] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            for result in scan_tree(path, on_file=progress, deep=deep):
                if isinstance(result, ScanProblem):
                    problems.append(
                        ScanProblem(
                            path=f"{given.rstrip('/')}/{result.path}", message=result.message
                        )
                    )
                elif isinstance(result, FileReport):
                    reports.append(result)
            continue
        if not path.exists():
            raise InputError(f"{given}: no such file or folder.")
        report = inspect_file(path, display=given, deep=deep)
        progress(given, report is not None)
        if report is not None:
            reports.append(report)
    return reports, problems


@click.command("inspect", cls=Command)
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option(
    "--deep",
    is_flag=True,
    help="Also search each ELF file's data for device code no fatbinary section names "
    "(cubins and fatbinaries the program loads itself); check always does.",
)
@json_option
def inspect(paths: tuple[str, ...], deep: bool, as_json: bool) -> int:
    """List the SASS targets and PTX versions in CUDA binaries.

    PATH is a shared library, executable, object, static archive, .cubin, .fatbin or
    .ptx file, or a folder to scan recursively (symbolic links are not followed).
    Only files with device code are listed, as cuobjdump lists them; --deep adds the
    code kept as data. A corrupt file named on the command line exits 2; one found
    in a folder is reported and the scan goes on.
    """
    progress = Progress()
    try:
        reports, problems = collect(paths, progress, deep=deep)
    finally:
        progress.done()
    if as_json:
        echo_json(
            {
                "files": [r.to_json() for r in reports],
                "problems": [f"{p.path}: {p.message}" for p in problems],
            }
        )
    else:
        if reports:
            rows = [[r.path, ", ".join(r.sass) or "-", _ptx_cell(r)] for r in reports]
            click.echo(table(["FILE", "SASS", "PTX"], rows))
        click.echo(
            f"{len(reports)} file(s) with device code"
            + (f" of {progress.files} scanned" if progress.files else "")
        )
    for p in problems:
        click.echo(f"buildmatrix: warning: {p.message}", err=True)
    return 0
