"""GPU Operator ``NVIDIADriver`` objects, one per pool (docs/drivers.md). Pure.

The GPU Operator runs one driver DaemonSet per ``NVIDIADriver`` object
(NVIDIA/gpu-operator ``api/nvidia/v1alpha1/nvidiadriver_types.go``, CRD
``deployments/gpu-operator/crds/nvidia.com_nvidiadrivers.yaml`` at v26.7.0, kept as
tests/fixtures/crds/nvidia.com_nvidiadrivers.yaml). What it takes from there:

- ``spec.default``, ``spec.driverType`` and ``spec.image`` are required; a per-pool
  object is not the default one, and a default one may not carry a ``nodeSelector``
  (the CRD's CEL rule and ``NVIDIADriver.ValidateNodeSelector``);
- the driver image is ``<repository>/<image>:<version>-<os>``
  (``NVIDIADriverSpec.GetImagePath``): ``version`` is the driver version itself;
- the operator refuses two objects whose ``nodeSelector`` picks the same node
  (``internal/validator/validator.go``): one object per value of the pool label
  ``gpu-pool`` never overlaps, since a node carries one value;
- the chart's defaults are ``repository: nvcr.io/nvidia``, ``image: driver``
  (``deployments/gpu-operator/values.yaml``, ``driver:``);
- the driver DaemonSet of an object tolerates ``nvidia.com/gpu`` and the object's own
  ``spec.tolerations``, nothing else (``manifests/state-driver/0500_daemonset.yaml``:
  the chart's ``daemonsets.tolerations`` do not reach it). A node joins tainted
  ``buildmatrix.io/unverified`` and ``smoke`` needs the driver before it can admit the
  node, so every object tolerates that taint; without it the pool's nodes never get a
  driver and stay tainted.

A version below the pool's floor (buildmatrix.drivers) is refused before any object
is written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from buildmatrix.drivers import PoolPolicy
from buildmatrix.errors import InputError
from buildmatrix.labelkeys import DRIVER_FLOOR, POOL, TAINT_EFFECT, TAINT_KEY

API_VERSION = "nvidia.com/v1alpha1"
KIND = "NVIDIADriver"
DEFAULT_REPOSITORY = "nvcr.io/nvidia"
DEFAULT_IMAGE = "driver"
# metadata.name of a cluster-scoped object: a DNS-1123 subdomain (Kubernetes
# apimachinery validation.IsDNS1123Subdomain).
_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True, kw_only=True)
class DriverImage:
    repository: str = DEFAULT_REPOSITORY
    image: str = DEFAULT_IMAGE
    driver_type: str = "gpu"


def object_name(pool: str) -> str:
    """The object's name: the pool label value in DNS-1123 form (``_`` to ``-``, lower)."""
    name = pool.lower().replace("_", "-").strip("-.")
    if not _DNS1123.fullmatch(name) or len(name) > 253:
        raise InputError(
            f"pool '{pool}' cannot name an NVIDIADriver object ('{name}' is not a DNS-1123 "
            "subdomain: lower-case letters, digits, '-' and '.'); rename the pool."
        )
    return name


def refuse_below_floor(policy: PoolPolicy) -> None:
    """A proposed version that ``check --snapshot`` would not admit on the pool."""
    if policy.proposed is None:
        return
    floor = policy.floor
    if floor.driver is None and not policy.models:
        return  # no GPU the profiles list falls in the pool: nothing to hold it to
    if floor.driver is None:
        raise InputError(
            f"pool '{policy.name}': no driver admits {floor.subject}: "
            + "; ".join(floor.why)
            + ". Fix the pool's images or products before choosing its driver."
        )
    if floor.driver is not None and policy.proposed < floor.driver:
        raise InputError(
            f"--driver {policy.name}={policy.proposed}: the pool needs driver >= "
            f"{floor.driver}, set by {floor.subject} (" + "; ".join(floor.why[:2]) + "). "
            f"Propose {floor.driver} or newer; 'buildmatrix drivers --driver "
            f"{policy.name}={policy.proposed}' shows what would break."
        )


def nvidia_driver(
    policy: PoolPolicy, image: DriverImage, taint_key: str = TAINT_KEY
) -> dict[str, Any]:
    """The ``NVIDIADriver`` object of one pool at its proposed driver, tolerating the
    admission taint ``taint_key`` (``--taint-key``)."""
    if policy.proposed is None:
        raise InputError(f"pool '{policy.name}': no --driver {policy.name}=VERSION given.")
    refuse_below_floor(policy)
    floor = policy.floor.driver
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": object_name(policy.name),
            "labels": {"app.kubernetes.io/managed-by": "buildmatrix"},
            "annotations": {
                "buildmatrix.io/pool": policy.name,
                DRIVER_FLOOR: str(floor or "none"),
                f"{DRIVER_FLOOR}-set-by": policy.floor.subject,
            },
        },
        "spec": {
            "default": False,
            "driverType": image.driver_type,
            "repository": image.repository,
            "image": image.image,
            "version": str(policy.proposed),
            "nodeSelector": {POOL: policy.name},
            "tolerations": [{"key": taint_key, "operator": "Exists", "effect": TAINT_EFFECT}],
        },
    }


def nvidia_drivers(
    policies: Sequence[PoolPolicy], image: DriverImage, taint_key: str = TAINT_KEY
) -> list[dict[str, Any]]:
    """One object per pool that has a proposed driver, in pool order."""
    return [nvidia_driver(p, image, taint_key) for p in policies if p.proposed is not None]
