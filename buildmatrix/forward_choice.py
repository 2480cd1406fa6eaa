"""The cuda-compat states a node may run an image in, on a given driver: the
``enable-cuda-compat`` hook's choice (buildmatrix.forward), the legacy runtime's
where it differs (buildmatrix.forward_legacy), and the hook's on the toolkit
releases that leave its folder unused (buildmatrix.forward_conf.older_releases);
``check`` judges the image in each and the worse counts (docs/compatibility.md,
"Forward compatibility")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from buildmatrix.cuda import DriverVersion
from buildmatrix.forward import CompatLibrary, CompatSetup, CompatUse, compat_use
from buildmatrix.forward_legacy import LegacyUse, legacy_use


@dataclass(frozen=True, kw_only=True)
class CompatChoice:
    """``hook``: the hook's choice (None: no library for it); ``legacy``: the legacy
    runtime's where it differs (None: the same); ``undetermined``: why the choice or
    its effect cannot be known (the check then fails)."""

    hook: CompatUse | None
    legacy: CompatUse | None = None
    undetermined: str | None = None
    older: CompatUse | None = None  # the hook's state on releases 1.17.5 to 1.18.0

    @property
    def states(self) -> tuple[CompatUse | None, ...]:
        return (self.hook, *(s for s in (self.legacy, self.older) if s is not None))


def compat_choice(setup: CompatSetup | None, driver: DriverVersion) -> CompatChoice:
    if setup is None:  # no compat folder: nothing to choose, on any driver
        return CompatChoice(hook=None)
    hook = compat_use(setup, driver)
    legacy = legacy_use(setup.legacy, driver) if setup is not None else None
    other = _legacy_state(hook, legacy)
    if other is not None and hook is not None:
        hook = replace(hook, why=f"the enable-cuda-compat hook (CDI mode): {hook.why}")
    unknown = setup.undetermined if setup is not None else None
    unknown = unknown or (hook.undetermined if hook is not None else None)
    if setup is not None and setup.preload is not None:
        # LD_LIBRARY_PATH wins over the cache: only where it leads to the folder the
        # hook puts in use, on both paths, is the file the same.
        folder, why = setup.preload
        same = hook is not None and hook.in_use and other is None and setup.loaded is not None
        if not (same and setup.loaded is not None and folder == setup.loaded.folder):
            unknown = unknown or why
    in_use = any(s is not None and s.in_use for s in (hook, other))
    if setup is not None and setup.node_first is not None and in_use:
        unknown = unknown or setup.node_first
    unknown = unknown or (legacy.undetermined if legacy is not None else None)
    older = None
    if hook is not None and hook.in_use and setup is not None and setup.older is not None:
        why = f"the enable-cuda-compat hook on older toolkit releases: {setup.older}"
        older = CompatUse(library=hook.library, in_use=False, why=why)
    return CompatChoice(hook=hook, legacy=other, undetermined=unknown, older=older)


def _legacy_state(hook: CompatUse | None, legacy: LegacyUse | None) -> CompatUse | None:
    """The legacy runtime's compat state where it differs from the hook's (None: the
    same, or it cannot be known, which ``undetermined`` reports)."""
    used = hook.library.path if hook is not None and hook.in_use else None
    if legacy is None or legacy.undetermined:
        if used is None or hook is None:
            return None
        why = "the legacy runtime (libnvidia-container) finds no compat library to use"
        return CompatUse(library=hook.library, in_use=False, why=why)
    if (legacy.library.path if legacy.library else None) == used:
        return None
    if legacy.library is None:
        return None if hook is None else replace(hook, in_use=False, why=legacy.why)
    return CompatUse(library=legacy.library, in_use=True, why=legacy.why, version=legacy.version)


def compat_json(setup: CompatSetup | None, choice: CompatChoice | None) -> dict[str, Any] | None:
    """``check --json``'s ``forward_compat`` (schemas/check.schema.json)."""
    legacy = choice.legacy if choice is not None else None
    extra = None if legacy is None else {"in_use": legacy.in_use, "why": legacy.why}
    if choice is not None and choice.hook is not None:
        f = choice.hook
        return _library_json(f.library, f.in_use, f.why, version=f.version) | {"legacy": extra}
    if setup is None:
        return None
    if setup.library is None:  # a compat folder the container toolkit would not use
        return {"path": None, "in_use": False, "why": setup.why, "legacy": extra}
    why = "whether a node uses it depends on its driver (--driver or --snapshot)"
    name = setup.library.path.rpartition("/")[2][len("libcuda.so.") :]
    doc = _library_json(setup.library, False, f"{setup.library.describe()}: {why}", name=name)
    return doc | {"legacy": extra}


def _library_json(
    lib: CompatLibrary,
    in_use: bool,
    why: str,
    *,
    version: DriverVersion | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    return {
        "path": "/" + lib.path,
        "driver": str(version) if version else name,
        "cuda": lib.cuda or None,
        "branches": list(lib.branches) if lib.note else None,
        "in_use": in_use,
        "why": why,
    }
