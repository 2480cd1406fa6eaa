"""Node labels in three layers, computed the way GPU Feature Discovery computes them.

Pure. Layer 1/2 are GFD's own keys, so buildmatrix's labels and GFD's agree where
both run (NVIDIA/k8s-device-plugin ``internal/lm/resource.go`` and ``nvml.go``);
``buildmatrix.io/gpu.compute-capability``, ``gpu.memory-mb`` and ``driver.version``
are what ``affinity`` selects on (the seed's ``nvidia.com/`` names of the first two
are written beside them for the transition: labelkeys ``LEGACY``); layer 3 is the
pool (``gpu-pool``); the other ``buildmatrix.io/*`` say what smoke found.

Fail closed: a node that failed gets ``buildmatrix.io/smoke=failed`` and nothing
else, so no selector on family, pool or verified image can match it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from buildmatrix.arch import ComputeCapability, gfd_family
from buildmatrix.labelkeys import (
    COMPUTE_CAPABILITY,
    COMPUTE_MAJOR,
    COMPUTE_MINOR,
    COUNT,
    CUDA_DRIVER_FULL,
    CUDA_DRIVER_MAJOR,
    CUDA_DRIVER_MINOR,
    CUDA_DRIVER_REVISION,
    CUDA_RUNTIME_FULL,
    CUDA_RUNTIME_MAJOR,
    CUDA_RUNTIME_MINOR,
    DRIVER_FLOOR,
    DRIVER_MAJOR,
    DRIVER_MINOR,
    DRIVER_REVISION,
    DRIVER_VERSION,
    FAMILY,
    GFD_KEYS,
    LEGACY,
    MEMORY,
    MEMORY_MB,
    MIG_ATTRIBUTE_SUFFIXES,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY,
    MIXED,
    POOL,
    PRODUCT,
    SEED_KEYS,
    SMOKE,
    VERIFIED_PREFIX,
    driver_ordinal,
    present_key,
)
from buildmatrix.node.checks import NodeReport
from buildmatrix.node.mig import gfd_name
from buildmatrix.node.pools import Pools
from buildmatrix.node.values import label_value
from buildmatrix.snapshot import MigDevice, Snapshot

__all__ = [
    "DRIVER_FLOOR",
    "GFD_KEYS",
    "MIXED",
    "POOL",
    "SEED_KEYS",
    "SMOKE",
    "VERIFIED_PREFIX",
    "VerifiedImage",
    "gfd_family_label",
    "gfd_product",
    "mig_labels",
    "node_labels",
]


@dataclass(frozen=True, kw_only=True)
class VerifiedImage:
    """An image smoke proved on this node; ``name`` becomes a ``verified.*`` label."""

    name: str


def gfd_product(name: str) -> str:
    """NVML name as GFD writes ``gpu.product``: characters outside ``[A-Za-z0-9-_. ]``
    dropped, whitespace runs joined by ``-`` ("NVIDIA H100 80GB HBM3" ->
    "NVIDIA-H100-80GB-HBM3"); cut to a valid label value where GFD's would be invalid."""
    kept = re.sub(r"[^A-Za-z0-9\-_. ]", "", name)
    return label_value("-".join(kept.split()))


def gfd_family_label(cc: ComputeCapability) -> str:
    """``gpu.family`` as GFD v0.20 writes it (13.x rubin, unknown majors undefined)."""
    return gfd_family(cc).value


def _mig_resource(resource: str, parent: str, device: MigDevice, count: int) -> dict[str, str]:
    """GFD's NewMIGResourceLabeler for one resource: product ``<parent>-MIG-<profile>``
    (getProductName: each part sanitised, joined by ``-``), the count, and the MIG
    device's attributes (newMigAttributeLabels)."""
    profile = gfd_name(device.profile or "")
    product = "-".join(gfd_product(part) for part in (parent, "MIG", profile))
    labels = {f"{resource}.product": label_value(product), f"{resource}.count": str(count)}
    a = device.attributes
    if a is not None:
        values = (
            a.memory,
            a.multiprocessors,
            a.slices_gi,
            a.slices_ci,
            a.engines_copy,
            a.engines_decoder,
            a.engines_encoder,
            a.engines_jpeg,
            a.engines_ofa,
        )
        labels |= {
            f"{resource}.{k}": str(v) for k, v in zip(MIG_ATTRIBUTE_SUFFIXES, values, strict=True)
        }
    return labels


