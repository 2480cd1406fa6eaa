"""``buildmatrix drivers`` and ``buildmatrix k8s drivers`` (docs/drivers.md)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from buildmatrix.cli._common import (
    ByteProgress,
    Command,
    F,
    dump_manifests,
    echo_json,
    load,
    platform_option,
    profiles_option,
    taint_key_option,
)
from buildmatrix.errors import EnvironmentUnavailable, InputError, did_you_mean

if TYPE_CHECKING:
    from buildmatrix.cuda import DriverVersion
    from buildmatrix.drivers import PoolPolicy
    from buildmatrix.image.scanned import ScannedImage

_POOLS = click.option(
    "--pools",
    "pools_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Pools file: which GPUs fall in each pool and pools.<name>.images.",
)


def _driver_options(func: F) -> F:
    func = click.option(
        "--drivers-file",
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        help='Proposed drivers as YAML, one line per pool: training-hopper: "580.82.07".',
    )(func)
    decorator = click.option(
        "--driver",
        "drivers",
        multiple=True,
        metavar="POOL=VERSION",
        help="A proposed driver for a pool, e.g. training-hopper=570.172.08 (repeatable).",
    )
    return decorator(func)


def proposal_items(items: Sequence[str], file: Path | None) -> list[tuple[str, str, str]]:
    """(where, pool, version) for each ``--driver POOL=VERSION`` and each entry of the
    ``--drivers-file`` (a YAML mapping ``pool: "version"``)."""
    out: list[tuple[str, str, str]] = []
    for item in items:
        pool, sep, version = item.partition("=")
        if not sep or not pool or not version:
            raise InputError(
                f"--driver {item}: write it as POOL=VERSION, e.g. --driver "
                "training-hopper=580.82.07."
            )
        out.append((f"--driver {item}", pool, version))
    if file is None:
        return out
    from buildmatrix.yamlio import load_yaml_file

    data = load_yaml_file(file)
    if not isinstance(data, dict):
        raise InputError(
            f"{file}: expected a mapping of pool to driver version, e.g. "
            'training-hopper: "580.82.07" (one line per pool).'
        )
    for pool, version in data.items():
        if not isinstance(version, str):
            raise InputError(
                f"{file}: key '{pool}': write the driver version as a quoted string "
                f'({pool}: "{version}"); YAML reads 580.60 as the number 580.6.'
            )
        out.append((f"{file}: key '{pool}'", str(pool), version))
    return out


def parse_proposals(
    items: Sequence[tuple[str, str, str]], pools: Sequence[str]
) -> dict[str, DriverVersion]:
    """Proposed drivers: each a known pool and a driver version, each pool once."""
    from buildmatrix.cuda import parse_driver_version

    out: dict[str, DriverVersion] = {}
    for where, pool, version in items:
        if pool not in pools:
            raise InputError(
                f"{where}: the pools file has no pool '{pool}'."
                f"{did_you_mean(pool, pools)} Pools: {', '.join(pools) or '(none)'}."
            )
        if pool in out:
            raise InputError(
                f"{where}: a driver for the pool '{pool}' is already given; give one per pool."
            )
        out[pool] = parse_driver_version(version, what=where)
    return out


def _scan(refs: Sequence[str], platform: str) -> dict[str, ScannedImage]:
    from buildmatrix.image.open import scan_image

    images: dict[str, ScannedImage] = {}
    progress = ByteProgress()
    for ref in refs:
        try:
            images[ref] = scan_image(ref, platform=platform, progress=progress)
        except OSError as exc:
            raise EnvironmentUnavailable(
                f"image {ref} (a pool's images in the pools file) cannot be read: {exc}. "
                "Check that it exists and that the registry or engine is reachable."
            ) from None
    progress.done()
    return images


def policies(
    pools_file: Path,
    drivers: Sequence[tuple[str, str, str]],
    *,
    platform: str,
    profiles_dir: str | None,
) -> list[PoolPolicy]:
    """Load the inputs, read every pool's images once, and judge each pool."""
    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.drivers import pool_policy
    from buildmatrix.node.poolmodels import pool_models
    from buildmatrix.node.pools import load_pools

    profiles = load(profiles_dir)
    pools = load_pools(pools_file, profiles)
    models = pool_models(pools, profiles)
    proposals = parse_proposals(drivers, list(models))
    refs = list(dict.fromkeys(r for name in models for r in pools.spec(name).images))
    images = _scan(refs, platform)
    facts = load_cuda_facts()
    return [
        pool_policy(
            name,
            models=pool_models_of,
            images={r: images[r] for r in pools.spec(name).images},
            others=images,
            proposed=proposals.get(name),
            profiles=profiles,
            facts=facts,
            current=pools.spec(name).driver,
        )
        for name, pool_models_of in models.items()
    ]


