"""``buildmatrix labels``: a GPU node's labels in three layers, as smoke would write
them (the node checks decide first)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from buildmatrix.cli._common import (
    Command,
    echo_json,
    gfd_mode,
    load,
    no_gfd_keys_option,
    node_option,
    pools_option,
    profiles_option,
)
from buildmatrix.cli.node_options import mig_strategy_option, pools_or_none, sysfs_option
from buildmatrix.labelkeys import writes_gfd_keys


@click.command("labels", cls=Command)
@click.option(
    "--snapshot",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="A recorded node snapshot (default: read this node's GPUs with NVML).",
)
@pools_option
@no_gfd_keys_option
@click.option("--allow-mixed", is_flag=True, help="Label a node with several GPU models.")
@mig_strategy_option
@sysfs_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "kubectl", "nfd", "nodefeature"]),
    default="json",
    show_default=True,
    help="JSON, a kubectl label command, an NFD feature file, or a NodeFeature object.",
)
@node_option
@click.option(
    "--namespace",
    default="node-feature-discovery",
    show_default=True,
    metavar="NS",
    help="Namespace of the NodeFeature object.",
)
@profiles_option
def labels(  # noqa: PLR0917 - one parameter per option, as click passes them
    snapshot: Path | None,
    pools: Path | None,
    gfd_keys: str | None,
    no_gfd_keys: bool,
    allow_mixed: bool,
    mig_strategy: str,
    sysfs: Path,
    fmt: str,
    node: str | None,
    namespace: str,
    profiles_dir: str | None,
) -> int:
    """Print the node's labels in three layers: product, family/compute capability, pool.

    The node checks of smoke (without images) decide first: a node that fails gets
    only buildmatrix.io/smoke=failed, and the exit code is 1.
    """
    import yaml

    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.node.checks import NodeOptions, evaluate
    from buildmatrix.node.labels import node_labels
    from buildmatrix.node.nfd import NFD_TTL, feature_file, node_feature
    from buildmatrix.node.node_snapshot import read_snapshot

    profiles = load(profiles_dir)
    pool_map = pools_or_none(pools, profiles)
    snap = read_snapshot(snapshot=snapshot, record=None, node=node, sysfs=sysfs)
    options = NodeOptions(allow_mixed=allow_mixed, pools=pool_map, mig_strategy=mig_strategy)
    report = evaluate(snap, profiles, load_cuda_facts(), options=options)
    # no Node to look at: auto writes GFD's keys (labelkeys.writes_gfd_keys)
    writes = writes_gfd_keys(gfd_mode(no_gfd_keys, gfd_keys), None)
    found = node_labels(snap, report, pools=pool_map, gfd_keys=writes, mig_strategy=mig_strategy)
    name = node or snap.hostname
    if fmt == "json":
        echo_json({"node": name, "verdict": "pass" if report.passed else "fail", "labels": found})
    elif fmt == "kubectl":
        from shlex import quote

        pairs = " ".join(quote(f"{k}={v}") for k, v in found.items())
        click.echo(f"kubectl label node {quote(name or 'NODE')} --overwrite {pairs}")
    elif fmt == "nfd":
        click.echo(feature_file(found, now=datetime.now(UTC), ttl=NFD_TTL), nl=False)
    else:
        obj = node_feature(found, node=name or "NODE", namespace=namespace)
        click.echo(yaml.safe_dump(obj, sort_keys=False), nl=False)
    return 0 if report.passed else 1
