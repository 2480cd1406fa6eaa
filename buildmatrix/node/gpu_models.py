"""The GPU models on a node: its GPUs grouped by (NVML name, compute capability),
each with its arch profile, and the model the node's labels describe. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from buildmatrix.arch import ComputeCapability
from buildmatrix.profiles import Profile, ProfileSet
from buildmatrix.snapshot import Gpu, Snapshot


@dataclass(frozen=True, kw_only=True)
class Model:
    """One GPU model on the node: NVML name and compute capability, with its GPUs."""

    name: str
    gpus: tuple[Gpu, ...]
    profile: Profile | None

    @property
    def cc(self) -> ComputeCapability:
        return self.gpus[0].cc

    @property
    def memory_mib(self) -> int | None:
        sizes = [g.memory_total_mib for g in self.gpus if g.memory_total_mib]
        return min(sizes) if sizes else None

    @property
    def indexes(self) -> str:
        return ",".join(str(g.index) for g in self.gpus)


def models_of(snapshot: Snapshot, profiles: ProfileSet) -> tuple[Model, ...]:
    """GPU models in order of their first GPU; one model = one (name, CC)."""
    groups: dict[tuple[str, ComputeCapability], list[Gpu]] = {}
    for gpu in sorted(snapshot.gpus, key=lambda g: g.index):
        groups.setdefault((gpu.name, gpu.cc), []).append(gpu)
    return tuple(
        Model(name=name, gpus=tuple(gpus), profile=profiles.by_cc(cc))
        for (name, cc), gpus in groups.items()
    )


def least_capable(models: Sequence[Model]) -> Model:
    """The model every workload on the node can count on: lowest CC, then least memory."""
    return min(models, key=lambda m: (m.cc, m.memory_mib or 0, m.name))
