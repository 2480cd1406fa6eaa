"""CUDA versions in image specs: a full version must be a release NVIDIA publishes as
nvidia/cuda images (buildmatrix/data/cuda.yaml, releases), and two versions of one
CUDA minor are named when the tag pattern cannot tell them apart."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.cuda import facts_from_data, load_cuda_facts
from buildmatrix.errors import InputError
from buildmatrix.profile_files import load_profiles
from buildmatrix.specs import spec_from_data
from buildmatrix.yamlio import load_yaml_text
from tests.conftest import REPO, SHIPPED_PROFILES, CliRunner

FACTS = load_cuda_facts()


def _images(tmp_path: Path, cuda: str, tag: str | None = None) -> Path:
    images = tmp_path / "images"
    shutil.copytree(REPO / "images" / "infer", images / "infer")
    spec = images / "infer" / "image.yaml"
    text = re.sub(r"cuda: \[.*\]", f"cuda: {cuda}", spec.read_text())
    text = re.sub(r"exclude:\n(  .*\n)+", "", text)  # the shipped exclusion names 12.9
    if tag is not None:
        text = re.sub(r"^tag: .*$", f'tag: "{tag}"', text, flags=re.MULTILINE)
    spec.write_text(text)
    return images


def _generate(cli: CliRunner, images: Path, tmp_path: Path) -> Any:
    return cli("generate", "--images", str(images), "--out", str(tmp_path / "build"))


def test_a_patch_nvidia_never_released_is_refused_with_the_known_ones(
    cli: CliRunner, tmp_path: Path
) -> None:
    result = _generate(cli, _images(tmp_path, '["12.8.99"]'), tmp_path)
    assert result.code == 2
    err = " ".join(result.err.split())
    assert "key 'cuda': '12.8.99' is not a released CUDA version" in err
    assert "the known ones are 12.8.0, 12.8.1" in err
    assert "image.yaml" in err
    assert not (tmp_path / "build").exists()


def test_a_toolkit_without_images_yet_says_so(cli: CliRunner, tmp_path: Path) -> None:
    result = _generate(cli, _images(tmp_path, '["13.5.0"]'), tmp_path)
    assert result.code == 2
    assert "no nvidia/cuda image of CUDA 13.5 is published yet" in " ".join(result.err.split())


def test_two_versions_of_one_minor_are_named(cli: CliRunner, tmp_path: Path) -> None:
    result = _generate(cli, _images(tmp_path, '["12.8.0", "12.8.1"]'), tmp_path)
    assert result.code == 2
    err = " ".join(result.err.split())
    assert "'12.8.0' and '12.8.1' are both CUDA 12.8" in err
    assert "put {cuda} into the tag pattern" in err
    assert "every axis" not in err
    # with the full version in the tag, both are variants of their own
    images = _images(
        tmp_path / "b", '["12.8.0", "12.8.1"]', tag="{version}-cu{cuda}-py{python}-{family}"
    )
    ok = _generate(cli, images, tmp_path / "b")
    assert ok.code == 0, ok.err
    built = {p.name for p in (tmp_path / "b" / "build" / "infer").glob("*.Dockerfile")}
    assert any("cu12.8.0" in n for n in built) and any("cu12.8.1" in n for n in built)


def _spec(cuda: list[str]) -> dict[str, Any]:
    return {"name": "x", "repository": "ml/x", "version": "1", "template": "Dockerfile.j2",
            "cuda": cuda, "families": ["hopper"]}  # fmt: skip


def test_every_listed_release_is_accepted_and_every_other_patch_refused(tmp_path: Path) -> None:
    """Exhaustive over the facts: each listed release (and MAJOR.MINOR) passes; the next
    patch after the newest, and every gap between listed ones, is refused naming the
    listed ones."""
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "Dockerfile.j2").write_text("FROM nvidia/cuda:{{ cuda }}-base-ubuntu24.04\n")
    profiles = load_profiles(SHIPPED_PROFILES)
    path = folder / "image.yaml"
    assert FACTS.releases, "the facts list no releases"
    for mm, releases in FACTS.releases.items():
        for ok in (mm, *releases):
            spec_from_data(_spec([ok]), path, profiles, facts=FACTS)
        patches = {int(r.rsplit(".", 1)[1]) for r in releases}
        for patch in range(max(patches, default=-1) + 2):
            if patch in patches:
                continue
            with pytest.raises(InputError, match="is not a released CUDA version") as err:
                spec_from_data(_spec([f"{mm}.{patch}"]), path, profiles, facts=FACTS)
            assert all(r in str(err.value) for r in releases)


def test_the_releases_are_toolkits_of_the_facts() -> None:
    text = (REPO / "buildmatrix" / "data" / "cuda.yaml").read_text()
    data = load_yaml_text(text, source="cuda.yaml")
    assert set(data["releases"]) == {f"{t.version.major}.{t.version.minor}" for t in FACTS.toolkits}
    data["releases"]["14.0"] = ["14.0.0"]
    with pytest.raises(InputError, match=r"'14\.0' is not a toolkit"):
        facts_from_data(data, source="cuda.yaml")
    del data["releases"]["14.0"]
    data["releases"]["12.8"] = ["12.9.0"]
    with pytest.raises(InputError, match=r"'12\.9\.0' is not a 12\.8 release"):
        facts_from_data(data, source="cuda.yaml")
    data["releases"]["12.8"] = ["12.8.0", "12.8.1"]
    data["removed"] = ["12.8.2"]
    with pytest.raises(InputError, match=r"removed: '12\.8\.2' is not one of 'releases'"):
        facts_from_data(data, source="cuda.yaml")


def test_the_shipped_specs_name_released_versions() -> None:
    for spec in sorted((REPO / "images").glob("*/image.yaml")):
        (line,) = [x for x in spec.read_text().splitlines() if x.startswith("cuda:")]
        for version in re.findall(r'"(\d+\.\d+\.\d+)"', line):
            mm = version.rsplit(".", 1)[0]
            assert version in FACTS.releases[mm], (spec, version)


def test_a_major_minor_cuda_in_a_nvidia_cuda_tag_is_refused(cli: CliRunner, tmp_path: Path) -> None:
    """The shipped templates write ``nvidia/cuda:{{ cuda }}-devel-ubuntu24.04``: with
    ``cuda: ["12.9"]`` that is ``nvidia/cuda:12.9-devel-ubuntu24.04``, a tag NVIDIA does
    not publish (only full versions), refused before any Dockerfile is written."""
    result = _generate(cli, _images(tmp_path, '["12.9"]'), tmp_path)
    assert result.code == 2
    err = " ".join(result.err.split())
    assert "pulls nvidia/cuda:12.9-devel-ubuntu24.04, a tag NVIDIA does not publish" in err
    assert "(12.9.0, 12.9.1, 12.9.2;" in err
    assert "Dockerfile.j2" in err
    assert not (tmp_path / "build").exists()


def test_a_rendered_nvidia_cuda_tag_is_a_listed_release_or_refused(tmp_path: Path) -> None:
    """Exhaustive over the facts: a template pulling ``nvidia/cuda:{{ cuda }}-...`` (and
    the same through ``docker.io/``) renders for each listed release and is refused
    for MAJOR.MINOR; a digest-pinned reference is left alone (Docker pulls the
    digest), as is another registry's ``nvidia/cuda``."""
    from buildmatrix.bases import Bases
    from buildmatrix.matrix import expand
    from buildmatrix.render import render

    profiles = load_profiles(SHIPPED_PROFILES)
    folder = tmp_path / "x"
    folder.mkdir()
    path = folder / "image.yaml"
    templates = {
        "FROM nvidia/cuda:{{ cuda }}-base-ubuntu24.04\n": True,
        "FROM docker.io/nvidia/cuda:{{ cuda }}-base-ubuntu24.04 AS b\nFROM b\n": True,
        "FROM nvidia/cuda:{{ cuda }}-base-ubuntu24.04@sha256:" + "0" * 64 + "\n": False,
        "FROM nvcr.io/nvidia/cuda:{{ cuda }}-base-ubuntu24.04\n": False,
    }
    # no flavour: nvidia/cuda has no bare version tags
    (folder / "Dockerfile.j2").write_text("FROM nvidia/cuda:{{ cuda }}\n")
    data = _spec(["12.9.1"]) | {"families": ["ampere"]}
    spec = spec_from_data(data, path, profiles, facts=FACTS)
    entry = expand(spec, profiles, facts=FACTS, out=tmp_path / "o").entries[0]
    with pytest.raises(InputError, match="VERSION-FLAVOUR-OS"):
        render(entry, source="x")
    # a tag pinned by digest in bases.yaml is pulled by its digest: left alone
    (folder / "Dockerfile.j2").write_text("FROM nvidia/cuda:{{ cuda }}-base-ubuntu24.04\n")
    spec = spec_from_data(_spec(["12.9"]) | {"families": ["ampere"]}, path, profiles, facts=FACTS)
    entry = expand(spec, profiles, facts=FACTS, out=tmp_path / "o").entries[0]
    pins = {"nvidia/cuda:12.9-base-ubuntu24.04": "sha256:" + "1" * 64}
    assert "@sha256:" in render(entry, source="x", bases=Bases(pins=pins))
    for text, checked in templates.items():
        (folder / "Dockerfile.j2").write_text(text)
        for mm, releases in FACTS.releases.items():
            for version in (mm, *releases):
                data = _spec([version]) | {"families": ["ampere"]}
                spec = spec_from_data(data, path, profiles, facts=FACTS)
                entry = expand(spec, profiles, facts=FACTS, out=tmp_path / "o").entries[0]
                if checked and version not in releases:
                    with pytest.raises(InputError, match="a tag NVIDIA does not publish"):
                        render(entry, source="x")
                elif (
                    checked
                    and version not in FACTS.removed
                    and ("ubuntu24.04" not in FACTS.os.get(version, ("ubuntu24.04",)))
                ):
                    with pytest.raises(InputError, match=r"not ubuntu24\.04"):
                        render(entry, source="x")
                elif checked and version in FACTS.removed:
                    with pytest.raises(InputError, match="deleted the nvidia/cuda tags"):
                        render(entry, source="x")
                    # a mirror that keeps the tag serves it, if it ever existed
                    mirror = Bases(registry="mirror.example")
                    if "ubuntu24.04" in FACTS.os.get(version, ("ubuntu24.04",)):
                        mirrored = render(entry, source="x", bases=mirror)
                        assert f"mirror.example/nvidia/cuda:{version}-base" in mirrored
                    else:
                        with pytest.raises(InputError, match=r"not ubuntu24\.04"):
                            render(entry, source="x", bases=mirror)
                else:
                    assert f":{version}-base" in render(entry, source="x")


