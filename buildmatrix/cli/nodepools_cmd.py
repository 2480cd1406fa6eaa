"""``buildmatrix k8s nodepools`` (docs/kubernetes.md, "Day 2: autoscaling from zero")."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from buildmatrix.cli._common import (
    Command,
    dump_manifests,
    load,
    profiles_option,
    taint_key_option,
)
from buildmatrix.errors import InputError

if TYPE_CHECKING:
    from buildmatrix.cuda import DriverVersion
    from buildmatrix.node.pools import Pools


def _drivers(pools: Pools, given: dict[str, DriverVersion]) -> dict[str, DriverVersion]:
    """Each pool's driver: --driver's, else the pools file's promise; the two must agree
    (smoke fails a node off its pool's promise, so a template at another driver would
    describe nodes that never pass)."""
    out = dict(given)
    for pool, spec in pools.specs.items():
        if spec.driver is None:
            continue
        if pool in given and given[pool].key != spec.driver.key:
            raise InputError(
                f"--driver {pool}={given[pool]}: {pools.source} promises {spec.driver} "
                f"(pools.{pool}.driver), and smoke fails a node of the pool on any other "
                "driver. Give the same version, or change the promise first."
            )
        out.setdefault(pool, spec.driver)
    return out


@click.command("nodepools", cls=Command)
@click.option(
    "--pools",
    "pools_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Pools file: which GPUs fall in each pool (pools.<name>.driver: its promise).",
)
@click.option(
    "--driver",
    "drivers",
    multiple=True,
    metavar="POOL=VERSION",
    help="The driver a pool's nodes run, e.g. training-hopper=580.65.06 (repeatable).",
)
@click.option(
    "--provisioner",
    type=click.Choice(["karpenter", "cluster-autoscaler"]),
    required=True,
    help="karpenter: karpenter.sh/v1 NodePools (AWS EC2NodeClass); cluster-autoscaler: "
    "the node-template tags of each AWS Auto Scaling group.",
)
@click.option(
    "--node-class",
    default="default",
    show_default=True,
    metavar="NAME",
    help="The EC2NodeClass each NodePool's nodeClassRef names (karpenter).",
)
@click.option(
    "--agent-namespace",
    metavar="NS",
    help="karpenter: also the rights the admission agent in NS needs for smoke "
    "--replace-after (delete its own node's NodeClaim while never initialized), with the "
    "ValidatingAdmissionPolicy that bounds them (docs/kubernetes.md, 'A failing new node').",
)
@taint_key_option
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml")
@profiles_option
def nodepools(  # noqa: PLR0917 - one parameter per option, as click passes them
    pools_file: Path,
    drivers: tuple[str, ...],
    provisioner: str,
    node_class: str,
    agent_namespace: str | None,
    taint_key: str,
    fmt: str,
    profiles_dir: str | None,
) -> int:
    """Print each pool's autoscaler template, labelled as smoke will label its nodes.

    Per pool given a driver (--driver, or the pools file's pools.<name>.driver), and
    per GPU model of it that smoke would admit at that driver: the labels smoke writes
    with the keys buildmatrix owns (every key affinity may require), computed by
    smoke's own code, so that a Pod carrying affinity's terms can scale an empty pool
    up. Models whose labels agree share one template.
    """
    from buildmatrix.cli.drivers_cmd import parse_proposals, proposal_items
    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.node.nodepools import (
        AWS_GPU_NAMES,
        CA_STARTUP_PREFIX,
        karpenter_nodepools,
        node_group_tags,
        templates,
    )
    from buildmatrix.node.poolmodels import pool_models
    from buildmatrix.node.pools import load_pools

    profiles = load(profiles_dir)
    pools = load_pools(pools_file, profiles)
    models = pool_models(pools, profiles)
    chosen = _drivers(pools, parse_proposals(proposal_items(drivers, None), list(models)))
    if not chosen:
        raise InputError(
            "k8s nodepools labels each template with the driver its nodes run, and no pool "
            "has one: pass --driver POOL=VERSION (repeatable), or give pools.<name>.driver "
            f"in {pools_file}."
        )
    karpenter = provisioner == "karpenter"
    gpu_names = AWS_GPU_NAMES if karpenter else None
    found, skipped = templates(
        pools, models, chosen, profiles=profiles, facts=load_cuda_facts(), gpu_names=gpu_names
    )
    notes: dict[tuple[str, str], list[str]] = {}
    for s in skipped:
        notes.setdefault((s.pool, s.why), []).append(s.product)
    for (pool, why), products in notes.items():
        click.echo(f"note: {pool}: no template for {', '.join(products)}: {why}", err=True)
    if not found:
        raise InputError(
            f"k8s nodepools: no GPU model of the pools given a driver "
            f"({', '.join(chosen)}) gets a template; the notes above say why."
        )
    if agent_namespace is not None and not karpenter:
        raise InputError(
            "--agent-namespace renders the rights to delete a Karpenter NodeClaim; "
            "cluster-autoscaler removes a node that never turns ready by itself "
            "(--scale-down-unready-time): leave it out with --provisioner cluster-autoscaler."
        )
    if karpenter:
        objects = karpenter_nodepools(
            found, AWS_GPU_NAMES, node_class=node_class, taint_key=taint_key
        )
        if agent_namespace is not None:
            from buildmatrix.k8s import is_dns_label
            from buildmatrix.k8s_repair import repair_objects

            if not is_dns_label(agent_namespace):
                raise InputError(
                    f"--agent-namespace '{agent_namespace}' is not a valid namespace name (a "
                    "DNS label: at most 63 lower-case letters, digits and '-'); give the "
                    "namespace k8s manifests --namespace installed the agent in."
                )

            objects += repair_objects(namespace=agent_namespace)
        click.echo(dump_manifests(objects, fmt), nl=False)
        return 0
    if not taint_key.startswith(CA_STARTUP_PREFIX):
        click.echo(
            f"note: run cluster-autoscaler with --startup-taint={taint_key}, or use a "
            f"--taint-key under {CA_STARTUP_PREFIX} (managed autoscalers take no flags)",
            err=True,
        )
    doc = {"version": 1, "nodeGroups": node_group_tags(found, taint_key=taint_key)}
    click.echo(dump_manifests(doc, fmt), nl=False)
    return 0
