"""The Kubernetes objects of node admission (``buildmatrix k8s manifests``). Pure.

- Namespace, ServiceAccount, a ClusterRole with ``get`` and ``patch`` on ``nodes``
  and nothing else, and its binding;
- a ValidatingAdmissionPolicy and binding that narrow ``patch`` to the agent's own
  node, the labels buildmatrix owns and the admission taint (k8s_policy.py);
- a ConfigMap with the pools file;
- the admission DaemonSet (k8s_daemonset.py, with the Settings all are rendered
  from): on every NVIDIA GPU node (NFD's PCI labels, the GPU
  Operator's ``nvidia.com/gpu.present``, or a label the provisioner sets at join:
  ``node_selectors``), tolerating the admission taint and ``nvidia.com/gpu``, it runs
  ``smoke --apply`` now and every ``interval`` seconds, so a GPU that degrades later is
  tainted again. NVML and the driver come from the NVIDIA container toolkit (runtime
  class ``nvidia``, ``NVIDIA_VISIBLE_DEVICES=all``, capability ``utility``; ``compute``
  too with the load test); it requests no GPU;
- only where asked: the ``nvidia`` RuntimeClass (clusters with a host-installed
  toolkit; the GPU Operator creates its own), and an example FP8 training Job whose
  node affinity is what ``buildmatrix affinity --require fp8 --min-memory 70000`` gives
  for a CUDA 13 image with code for every FP8 GPU (driver terms included).

Nodes must join with the taint already set (kubelet ``--register-with-taints``,
Karpenter ``startupTaints``, cluster-autoscaler startup taints): that is what makes
the admission real (docs/kubernetes.md).
"""

from __future__ import annotations

import re
from typing import Any

from buildmatrix.cuda import CudaFacts
from buildmatrix.k8s_daemonset import APP, PRIORITY_CLASS, RUNTIME_CLASS, Settings, daemonset
from buildmatrix.k8s_nfd import node_feature_rule
from buildmatrix.k8s_policy import policy_objects
from buildmatrix.profiles import ProfileSet

# Pods of PRIORITY_CLASS the namespace's quota admits: one per node; above the largest
# cluster size any provider documents (GKE: 65,000 nodes).
CRITICAL_PODS = "100000"
# A Secret's name (apimachinery validation.IsDNS1123Subdomain): at most 253 characters.
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)


_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")


def is_dns_label(name: str) -> bool:
    """A Namespace's name (apimachinery validation.IsDNS1123Label): at most 63."""
    return len(name) <= 63 and _DNS_LABEL.fullmatch(name) is not None


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name) is not None


def default_pools(profiles: ProfileSet) -> str:
    families = sorted({p.family.value for p in profiles})
    return "families:\n" + "".join(f"  {f}: {f}\n" for f in families)


def render(
    settings: Settings, profiles: ProfileSet, facts: CudaFacts | None = None
) -> list[dict[str, Any]]:
    """The objects in apply order; ``facts`` (the CUDA table) only for the example Job."""
    ns = settings.namespace
    labels = {"app.kubernetes.io/name": APP, "app.kubernetes.io/part-of": "buildmatrix"}
    meta = {"name": APP, "namespace": ns, "labels": labels}
    if settings.mode == "nfd":  # no ServiceAccount rights, no policy: k8s_nfd.py
        objects: list[dict[str, Any]] = [
            _namespace(settings, labels),
            _critical_pods_quota(ns, labels),
            node_feature_rule(name=APP, labels=labels, taint_key=settings.taint_key),
            _pools_config(settings, profiles, ns, labels),
        ]
    else:
        objects = _apply_objects(settings, profiles, meta, labels)
    if settings.runtime_class:
        objects.append(runtime_class(labels))
    objects.append(daemonset(settings, meta, labels))
    if settings.example_job:
        # only here: the Job's affinity is check's and affinity's work, which the
        # admission manifests alone do not need
        from buildmatrix.k8s_example import example_job

        if facts is None:
            raise ValueError("the example Job needs the CUDA facts")
        objects.append(example_job(profiles, ns, facts))
    return objects


def _namespace(settings: Settings, labels: dict[str, str]) -> dict[str, Any]:
    """The Namespace. A hostPath volume (--mode nfd's feature folder, --containerd's
    stores) or an added capability (SYS_ADMIN for MIG monitoring, --mig-strategy) is
    refused by the Pod Security Standards' baseline level, which clusters often
    enforce by default: such a namespace is labelled privileged, as the GPU Operator
    labels its own (controllers/state_manager.go, setPodSecurityLabelsForNamespace)."""
    meta: dict[str, Any] = {"name": settings.namespace, "labels": dict(labels)}
    if (
        settings.mode == "nfd"
        or settings.mig_strategy is not None
        or settings.containerd
        or settings.device_request == "volume-mounts"  # a hostPath volume: /dev/null
    ):
        meta["labels"]["pod-security.kubernetes.io/enforce"] = "privileged"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def _critical_pods_quota(ns: str, labels: dict[str, str]) -> dict[str, Any]:
    """The ResourceQuota that lets the DaemonSet's Pods, of the ``system-node-critical``
    class, be created outside ``kube-system`` where the cluster limits that class to
    namespaces holding a quota that covers it, as GKE Standard does (the ResourceQuota
    admission plugin's ``limitedResources``; Kubernetes "Resource Quotas", "Limit
    Priority Class consumption by default"): without it the DaemonSet controller's
    creates fail and every node that joins tainted stays so. Elsewhere it limits
    nothing: one Pod per node, and the ceiling is above any cluster's node count."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": f"{APP}-critical-pods", "namespace": ns, "labels": labels},
        "spec": {
            "hard": {"pods": CRITICAL_PODS},
            "scopeSelector": {
                "matchExpressions": [
                    {"scopeName": "PriorityClass", "operator": "In", "values": [PRIORITY_CLASS]}
                ]
            },
        },
    }


def _apply_objects(
    settings: Settings, profiles: ProfileSet, meta: dict[str, Any], labels: dict[str, str]
) -> list[dict[str, Any]]:
    """Mode apply: the ServiceAccount, its node rights, the policy narrowing them."""
    ns = settings.namespace
    return [
        _namespace(settings, labels),
        _critical_pods_quota(ns, labels),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": APP, "labels": labels},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": APP, "labels": labels},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": APP,
            },
            "subjects": [{"kind": "ServiceAccount", "name": APP, "namespace": ns}],
        },
        *(
            policy_objects(
                name=APP,
                namespace=ns,
                service_account=APP,
                gfd_keys=settings.gfd_keys,
                labels=labels,
                taint_key=settings.taint_key,
            )
            if settings.node_policy
            else []
        ),
        _pools_config(settings, profiles, ns, labels),
    ]


def runtime_class(labels: dict[str, str]) -> dict[str, Any]:
    """The RuntimeClass the DaemonSet names: handler ``nvidia``, the runtime that
    ``nvidia-ctk runtime configure`` adds to containerd/CRI-O. The GPU Operator creates
    its own (assets/pre-requisites/0200_runtime_class.yaml), so this is only for
    clusters whose toolkit is installed on the hosts."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": RUNTIME_CLASS, "labels": labels},
        "handler": RUNTIME_CLASS,
    }


def _pools_config(
    settings: Settings, profiles: ProfileSet, ns: str, labels: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{APP}-pools", "namespace": ns, "labels": labels},
        "data": {"pools.yaml": settings.pools or default_pools(profiles)},
    }
