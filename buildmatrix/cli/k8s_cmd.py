"""``buildmatrix affinity`` and ``buildmatrix k8s manifests``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from buildmatrix.cli._common import (
    ByteProgress,
    containerd_options,
    containerd_store,
    load,
    platform_option,
    profiles_option,
    timeout_option,
)
from buildmatrix.errors import InputError
from buildmatrix.labelkeys import GfdKeys

if TYPE_CHECKING:
    from buildmatrix.node.pools import Pools

_FORMATS = click.Choice(["yaml", "json"])


def _dump(obj: Any, fmt: str) -> str:
    import yaml

    class Plain(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True  # no &anchors: kubectl reads them, people and diffs less well

    if fmt == "json":
        return json.dumps(obj, indent=2) + "\n"
    if isinstance(obj, list):
        return yaml.dump_all(obj, Dumper=Plain, sort_keys=False)
    return yaml.dump(obj, Dumper=Plain, sort_keys=False)


def _memory(_ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """--min-memory in MiB, from MiB or a unit (affinity.parse_memory_mib)."""
    if value is None:
        return None
    from buildmatrix.affinity import parse_memory_mib
    from buildmatrix.errors import InputError

    try:
        return parse_memory_mib(value)
    except InputError as exc:
        raise click.BadParameter(str(exc).removeprefix("--min-memory "), param=param) from None


@click.command("affinity")
@click.argument("ref")
@click.option(
    "--require",
    "features",
    multiple=True,
    metavar="FEATURE",
    help="A feature the GPU must have, as the profiles name them (fp8, bf16, ...; repeatable).",
)
@click.option(
    "--min-memory",
    metavar="MIB",
    callback=_memory,
    help="GPU memory the job needs: MiB (nvidia.com/gpu.memory-mb, the smallest GPU's), an "
    "integer, or with a unit: 70GiB, 80GB, 40960MiB.",
)
@click.option("--require-sass", is_flag=True, help="Leave out GPUs that run the image only by JIT.")
@click.option("--format", "fmt", type=_FORMATS, default="yaml", show_default=True)
@click.option(
    "--into",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="A Pod, Job, CronJob, Deployment, StatefulSet, ReplicaSet or DaemonSet manifest to "
    "merge the affinity into (printed whole; every workload of a multi-document file).",
)
@platform_option
@containerd_options
@timeout_option
@profiles_option
def affinity(  # noqa: PLR0917 - one parameter per option, as click passes them
    ref: str,
    features: tuple[str, ...],
    min_memory: int | None,
    require_sass: bool,
    fmt: str,
    into: Path | None,
    platform: str,
    profiles_dir: str | None,
) -> int:
    """Print the nodeAffinity that sends a Pod only to GPUs and drivers its image runs on.

    The image's device code is checked against every arch profile at every driver
    version where check's answer can change; the GPUs that run it and have every
    --require'd feature give nvidia.com/gpu.compute-capability In [...], the drivers
    they run it on give terms over buildmatrix.io/driver.major/minor/revision, and
    --min-memory adds nvidia.com/gpu.memory-mb Gt. On every node smoke admitted, the
    affinity matches iff check --snapshot passes the image there (docs/kubernetes.md).
    Exit 1 when no GPU qualifies.
    """
    import yaml

    from buildmatrix.affinity import (
        Needs,
        choose,
        merge_into,
        nodes_block,
        validate_needs,
    )
    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.image.open import scan_image

    profiles = load(profiles_dir)
    needs = Needs(features=features, min_memory_mib=min_memory, require_sass=require_sass)
    validate_needs(needs)
    documents: list[Any] = []
    if into is not None:
        try:
            documents = [d for d in yaml.safe_load_all(into.read_text(encoding="utf-8")) if d]
        except OSError as exc:
            raise InputError(f"--into {into}: cannot read: {exc.strerror}.") from None
        except yaml.YAMLError as exc:
            raise InputError(f"--into {into}: not valid YAML ({exc}).") from None
        if not documents:
            raise InputError(f"--into {into}: holds no manifest.")
    progress = ByteProgress()
    try:
        image = scan_image(ref, platform=platform, progress=progress, containerd=containerd_store())
    finally:
        progress.done()
    facts = load_cuda_facts()
    choice = choose(image, profiles, needs, facts)
    if not choice.chosen:
        click.echo(
            f"buildmatrix: error: {ref} runs on none of the GPUs that meet the needs:", err=True
        )
        for p, why in choice.excluded:
            click.echo(f"  - {p.sm} ({p.family.value}): {why}", err=True)
        return 1
    node_terms = _node_terms(
        ref, image, choice, platform=platform, profiles=profiles, needs=needs, facts=facts
    )
    if into is None:
        click.echo(_dump(nodes_block(node_terms), fmt), nl=False)
        return 0
    merged = [merge_into(d, node_terms, source=str(into)) for d in documents]
    click.echo(_dump(merged if len(merged) > 1 else merged[0], fmt), nl=False)
    return 0


def _node_terms(
    ref: str, image: Any, choice: Any, *, platform: str, profiles: Any, needs: Any, facts: Any
) -> list[list[dict[str, Any]]]:
    """The terms for ``--platform``'s CPU architecture (``choice``, from ``image``)
    and every other Linux one the image offers (buildmatrix.arch.HOST_ARCHES), each
    entry judged as its node asks for it (``linux/ARCH``); an architecture whose
    entry runs on no GPU gives none (buildmatrix.affinity.per_arch_terms)."""
    from buildmatrix.affinity import choose, per_arch_terms, terms
    from buildmatrix.arch import HOST_ARCHES
    from buildmatrix.image.open import scan_image
    from buildmatrix.image.platform import parse_platform

    mine = parse_platform(platform).architecture
    offered = {p.split("/")[1] for p in image.offered if p.startswith("linux/")}
    judged = [mine, *(a for a in HOST_ARCHES if a in offered and a != mine)]
    by_arch = {}
    for arch in judged:
        if arch != mine:
            progress = ByteProgress()
            try:
                entry = scan_image(
                    ref, platform=f"linux/{arch}", progress=progress, containerd=containerd_store()
                )
            finally:
                progress.done()
            choice = choose(entry, profiles, needs, facts)
        if choice.chosen:
            by_arch[arch] = terms(choice, profiles, needs, image.offered)
    return per_arch_terms(by_arch, judged)


@click.group("k8s")
def k8s() -> None:
    """Kubernetes manifests for node admission."""


@k8s.command("manifests")
@click.option(
    "--image",
    "tool_image",
    default="ghcr.io/buildmatrix/buildmatrix:latest",
    show_default=True,
    metavar="IMAGE",
    help="The buildmatrix image the admission DaemonSet runs.",
)
@click.option(
    "--pools",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="A pools file to ship in the ConfigMap (default: every SM's family as its pool).",
)
@click.option("--namespace", default="buildmatrix", show_default=True, metavar="NS")
@click.option(
    "--interval",
    type=click.IntRange(min=60),
    default=600,
    show_default=True,
    metavar="SECONDS",
    help="How often the DaemonSet re-runs smoke on each node.",
)
@click.option("--load-test", is_flag=True, help="Run smoke with --load-test.")
@click.option(
    "--registry-secret",
    metavar="NAME",
    help="A Secret of type kubernetes.io/dockerconfigjson in the namespace, mounted for "
    "smoke to read the pools' images from private registries.",
)
@click.option(
    "--node-selector",
    "node_selectors",
    multiple=True,
    metavar="KEY=VALUE[,KEY=VALUE]",
    help="Also run on nodes with these labels, set by the provisioner at join (kubelet "
    "--node-labels, Karpenter NodePool labels); ORed with the GPU labels (repeatable).",
)
@click.option(
    "--runtime-class",
    is_flag=True,
    help="Also print the nvidia RuntimeClass (clusters with a host-installed toolkit; "
    "the GPU Operator creates its own).",
)
@click.option("--example-job", is_flag=True, help="Also print an example FP8 training Job.")
@click.option(
    "--containerd",
    is_flag=True,
    help="Mount the node's containerd content and metadata stores read-only, so that "
    "pools may name images as containerd:NAME (read from the node, not a registry).",
)
@click.option(
    "--gpu-operator-values",
    "operator_values",
    is_flag=True,
    help="Print instead the Helm values that let the GPU Operator's DaemonSets and its "
    "NFD worker run on nodes still tainted for admission.",
)
@click.option(
    "--nfd-values",
    "nfd_values",
    is_flag=True,
    help="Print instead the Helm values that let a standalone NFD chart's worker run on "
    "nodes still tainted for admission.",
)
@click.option(
    "--gfd-keys",
    type=click.Choice([m.value for m in GfdKeys]),
    default=GfdKeys.AUTO.value,
    show_default=True,
    help="Who writes GPU Feature Discovery's keys (smoke --gfd-keys; the admission policy "
    "allows the agent exactly that): auto leaves them to GFD where it labels the node.",
)
@click.option(
    "--mode",
    type=click.Choice(["apply", "nfd"]),
    default="apply",
    show_default=True,
    help="apply: the agent labels and untaints its own Node (RBAC on nodes, held to its "
    "node by an admission policy); nfd: it writes an NFD feature file and NFD labels and "
    "untaints the node (no Kubernetes API rights in the agent; nfd-master -enable-taints).",
)
@click.option(
    "--kubernetes-version",
    default="1.30",
    show_default=True,
    metavar="MAJOR.MINOR",
    help="The cluster's Kubernetes version: the policy that confines the agent to its own "
    "node needs 1.30 or newer.",
)
@click.option(
    "--no-node-policy",
    is_flag=True,
    help="Leave out the ValidatingAdmissionPolicy (clusters older than 1.30): the agent can "
    "then relabel and untaint every node (docs/kubernetes.md, Security).",
)
@click.option(
    "--mig-strategy",
    type=click.Choice(["none", "single", "mixed"]),
    help="The cluster has MIG GPUs: smoke labels them with this GPU Feature Discovery "
    "strategy and may monitor MIG (root, CAP_SYS_ADMIN; docs/smoke.md, MIG).",
)
@click.option("--format", "fmt", type=_FORMATS, default="yaml", show_default=True)
@profiles_option
def manifests(  # noqa: PLR0917 - one parameter per option, as click passes them
    tool_image: str,
    pools: Path | None,
    namespace: str,
    interval: int,
    load_test: bool,
    registry_secret: str | None,
    node_selectors: tuple[str, ...],
    runtime_class: bool,
    example_job: bool,
    containerd: bool,
    operator_values: bool,
    nfd_values: bool,
    gfd_keys: str,
    mode: str,
    kubernetes_version: str,
    no_node_policy: bool,
    mig_strategy: str | None,
    fmt: str,
    profiles_dir: str | None,
) -> int:
    """Print ready-to-apply YAML: namespace, RBAC, pools ConfigMap and the admission
    DaemonSet (smoke --apply on every GPU node); with --runtime-class the nvidia
    RuntimeClass, with --example-job an example FP8 training Job. --gpu-operator-values
    and --nfd-values print the Helm values the GPU stack needs instead."""
    from buildmatrix.k8s import Settings, is_dns_label, is_dns_subdomain, render
    from buildmatrix.k8s_nodes import parse_selector
    from buildmatrix.k8s_policy import require_node_policy
    from buildmatrix.node.pools import load_pools

    if operator_values and nfd_values:
        raise InputError(
            "--gpu-operator-values and --nfd-values print the values of two different "
            "charts: give one (the GPU Operator's values already cover its bundled NFD)."
        )
    if operator_values or nfd_values:
        chart = "gpu-operator" if operator_values else "nfd"
        click.echo(_values(chart, fmt, nfd_taints=mode == "nfd"), nl=False)
        return 0
    terms = tuple(parse_selector(s) for s in node_selectors)
    profiles = load(profiles_dir)
    pools_text = None
    if pools is not None:
        pool_map = load_pools(pools, profiles)  # validated before it is shipped
        pools_text = pools.read_text(encoding="utf-8")
        if load_test:
            _every_pool_has_images(pool_map)
    elif load_test:
        raise InputError(
            "--load-test loads each pool's images on its nodes, and without --pools no "
            "pool names any: every node would fail. Pass --pools FILE whose "
            "pools.<name>.images list them (docs/smoke.md, Pools file)."
        )
    if not is_dns_label(namespace):
        raise InputError(
            f"--namespace '{namespace}' is not a valid namespace name (a DNS label: at most "
            "63 characters of lower-case letters, digits and '-', starting and ending with "
            "a letter or digit)."
        )
    if registry_secret is not None and not is_dns_subdomain(registry_secret):
        raise InputError(
            f"--registry-secret '{registry_secret}' is not a valid Secret name (a DNS "
            "subdomain: at most 253 characters of lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit)."
        )
    if mode == "apply" and not no_node_policy:
        require_node_policy(kubernetes_version)
    settings = Settings(
        image=tool_image,
        namespace=namespace,
        interval=interval,
        load_test=load_test,
        pools=pools_text,
        registry_secret=registry_secret,
        node_selectors=terms,
        runtime_class=runtime_class,
        example_job=example_job,
        node_policy=not no_node_policy,
        gfd_keys=GfdKeys(gfd_keys),
        mode=mode,
        mig_strategy=mig_strategy,
        containerd=containerd,
    )
    from buildmatrix.cuda import load_cuda_facts

    facts = load_cuda_facts() if example_job else None
    click.echo(_dump(render(settings, profiles, facts), fmt), nl=False)
    return 0


def _every_pool_has_images(pool_map: Pools) -> None:
    from buildmatrix.node.poolimages import pools_without_images

    empty = pools_without_images(pool_map)
    if empty:
        raise InputError(
            f"{pool_map.source}: --load-test loads each pool's images on its nodes, and "
            f"pool(s) {', '.join(empty)} list none: their nodes would never be admitted. "
            "Add pools.<name>.images for each, or leave out --load-test."
        )


def _values(chart: str, fmt: str, *, nfd_taints: bool) -> str:
    from buildmatrix import k8s_values

    if chart == "gpu-operator":
        data = k8s_values.gpu_operator_values(nfd_taints=nfd_taints)
        note = k8s_values.GPU_OPERATOR_NOTE
    else:
        data, note = k8s_values.nfd_values(nfd_taints=nfd_taints), k8s_values.NFD_NOTE
    if nfd_taints:
        note += k8s_values.NFD_TAINTS_NOTE
    if fmt == "json":
        return _dump(data, fmt)
    return "".join(f"# {line}".rstrip() + "\n" for line in note.splitlines()) + _dump(data, fmt)
