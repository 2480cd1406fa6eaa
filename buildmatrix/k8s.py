"""The Kubernetes objects of node admission (``buildmatrix k8s manifests``). Pure.

- Namespace, ServiceAccount, a ClusterRole with ``get`` and ``patch`` on ``nodes``
  and nothing else, and its binding;
- a ValidatingAdmissionPolicy and binding that narrow ``patch`` to the agent's own
  node, the labels buildmatrix owns and the admission taint (k8s_policy.py);
- a ConfigMap with the pools file;
- the admission DaemonSet: on every NVIDIA GPU node (NFD's PCI labels, the GPU
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
from dataclasses import dataclass
from typing import Any

from buildmatrix.cuda import CudaFacts
from buildmatrix.k8s_nfd import FEATURE_FILE, nfd_pod, node_feature_rule
from buildmatrix.k8s_nodes import SelectorTerm
from buildmatrix.k8s_policy import policy_objects
from buildmatrix.labelkeys import TAINT_EFFECT, TAINT_KEY, GfdKeys
from buildmatrix.profiles import ProfileSet

APP = "buildmatrix-smoke"
# NFD's PCI label for an NVIDIA device is named after the worker's deviceLabelFields
# (node-feature-discovery source/pci/pci.go GetLabels): "vendor" alone, as the GPU
# Operator's chart configures it, gives pci-10de; NFD's default "class", "vendor" gives
# pci-0302_10de (3D controller: A100, H100...) or pci-0300_10de (VGA: L40S, A40...). The
# same three as the GPU Operator's gpuNodeLabels (controllers/state_manager.go), which
# sets nvidia.com/gpu.present from them (controllers/nodelabeling_controller.go
# reconcileCommonGPULabel).
GPU_NODE_LABELS = (
    ("feature.node.kubernetes.io/pci-10de.present", "true"),
    ("feature.node.kubernetes.io/pci-0302_10de.present", "true"),
    ("feature.node.kubernetes.io/pci-0300_10de.present", "true"),
    ("nvidia.com/gpu.present", "true"),
)
RUNTIME_CLASS = "nvidia"
POOLS_PATH = "/etc/buildmatrix/pools.yaml"
# The registry Secret's .dockerconfigjson, mounted as config.json in the folder
# $DOCKER_CONFIG names: where the Docker CLI, and buildmatrix, read credentials.
REGISTRY_CONFIG_DIR = "/var/run/secrets/buildmatrix.io/registry"
CONTAINERD_ROOT = "/var/lib/containerd"  # containerd's default root (defaults/defaults_unix.go)
PRIORITY_CLASS = "system-node-critical"  # the DaemonSet's Pods, as the GPU Operator's
# Pods of PRIORITY_CLASS the namespace's quota admits: one per node; above the largest
# cluster size any provider documents (GKE: 65,000 nodes).
CRITICAL_PODS = "100000"
# A Secret's name (apimachinery validation.IsDNS1123Subdomain): at most 253 characters.
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)


@dataclass(frozen=True, kw_only=True)
class Settings:
    image: str
    namespace: str = "buildmatrix"
    interval: int = 600
    deadline: int = 3600  # smoke --deadline: a round that hangs marks the node failed
    load_test: bool = False
    pools: str | None = None  # the pools file's text; None: every family its own pool
    registry_secret: str | None = None  # a kubernetes.io/dockerconfigjson Secret's name
    node_selectors: tuple[SelectorTerm, ...] = ()  # ORed with GPU_NODE_LABELS
    runtime_class: bool = False  # ship the nvidia RuntimeClass
    example_job: bool = False
    # The ValidatingAdmissionPolicy that confines the agent to its node and keys
    # (k8s_policy.py); off only for clusters older than Kubernetes 1.30.
    node_policy: bool = True
    # apply: the agent patches its Node (RBAC + policy); nfd: it writes an NFD feature
    # file and NFD labels and untaints (k8s_nfd.py); the agent has no API rights.
    mode: str = "apply"
    gfd_keys: GfdKeys = GfdKeys.AUTO  # smoke --gfd-keys, and what the policy allows
    mig_strategy: str | None = None  # a cluster with MIG GPUs: GFD's strategy (grants monitoring)
    containerd: bool = False  # mount the node's containerd stores for containerd: REFs


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
            node_feature_rule(name=APP, labels=labels),
            _pools_config(settings, profiles, ns, labels),
        ]
    else:
        objects = _apply_objects(settings, profiles, meta, labels)
    if settings.runtime_class:
        objects.append(runtime_class(labels))
    objects.append(_daemonset(settings, meta, labels))
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
    if settings.mode == "nfd" or settings.mig_strategy is not None or settings.containerd:
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


def node_selector_terms(selectors: tuple[SelectorTerm, ...]) -> list[dict[str, Any]]:
    """The DaemonSet's nodeSelectorTerms: one per GPU label, one per provisioner
    selector (its labels ANDed); terms are ORed."""
    terms = [[(k, v)] for k, v in GPU_NODE_LABELS] + [list(s.labels) for s in selectors]
    return [
        {"matchExpressions": [{"key": k, "operator": "In", "values": [v]} for k, v in term]}
        for term in terms
    ]


def _pools_config(
    settings: Settings, profiles: ProfileSet, ns: str, labels: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{APP}-pools", "namespace": ns, "labels": labels},
        "data": {"pools.yaml": settings.pools or default_pools(profiles)},
    }


def _daemonset(settings: Settings, meta: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    gpu = {"nodeSelectorTerms": node_selector_terms(settings.node_selectors)}
    mounts, volumes, env = _volumes(settings)
    daemonset: dict[str, Any] = {
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
                    "runtimeClassName": RUNTIME_CLASS,
                    "priorityClassName": PRIORITY_CLASS,
                    "affinity": {
                        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": gpu}
                    },
                    "tolerations": [
                        {"key": TAINT_KEY, "operator": "Exists", "effect": TAINT_EFFECT},
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    ],
                    "containers": [_smoke_container(settings, mounts, env)],
                    "volumes": volumes,
                },
            },
        },
    }

    if settings.mode == "nfd":
        template = daemonset["spec"]["template"]
        template["spec"] = nfd_pod(template["spec"])
    return daemonset


def _smoke_script(settings: Settings) -> str:
    """The container's shell loop: smoke as the settings ask, every interval."""
    if settings.mode == "nfd":
        where = f"buildmatrix smoke --nfd-file {FEATURE_FILE}"
    else:
        where = "buildmatrix smoke --apply"
    smoke = f"{where} --pools {POOLS_PATH} --deadline {settings.deadline}"
    gfd_keys = settings.gfd_keys
    if settings.mode == "nfd" and gfd_keys is GfdKeys.AUTO:
        # Without a Node to read, auto cannot see GFD's timestamp and would write its
        # keys: a second NodeFeature with GFD's keys, whose values nfd-master merges by
        # object name (node-feature-discovery nfd-master getAndMergeNodeFeatures), so a
        # node's -SHARED product could be replaced. GFD's keys stay GFD's here.
        gfd_keys = GfdKeys.NEVER
    if gfd_keys is not GfdKeys.AUTO:
        smoke += f" --gfd-keys {gfd_keys.value}"
        where += f" --gfd-keys {gfd_keys.value}"
    if settings.load_test:
        smoke += " --load-test"
    if settings.containerd:  # the pools' images as the node holds them, when it does
        smoke += " --prefer-containerd"
    if settings.mig_strategy is not None:
        smoke += f" --mig-strategy {settings.mig_strategy}"
    # A failed check is exit 1 and leaves the node tainted; the loop goes on so that
    # a node that is repaired is admitted at the next round without a restart. A round
    # killed by a signal (the OOM killer's SIGKILL: exit 128 + 9) wrote nothing, so
    # the failure mark is written then by a run that reads nothing (--mark-failed).
    mark = f'{where} --mark-failed "the round was killed by signal $((rc - 128))"'
    return (
        f"while true; do {smoke}; rc=$?; "
        f'if [ "$rc" -gt 128 ]; then {mark}; fi; sleep {settings.interval}; done'
    )


