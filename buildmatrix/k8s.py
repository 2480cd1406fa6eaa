"""The Kubernetes objects of node admission (``buildmatrix k8s manifests``). Pure.

- Namespace, ServiceAccount, a ClusterRole with ``get`` and ``patch`` on ``nodes``
  and nothing else, and its binding;
- a ConfigMap with the pools file;
- the admission DaemonSet: on every NVIDIA GPU node (NFD's PCI vendor label or
  GFD's ``nvidia.com/gpu.present``), tolerating the admission taint and
  ``nvidia.com/gpu``, it runs ``smoke --apply`` now and every ``interval`` seconds,
  so a GPU that degrades later is tainted again. NVML and the driver come from the
  NVIDIA container toolkit (runtime class ``nvidia``, ``NVIDIA_VISIBLE_DEVICES=all``,
  capability ``utility``; ``compute`` too with the load test); it requests no GPU;
- an example FP8 training Job whose node affinity is what ``buildmatrix affinity
  --require fp8 --min-memory 70000`` gives for code that runs on every FP8 GPU.

Nodes must join with the taint already set (kubelet ``--register-with-taints``,
Karpenter ``startupTaints``, cluster-autoscaler startup taints): that is what makes
the admission real (docs/kubernetes.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from buildmatrix.affinity import FAMILY, MEMORY, affinity_block
from buildmatrix.node.apply import TAINT_EFFECT, TAINT_KEY
from buildmatrix.profiles import ProfileSet

APP = "buildmatrix-smoke"
GPU_NODE_LABELS = (
    ("feature.node.kubernetes.io/pci-10de.present", "true"),  # NFD: an NVIDIA PCI device
    ("nvidia.com/gpu.present", "true"),  # GPU Feature Discovery / the GPU Operator
)
POOLS_PATH = "/etc/buildmatrix/pools.yaml"
# The registry Secret's .dockerconfigjson, mounted as config.json in the folder
# $DOCKER_CONFIG names: where the Docker CLI, and buildmatrix, read credentials.
REGISTRY_CONFIG_DIR = "/var/run/secrets/buildmatrix.io/registry"
# A Secret's name (apimachinery validation.IsDNS1123Subdomain): at most 253 characters.
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)


@dataclass(frozen=True, kw_only=True)
class Settings:
    image: str
    namespace: str = "buildmatrix"
    interval: int = 600
    load_test: bool = False
    pools: str | None = None  # the pools file's text; None: every family its own pool
    registry_secret: str | None = None  # a kubernetes.io/dockerconfigjson Secret's name


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name) is not None


def default_pools(profiles: ProfileSet) -> str:
    families = sorted({p.family.value for p in profiles})
    return "families:\n" + "".join(f"  {f}: {f}\n" for f in families)


def render(settings: Settings, profiles: ProfileSet) -> list[dict[str, Any]]:
    ns = settings.namespace
    labels = {"app.kubernetes.io/name": APP, "app.kubernetes.io/part-of": "buildmatrix"}
    meta = {"name": APP, "namespace": ns, "labels": labels}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}},
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
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{APP}-pools", "namespace": ns, "labels": labels},
            "data": {"pools.yaml": settings.pools or default_pools(profiles)},
        },
        _daemonset(settings, meta, labels),
        _example_job(profiles, ns),
    ]


def _daemonset(settings: Settings, meta: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    smoke = f"buildmatrix smoke --apply --pools {POOLS_PATH}"
    if settings.load_test:
        smoke += " --load-test"
    # A failed check is exit 1 and leaves the node tainted; the loop goes on so that
    # a node that is repaired is admitted at the next round without a restart.
    script = f"while true; do {smoke}; sleep {settings.interval}; done"
    capabilities = "utility,compute" if settings.load_test else "utility"
    gpu = {  # any NVIDIA GPU node: terms are ORed
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]}
            for k, v in GPU_NODE_LABELS
        ]
    }
    mounts = [
        {"name": "pools", "mountPath": "/etc/buildmatrix", "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "pools", "configMap": {"name": f"{APP}-pools"}},
        {"name": "tmp", "emptyDir": {}},  # load-test files; the root is read-only
    ]
    env: list[dict[str, Any]] = []
    if settings.registry_secret is not None:
        # Not optional: without its Secret the Pod does not start and the node stays
        # tainted, rather than smoke running without the credentials the pools need.
        mounts.append({"name": "registry", "mountPath": REGISTRY_CONFIG_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "registry",
                "secret": {
                    "secretName": settings.registry_secret,
                    "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
                },
            }
        )
        env.append({"name": "DOCKER_CONFIG", "value": REGISTRY_CONFIG_DIR})
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": APP}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": APP,
                    "runtimeClassName": "nvidia",
                    "priorityClassName": "system-node-critical",
                    "affinity": {
                        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": gpu}
                    },
                    "tolerations": [
                        {"key": TAINT_KEY, "operator": "Exists", "effect": TAINT_EFFECT},
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    ],
                    "containers": [
                        {
                            "name": "smoke",
                            "image": settings.image,
                            "command": ["/bin/sh", "-c", script],
                            "env": [
                                {
                                    "name": "NODE_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                                },
                                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": capabilities},
                                *env,
                            ],
                            "volumeMounts": mounts,
                            "resources": {
                                "requests": {"cpu": "50m", "memory": "128Mi"},
                                "limits": {"memory": "512Mi"},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }


def _example_job(profiles: ProfileSet, ns: str) -> dict[str, Any]:
    """FP8 training on GPUs with >= 70000 MiB: the families whose every profile has
    FP8 (as affinity gives for an image with code for all of them)."""
    families = sorted(
        f
        for f in {p.family.value for p in profiles}
        if all("fp8" in p.features for p in profiles.family(f))
    )
    exprs = [
        {"key": FAMILY, "operator": "In", "values": families},
        {"key": MEMORY, "operator": "Gt", "values": ["69999"]},
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "example-fp8-training", "namespace": ns},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    **affinity_block(exprs),
                    "containers": [
                        {
                            "name": "train",
                            "image": "registry.example.com/ml/train-fp8:1.4.0-cu133",
                            "resources": {"limits": {"nvidia.com/gpu": 1}},
                        }
                    ],
                }
            },
        },
    }
