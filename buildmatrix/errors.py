"""One error hierarchy; each class carries the exit code of the CLI contract.

Inner code only raises; ``cli.main`` catches once, prints the message and exits
with ``exit_code`` (the exit codes of README.md, section Commands). A check that ran
and said no (incompatible image, rejected node, out-of-date files) is no error: its
command prints what failed and returns 1.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class BuildmatrixError(Exception):
    """Base class. ``str(err)`` is the one-paragraph message shown to the user."""

    exit_code: int = 2


class InputError(BuildmatrixError):
    """Bad input or usage: invalid YAML, unknown SM, malformed file, bad reference."""

    exit_code = 2


class EnvironmentUnavailable(BuildmatrixError):
    """Something outside is missing: Docker engine, registry, NVML, driver."""

    exit_code = 3


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ' Did you mean 'x'?' for the closest choice, or '' when none is close."""
    by_folded = {c.lower(): c for c in choices}  # 'FP8' and 'Hopper' find 'fp8', 'hopper'
    matches = difflib.get_close_matches(word.lower(), list(by_folded), n=1, cutoff=0.6)
    if not matches or by_folded[matches[0]] == word:
        return ""
    return f" Did you mean '{by_folded[matches[0]]}'?"
