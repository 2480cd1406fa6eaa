"""``buildmatrix k8s manifests``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from buildmatrix.cli._common import (
    MANIFEST_FORMATS,
    MAX_TIMEOUT,
    Group,
    dump_manifests,
    flag,
    given,
    load,
    profiles_option,
    refuse_together,
    taint_key_option,
)
from buildmatrix.errors import InputError
from buildmatrix.labelkeys import GfdKeys

IMAGE_REPOSITORY = "ghcr.io/buildmatrix/buildmatrix"


def default_image() -> str:
    """The tool image of this package's own version, as the release workflow tags it
    (``IMAGE:VERSION``): the agent patches Nodes, so what it runs is pinned, never a
    tag that moves (``latest``) under a DaemonSet that holds node rights. A development
    build's local version (``+g1a2b3c``) is no valid tag: its ``+`` becomes ``-``
    (a tag that no release has; docs/kubernetes.md says to pass --image then)."""
    from buildmatrix import installed_version

    return f"{IMAGE_REPOSITORY}:{installed_version().replace('+', '-')}"


if TYPE_CHECKING:
    from buildmatrix.node.pools import Pools
    from buildmatrix.profiles import ProfileSet


@click.group("k8s", cls=Group)
def k8s() -> None:
    """Kubernetes manifests for node admission."""


@k8s.command("manifests")
@click.option(
    "--image",
    "tool_image",
    default=default_image,
    show_default=f"{IMAGE_REPOSITORY}:<this buildmatrix's version>",
    metavar="IMAGE",
    help="The buildmatrix image the admission DaemonSet runs. Default: this package's own "
    "version, never a moving tag (the agent has rights on nodes).",
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
@click.option(
    "--deadline",
    type=click.IntRange(min=60, max=MAX_TIMEOUT),
    default=3600,
    show_default=True,
    metavar="SECONDS",
    help="smoke --deadline: a round that takes longer (a hung NVML call or load test) "
    "marks the node failed.",
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
@taint_key_option
@click.option(
    "--source-grace",
    type=click.IntRange(min=0, max=30 * 86400),
    metavar="SECONDS",
    help="smoke --source-grace: how long an admitted node stays admitted while a pool "
    "image's source cannot be read (default: smoke's, 86400).",
)
@click.option(
    "--device-request",
    type=click.Choice(["envvar", "volume-mounts", "cdi-annotation"]),
    default="envvar",
    show_default=True,
    help="How the DaemonSet asks the NVIDIA container toolkit for the driver: "
    "NVIDIA_VISIBLE_DEVICES; volume-mounts (/dev/null at "
    "/var/run/nvidia-container-devices/all) where the toolkit sets "
    "accept-nvidia-visible-devices-envvar-when-unprivileged=false and "
    "accept-nvidia-visible-devices-as-volume-mounts=true; or the CDI annotation "
    "(cdi.k8s.io/…: nvidia.com/gpu=all) where the runtime resolves CDI devices.",
)
@click.option("--format", "fmt", type=MANIFEST_FORMATS, default="yaml", show_default=True)
@profiles_option
# Over 60 lines only by its signature: one parameter per option (24 of them).
def manifests(  # noqa: PLR0917 - one parameter per option, as click passes them
    tool_image: str,
    pools: Path | None,
    namespace: str,
    interval: int,
    deadline: int,
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
    taint_key: str,
    source_grace: int | None,
    device_request: str,
    fmt: str,
    profiles_dir: str | None,
) -> int:
    """Print ready-to-apply YAML: namespace, RBAC, pools ConfigMap and the admission
    DaemonSet (smoke --apply on every GPU node); with --runtime-class the nvidia
    RuntimeClass, with --example-job an example FP8 training Job. --gpu-operator-values
    and --nfd-values print the Helm values the GPU stack needs instead."""
    from buildmatrix.k8s import render
    from buildmatrix.k8s_daemonset import Settings
    from buildmatrix.k8s_nodes import parse_selector
    from buildmatrix.k8s_policy import require_node_policy

    if operator_values and nfd_values:
        raise InputError(
            "--gpu-operator-values and --nfd-values print the values of two different "
            "charts: give one (the GPU Operator's values already cover its bundled NFD)."
        )
    _refuse_meaningless(operator_values=operator_values, nfd_values=nfd_values, mode=mode)
    if operator_values or nfd_values:
        chart = "gpu-operator" if operator_values else "nfd"
        click.echo(_values(chart, fmt, nfd_taints=mode == "nfd", taint_key=taint_key), nl=False)
        return 0
    terms = tuple(parse_selector(s) for s in node_selectors)
    profiles = load(profiles_dir)
    pools_text = _pools_text(pools, profiles, load_test=load_test)
    _check_names(namespace, registry_secret)
    if mode == "apply" and not no_node_policy:
        require_node_policy(kubernetes_version)
    settings = Settings(
        image=tool_image,
        namespace=namespace,
        interval=interval,
        deadline=deadline,
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
        taint_key=taint_key,
        source_grace=source_grace,
        device_request=device_request,
    )
    from buildmatrix.cuda import load_cuda_facts

    facts = load_cuda_facts() if example_job else None
    click.echo(dump_manifests(render(settings, profiles, facts), fmt), nl=False)
    return 0


def _pools_text(pools: Path | None, profiles: ProfileSet, *, load_test: bool) -> str | None:
    """The --pools file's text, validated before it is shipped; --load-test needs one
    whose every pool names images."""
    from buildmatrix.node.pools import load_pools

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
    return pools_text


def _check_names(namespace: str, registry_secret: str | None) -> None:
    """--namespace and --registry-secret as Kubernetes accepts the names."""
    from buildmatrix.k8s import is_dns_label, is_dns_subdomain

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


def _every_pool_has_images(pool_map: Pools) -> None:
    from buildmatrix.node.poolimages import pools_without_images

    empty = pools_without_images(pool_map)
    if empty:
        raise InputError(
            f"{pool_map.source}: --load-test loads each pool's images on its nodes, and "
            f"pool(s) {', '.join(empty)} list none: their nodes would never be admitted. "
            "Add pools.<name>.images for each, or leave out --load-test."
        )


# What the Helm values depend on: the rest shapes only the manifests, which
# --gpu-operator-values and --nfd-values do not print.
_VALUES_OPTIONS = frozenset(
    {"operator_values", "nfd_values", "mode", "fmt", "profiles_dir", "taint_key"}
)


def _refuse_meaningless(*, operator_values: bool, nfd_values: bool, mode: str) -> None:
    """Refuse options the chosen output ignores, naming both (docs/kubernetes.md)."""
    if operator_values or nfd_values:
        chart = flag("operator_values" if operator_values else "nfd_values")
        for param in click.get_current_context().command.params:
            if param.name and param.name not in _VALUES_OPTIONS and given(param.name):
                refuse_together(
                    chart,
                    flag(param.name),
                    f"{chart} prints only the chart's Helm values, which "
                    f"{flag(param.name)} does not change; render the manifests in a "
                    "second command.",
                )
    if mode == "nfd":
        for name, why in (
            ("no_node_policy", "in nfd mode the agent has no Kubernetes API rights, so "
             "there is no node policy to leave out"),
            ("kubernetes_version", "it only decides whether the node policy can be "
             "rendered, and nfd mode renders none (the agent has no API rights)"),
        ):  # fmt: skip
            if given(name):
                refuse_together("--mode nfd", flag(name), why + ".")


def _values(chart: str, fmt: str, *, nfd_taints: bool, taint_key: str) -> str:
    from buildmatrix import k8s_values

    if chart == "gpu-operator":
        data = k8s_values.gpu_operator_values(nfd_taints=nfd_taints, taint_key=taint_key)
        note = k8s_values.GPU_OPERATOR_NOTE.format(taint_key=taint_key)
    else:
        data = k8s_values.nfd_values(nfd_taints=nfd_taints, taint_key=taint_key)
        note = k8s_values.NFD_NOTE.format(taint_key=taint_key)
    if nfd_taints:
        note += k8s_values.NFD_TAINTS_NOTE
    if fmt == "json":
        return dump_manifests(data, fmt)
    comments = "".join(f"# {line}".rstrip() + "\n" for line in note.splitlines())
    return comments + dump_manifests(data, fmt)
