"""Which nodes the admission DaemonSet runs on (``k8s manifests --node-selector``). Pure.

The DaemonSet must be able to start on a node that has just joined with the
admission taint. The labels that say "an NVIDIA GPU is here" come from node-feature-
discovery's worker (``feature.node.kubernetes.io/pci-…10de.present``) and, from them,
the GPU Operator (``nvidia.com/gpu.present``): components that must themselves
tolerate the taint first (docs/kubernetes.md, "Install"). A label the node carries from
the moment it registers does not depend on them: the provisioner sets it beside the
taint (kubelet ``--node-labels`` beside ``--register-with-taints``; Karpenter NodePool
``spec.template.metadata.labels`` beside ``startupTaints``). Each ``--node-selector``
is one more nodeSelectorTerm, ORed with the default ones.

A kubelet may only set its own labels within what the NodeRestriction admission
plugin allows (kubernetes ``plugin/pkg/admission/noderestriction/admission.go``,
``getForbiddenLabels``): nothing under ``node-restriction.kubernetes.io``, and under
``kubernetes.io``/``k8s.io`` only the keys and namespaces of
``k8s.io/kubelet/pkg/apis/well_known_labels.go`` (``IsKubeletLabel``). A selector on a
key the node cannot set at join would select nothing, so it is refused here. So is a
label ``smoke --apply`` owns: it removes those it did not set, and once the node lost
the label the DaemonSet controller would delete the very Pod that admits it
(``NodeShouldRunDaemonPod``: shouldContinueRunning is false when the affinity no longer
matches).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from buildmatrix.errors import InputError
from buildmatrix.labelkeys import owned

# k8s.io/api core/v1 well_known_labels.go, the keys kubelet's IsKubeletLabel allows.
KUBELET_LABELS = frozenset(
    {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
    }
)
# ... and the namespaces (with any subdomain in front) it allows.
KUBELET_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
NODE_RESTRICTION_NAMESPACE = "node-restriction.kubernetes.io"

# k8s.io/apimachinery pkg/api/validate/content kube.go (IsLabelKey, IsLabelValue) and
# dns.go (IsDNS1123Subdomain).
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_EXAMPLE = "example.com/gpu-node=true"


@dataclass(frozen=True, kw_only=True)
class SelectorTerm:
    """One nodeSelectorTerm: every (key, value) must be on the node (ANDed)."""

    labels: tuple[tuple[str, str], ...]


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label key (IsLabelKey), or None."""
    prefix, _, name = key.rpartition("/")
    if key.count("/") > 1:
        return "has more than one '/'"
    if "/" in key and not prefix:
        return "has an empty prefix before '/'"
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return f"prefix '{prefix}' is not a DNS subdomain (lower case, dots, at most 253)"
    if not name or len(name) > 63 or not _NAME.match(name):
        return (
            f"name '{name}' must be 1-63 characters of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a valid label value (IsLabelValue), or None."""
    if value == "" or (len(value) <= 63 and _NAME.match(value)):
        return None
    return (
        "must be at most 63 characters of letters, digits, '-', '_' or '.', "
        "starting and ending with a letter or digit"
    )


def _namespace(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else ""


def _in(namespace: str, domain: str) -> bool:
    return namespace == domain or namespace.endswith("." + domain)


def kubelet_may_set(key: str) -> bool:
    """Whether a kubelet may put ``key`` on its own Node under NodeRestriction
    (noderestriction admission.go ``getForbiddenLabels`` with kubelet's
    ``IsKubeletLabel``)."""
    namespace = _namespace(key)
    if _in(namespace, NODE_RESTRICTION_NAMESPACE):
        return False
    if not (_in(namespace, "kubernetes.io") or _in(namespace, "k8s.io")):
        return True
    return key in KUBELET_LABELS or any(_in(namespace, ns) for ns in KUBELET_NAMESPACES)


def parse_selector(text: str) -> SelectorTerm:
    """``KEY=VALUE[,KEY=VALUE...]`` (as kubectl's ``-l`` writes equality) into a term."""
    where = f"--node-selector '{text}'"
    pairs: list[tuple[str, str]] = []
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or not key:
            raise InputError(
                f"{where}: '{part}' is not KEY=VALUE. Give the label the provisioner sets "
                f"on the node at join, e.g. --node-selector {_EXAMPLE}."
            )
        if problem := label_key_problem(key):
            raise InputError(f"{where}: label key '{key}' {problem}.")
        if problem := label_value_problem(value):
            raise InputError(f"{where}: value '{value}' of '{key}' {problem}.")
        if not kubelet_may_set(key):
            raise InputError(
                f"{where}: a kubelet may not set '{key}' on its own Node (the NodeRestriction "
                "admission plugin allows no node-restriction.kubernetes.io keys, and under "
                "kubernetes.io and k8s.io only the well-known kubelet labels and the "
                "kubelet.kubernetes.io and node.kubernetes.io namespaces), so a node could "
                "not join with it. Use a key in your own domain, e.g. --node-selector "
                f"{_EXAMPLE}, or node.kubernetes.io/instance-type=TYPE."
            )
        if owned(key, gfd_keys=True):
            raise InputError(
                f"{where}: '{key}' is a label smoke --apply writes and removes; selecting on "
                "it would stop the DaemonSet on the node once smoke removed it. Use a label "
                f"only the provisioner sets, e.g. --node-selector {_EXAMPLE}."
            )
        if any(k == key for k, _ in pairs):
            raise InputError(f"{where}: '{key}' is given twice; one value per key in a term.")
        pairs.append((key, value))
    return SelectorTerm(labels=tuple(pairs))