def mig_labels(snapshot: Snapshot, *, strategy: str, gfd_keys: bool = True) -> dict[str, str]:
    """The MIG labels of GFD's ``--mig-strategy`` (``internal/lm/mig-strategy.go``):

    - ``none``: none (whole-GPU labels only);
    - ``single``: ``nvidia.com/gpu.*`` describe one MIG device: product
      ``<product>-MIG-<profile>``, count = MIG devices on the node, memory = the
      slice's ``memorySizeMB`` (newMigStrategySingleLabeler); the seed's
      ``gpu.memory-mb`` follows the slice too, since that is what a Pod gets;
    - ``mixed``: ``nvidia.com/mig-<profile>.*`` per profile, whole-GPU labels stay
      (newMigStrategyMixedLabeler).

    Both set ``nvidia.com/mig.strategy``. The node's MIG check has already failed
    any layout the strategy cannot describe (node/mig.py)."""
    found: dict[str, tuple[str, MigDevice, int]] = {}  # name -> (parent, first device, count)
    for gpu in sorted(snapshot.gpus, key=lambda g: g.index):
        for device in gpu.mig_devices or () if gpu.mig_mode else ():
            if device.profile is None:
                continue
            name = gfd_name(device.profile)
            parent, first, count = found.get(name, (gpu.name, device, 0))
            found[name] = (parent, first, count + 1)
    if strategy == "none" or not found:
        return {}
    labels: dict[str, str] = {}
    if strategy == "single":
        ((parent, device, count),) = found.values()
        if gfd_keys:
            labels |= _mig_resource("nvidia.com/gpu", parent, device, count)
        if device.attributes is not None:
            labels[MEMORY_MB] = str(device.attributes.memory)
    elif gfd_keys:
        for name, (parent, device, count) in sorted(found.items()):
            labels |= _mig_resource(MIG_RESOURCE_PREFIX + name, parent, device, count)
    if gfd_keys:
        labels[MIG_STRATEGY] = strategy
    return labels


def _driver_labels(snapshot: Snapshot) -> dict[str, str]:
    # GFD splits nvmlSystemGetDriverVersion on "." and keeps leading zeros; the
    # revision is empty for a two-part version (internal/lm/nvml.go, newVersionLabeler).
    text = str(snapshot.driver)
    parts = text.split(".")
    labels = {
        CUDA_DRIVER_MAJOR: parts[0],
        CUDA_DRIVER_MINOR: parts[1],
        CUDA_DRIVER_REVISION: parts[2] if len(parts) > 2 else "",
        CUDA_DRIVER_FULL: text,
    }
    if snapshot.cuda_driver_version:
        major, _, minor = snapshot.cuda_driver_version.partition(".")
        labels |= {
            CUDA_RUNTIME_MAJOR: major,
            CUDA_RUNTIME_MINOR: minor,
            CUDA_RUNTIME_FULL: snapshot.cuda_driver_version,
        }
    return labels


def _own_driver_labels(snapshot: Snapshot) -> dict[str, str]:
    """The driver as integers: its three parts, and the one ordinal affinity's Gt/Lt
    terms compare (labelkeys.driver_ordinal; none for a version no NVIDIA driver has)."""
    major, minor, revision = snapshot.driver.key
    labels = {DRIVER_MAJOR: str(major), DRIVER_MINOR: str(minor), DRIVER_REVISION: str(revision)}
    if (ordinal := driver_ordinal(snapshot.driver.key)) is not None:
        labels[DRIVER_VERSION] = str(ordinal)
    return labels


def _smallest_memory(snapshot: Snapshot) -> int | None:
    """The smallest GPU memory on the node (MiB): on a mixed node a ``Gt`` on the
    memory labels is then a promise every GPU keeps. GFD leaves memory out when NVML
    reports 0 (``NewGPUResourceLabeler``), and so does this."""
    sizes = [g.memory_total_mib for g in snapshot.gpus if g.memory_total_mib]
    return min(sizes) if sizes else None


def node_labels(
    snapshot: Snapshot,
    report: NodeReport,
    *,
    pools: Pools | None = None,
    gfd_keys: bool = True,
    verified: Sequence[VerifiedImage] = (),
    mig_strategy: str = "none",
) -> dict[str, str]:
    """The labels for this node: all layers on pass, only the failure mark on fail.

    On a node of several models (``--allow-mixed``) the labels describe the least
    capable one: its product and, as GFD counts (``newGPULabelers``: ``counts[name]``
    per model name), the number of GPUs of that model; the memory labels are the
    smallest GPU's of the whole node.
    """
    model = report.labelled
    if not report.passed or model is None:
        return {SMOKE: "failed"}
    memory = _smallest_memory(snapshot)
    labels: dict[str, str] = {}
    if gfd_keys:
        labels[PRODUCT] = gfd_product(model.name)
        labels[COUNT] = str(len(model.gpus))
        if memory:
            labels[MEMORY] = str(memory)
        if model.cc.major != 0:  # GFD: no architecture labels for CC major 0
            labels[FAMILY] = gfd_family_label(model.cc)
            labels[COMPUTE_MAJOR] = str(model.cc.major)
            labels[COMPUTE_MINOR] = str(model.cc.minor)
        labels |= _driver_labels(snapshot)
    labels[COMPUTE_CAPABILITY] = str(model.cc)
    if memory:
        labels[MEMORY_MB] = str(memory)
    labels |= mig_labels(snapshot, strategy=mig_strategy, gfd_keys=gfd_keys)
    labels |= {old: labels[new] for new, old in LEGACY.items() if new in labels}
    labels |= _own_driver_labels(snapshot)
    if pools is not None:
        pool = pools.pool_for(product=model.name, family=gfd_family_label(model.cc))
        if pool:
            labels[POOL] = pool
    labels[SMOKE] = "passed"
    if report.driver_floor is not None:
        labels[DRIVER_FLOOR] = str(report.driver_floor)
    if len(report.models) > 1:
        labels[MIXED] = "true"
        for m in report.models:
            labels[present_key(m.cc)] = "true"
    for image in verified:
        name = label_value(image.name)
        if name:
            labels[VERIFIED_PREFIX + name] = "true"
    return labels
