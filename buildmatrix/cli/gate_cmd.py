"""``buildmatrix k8s gate``: the admission gate for GPU Pods, or the placements CI
feeds it."""

from __future__ import annotations

from typing import Any

import click

from buildmatrix.cli._common import (
    MANIFEST_FORMATS,
    Command,
    containerd_options,
    dump_manifests,
    given,
    load,
    platform_option,
    profiles_option,
    refuse_together,
    timeout_option,
)
from buildmatrix.errors import InputError

LABELS = {
    "app.kubernetes.io/name": "buildmatrix-gpu-gate",
    "app.kubernetes.io/part-of": "buildmatrix",
}


@click.command("gate", cls=Command)
@click.option(
    "--engine",
    type=click.Choice(["vap", "kyverno"]),
    default="vap",
    show_default=True,
    help="vap: a ValidatingAdmissionPolicy (Kubernetes 1.30+) over the placements CI "
    "applies; kyverno: a Kyverno verifyImages policy over the signed check --attest verdict.",
)
@click.option(
    "--image",
    "images",
    multiple=True,
    metavar="REF",
    help="Print instead the placements object for these images (repeatable): each digest "
    "mapped to the nodeSelectorTerms affinity prints, for CI to apply after check.",
)
@click.option(
    "--claim-template",
    metavar="NAME",
    help="With --image: the placements name this DRA ResourceClaimTemplate (affinity "
    "--format dra) instead of node affinity terms.",
)
@click.option(
    "--name",
    default="buildmatrix-gpu-gate",
    show_default=True,
    metavar="NAME",
    help="The policy's (and its binding's) name.",
)
@click.option(
    "--kyverno-images",
    "kyverno_images",
    multiple=True,
    metavar="PATTERN",
    help="--engine kyverno: the image references the policy covers (repeatable), e.g. "
    "'ghcr.io/ORG/*'.",
)
@click.option(
    "--identity",
    metavar="SUBJECT",
    help="--engine kyverno: the keyless signer that must have signed the attestation, e.g. "
    "https://github.com/ORG/REPO/.github/workflows/build-images.yml@refs/heads/main.",
)
@click.option(
    "--issuer",
    default="https://token.actions.githubusercontent.com",
    show_default=True,
    metavar="URL",
    help="--engine kyverno: the OIDC issuer of --identity.",
)
@click.option("--format", "fmt", type=MANIFEST_FORMATS, default="yaml", show_default=True)
@platform_option
@containerd_options
@timeout_option
@profiles_option
def gate(  # noqa: PLR0917 - one parameter per option, as click passes them
    engine: str,
    images: tuple[str, ...],
    claim_template: str | None,
    name: str,
    kyverno_images: tuple[str, ...],
    identity: str | None,
    issuer: str,
    fmt: str,
    platform: str,
    profiles_dir: str | None,
) -> int:
    """Print an admission gate that denies GPU Pods whose image was not placed by CI.

    A Pod asking for nvidia.com/gpu (or using a claim from a placement's DRA template)
    is denied where a GPU container's image is not pinned by digest, has no placement,
    or where the Pod's affinity (or claim) does not require what the placement says.
    Prints the CustomResourceDefinition of the placements, the ValidatingAdmissionPolicy
    and its binding; with --image, the placements object for those images;
    with --engine kyverno, a ClusterPolicy that checks the signed check verdict.
    docs/placement.md.
    """
    if engine == "kyverno":
        if images:
            refuse_together("--engine kyverno", "--image", "placements feed the vap engine.")
        if not kyverno_images or not identity:
            raise InputError(
                "--engine kyverno needs --kyverno-images PATTERN and --identity SUBJECT: the "
                "images the policy covers and the keyless signer of their attestations "
                "(the workflow that ran check --attest and cosign attest)."
            )
        from buildmatrix.k8s_kyverno import policy

        doc = policy(
            name=name, images=kyverno_images, subject=identity, issuer=issuer, labels=LABELS
        )
        click.echo(dump_manifests(doc, fmt), nl=False)
        return 0
    for option in ("kyverno_images", "identity", "issuer"):
        if given(option):
            refuse_together(f"--{option.replace('_', '-')}", "--engine vap", "it is Kyverno's.")
    if claim_template is not None and not images:
        raise InputError(
            "--claim-template names the template of --image's placements; give --image."
        )
    if images:
        entries = _placements(
            images, platform=platform, claim=claim_template, profiles_dir=profiles_dir
        )
        from buildmatrix.k8s_gate import placements

        click.echo(dump_manifests(placements(entries, LABELS), fmt), nl=False)
        return 0
    from buildmatrix.k8s_gate import crd, policy_objects

    click.echo(
        dump_manifests([crd(LABELS), *policy_objects(name=name, labels=LABELS)], fmt), nl=False
    )
    return 0


def _placements(
    refs: tuple[str, ...], *, platform: str, claim: str | None, profiles_dir: str | None
) -> dict[str, dict[str, Any]]:
    """Each image's digests (index and manifest) -> its placement: the terms affinity
    prints for it (the same code), or the claim template."""
    from buildmatrix.affinity import Needs, choose
    from buildmatrix.cli.affinity_cmd import _node_terms, _scan
    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.k8s_gate import placement_of

    profiles = load(profiles_dir)
    facts = load_cuda_facts()
    entries: dict[str, dict[str, Any]] = {}
    for ref in refs:
        image = _scan(ref, platform)
        digests = [d for d in (image.index_digest, image.digest) if d]
        if not digests:
            raise InputError(
                f"--image {ref}: has no digest (a folder or a single file); a Pod names its "
                "image by registry digest, so a placement must too. Give the image as pushed "
                "(docker://HOST/NAME@sha256:...)."
            )
        if claim is not None:
            placement: dict[str, Any] = {"claimTemplate": claim}
        else:
            needs = Needs()
            choice = choose(image, profiles, needs, facts)
            if not choice.chosen:
                raise InputError(
                    f"--image {ref}: runs on none of the profiles' GPUs; nothing to place."
                )
            terms = _node_terms(
                ref, image, choice, platform=platform, profiles=profiles, needs=needs, facts=facts
            )
            placement = placement_of(terms)
        for d in digests:
            entries[d] = placement
    return entries
