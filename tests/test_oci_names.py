"""An OCI layout whose index.json gives one ``org.opencontainers.image.ref.name`` to two
images: the name is given twice, and that is what check says (exit 2), not "no image
tagged 'v1' … name one of: v1". The layout is skopeo's, edited afterwards: skopeo
itself replaces the entry of a name it writes again."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.images import Image, fixture, write_docker_archive

pytestmark = pytest.mark.integration

REF_NAME = "org.opencontainers.image.ref.name"
IMAGES = {
    "v1": Image(layers=[{"usr/lib/libhopper_a.so": fixture("libhopper_a.so")}]),
    "v2": Image(layers=[{"usr/lib/libsass_sm80.so": fixture("libsass_sm80.so")}]),
}


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """Two images written by skopeo into one layout, tagged v1 and v2."""
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed (Debian package skopeo)")
    folder = tmp_path / "layout"
    for tag, image in IMAGES.items():
        archive = write_docker_archive(tmp_path / f"{tag}.tar", image)
        subprocess.run(
            ["skopeo", "--insecure-policy", "copy", f"docker-archive:{archive}",
             f"oci:{folder}:{tag}"],
            check=True, capture_output=True,
        )  # fmt: skip
    return folder


def _rename(folder: Path, old: str, new: str) -> None:
    index = json.loads((folder / "index.json").read_text())
    for m in index["manifests"]:
        if m["annotations"][REF_NAME] == old:
            m["annotations"][REF_NAME] = new
    (folder / "index.json").write_text(json.dumps(index))


def test_a_name_given_twice_is_refused_as_such(cli: CliRunner, layout: Path) -> None:
    # as skopeo wrote it: each name picks its image
    assert cli("check", f"oci:{layout}:v1", "--sm", "9.0").code == 0
    assert cli("check", f"oci:{layout}:v2", "--sm", "9.0").code == 1
    _rename(layout, "v2", "v1")
    for ref in (f"oci:{layout}:v1", f"oci:{layout}", str(layout)):
        r = cli("check", ref, "--sm", "9.0")
        assert r.code == 2, (ref, r.out)
        flat = " ".join(r.err.split())
        assert f"gives the name 'v1' ({REF_NAME}) to 2 images" in flat, (ref, flat)
        assert "no image tagged" not in flat


def test_distinct_names_still_ask_for_one(cli: CliRunner, layout: Path) -> None:
    """Two images under two names and no name given: the message lists both."""
    r = cli("check", f"oci:{layout}", "--sm", "9.0")
    assert r.code == 2
    assert "name one of: v1, v2" in " ".join(r.err.split())
    missing = cli("check", f"oci:{layout}:v3", "--sm", "9.0")
    assert missing.code == 2
    assert "no image tagged 'v3'" in missing.err
