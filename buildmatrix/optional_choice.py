"""Per target GPU, what of an image's files counts: the second half of
buildmatrix.optional.

Pure: a :class:`~buildmatrix.optional.Loading` (which files always load, which are
optional and why) and each file's verdict on one GPU in, a :class:`Choice` out: the
files that count there, each sibling group's verdict, and the optional files skipped
there with their evidence (docs/compatibility.md, "Files a package loads only where
they run").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from buildmatrix.arch import ComputeCapability
from buildmatrix.optional import Loading, Rule
from buildmatrix.verdict import RANK, FileJudgement, Verdict


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """An optional file left out on one GPU: its path, why (``reason``), by ``rule``."""

    path: str
    reason: str
    rule: Rule

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason, "rule": self.rule.name.lower()}


@dataclass(frozen=True, kw_only=True)
class Choice:
    """What counts on one GPU: the files that always load (``counted``), each
    sibling group's verdict (``groups``: its pattern and best member's verdict, or
    none with the reason), the optional files skipped there, and the verdict the
    optional files give where nothing that always loads holds device code
    (``fallback``: None where something does)."""

    counted: tuple[str, ...]
    groups: tuple[tuple[str, Verdict, str], ...] = ()
    skipped: tuple[Skipped, ...] = ()
    fallback: tuple[Verdict, tuple[str, ...]] | None = None


def choose(loading: Loading, judged: Mapping[str, FileJudgement], cc: ComputeCapability) -> Choice:
    """The two levels on ``cc``, from each file's verdict there (``judged``, by path:
    every file of the image with device code but static archives)."""

    def effective(path: str) -> tuple[Verdict, str]:
        """A file's verdict with the files loaded with it alone (Loading.deps)."""
        for dep in loading.deps.get(path, ()):
            if judged[dep].verdict is Verdict.NONE:
                return Verdict.NONE, f"it loads {dep}, which has no code for {cc}"
        j = judged[path]
        verdicts = [j.verdict, *(judged[d].verdict for d in loading.deps.get(path, ()))]
        return min(verdicts, key=RANK.__getitem__), loading.holds.get(path, "")

    # rule (e): on the GPUs its package's loader uses it on, a gated file counts
    counted = tuple(
        p
        for p in judged
        if loading.required(p) or (p in loading.gates and loading.gates[p].admits(cc))
    )
    skipped: list[Skipped] = []
    groups: list[tuple[str, Verdict, str]] = []
    for g in loading.groups:
        got = {m: effective(m) for m in g.members}
        names = ", ".join(g.members)
        pool = g.members if g.loads is None else g.loads
        if not pool:
            groups.append((g.pattern, Verdict.NONE, f"of the sibling files {names}, {g.chose}"))
            continue
        # any member a release the image shows picks may load: the worst counts
        best = (max if g.loads is None else min)(pool, key=lambda m: RANK[got[m][0]])
        if got[best][0] is not Verdict.NONE:
            groups.append((g.pattern, got[best][0], f"{best} (one of {names})"))
        elif g.loads is not None:
            why = f"{g.chose}; {best} has no code for {cc}: {got[best][1]}"
            groups.append((g.pattern, Verdict.NONE, why))
        else:
            why = f"none of the sibling files {names} runs on {cc}: " + "; ".join(
                f"{m}: {got[m][1]}" for m in g.members
            )
            groups.append((g.pattern, Verdict.NONE, why))
            continue
        # skipped: the members no release shown picks (the others may load, and keep
        # their runtime's floor), or without such a choice all but the best
        for m in g.members:
            if m not in pool or (g.loads is None and m != best):
                state = got[m][1] if got[m][0] is Verdict.NONE else "runs too"
                why = (
                    f"it differs from {best}, which runs there, only by its {g.tag} tag, "
                    "and the package loads one of them"
                    if g.loads is None
                    else g.chose
                )
                skipped.append(
                    Skipped(
                        path=m,
                        rule=Rule.SIBLING,
                        reason=f"{state} — skipped on {cc} ({Rule.SIBLING}: {why})",
                    )
                )
    runs: list[tuple[Verdict, str]] = []
    # An arch-specific file whose own code runs here loads here, and what it names.
    here = {
        dep
        for path, o in loading.optional.items()
        if o.rule is Rule.SPECIFIC and path in judged and judged[path].verdict is not Verdict.NONE
        for dep in loading.deps.get(path, ())
    }
    for path, o in loading.optional.items():
        if path not in judged or path in counted or path in here:
            continue
        verdict, why = effective(path)
        if verdict is not Verdict.NONE:
            runs.append((verdict, path))
            continue
        if o.rule is Rule.SPECIFIC and judged[path].verdict is not Verdict.NONE:
            # Its own code is for this GPU, so the check that guards it passes here and
            # it loads, with what it names in DT_NEEDED: that file's failure is real.
            groups.append((path, Verdict.NONE, f"{why}, and it runs on {cc}, so it loads"))
            continue
        evidence = "" if o.rule is Rule.SPECIFIC else f": {o.why}"
        skipped.append(
            Skipped(path=path, rule=o.rule, reason=f"{why} — skipped on {cc} ({o.rule}{evidence})")
        )
    fallback: tuple[Verdict, tuple[str, ...]] | None = None
    if not counted and not groups and any(p in judged for p in loading.optional):
        if runs:
            verdict, best = max(runs, key=lambda r: RANK[r[0]])
            fallback = (
                verdict,
                (
                    "the files that always load hold no device code; "
                    f"{len(runs)} optional file(s) run on {cc}, the best counts: {best}",
                    *judged[best].reasons,  # why it runs (natively, or by JIT on this driver)
                ),
            )
        else:  # every optional file counts, and fails: none is skipped
            lines = [f"{s.path}: " + "; ".join(judged[s.path].reasons) for s in skipped[:5]]
            if len(skipped) > 5:
                lines.append(f"and {len(skipped) - 5} more without code for {cc}")
            # What a package compiles at run time from its source (a JIT such as
            # flashinfer's, flashinfer/jit/cpp_ext.py) lies in no file: whether the
            # image can compile it there is not in its device code.
            lines.append(
                f"none of the image's device code runs on {cc}: the files that always "
                f"load hold none, and its {len(skipped)} file(s) with device code are all "
                "optional, for other GPUs; code a package would compile at run time "
                "(JIT from source) is in no file, so check cannot vouch for it"
            )
            fallback, skipped = (Verdict.NONE, tuple(lines)), []
    return Choice(counted=counted, groups=tuple(groups), skipped=tuple(skipped), fallback=fallback)


def skipped_everywhere(per_target: Collection[Collection[Skipped]]) -> frozenset[str]:
    """The files skipped on every target (they set no driver floor for the image)."""
    sets = [frozenset(s.path for s in skips) for skips in per_target]
    return frozenset.intersection(*sets) if sets else frozenset()
