"""JSON Schema validation of data files, with messages that name file, key and fix.

The data files buildmatrix ships (``buildmatrix/data/cuda.yaml``, the arch profiles)
are validated by the tests, and their digests recorded in
``buildmatrix/data/validated.txt``; a text whose digest is recorded there is not
validated again at run time, which spares each command the import of jsonschema
(docs/development.md, "Start-up time"). Any other text, a shipped file edited by one
byte included, is validated as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from buildmatrix import package_file
from buildmatrix.errors import InputError, did_you_mean

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator


RECORD = "validated.txt"  # in buildmatrix/data/


@cache
def schema_text(name: str) -> str:
    """The text of a schema shipped in ``buildmatrix/schemas/`` (e.g. ``arch-profile``)."""
    return package_file("schemas", f"{name}.schema.json").read_text(encoding="utf-8")


@cache
def load_schema(name: str) -> dict[str, Any]:
    """Load a schema shipped in ``buildmatrix/schemas/`` (e.g. ``arch-profile``)."""
    schema: dict[str, Any] = json.loads(schema_text(name))
    return schema


def text_digest(text: str, schema_name: str) -> str:
    """SHA-256 over the schema's name, the schema's text and the data file's text, each
    prefixed by its length: a recorded digest vouches for this text against this
    schema only, and an edit of either is a new digest."""
    import hashlib  # its OpenSSL binding only where a data file is read

    digest = hashlib.sha256()
    for part in (schema_name, schema_text(schema_name), text):
        data = part.encode()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


@cache
def recorded_digests() -> frozenset[str]:
    """The digests in ``buildmatrix/data/validated.txt`` (first word of each line that
    is not a comment), written by the tests after validating each shipped file
    (tests/test_schema.py, ``test_record_is_the_shipped_files``)."""
    text = package_file("data", RECORD).read_text(encoding="utf-8")
    return frozenset(
        line.split()[0] for line in text.splitlines() if line.strip() and not line.startswith("#")
    )


@cache
def _validator(schema_name: str) -> Validator:
    """One validator per schema per process."""
    import jsonschema  # ~70 ms to import: only when a data file is validated

    return jsonschema.Draft202012Validator(load_schema(schema_name))


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
        hint = ""
        number = isinstance(error.instance, int | float) and not isinstance(error.instance, bool)
        if number and "string" in str(error.validator_value):
            # YAML reads 12.8 as a number, and 12.10 as 12.1: the text is lost
            hint = (
                f" YAML reads {error.instance!r} as a number: quote it as text, "
                f'"{error.instance}" (a bare 12.10 would already have become 12.1).'
            )
        return f"{where}: expected {error.validator_value}, got {error.instance!r}.{hint}"
    if error.validator == "pattern":
        expected = sub.get("description", error.validator_value)
        return f"{where}: {error.instance!r} does not have the expected form ({expected})."
    return f"{where}: {error.message}."


def validate(instance: Any, schema_name: str, *, source: str, text: str | None = None) -> None:
    """Raise :class:`InputError` naming ``source`` for the first schema violation.

    Errors are reported in document order so the user fixes the file top-down.
    ``text``: the file's text that ``instance`` was parsed from, where the caller has
    it; a text whose digest the tests recorded (:func:`recorded_digests`) is a shipped
    file they validated, and is not validated again.
    """
    if text is not None and text_digest(text, schema_name) in recorded_digests():
        return
    import jsonschema

    validator = _validator(schema_name)
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
