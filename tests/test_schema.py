"""buildmatrix/schema.py: the shipped data files are validated here, once, and their
digests recorded in buildmatrix/data/validated.txt; at run time a recorded text is not
validated again, and any other text (a shipped file edited by one byte included) is.

``BUILDMATRIX_UPDATE_GOLDEN=1 pytest tests/test_schema.py`` rewrites the record after
validating every shipped file (and refuses to record one that fails); review the diff.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from buildmatrix import schema
from buildmatrix.cuda import facts_from_text
from buildmatrix.errors import InputError
from buildmatrix.loaders import gates_from_data
from buildmatrix.profile_files import load_profiles
from buildmatrix.yamlio import load_yaml_text
from tests.conftest import REPO, SHIPPED_PROFILES

UPDATE = os.environ.get("BUILDMATRIX_UPDATE_GOLDEN") == "1"
RECORD = REPO / "buildmatrix" / "data" / schema.RECORD
CUDA_FACTS = REPO / "buildmatrix" / "data" / "cuda.yaml"
LOADERS = REPO / "buildmatrix" / "data" / "loaders.yaml"
HEADER = """\
# SHA-256 digests (buildmatrix/schema.py, text_digest: the schema's name, the schema's
# text, the file's text) of the data files buildmatrix ships, each validated against its
# schema by tests/test_schema.py, which writes this file: a text listed here is not
# validated again at run time; any other text is (docs/development.md, "Start-up time").
# Regenerate: BUILDMATRIX_UPDATE_GOLDEN=1 pytest tests/test_schema.py
"""


def _shipped() -> list[tuple[Path, str]]:
    """Every data file buildmatrix ships, with the schema its loader holds it to."""
    return [(CUDA_FACTS, "cuda-facts"), (LOADERS, "loaders")] + [
        (path, "arch-profile") for path in sorted(SHIPPED_PROFILES.glob("*.yaml"))
    ]


def _oracle(path: Path, schema_name: str) -> None:
    """jsonschema itself, on the schema file as it lies in the tree (not buildmatrix's
    loader or messages)."""
    doc = json.loads((REPO / "buildmatrix" / "schemas" / f"{schema_name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    jsonschema.validate(yaml.safe_load(path.read_text()), doc, cls=jsonschema.Draft202012Validator)


def test_record_is_the_shipped_files() -> None:
    lines = []
    for path, schema_name in _shipped():
        _oracle(path, schema_name)  # a file that fails is never recorded
        digest = schema.text_digest(path.read_text(encoding="utf-8"), schema_name)
        lines.append(f"{digest}  {schema_name}  {path.relative_to(REPO)}\n")
    want = HEADER + "".join(lines)
    if UPDATE:
        RECORD.write_text(want)
    assert RECORD.read_text() == want, (
        f"{RECORD.relative_to(REPO)} is not the digests of the shipped files as they are; "
        "BUILDMATRIX_UPDATE_GOLDEN=1 pytest tests/test_schema.py rewrites it"
    )
    assert schema.recorded_digests() == {line.split()[0] for line in lines}


@pytest.mark.parametrize(
    ("path", "schema_name"), _shipped(), ids=lambda v: v.name if isinstance(v, Path) else ""
)
def test_an_edited_shipped_file_is_validated(tmp_path: Path, path: Path, schema_name: str) -> None:
    """The same file with a key its schema refuses, read by the loader users run: the
    schema's message, as for any file (a skip keyed by name or path would pass it)."""
    edited = path.read_text(encoding="utf-8") + "zz_unknown: 1\n"
    with pytest.raises(InputError, match=r"unknown key 'zz_unknown'\. Allowed keys: "):
        if schema_name == "cuda-facts":
            facts_from_text(edited, source="cuda.yaml")
        elif schema_name == "loaders":
            gates_from_data(load_yaml_text(edited, source="loaders.yaml"), source="loaders.yaml")
        else:
            folder = tmp_path / "profiles"
            shutil.copytree(SHIPPED_PROFILES, folder)
            (folder / path.name).write_text(edited)
            load_profiles(folder)


@pytest.mark.parametrize(
    ("path", "schema_name"), _shipped()[:3], ids=["cuda", "loaders", "profile"]
)
def test_a_recorded_digest_vouches_for_its_text_and_schema_only(
    path: Path, schema_name: str
) -> None:
    text = path.read_text(encoding="utf-8")
    recorded = schema.recorded_digests()
    assert schema.text_digest(text, schema_name) in recorded
    other = "arch-profile" if schema_name == "cuda-facts" else "cuda-facts"
    assert schema.text_digest(text, other) not in recorded
    for edit in (text + "\n", text.replace(":", ": ", 1), text[:-1]):
        assert schema.text_digest(edit, schema_name) not in recorded


def test_a_recorded_text_is_not_validated_again() -> None:
    """In a fresh process, reading the shipped facts, loader gates and profiles never imports
    jsonschema (the time this saves: docs/development.md, "Start-up time"), and a
    user's file (a snapshot) still is validated."""
    code = (
        "import sys\n"
        "from buildmatrix.cuda import load_cuda_facts\n"
        "from buildmatrix.profile_files import default_profiles_dir, load_profiles\n"
        "from buildmatrix.loaders import load_gates\n"
        "load_cuda_facts(); load_profiles(default_profiles_dir()); load_gates()\n"
        "print('jsonschema' in sys.modules)\n"
        "from pathlib import Path\n"
        "from buildmatrix.snapshot import load_snapshot\n"
        f"load_snapshot(Path({str(REPO / 'tests/fixtures/nodes/a40.json')!r}))\n"
        "print('jsonschema' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "True"]
