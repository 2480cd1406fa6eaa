"""``buildmatrix drivers`` output: JSON, text, Markdown and one self-contained HTML
page (docs/drivers.md). Pure: policies in, a string or a JSON document out.

The matrix is pools x images. A cell is the worst verdict of the image over the
pool's GPU models at the driver judged (the proposed one, else the pool's floor):
``fails`` beats ``jit`` beats ``native``. Images a pool does not list are judged too,
shown muted: they tell where else an image would run, and never fail the command.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from buildmatrix.drivers import Cell, Floor, PoolPolicy, State, fleet_passed

_RANK = {State.FAILS: 0, State.JIT: 1, State.NATIVE: 2}
_WORD = {State.NATIVE: "native", State.JIT: "JIT only", State.FAILS: "fails"}
_MARK = {State.NATIVE: "✅", State.JIT: "🟡", State.FAILS: "❌"}
# In the page: signs every font has (DejaVu, Liberation), as emoji may have none.
_SIGN = {State.NATIVE: "✓", State.JIT: "≈", State.FAILS: "✗"}


def short(ref: str) -> str:
    """A column heading for an image: its last path part (``train:1.4.0-cu128``,
    ``multi.tar``); the whole reference is the heading's hover text."""
    return ref.rstrip("/").rsplit("/", 1)[-1] or ref


def images_of(policies: Sequence[PoolPolicy]) -> list[str]:
    """Every image of the fleet once, in the order the pools list them."""
    return list(dict.fromkeys(c.image for p in policies for c in p.cells))


def worst(cells: Sequence[Cell]) -> State | None:
    return min((c.state for c in cells), key=_RANK.__getitem__, default=None)


def _of(cells: Sequence[Cell], image: str) -> list[Cell]:
    return [c for c in cells if c.image == image]


def _floor_json(f: Floor) -> dict[str, Any]:
    return {"driver": str(f.driver) if f.driver else None, "set_by": f.subject, "why": list(f.why)}


def _cell_json(c: Cell, base: Cell) -> dict[str, Any]:
    return {
        "image": c.image,
        "model": c.model,
        "own": c.own,
        "driver": str(c.driver),
        "state": c.state.value,
        "at_floor": base.state.value,
        "reasons": list(c.reasons),
    }


def to_json(policies: Sequence[PoolPolicy]) -> dict[str, Any]:
    """The ``--format json`` document (without ``version``, which echo_json adds)."""
    pools = []
    for p in policies:
        pools.append(
            {
                "name": p.name,
                "models": [
                    {
                        "product": m.product,
                        "sm": m.profile.sm,
                        "family": m.profile.family.value,
                        "hardware_floor": str(m.hardware_floor),
                    }
                    for m in p.models
                ],
                "images": list(p.images),
                "floor": _floor_json(p.floor),
                "set_by": [_floor_json(f) for f in p.setters],
                "floors": [_floor_json(f) for f in p.floors],
                "proposed": str(p.proposed) if p.proposed else None,
                "judged_at": str(p.judged_at) if p.judged_at else None,
                "current": str(p.current) if p.current else None,
                "cells": [_cell_json(c, b) for c, b in zip(p.cells, p.baseline, strict=True)],
                "hardware": [
                    {"model": h.model, "ok": h.state is not State.FAILS, "reasons": list(h.reasons)}
                    for h in p.hardware
                ],
                "breaks": [{"image": c.image or None, "model": c.model} for c in p.breaks],
                "verdict": "pass" if p.passed else "fail",
            }
        )
    return {"pools": pools, "verdict": "pass" if fleet_passed(policies) else "fail"}


def _floor_text(p: PoolPolicy) -> str:
    if p.floor.driver is None:
        if not p.models:
            return "no GPU model of the profiles falls in this pool"
        return f"none: no driver admits {p.floor.subject}: {'; '.join(p.floor.why)}"
    names = [f.subject for f in p.setters]
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"{p.floor.driver}, set by {'; '.join(names[:3])}{more}"


@dataclass(frozen=True, kw_only=True)
class Change:
    """One image whose verdict the proposed driver changes on some of a pool's models."""

    image: str
    before: State
    after: State
    driver: str
    models: tuple[str, ...]
    reason: str

    def on(self) -> str:
        more = f" and {len(self.models) - 2} more" if len(self.models) > 2 else ""
        return ", ".join(self.models[:2]) + more


def changes_of(p: PoolPolicy) -> list[Change]:
    """The pool's changes grouped by image and by (before, after)."""
    groups: dict[tuple[str, State, State], list[Cell]] = {}
    for b, c in p.changes:
        groups.setdefault((c.image, b.state, c.state), []).append(c)
    return [
        Change(
            image=image,
            before=before,
            after=after,
            driver=str(cells[0].driver),
            models=tuple(c.model for c in cells),
            reason=cells[0].reasons[0] if cells[0].reasons else "",
        )
        for (image, before, after), cells in groups.items()
    ]


