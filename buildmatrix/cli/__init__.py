"""The ``buildmatrix`` command line: the only place that prints.

Each command returns an exit code; :func:`main` maps errors to the codes of the
CLI contract (README.md, section Commands) and never lets a traceback reach the user for
bad input.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from buildmatrix import installed_version
from buildmatrix.cli._common import Group, echo_error
from buildmatrix.cli.affinity_cmd import affinity
from buildmatrix.cli.check_cmd import check
from buildmatrix.cli.drivers_cmd import drivers, k8s_drivers
from buildmatrix.cli.gate_cmd import gate
from buildmatrix.cli.generate_cmd import generate, matrix
from buildmatrix.cli.inspect_cmd import inspect
from buildmatrix.cli.k8s_cmd import k8s
from buildmatrix.cli.labels_cmd import labels
from buildmatrix.cli.node_cmd import smoke
from buildmatrix.cli.nodepools_cmd import nodepools
from buildmatrix.cli.profiles_cmd import profiles
from buildmatrix.errors import BuildmatrixError


class _Group(Group):
    """Lists each command with its whole first paragraph, wrapped, where click would cut
    it at 45 characters with '...'."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            first = (command.short_help or command.help or "").split("\n\n")[0]
            rows.append((name, " ".join(first.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``, worded as click's version_option words it; the version is read
    only here (buildmatrix.installed_version), not by every command."""
    if value and not ctx.resilient_parsing:
        click.echo(f"buildmatrix, version {installed_version()}")
        ctx.exit()


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
def cli() -> None:
    """Make the GPU architecture a first-class axis of image builds and node admission.

    Exit codes: 0 pass, 1 a check failed, 2 bad input or usage, 3 an environment or
    source is unavailable.
    """


cli.add_command(profiles)
cli.add_command(inspect)
cli.add_command(check)
cli.add_command(generate)
cli.add_command(matrix)
cli.add_command(smoke)
cli.add_command(labels)
cli.add_command(affinity)
cli.add_command(k8s)
cli.add_command(drivers)
k8s.add_command(k8s_drivers, "drivers")
k8s.add_command(nodepools, "nodepools")
k8s.add_command(gate, "gate")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = cli.main(args=args, prog_name="buildmatrix", standalone_mode=False)
    except BuildmatrixError as exc:
        echo_error(str(exc))
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("buildmatrix: aborted.", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("buildmatrix: interrupted.", err=True)
        return 130
    return result if isinstance(result, int) else 0
