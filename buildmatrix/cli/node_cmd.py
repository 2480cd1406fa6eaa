"""``buildmatrix smoke`` and ``buildmatrix labels``: admit a GPU node, and describe it."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from buildmatrix.cli._common import (
    containerd_options,
    containerd_store,
    echo_json,
    gfd_mode,
    json_option,
    load,
    no_gfd_keys_option,
    node_option,
    platform_option,
    pools_option,
    profiles_option,
    table,
    timeout_option,
)
from buildmatrix.errors import BuildmatrixError, EnvironmentUnavailable, InputError
from buildmatrix.labelkeys import GFD_KEYS, GfdKeys, is_mig_key, writes_gfd_keys

if TYPE_CHECKING:
    from buildmatrix.check import CheckResult
    from buildmatrix.node.apply import Applied
    from buildmatrix.node.checks import NodeReport
    from buildmatrix.node.labels import VerifiedImage
    from buildmatrix.node.poolimages import ImagePlan
    from buildmatrix.node.pools import Pools
    from buildmatrix.node.results import LoadResult
    from buildmatrix.profiles import ProfileSet
    from buildmatrix.snapshot import Snapshot

NFD_TTL = timedelta(hours=24)  # NFD drops the labels if smoke stops re-running


def _pools(path: Path | None, profiles: ProfileSet) -> Pools | None:
    from buildmatrix.node.pools import load_pools

    return load_pools(path, profiles) if path is not None else None


def _live_snapshot(node: str | None, record: Path | None, sysfs: Path) -> Snapshot:
    """Probe NVML and the PCI bus; with ``record``, write what they said first
    (before any judging)."""
    from buildmatrix.node.probe import probe
    from buildmatrix.snapshot import snapshot_from_doc

    doc = probe(hostname=node, sysfs=sysfs)
    if record is not None:
        try:
            record.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"--record {record}: cannot write: {exc.strerror}.") from None
    return snapshot_from_doc(doc, source="NVML")


def _snapshot(
    snapshot: Path | None, record: Path | None, node: str | None, sysfs: Path
) -> Snapshot:
    from buildmatrix.snapshot import load_snapshot

    if snapshot is not None and record is not None:
        raise InputError(
            "--snapshot and --record exclude each other: --record reads this node's GPUs "
            "and writes them to FILE, --snapshot judges a recorded node instead."
        )
    if snapshot is not None:
        return load_snapshot(snapshot)
    return _live_snapshot(node, record, sysfs)


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


@dataclass
class _ImageOutcome:
    ref: str
    result: CheckResult | None = None
    loads: Sequence[LoadResult] = ()
    error: BuildmatrixError | None = None


def _check_images(
    refs: Sequence[str],
    snap: Snapshot,
    profiles: ProfileSet,
    *,
    require_sass: bool,
    load_test: bool,
    platform: str,
    prefer_containerd: bool = False,
) -> list[_ImageOutcome]:
    """Each image judged on the node's GPUs (and loaded by the driver with --load-test).

    An image that cannot be read is a failed check, not an abort: the node must still
    be reported (and marked failed) when the registry is down.
    """
    from buildmatrix.check import Options, run_check
    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.image.open import scan_image, scan_node_first

    facts = load_cuda_facts()
    outcomes = []
    for ref in refs:
        outcome = _ImageOutcome(ref=ref)
        keep = Path(tempfile.mkdtemp(prefix="buildmatrix-load-")) if load_test else None
        try:
            store = containerd_store()
            scan = scan_node_first if prefer_containerd else scan_image
            image = scan(ref, platform=platform, keep=keep, containerd=store)
            opts = Options(snapshot=snap, require_sass=require_sass)
            outcome.result = run_check(image, profiles, opts, facts)
            if load_test:
                from buildmatrix.node.loadtest import load_test as run_load_test

                outcome.loads = run_load_test(ref, outcome.result.files, facts)
            # what another containerd generation runs on this node instead (os.features,
            # docs/check.md "Platforms"): the image is proven only if that passes too
            for request in image.also:
                other = run_check(
                    scan(ref, platform=request, containerd=store), profiles, opts, facts
                )
                if outcome.result.passed and not other.passed:
                    outcome.result = other
        except BuildmatrixError as exc:
            outcome.error = exc
        finally:
            if keep is not None:
                shutil.rmtree(keep, ignore_errors=True)
        outcomes.append(outcome)
    return outcomes


def _verified(outcomes: Sequence[_ImageOutcome]) -> list[VerifiedImage]:
    """Images proven on the node, named by their spec (io.buildmatrix.image) label."""
    from buildmatrix.node.labels import VerifiedImage

    found = []
    for o in outcomes:
        if o.result is None or not o.result.passed:
            continue
        labels = o.result.image.config.labels
        name = labels.get("io.buildmatrix.image") or o.ref.rsplit("/", 1)[-1].split(":")[0]
        found.append(VerifiedImage(name=name))
    return found


def _unavailable_report(exc: EnvironmentUnavailable, *, node: str | None) -> dict[str, Any]:
    """The report of a node whose GPUs could not be read: every key of a full one
    (docs/smoke.md, --json), the node as --node names it (None without)."""
    from buildmatrix.labelkeys import SMOKE

    check = {"name": "nvml", "ok": False, "message": str(exc), "warning": False}
    return {
        "verdict": "fail",
        "node": node,
        "checks": [check],
        "labels": {SMOKE: "failed"},
        "load_test": [],
    }


def _write_nfd(path: Path, labels: dict[str, str]) -> None:
    from buildmatrix.node.nfd import feature_file, write_atomically

    write_atomically(path, feature_file(labels, now=datetime.now(UTC), ttl=NFD_TTL))


def _print_report(
    snap: Snapshot, report: NodeReport, labels: dict[str, str], *, plan: ImagePlan
) -> None:
    click.echo(f"node     {snap.hostname or '-'}  ({snap.source})")
    cuda = f" (CUDA {snap.cuda_driver_version})" if snap.cuda_driver_version else ""
    click.echo(f"driver   {snap.driver}{cuda}")
    for m in report.models:
        memory = f", {m.memory_mib} MiB" if m.memory_mib else ""
        click.echo(f"gpus     {len(m.gpus)} x {m.name} ({m.cc}{memory}; GPU {m.indexes})")
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
        for c in report.checks
    ]
    click.echo("\n" + table(["CHECK", "RESULT", "MESSAGE"], rows))
    click.echo("\nlabels")
    for key, value in labels.items():
        click.echo(f"  {key}={value}")
    click.echo("\nPASS" if report.passed else "\nFAIL: the node is not admitted")


@click.command("smoke")
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
    "admission taint buildmatrix.io/unverified (removed on pass, kept on fail).",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Credentials for --apply (default: in-cluster ServiceAccount, else ~/.kube/config).",
)
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
    from buildmatrix.image.ref import parse_ref
    from buildmatrix.node.checks import NodeOptions, evaluate
    from buildmatrix.node.labels import node_labels
    from buildmatrix.node.poolimages import nothing_to_load, plan_images, require_images

    mode = gfd_mode(no_gfd_keys, gfd_keys)
    profiles = load(profiles_dir)
    pool_map = _pools(pools, profiles)
    for ref in images:
        parse_ref(ref)  # a malformed reference is bad input, before any NVML or I/O
    if load_test:
        require_images(images, pool_map)
    api = _node_api(node, kubeconfig) if apply_to_node else None
    try:
        snap = _snapshot(snapshot, record, node, sysfs)
    except EnvironmentUnavailable as exc:
        doc = _unavailable_report(exc, node=node)
        if nfd_file is not None:
            _write_nfd(nfd_file, doc["labels"])
        if api is not None and node is not None:
            failures = [f"nvml: {exc}"]
            doc["applied"] = _apply(
                api,
                node,
                passed=False,
                labels=doc["labels"],
                failures=failures,
                mode=mode,
            ).to_json()
        if as_json:
            echo_json(doc)
        else:
            click.echo(f"FAIL: {exc}")
            if "applied" in doc:
                click.echo(f"applied  node {node}: admission taint {doc['applied']['taint']}")
        return exc.exit_code
    plan = plan_images(images, snapshot=snap, profiles=profiles, pools=pool_map)
    outcomes = _check_images(
        plan.refs,
        snap,
        profiles,
        require_sass=require_sass,
        load_test=load_test,
        platform=_images_platform(platform, live=snapshot is None, recorded=snap.platform),
        prefer_containerd=prefer_containerd,
    )
    report = evaluate(
        snap,
        profiles,
        load_cuda_facts(),
        options=NodeOptions(
            expect_gpus=expect_gpus,
            allow_mixed=allow_mixed,
            pools=pool_map,
            mig_strategy=mig_strategy,
        ),
        images=[o.result for o in outcomes if o.result is not None],
        unreadable=[(o.ref, str(o.error)) for o in outcomes if o.error is not None],
        loads=[x for o in outcomes for x in o.loads],
    )
    empty = nothing_to_load(plan, pool_map) if load_test else None
    if empty is not None:  # a load test of no image is bad input, and never a pass
        report = replace(report, checks=(*report.checks, empty))
    labels = node_labels(
        snap,
        report,
        pools=pool_map,
        gfd_keys=writes_gfd_keys(mode, None),
        verified=_verified(outcomes),
        mig_strategy=mig_strategy,
    )
    if nfd_file is not None:
        _write_nfd(nfd_file, labels)
    applied = None
    if api is not None and node is not None:
        failures = [f"{c.name}: {c.message}" for c in report.checks if not c.ok]
        applied = _apply(
            api,
            node,
            passed=report.passed,
            labels=labels,
            failures=failures,
            mode=mode,
        )
        if not applied.gfd_keys:  # GFD labels the node: its keys are its own
            labels = {k: v for k, v in labels.items() if k not in GFD_KEYS and not is_mig_key(k)}
    if as_json:
        doc = {
            "verdict": "pass" if report.passed else "fail",
            "node": node or snap.hostname,
            "checks": [c.to_json() for c in report.checks],
            "labels": labels,
            "load_test": [
                {"image": x.image, "model": x.model, "files": list(x.files)}
                for o in outcomes
                for x in o.loads
            ],
        }
        if applied is not None:
            doc["applied"] = applied.to_json()
        echo_json(doc)
    else:
        _print_report(snap, report, labels, plan=plan)
        if applied is not None:
            click.echo(f"applied  {applied.describe()}")
    if report.passed:
        return 0
    codes = [o.error.exit_code for o in outcomes if o.error is not None]
    return max([1, *codes, *([InputError.exit_code] if empty is not None else [])])


def _images_platform(given: str, *, live: bool, recorded: str | None = None) -> str:
    """On the node itself, a multi-platform image is judged by the variant this machine
    runs (linux/arm64 on a Grace node) unless --platform says otherwise; a recorded
    snapshot by the CPU it recorded (its ``cpu``), else --platform's default."""
    import platform as host

    from click.core import ParameterSource

    from buildmatrix.node.poolimages import node_platform

    source = click.get_current_context().get_parameter_source("platform")
    if source is not ParameterSource.DEFAULT:
        return given
    if not live:
        return recorded or given
    return node_platform(host.machine()) or given


def _node_api(node: str | None, kubeconfig: Path | None) -> Any:
    """The API client for --apply, made before any NVML or image work: a missing node
    name or unusable credentials is found before the node is judged."""
    from buildmatrix.node.apply import NodeApi

    if not node:
        raise InputError(
            "--apply needs the Node's name: pass --node NAME or set NODE_NAME (a "
            "DaemonSet sets it from spec.nodeName)."
        )
    return NodeApi(kubeconfig)


def _apply(
    api: Any,
    node: str,
    *,
    passed: bool,
    labels: dict[str, str],
    failures: list[str],
    mode: GfdKeys,
) -> Applied:
    from buildmatrix.node.apply import apply

    return apply(api, node, passed=passed, labels=labels, failures=failures, gfd_keys=mode)


@click.command("labels")
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
    from buildmatrix.node.nfd import feature_file, node_feature

    profiles = load(profiles_dir)
    pool_map = _pools(pools, profiles)
    snap = _snapshot(snapshot, None, node, sysfs)
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
