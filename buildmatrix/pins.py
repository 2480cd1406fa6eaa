"""Whether the pinned base digests of ``bases.yaml`` are stale: the one network step of
``generate``, run only with ``--check-pins`` (docs/generate.md, "Bases").

A pin is stale when its tag now names another manifest than the pinned digest: the
tag was re-pushed (a patched base) or removed (NVIDIA removes the tags of
end-of-life CUDA releases; then the registry answers 404 and the pin is reported as
gone). The tag is asked of the registry the build pulls from: the mirror where
``registry`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass

from buildmatrix.bases import Bases, apply, external_refs
from buildmatrix.image.ref import parse_ref


@dataclass(frozen=True, kw_only=True)
class PinState:
    ref: str  # as bases.yaml names it
    pinned: str
    pulled_from: str  # the reference asked (mirrored where a mirror is set)
    current: str | None  # None: the tag is gone

    @property
    def stale(self) -> bool:
        return self.current != self.pinned

    def __str__(self) -> str:
        if self.current is None:
            return f"{self.ref}: pinned {self.pinned}, but {self.pulled_from} no longer exists"
        return f"{self.ref}: pinned {self.pinned}, but {self.pulled_from} is now {self.current}"


def _asked(ref: str, bases: Bases) -> str:
    """The tag reference a build pulls for ``ref``: mirrored, without the digest."""
    return external_refs(apply(f"FROM {ref}\n", Bases(registry=bases.registry)))[0]


def pin_states(bases: Bases) -> list[PinState]:
    """Each pin with the digest its tag names now (network; exit 3 when a registry
    cannot be reached or refuses, as ``check`` does)."""
    from buildmatrix.image.registry import NotFound, RegistryClient

    states = []
    for ref, pinned in sorted(bases.pins.items()):
        asked = _asked(ref, bases)
        parsed = parse_ref(f"docker://{asked}")
        client = RegistryClient(parsed)
        try:
            _, current = client.manifest(parsed.reference, digest=None)
        except NotFound:
            current = None
        states.append(PinState(ref=ref, pinned=pinned, pulled_from=asked, current=current))
    return states