def _volumes(
    settings: Settings,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The smoke container's mounts, the Pod's volumes and the environment they need."""
    mounts: list[dict[str, Any]] = [
        {"name": "pools", "mountPath": "/etc/buildmatrix", "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "pools", "configMap": {"name": f"{APP}-pools"}},
        {"name": "tmp", "emptyDir": {}},  # load-test files; the root is read-only
    ]
    env: list[dict[str, Any]] = []
    if settings.containerd:
        _mount_containerd(mounts, volumes, env)
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
    return mounts, volumes, env


def _smoke_container(
    settings: Settings, mounts: list[dict[str, Any]], env: list[dict[str, Any]]
) -> dict[str, Any]:
    """The one container of the DaemonSet's Pod: smoke's loop with the GPU's tools."""
    script = _smoke_script(settings)
    capabilities = "utility,compute" if settings.load_test else "utility"
    return {
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
            *_mig_monitoring(settings).get("env", []),
        ],
        "volumeMounts": mounts,
        "resources": {
            "requests": {"cpu": "50m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        },
        "securityContext": _mig_monitoring(settings).get(
            "securityContext",
            {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
        ),
    }


def _mig_monitoring(settings: Settings) -> dict[str, Any]:
    """What reading a MIG-enabled GPU needs: NVML answers its aggregate queries
    (nvmlDeviceGetMemoryInfo on the GPU) only to a caller allowed to monitor MIG, which
    the NVIDIA container toolkit grants with NVIDIA_MIG_MONITOR_DEVICES=all, honoured
    only in a container whose bounding set holds CAP_SYS_ADMIN (nvidia-container-toolkit
    cmd/nvidia-container-runtime/README.md; cmd/nvidia-container-runtime-hook/
    container_config.go, getNvidiaConfig). The GPU Operator sets the same variable on
    its own NVML readers (gpu-operator controllers/object_controls.go,
    applyMIGConfiguration) and runs GPU Feature Discovery privileged. A non-root user
    would also need read access to /proc/driver/nvidia/capabilities/mig/monitor, so the
    container runs as root; Kubernetes refuses allowPrivilegeEscalation false beside
    CAP_SYS_ADMIN (pkg/apis/core/validation, ValidateSecurityContext)."""
    if settings.mig_strategy is None:
        return {}
    return {
        "env": [{"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}],
        "securityContext": {
            "allowPrivilegeEscalation": True,
            "readOnlyRootFilesystem": True,
            "runAsUser": 0,
            "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
        },
    }


def _mount_containerd(
    mounts: list[dict[str, Any]], volumes: list[dict[str, Any]], env: list[dict[str, Any]]
) -> None:
    """The node's containerd content and metadata stores, read-only, where the agent
    reads ``containerd:`` REFs (docs/kubernetes.md). Only the two folders: containerd
    keeps its root 0700 (cmd/containerd/server/server.go), but the content store's
    folders are 0755 and its blobs 0444 (plugins/content/local/store.go, writer.go),
    the metadata folder 0711 and meta.db 0644 (plugins/metadata/plugin.go), so the
    agent reads them as its own non-root user."""
    for name, folder in (
        ("containerd-content", "io.containerd.content.v1.content"),
        ("containerd-metadata", "io.containerd.metadata.v1.bolt"),
    ):
        path = f"{CONTAINERD_ROOT}/{folder}"
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
        volumes.append({"name": name, "hostPath": {"path": path, "type": "Directory"}})
    env.append({"name": "CONTAINERD_ROOT", "value": CONTAINERD_ROOT})