@click.command("drivers", cls=Command)
@_POOLS
@_driver_options
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "markdown", "html"]),
    default="text",
    show_default=True,
    help="markdown for $GITHUB_STEP_SUMMARY; html: one self-contained page.",
)
@platform_option
@profiles_option
def drivers(  # noqa: PLR0917 - one parameter per option, as click passes them
    pools_file: Path,
    drivers: tuple[str, ...],
    drivers_file: Path | None,
    fmt: str,
    platform: str,
    profiles_dir: str | None,
) -> int:
    """Per pool: its GPUs, its images and the driver floor that admits them all, and
    why; with --driver, every image's verdict on every pool at the proposed driver.

    Each verdict is check --snapshot's on a node of one of the pool's GPU models.
    Exit 1 when a pool's own image would fail (or no driver admits it), 2 for bad
    input, 3 when an image cannot be read.
    """
    from buildmatrix import driver_report
    from buildmatrix.drivers import fleet_passed

    proposed = proposal_items(drivers, drivers_file)
    found = policies(pools_file, proposed, platform=platform, profiles_dir=profiles_dir)
    if fmt == "json":
        echo_json(driver_report.to_json(found))
    elif fmt == "markdown":
        click.echo(driver_report.to_markdown(found), nl=False)
    elif fmt == "html":
        click.echo(driver_report.to_html(found), nl=False)
    else:
        click.echo(driver_report.to_text(found))
    return 0 if fleet_passed(found) else 1


@click.command("drivers", cls=Command)
@_POOLS
@_driver_options
@click.option(
    "--repository",
    default="nvcr.io/nvidia",
    show_default=True,
    help="Driver image repository (NVIDIADriver spec.repository).",
)
@click.option("--image", default="driver", show_default=True, help="Driver image (spec.image).")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml")
@taint_key_option
@platform_option
@profiles_option
def k8s_drivers(  # noqa: PLR0917 - one parameter per option, as click passes them
    pools_file: Path,
    drivers: tuple[str, ...],
    drivers_file: Path | None,
    repository: str,
    image: str,
    fmt: str,
    taint_key: str,
    platform: str,
    profiles_dir: str | None,
) -> int:
    """Print one GPU Operator NVIDIADriver object per pool given with --driver.

    Each selects the pool's nodes by the gpu-pool label; a version below the pool's
    floor (buildmatrix drivers) is refused, exit 2.
    """

    from buildmatrix.k8s_drivers import DriverImage, nvidia_drivers

    proposed = proposal_items(drivers, drivers_file)
    if not proposed:
        raise InputError(
            "k8s drivers writes one NVIDIADriver object per pool with a proposed driver, and "
            "none was given: pass --driver POOL=VERSION (repeatable) or --drivers-file FILE."
        )
    found = policies(pools_file, proposed, platform=platform, profiles_dir=profiles_dir)
    objects = nvidia_drivers(found, DriverImage(repository=repository, image=image), taint_key)
    click.echo(dump_manifests(objects, fmt), nl=False)
    return 0
