"""Node label keys, and who owns each (docs/smoke.md, "What each label means").

Facts, no I/O. The one list of the keys buildmatrix writes: ``smoke`` labels with
them, ``smoke --apply`` removes only them (never another controller's label), and
``affinity`` selects only on keys ``smoke`` writes whatever ``--gfd-keys`` says.

GPU Feature Discovery's keys are GFD's: buildmatrix computes them as GFD does
(NVIDIA/k8s-device-plugin ``internal/lm/resource.go``: ``baseLabeler``,
``newArchitectureLabels``; ``internal/lm/nvml.go``: ``newVersionLabeler``) and
writes them only where GFD does not run (:class:`GfdKeys`). GFD marks every node it
labels with ``nvidia.com/gfd.timestamp`` (``internal/lm/timestamp.go``,
``NewTimestampLabeler``; left out only with GFD's ``--no-timestamp``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

# --- buildmatrix's own keys ------------------------------------------------------
SMOKE = "buildmatrix.io/smoke"
DRIVER_FLOOR = "buildmatrix.io/driver-floor"
MIXED = "buildmatrix.io/mixed"
# The node's driver as three integers (535.104.05 -> 535, 104, 5; a two-part version's
# revision is 0): GFD's own revision label is empty for a two-part version.
DRIVER_MAJOR = "buildmatrix.io/driver.major"
DRIVER_MINOR = "buildmatrix.io/driver.minor"
DRIVER_REVISION = "buildmatrix.io/driver.revision"
# The driver as one sortable integer (driver_ordinal: 580.65.06 -> 580065006), the key
# affinity's driver terms read: Kubernetes' Gt and Lt compare one label parsed as an
# integer with one integer (k8s.io/apimachinery labels/selector.go,
# Requirement.Matches), so "driver >= 580.65.06" is one Gt on it.
DRIVER_VERSION = "buildmatrix.io/driver.version"
# On a node of several GPU models (--allow-mixed), one key per model's compute
# capability (buildmatrix.io/compute-capability.9.0=true), so that an affinity can
# ask that every GPU of the node runs the image, not only the least capable one.
PRESENT_PREFIX = "buildmatrix.io/compute-capability."
POOL = "gpu-pool"
VERIFIED_PREFIX = "verified.buildmatrix.io/"
# The least capable GPU's compute capability and the smallest GPU's memory (MiB), the
# keys affinity reads. They are buildmatrix's, so they live in its own prefix.
COMPUTE_CAPABILITY = "buildmatrix.io/gpu.compute-capability"
MEMORY_MB = "buildmatrix.io/gpu.memory-mb"
# The seed's names for the same two labels, written into NVIDIA's prefix although no
# NVIDIA component writes them (docs/smoke.md, "Label keys: the transition"). smoke
# still writes them, with the same values, so selectors written against them keep
# working while they move to the keys above; affinity reads only the keys above.
# They stay owned (smoke --apply removes them where it removes its labels) for as
# long as smoke writes them and one release after, since smoke alone ever wrote them.
SEED_KEYS = ("nvidia.com/gpu.compute-capability", "nvidia.com/gpu.memory-mb")
LEGACY = dict(zip((COMPUTE_CAPABILITY, MEMORY_MB), SEED_KEYS, strict=True))
# The admission taint smoke removes from a node that passes (and adds to one that
# fails), and the annotation that carries a failed node's report (docs/smoke.md).
TAINT_KEY = "buildmatrix.io/unverified"
TAINT_EFFECT = "NoSchedule"
REPORT_ANNOTATION = "buildmatrix.io/smoke-report"
# When an admitted node's image source first could not be read (node/hold.py; RFC 3339).
UNAVAILABLE_ANNOTATION = "buildmatrix.io/smoke-unavailable-since"
AGENT_ANNOTATIONS = (REPORT_ANNOTATION, UNAVAILABLE_ANNOTATION)  # all the agent writes

# --- GPU Feature Discovery's keys ------------------------------------------------
PRODUCT = "nvidia.com/gpu.product"
COUNT = "nvidia.com/gpu.count"
MEMORY = "nvidia.com/gpu.memory"
FAMILY = "nvidia.com/gpu.family"
GFD_TIMESTAMP = "nvidia.com/gfd.timestamp"
COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
CUDA_DRIVER_MAJOR = "nvidia.com/cuda.driver-version.major"
CUDA_DRIVER_MINOR = "nvidia.com/cuda.driver-version.minor"
CUDA_DRIVER_REVISION = "nvidia.com/cuda.driver-version.revision"
CUDA_DRIVER_FULL = "nvidia.com/cuda.driver-version.full"
CUDA_RUNTIME_MAJOR = "nvidia.com/cuda.runtime-version.major"
CUDA_RUNTIME_MINOR = "nvidia.com/cuda.runtime-version.minor"
CUDA_RUNTIME_FULL = "nvidia.com/cuda.runtime-version.full"
# The keys of GFD's that buildmatrix can compute from a snapshot and writes where GFD
# does not run (and the MIG keys below). GFD writes more (gpu.replicas,
# gpu.sharing-strategy, gpu.mode, gpu.machine, mig.capable, the timestamp…):
# buildmatrix never writes or removes those.
GFD_KEYS = (
    PRODUCT,
    FAMILY,
    COMPUTE_MAJOR,
    COMPUTE_MINOR,
    MEMORY,
    COUNT,
    CUDA_DRIVER_MAJOR,
    CUDA_DRIVER_MINOR,
    CUDA_DRIVER_REVISION,
    CUDA_DRIVER_FULL,
    CUDA_RUNTIME_MAJOR,
    CUDA_RUNTIME_MINOR,
    CUDA_RUNTIME_FULL,
)
# What buildmatrix owns, as the admission policy (k8s_policy.py) also states it: every
# key under these prefixes, and these keys.
OWNED_PREFIXES = ("buildmatrix.io/", VERIFIED_PREFIX)
OWNED_KEYS = (POOL, *SEED_KEYS)
# GFD's MIG keys (internal/lm/mig-strategy.go, migStrategyLabeler and
# newMigStrategyMixedLabeler; internal/resource/nvml-mig-device.go, GetAttributes):
# the strategy, and per MIG resource (nvidia.com/gpu with --mig-strategy single,
# nvidia.com/mig-<profile> with mixed) the MIG device's attributes beside product and
# count. Written where GFD's keys are, under smoke's --mig-strategy.
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MIG_ATTRIBUTE_SUFFIXES = (
    "memory",
    "multiprocessors",
    "slices.gi",
    "slices.ci",
    "engines.copy",
    "engines.decoder",
    "engines.encoder",
    "engines.jpeg",
    "engines.ofa",
)
# The fixed MIG keys (mig.strategy, and --mig-strategy single's attributes of
# nvidia.com/gpu); mixed's keys are every key under MIG_RESOURCE_PREFIX.
GFD_MIG_KEYS = (MIG_STRATEGY, *(f"nvidia.com/gpu.{s}" for s in MIG_ATTRIBUTE_SUFFIXES))


class GfdKeys(StrEnum):
    """Who writes GFD's keys on a node: ``smoke --gfd-keys``."""

    AUTO = "auto"  # buildmatrix, unless the node carries GFD's timestamp label
    ALWAYS = "always"  # buildmatrix: GFD does not run on the cluster
    NEVER = "never"  # GFD (--no-gfd-keys): it runs, maybe with --no-timestamp


