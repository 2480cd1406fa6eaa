"""Whether the image's ``Env`` leaves its processes a GPU, as the NVIDIA container
toolkit and the CUDA driver read it. Pure.

Read as the toolkit's legacy hook reads it (nvidia-container-runtime-hook, which
``docker run --gpus`` and a runtime in ``legacy`` mode run; nvidia-container-toolkit
``cmd/nvidia-container-runtime-hook/container_config.go``, ``internal/config/image/``):

- ``NVIDIA_VISIBLE_DEVICES`` (``CUDA.devicesFromEnvvars``, ``NewVisibleDevices``):
  ``void``, empty, or unset in an image that is no legacy CUDA image, is "not a GPU
  container" (the hook does nothing: no device, no driver library); ``none`` mounts
  the driver but no GPU. A value the runtime sets for the container replaces the
  image's (``docker run --gpus``, the Kubernetes device plugin's ``envvar``
  strategy), so only ``void``, ``none`` and an empty value written in the image are
  findings: an unset one is what such runtimes fill in.
- ``NVIDIA_DRIVER_CAPABILITIES`` (``getDriverCapabilities``): unset, ``utility,compute``
  (every capability for a legacy image); set and empty, the same; otherwise its
  comma list, where ``all`` is every one and a name the toolkit does not support
  makes the hook panic (the container does not start). Without ``compute`` no
  libcuda is mounted: nothing runs.
- ``NVIDIA_REQUIRE_*`` and ``NVIDIA_DISABLE_REQUIRE``: buildmatrix.toolkit_require.

The nvidia runtime's ``cdi`` and ``jit-cdi`` modes (jit-cdi is its default from
toolkit 1.18) inject every driver library and check no requirement; buildmatrix
judges by the legacy hook, the stricter reading (fail closed), and says so.

``CUDA_VISIBLE_DEVICES`` is read by the CUDA driver in every process (CUDA C++
Programming Guide, "CUDA Environment Variables"): a comma-separated list of GPU
indices or UUIDs; "If one of the indices is invalid, only the devices whose index
precedes the invalid index are visible". So a first entry that is no device (``-1``,
``none``, an empty value) hides every GPU, and one that names a device the container
may not have (an index above 0, a UUID) hides it wherever that device is missing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from packaging.version import Version

from buildmatrix.cuda import CudaFacts, DriverVersion
from buildmatrix.target_verdict import TargetResult
from buildmatrix.toolkit_require import Known, evaluate, requirements
from buildmatrix.verdict import Verdict

_SUPPORTED = frozenset({"compute", "compat32", "graphics", "utility", "video", "display", "ngx"})
_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z-]+(?:/\d+/\d+)?")
_LEGACY_HOOK = "the NVIDIA container toolkit's legacy hook (docker run --gpus)"
# The brand libnvidia-container evaluates ``brand=`` with, by the NVML brand
# (``src/driver.c``: ``driver_get_device_brand_1_svc``); every other brand it reports
# as "Unknown" in that version, and a newer one may name more, so those are taken as
# not known (each value is tried).
_BRANDS = {0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "GRID", 5: "GeForce", 6: "TITAN"}


@dataclass(frozen=True, kw_only=True)
class EnvFinding:
    """Why the image's processes get no usable GPU on one target (``refusals``), and
    what may refuse it on a driver or GPU not known (``maybe``)."""

    refusals: tuple[str, ...] = ()
    maybe: tuple[str, ...] = ()


def _legacy(env: Mapping[str, str]) -> bool:
    """CUDA.IsLegacy: CUDA_VERSION set and NVIDIA_REQUIRE_CUDA unset or empty."""
    return bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")


def visible_devices(env: Mapping[str, str]) -> str | None:
    """Why ``NVIDIA_VISIBLE_DEVICES`` as the image sets it gives no GPU (None: it does)."""
    if "NVIDIA_VISIBLE_DEVICES" not in env:
        return None  # the runtime's request fills it in (--gpus, the device plugin)
    value = env["NVIDIA_VISIBLE_DEVICES"]
    devices = [d.strip() for d in value.split(",") if d.strip()]
    if devices and "void" not in devices:
        for d in devices:  # NewVisibleDevices: the first of all and none decides
            if d == "all":
                return None
            if d == "none":
                return (
                    f"the image's Env sets NVIDIA_VISIBLE_DEVICES={value}: {_LEGACY_HOOK} "
                    "mounts the driver but no GPU (a value the runtime sets replaces it)"
                )
        return None
    return (
        f"the image's Env sets NVIDIA_VISIBLE_DEVICES={value!r}: to {_LEGACY_HOOK} that is no "
        "GPU container, which gets no GPU and no driver (a value the runtime sets replaces it)"
    )


def capabilities(env: Mapping[str, str]) -> str | None:
    """Why ``NVIDIA_DRIVER_CAPABILITIES`` leaves the container without libcuda."""
    value = env.get("NVIDIA_DRIVER_CAPABILITIES")
    if value is None or value == "":
        return None  # utility,compute; every capability for a legacy image
    names = {c.strip() for c in value.split(",") if c.strip()}
    if "all" in names:
        return None
    what = f"the image's Env sets NVIDIA_DRIVER_CAPABILITIES={value}"
    unsupported = sorted(names - _SUPPORTED)
    if unsupported:
        return (
            f"{what}: {_LEGACY_HOOK} refuses to start the container ('unsupported "
            f"capabilities found': {', '.join(unsupported)})"
        )
    if "compute" not in names:
        return (
            f"{what}, without compute: {_LEGACY_HOOK} mounts no libcuda, so no CUDA code runs "
            "(the nvidia runtime's CDI modes mount it all the same)"
        )
    return None


def cuda_visible(env: Mapping[str, str]) -> str | None:
    """Why ``CUDA_VISIBLE_DEVICES`` hides the GPU from every process of the image."""
    if "CUDA_VISIBLE_DEVICES" not in env:
        return None
    value = env["CUDA_VISIBLE_DEVICES"]
    first = value.split(",", 1)[0].strip()
    what = f"the image's Env sets CUDA_VISIBLE_DEVICES={value!r}"
    if first.isdigit() and int(first) == 0:
        return None
    if first.isdigit():
        return (
            f"{what}: device {int(first)} is visible only where the container has more than "
            f"{int(first)} GPU (a Pod given one GPU sees it as device 0); every GPU is hidden "
            "elsewhere (fail closed)"
        )
    if _UUID.fullmatch(first):
        return f"{what}: only that one GPU is visible, and no other GPU (fail closed)"
    return (
        f"{what}: its first entry is no device, so the CUDA driver hides every GPU (CUDA "
        "Programming Guide, CUDA Environment Variables)"
    )


def env_finding(env: Mapping[str, str], known: Known) -> EnvFinding:
    """Everything the image's Env does to the GPU of one target (``known``)."""
    refusals = [why for why in (visible_devices(env), capabilities(env), cuda_visible(env)) if why]
    reqs, broken = requirements(env)
    maybe: list[str] = []
    if broken is not None:
        refusals.append(f"{_LEGACY_HOOK} refuses to start the container: {broken}")
    elif reqs:
        outcome = evaluate(reqs, known)
        if outcome.refused is not None:
            refusals.append(
                f"{_LEGACY_HOOK} refuses to start the container on this GPU and driver: "
                f"requirement error: {outcome.refused} (NVIDIA_DISABLE_REQUIRE=true turns the "
                "check off)"
            )
        elif outcome.maybe is not None and known.driver is not None and not outcome.by_brand:
            refusals.append(
                f"{_LEGACY_HOOK} refuses to start the container on this driver unless its "
                "exact CUDA version, which buildmatrix is not told, allows it (fail closed): "
                f"requirement error: {outcome.maybe}"
            )
        elif outcome.maybe is not None and known.driver is not None:
            maybe.append(
                f"{_LEGACY_HOOK} refuses to start the container on this driver for GPUs of "
                f"some brands: requirement error: {outcome.maybe}; a node snapshot (check "
                "--snapshot) names the brand"
            )
        elif outcome.maybe is not None:
            maybe.append(
                f"{_LEGACY_HOOK} refuses to start the container on some drivers: requirement "
                f"error: {outcome.maybe}; pass --driver or --snapshot to judge it"
            )
    return EnvFinding(refusals=tuple(refusals), maybe=tuple(maybe))


