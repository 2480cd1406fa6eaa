"""Package loader gates as data: modules a Python package calls into only on some GPUs.

The table lives in ``buildmatrix/data/loaders.yaml`` (schema
``schemas/loaders.schema.json``); each entry names a module by its path inside its
package, the package versions whose own source was read, the compute capabilities
the package's loader uses it on, and the file and function of that source which
check the GPU's capability first (docs/compatibility.md, "Files a package loads only
where they run", rule (e)). An entry applies only to an image that holds one of those
versions, told by the ``NAME-VERSION.dist-info`` folder pip leaves beside the
package (the wheel's ``.dist-info`` directory, PyPA "Recording installed projects").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from buildmatrix import package_file, schema
from buildmatrix.arch import ComputeCapability

SOURCE = "buildmatrix/data/loaders.yaml"


def _cc(text: str) -> ComputeCapability:
    major, _, minor = text.partition(".")
    return ComputeCapability(int(major), int(minor))


@dataclass(frozen=True, kw_only=True)
class Gate:
    """One entry: ``module`` (a path inside the site folder, e.g.
    ``vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so``), the ``package`` as its
    ``.dist-info`` folder spells it and the ``versions`` read; the GPUs it is used
    on: capability ``low`` and up, below ``below`` (None: no end), but ``but``."""

    module: str
    package: str
    versions: tuple[str, ...]
    low: ComputeCapability
    below: ComputeCapability | None
    but: tuple[ComputeCapability, ...]
    source: str
    function: str

    def admits(self, cc: ComputeCapability) -> bool:
        """Whether the package's loader may use the module on ``cc``."""
        if cc < self.low or cc in self.but:
            return False
        return self.below is None or cc < self.below

    @property
    def gpus(self) -> str:
        """The range as text: ``8.0 and up, below 10.0, but 8.6, 8.9``."""
        text = f"{self.low} and up"
        if self.below is not None:
            text += f", below {self.below}"
        if self.but:
            text += ", but " + ", ".join(str(c) for c in self.but)
        return text

    @property
    def cite(self) -> str:
        versions = ", ".join(self.versions)
        return f"data/loaders.yaml: {self.package} {versions}, {self.source}, {self.function}"


def gates_from_data(data: Any, *, source: str, text: str | None = None) -> tuple[Gate, ...]:
    """Validate the table against its schema and convert it."""
    schema.validate(data, "loaders", source=source, text=text)
    return tuple(
        Gate(
            module=e["path"].removeprefix("*/"),
            package=e["package"],
            versions=tuple(e["versions"]),
            low=_cc(e["gpus"]["min"]),
            below=_cc(e["gpus"]["below"]) if "below" in e["gpus"] else None,
            but=tuple(_cc(c) for c in e["gpus"].get("except", ())),
            source=e["source"],
            function=e["function"],
        )
        for e in data["loaders"]
    )


@cache
def load_gates() -> tuple[Gate, ...]:
    """The table shipped with buildmatrix (read once per process)."""
    from buildmatrix.yamlio import load_yaml_text  # PyYAML only when the table is read

    text = package_file("data", "loaders.yaml").read_text(encoding="utf-8")
    return gates_from_data(load_yaml_text(text, source=SOURCE), source=SOURCE, text=text)


def gate_for(path: str, gates: Sequence[Gate], paths: Collection[str]) -> tuple[Gate | None, str]:
    """The gate of the file at ``path`` (relative to the image's root), given every
    path of the image (``paths``), or None with why an entry of its path does not
    apply ("" where no entry names it): the image holds no version that was read."""
    found = ""
    for gate in gates:
        if path != gate.module and not path.endswith("/" + gate.module):
            continue
        site = path[: len(path) - len(gate.module)]
        installed = _installed(site, gate.package, paths)
        if installed & set(gate.versions):
            return gate, ""
        held = ", ".join(sorted(installed)) or "no version (no .dist-info folder)"
        found = (
            f"{path}: {gate.cite} holds for {gate.package} {', '.join(gate.versions)}, "
            f"but the image holds {held}: the file counts on every GPU"
        )
    return None, found


def _installed(site: str, package: str, paths: Collection[str]) -> set[str]:
    """The versions of ``package`` whose ``.dist-info`` folder lies in ``site``."""
    prefix = f"{site}{package}-"
    versions = set()
    for p in paths:
        if p.startswith(prefix):
            folder = p[len(site) :].split("/", 1)[0]
            if folder.endswith(".dist-info"):
                versions.add(folder[len(package) + 1 : -len(".dist-info")])
    return versions
