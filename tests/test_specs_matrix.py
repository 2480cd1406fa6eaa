"""Image specs and matrix expansion: the shipped examples, and every kind of bad spec."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from packaging.version import Version

from buildmatrix.cuda import load_cuda_facts
from buildmatrix.matrix import expand_all
from buildmatrix.profile_files import load_profiles
from buildmatrix.specs import load_specs
from tests.conftest import REPO, SHIPPED_PROFILES, CliRunner

PROFILES = load_profiles(SHIPPED_PROFILES)
FACTS = load_cuda_facts()
IMAGES = REPO / "images"


def shipped() -> tuple[list[str], list[str]]:
    m = expand_all(
        load_specs(IMAGES, PROFILES, facts=FACTS), PROFILES, facts=FACTS, out=Path("build")
    )
    tags = dict.fromkeys(f"{e.spec.name}:{e.tag}" for e in m.entries)  # one per platform
    return list(tags), [str(d) for d in m.dropped]


def test_fp8_image_is_built_only_where_fp8_exists() -> None:
    entries, dropped = shipped()
    fp8 = [e for e in entries if e.startswith("train-fp8:")]
    assert fp8 == [
        "train-fp8:1.4.0-cu129-ada-lovelace",
        "train-fp8:1.4.0-cu133-ada-lovelace",
        "train-fp8:1.4.0-cu129-hopper",
        "train-fp8:1.4.0-cu133-hopper",
        "train-fp8:1.4.0-cu129-blackwell",
        "train-fp8:1.4.0-cu133-blackwell",
    ]
    assert "train-fp8: ampere cuda 12.9.1: sm_80 lacks fp8; sm_86 lacks fp8" in dropped


def test_an_sm_the_cuda_version_cannot_build_is_left_out(tmp_path: Path) -> None:
    images = _copy_example(tmp_path)
    spec = images / "train-fp8" / "image.yaml"
    spec.write_text(spec.read_text().replace('["12.9.1", "13.3.1"]', '["12.8.1"]'))
    m = expand_all(
        load_specs(images, PROFILES, facts=FACTS), PROFILES, facts=FACTS, out=Path("build")
    )
    for sm in ("sm_103", "sm_121"):
        assert (
            f"train-fp8: blackwell cuda 12.8.1: {sm}: left out of the variant: {sm} needs "
            "CUDA 12.9 or newer"
        ) in [str(d) for d in m.dropped]
    blackwell = next(e for e in m.entries if e.family.value == "blackwell")
    assert blackwell.sms == ["sm_100", "sm_120"]
    assert blackwell.gencode == [
        "-gencode=arch=compute_100,code=sm_100",
        "-gencode=arch=compute_100a,code=sm_100a",
        "-gencode=arch=compute_120,code=sm_120",
        "-gencode=arch=compute_120,code=compute_120",
    ]
    # sm_100 SASS also runs on 10.3 (B300), not on 10.1 (Thor before CUDA 13, an
    # integrated GPU), and sm_120 SASS on 12.1 (GB10); 10.3 and 12.1 have their own
    # floors; 13.x GPUs JIT the compute_120 PTX of ISA 8.7, which needs CUDA 12.8's
    # 570.26.
    assert blackwell.nvidia_require_arch == (
        "arch=10.0,driver>=570.26 arch>=10.3,arch<11.0,driver>=575.51.03 "
        "arch=12.0,driver>=570.26 arch>=12.1,arch<13.0,driver>=575.51.03 "
        "arch>=13.0,driver>=570.26"
    )


def test_inference_axes_and_exclusions() -> None:
    entries, dropped = shipped()
    infer = [e for e in entries if e.startswith("infer:")]
    assert len(infer) == 12  # 4 families x (2 CUDA x 2 Python - the excluded 12.9/3.11)
    assert "infer:2.1.0-cu129-py3.11-hopper" not in infer
    assert (
        "infer: hopper cuda 12.9.1 python=3.11 cudnn=9.27.0.42 nccl=2.32.3: excluded by "
        "the spec (cuda=12.9, python=3.11)" in dropped
    )


def test_entry_build_flags_follow_the_cuda_version() -> None:
    m = expand_all(
        load_specs(IMAGES, PROFILES, facts=FACTS, only="train-fp8"),
        PROFILES,
        facts=FACTS,
        out=Path("build"),
    )
    by_tag = {e.tag: e for e in m.entries}
    blackwell = by_tag["1.4.0-cu129-blackwell"]
    assert blackwell.sms == ["sm_100", "sm_103", "sm_120", "sm_121"]
    assert blackwell.torch_arch_list == "10.0;10.0a;10.3;10.3a;12.0+PTX;12.1;12.1a"
    # SASS runs within its major, PTX lets newer GPUs in by JIT; each range carries the
    # highest floor there: the CUDA 12 runtime (525.60.13), the hardware floor (sm_100
    # and sm_120 570.26, sm_103 and sm_121 575.51.03), the JIT of CUDA 12.9's PTX ISA
    # 8.8 (575.51.03).
    assert blackwell.nvidia_require_arch == (
        "arch=10.0,driver>=570.26 arch>=10.3,arch<11.0,driver>=575.51.03 "
        "arch=12.0,driver>=570.26 arch>=12.1,driver>=575.51.03"
    )
    assert blackwell.min_driver == "570.26"
    ada = by_tag["1.4.0-cu133-ada-lovelace"]
    # a CUDA 13 runtime needs R580, whatever the GPU's own floor (520.61.05)
    assert ada.nvidia_require_arch == "arch=8.9,driver>=580.65.06"
    assert ada.min_driver == "580.65.06"
    assert ada.labels["io.buildmatrix.family"] == "ada-lovelace"
    assert ada.labels["io.buildmatrix.cuda"] == "13.3.1"
    assert Version(ada.cuda.mm) == Version("13.3")


def _copy_example(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    shutil.copytree(IMAGES / "train-fp8", images / "train-fp8")
    return images


BAD_SPECS = {
    "tag escaping --out": (
        ('tag: "{version}-cu{cuda_major}{cuda_minor}-{family}"', 'tag: "../../escaped-{family}"'),
        "gives '../../escaped-ada-lovelace' for ada-lovelace cuda 12.9.1, which is not a "
        "Docker tag",
    ),
    "tag with a slash and a colon": (
        ('tag: "{version}-cu{cuda_major}{cuda_minor}-{family}"', 'tag: "{version}/{family}:x"'),
        "gives '1.4.0/ada-lovelace:x'",
    ),
    "tag with a conversion": (
        ('tag: "{version}-cu{cuda_major}{cuda_minor}-{family}"', 'tag: "{cuda!r}-{family}"'),
        "'{cuda!r}' has a conversion or format spec",
    ),
    "tag with a format spec": (
        ('tag: "{version}-cu{cuda_major}{cuda_minor}-{family}"', 'tag: "{cuda:>20}-{family}"'),
        "'{cuda:>20}' has a conversion or format spec",
    ),
    "cuda never released": (
        ('cuda: ["12.9.1", "13.3.1"]', 'cuda: ["12.7.0"]'),
        "key 'cuda': 12.7.0 is not a CUDA release buildmatrix knows",
    ),
    "cuda newer than the table": (
        ('cuda: ["12.9.1", "13.3.1"]', 'cuda: ["14.0.0"]'),
        "14.0.0 is not a CUDA release buildmatrix knows (its driver floor and PTX ISA would "
        "be made up). Known releases: 11.0,",
    ),
    "unknown family": (
        ("families: [hopper]", "families: [hoper]"),
        "no profile has family 'hoper'. Did you mean 'hopper'?",
    ),
    "unknown feature": (
        ("requires: [fp8]", "requires: [fp4, int4]"),
        "unknown feature 'int4'. Did you mean 'int8'?",
    ),
    "feature in capitals": (
        ("requires: [fp8]", "requires: [FP8]"),
        "unknown feature 'FP8'. Did you mean 'fp8'?",
    ),
    "family in capitals": (
        ("families: [hopper]", "families: [Hopper]"),
        "no profile has family 'Hopper'. Did you mean 'hopper'?",
    ),
    "key written twice": (
        ("requires: [fp8]", "requires: [fp8]\nrequires: [fp8]"),
        "duplicate key 'requires' (first written at line",
    ),
    "axes not lists": (
        ("tag:", "axes:\n  python: '3.12'\ntag:"),
        "key 'axes.python': expected array",
    ),
    "unknown tag field": (
        ('tag: "{version}-cu{cuda_major}{cuda_minor}-{family}"', 'tag: "{version}-{famly}"'),
        "unknown field '{famly}'. Did you mean 'family'?",
    ),
    "missing template": (
        ("template: Dockerfile.j2", "template: Nope.j2"),
        "Nope.j2 does not exist",
    ),
    "unknown key": (
        ("version:", "verison: x\nversion:"),
        "unknown key 'verison'. Did you mean 'version'?",
    ),
    "cuda not a list": (
        ('cuda: ["12.9.1", "13.3.1"]', 'cuda: "12.9.1"'),
        "key 'cuda': expected array",
    ),
    "cuda malformed": (
        ('cuda: ["12.9.1", "13.3.1"]', 'cuda: ["twelve"]'),
        "key 'cuda[0]': 'twelve'",
    ),
    "exclude unknown field": (
        ("tag:", "exclude:\n  - {famly: hopper}\ntag:"),
        "exclude[0]' names unknown field 'famly'",
    ),
    "tags collide": (
        ('tag: "{version}-cu{cuda_major}{cuda_minor}-{family}"', 'tag: "{version}"'),
        "two variants get the same tag",
    ),
}


@pytest.mark.parametrize(("edit", "message"), BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_bad_specs_exit_2(
    tmp_path: Path, cli: CliRunner, edit: tuple[str, str], message: str
) -> None:
    images = _copy_example(tmp_path)
    spec = images / "train-fp8" / "image.yaml"
    text = spec.read_text()
    if edit[0] == "families: [hopper]":
        text = text.replace("requires: [fp8]", "requires: [fp8]\nfamilies: [hopper]")
    assert edit[0] in text
    spec.write_text(text.replace(edit[0], edit[1], 1))
    result = cli("matrix", "--images", str(images))
    assert result.code == 2, result.out
    assert message in result.err
    assert result.out == ""


def test_feature_no_profile_has(tmp_path: Path, cli: CliRunner) -> None:
    images = _copy_example(tmp_path)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for sm in ("sm_80", "sm_86"):
        shutil.copy(SHIPPED_PROFILES / f"{sm}.yaml", profiles)
    result = cli("matrix", "--images", str(images), "--profiles", str(profiles))
    assert result.code == 2
    assert "no arch profile has feature 'fp8'" in result.err


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("FROM x:{{ cuda }\n", "template syntax error"),
        ("FROM x:{{ cuda }}\nRUN echo {{ nope }}\n", "Dockerfile.j2:2: 'nope' is undefined"),
        (
            "FROM x:{{ cuda }}\n{% if cuda %}\n\nRUN {{ cuda.nope }}\n{% endif %}\n",
            "Dockerfile.j2:4: 'str object' has no attribute 'nope'",
        ),
        ("RUN echo {{ cuda }}\n", "without a FROM line"),
    ],
)
def test_templates_that_fail_to_render(
    tmp_path: Path, cli: CliRunner, body: str, message: str
) -> None:
    images = _copy_example(tmp_path)
    (images / "train-fp8" / "Dockerfile.j2").write_text(body)
    result = cli("generate", "--images", str(images), "--out", str(tmp_path / "out"))
    assert result.code == 2
    assert message in result.err
    assert not (tmp_path / "out").exists()


def test_github_matrix_limit(tmp_path: Path, cli: CliRunner) -> None:
    images = _copy_example(tmp_path)
    spec = images / "train-fp8" / "image.yaml"
    axis = ", ".join(f'"{i}"' for i in range(50))
    spec.write_text(
        spec.read_text().replace(
            'tag: "{version}-cu{cuda_major}{cuda_minor}-{family}"',
            f'axes:\n  shard: [{axis}]\ntag: "{{version}}-{{family}}-{{cuda}}-{{shard}}"',
        )
    )
    result = cli("matrix", "--images", str(images))
    assert result.code == 2
    assert "600 entries, over GitHub's limit of 256 jobs per matrix (" in result.err
    # one image alone is over the limit: --image cannot help, its axes are named
    assert (
        "train-fp8 alone has 600 (3 families x 2 CUDA versions x 2 platforms x 50 'shard' values)"
    ) in result.err
    assert "--image cannot split it" in result.err
    ok = cli("matrix", "--images", str(images), "--format", "json")
    assert ok.code == 0
    assert len(ok.json()["entries"]) == 600
    # 20 shards: 240 for train-fp8 (x 2 platforms) and the 40 of infer fit one by one,
    # not together
    spec.write_text(spec.read_text().replace(axis, ", ".join(f'"{i}"' for i in range(20))))
    shutil.copytree(IMAGES / "infer", images / "infer")
    (images / "infer" / "image.yaml").write_text(
        (images / "infer" / "image.yaml")
        .read_text()
        .replace('["3.11", "3.12"]', '["3.11", "3.12", "3.13"]')
    )
    split = cli("matrix", "--images", str(images))
    assert split.code == 2, split.out
    assert "Split it: one matrix job per image with --image NAME." in split.err
    for name in ("train-fp8", "infer"):
        assert cli("matrix", "--images", str(images), "--image", name).code == 0


def test_matrix_formats(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    github = cli("matrix").json()
    assert set(github) == {"include"}
    first = github["include"][0]
    assert {"image", "family", "cuda", "tags", "dockerfile", "gencode"} <= set(first)
    assert first["dockerfile"] == f"build/{first['image']}/{first['tag']}.Dockerfile"
    bake = cli("matrix", "--format", "bake").json()
    merge = cli("matrix", "--format", "merge").json()["include"]
    # one bake target per family tag, or one per platform where its Dockerfiles differ
    files: dict[str, set[str]] = {}
    for e in github["include"]:
        files.setdefault(e["tags"][0], set()).add(e["dockerfile"])
    assert len(bake["group"]["default"]["targets"]) == sum(
        1 if len(files[m["tags"][0]]) == 1 else len(m["platforms"]) for m in merge
    )
    assert [m["tags"][0] for m in merge] == list(files)
    for m in merge:  # the merge job's platforms are exactly its tag's build jobs'
        built = [e["platform"] for e in github["include"] if e["tags"] == m["tags"]]
        assert m["platforms"] == built
        assert m["key"] == f"{m['image']}-{m['tag']}"
    target = bake["target"]["train-fp8-1-4-0-cu133-hopper"]
    assert target["context"] == "images/train-fp8"
    assert target["dockerfile"] == "../../build/train-fp8/1.4.0-cu133-hopper.Dockerfile"
    full = cli("matrix", "--format", "json", "--image", "train-fp8").json()
    assert full["version"] == 1
    assert {d["what"] for d in full["dropped"]} >= {"volta cuda 12.9.1", "ampere cuda 13.3.1"}


INFER_EDITS = {
    "exclusion with a typo": (
        ('{cuda: "12.9", python: "3.11"}', "{family: hoper}"),
        "key 'exclude[0]' matches no variant: family is never 'hoper'. Did you mean 'hopper'?",
    ),
    "exclusion of a CUDA version the spec lacks": (
        ('{cuda: "12.9", python: "3.11"}', '{cuda: "12.8.0"}'),
        "key 'exclude[0]' matches no variant: cuda is never '12.8.0'",
    ),
    "exclusion with a bare version": (
        ('{cuda: "12.9", python: "3.11"}', '{cuda: "12.9", python: 3.10}'),
        "key 'exclude[0].python': 3.1 is a number to YAML (3.10 would become 3.1",
    ),
    "axis with bare versions": (
        ('python: ["3.11", "3.12"]', "python: [3.10, 3.12]"),
        "key 'axes.python': 3.1 is a number to YAML",
    ),
    "no variant at all": (
        (
            "families: [ampere, ada-lovelace, hopper, blackwell]",
            "families: [ampere]\nrequires: [fp8]",
        ),
        "the spec yields no variant: every combination is left out",
    ),
}


@pytest.mark.parametrize("case", sorted(INFER_EDITS))
def test_silent_no_ops_are_refused(cli: CliRunner, tmp_path: Path, case: str) -> None:
    (old, new), message = INFER_EDITS[case]
    images = tmp_path / "images"
    shutil.copytree(IMAGES / "infer", images / "infer")
    spec = images / "infer" / "image.yaml"
    text = spec.read_text()
    assert old in text
    text = text.replace(old, new, 1)
    if "requires: [fp8]" in new:  # the spec's own requires line would come twice
        text = text.replace("requires: [bf16]\n", "")
    spec.write_text(text)
    result = cli("matrix", "--images", str(images))
    assert result.code == 2, result.out
    assert message in result.err


def test_bake_target_names_never_collide(cli: CliRunner, tmp_path: Path) -> None:
    """Axis values a.b and a-b give different tags but one bake target name."""
    images = _copy_example(tmp_path)
    spec = images / "train-fp8" / "image.yaml"
    spec.write_text(
        spec.read_text().replace(
            'tag: "{version}-cu{cuda_major}{cuda_minor}-{family}"',
            'axes:\n  variant: ["a.b", "a-b"]\n'
            'tag: "{version}-cu{cuda_major}{cuda_minor}-{family}-{variant}"',
        )
    )
    assert cli("matrix", "--images", str(images)).code == 0  # the github matrix is fine
    result = cli("matrix", "--images", str(images), "--format", "bake")
    assert result.code == 2
    assert "both become the bake target" in result.err


@pytest.mark.parametrize(
    ("repository", "registry", "tag"),
    [
        ("ml/train-fp8", "ghcr.io/example-org", "ghcr.io/example-org/ml/train-fp8:"),
        ("ml/train-fp8", "127.0.0.1:5000", "127.0.0.1:5000/ml/train-fp8:"),
        ("ml/train-fp8", "localhost:5000/", "localhost:5000/ml/train-fp8:"),
        ("ml/train-fp8", None, "ml/train-fp8:"),  # as written: Docker Hub semantics
        # a host in the spec is deliberate and kept
        ("registry.example.com/ml/x", "ghcr.io/org", "registry.example.com/ml/x:"),
        ("localhost/ml/x", "ghcr.io/org", "localhost/ml/x:"),
    ],
)
def test_registry_prefix(
    tmp_path: Path, cli: CliRunner, repository: str, registry: str | None, tag: str
) -> None:
    images = _copy_example(tmp_path)
    spec = images / "train-fp8" / "image.yaml"
    spec.write_text(re.sub(r"(?m)^repository: .*$", f"repository: {repository}", spec.read_text()))
    args = ["matrix", "--images", str(images)] + (["--registry", registry] if registry else [])
    for fmt in ("github", "bake"):
        result = cli(*args, "--format", fmt)
        assert result.code == 0, result.err
        doc = result.json()
        entries = doc["include"] if fmt == "github" else list(doc["target"].values())
        assert entries
        assert all(t.startswith(tag) for e in entries for t in e["tags"])


def test_registry_from_the_environment_and_bad_prefixes(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BUILDMATRIX_REGISTRY", "ghcr.io/env-org")
    entry = cli("matrix").json()["include"][0]
    assert entry["tags"][0].startswith("ghcr.io/env-org/ml/")
    for bad in ("ghcr.io/Org", "ghcr.io//org", "https://ghcr.io/org", "ghcr.io/org:tag"):
        result = cli("matrix", "--registry", bad)
        assert result.code == 2, bad
        assert "is not a registry prefix; expected HOST[:PORT][/PATH]" in result.err
        assert result.out == ""
