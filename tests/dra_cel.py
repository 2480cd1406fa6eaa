"""A STAND-IN for Kubernetes' DRA device selection and NVIDIA's DRA driver, for tests.

No API server, scheduler or DRA driver runs here, so this restates, from their source,
what the rendered ResourceClaimTemplate relies on, and evaluates its CEL with
cel-python (a CEL implementation buildmatrix did not write):

- the devices NVIDIA's DRA driver publishes for a node (kubernetes-sigs/
  dra-driver-nvidia-gpu, formerly NVIDIA/k8s-dra-driver-gpu, ``cmd/gpu-kubelet-plugin``):
  ``deviceinfo.go`` ``GpuInfo.Attributes`` / ``GetDevice`` (type ``gpu``, ``uuid``,
  ``productName``, ``cudaComputeCapability``, ``driverVersion`` and
  ``cudaDriverVersion`` as versions through Masterminds/semver v3 ``NewVersion`` then
  ``String()``), ``partitions.go`` ``fullGpuCapacity`` (capacity ``memory``, bytes),
  ``nvlib.go`` ``getGpuInfo`` (the CUDA driver version as ``major.minor`` from NVML's
  integer) and ``enumerateAllPossibleDevices`` (a GPU in static MIG mode is not
  published whole: its MIG devices are, ``mig.go`` ``CommonAttributesMig``, type
  ``mig``);
- the DeviceClass ``gpu.nvidia.com``'s selector (the driver's Helm chart,
  ``templates/deviceclass-gpu.yaml``);
- the semver library of Kubernetes' CEL (k8s.io/apiserver ``pkg/cel/library/
  semverlib.go``: ``semver()`` is github.com/blang/semver/v4 ``Parse``; ``compareTo``,
  ``isLessThan``, ``isGreaterThan`` are ``Version.Compare``) and its quantity library
  (``pkg/cel/library/quantity.go``: ``quantity()`` is apimachinery's
  ``resource.ParseQuantity``, ``compareTo`` is ``Quantity.Cmp``);
- the device variable (k8s.io/dynamic-resource-allocation ``cel/compile.go``,
  ``DeviceMatches``: ``device.driver``, ``device.attributes[domain]``,
  ``device.capacity[domain]``; a version attribute is parsed by blang ``Parse``).

Looser than the real thing: no type check or cost estimate at compile time, and
``quantity()`` takes only an integer with a binary or decimal SI suffix (what the
renderer writes; anything else is refused, not guessed). Stricter: an unknown domain
is an error, not an empty map.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes

DOMAIN = "gpu.nvidia.com"
# templates/deviceclass-gpu.yaml
CLASS_SELECTOR = f"device.driver == '{DOMAIN}' && device.attributes['{DOMAIN}'].type == 'gpu'"

_NUMBER = r"(?:0|[1-9][0-9]*)"
_IDENT = r"[0-9A-Za-z-]+"


@dataclass(frozen=True)
class Semver:
    """blang/semver v4 ``Version``."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()


def parse_semver(text: str) -> Semver:
    """blang/semver v4 ``Parse``: exactly three dot-separated numbers without leading
    zeros (``Major number must not contain leading zeroes``), an optional pre-release
    of non-empty identifiers (a numeric one without leading zeros) and build metadata
    (ignored for precedence)."""
    match = re.fullmatch(
        rf"({_NUMBER})\.({_NUMBER})\.({_NUMBER})(?:-({_IDENT}(?:\.{_IDENT})*))?"
        rf"(?:\+({_IDENT}(?:\.{_IDENT})*))?",
        text,
    )
    if match is None:
        raise ValueError(f"not a semantic version (blang/semver Parse): {text!r}")
    pre: list[int | str] = []
    for part in (match.group(4) or "").split(".") if match.group(4) else []:
        if part.isdigit():
            if len(part) > 1 and part.startswith("0"):
                raise ValueError(f"numeric pre-release with leading zeroes: {text!r}")
            pre.append(int(part))
        else:
            pre.append(part)
    return Semver(int(match.group(1)), int(match.group(2)), int(match.group(3)), tuple(pre))


def _cmp(a: Any, b: Any) -> int:
    return int(a > b) - int(a < b)


def compare_semver(v: Semver, o: Semver) -> int:
    """blang/semver v4 ``Version.Compare``: numbers, then a version without a
    pre-release above one with; identifiers pairwise (``PRVersion.Compare``: numeric
    below alphanumeric, numbers numerically, strings lexically); the shorter list
    below where all its identifiers are equal."""
    if d := _cmp((v.major, v.minor, v.patch), (o.major, o.minor, o.patch)):
        return d
    if not v.pre or not o.pre:
        return _cmp(not v.pre, not o.pre)
    for a, b in zip(v.pre, o.pre, strict=False):
        if isinstance(a, int) != isinstance(b, int):
            return -1 if isinstance(a, int) else 1
        if d := _cmp(a, b):
            return d
    return _cmp(len(v.pre), len(o.pre))