def gate(
    results: Sequence[TargetResult],
    env: Mapping[str, str],
    *,
    driver: DriverVersion | None,
    driver_cuda: Version | None,
    facts: CudaFacts,
) -> tuple[list[TargetResult], list[str]]:
    """``results`` with every target the image's Env leaves without a GPU failed (its
    reasons first), and the warnings of what a driver not given may refuse."""
    cuda, at_least = driver_cuda, None
    if cuda is None and driver is not None:
        # the release of the newest toolkit driver at or below it: exact up to the
        # newest release that names its driver, a lower bound above that
        cuda = facts.driver_cuda(driver)
        newest = max((tk.driver for tk in facts.toolkits if tk.driver is not None), default=None)
        if cuda is not None and newest is not None and driver > newest:
            cuda, at_least = None, cuda
    gated: list[TargetResult] = []
    warnings: list[str] = []
    for r in results:
        known = Known(
            cuda=f"{cuda.major}.{cuda.minor}" if cuda is not None else None,
            driver=driver.text if driver is not None else None,
            arch=str(r.target.cc),
            brand=_BRANDS.get(r.target.brand) if r.target.brand is not None else None,
            cuda_at_least=f"{at_least.major}.{at_least.minor}" if at_least is not None else None,
        )
        found = env_finding(env, known)
        warnings += [w for w in found.maybe if w not in warnings]
        gated.append(
            replace(
                r,
                verdict=Verdict.NONE,
                reasons=(*found.refusals, *r.reasons),
                code_failures=(*found.refusals, *r.code_failures),
            )
            if found.refusals
            else r
        )
    return gated, warnings
