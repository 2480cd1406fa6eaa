"""``check --attest FILE``: an in-toto Statement v1 of the verdicts.

The Statement's layout is held to the in-toto attestation spec (``spec/v1/
statement.md``: ``_type``, ``subject`` ResourceDescriptors with a ``digest`` map,
``predicateType``, ``predicate``), its predicate to the shipped JSON Schema, and its
content to what ``check --json`` says of the same run (subject digests, verdicts) and
to NVIDIA's tables (the CUDA 13.x runtime's driver floor, CUDA Compatibility guide,
"Minor Version Compatibility": 580.65.06 on Linux; Hopper's hardware floor: the
profile's min_driver).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, CliRunner, validate
from tests.images import Image, fixture, write_oci_layout, write_platform_layout

pytestmark = pytest.mark.integration  # nvcc-built fixtures in real OCI layouts
PREDICATE_SCHEMA = json.loads(
    (REPO / "buildmatrix/schemas/check-predicate.schema.json").read_text()
)
# in-toto attestation spec/v1/statement.md and resource_descriptor.md, as a schema
STATEMENT_SCHEMA = {
    "type": "object",
    "required": ["_type", "subject", "predicateType", "predicate"],
    "properties": {
        "_type": {"const": "https://in-toto.io/Statement/v1"},
        "subject": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "digest"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "digest": {
                        "type": "object",
                        "minProperties": 1,
                        "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]+$"},
                    },
                },
            },
        },
        "predicateType": {"type": "string", "format": "uri"},
        "predicate": {"type": "object"},
    },
}


def image(library: str = "libsass_ptx.so") -> Image:
    return Image(layers=[{f"usr/lib/{library}": fixture(library)}])


def attest(cli: CliRunner, tmp_path: Path, *refs: str, extra: tuple[str, ...] = ()) -> Any:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    r = cli("check", *refs, "--family", "hopper", "--attest", str(out / "a.json"), "--json", *extra)
    return r, out


def test_statement_of_one_image(cli: CliRunner, tmp_path: Path) -> None:
    layout = write_oci_layout(tmp_path / "img", image())
    r, out = attest(cli, tmp_path, f"oci:{layout}")
    assert r.code == 0, r.err
    assert [p.name for p in out.iterdir()] == ["a.json"]  # nothing else written
    doc = json.loads((out / "a.json").read_text())
    checked = r.json()
    validate(doc, STATEMENT_SCHEMA)
    validate(doc["predicate"], PREDICATE_SCHEMA)
    assert doc["predicateType"] == "https://buildmatrix.io/check/v1"
    algorithm, hexa = checked["digest"].split(":")
    assert doc["subject"] == [{"name": str(layout), "digest": {algorithm: hexa}}]
    (platform,) = doc["predicate"]["platforms"]
    assert platform["digest"] == checked["digest"]
    assert doc["predicate"]["verdict"] == checked["verdict"] == "pass"
    assert [(t["sm"], t["verdict"], t["driver_ok"]) for t in platform["targets"]] == [
        (t["sm"], t["verdict"], t["driver_ok"]) for t in checked["targets"]
    ]
    assert platform["cuda_runtime"] == checked["cuda_runtime"]
    assert checked["cuda_runtime"]["version"] == "13.0"  # nvcc 13.0 built the fixture
    hopper = cli("profiles", "show", "9.0", "--json").json()["profile"]
    assert platform["targets"][0]["driver_floor"] == {
        "runtime": "580.65.06",
        "hardware": hopper["min_driver"],
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["predicate"]["time"])
    assert doc["predicate"]["tool"]["version"] == cli("--version").out.split()[-1]


def test_profiles_digest_is_over_the_profiles_json(cli: CliRunner, tmp_path: Path) -> None:
    """The digest is sha256 over ``profiles --json``'s objects, canonical; other
    profiles give another digest."""
    layout = write_oci_layout(tmp_path / "img", image())
    r, out = attest(cli, tmp_path, f"oci:{layout}")
    doc = json.loads((out / "a.json").read_text())
    shown = cli("profiles", "--json").json()["profiles"]
    canonical = json.dumps(shown, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    want = hashlib.sha256(canonical.encode()).hexdigest()
    assert doc["predicate"]["profiles"]["digest"] == {"sha256": want}
    mine = tmp_path / "profiles"
    mine.mkdir()
    for f in (REPO / "arch-profiles").glob("*.yaml"):
        text = f.read_text()
        (mine / f.name).write_text(
            text.replace("H100", "H100 (renamed)") if "sm_90" in text else text
        )
    r, out = attest(cli, tmp_path, f"oci:{layout}", extra=("--profiles", str(mine)))
    assert r.code == 0, r.err
    other = json.loads((out / "a.json").read_text())["predicate"]["profiles"]["digest"]
    assert other != {"sha256": want}


def test_a_failed_check_is_attested_as_failed(cli: CliRunner, tmp_path: Path) -> None:
    layout = write_oci_layout(tmp_path / "img", image("libsass_sm80.so"))
    r, out = attest(cli, tmp_path, f"oci:{layout}")
    assert r.code == 1
    doc = json.loads((out / "a.json").read_text())
    validate(doc["predicate"], PREDICATE_SCHEMA)
    assert doc["predicate"]["verdict"] == "fail"
    assert doc["predicate"]["platforms"][0]["targets"][0]["verdict"] == "none"


def test_an_index_and_each_manifest_judged_are_subjects(cli: CliRunner, tmp_path: Path) -> None:
    layout = write_platform_layout(
        tmp_path / "multi",
        [
            ({"os": "linux", "architecture": "amd64"}, image()),
            ({"os": "linux", "architecture": "arm64"}, image("libmulti.so")),
        ],
    )
    r, out = attest(cli, tmp_path, f"oci:{layout}")
    assert r.code in (0, 1), r.err
    doc = json.loads((out / "a.json").read_text())
    checked = r.json()
    validate(doc["predicate"], PREDICATE_SCHEMA)
    want = [checked["index_digest"], *(p["digest"] for p in checked["platforms"])]
    assert len(set(want)) == 3 and None not in want
    assert [f"sha256:{s['digest']['sha256']}" for s in doc["subject"]] == want
    assert [p["platform"] for p in doc["predicate"]["platforms"]] == [
        p["platform"] for p in checked["platforms"]
    ]


def test_no_digest_and_several_images_are_refused(cli: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "root" / "usr" / "lib"
    root.mkdir(parents=True)
    (root / "libsass_ptx.so").write_bytes(fixture("libsass_ptx.so"))
    for refs in ([f"dir:{tmp_path / 'root'}"], [str(root / "libsass_ptx.so")]):
        r, out = attest(cli, tmp_path, *refs)
        assert r.code == 2, r.err
        assert "has no digest" in r.err and "Traceback" not in r.err
        assert list(out.iterdir()) == []
    layout = write_oci_layout(tmp_path / "img", image())
    r, out = attest(cli, tmp_path, f"oci:{layout}", f"oci:{layout}")
    assert r.code == 2 and "once per image" in r.err
    assert list(out.iterdir()) == []
