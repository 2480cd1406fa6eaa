"""``affinity --format dra``: a ``resource.k8s.io/v1`` ResourceClaimTemplate whose
device request selects, with CEL over the attributes NVIDIA's DRA driver publishes,
exactly the GPUs (and drivers) ``check`` passes the image on.

Pure. What it reads of a device, as the DRA driver publishes it (kubernetes-sigs/
dra-driver-nvidia-gpu, formerly NVIDIA/k8s-dra-driver-gpu, ``cmd/gpu-kubelet-plugin``):

- ``device.attributes['gpu.nvidia.com'].cudaComputeCapability``: a version
  (``deviceinfo.go``, ``GpuInfo.Attributes``: ``VersionValue:
  semver.MustParse(d.cudaComputeCapability).String()``, from NVML's "8.0" through
  go-nvlib's ``GetCudaComputeCapabilityAsString``): ``8.0.0``;
- ``device.attributes['gpu.nvidia.com'].driverVersion``: a version, NVML's
  ``SystemGetDriverVersion`` through Masterminds/semver v3's coercing ``NewVersion``
  (``coerceNewVersion``: each part through ``strconv.ParseUint``) and ``String()``
  (``%d.%d.%d``): 580.65.06 is published as ``580.65.6``;
- ``device.attributes['gpu.nvidia.com'].productName``: a string, NVML's ``GetName``
  (``nvlib.go``, ``getGpuInfo``), the name the profiles' product floors use;
- ``device.capacity['gpu.nvidia.com'].memory``: a quantity in bytes, NVML's
  ``GetMemoryInfo().Total`` (``partitions.go``, ``GpuInfo.fullGpuCapacity``); absent
  where NVML does not report it.

The DeviceClass ``gpu.nvidia.com`` (the driver's Helm chart,
``templates/deviceclass-gpu.yaml``) selects its full GPUs (``type == 'gpu'``); MIG
devices are the class ``mig.nvidia.com``'s and are not requested here.

Versions are compared with Kubernetes' CEL semver library (k8s.io/apiserver
``pkg/cel/library/semverlib.go``: ``semver()`` parses with blang/semver v4's strict
``Parse``, which refuses leading zeros, so every literal here is written from the
version's numbers; ``compareTo`` is ``Version.Compare``), memory with its quantity
library (``pkg/cel/library/quantity.go``). Both are in the DRA selector environment
(k8s.io/dynamic-resource-allocation ``cel/compile.go``, ``newCompiler``: the base
environment, which has the quantity library from 1.28 (k8s.io/apiserver
``pkg/cel/environment/base.go``), plus ``library.SemverLib`` from 1.31).
Each attribute is tested for presence before it is read: an unknown field aborts the
allocation (k8s.io/api ``resource/v1`` ``CELDeviceSelector``).

Native code is preferred to PTX JIT where both run: the request is a ``firstAvailable``
list (k8s.io/api ``resource/v1/types.go``, ``DeviceRequest.FirstAvailable``, feature
gate DRAPrioritizedList) of the GPUs that run the image natively, then of every GPU
that runs it; one ``exactly`` request where the two sets are the same or one is empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from buildmatrix.affinity import Choice, Interval, Needs
from buildmatrix.cuda import DriverVersion
from buildmatrix.profiles import Profile

__all__ = ["DEVICE_CLASS", "DOMAIN", "claim_template", "selector"]

DOMAIN = "gpu.nvidia.com"  # cmd/gpu-kubelet-plugin/main.go, DriverName
DEVICE_CLASS = "gpu.nvidia.com"
API_VERSION = "resource.k8s.io/v1"
_ATTRS = f"device.attributes['{DOMAIN}']"
_CAPACITY = f"device.capacity['{DOMAIN}']"
_ZERO = (0, 0, 0)


def _semver(key: tuple[int, ...]) -> str:
    # written from the numbers: semver() refuses leading zeros (blang/semver v4 Parse)
    return "semver('" + ".".join(str(int(x)) for x in [*key, 0, 0][:3]) + "')"


def _string(text: str) -> str:
    """A CEL string literal (single-quoted; a quote or backslash escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _at_least(version: DriverVersion) -> str:
    return f"{_ATTRS}.driverVersion.compareTo({_semver(version.key)}) >= 0"


def _below(version: DriverVersion) -> str:
    return f"{_ATTRS}.driverVersion.isLessThan({_semver(version.key)})"


def _drivers(ranges: Sequence[Interval]) -> str | None:
    """The driver in one of the ranges [low, high); None: any driver."""
    alternatives = []
    for low, high in ranges:
        parts = [_at_least(low)] if low.key != _ZERO else []
        parts += [_below(high)] if high is not None else []
        if not parts:
            return None
        alternatives.append(" && ".join(parts))
    return " || ".join(f"({a})" for a in alternatives)


def _profile(p: Profile, ranges: Sequence[Interval]) -> str:
    """A GPU of this profile's compute capability, on a driver at or above its
    product's own floor where the product has one above the profile's and above
    every range's low end (H200 beside H100: profiles.ProfileSet.hardware_floor)."""
    cc = f"{_ATTRS}.cudaComputeCapability.compareTo({_semver((p.cc.major, p.cc.minor))}) == 0"
    lowest = min(low for low, _ in ranges)
    floors = [
        f"({_ATTRS}.productName != {_string(product)} || {_at_least(p.driver_floor(product))})"
        for product in sorted(p.product_floors)
        if p.driver_floor(product) > max(p.min_driver, lowest)
    ]
    return " && ".join([cc, *floors])


def selector(choice: Choice, needs: Needs) -> str:
    """The CEL expression true for a device iff its GPU and driver run the image as
    ``choice`` says (one clause per group of profiles that need the same drivers),
    with ``--min-memory`` in capacity. One clause a line, for people to read."""
    groups: dict[tuple[Interval, ...], list[Profile]] = {}
    for p, ranges in choice.chosen:
        groups.setdefault(ranges, []).append(p)
    clauses = []
    for ranges, members in groups.items():
        gpus = "\n    || ".join(f"({_profile(p, ranges)})" for p in members)
        drivers = _drivers(ranges)
        clauses.append(f"({gpus})" if drivers is None else f"({gpus})\n   && ({drivers})")
    lines = [f"'{name}' in {_ATTRS}" for name in ("cudaComputeCapability", "driverVersion")]
    if any(p.product_floors for p in choice.profiles):
        lines.append(f"'productName' in {_ATTRS}")
    lines.append("(\n  " + "\n  || ".join(f"({c})" for c in clauses) + "\n)")
    if needs.min_memory_mib is not None:
        lines += [
            f"'memory' in {_CAPACITY}",
            f"{_CAPACITY}.memory.compareTo(quantity('{needs.min_memory_mib}Mi')) >= 0",
        ]
    return "\n&& ".join(lines) + "\n"


def _request(name: str, expression: str) -> dict[str, Any]:
    return {
        "name": name,
        "deviceClassName": DEVICE_CLASS,
        "selectors": [{"cel": {"expression": expression}}],
        "allocationMode": "ExactCount",
        "count": 1,
    }


def claim_template(
    *, name: str, image: str, full: Choice, native: Choice, needs: Needs
) -> dict[str, Any]:
    """The ResourceClaimTemplate: one GPU that runs the image, native code first.

    ``full``: the choice with the needs as given; ``native``: the same with
    ``--require-sass`` (``check``'s answer when JIT is not allowed)."""
    everything = selector(full, needs)
    request: dict[str, Any] = {"name": "gpu"}
    if native.chosen and native.chosen != full.chosen and not needs.require_sass:
        request["firstAvailable"] = [
            _request("native", selector(native, needs)),
            _request("jit", everything),
        ]
    else:
        request["exactly"] = {k: v for k, v in _request("", everything).items() if k != "name"}
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "annotations": {"buildmatrix.io/image": image}},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }
