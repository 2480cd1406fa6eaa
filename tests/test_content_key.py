"""Content keys (buildmatrix/content_key.py, buildmatrix/pipeline.py): the key of a
variant changes exactly when what shapes it changes (its Dockerfile text, a context
file it reads, its base, its platform), and is the same on every machine.

The properties run over random build contexts (hypothesis); the shipped examples are
then edited the ways a repository is edited, through ``matrix --format json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import Version

from buildmatrix.content_key import content_key, context_files, used_sources
from tests.conftest import REPO, CliRunner, validate

NAMES = st.sampled_from(["a", "b", "c", "lib", "src"])
FILES = st.dictionaries(
    st.tuples(NAMES, st.sampled_from(["x.cu", "y.h", "z.txt"])),
    st.tuples(st.binary(max_size=32), st.booleans()),  # content, executable
    min_size=1,
    max_size=12,
)


def write_tree(root: Path, files: dict[tuple[str, str], tuple[bytes, bool]], *, order: int) -> None:
    """The files under ``root``, created in an order and with mtimes and group bits
    that differ by ``order``: none of that may reach the key."""
    items = sorted(files.items(), reverse=bool(order % 2))
    for i, ((folder, name), (data, executable)) in enumerate(items):
        path = root / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod((0o775 if order else 0o755) if executable else (0o664 if order else 0o644))
        os.utime(path, (1_000_000 + order * 77 + i, 1_000_000 + order * 91 + i))


def dockerfile(used: list[str], base: str = "nvidia/cuda:13.0.0-devel-ubuntu24.04") -> str:
    copies = "".join(f"COPY {folder}/ /work/{folder}/\n" for folder in used)
    return f"FROM {base} AS build\n{copies}FROM build\nCOPY --from=build /work /work\n"


def key_of(root: Path, text: str, platform: str = "linux/amd64") -> str:
    return content_key(
        dockerfile=text, platform=platform, files=context_files(root, used_sources(text))
    )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(files=FILES, data=st.data())
def test_key_follows_used_files_only(
    files: dict[tuple[str, str], tuple[bytes, bool]],
    data: st.DataObject,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folders = sorted({f for f, _ in files})
    used = data.draw(st.lists(st.sampled_from(folders), unique=True, min_size=1))
    text = dockerfile(used)
    first, second = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    write_tree(first, files, order=0)
    write_tree(second, files, order=1)
    key = key_of(first, text)
    # the same tree elsewhere, made in another order, other mtimes and group bits
    assert key_of(second, text) == key
    (folder, name), (content, executable) = data.draw(st.sampled_from(sorted(files.items())))
    target = second / folder / name
    how = data.draw(st.sampled_from(["content", "mode", "new file", "remove"]))
    if how == "content":
        target.write_bytes(content + b"!")
    elif how == "mode":
        target.chmod(0o644 if executable else 0o755)
    elif how == "new file":
        (second / folder / "added.cu").write_bytes(b"new")
    else:
        target.unlink()
    changed = key_of(second, text) != key
    assert changed == (folder in used), (how, folder, used)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    files=FILES,
    other=st.sampled_from(
        ["ubuntu:24.04", "nvidia/cuda:13.0.0-devel-ubuntu24.04@sha256:" + "1" * 64]
    ),
)
def test_key_follows_base_platform_and_text(
    files: dict[tuple[str, str], tuple[bytes, bool]],
    other: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("ctx")
    write_tree(root, files, order=0)
    used = sorted({f for f, _ in files})[:1]
    key = key_of(root, dockerfile(used))
    assert key_of(root, dockerfile(used, base=other)) != key
    assert key_of(root, dockerfile(used), platform="linux/arm64") != key
    assert key_of(root, dockerfile(used) + "ENV X=1\n") != key
    assert key_of(root, dockerfile(used)) == key


def test_sources_the_dockerfile_reads() -> None:
    text = (
        "FROM x AS b\n"
        'COPY --chown=1:1 ["a b", "c/*.cu", "/d/"]\n'
        "COPY --from=b /x /y\n"
        "ADD https://example.com/f.tgz /f\n"
        "# a comment between\n"
        "RUN --mount=type=cache,target=/c --mount=type=bind,source=src,target=/s \\\n"
        "    make\n"
        "RUN --mount=type=bind,from=b,source=/x,target=/x true\n"
    )
    assert used_sources(text) == ["a b", "c/*.cu", "src"]
    assert used_sources("FROM x\nRUN --mount=target=/all true\n") == ["."]  # bind, root
    for unknown in ("FROM x\nARG D\nCOPY $D /d\n", "FROM x\nCOPY <<EOF /f\nhi\nEOF\n"):
        assert used_sources(unknown) is None  # the whole context counts


def test_globs_climbing_and_missing_sources(tmp_path: Path) -> None:
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "one.cu").write_text("1")
    (tmp_path / "k" / "two.h").write_text("2")
    (tmp_path / "top.cu").write_text("3")
    files = context_files(tmp_path, ["k/*.cu", "../../top.cu", "absent.txt"])
    assert sorted(files) == ["absent.txt", "k/one.cu", "top.cu"]
    assert files["absent.txt"] == "missing"
    assert sorted(context_files(tmp_path, None)) == ["k", "k/one.cu", "k/two.h", "top.cu"]
    (tmp_path / ".dockerignore").write_text("*.h\n")  # counted, never applied
    assert ".dockerignore" in context_files(tmp_path, ["k/*.cu"])


# --- the shipped examples, through the CLI --------------------------------------------


@pytest.fixture
def repo_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(REPO / "images", tmp_path / "images")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.md").write_text("# notes\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def keys(cli: CliRunner) -> dict[tuple[str, str], str]:
    result = cli("matrix", "--format", "json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    return {(e["key"], e["platform"]): e["content_key"] for e in doc["entries"]}


def changed(before: dict[tuple[str, str], str], after: dict[tuple[str, str], str]) -> set[str]:
    assert before.keys() == after.keys()
    return {name for name, platform in before if before[name, platform] != after[name, platform]}


def images_of(names: set[str]) -> set[str]:
    return {n.split("-", 1)[0] if n.startswith("infer") else "train-fp8" for n in names}


def test_edits_change_exactly_the_variants_they_shape(repo_copy: Path, cli: CliRunner) -> None:
    before = keys(cli)
    every_infer = {n for n, _ in before if n.startswith("infer-")}
    every_train = {n for n, _ in before if n.startswith("train-fp8-")}
    assert len(set(before.values())) == len(before)  # every entry and platform its own key

    (repo_copy / "docs" / "notes.md").write_text("# notes, edited\n")
    (repo_copy / "images" / "infer" / "NOTES.md").write_text("not copied by the Dockerfile\n")
    assert changed(before, keys(cli)) == set()

    source = repo_copy / "images" / "infer" / "ext" / "infer_ops.cu"
    source.write_text(source.read_text() + "\n// edited\n")
    now = keys(cli)
    assert changed(before, now) == every_infer  # a used context file
    before = now

    spec = repo_copy / "images" / "train-fp8" / "image.yaml"
    spec.write_text(spec.read_text().replace("FP8 training image", "FP8 trainer"))
    now = keys(cli)
    assert changed(before, now) == every_train  # another image's spec leaves infer alone
    before = now

    template = repo_copy / "images" / "infer" / "Dockerfile.j2"
    template.write_text(template.read_text() + "ENV EDITED=1\n")
    now = keys(cli)
    assert changed(before, now) == every_infer
    before = now

    # a pinned base: exactly the variants that pull it
    runtime = "nvidia/cuda:13.3.1-runtime-ubuntu24.04"
    (repo_copy / "images" / "bases.yaml").write_text(f"pins:\n  {runtime}: sha256:{'a' * 64}\n")
    now = keys(cli)
    pulls = {n for n, _ in before if "-cu133-" in n}
    assert changed(before, now) == pulls
    before = now
    (repo_copy / "images" / "bases.yaml").write_text("registry: mirror.example.com/hub\n")
    assert changed(before, keys(cli)) == every_infer | every_train  # every base moves


def test_cuda_facts_that_change_the_constraint_change_the_key(
    repo_copy: Path, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edit to the CUDA facts that moves NVIDIA_REQUIRE_ARCH (the driver that
    JITs CUDA 13.3's PTX) changes the keys of the variants whose constraint moved."""
    import buildmatrix.cuda
    from buildmatrix.cuda import load_cuda_facts, parse_driver_version

    before_doc = json.loads(cli("matrix", "--format", "json").out)
    facts = load_cuda_facts()
    toolkits = tuple(
        dataclasses.replace(tk, driver=parse_driver_version("615.0.0"))
        if tk.version == Version("13.3")
        else tk
        for tk in facts.toolkits
    )
    edited = dataclasses.replace(facts, toolkits=toolkits)
    monkeypatch.setattr(buildmatrix.cuda, "load_cuda_facts", lambda: edited)
    after_doc = json.loads(cli("matrix", "--format", "json").out)
    pairs = list(zip(before_doc["entries"], after_doc["entries"], strict=True))
    moved = {a["key"] for a, b in pairs if a["nvidia_require_arch"] != b["nvidia_require_arch"]}
    rekeyed = {a["key"] for a, b in pairs if a["content_key"] != b["content_key"]}
    assert moved  # the edit reaches some constraint
    assert rekeyed == moved