@dataclass(frozen=True)
class Quantity:
    """apimachinery ``resource.Quantity``, as an exact number of base units."""

    value: int


_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def parse_quantity(text: str) -> Quantity:
    match = re.fullmatch(r"([0-9]+)([A-Za-z]*)", text)
    scale = None if match is None else (_BINARY | _DECIMAL).get(match.group(2))
    if match is None or scale is None:
        raise ValueError(f"quantity the stand-in does not take: {text!r}")
    return Quantity(int(match.group(1)) * scale)


# Every string semver() was called with (the real one refuses some).
SEMVER_CALLS: set[str] = set()


def _semver(arg: Any) -> Semver:
    SEMVER_CALLS.add(str(arg))
    return parse_semver(str(arg))


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, Semver) and isinstance(b, Semver):
        return compare_semver(a, b)
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return _cmp(a.value, b.value)
    raise TypeError(f"no such overload: compareTo({type(a).__name__}, {type(b).__name__})")


FUNCTIONS: dict[str, Any] = {
    "semver": _semver,
    "isSemver": lambda s: celtypes.BoolType(_is_semver(str(s))),
    "quantity": lambda s: parse_quantity(str(s)),
    "compareTo": lambda a, b: celtypes.IntType(_compare(a, b)),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) == -1),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) == 1),
}


def _is_semver(text: str) -> bool:
    try:
        parse_semver(text)
    except ValueError:
        return False
    return True


@functools.cache
def _environment() -> celpy.Environment:
    return celpy.Environment()


@functools.cache
def _program(expression: str) -> Any:
    env = _environment()
    return env.program(env.compile(expression), functions=FUNCTIONS)


def published(version: str) -> Semver:
    """Masterminds/semver v3 ``NewVersion`` (coercing: missing parts 0, each part
    ``strconv.ParseUint``) then ``String()``, read back by blang ``Parse``
    (compile.go ``getAttributeValue``)."""
    return parse_semver(published_text(version))


def published_text(version: str) -> str:
    """Masterminds/semver v3 ``NewVersion`` then ``String()`` (``%d.%d.%d``)."""
    parts = [int(x) for x in version.split(".")]
    return ".".join(str(x) for x in [*parts, 0, 0][:3])


@dataclass(frozen=True)
class Device:
    name: str
    attributes: dict[str, Any]
    capacity: dict[str, Quantity]


def devices(snapshot: dict[str, Any]) -> list[Device]:
    """What the DRA driver publishes for a node snapshot (``smoke --record``'s JSON)."""
    major, minor = (int(x) for x in snapshot["cuda_driver_version"].split("."))
    common = {
        "driverVersion": published(snapshot["driver_version"]),
        # getGpuInfo: fmt.Sprintf("%v.%v", v/1000, (v%1000)/10) of NVML's integer
        "cudaDriverVersion": published(f"{major}.{minor}"),
    }
    out = []
    for gpu in snapshot["gpus"]:
        attrs = common | {
            "productName": gpu["name"],
            "cudaComputeCapability": published(gpu["compute_capability"]),
        }
        if gpu.get("mig_mode"):
            for mig in gpu.get("mig_devices") or []:
                out.append(
                    Device(
                        f"gpu-{gpu['index']}-mig-{mig['index']}",
                        attrs
                        | {"type": "mig", "uuid": mig["uuid"], "parentUUID": gpu["uuid"]}
                        | {"profile": mig.get("profile") or ""},
                        {"memory": Quantity((mig.get("memory_total_mib") or 0) << 20)},
                    )
                )
            continue
        capacity = {}
        if gpu.get("memory_total_mib") is not None:
            capacity["memory"] = Quantity(gpu["memory_total_mib"] << 20)
        out.append(
            Device(f"gpu-{gpu['index']}", attrs | {"type": "gpu", "uuid": gpu["uuid"]}, capacity)
        )
    return out


def _cel(value: Any) -> Any:
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, dict):
        return celtypes.MapType({celtypes.StringType(k): _cel(v) for k, v in value.items()})
    return value  # Semver, Quantity: the library's own types


def matches(expression: str, device: Device) -> bool:
    """The selector's answer for the device; an evaluation error raises (it aborts the
    allocation: k8s.io/api resource/v1 ``CELDeviceSelector``)."""
    activation = {
        "device": _cel(
            {
                "driver": DOMAIN,
                "attributes": {DOMAIN: device.attributes},
                "capacity": {DOMAIN: device.capacity},
            }
        )
    }
    value = _program(expression).evaluate(activation)
    if not isinstance(value, celtypes.BoolType):
        raise AssertionError(f"{device.name}: the selector gave {value!r}, not a bool")
    return bool(value)


def selected(request: dict[str, Any], device: Device) -> bool:
    """A device a request (or subrequest) may be given: of its class (here only
    ``gpu.nvidia.com``) and every selector true."""
    if request["deviceClassName"] != DOMAIN or not matches(CLASS_SELECTOR, device):
        return False
    return all(matches(s["cel"]["expression"], device) for s in request.get("selectors", []))
