"""Spec errors a newcomer can act on: each names the key and the fix, through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import CliRunner

TEMPLATE = "FROM nvidia/cuda:{{ cuda }}-runtime-ubuntu24.04\n"


def _spec(root: Path, cuda: str) -> Path:
    folder = root / "images" / "x"
    folder.mkdir(parents=True)
    (folder / "image.yaml").write_text(
        f'name: x\nrepository: me/x\nversion: "1.0"\ntemplate: Dockerfile.j2\ncuda: {cuda}\n'
    )
    (folder / "Dockerfile.j2").write_text(TEMPLATE)
    return root / "images"


@pytest.mark.parametrize(
    ("bare", "quoted"), [("12.8", '"12.8"'), ("13", '"13"'), ("12.10", '"12.1"')]
)
def test_a_version_yaml_reads_as_a_number_says_to_quote_it(
    cli: CliRunner, tmp_path: Path, bare: str, quoted: str
) -> None:
    images = _spec(tmp_path, f"[{bare}]")
    r = cli("generate", "--images", str(images), "--out", str(tmp_path / "out"))
    assert r.code == 2
    assert "key 'cuda[0]': expected string" in r.err
    assert f"quote it as text, {quoted}" in r.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("version", ["13.9.0", "12.8.9"])
def test_a_release_this_installation_lacks_names_the_upgrade_not_site_packages(
    cli: CliRunner, tmp_path: Path, version: str
) -> None:
    """An adopter's data/cuda.yaml lies in site-packages: the message must not send them
    there to edit it, but to the release that knows the version."""
    images = _spec(tmp_path, f'["{version}"]')
    r = cli("generate", "--images", str(images), "--out", str(tmp_path / "out"))
    assert r.code == 2
    assert "key 'cuda'" in r.err and version in r.err
    assert "pip install -U buildmatrix-gpu" in r.err
    assert "cuda.yaml" not in r.err