def test_outputs_carry_key_tag_cache_and_labels(repo_copy: Path, cli: CliRunner) -> None:
    run = [
        "--source",
        "https://github.com/o/r",
        "--revision",
        "abc123",
        "--created",
        "2026-12-01T17:30:00Z",
    ]
    github = json.loads(cli("matrix", "--format", "github", *run).out)["include"]
    merge = json.loads(cli("matrix", "--format", "merge", *run).out)["include"]
    bake = json.loads(cli("matrix", "--format", "bake", *run).out)["target"]
    labels = [
        "org.opencontainers.image.created=2026-12-01T17:30:00.000Z",
        "org.opencontainers.image.revision=abc123",
        "org.opencontainers.image.source=https://github.com/o/r",
    ]
    scopes = [e["cache_to"] for e in github]
    assert len(set(scopes)) == len(github)  # a gha scope per entry and platform
    by_tag = {m["tags"][0]: m for m in merge}
    for e in github:
        key16 = by_tag[e["tags"][0]]["content_key"][:16]
        assert e["content_tag"] == f"{e['tags'][0]}-{key16}" == by_tag[e["tags"][0]]["content_tag"]
        assert e["cache_from"] + ",mode=max" == e["cache_to"]
        assert e["oci_labels"] == labels
        assert e["annotations"] == [f"manifest:{x}" for x in labels]
    for m in merge:
        assert m["annotations"] == [f"index:{x}" for x in labels]
    immutable = {m["content_tag"] for m in merge}
    for name, target in bake.items():
        assert target["cache-to"] == [f"type=gha,scope={name},mode=max"]
        assert all(target["labels"][k] == v for k, _, v in (x.partition("=") for x in labels))
        family, fixed = target["tags"]
        suffix = family.removeprefix(family.rsplit("-", 1)[0]) if name.endswith("64") else ""
        assert fixed.removesuffix(suffix) in immutable  # per-platform targets: -ARCH
    assert any(name.endswith("-arm64") for name in bake)  # the Blackwell tags are split


