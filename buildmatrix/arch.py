"""GPU architecture names: compute capabilities, SASS/PTX targets, GFD families.

Pure data types and parsers; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from buildmatrix.errors import InputError


class Family(StrEnum):
    """GPU Feature Discovery family names (``nvidia.com/gpu.family``)."""

    TESLA = "tesla"  # compute capability 1.x
    FERMI = "fermi"  # compute capability 2.x
    KEPLER = "kepler"
    MAXWELL = "maxwell"
    PASCAL = "pascal"
    VOLTA = "volta"
    TURING = "turing"
    AMPERE = "ampere"
    ADA_LOVELACE = "ada-lovelace"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"
    RUBIN = "rubin"
    UNDEFINED = "undefined"  # GFD's value for a compute capability it does not map


class Suffix(StrEnum):
    """Arch suffix: none, ``a`` (arch-specific), ``f`` (family-specific, CUDA 12.9+)."""

    NONE = ""
    ARCH = "a"
    FAMILY = "f"


class CodeKind(StrEnum):
    SASS = "sass"
    PTX = "ptx"


@dataclass(frozen=True, order=True)
class ComputeCapability:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def number(self) -> int:
        """The number used in arch names: 9.0 -> 90, 10.3 -> 103, 12.1 -> 121."""
        return self.major * 10 + self.minor

    @classmethod
    def from_number(cls, number: int) -> ComputeCapability:
        return cls(number // 10, number % 10)


def gfd_family(cc: ComputeCapability) -> Family:
    """Family by compute capability, as GPU Feature Discovery computes it.

    Source: NVIDIA/k8s-device-plugin ``internal/lm/resource.go`` (getArchFamily,
    v0.20.0): 1.x tesla, 2.x fermi, 3.x kepler, 5.x maxwell, 6.x pascal, 7.0-7.4
    volta, 7.5 turing, 8.0-8.8 ampere, 8.9 ada-lovelace, 9.x hopper, 10.x and 12.x
    blackwell, 13.x rubin; any other major is ``undefined`` (4.x and 11.x among
    them), which an arch profile may name for such an SM.
    """
    match cc.major:
        case 1:
            return Family.TESLA
        case 2:
            return Family.FERMI
        case 3:
            return Family.KEPLER
        case 5:
            return Family.MAXWELL
        case 6:
            return Family.PASCAL
        case 7:
            return Family.TURING if cc.minor >= 5 else Family.VOLTA
        case 8:
            return Family.ADA_LOVELACE if cc.minor == 9 else Family.AMPERE
        case 9:
            return Family.HOPPER
        case 10 | 12:
            return Family.BLACKWELL
        case 13:
            return Family.RUBIN
        case _:
            return Family.UNDEFINED


@dataclass(frozen=True, order=True)
class Arch:
    """One code target as a fatbinary names it: ``sm_90``, ``sm_100f``, ``compute_90a``."""

    cc: ComputeCapability
    kind: CodeKind
    suffix: Suffix = Suffix.NONE

    def __str__(self) -> str:
        prefix = "sm" if self.kind is CodeKind.SASS else "compute"
        return f"{prefix}_{self.cc.number}{self.suffix.value}"

    @property
    def sort_key(self) -> tuple[int, str]:
        return (self.cc.number, self.suffix.value)


_ARCH_RE = re.compile(r"(?P<prefix>sm|compute)_(?P<num>[1-9][0-9]{1,2})(?P<suffix>[af]?)")
_CC_RE = re.compile(r"(?P<major>[1-9][0-9]?)\.(?P<minor>[0-9])")
_NUM_RE = re.compile(r"(?P<num>[1-9][0-9]{1,2})(?P<suffix>[af]?)")


def parse_arch(text: str) -> Arch:
    """Parse ``sm_90``, ``sm_90a``, ``compute_100f``."""
    m = _ARCH_RE.fullmatch(text.strip())
    if not m:
        raise InputError(
            f"'{text}' is not a GPU arch name; expected sm_XY or compute_XY with an optional "
            "'a' or 'f' suffix, e.g. sm_90, sm_90a, compute_100f."
        )
    kind = CodeKind.SASS if m["prefix"] == "sm" else CodeKind.PTX
    return Arch(ComputeCapability.from_number(int(m["num"])), kind, Suffix(m["suffix"]))


def parse_cc(text: str) -> ComputeCapability:
    """Parse a compute capability written as ``9.0``."""
    m = _CC_RE.fullmatch(text.strip())
    if not m:
        raise InputError(f"'{text}' is not a compute capability; expected MAJOR.MINOR, e.g. 9.0.")
    return ComputeCapability(int(m["major"]), int(m["minor"]))


def parse_sm(text: str) -> Arch:
    """Parse a user's ``--sm``: ``sm_90``, ``sm_90a``, ``9.0`` or ``90`` (SASS target)."""
    value = text.strip()
    if value.startswith("sm_"):
        return parse_arch(value)
    if _CC_RE.fullmatch(value):
        return Arch(parse_cc(value), CodeKind.SASS)
    m = _NUM_RE.fullmatch(value)
    if m:
        cc = ComputeCapability.from_number(int(m["num"]))
        return Arch(cc, CodeKind.SASS, Suffix(m["suffix"]))
    raise InputError(f"'{text}' is not an SM; write it as sm_90, sm_90a, 9.0 or 90.")


