"""Helm values that let the GPU stack run on a node still held by the admission taint. Pure.

``smoke`` needs the driver and the ``nvidia`` runtime handler on the node, and the
DaemonSet's default node selection needs node-feature-discovery's PCI label. On a node
that joined with ``buildmatrix.io/unverified:NoSchedule``, none of that comes unless the
components that bring it tolerate the taint, and by default they do not:

- GPU Operator chart (NVIDIA/gpu-operator ``deployments/gpu-operator/values.yaml``,
  v26.7.0): ``daemonsets.tolerations`` is copied into the ClusterPolicy and set on every
  operand DaemonSet (driver, container toolkit, device plugin, GFD, DCGM, validator...;
  ``controllers/object_controls.go`` ``applyCommonDaemonsetConfig``), default only
  ``nvidia.com/gpu``; the bundled NFD chart's ``node-feature-discovery.worker.tolerations``
  default ``node-role.kubernetes.io/control-plane`` and ``nvidia.com/gpu``.
- NFD chart (kubernetes-sigs/node-feature-discovery
  ``deployment/helm/node-feature-discovery/values.yaml``, v0.19.0):
  ``worker.tolerations: []``; ``master.enableTaints: false`` (NodeFeatureRule taints,
  which ``k8s manifests --mode nfd`` needs, are off by default).

A Helm values list replaces the chart's list whole (maps merge key by key, lists do
not), so each overlay repeats the chart's default tolerations and adds the admission
taint's. Tests: tests/test_scheduling.py applies these overlays to the charts' defaults
(tests/fixtures/charts/) and walks a node from join to admission.
"""

from __future__ import annotations

from typing import Any

from buildmatrix.labelkeys import TAINT_EFFECT, TAINT_KEY

ADMISSION_TOLERATION: dict[str, str] = {
    "key": TAINT_KEY,
    "operator": "Exists",
    "effect": TAINT_EFFECT,
}
GPU_TOLERATION: dict[str, str] = {
    "key": "nvidia.com/gpu",
    "operator": "Exists",
    "effect": "NoSchedule",
}
CONTROL_PLANE_TOLERATION: dict[str, str] = {
    "key": "node-role.kubernetes.io/control-plane",
    "operator": "Equal",
    "value": "",
    "effect": "NoSchedule",
}

# The charts' defaults that each overlay keeps (see the module docstring for where).
GPU_OPERATOR_DAEMONSETS_DEFAULT = (GPU_TOLERATION,)
GPU_OPERATOR_NFD_WORKER_DEFAULT = (CONTROL_PLANE_TOLERATION, GPU_TOLERATION)
# The NFD chart's own default is []: the overlay adds nvidia.com/gpu as well, because
# GPU node pools are often tainted with it (which the GPU Operator's defaults tolerate
# for the same reason) and NFD must label those nodes too.
NFD_WORKER_DEFAULT = (GPU_TOLERATION,)


def _with_admission(defaults: tuple[dict[str, str], ...], taint_key: str) -> list[dict[str, str]]:
    return [dict(t) for t in defaults] + [{**ADMISSION_TOLERATION, "key": taint_key}]


def _nfd(
    worker_default: tuple[dict[str, str], ...], *, taints: bool, taint_key: str
) -> dict[str, Any]:
    tolerations = _with_admission(worker_default, taint_key)
    values: dict[str, Any] = {"worker": {"tolerations": tolerations}}
    if taints:  # k8s manifests --mode nfd: the master sets taints from NodeFeatureRules
        values["master"] = {"enableTaints": True}
    return values


def gpu_operator_values(*, nfd_taints: bool = False, taint_key: str = TAINT_KEY) -> dict[str, Any]:
    """Values for ``helm install/upgrade gpu-operator nvidia/gpu-operator -f FILE``;
    ``nfd_taints`` for ``k8s manifests --mode nfd``, whose taint NFD's master sets;
    ``taint_key``: the admission taint's (``--taint-key``)."""
    return {
        "daemonsets": {"tolerations": _with_admission(GPU_OPERATOR_DAEMONSETS_DEFAULT, taint_key)},
        "node-feature-discovery": _nfd(
            GPU_OPERATOR_NFD_WORKER_DEFAULT, taints=nfd_taints, taint_key=taint_key
        ),
    }


def nfd_values(*, nfd_taints: bool = False, taint_key: str = TAINT_KEY) -> dict[str, Any]:
    """Values for a standalone ``node-feature-discovery`` chart (``-f FILE``)."""
    return _nfd(NFD_WORKER_DEFAULT, taints=nfd_taints, taint_key=taint_key)


GPU_OPERATOR_NOTE = """\
Helm values for the NVIDIA GPU Operator chart: every operand DaemonSet (driver,
container toolkit, device plugin, GFD, DCGM, validator) and the bundled NFD worker
tolerate the admission taint {taint_key}:NoSchedule, so a node that joins
tainted gets its driver, its nvidia runtime handler and its labels, and smoke can run.
  helm upgrade --install gpu-operator nvidia/gpu-operator -n gpu-operator -f THIS_FILE
A values list replaces the chart's list: the chart's default tolerations are repeated
here; merge any tolerations of your own into these lists. With the NVIDIADriver CRD
(driver.nvidiaDriverCRD.enabled) the driver's tolerations are the NVIDIADriver's
spec.tolerations: add the same toleration there."""

NFD_NOTE = """\
Helm values for the node-feature-discovery chart: its worker tolerates the admission
taint {taint_key}:NoSchedule (and nvidia.com/gpu), so a node that joins
tainted gets its PCI labels and the admission DaemonSet is scheduled there.
  helm upgrade --install nfd nfd/node-feature-discovery -n node-feature-discovery -f THIS_FILE
A values list replaces the chart's list: merge any tolerations of your own into it."""

NFD_TAINTS_NOTE = """
--mode nfd: NFD's master sets and removes the admission taint from buildmatrix's
NodeFeatureRule, which needs master.enableTaints (nfd-master -enable-taints)."""