# driver_ordinal's field widths: NVIDIA's Linux driver versions are MAJOR.MINOR or
# MAJOR.MINOR.REVISION with a minor of at most three digits (535.104.05, 470.256.02) and
# a two-digit revision (570.86.16; 580.65.06); a field of 1000 or more is no NVIDIA
# driver's and gets no ordinal.
_FIELD = 1000


def driver_ordinal(key: tuple[int, int, int]) -> int | None:
    """``buildmatrix.io/driver.version``'s value: MAJOR*10^6 + MINOR*10^3 + REVISION
    (580.65.06 -> 580065006; 570.86 -> 570086000, a missing revision being 0, as
    ``packaging.Version`` orders it). Integers compare as the versions do. None where
    the minor or revision has four digits or more (no NVIDIA driver's): smoke then
    writes no such label, so no driver term matches (fail closed)."""
    major, minor, revision = key
    if min(key) < 0 or minor >= _FIELD or revision >= _FIELD:
        return None
    return (major * _FIELD + minor) * _FIELD + revision


def driver_ordinal_at_least(key: tuple[int, int, int]) -> int:
    """The smallest ordinal of a driver >= ``key``: for every driver D with an ordinal,
    D >= key iff ordinal(D) >= this (a bound past the field widths is rounded up to
    the next version that has one)."""
    major, minor, revision = key
    if revision >= _FIELD:
        minor, revision = minor + 1, 0
    if minor >= _FIELD:
        major, minor, revision = major + 1, 0, 0
    return (major * _FIELD + minor) * _FIELD + revision


def present_key(cc: object) -> str:
    """The key that says a GPU of compute capability ``cc`` (``9.0``) is on a mixed node."""
    return f"{PRESENT_PREFIX}{cc}"


def writes_gfd_keys(mode: GfdKeys, node_labels: Mapping[str, str] | None) -> bool:
    """Whether buildmatrix writes (and so owns) GFD's keys on a node with these labels
    (None: the node cannot be read, as for ``labels`` or ``--nfd-file`` alone)."""
    if mode is GfdKeys.AUTO:
        return GFD_TIMESTAMP not in (node_labels or {})
    return mode is GfdKeys.ALWAYS


# What buildmatrix writes of a mixed MIG resource: product, count and the attributes.
# GFD also writes its ``.replicas`` and ``.sharing-strategy`` (internal/lm/resource.go,
# baseLabeler), which are the device plugin's sharing settings: never buildmatrix's.
_MIG_RESOURCE_SUFFIXES = tuple(f".{s}" for s in ("product", "count", *MIG_ATTRIBUTE_SUFFIXES))


def is_mig_key(key: str) -> bool:
    """A GFD MIG key buildmatrix writes with ``--mig-strategy single`` or ``mixed``."""
    return key in GFD_MIG_KEYS or (
        key.startswith(MIG_RESOURCE_PREFIX) and key.endswith(_MIG_RESOURCE_SUFFIXES)
    )


def owned(key: str, *, gfd_keys: bool) -> bool:
    """Whether buildmatrix writes, and so may remove, this label: its own keys, and
    GFD's listed keys only where it writes them (``gfd_keys``)."""
    return (
        key.startswith(OWNED_PREFIXES)
        or key in OWNED_KEYS
        or (gfd_keys and (key in GFD_KEYS or is_mig_key(key)))
    )
