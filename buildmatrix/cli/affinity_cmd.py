"""``buildmatrix affinity``: the nodeAffinity a Pod needs to land only where its image runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from buildmatrix.cli._common import (
    MANIFEST_FORMATS,
    ByteProgress,
    Command,
    containerd_options,
    containerd_store,
    dump_manifests,
    load,
    platform_option,
    profiles_option,
    timeout_option,
)
from buildmatrix.errors import InputError


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


@click.command("affinity", cls=Command)
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
    help="GPU memory the job needs: MiB (buildmatrix.io/gpu.memory-mb, the smallest GPU's), an "
    "integer, or with a unit: 70GiB, 80GB, 40960MiB.",
)
@click.option("--require-sass", is_flag=True, help="Leave out GPUs that run the image only by JIT.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice([*MANIFEST_FORMATS.choices, "dra"]),
    default="yaml",
    show_default=True,
    help="yaml or json: the nodeAffinity; dra: a resource.k8s.io/v1 ResourceClaimTemplate "
    "(YAML) whose CEL selects the GPUs of NVIDIA's DRA driver that run the image "
    "(Kubernetes 1.34+; docs/placement.md).",
)
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
    --require'd feature give buildmatrix.io/gpu.compute-capability In [...], the drivers
    they run it on give a Gt (and Lt) on buildmatrix.io/driver.version, and
    --min-memory adds buildmatrix.io/gpu.memory-mb Gt. On every node smoke admitted, the
    affinity matches iff check --snapshot passes the image there (docs/kubernetes.md).
    Exit 1 when no GPU qualifies.
    """
    from buildmatrix.affinity import (
        Needs,
        choose,
        merge_into,
        nodes_block,
        validate_needs,
    )
    from buildmatrix.cuda import load_cuda_facts

    profiles = load(profiles_dir)
    needs = Needs(features=features, min_memory_mib=min_memory, require_sass=require_sass)
    validate_needs(needs)
    if fmt == "dra" and into is not None:
        raise InputError(
            "--format dra prints a ResourceClaimTemplate, which is its own object: --into "
            "merges a nodeAffinity only. Reference the template from the Pod's "
            "spec.resourceClaims instead (docs/placement.md)."
        )
    documents = [] if into is None else _read_into(into)
    image = _scan(ref, platform)
    facts = load_cuda_facts()
    choice = choose(image, profiles, needs, facts)
    if not choice.chosen:
        click.echo(
            f"buildmatrix: error: {ref} runs on none of the GPUs that meet the needs:", err=True
        )
        for p, why in choice.excluded:
            click.echo(f"  - {p.sm} ({p.family.value}): {why}", err=True)
        return 1
    if fmt == "dra":
        return _dra(ref, image, choice, profiles=profiles, needs=needs, facts=facts)
    node_terms = _node_terms(
        ref, image, choice, platform=platform, profiles=profiles, needs=needs, facts=facts
    )
    if into is None:
        click.echo(dump_manifests(nodes_block(node_terms), fmt), nl=False)
        return 0
    merged = [merge_into(d, node_terms, source=str(into)) for d in documents]
    click.echo(dump_manifests(merged if len(merged) > 1 else merged[0], fmt), nl=False)
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
    from buildmatrix.image.platform import parse_platform

    mine = parse_platform(platform).architecture
    offered = {p.split("/")[1] for p in image.offered if p.startswith("linux/")}
    judged = [mine, *(a for a in HOST_ARCHES if a in offered and a != mine)]
    by_arch = {}
    for arch in judged:
        if arch != mine:
            choice = choose(_scan(ref, f"linux/{arch}"), profiles, needs, facts)
        if choice.chosen:
            by_arch[arch] = terms(choice, profiles, needs, image.offered)
    return per_arch_terms(by_arch, judged)


def _dra(ref: str, image: Any, choice: Any, *, profiles: Any, needs: Any, facts: Any) -> int:
    """Print the ResourceClaimTemplate for ``--platform``'s entry: a device claim says
    nothing of the host's CPU, so where that matters the note on stderr names the
    ``kubernetes.io/arch`` the Pod must keep to (buildmatrix.affinity.arch_constraint)."""
    from dataclasses import replace

    from buildmatrix.affinity import arch_constraint, choose
    from buildmatrix.k8s_dra import claim_template

    native = choose(image, profiles, replace(needs, require_sass=True), facts)
    doc = claim_template(name="gpu", image=ref, full=choice, native=native, needs=needs)
    click.echo(_block_yaml(doc), nl=False)
    if (arch := arch_constraint(choice, profiles, image.offered)) is not None:
        click.echo(
            f"buildmatrix: note: some of these GPUs come with hosts whose CPU the image has "
            f"no entry for: keep the Pod on kubernetes.io/arch in {sorted(arch.values or ())} "
            "(affinity without --format dra prints that nodeAffinity).",
            err=True,
        )
    return 0


def _block_yaml(doc: Any) -> str:
    """YAML with each string of several lines (a CEL selector) as a literal block."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump(doc, Dumper=Dumper, sort_keys=False)


def _read_into(into: Path) -> list[Any]:
    """The manifests of the ``--into`` file, each YAML document that is not empty."""
    import yaml

    try:
        documents = [d for d in yaml.safe_load_all(into.read_text(encoding="utf-8")) if d]
    except OSError as exc:
        raise InputError(f"--into {into}: cannot read: {exc.strerror}.") from None
    except yaml.YAMLError as exc:
        raise InputError(f"--into {into}: not valid YAML ({exc}).") from None
    if not documents:
        raise InputError(f"--into {into}: holds no manifest.")
    return documents


def _scan(ref: str, platform: str) -> Any:
    """The image's entry for ``platform``, read with the byte counter on stderr."""
    from buildmatrix.image.open import scan_image

    progress = ByteProgress()
    try:
        return scan_image(ref, platform=platform, progress=progress, containerd=containerd_store())
    finally:
        progress.done()
