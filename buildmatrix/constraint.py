"""``NVIDIA_REQUIRE_ARCH``: which (GPU, driver) pairs may start an image, from its code.

Pure. The NVIDIA container toolkit refuses to start a container whose
``NVIDIA_REQUIRE_*`` variables no GPU satisfies: space-separated alternatives (OR),
each a comma-separated list of conditions (AND) on ``arch`` (compute capability) and
``driver``, with ``= != < <= > >=`` (nvidia-container-toolkit, "Specialized
configurations with Docker": environment variables). Enforced by the legacy hook and
CSV mode, not by CDI mode (docs/generate.md).

The constraint is derived with the rules and floors ``check`` uses (compat.py), so it
admits a GPU and driver exactly when ``check`` passes the image's code there. Along
the compute-capability axis the answer can change only at the profiles' CCs (their
hardware floors), the code's CCs and each major's X.0; so each such point is judged on
its own, each open interval between two of them at one CC inside it, and neighbours
with the same answer are merged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import Version

from buildmatrix.arch import ComputeCapability
from buildmatrix.compat import CodeTarget, Verdict, driver_floors, jit_floor, judge_codes
from buildmatrix.cuda import CudaFacts, DriverVersion
from buildmatrix.profiles import ProfileSet


@dataclass(frozen=True, kw_only=True)
class Segment:
    """A range of compute capabilities that may run the code from ``driver`` on."""

    low: ComputeCapability
    low_included: bool
    high: ComputeCapability | None  # None: no upper bound
    high_included: bool
    driver: DriverVersion

    def conditions(self) -> list[str]:
        if self.high == self.low and self.low_included and self.high_included:
            arch = [f"arch={self.low}"]
        else:
            arch = [f"arch>={self.low}" if self.low_included else f"arch>{self.low}"]
            if self.high is not None:
                arch.append(f"arch<={self.high}" if self.high_included else f"arch<{self.high}")
        return [*arch, f"driver>={self.driver}"]


# (low, low included, high or None, high included, driver or None): one point or interval
_Piece = tuple[ComputeCapability, bool, ComputeCapability | None, bool, DriverVersion | None]


def _after(cc: ComputeCapability) -> ComputeCapability:
    """The next compute capability: 8.9 -> 9.0, 9.0 -> 9.1."""
    return (
        ComputeCapability(cc.major, cc.minor + 1)
        if cc.minor < 9
        else ComputeCapability(cc.major + 1, 0)
    )


def required_driver(
    codes: Sequence[CodeTarget],
    cc: ComputeCapability,
    *,
    runtime: Version,
    profiles: ProfileSet,
    facts: CudaFacts,
) -> DriverVersion | None:
    """The lowest driver on which the code runs on ``cc`` (None: it runs on no driver).

    ``max`` of the floors of compat.driver_floors (runtime major, the GPU's hardware
    floor, ProfileSet.hardware_floor) and, where only PTX runs, the JIT floor.
    """
    verdict = judge_codes(codes, cc, driver=None, facts=facts).verdict
    if verdict is Verdict.NONE:
        return None
    hardware = profiles.hardware_floor(cc)
    floors = driver_floors(
        cuda_runtime=runtime,
        hardware_floor=hardware[0] if hardware else None,
        facts=facts,
    )
    drivers = [f.driver for f in floors]
    if verdict is Verdict.JIT:
        drivers.append(jit_floor(codes, cc, facts))
    known = [d for d in drivers if d is not None]
    if len(known) != len(drivers) or not known:
        return None  # a floor nobody can state: admit nothing (fail closed)
    return max(known)


def admitted(
    codes: Sequence[CodeTarget], *, runtime: Version, profiles: ProfileSet, facts: CudaFacts
) -> list[Segment]:
    """The compute-capability ranges that run the code, each with its driver floor."""
    ccs = {p.cc for p in profiles} | {c.arch.cc for c in codes}
    majors = range(min(cc.major for cc in ccs), max(cc.major for cc in ccs) + 2)
    points = sorted(ccs | {ComputeCapability(m, 0) for m in majors})

    def need(cc: ComputeCapability) -> DriverVersion | None:
        return required_driver(codes, cc, runtime=runtime, profiles=profiles, facts=facts)

    pieces: list[_Piece] = []
    for i, point in enumerate(points):
        pieces.append((point, True, point, True, need(point)))
        following = points[i + 1] if i + 1 < len(points) else None
        inside = _after(point)
        if following is None:
            pieces.append((point, False, None, False, need(inside)))
        elif inside < following:
            pieces.append((point, False, following, False, need(inside)))
    segments: list[Segment] = []
    for low, low_in, high, high_in, driver in pieces:
        if driver is None:
            continue
        last = segments[-1] if segments else None
        # Meeting at one point, or at neighbouring capabilities (12.0 then 12.1: there
        # is none between them).
        touching = last is not None and (
            (last.high == low and last.high_included != low_in)
            or (
                last.high is not None and last.high_included and low_in and _after(last.high) == low
            )
        )
        if last is not None and touching and last.driver == driver:
            segments[-1] = Segment(
                low=last.low,
                low_included=last.low_included,
                high=high,
                high_included=high_in,
                driver=driver,
            )
        else:
            segments.append(
                Segment(
                    low=low, low_included=low_in, high=high, high_included=high_in, driver=driver
                )
            )
    return segments


def nvidia_require_arch(segments: Sequence[Segment]) -> str:
    """The environment variable's value: one alternative per segment."""
    return " ".join(",".join(s.conditions()) for s in segments)