def test_a_release_is_pulled_only_for_the_os_it_is_published_for(tmp_path: Path) -> None:
    """Exhaustive over the facts' os table: ``FROM nvidia/cuda:VERSION-FLAVOUR-OS``
    renders iff NVIDIA publishes VERSION for OS (a removed release is refused anyway);
    ``12.4.1-devel-ubuntu24.04`` (ubuntu24.04 images start at 12.5.1) failed only at
    docker build."""
    from buildmatrix.matrix import expand
    from buildmatrix.render import render

    profiles = load_profiles(SHIPPED_PROFILES)
    folder = tmp_path / "x"
    folder.mkdir()
    path = folder / "image.yaml"
    (folder / "Dockerfile.j2").write_text("FROM scratch\n")
    spec = spec_from_data(_spec(["12.9.1"]) | {"families": ["ampere"]}, path, profiles, facts=FACTS)
    every_os = sorted({name for names in FACTS.os.values() for name in names})
    assert "ubuntu24.04" in every_os and len(FACTS.os) > 40
    checked = 0
    for version, names in FACTS.os.items():
        for os_name in every_os:
            for flavour in ("base", "cudnn-devel"):
                (folder / "Dockerfile.j2").write_text(
                    f"FROM nvidia/cuda:{version}-{flavour}-{os_name}\n"
                )
                entry = expand(spec, profiles, facts=FACTS, out=tmp_path / "o").entries[0]
                if version in FACTS.removed:
                    with pytest.raises(InputError, match="deleted the nvidia/cuda tags"):
                        render(entry, source="x")
                elif os_name not in names:
                    with pytest.raises(InputError, match=f"not {re.escape(os_name)}"):
                        render(entry, source="x")
                else:
                    assert f":{version}-{flavour}-{os_name}" in render(entry, source="x")
                checked += 1
    assert checked == 2 * len(FACTS.os) * len(every_os)


