"""The admission DaemonSet of ``buildmatrix k8s manifests`` (k8s.py renders the rest),
and the settings all of them are rendered from. Pure.

On every NVIDIA GPU node (NFD's PCI labels, the GPU Operator's
``nvidia.com/gpu.present``, or a label the provisioner sets at join:
``node_selectors``), tolerating the admission taint and ``nvidia.com/gpu``, it runs
``smoke --apply`` (or ``--nfd-file``) now and every ``interval`` seconds, each round
within ``--deadline`` and marked failed when a signal ends it, so a GPU that degrades
later is tainted again. NVML and the driver come from the NVIDIA container toolkit
(runtime class ``nvidia``, ``NVIDIA_VISIBLE_DEVICES=all``, capability ``utility``;
``compute`` too with the load test); it requests no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from buildmatrix.k8s_nfd import FEATURE_FILE, nfd_pod
from buildmatrix.k8s_nodes import SelectorTerm
from buildmatrix.labelkeys import TAINT_EFFECT, TAINT_KEY, GfdKeys

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
# smoke --driver-file: the driver the container's libraries came with, in its /tmp
# (an emptyDir, which outlives a container's restart: the loop removes it at start).
DRIVER_FILE = "/tmp/buildmatrix-driver"
# The toolkit's device request as a mount: /dev/null on the host at
# DeviceListAsVolumeMountsRoot/<device> (nvidia-container-toolkit
# internal/config/image/cuda_image.go, requestsFromMounts).
DEVICE_LIST_MOUNT = "/var/run/nvidia-container-devices/all"
# The CDI device request as a Pod annotation (cdi.k8s.io/ is the toolkit's default
# annotation prefix, api/config/v1; and what container runtimes read natively).
CDI_ANNOTATION = f"cdi.k8s.io/{APP}"
CDI_ALL_GPUS = "nvidia.com/gpu=all"
CONTAINERD_ROOT = "/var/lib/containerd"  # containerd's default root (defaults/defaults_unix.go)
PRIORITY_CLASS = "system-node-critical"  # the DaemonSet's Pods, as the GPU Operator's


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
    taint_key: str = TAINT_KEY  # --taint-key: the admission taint's key
    source_grace: int | None = None  # smoke --source-grace (None: smoke's default)
    # How the Pod asks the NVIDIA container toolkit for the driver (device_request()).
    device_request: str = "envvar"  # envvar | volume-mounts | cdi-annotation


def node_selector_terms(selectors: tuple[SelectorTerm, ...]) -> list[dict[str, Any]]:
    """The DaemonSet's nodeSelectorTerms: one per GPU label, one per provisioner
    selector (its labels ANDed); terms are ORed."""
    terms = [[(k, v)] for k, v in GPU_NODE_LABELS] + [list(s.labels) for s in selectors]
    return [
        {"matchExpressions": [{"key": k, "operator": "In", "values": [v]} for k, v in term]}
        for term in terms
    ]


def daemonset(settings: Settings, meta: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
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
                "metadata": {"labels": labels, **_cdi_annotation(settings)},
                "spec": {
                    "serviceAccountName": APP,
                    "runtimeClassName": RUNTIME_CLASS,
                    "priorityClassName": PRIORITY_CLASS,
                    "affinity": {
                        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": gpu}
                    },
                    "tolerations": [
                        {
                            "key": settings.taint_key,
                            "operator": "Exists",
                            "effect": TAINT_EFFECT,
                        },
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
    smoke = (
        f"{where} --pools {POOLS_PATH} --deadline {settings.deadline} --driver-file {DRIVER_FILE}"
    )
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
    if settings.taint_key != TAINT_KEY:  # validated as a taint key: no shell quoting
        smoke += f" --taint-key {settings.taint_key}"
        where += f" --taint-key {settings.taint_key}"
    if settings.source_grace is not None:
        smoke += f" --source-grace {settings.source_grace}"
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
    # The node's driver changed under the container (node/driver_change.py): its
    # NVIDIA libraries are the old driver's until the container is created anew,
    # which the kubelet does when it ends (restartPolicy Always, a DaemonSet's only).
    restart = (
        f'case "$(cat {DRIVER_FILE} 2>/dev/null)" in changed*) '
        'echo "buildmatrix: the driver of the node changed: ending the container, which '
        'the kubelet starts again with the libraries of the new driver"; exit 0;; esac'
    )
    return (
        f"rm -f {DRIVER_FILE}; while true; do {smoke}; rc=$?; "
        f'if [ "$rc" -gt 128 ]; then {mark}; fi; {restart}; sleep {settings.interval}; done'
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
    if settings.device_request == "volume-mounts":
        mounts.append({"name": "nvidia-devices", "mountPath": DEVICE_LIST_MOUNT, "readOnly": True})
        volumes.append(
            {"name": "nvidia-devices", "hostPath": {"path": "/dev/null", "type": "CharDevice"}}
        )
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


def _cdi_annotation(settings: Settings) -> dict[str, Any]:
    """``--device-request cdi-annotation``: the Pod's annotation naming every GPU as a
    CDI device. The NVIDIA container runtime in CDI mode prefers annotation requests to
    any other (nvidia-container-toolkit internal/config/image/cuda_image.go,
    ``VisibleDevices``, ``cdiDeviceRequestsFromAnnotations``); a runtime without a CDI
    spec for nvidia.com/gpu refuses to create the container."""
    if settings.device_request != "cdi-annotation":
        return {}
    return {"annotations": {CDI_ANNOTATION: CDI_ALL_GPUS}}


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
