"""NFD mode of ``k8s manifests`` (``--mode nfd``): node admission with no rights on
any Kubernetes object in the agent. Pure: data in, Kubernetes objects out.

The agent writes its verdict as a local feature file into Node Feature Discovery's
``features.d`` folder on its own node (``smoke --nfd-file``; node/nfd.py); the NFD
worker on that node publishes it, and the NFD master applies the labels. No token
is mounted in the agent's Pod, so a compromised agent can say things about its own
node only, and only through what NFD accepts from a feature file.

The admission taint is NFD's: a ``NodeFeatureRule`` puts
``buildmatrix.io/unverified:NoSchedule`` on every node with an NVIDIA GPU whose
``buildmatrix.io/smoke`` feature label is absent or not ``passed``, and the master
removes it once the rule stops matching. Facts from NFD's source
(kubernetes-sigs/node-feature-discovery v0.20):

- taints from rules only with nfd-master ``-enable-taints`` (chart value
  ``master.enableTaints``; ``pkg/nfd-master/nfd-master.go``);
- the master removes only taints it set itself, listed in its annotation
  ``nfd.node.kubernetes.io/taints`` (``setTaints``); a taint a node registered with
  is adopted into that list the first time the rule matches it, and only then can
  NFD remove it: so a node that registers with the taint is released by NFD as long
  as NFD sees it unverified once (it always does when the GPU Operator waits for
  NFD's PCI labels before it installs the driver the agent needs);
- a feature file's labels are the ``local.label`` feature's attributes
  (``source/local/local.go``), watched with fsnotify;
- ``NotIn`` is false for an absent attribute, so "absent or not passed" is two
  ``matchAny`` terms, ``DoesNotExist`` and ``NotIn``
  (``pkg/apis/nfd/nodefeaturerule/expression.go`` ``evaluateMatchExpression``);
- an unprefixed label (``gpu-pool``) is published as
  ``feature.node.kubernetes.io/gpu-pool`` unless the master's ``DisableAutoPrefix``
  feature gate is on; ``buildmatrix.io/`` and ``nvidia.com/`` keys pass as they are
  (only ``kubernetes.io`` namespaces are refused; ``pkg/apis/nfd/validate``).
"""

from __future__ import annotations

from typing import Any

from buildmatrix.labelkeys import SMOKE, TAINT_EFFECT, TAINT_KEY

NFD_API = "nfd.k8s-sigs.io/v1alpha1"
FEATURES_D = "/etc/kubernetes/node-feature-discovery/features.d"
FEATURE_FILE = f"{FEATURES_D}/buildmatrix"
NVIDIA_VENDOR = "10de"
GPU_CLASSES = ("0300", "0302")  # PCI display controllers: VGA, 3D (NVSwitch is 0680)


def node_feature_rule(
    *, name: str, labels: dict[str, str], taint_key: str = TAINT_KEY
) -> dict[str, Any]:
    """The rule that keeps every NVIDIA GPU node tainted (``taint_key``) until smoke
    passed there."""
    gpu = {
        "feature": "pci.device",
        "matchExpressions": {
            "vendor": {"op": "In", "value": [NVIDIA_VENDOR]},
            "class": {"op": "In", "value": list(GPU_CLASSES)},
        },
    }

    def smoke(expression: dict[str, Any]) -> dict[str, Any]:
        return {
            "matchFeatures": [{"feature": "local.label", "matchExpressions": {SMOKE: expression}}]
        }

    return {
        "apiVersion": NFD_API,
        "kind": "NodeFeatureRule",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "rules": [
                {
                    "name": "buildmatrix: GPU node not verified by smoke",
                    "taints": [{"key": taint_key, "effect": TAINT_EFFECT}],
                    "matchFeatures": [gpu],
                    "matchAny": [
                        smoke({"op": "DoesNotExist"}),
                        smoke({"op": "NotIn", "value": ["passed"]}),
                    ],
                }
            ]
        },
    }


def nfd_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The admission DaemonSet's Pod spec for NFD mode: no API credentials, and the
    feature folder of its own node mounted (the command writes :data:`FEATURE_FILE`)."""
    spec = dict(pod)
    spec.pop("serviceAccountName", None)
    spec["automountServiceAccountToken"] = False
    (container,) = spec["containers"]
    container = dict(container)
    container["volumeMounts"] = [
        *container["volumeMounts"],
        {"name": "features-d", "mountPath": FEATURES_D},
    ]
    # features.d belongs to root (0755) on the host: the agent writes there as root,
    # with every capability dropped, no privilege escalation and a read-only root.
    container["securityContext"] = {**container["securityContext"], "runAsUser": 0}
    spec["containers"] = [container]
    spec["volumes"] = [
        *spec["volumes"],
        {"name": "features-d", "hostPath": {"path": FEATURES_D, "type": "DirectoryOrCreate"}},
    ]
    return spec
