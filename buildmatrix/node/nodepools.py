"""``buildmatrix k8s nodepools``: the autoscaler templates of each pool, whose labels
are the labels ``smoke`` will write there (docs/kubernetes.md, "Day 2: autoscaling
from zero"). Pure: pools, profiles and drivers in, objects out.

An autoscaler knows a node that does not exist yet only by its template. Karpenter
matches a pending Pod's required node affinity against a NodePool's requirements and
template labels (kubernetes-sigs/karpenter ``pkg/controllers/provisioning/scheduling/
nodeclaimtemplate.go`` ``NewNodeClaimTemplate``: ``spec.template.spec.requirements``
plus each template label as ``In [value]``; ``nodeclaim.go`` ``CanAdd``:
``Requirements.Compatible`` with ``AllowUndefinedWellKnownLabels``), and refuses a
required custom label the NodePool does not define (``pkg/scheduling/requirements.go``
``Compatible``: "label ... does not have known values"; aws/karpenter-provider-aws
#7535). cluster-autoscaler builds a node of an empty AWS node group from the group's
``k8s.io/cluster-autoscaler/node-template/label/<key>`` and ``.../taint/<key>`` tags
(kubernetes/autoscaler ``cluster-autoscaler/cloudprovider/aws/aws_manager.go``
``extractLabelsFromAsg``, ``extractTaintsFromAsg``; #4893). So a Pod carrying
``affinity``'s terms scales up nothing unless the template carries the labels smoke
writes after join.

The labels are computed, not listed: per GPU model of a pool (node/poolmodels.py), a
synthetic snapshot of that model at the pool's driver is judged by smoke's own checks
(node/checks.py ``evaluate``) and labelled by smoke's own code (node/labels.py
``node_labels``). A model smoke would fail at that driver gets no template (it would
be capacity that never admits). Kept: the keys buildmatrix owns whatever
``--gfd-keys`` says (labelkeys ``owned``: every key ``affinity`` reads is one), less
what a round found (``buildmatrix.io/smoke``, ``verified.*``, ``driver-floor``):
Karpenter writes template labels on the Node when it registers
(``nodeclaim/lifecycle/registration.go``), before smoke has run, so a verdict there
would claim a pass nobody made (the admission taint keeps Pods off until smoke's
verdict), and the floor smoke checks grows with the images it is given. Models whose
labels agree share one template.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from buildmatrix.cuda import CudaFacts, DriverVersion
from buildmatrix.drivers import GpuModel
from buildmatrix.labelkeys import (
    DRIVER_FLOOR,
    SMOKE,
    TAINT_EFFECT,
    TAINT_KEY,
    VERIFIED_PREFIX,
    owned,
)
from buildmatrix.node.checks import NodeOptions, evaluate
from buildmatrix.node.labels import node_labels
from buildmatrix.node.pools import Pools
from buildmatrix.profiles import ProfileSet
from buildmatrix.snapshot import Gpu, Snapshot

__all__ = [
    "AWS_GPU_NAMES",
    "CA_LABEL_TAG",
    "CA_STARTUP_PREFIX",
    "CA_TAINT_TAG",
    "GPU_NAME",
    "Skipped",
    "Template",
    "karpenter_nodepools",
    "node_group_tags",
    "templates",
]

# Karpenter's AWS provider labels an instance type with one GPU model by the lower
# kebab-case of EC2's GpuInfo name (aws/karpenter-provider-aws
# pkg/providers/instancetype/types.go, computeRequirements: LabelInstanceGPUName).
GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
# EC2's GPU name per NVML product, for the instance families AWS's instance-type
# reference lists with that name (aws/karpenter-provider-aws
# website/content/en/preview/reference/instance-types.md): p5 h100; p5e and p5en h200;
# p4d a100 (40960 MiB) and p4de a100 (81920 MiB); g5 a10g; g6 l4; g6e l40s; g4dn t4;
# p3dn v100 (32768 MiB); p6-b200 b200; p6-b300 b300. The NVML names are those of the
# GPUs AWS documents for each family (aws.amazon.com/ec2/instance-types, "Accelerated
# Computing"). A product AWS does not offer gets no NodePool: without a GPU requirement
# Karpenter could launch any instance type under labels that say it has the GPU.
AWS_GPU_NAMES: Mapping[str, str] = {
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA H200": "h200",
    "NVIDIA A100-SXM4-40GB": "a100",
    "NVIDIA A100-SXM4-80GB": "a100",
    "NVIDIA A10G": "a10g",
    "NVIDIA L4": "l4",
    "NVIDIA L40S": "l40s",
    "Tesla T4": "t4",
    "Tesla V100-SXM2-32GB": "v100",
    "NVIDIA B200": "b200",
    "NVIDIA B300 SXM6 AC": "b300",
}
CA_LABEL_TAG = "k8s.io/cluster-autoscaler/node-template/label/"
CA_TAINT_TAG = "k8s.io/cluster-autoscaler/node-template/taint/"
# cluster-autoscaler takes a taint with this prefix for a startup taint without any
# flag (its FAQ, "How does Cluster Autoscaler treat nodes with status/startup/ignore
# taints?"): what managed autoscalers (GKE, AKS), which take no flags, honour
CA_STARTUP_PREFIX = "startup-taint.cluster-autoscaler.kubernetes.io/"
ARCH = "kubernetes.io/arch"  # a Karpenter well-known label (pkg/apis/v1/labels.go)


@dataclass(frozen=True, kw_only=True)
class Template:
    """One template: the GPU models of a pool whose smoke labels agree."""

    name: str  # the NodePool's / node group's name
    pool: str
    driver: DriverVersion
    products: tuple[str, ...]
    labels: Mapping[str, str]
    arches: tuple[str, ...]  # kubernetes.io/arch of the models' hosts (profiles' hosts)


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """A model of a pool that gets no template, and why."""

    pool: str
    product: str
    why: str


def _snapshot(model: GpuModel, driver: DriverVersion, gpus: int, facts: CudaFacts) -> Snapshot:
    """A node of ``gpus`` GPUs of the model at the driver, as NVML would show it where
    it reports no fault. Its memory is unknown (no profile records it), so the memory
    labels are left out, as smoke leaves them out where NVML reports none."""
    cuda = facts.driver_cuda(driver)
    return Snapshot(
        hostname=f"template-{model.product}",
        driver=driver,
        cuda_driver_version=f"{cuda.major}.{cuda.minor}" if cuda is not None else None,
        gpus=tuple(
            Gpu(index=i, name=model.product, cc=model.profile.cc, memory_total_mib=None)
            for i in range(gpus)
        ),
        errors=(),
        source="k8s nodepools",
        gpu_count=gpus,
    )


# What a round found rather than what the node is: the verdict, the images it proved,
# and the highest floor it checked the driver against (which grows with the images
# smoke is given, which the template knows nothing of).
_FINDINGS = (SMOKE, DRIVER_FLOOR)


def template_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """What of smoke's labels a template carries: buildmatrix's own keys, less what a
    round found (the verdict, verified images, the floor checked)."""
    return {
        k: v
        for k, v in labels.items()
        if owned(k, gfd_keys=False) and k not in _FINDINGS and not k.startswith(VERIFIED_PREFIX)
    }


def _object_name(text: str) -> str:
    """A pool name (any label value) as a DNS-1123 subdomain, as object names must be."""
    name = re.sub(r"[^a-z0-9.-]+", "-", text.lower()).strip("-.")
    return name or "pool"


def templates(
    pools: Pools,
    models: Mapping[str, Sequence[GpuModel]],
    drivers: Mapping[str, DriverVersion],
    *,
    profiles: ProfileSet,
    facts: CudaFacts,
    gpu_names: Mapping[str, str] | None = None,
) -> tuple[list[Template], list[Skipped]]:
    """The templates of every pool given a driver. ``gpu_names`` (Karpenter on AWS):
    only the products the cloud offers, named by it, get one."""
    out: list[Template] = []
    skipped: list[Skipped] = []
    for pool, pool_models in models.items():
        driver = drivers.get(pool)
        if driver is None:
            continue
        groups: dict[tuple[tuple[str, str], ...], list[GpuModel]] = {}
        for model in pool_models:
            if gpu_names is not None and model.product not in gpu_names:
                why = "no instance type of the cloud provider has it"
                skipped.append(Skipped(pool=pool, product=model.product, why=why))
                continue
            snap = _snapshot(model, driver, pools.spec(pool).gpus or 1, facts)
            report = evaluate(snap, profiles, facts, options=NodeOptions(pools=pools))
            if not report.passed:
                why = "; ".join(f"{c.name}: {c.message}" for c in report.checks if not c.ok)
                skipped.append(Skipped(pool=pool, product=model.product, why=f"smoke fails: {why}"))
                continue
            labels = template_labels(node_labels(snap, report, pools=pools, gfd_keys=False))
            groups.setdefault(tuple(sorted(labels.items())), []).append(model)
        for key, members in groups.items():
            names = sorted({gpu_names[m.product] for m in members}) if gpu_names else []
            suffix = "-".join(names) if names else members[0].product
            name = _object_name(pool if len(groups) == 1 else f"{pool}-{suffix}")
            hosts = {a for m in members for a in m.profile.hosts(m.product)}
            out.append(
                Template(
                    name=name,
                    pool=pool,
                    driver=driver,
                    products=tuple(m.product for m in members),
                    labels=dict(key),
                    arches=tuple(sorted(hosts)),
                )
            )
    return out, skipped


def karpenter_nodepools(
    found: Sequence[Template],
    gpu_names: Mapping[str, str],
    *,
    node_class: str,
    taint_key: str = TAINT_KEY,
) -> list[dict[str, object]]:
    """One ``karpenter.sh/v1`` NodePool per template: its labels, the GPU and CPU
    architecture requirements, and the admission taint as a startup taint (Karpenter
    leaves a NodeClaim uninitialized until its startup taints are gone:
    ``nodeclaim/lifecycle/initialization.go``, ``StartupTaintsRemoved``; a Pod need not
    tolerate it to be placed there: ``scheduling/nodeclaim.go`` ``CanAdd`` checks
    ``spec.taints`` only)."""
    objects: list[dict[str, object]] = []
    for t in found:
        requirements = [
            {
                "key": GPU_NAME,
                "operator": "In",
                "values": sorted({gpu_names[p] for p in t.products}),
            },
            {"key": ARCH, "operator": "In", "values": list(t.arches)},
        ]
        objects.append(
            {
                "apiVersion": "karpenter.sh/v1",
                "kind": "NodePool",
                "metadata": {
                    "name": t.name,
                    "labels": {"app.kubernetes.io/managed-by": "buildmatrix"},
                    "annotations": {"buildmatrix.io/products": ", ".join(t.products)},
                },
                "spec": {
                    "template": {
                        "metadata": {"labels": dict(t.labels)},
                        "spec": {
                            "nodeClassRef": {
                                "group": "karpenter.k8s.aws",
                                "kind": "EC2NodeClass",
                                "name": node_class,
                            },
                            "requirements": requirements,
                            "startupTaints": [{"key": taint_key, "effect": TAINT_EFFECT}],
                        },
                    },
                },
            }
        )
    return objects


def node_group_tags(
    found: Sequence[Template], *, taint_key: str = TAINT_KEY
) -> list[dict[str, object]]:
    """Per template, the AWS Auto Scaling group tags cluster-autoscaler reads for a
    node group with no node (aws_manager.go ``extractLabelsFromAsg``: the key after
    the prefix is the label; ``extractTaintsFromAsg``: the value ``VALUE:EFFECT``; the
    admission taint has no value). The taint must also be one of cluster-autoscaler's
    startup taints (``--startup-taint=KEY``, or a key under
    ``startup-taint.cluster-autoscaler.kubernetes.io/``, which managed autoscalers take
    without flags; its FAQ, "How does Cluster Autoscaler treat nodes with
    status/startup/ignore taints?"), or it judges the new node unable to take the Pod."""
    groups: list[dict[str, object]] = []
    for t in found:
        tags = {CA_LABEL_TAG + k: v for k, v in t.labels.items()}
        tags[CA_TAINT_TAG + taint_key] = f":{TAINT_EFFECT}"
        groups.append({"name": t.name, "pool": t.pool, "products": list(t.products), "tags": tags})
    return groups