@pytest.mark.parametrize(
    ("tag", "refused"),
    [
        ("12.9-devel-ubuntu24.04", "VERSION a full CUDA release"),
        ("12.4.1-devel-ubuntu24.04", "not ubuntu24.04"),
        ("latest", "VERSION-FLAVOUR-OS"),
        ("12.9.1-devel", "VERSION-FLAVOUR-OS"),
        ("12.9.1-devel-", "VERSION-FLAVOUR-OS"),
        ("12.9.1-DEVEL-UBUNTU24.04", "VERSION-FLAVOUR-OS"),
        ("11.2.0-devel-ubuntu20.04", None),  # removed from Docker Hub: the mirror may keep it
        ("12.9.1-cudnn-devel-ubuntu24.04", None),
    ],
)
def test_a_mirror_serves_only_tags_that_existed(
    tmp_path: Path, tag: str, refused: str | None
) -> None:
    """A mirror of Docker Hub (bases.yaml registry) may keep the tags NVIDIA deleted,
    never ones it did not publish: those are refused with or without it."""
    from buildmatrix.bases import Bases
    from buildmatrix.matrix import expand
    from buildmatrix.render import render

    profiles = load_profiles(SHIPPED_PROFILES)
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "Dockerfile.j2").write_text(f"FROM nvidia/cuda:{tag}\n")
    spec = spec_from_data(
        _spec(["12.9.1"]) | {"families": ["ampere"]}, folder / "image.yaml", profiles, facts=FACTS
    )
    entry = expand(spec, profiles, facts=FACTS, out=tmp_path / "o").entries[0]
    mirror = Bases(registry="mirror.example")
    if refused is None:
        assert f"mirror.example/nvidia/cuda:{tag}" in render(entry, source="x", bases=mirror)
    else:
        with pytest.raises(InputError, match=re.escape(refused)):
            render(entry, source="x", bases=mirror)