def _whys(p: PoolPolicy, n: int = 3) -> list[str]:
    """What fails just below the pool's floor: the first ``n`` distinct reasons."""
    return list(dict.fromkeys(w for f in p.setters for w in f.why))[:n]


_COMPARED = (
    "Each pool is compared with its current driver where the pools file states it "
    "(pools.<name>.driver), else with its floor."
)


def to_text(policies: Sequence[PoolPolicy]) -> str:
    lines: list[str] = []
    for p in policies:
        lines.append(f"pool {p.name}")
        lines.append(f"  GPUs:   {', '.join(m.product for m in p.models) or '(none)'}")
        lines.append(f"  images: {', '.join(p.images) or '(none)'}")
        lines.append(f"  floor:  {_floor_text(p)}")
        lines += [f"          below it: {why}" for why in _whys(p)]
        if p.judged_at is not None:
            at = "proposed" if p.proposed else "current" if p.current else "floor"
            lines.append(f"  at driver {p.judged_at} ({at}):")
            for image in dict.fromkeys(c.image for c in p.cells):
                cells = _of(p.cells, image)
                state = worst(cells)
                own = "" if cells[0].own else "  (not one of the pool's images)"
                lines.append(f"    {_WORD[state] if state else '-':9} {image}{own}")
        for h in p.hardware:
            if h.state is State.FAILS:
                lines.append(f"    fails     {h.model}: {'; '.join(h.reasons)}")
        for ch in changes_of(p):
            lines.append(
                f"  change: {ch.image} on {ch.on()}: {_WORD[ch.before]} at {p.baseline_at} "
                f"-> {_WORD[ch.after]} at {ch.driver}"
            )
        lines.append(f"  verdict: {'pass' if p.passed else 'FAIL'}")
    lines.append(f"fleet: {'pass' if fleet_passed(policies) else 'FAIL'}")
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(policies: Sequence[PoolPolicy]) -> str:
    """The report for ``$GITHUB_STEP_SUMMARY``: the matrix, the floors, the changes."""
    images = images_of(policies)
    verdict = "pass" if fleet_passed(policies) else "**fail**"
    out = [f"## GPU driver policy: {verdict}", ""]
    out.append("| pool | driver | floor | " + " | ".join(f"`{_md(i)}`" for i in images) + " |")
    out.append("|---|---|---|" + "---|" * len(images))
    for p in policies:
        row = [f"**{_md(p.name)}**", str(p.judged_at or "-"), str(p.floor.driver or "none")]
        for image in images:
            cells = _of(p.cells, image)
            state = worst(cells)
            text = f"{_MARK[state]} {_WORD[state]}" if state else "-"
            row.append(text if cells and cells[0].own else f"<sub>{text}</sub>")
        out.append("| " + " | ".join(row) + " |")
    out += ["", "✅ native · 🟡 JIT only · ❌ fails; small: not one of the pool's images.", ""]
    out.append("### Floors")
    for p in policies:
        why = "; ".join(_whys(p, 2))
        out.append(
            f"- **{_md(p.name)}**: {_md(_floor_text(p))}" + (f" ({_md(why)})" if why else "")
        )
    changes = [(p, ch) for p in policies for ch in changes_of(p)]
    if changes:
        out += ["", "### What the proposed drivers change", "", _COMPARED]
        for p, ch in changes:
            out.append(
                f"- {_md(p.name)}: `{_md(ch.image)}` on {_md(ch.on())}: {_WORD[ch.before]} at "
                f"{p.baseline_at} → **{_WORD[ch.after]}** at {ch.driver}"
                + (f" ({_md(ch.reason)})" if ch.reason else "")
            )
    return "\n".join(out) + "\n"


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d232a;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
table{border-collapse:collapse}th,td{border:1px solid #d0d7de;padding:6px 10px;text-align:left}
th{background:#f3f5f7;font-weight:600}small{font-weight:400;color:#57606a}td.cell{text-align:center;min-width:110px}
.native{background:#d9f2dd}.jit{background:#fff1c2}.fails{background:#ffd6d3;font-weight:600}
.other{opacity:.45}.changed{outline:3px solid #7a3cff;outline-offset:-3px}
.pass{color:#1a7f37}.fail{color:#cf222e}code{font-size:12px}
ul{margin:4px 0 0 18px;padding:0}.legend span{display:inline-block;padding:2px 8px;margin-right:6px}
"""


def _html_cell(p: PoolPolicy, image: str) -> str:
    cells = _of(p.cells, image)
    state = worst(cells)
    if state is None:
        return '<td class="cell">-</td>'
    before = worst(_of(p.baseline, image))
    hover = "\n".join(
        f"{c.model} at {c.driver}: {_WORD[c.state]}: {'; '.join(c.reasons[:2])}" for c in cells
    )
    changed = before is not state
    classes = [state.value] + ([] if cells[0].own else ["other"]) + (["changed"] if changed else [])
    return (
        f'<td class="cell {" ".join(classes)}" data-pool="{html.escape(p.name)}" '
        f'data-image="{html.escape(image)}" data-state="{state.value}" '
        f'title="{html.escape(hover)}">{_SIGN[state]} {_WORD[state]}</td>'
    )


def _html_rows(policies: Sequence[PoolPolicy], images: Sequence[str]) -> str:
    e = html.escape
    rows = []
    for p in policies:
        verdict = "pass" if p.passed else "fail"
        names = [m.product for m in p.models]
        more = f" +{len(names) - 3} more" if len(names) > 3 else ""
        models = ", ".join(names[:3]) + more
        mark = " (proposed)" if p.proposed else " (current)" if p.current else ""
        at = f"{p.judged_at or '-'}{mark}"
        rows.append(
            f'<tr data-pool="{e(p.name)}"><th title="{e(", ".join(names))}">{e(p.name)}<br>'
            f"<small>{e(models)}</small></th>"
            f"<td>{e(at)}</td><td>{e(str(p.floor.driver or 'none'))}</td>"
            f'<td class="{verdict}">{verdict}</td>'
            + "".join(_html_cell(p, i) for i in images)
            + "</tr>"
        )
    return "\n".join(rows)


def _html_lists(policies: Sequence[PoolPolicy]) -> tuple[str, str, str]:
    """The floors, the changes and the GPUs below their hardware floor, as <li> items."""
    e = html.escape
    floors = "".join(
        f"<li><b>{e(p.name)}</b>: {e(_floor_text(p))}<ul>"
        + "".join(f"<li>{e(w)}</li>" for w in _whys(p))
        + "</ul></li>"
        for p in policies
    )
    changes = "".join(
        f"<li><b>{e(p.name)}</b>: <code>{e(ch.image)}</code> on {e(ch.on())}: "
        f"{_WORD[ch.before]} at {e(p.baseline_at)} → <b>{_WORD[ch.after]}</b> at "
        f"{e(ch.driver)}<ul><li>{e(ch.reason)}</li></ul></li>"
        for p in policies
        for ch in changes_of(p)
    )
    if not changes:
        # no verdict changes: say so, and name the pools that fail all the same
        failing = [p.name for p in policies if not p.passed]
        changes = (
            "<li>no verdict changes"
            + (f"; still failing: {e(', '.join(failing))}" if failing else "")
            + "</li>"
        )
    hardware = "".join(
        f"<li><b>{e(p.name)}</b>: {e(h.model)}: {e('; '.join(h.reasons))}</li>"
        for p in policies
        for h in p.hardware
        if h.state is State.FAILS
    )
    return floors, changes, hardware or "<li>none</li>"


_LEGEND = (
    '<p class="legend"><span class="native">✓ native</span><span class="jit">≈ JIT only'
    '</span><span class="fails">✗ fails</span><span class="other">faded: not one of the '
    'pool\'s images</span><span class="changed">outlined: changed by the proposed driver'
    "</span> Hover a cell for each GPU's verdict and reason.</p>"
)


def to_html(policies: Sequence[PoolPolicy]) -> str:
    """One self-contained page: inline CSS, no script, no network."""
    images = images_of(policies)
    verdict = "pass" if fleet_passed(policies) else "fail"
    head = "".join(
        f'<th title="{html.escape(i)}"><code>{html.escape(short(i))}</code></th>' for i in images
    )
    floors, changes, hardware = _html_lists(policies)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>GPU driver policy</title><style>{_CSS}</style></head><body>\n"
        f'<h1>GPU driver policy: <span class="{verdict}">{verdict}</span></h1>\n{_LEGEND}\n'
        '<table id="matrix"><tr><th>pool</th><th>driver</th><th>floor</th><th>verdict</th>'
        f"{head}</tr>\n{_html_rows(policies, images)}</table>\n"
        f'<h2>Floors</h2><ul id="floors">{floors}</ul>\n'
        f"<h2>What the proposed drivers change</h2><p>{html.escape(_COMPARED)}</p>"
        f'<ul id="changes">{changes}'
        "</ul>\n"
        f'<h2>GPUs below their hardware floor</h2><ul id="hardware">{hardware}</ul>\n'
        "</body></html>\n"
    )
