"""``check`` over the platforms an image offers. Pure.

A family tag is a multi-platform image: an HGX H100 node pulls its ``linux/amd64``
entry, a GH200 node its ``linux/arm64`` one (containerd's matcher,
buildmatrix.image.platform). Each entry is a different image with its own binaries,
so ``check`` judges every entry the image offers (buildmatrix.image.offered) behind
which a target GPU can sit: the hosts the arch profiles give its products
(docs/profiles.md, "Hosts"; every platform for a GPU without a profile). ``--platform``
narrows it to one entry. The image passes when every judged entry passes; each
problem of an entry names its platform.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from buildmatrix.arch import HOST_ARCHES, platform_of, sorted_platforms
from buildmatrix.check import CheckResult
from buildmatrix.profiles import ProfileSet
from buildmatrix.target_verdict import Target


def behind(targets: Sequence[Target], profiles: ProfileSet) -> tuple[str, ...]:
    """The platforms the targets' GPUs can sit behind: a node's products' hosts where
    the target names them (a snapshot), else its SM's products', else every one."""
    found: set[str] = set()
    for t in targets:
        if t.products:
            for product in t.products:
                found |= set(profiles.platforms_of_cc(t.cc, product))
        elif t.profile is not None:
            found |= set(t.profile.platforms)
        else:
            found |= {platform_of(a) for a in HOST_ARCHES}
    return sorted_platforms(found)


def _arch(platform: str) -> tuple[str, str]:
    """(os, architecture) of ``os/arch[/variant]``."""
    os, _, rest = platform.partition("/")
    return os, rest.split("/")[0]


def to_judge(offered: Sequence[str], first: str, platforms: Sequence[str]) -> list[str]:
    """The platforms to judge besides ``first`` (the one already judged): each OS and
    CPU architecture of ``platforms`` the image offers an entry for, as a node of it
    asks (``os/arch``: containerd's ``DefaultSpec`` names no variant on amd64, and an
    arm64 node's CPU reports 8, which is plain arm64: containerd/platforms
    ``defaults_unix.go``, ``cpuinfo_linux.go`` ``getCPUVariant``). So an index whose
    ``arm64/v9`` entry comes before its plain ``arm64`` one is judged on the entry
    such a node pulls, not on the first listed."""
    wanted = {_arch(p) for p in platforms}
    done = {_arch(first)}
    out = []
    for p in offered:
        if _arch(p) in wanted and _arch(p) not in done:
            done.add(_arch(p))
            out.append("/".join(_arch(p)))
    return out


def serves(platform: str, platforms: Sequence[str]) -> bool:
    """Whether a target GPU can sit behind ``platform`` (OS and CPU architecture)."""
    return _arch(platform) in {_arch(p) for p in platforms}


@dataclass(frozen=True, kw_only=True)
class PlatformResults:
    """One image's check: the entry judged first, then every other one judged."""

    results: tuple[tuple[str, CheckResult], ...]

    @property
    def primary(self) -> CheckResult:
        return self.results[0][1]

    @property
    def passed(self) -> bool:
        return all(r.passed for _, r in self.results)

    @property
    def problems(self) -> list[str]:
        """Every entry's problems; each names its platform where several were judged."""
        if len(self.results) == 1:
            return list(self.primary.problems)
        return [f"{platform}: {p}" for platform, r in self.results for p in r.problems]

    def to_json(self) -> dict[str, Any]:
        """check --json's object (docs/check.md): the first entry's, with the
        verdict and problems of all, plus ``platform`` and ``platforms``."""
        platform, _ = self.results[0]
        return self.primary.to_json() | {
            "verdict": "pass" if self.passed else "fail",
            "problems": self.problems,
            "platform": platform,
            "platforms": [
                {
                    "platform": p,
                    "digest": r.image.digest,
                    "verdict": "pass" if r.passed else "fail",
                    "targets": [t.to_json() for t in r.targets],
                    "files": [f.to_json() for f in r.files],
                    "problems": r.problems,
                }
                for p, r in self.results
            ],
        }
