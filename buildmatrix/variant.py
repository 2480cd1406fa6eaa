"""One variant of the build matrix (:class:`Entry`), what was left out
(:class:`Dropped`), and how a variant's repository and tag are named.

Pure data and naming; buildmatrix.matrix expands image specs into these.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from packaging.version import Version

from buildmatrix.arch import CodeKind, Family, parse_arch
from buildmatrix.compat import CodeTarget
from buildmatrix.constraint import Segment, admitted, nvidia_require_arch
from buildmatrix.cuda import CudaFacts
from buildmatrix.errors import InputError
from buildmatrix.image.ref import COMPONENT_PATTERN, HOST_PATTERN, is_host
from buildmatrix.profiles import Profile, ProfileSet
from buildmatrix.specs import Cuda, ImageSpec


def variant_fields(
    spec: ImageSpec, family: str, cuda: Cuda, axes: tuple[tuple[str, str], ...]
) -> dict[str, str]:
    """The fields a tag pattern, an exclusion and a template see for one variant."""
    return {
        "name": spec.name,
        "version": spec.version,
        "family": family,
        "cuda": cuda.full,
        "cuda_major": str(cuda.major),
        "cuda_minor": str(cuda.minor),
        **dict(axes),
    }


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One image variant to build."""

    spec: ImageSpec
    family: Family
    profiles: tuple[Profile, ...]
    cuda: Cuda
    axes: tuple[tuple[str, str], ...]
    tag: str
    dockerfile: Path
    catalogue: ProfileSet = field(compare=False)  # every profile: floors of any GPU admitted
    facts: CudaFacts = field(compare=False)
    registry: str | None = None  # prefix for a spec repository without a registry host
    platform: str = "linux/amd64"  # the entry of the tag's multi-platform index
    emulated: bool = False  # built under QEMU on the x86 runner (the spec's 'emulate')

    @property
    def arch(self) -> str:
        """The platform's CPU architecture (``amd64``, ``arm64``)."""
        return self.platform.split("/")[1]

    @property
    def runner(self) -> str:
        """The GitHub-hosted runner that builds the entry natively: ``ubuntu-24.04-arm``
        for arm64 (GitHub's Linux arm64 hosted runners, changelog 2025-01-16), else
        ``ubuntu-24.04`` (which emulates arm64 with QEMU where the spec asks)."""
        return "ubuntu-24.04-arm" if self.arch == "arm64" and not self.emulated else "ubuntu-24.04"

    @property
    def key(self) -> str:
        """A name for the tag's artifacts: the image and tag, safe in artifact names."""
        return f"{self.spec.name}-{self.tag}"

    @property
    def fields(self) -> dict[str, str]:
        return variant_fields(self.spec, self.family.value, self.cuda, self.axes)

    @property
    def repository(self) -> str:
        """The spec's repository, under ``registry`` where the spec names no host."""
        return qualified_repository(self.spec.repository, self.registry)

    @property
    def image_ref(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def sms(self) -> list[str]:
        return [p.sm for p in self.profiles]

    def _cuda_version(self) -> Version:
        return Version(self.cuda.mm)

    @property
    def gencode(self) -> list[str]:
        return [g for p in self.profiles for g in p.gencode(self._cuda_version())]

    @property
    def torch_arch_list(self) -> str:
        return ";".join(e for p in self.profiles for e in p.torch_arch_list(self._cuda_version()))

    @property
    def cmake_architectures(self) -> str:
        return ";".join(
            e for p in self.profiles for e in p.cmake_architectures(self._cuda_version())
        )

    def codes(self) -> list[CodeTarget]:
        """The device code the variant's gencode flags produce (SASS and PTX)."""
        tk = self.facts.toolkit(self._cuda_version())
        isa = tk.ptx_isa if tk is not None else None
        found = []
        for flag in self.gencode:
            code = flag.rsplit("code=", 1)[1]
            kind = CodeKind.SASS if code.startswith("sm_") else CodeKind.PTX
            arch = parse_arch(code)
            found.append(CodeTarget(arch=arch, ptx_isa=isa if kind is CodeKind.PTX else None))
        return found

    @cached_property
    def segments(self) -> list[Segment]:
        """Where the variant runs, with the driver each range needs (constraint.py)."""
        return admitted(
            self.codes(),
            runtime=self._cuda_version(),
            profiles=self.catalogue,
            facts=self.facts,
        )

    @property
    def min_driver(self) -> str:
        """The lowest driver on which the variant runs on some GPU it admits: the CUDA
        runtime floor, the hardware floor, and the JIT floor where only PTX runs."""
        return str(min(s.driver for s in self.segments))

    @cached_property
    def nvidia_require_arch(self) -> str:
        """The ``NVIDIA_REQUIRE_ARCH`` value: exactly the (GPU, driver) pairs on which
        ``check`` passes the variant's code (constraint.py); written once per entry."""
        return nvidia_require_arch(self.segments)

    @property
    def labels(self) -> dict[str, str]:
        return {
            "io.buildmatrix.family": self.family.value,
            "io.buildmatrix.sm": ",".join(self.sms),
            "io.buildmatrix.cuda": self.cuda.full,
            "io.buildmatrix.min-driver": self.min_driver,
            "io.buildmatrix.image": self.spec.name,
            "org.opencontainers.image.title": self.spec.name,
            "org.opencontainers.image.version": self.spec.version,
            "org.opencontainers.image.description": self.spec.description
            or f"{self.spec.name} for {self.family.value} GPUs",
        }

    def to_json(self, *, relative_to: Path | None = None) -> dict[str, Any]:
        def rel(path: Path) -> str:
            base = relative_to or Path.cwd()
            return Path(os.path.relpath(path, base)).as_posix()

        return {
            "image": self.spec.name,
            "family": self.family.value,
            "platform": self.platform,
            "arch": self.arch,
            "runner": self.runner,
            "qemu": self.emulated,
            "key": self.key,
            "repository": self.repository,
            "sm": self.sms,
            "cuda": self.cuda.full,
            "axes": dict(self.axes),
            "tag": self.tag,
            "tags": [self.image_ref],
            "dockerfile": rel(self.dockerfile),
            "context": rel(self.spec.context),
            "gencode": " ".join(self.gencode),
            "torch_arch_list": self.torch_arch_list,
            "cmake_architectures": self.cmake_architectures,
            "min_driver": self.min_driver,
            "nvidia_require_arch": self.nvidia_require_arch,
            "labels": self.labels,
        }


@dataclass(frozen=True, kw_only=True)
class Dropped:
    image: str
    what: str
    reason: str
    sm_only: bool = False  # one SM left out of a variant that is still built

    def __str__(self) -> str:
        return f"{self.image}: {self.what}: {self.reason}"


@dataclass
class Matrix:
    entries: list[Entry] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    # why each built platform of a variant is built (--explain): "IMAGE: WHAT: why"
    platforms_built: list[str] = field(default_factory=list)


_REGISTRY = re.compile(rf"{HOST_PATTERN}(?:/{COMPONENT_PATTERN})*")


def qualified_repository(repository: str, registry: str | None) -> str:
    """``registry/repository`` when the repository names no registry host (its first
    component has no '.' or ':' and is not 'localhost', as Docker decides), else the
    repository as written: a host in the spec is deliberate."""
    first = repository.split("/", 1)[0]
    return repository if is_host(first) or not registry else f"{registry}/{repository}"


def check_registry(registry: str, *, what: str) -> str:
    """A registry prefix (``ghcr.io/org``, ``127.0.0.1:5000``), or an input error."""
    registry = registry.rstrip("/")
    if not _REGISTRY.fullmatch(registry):
        raise InputError(
            f"{what}: '{registry}' is not a registry prefix; expected HOST[:PORT][/PATH] "
            "with a lower-case path, e.g. ghcr.io/my-org or registry.example.com:5000/ml."
        )
    return registry
