"""PyYAML wrapped once: the C loader when present, duplicate keys refused, and
every error turned into an :class:`InputError` that names the file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from buildmatrix.errors import InputError

_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_Base):  # type: ignore[valid-type,misc]
    """SafeLoader that refuses a mapping with the same key twice.

    PyYAML silently keeps the last value, so a profile with two ``min_driver``
    lines would lose one without a word.
    """


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first written at line {seen[key]}); keep one",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_text(text: str, *, source: str) -> Any:
    """Parse YAML text; ``source`` names it in error messages."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        where = f" at line {exc.problem_mark.line + 1}" if exc.problem_mark else ""
        problem = exc.problem or str(exc)
        raise InputError(f"{source}: not valid YAML{where}: {problem}.") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not valid YAML: {exc}.") from None


def read_yaml_file(path: Path) -> str:
    """The text of one YAML file; unreadable or non-UTF-8 files are input errors."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a UTF-8 text file; expected YAML.") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}.") from None


def load_yaml_file(path: Path) -> Any:
    """Read and parse one YAML file; unreadable or non-UTF-8 files are input errors."""
    return load_yaml_text(read_yaml_file(path), source=str(path))
