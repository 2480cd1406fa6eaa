"""Which images of a fatbinary the driver may load, as the image's ``Env`` sets it.

The CUDA driver reads two environment variables of the process (CUDA C++ Programming
Guide, "CUDA Environment Variables"): ``CUDA_FORCE_PTX_JIT=1`` makes it ignore the
binary code embedded in an application and JIT-compile the embedded PTX instead ("If
a kernel does not have embedded PTX code, it will fail to load"), and
``CUDA_DISABLE_PTX_JIT=1`` turns JIT compilation off ("If a kernel does not have
embedded binary code or the embedded binary was compiled for an incompatible
architecture, then it will fail to load"). An image that sets either in its config's
``Env`` runs every process with it, so ``check`` judges its files with only the code
the driver may load. The guide documents the values 0 and 1; any other non-empty
value is taken as set (fail closed). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from buildmatrix.arch import CodeKind
from buildmatrix.verdict import Unit

FORCE_PTX_JIT = "CUDA_FORCE_PTX_JIT"
DISABLE_PTX_JIT = "CUDA_DISABLE_PTX_JIT"
_EFFECTS = {
    FORCE_PTX_JIT: (CodeKind.SASS, "the driver ignores SASS and JIT-compiles PTX"),
    DISABLE_PTX_JIT: (CodeKind.PTX, "the driver JIT-compiles no PTX"),
}
EVERY_KIND = frozenset({CodeKind.SASS, CodeKind.PTX})


@dataclass(frozen=True, kw_only=True)
class JitEnv:
    """The kinds of code the driver may load, and the settings that narrowed them."""

    loadable: frozenset[CodeKind] = EVERY_KIND
    settings: tuple[str, ...] = ()  # "CUDA_FORCE_PTX_JIT=1", in the order above

    @property
    def narrowed(self) -> bool:
        return self.loadable != EVERY_KIND

    def describe(self) -> str:
        """Why the code was judged so (an empty text where nothing narrowed it)."""
        effects = "; ".join(_EFFECTS[s.split("=", 1)[0]][1] for s in self.settings)
        return (
            f"the image's Env sets {', '.join(self.settings)}: {effects}" if self.settings else ""
        )


DEFAULT = JitEnv()


def jit_env(env: Mapping[str, str]) -> JitEnv:
    """What ``env`` (the image config's ``Env``) makes the driver load."""
    loadable = set(EVERY_KIND)
    settings = []
    for name, (ignored, _) in _EFFECTS.items():
        value = env.get(name)
        if value is None or value.strip() in ("", "0"):
            continue
        loadable.discard(ignored)
        settings.append(f"{name}={value}")
    return JitEnv(loadable=frozenset(loadable), settings=tuple(settings)) if settings else DEFAULT


def loadable_units(units: Sequence[Unit], jit: JitEnv) -> tuple[Unit, ...]:
    """``units`` with only the code the driver may load under ``jit``."""
    if not jit.narrowed:
        return tuple(units)
    return tuple(
        replace(
            u,
            codes=tuple(c for c in u.codes if c.arch.kind in jit.loadable),
            lacking=tuple(x for x in u.lacking if x.image.kind in jit.loadable),
        )
        for u in units
    )
