"""JSON Schema validation of data files, with messages that name file, key and fix."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from buildmatrix.errors import InputError, did_you_mean

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError


@cache
def load_schema(name: str) -> dict[str, Any]:
    """Load a schema shipped in ``buildmatrix/schemas/`` (e.g. ``arch-profile``)."""
    text = resources.files("buildmatrix").joinpath("schemas", f"{name}.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def _key_path(error: ValidationError) -> str:
    parts = [f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path]
    return "".join(parts).lstrip(".")


def _describe(error: ValidationError) -> str:
    key = _key_path(error)
    sub = error.schema if isinstance(error.schema, Mapping) else {}
    where = f"key '{key}'" if key else "top level"
    if error.validator == "additionalProperties":
        allowed = sorted(sub.get("properties", {}))
        instance = error.instance if isinstance(error.instance, dict) else {}
        unknown = sorted(k for k in instance if k not in allowed)
        names = ", ".join(f"'{k}'" for k in unknown)
        hint = did_you_mean(unknown[0], allowed) if unknown else ""
        prefix = f"{where}: unknown key" if key else "unknown key"
        return f"{prefix} {names}.{hint} Allowed keys: {', '.join(allowed)}."
    if error.validator == "required":
        return f"{where}: {error.message}."
    if error.validator == "enum":
        choices = [str(c) for c in sub.get("enum", [])]
        hint = did_you_mean(str(error.instance), choices)
        return f"{where}: {error.instance!r} is not one of {', '.join(choices)}.{hint}"
    if error.validator == "type":
        return f"{where}: expected {error.validator_value}, got {error.instance!r}."
    if error.validator == "pattern":
        expected = sub.get("description", error.validator_value)
        return f"{where}: {error.instance!r} does not have the expected form ({expected})."
    return f"{where}: {error.message}."


def validate(instance: Any, schema_name: str, *, source: str) -> None:
    """Raise :class:`InputError` naming ``source`` for the first schema violation.

    Errors are reported in document order so the user fixes the file top-down.
    """
    import jsonschema  # ~70 ms to import: only when a data file is loaded

    schema = load_schema(schema_name)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(
        validator.iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path]
    )
    if not errors:
        return
    first = jsonschema.exceptions.best_match(errors)
    if first is None:  # unreachable: errors is not empty
        return
    more = f" ({len(errors) - 1} more problem(s) after this one.)" if len(errors) > 1 else ""
    raise InputError(f"{source}: {_describe(first)}{more}")
