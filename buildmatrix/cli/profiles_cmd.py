"""``buildmatrix profiles`` and ``buildmatrix profiles show SM``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from buildmatrix.cli._common import Group, echo_json, json_option, load, profiles_option, table

if TYPE_CHECKING:
    from buildmatrix.profiles import Profile


def _short(product: str) -> str:
    return product.removeprefix("NVIDIA ")


def _products(p: Profile, limit: int = 4) -> str:
    names = [_short(x) for x in p.products]
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _cuda_range(p: Profile) -> str:
    return f"{p.min_cuda}-{p.max_cuda}" if p.max_cuda else f"{p.min_cuda}+"


def _value(value: object) -> str:
    """A nested value of ``profiles show``: a list joined, a mapping as ``k=v``."""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


@click.group(cls=Group, invoke_without_command=True)
@profiles_option
@json_option
@click.pass_context
def profiles(ctx: click.Context, profiles_dir: str | None, as_json: bool) -> int:
    """List the arch profiles: SM, compute capability, family, features, CUDA, driver."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = profiles_dir
        return 0
    loaded = load(profiles_dir)
    if as_json:
        families = {f.value: list(loaded.family_platforms(f.value)) for f in loaded.families}
        echo_json({"profiles": [p.to_json() for p in loaded], "family_platforms": families})
        return 0
    rows = [
        [
            p.sm,
            str(p.cc),
            p.family.value,
            ",".join(p.features) or "-",
            _cuda_range(p),
            str(p.min_driver),
            ",".join(p.hosts()),
            _products(p),
        ]
        for p in loaded
    ]
    head = ["SM", "CC", "FAMILY", "FEATURES", "CUDA", "MIN DRIVER", "HOSTS", "PRODUCTS"]
    click.echo(table(head, rows))
    click.echo(f"\n{len(loaded)} profiles from {loaded.directory}")
    click.echo("platforms per family (its products' hosts):")
    for family in loaded.families:
        platforms = ", ".join(loaded.family_platforms(family.value))
        click.echo(f"  {family.value}: {platforms}")
    return 0


@profiles.command("show")
@click.argument("sm")
@profiles_option
@json_option
@click.pass_obj
def show(parent_dir: str | None, sm: str, profiles_dir: str | None, as_json: bool) -> int:
    """Show one profile in full, with its derived build flags. SM: sm_90, 9.0 or 90."""
    from buildmatrix.arch import parse_sm

    loaded = load(profiles_dir or parent_dir)
    arch = parse_sm(sm)
    profile = loaded.get(f"sm_{arch.cc.number}")
    if as_json:
        echo_json({"profile": profile.to_json()})
        return 0
    data = profile.to_json()
    width = max(len(k) for k in data)
    indent = "\n" + " " * (width + 2)
    for key, value in data.items():
        if isinstance(value, list):
            text = indent.join(value) or "-"
        elif isinstance(value, dict) and key == "product_floors":  # one line per product
            text = indent.join(_floor_line(k, v) for k, v in value.items()) or "-"
        elif isinstance(value, dict):
            text = indent.join(f"{k}: {_value(v)}" for k, v in value.items()) or "-"
        else:
            text = "-" if value is None else str(value)
        click.echo(f"{key.ljust(width)}  {text}")
    return 0


def _floor_line(product: str, floor: object) -> str:
    """``NVIDIA H200  550.90.07  (source)`` for one entry of product_floors."""
    if not isinstance(floor, dict):
        return f"{product}  {floor}"
    source = f"  ({floor['source']})" if floor.get("source") else ""
    return f"{product}  {floor.get('min_driver', '-')}{source}"
