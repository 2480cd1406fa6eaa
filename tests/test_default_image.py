"""``k8s manifests`` without ``--image``: the DaemonSet runs the tool image of this
package's own version, as the release workflow tags it (.github/workflows/release.yml:
``IMAGE:VERSION``), never the moving ``latest``: the agent holds rights on nodes."""

from __future__ import annotations

import re
from importlib.metadata import version

import yaml

from tests.conftest import CliRunner

# The OCI distribution spec's tag grammar (distribution-spec spec.md, "Pulling
# manifests"): [a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}
TAG = re.compile(r"[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}")


def test_the_default_image_is_this_version(cli: CliRunner) -> None:
    r = cli("k8s", "manifests")
    assert r.code == 0, r.err
    (ds,) = [d for d in yaml.safe_load_all(r.out) if d["kind"] == "DaemonSet"]
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    repository, _, tag = image.rpartition(":")
    assert repository == "ghcr.io/buildmatrix/buildmatrix"
    assert tag == version("buildmatrix-gpu").replace("+", "-")
    assert tag != "latest"
    assert TAG.fullmatch(tag), tag
    given = cli("k8s", "manifests", "--image", "registry.example.com/bm:1.2.3")
    assert "image: registry.example.com/bm:1.2.3" in given.out


def test_the_help_says_so(cli: CliRunner) -> None:
    r = cli("k8s", "manifests", "--help")
    assert r.code == 0
    text = " ".join(r.out.split())
    assert "ghcr.io/buildmatrix/buildmatrix:<this buildmatrix's version>" in text
    assert "never a moving tag" in text
