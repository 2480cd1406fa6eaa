"""Kubernetes label syntax: what a key and a value may be, and how to make one valid.

Kubernetes API conventions, "Syntax and character set" (labels): a value is empty
or at most 63 characters of ``[A-Za-z0-9_.-]``, beginning and ending with a letter
or digit; a key is an optional DNS-subdomain prefix and ``/`` plus a name of the
same form as a non-empty value.
"""

from __future__ import annotations

import re

_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?")
_DNS_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_PREFIX = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")
MAX_VALUE = 63


def is_label_value(text: str) -> bool:
    return _VALUE.fullmatch(text) is not None


def is_label_key(text: str) -> bool:
    prefix, _, name = text.rpartition("/")
    if prefix and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        return False
    return bool(name) and is_label_value(name)


def label_value(text: str) -> str:
    """``text`` made a valid label value: other characters become ``-``, at most 63
    characters, letters or digits at both ends (empty when nothing is left)."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:MAX_VALUE]
    return value.strip("-_.")
