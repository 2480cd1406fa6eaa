"""``buildmatrix smoke``: admit a GPU node (``labels``, which describes one, is
buildmatrix.cli.labels_cmd).

The admission itself is node/admit.py; these commands parse options, call the
library and print (text, or the JSON of docs/smoke.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from buildmatrix.cli._common import (
    Command,
    Seconds,
    containerd_options,
    containerd_store,
    echo_json,
    gfd_mode,
    given,
    json_option,
    load,
    no_gfd_keys_option,
    node_option,
    platform_option,
    pools_option,
    profiles_option,
    table,
    taint_key_option,
    timeout_option,
)
from buildmatrix.cli.node_options import mig_strategy_option, pools_or_none, sysfs_option
from buildmatrix.errors import InputError
from buildmatrix.node.hold import SOURCE_GRACE

MAX_GRACE = 30 * 86400  # --source-grace: at most 30 days

if TYPE_CHECKING:
    from buildmatrix.node.admit import Admission
    from buildmatrix.node.repair import Repair


def _smoke_json(admission: Admission) -> dict[str, Any]:
    """smoke --format json (docs/smoke.md): the same keys whether or not NVML answered."""
    doc: dict[str, Any] = {
        "verdict": "pass" if admission.passed else "fail",
        "node": admission.node,
        "checks": [c.to_json() for c in admission.checks],
        "labels": dict(admission.labels),
        "load_test": [
            {"image": x.image, "model": x.model, "files": list(x.files)} for x in admission.loads
        ],
    }
    if admission.applied is not None:
        doc["applied"] = admission.applied.to_json()
    if admission.held is not None:
        doc["held"] = admission.held
    return doc


def _print_admission(admission: Admission) -> None:
    snap = admission.snapshot
    if snap is None:  # NVML could not be read
        click.echo(f"FAIL: {admission.unavailable}")
        if admission.applied is not None:
            click.echo(f"applied  node {admission.node}: admission taint {admission.applied.taint}")
        return
    click.echo(f"node     {snap.hostname or '-'}  ({snap.source})")
    cuda = f" (CUDA {snap.cuda_driver_version})" if snap.cuda_driver_version else ""
    click.echo(f"driver   {snap.driver}{cuda}")
    for m in admission.models:
        memory = f", {m.memory_mib} MiB" if m.memory_mib else ""
        click.echo(f"gpus     {len(m.gpus)} x {m.name} ({m.cc}{memory}; GPU {m.indexes})")
    plan = admission.plan
    if plan.from_pool:
        click.echo(f"pool     {plan.pool}: checks its images {', '.join(plan.from_pool)}")
    if snap.pci_gpus is not None:
        click.echo(f"pci      {len(snap.pci_gpus)} NVIDIA GPU(s) on the bus")
    for g in snap.gpus:
        if g.mig_mode and g.mig_devices is not None:
            profiles = [m.profile or "?" for m in g.mig_devices]
            found = ", ".join(f"{profiles.count(p)} x {p}" for p in sorted(set(profiles)))
            click.echo(f"mig      GPU {g.index}: {found or 'no MIG devices'}")
    rows = [
        [c.name, "ok" if c.ok and not c.warning else ("warn" if c.ok else "FAIL"), c.message]
        for c in admission.checks
    ]
    click.echo("\n" + table(["CHECK", "RESULT", "MESSAGE"], rows))
    click.echo("\nlabels")
    for key, value in admission.labels.items():
        click.echo(f"  {key}={value}")
    if admission.held is not None and admission.applied is None:
        click.echo(f"\nFAIL: {admission.held}")
    else:
        click.echo("\nPASS" if admission.passed else "\nFAIL: the node is not admitted")
    if admission.applied is not None:
        click.echo(f"applied  {admission.applied.describe()}")


@click.command("smoke", cls=Command)
@click.option(
    "--snapshot",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Judge a recorded node snapshot instead of this node's GPUs.",
)
@click.option(
    "--record",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Read this node's GPUs with NVML and write the snapshot to FILE too.",
)
@click.option(
    "--image",
    "images",
    multiple=True,
    metavar="REF",
    help="An image the node must run (any REF check takes; repeatable).",
)
@pools_option
@click.option("--expect-gpus", type=click.IntRange(min=1), metavar="N", help="Fail below N GPUs.")
@click.option("--allow-mixed", is_flag=True, help="Admit a node with several GPU models.")
@no_gfd_keys_option
@mig_strategy_option
@sysfs_option
@click.option("--require-sass", is_flag=True, help="Fail an image that runs only by PTX JIT.")
@click.option(
    "--load-test",
    is_flag=True,
    help="Load every image's device code on each GPU model through libcuda.",
)
@click.option(
    "--nfd-file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="PATH",
    help="Write the labels as an NFD feature file (features.d/), atomically.",
)
@click.option(
    "--apply",
    "apply_to_node",
    is_flag=True,
    help="Write the verdict onto the Node through the Kubernetes API: labels and the "
    "admission taint (--taint-key; removed on pass, kept on fail).",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Credentials for --apply (default: in-cluster ServiceAccount, else ~/.kube/config).",
)
@click.option(
    "--deadline",
    type=Seconds(),
    metavar="SECONDS",
    help="Give the round this long: past it, the node is marked failed where the verdict "
    "goes (--apply: tainted; --nfd-file) and smoke exits 1 (3 if that mark cannot be "
    "written), so that a hung NVML call or load test never leaves a node admitted.",
)
@click.option(
    "--mark-failed",
    metavar="REASON",
    help="Read nothing: write only the failure mark, with REASON as its report, where "
    "the verdict goes (--apply, --nfd-file); exit 1. What the DaemonSet runs after a "
    "round was killed.",
)
@click.option(
    "--replace-after",
    type=click.IntRange(min=60),
    metavar="SECONDS",
    envvar="BUILDMATRIX_REPLACE_AFTER",
    help="With --apply on a Karpenter node that has failed since it joined: once it is "
    "this old, delete its NodeClaim so that Karpenter replaces it (docs/kubernetes.md, "
    "'A failing new node').",
)
@click.option(
    "--driver-file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="The driver version this container's NVIDIA libraries came with: the first "
    "round writes it; a round that finds another driver (or NVML's "
    "LIB_RM_VERSION_MISMATCH) marks the node failed and writes 'changed' to FILE, on "
    "which the DaemonSet's loop ends its container so that it restarts with the new "
    "driver's libraries.",
)
@click.option(
    "--source-grace",
    type=click.FloatRange(min=0, max=MAX_GRACE),
    default=SOURCE_GRACE,
    show_default=True,
    metavar="SECONDS",
    help="How long a node admitted before (the Node with --apply, the feature file with "
    "--nfd-file) stays admitted while the only failure is an image source that cannot "
    "be read (a registry down, credentials expired); counted from the first such round, "
    "kept in the annotation buildmatrix.io/smoke-unavailable-since. 0: fail at once.",
)
@taint_key_option
@click.option(
    "--prefer-containerd",
    is_flag=True,
    help="Read each registry image from the node's containerd when it holds that name "
    "(what the kubelet would start), else from the registry.",
)
@node_option
@platform_option
@containerd_options
@timeout_option
@profiles_option
@json_option
# Over 60 lines only by its signature (one parameter per option) and help text: the
# work is node/admit.py, the printing _smoke_json and _print_admission.
def smoke(  # noqa: PLR0917 - one parameter per option, as click passes them
    snapshot: Path | None,
    record: Path | None,
    images: tuple[str, ...],
    pools: Path | None,
    expect_gpus: int | None,
    allow_mixed: bool,
    gfd_keys: str | None,
    no_gfd_keys: bool,
    mig_strategy: str,
    sysfs: Path,
    require_sass: bool,
    load_test: bool,
    nfd_file: Path | None,
    apply_to_node: bool,
    kubeconfig: Path | None,
    deadline: float | None,
    mark_failed: str | None,
    replace_after: int | None,
    driver_file: Path | None,
    source_grace: float,
    taint_key: str,
    prefer_containerd: bool,
    node: str | None,
    platform: str,
    profiles_dir: str | None,
    as_json: bool,
) -> int:
    """Admit a GPU node: read its GPUs, check driver floors, health and image fit, label it.

    Fails closed: any NVML error, unknown GPU or failed check is FAIL, and then the
    labels hold only buildmatrix.io/smoke=failed. With --apply the Node object is
    updated too (docs/kubernetes.md). Exit 0 pass, 1 fail, 2 bad input, 3 NVML or
    the Kubernetes API unavailable (the report is printed all the same).
    """
    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.node.admit import AdmitOptions, admit

    if replace_after is not None and not apply_to_node:
        raise InputError(
            "--replace-after acts on the Node object: it needs --apply (and --node NAME)."
        )
    options = AdmitOptions(
        images=images,
        snapshot=snapshot,
        record=record,
        node=node,
        sysfs=sysfs,
        expect_gpus=expect_gpus,
        allow_mixed=allow_mixed,
        gfd_keys=gfd_mode(no_gfd_keys, gfd_keys),
        mig_strategy=mig_strategy,
        require_sass=require_sass,
        load_test=load_test,
        nfd_file=nfd_file,
        apply=apply_to_node,
        kubeconfig=kubeconfig,
        prefer_containerd=prefer_containerd,
        platform=platform if given("platform") else None,
        deadline=deadline,
        mark_failed=mark_failed,
        driver_file=driver_file,
        source_grace=source_grace,
        taint_key=taint_key,
    )
    profiles = load(profiles_dir)
    admission = admit(
        options,
        profiles=profiles,
        pools=pools_or_none(pools, profiles),
        facts=load_cuda_facts(),
        containerd=containerd_store(),
        overdue=_overdue,
    )
    repair = _repair(admission, replace_after, kubeconfig)
    if as_json:
        doc = _smoke_json(admission)
        if repair is not None:
            doc["repair"] = {"action": repair.action.value, "why": repair.why}
        echo_json(doc)
    else:
        _print_admission(admission)
        if repair is not None:
            click.echo(f"repair   {repair.action.value}: {repair.why}")
    return admission.exit_code


def _repair(admission: Admission, after: int | None, kubeconfig: Path | None) -> Repair | None:
    """--replace-after: what becomes of a node that failed (node/repair.py), where the
    verdict went onto the Node."""
    if after is None or admission.passed or admission.applied is None or not admission.node:
        return None
    from datetime import timedelta

    from buildmatrix.node.nodeclaims import replace_phantom
    from buildmatrix.node.repair import NVML_UNAVAILABLE

    failed = [c.name for c in admission.checks if not c.ok]
    if admission.unavailable is not None:  # no driver: not this node's own fault
        failed = [NVML_UNAVAILABLE]
    return replace_phantom(
        admission.node, failed, after=timedelta(seconds=after), kubeconfig=kubeconfig
    )


def _overdue(message: str, code: int) -> None:
    """The deadline passed (node/admit.py, Deadline): say why and end the process at
    once, from the timer's thread, whatever the main thread is waiting in."""
    import os
    import sys

    sys.stderr.write(f"buildmatrix: FAIL: {message}\n")
    sys.stderr.flush()
    os._exit(code)