# The integrated GPUs (Tegra: Jetson, DRIVE, IGX's own GPU, Thor) and the SMs outside
# the desktop line. The CUDA C++ Programming Guide ("Binary Compatibility"): "Binary
# compatibility is supported only for the desktop. It is not supported for Tegra.
# Also, the binary compatibility between desktop and Tegra is not supported." So SASS
# for one of these runs on exactly that compute capability, and no other SASS runs on
# it. nvlink 13.0 agrees for every SM it knows (tests/test_integrated_nvlink.py links
# a cubin of each SM into a program for each): sm_87 and sm_88 code links only for
# itself, sm_80/sm_86 code not for 8.7 or 8.8, sm_110 code only for 11.0, while
# sm_120 code links for 12.1 (GB10, desktop line). 3.2 Tegra K1, 5.3 Tegra X1, 6.2
# Tegra X2 (Programming Guide, "Compute Capabilities" table of Tegra products), 7.2
# Xavier, 8.7 Orin (developer.nvidia.com/cuda-gpus, "Jetson"), 8.8 (CUDA 13.0's
# nvcc --list-gpu-code; nvlink treats it as above), 10.1 Thor as CUDA 12.8 and 12.9
# number it and 11.0 the same Thor as CUDA 13.0 renumbered it (CUDA 13.0 release
# notes: sm_101 renamed sm_110).
INTEGRATED = frozenset(
    ComputeCapability(*cc)
    for cc in ((3, 2), (5, 3), (6, 2), (7, 2), (8, 7), (8, 8), (10, 1), (11, 0))
)


def integrated(cc: ComputeCapability) -> bool:
    """Whether ``cc`` is an integrated (Tegra) GPU's, outside the desktop line."""
    return cc in INTEGRATED


def sass_runs_on(arch: Arch, cc: ComputeCapability) -> bool:
    """Binary compatibility of SASS (CUDA C++ Programming Guide, "Binary
    Compatibility"; the ``f`` suffix: CUDA 12.9 release notes, family-specific).

    On the desktop line ``sm_XY`` and ``sm_XYf`` run on X.Z for Z >= Y (same major
    only) and ``sm_XYa`` on exactly X.Y; integrated SMs (:data:`INTEGRATED`) have no
    binary compatibility: their SASS runs on exactly their compute capability, and no
    other SASS runs on them.
    """
    if arch.suffix is Suffix.ARCH or integrated(arch.cc) or integrated(cc):
        return cc == arch.cc
    return cc.major == arch.cc.major and cc.minor >= arch.cc.minor


def serves_wherever(have: frozenset[Arch], need: frozenset[Arch]) -> bool:
    """Whether ``have`` has code wherever ``need`` does: each target of ``need`` is in
    ``have``, or is SASS that a plain SASS target of ``have`` runs wherever it runs
    (sm_80 runs wherever sm_86 does, but not where sm_87 does: :func:`sass_runs_on`;
    docs/compatibility.md). PTX is matched exactly (JIT depends on the driver)."""
    return all(
        t in have
        or (
            t.kind is CodeKind.SASS
            and any(
                s.kind is CodeKind.SASS
                and s.suffix is Suffix.NONE
                and (
                    s.cc == t.cc
                    or (
                        not integrated(s.cc)
                        and not integrated(t.cc)
                        and s.cc.major == t.cc.major
                        and s.cc.minor <= t.cc.minor
                    )
                )
                for s in have
            )
        )
        for t in need
    )


# The CPU architectures a GPU's host can have, in output order: the names of the OCI
# image index's ``platform.architecture`` (Go's GOARCH) and of the node label
# ``kubernetes.io/arch``. A profile that names none judges every one (docs/profiles.md:
# a PCIe card sits in x86 and Arm SBSA servers alike).
HOST_ARCHES = ("amd64", "arm64")


def platform_of(arch: str) -> str:
    """The OCI/buildx platform of a Linux host of CPU architecture ``arch``."""
    return f"linux/{arch}"


def sorted_platforms(platforms: Iterable[str]) -> tuple[str, ...]:
    """``linux/ARCH`` platforms, de-duplicated, in :data:`HOST_ARCHES` order."""
    order = {platform_of(a): i for i, a in enumerate(HOST_ARCHES)}
    return tuple(sorted(set(platforms), key=lambda p: (order.get(p, len(order)), p)))
