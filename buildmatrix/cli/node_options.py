"""Options and inputs ``smoke`` and ``labels`` share (buildmatrix.cli.node_cmd,
buildmatrix.cli.labels_cmd)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from buildmatrix.node.pools import Pools
    from buildmatrix.profiles import ProfileSet


def pools_or_none(path: Path | None, profiles: ProfileSet) -> Pools | None:
    from buildmatrix.node.pools import load_pools

    return load_pools(path, profiles) if path is not None else None


# GPU Feature Discovery's --mig-strategy values and default (NVIDIA/k8s-device-plugin
# cmd/gpu-feature-discovery/main.go: Value spec.MigStrategyNone; internal/lm/mig-strategy.go).
mig_strategy_option = click.option(
    "--mig-strategy",
    type=click.Choice(["none", "single", "mixed"]),
    default="none",
    show_default=True,
    help="How MIG devices are labelled, as GPU Feature Discovery's --mig-strategy "
    "(use the device plugin's setting).",
)
sysfs_option = click.option(
    "--sysfs",
    type=click.Path(file_okay=False, path_type=Path),
    default="/sys",
    envvar="BUILDMATRIX_SYSFS",
    show_default=True,
    metavar="DIR",
    help="Where sysfs is mounted: the PCI bus is read from DIR/bus/pci/devices.",
)
