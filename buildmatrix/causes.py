"""check's failure lines grouped by cause for the text report (the JSON keeps them all)."""

from __future__ import annotations

import re
from collections.abc import Sequence


def group_by_cause(problems: list[str], targets: Sequence[tuple[str, str, str]]) -> list[str]:
    """Failure lines of several targets with one cause as one line naming them all.

    ``targets``: (name, sm, compute capability) of each judged target. A line
    'NAME (SM): CAUSE' counts as the same cause as another target's where the two differ
    only in the target's own SM and compute capability ('sm_80 SASS runs only on 8.x,
    not 10.0' and '..., not 12.0'); the merged line lists those as 10.0/12.0. Lines of
    no target, and causes of one target, stay as they are, in first-seen order.
    """
    sm_mark, cc_mark = "\0sm\0", "\0cc\0"
    groups: dict[str, list[tuple[str, str, str]]] = {}
    first: dict[str, str] = {}
    for problem in problems:
        who = next((x for x in targets if problem.startswith(f"{x[0]} ({x[1]}): ")), None)
        key = problem
        if who is not None:
            key = problem.removeprefix(f"{who[0]} ({who[1]}): ")
            key = re.sub(rf"\b{re.escape(who[1])}\b", sm_mark, key)
            key = re.sub(rf"(?<![\d.]){re.escape(who[2])}(?![\d.])", cc_mark, key)
        groups.setdefault(key, [])
        first.setdefault(key, problem)
        if who is not None:
            groups[key].append(who)
    lines = []
    for key, members in groups.items():
        if len(members) < 2:
            lines.append(first[key])
            continue
        names = dict.fromkeys(name for name, _, _ in members)
        label = ", ".join(f"{n} ({', '.join(sm for m, sm, _ in members if m == n)})" for n in names)
        cause = key.replace(sm_mark, "/".join(sm for _, sm, _ in members))
        cause = cause.replace(cc_mark, "/".join(cc for _, _, cc in members))
        lines.append(f"{label}: {cause}")
    return lines