def test_a_tag_with_no_room_for_the_key_is_exit_2(repo_copy: Path, cli: CliRunner) -> None:
    spec = repo_copy / "images" / "train-fp8" / "image.yaml"
    long = "x" * 100
    spec.write_text(spec.read_text().replace('tag: "{version}', f'tag: "{long}-{{version}}'))
    result = cli("matrix", "--image", "train-fp8")
    assert result.code == 2
    assert "key 'tag'" in result.err
    assert "leaves no room for the content key" in result.err


def test_run_labels_from_the_environment(
    repo_copy: Path, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    monkeypatch.setenv("GITHUB_REPOSITORY", "o/r")
    monkeypatch.setenv("GITHUB_SHA", "f00")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    entry = json.loads(cli("matrix", "--format", "github").out)["include"][0]
    assert entry["oci_labels"] == [
        "org.opencontainers.image.created=1970-01-01T00:00:00.000Z",
        "org.opencontainers.image.revision=f00",
        "org.opencontainers.image.source=https://github.com/o/r",
    ]
    bad = cli("matrix", "--created", "yesterday")
    assert bad.code == 2
    assert "--created: 'yesterday' is not an ISO 8601 time" in bad.err


def test_json_output_follows_its_schema(repo_copy: Path, cli: CliRunner) -> None:
    schema = json.loads((REPO / "buildmatrix" / "schemas" / "matrix.schema.json").read_text())
    run = ["--source", "https://github.com/o/r", "--revision", "abc", "--created", "now"]
    for extra in ([], run):
        doc = json.loads(cli("matrix", "--format", "json", *extra).out)
        validate(doc, schema)
        github = json.loads(cli("matrix", "--format", "github", *extra).out)["include"]
        entry = {"$ref": "#/$defs/entry", "$defs": schema["$defs"]}
        for e in github:  # a subset of the json entry's keys, the same values
            validate(doc["entries"][0] | e, entry)


def test_links_count_by_target_and_fifos_are_not_read(tmp_path: Path) -> None:
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "real.cu").write_text("1")
    (tmp_path / "k" / "alias.cu").symlink_to("real.cu")
    os.mkfifo(tmp_path / "k" / "pipe")
    files = context_files(tmp_path, ["k"])
    assert files["k/alias.cu"] == "link real.cu"
    assert files["k/pipe"] == "special"
    (tmp_path / "k" / "alias.cu").unlink()
    (tmp_path / "k" / "alias.cu").symlink_to("other.cu")
    assert context_files(tmp_path, ["k"]) != files
