"""A stand-in GPU cluster: one node joins, and the DaemonSets of its GPU stack take turns.

Nothing here can run a kubelet, a scheduler or the GPU stack. The node is the API
object (labels, taints) plus the host facts the stack's Pods produce or need: the
driver loaded, the runtime handlers containerd knows. Each component is the DaemonSet
object that the cluster really runs (buildmatrix's from ``k8s manifests``; the GPU
Operator's operands and NFD's worker built from the charts' values in
tests/fixtures/charts/, with the printed values overlay applied as Helm applies it),
and what its Pod does on the node, as its source says:

- nfd-worker: PCI labels named after its config (node-feature-discovery
  source/pci/pci.go GetLabels); the NFD master, which writes them, runs elsewhere;
- the GPU Operator's node-labelling controller (not a DaemonSet: it runs in the
  operator's Deployment elsewhere): ``nvidia.com/gpu.present`` from the PCI labels,
  then the deploy labels (controllers/nodelabeling_controller.go labelGPUNodes);
- driver: the driver loaded; container toolkit (which waits for the driver): the
  ``nvidia`` runtime handler; the other operands only need their runtime class;
- buildmatrix's smoke: the labels ``labels --snapshot`` gives for a recorded H100 node
  and the patch ``buildmatrix.node.apply.plan`` computes, applied to the node.

A Pod runs when the DaemonSet controller places it (tests/scheduling.py should_run),
its RuntimeClass exists (else the RuntimeClass admission plugin rejects the Pod), the
node has the RuntimeClass's handler (else the kubelet cannot create the sandbox), and
the host facts it waits for are there. ``walk`` repeats rounds until nothing changes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.scheduling import should_run

ADMISSION_TAINT = {"key": "buildmatrix.io/unverified", "effect": "NoSchedule"}
H100_PCI = {"class": "0302", "vendor": "10de", "device": "2330"}  # 3D controller


@dataclass
class Node:
    obj: dict[str, Any]
    facts: set[str] = field(default_factory=set)  # "driver", "runtime:nvidia", ...

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.obj["metadata"].setdefault("labels", {})
        return labels

    @property
    def taints(self) -> list[dict[str, Any]]:
        taints: list[dict[str, Any]] = self.obj["spec"].setdefault("taints", [])
        return taints


def joining_node(labels: Mapping[str, str], *, facts: set[str], cordoned: bool = False) -> Node:
    """A node as it registers: the admission taint and the provisioner's labels."""
    taints: list[dict[str, Any]] = [dict(ADMISSION_TAINT)]
    if cordoned:  # TaintNodesByCondition: spec.unschedulable gives this taint
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    obj = {
        "metadata": {"name": "gpu-new", "labels": dict(labels), "resourceVersion": "1"},
        "spec": {"taints": taints},
    }
    return Node(obj=obj, facts=set(facts))


@dataclass(frozen=True, kw_only=True)
class Component:
    name: str
    daemonset: Mapping[str, Any] | None  # None: a controller that runs elsewhere
    waits_for: frozenset[str] = frozenset()
    act: Callable[[Node], None]


@dataclass
class Walk:
    steps: list[str]
    blocked: dict[str, str]  # component -> why it cannot run on the node
    node: Node

    @property
    def admitted(self) -> bool:
        return ADMISSION_TAINT["key"] not in {t["key"] for t in self.node.taints}


def _blocker(c: Component, node: Node, runtime_classes: Mapping[str, str]) -> str | None:
    if c.daemonset is None:
        return None
    fits, why = should_run(c.daemonset, node.obj)
    if not fits:
        return why
    rc = c.daemonset["spec"]["template"]["spec"].get("runtimeClassName")
    if rc is not None and rc not in runtime_classes:
        return f"RuntimeClass {rc} does not exist: the Pod is rejected"
    if rc is not None and f"runtime:{runtime_classes[rc]}" not in node.facts:
        return f"no runtime handler {runtime_classes[rc]} on the node: the sandbox fails"
    missing = sorted(c.waits_for - node.facts)
    return f"waits for {', '.join(missing)}" if missing else None


def walk(components: list[Component], node: Node, runtime_classes: Mapping[str, str]) -> Walk:
    """Round after round, run every DaemonSet Pod that can run (once) and every
    controller (each round, as it reconciles), until a round changes nothing; record
    what changed the node, in order, and why the rest could not run."""
    done: list[str] = []
    steps: list[str] = []
    progressed = True
    while progressed:
        progressed = False
        for c in components:
            if c.name in done or _blocker(c, node, runtime_classes) is not None:
                continue
            before = copy.deepcopy((node.obj, node.facts))
            c.act(node)
            changed = before != (node.obj, node.facts)
            if c.daemonset is not None:
                done.append(c.name)
            if changed or c.daemonset is not None:
                steps.append(c.name)
            progressed = progressed or changed or c.daemonset is not None
    blocked = {
        c.name: why
        for c in components
        if c.daemonset is not None
        and c.name not in done
        and (why := _blocker(c, node, runtime_classes)) is not None
    }
    return Walk(steps=steps, blocked=blocked, node=node)
