"""The example FP8 training Job ``k8s manifests --example-job`` prints: a workload whose
nodeAffinity is what ``affinity`` gives for its image (docs/kubernetes.md)."""

from __future__ import annotations

from typing import Any

from buildmatrix.affinity import Choice, Needs, nodes_block, terms
from buildmatrix.cuda import CudaFacts
from buildmatrix.profiles import ProfileSet


def example_job(profiles: ProfileSet, ns: str, facts: CudaFacts) -> dict[str, Any]:
    """An FP8 training Job whose affinity is what ``affinity --require fp8 --min-memory
    70000`` gives for its (example) image: CUDA 13 runtime, SASS for every SM with FP8,
    so every FP8 GPU on a driver that meets both the CUDA 13 floor and its own."""
    runtime = facts.runtime_floor(13)
    chosen = tuple(
        (p, ((max(p.min_driver, runtime) if runtime else p.min_driver, None),))
        for p in profiles
        if "fp8" in p.features
    )
    needs = Needs(features=("fp8",), min_memory_mib=70000)
    block = nodes_block(terms(Choice(chosen=chosen, excluded=()), profiles, needs))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "example-fp8-training", "namespace": ns},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    **block,
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
