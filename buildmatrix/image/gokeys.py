"""JSON object keys held to Go's ``encoding/json``, which the engine, containerd and the
container runtime read image documents with.

Go matches an object's keys to a struct's fields "preferring an exact match but also
accepting a case-insensitive match" (``encoding/json`` ``Unmarshal``; with Unicode
folding, so U+017F, the long s, matches ``s`` and U+212A, the Kelvin sign, ``k``),
and a later key overwrites an earlier one. Python's ``json`` keeps every spelling
as its own key and buildmatrix reads the exact one. So ``{"Layers": [A], "layers":
[B]}`` in a ``docker save`` manifest is layer B to ``docker load`` and layer A to a
reader going by exact name, and ``{"config": {"env": [...]}}`` sets the container's
environment in Go only. Each such document hid an sm_80 library from ``check``
(tests/test_go_json.py, with ``docker load`` + ``docker export`` as the oracle).

The rule, per object of a known Go struct (the shapes below, from the structs the
readers unmarshal into): a key that Go could match to a field must be the field's
own name, alone. Keys that match no field are ignored, as Go ignores them; map
fields (``Labels``, ``annotations``, ``LayerSources``) are not structs and are not
looked into.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from buildmatrix.errors import InputError

# struct -> (its fields as the JSON tags spell them, the fields that hold structs:
# field -> struct, or [struct] for a list of them)
_Shape = tuple[tuple[str, ...], Mapping[str, str | list[str]]]
SHAPES: dict[str, _Shape] = {
    # opencontainers/image-spec specs-go/v1 descriptor.go, Descriptor and Platform
    "descriptor": (
        ("mediaType", "digest", "size", "urls", "annotations", "data", "platform", "artifactType"),
        {"platform": "platform"},
    ),
    "platform": (("architecture", "os", "os.version", "os.features", "variant"), {}),
    # manifest.go Manifest and index.go Index (containerd reads either through one
    # struct of both: core/images/image.go, unknownDocument / validateMediaType)
    "manifest": (
        (
            "schemaVersion",
            "mediaType",
            "artifactType",
            "config",
            "layers",
            "manifests",
            "subject",
            "annotations",
        ),
        {
            "config": "descriptor",
            "layers": ["descriptor"],
            "manifests": ["descriptor"],
            "subject": "descriptor",
        },
    ),
    # config.go Image (and moby image/image.go V1Image/Image, which add the v1 fields)
    "config": (
        (
            "created",
            "author",
            "architecture",
            "variant",
            "os",
            "os.version",
            "os.features",
            "config",
            "rootfs",
            "history",
            "id",
            "parent",
            "comment",
            "container",
            "container_config",
            "docker_version",
            "Size",
        ),
        {"config": "runconfig", "container_config": "runconfig", "rootfs": "rootfs"},
    ),
    # config.go ImageConfig; moby api/types/container Config (no JSON tags: Go names)
    "runconfig": (
        (
            "User",
            "ExposedPorts",
            "Env",
            "Entrypoint",
            "Cmd",
            "Volumes",
            "WorkingDir",
            "Labels",
            "StopSignal",
            "ArgsEscaped",
            "Healthcheck",
            "OnBuild",
            "Shell",
            "Hostname",
            "Domainname",
            "Image",
            "StopTimeout",
        ),
        {},
    ),
    "rootfs": (("type", "diff_ids"), {}),
    # moby image/tarexport/tarexport.go manifestItem (a docker save manifest.json entry)
    "saveentry": (("Config", "RepoTags", "Layers", "Parent", "LayerSources"), {}),
}


def check_keys(doc: Any, *, shape: str, name: str) -> None:
    """Refuse ``doc`` (a document of ``shape``, or a list of them) where Go's
    ``encoding/json`` could read a field from another key than Python does, or any
    string of it otherwise (:func:`check_strings`)."""
    check_strings(doc, name=name)
    stack: list[tuple[Any, str, str]] = [(doc, shape, "")]
    while stack:
        value, kind, where = stack.pop()
        if isinstance(value, list):
            stack.extend((v, kind, f"{where}[{i}]") for i, v in enumerate(value))
            continue
        if not isinstance(value, dict):
            continue
        fields, nested = SHAPES[kind]
        for field in fields:
            spellings = [k for k in value if _may_match(k, field)]
            if spellings and spellings != [field]:
                _refuse(name, f"{where}.{field}".lstrip("."), spellings)
        for field, inner in nested.items():
            if field in value:
                inner_kind = inner[0] if isinstance(inner, list) else inner
                stack.append((value[field], inner_kind, f"{where}.{field}"))


def loads(data: bytes, *, name: str) -> Any:
    """``json.loads``, but an object with a key twice is refused: Go's ``encoding/json``
    decodes a repeated object-valued field into the value it already holds (two
    ``"config"`` objects merge: ``Env`` from the first, ``Labels`` from the second),
    Python's keeps only the last."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise InputError(
                    f"{name}: the key {key!r} appears twice in one object; Go's "
                    "encoding/json (the engine, containerd) merges the two values, "
                    "Python's reader keeps the last. The document is refused."
                )
            out[key] = value
        return out

    try:
        return json.loads(data, object_pairs_hook=unique)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{name}: not valid JSON ({exc}).") from None
    except RecursionError:
        # Python's decoder recurses per level (about a thousand); no image document
        # nests past a handful
        raise InputError(
            f"{name}: JSON nested deeper than Python's reader follows; refused."
        ) from None


def check_strings(doc: Any, *, name: str) -> None:
    """Refuse a document with a lone UTF-16 surrogate escape in any string or key
    (``"\\udc80"``): Go's decoder reads it as U+FFFD (``encoding/json`` decode.go,
    ``unquoteBytes``), Python's keeps the surrogate, and tarfile reads a member name
    with the byte 0x80 as that same surrogate (``surrogateescape``): the two readers
    would open different members of a ``docker save`` archive. A valid pair is one
    character to both."""
    stack = [doc]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str) and _SURROGATE.search(value):
            raise InputError(
                f"{name}: the string {value!r} holds a lone UTF-16 surrogate escape, which "
                "Go's encoding/json (the engine, containerd) reads as U+FFFD and Python's "
                "keeps; the two would read different names. The document is refused."
            )


_SURROGATE = re.compile("[\ud800-\udfff]")


def _may_match(key: str, field: str) -> bool:
    """Whether Go could match ``key`` to ``field`` (ASCII): equal but for ASCII case,
    a non-ASCII character counting as any letter (Unicode folding maps some to ASCII
    letters: U+017F, U+212A, U+0131, U+0130), the same number of characters."""
    if len(key) != len(field):
        return False
    return all(
        k == f or (k.isascii() and k.upper() == f.upper()) or (not k.isascii() and f.isalpha())
        for k, f in zip(key, field, strict=True)
    )


def _refuse(name: str, field: str, spellings: list[str]) -> NoReturn:
    given = ", ".join(f"'{s}'" for s in spellings)
    raise InputError(
        f"{name}: the key(s) {given} for '{field}': Go's encoding/json (the engine, "
        "containerd) matches keys to fields without regard to case and takes the last, "
        "Python's reader the exact one, so the two would read different values. The "
        "document is refused; write each field once, spelt as the spec spells it."
    )
