"""The platform axis: image specs x the CPU architectures the profiles' products come
with (docs/generate.md, "Platforms"). Properties over the shipped specs and profiles,
and every way a spec can ask for platforms, right or wrong."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from buildmatrix.cuda import load_cuda_facts
from buildmatrix.matrix import expand_all, merges
from buildmatrix.profile_files import load_profiles
from buildmatrix.specs import load_specs
from buildmatrix.variant import Entry
from tests.conftest import REPO, SHIPPED_PROFILES, CliRunner, validate
from tests.services import Registry

PROFILES = load_profiles(SHIPPED_PROFILES)
FACTS = load_cuda_facts()
TRAIN = 'tag: "{version}-cu{cuda_major}{cuda_minor}-{family}"'


def _images(tmp_path: Path, extra: str = "") -> Path:
    images = tmp_path / "images"
    shutil.copytree(REPO / "images" / "train-fp8", images / "train-fp8")
    spec = images / "train-fp8" / "image.yaml"
    spec.write_text(spec.read_text() + extra)
    return images


def test_default_platforms_are_the_products_hosts() -> None:
    """Every shipped variant is built for exactly the platforms some product of its
    SMs sits behind, and each platform's entry holds exactly the SMs with a product
    there; the merge job of a tag lists exactly its build entries' platforms."""
    m = expand_all(
        load_specs(REPO / "images", PROFILES, facts=FACTS), PROFILES, facts=FACTS, out=Path("build")
    )
    by_tag: dict[str, list[Entry]] = {}
    for e in m.entries:
        by_tag.setdefault(e.image_ref, []).append(e)
    for ref, group in by_tag.items():
        union = {p for e in group for p in e.profiles}  # the variant's kept SMs
        want = [
            plat
            for plat in ("linux/amd64", "linux/arm64")
            if any(plat in p.platforms for p in union)
        ]
        assert [e.platform for e in group] == want, ref
        for e in group:
            assert set(e.profiles) == {p for p in union if e.platform in p.platforms}
            assert e.runner == ("ubuntu-24.04-arm" if e.arch == "arm64" else "ubuntu-24.04")
            assert e.emulated is False
        shared = len({e.dockerfile for e in group}) == 1
        assert shared is (len({e.profiles for e in group}) == 1), ref
    assert {mg["tags"][0]: mg["platforms"] for mg in merges(m.entries)} == {
        ref: [e.platform for e in group] for ref, group in by_tag.items()
    }
    # a Grace node of each family can pull its family tag
    grace = {"hopper": "NVIDIA GH200 480GB", "blackwell": "NVIDIA GB200"}
    for family, product in grace.items():
        for ref, group in by_tag.items():
            if group[0].family.value == family:
                arm = next(e for e in group if e.arch == "arm64")
                assert PROFILES.by_product(product) in arm.profiles, ref


def test_platforms_override_and_emulate(tmp_path: Path, cli: CliRunner) -> None:
    amd = _images(tmp_path / "a", "platforms: [linux/amd64]\n")
    doc = cli("matrix", "--images", str(amd)).json()
    assert {e["platform"] for e in doc["include"]} == {"linux/amd64"}
    assert {e["runner"] for e in doc["include"]} == {"ubuntu-24.04"}
    qemu = _images(tmp_path / "q", "emulate: [linux/arm64]\n")
    doc = cli("matrix", "--images", str(qemu)).json()
    arm = [e for e in doc["include"] if e["platform"] == "linux/arm64"]
    assert arm
    assert all(e["runner"] == "ubuntu-24.04" and e["qemu"] is True for e in arm)
    assert all(e["qemu"] is False for e in doc["include"] if e["arch"] == "amd64")


def test_exclusions_and_explain_name_the_platform(tmp_path: Path, cli: CliRunner) -> None:
    images = _images(tmp_path, "exclude:\n  - {family: blackwell, platform: linux/amd64}\n")
    result = cli("matrix", "--images", str(images), "--format", "json", "--explain")
    assert result.code == 0, result.err
    assert (
        "left out  train-fp8: blackwell cuda 13.3.1 linux/amd64: excluded by the spec "
        "(family=blackwell, platform=linux/amd64)"
    ) in result.err
    blackwell = [e for e in result.json()["entries"] if e["family"] == "blackwell"]
    assert {e["platform"] for e in blackwell} == {"linux/arm64"}


BAD = {
    "tag with the platform": (
        TRAIN.replace("{family}", "{family}-{platform}"),
        "key 'tag' uses '{platform}', but every platform of a variant shares one tag",
    ),
    "emulating a platform not built": (
        TRAIN + "\nplatforms: [linux/amd64]\nemulate: [linux/arm64]",
        "key 'emulate' names linux/arm64, which 'platforms' does not build",
    ),
    "a platform no profile knows": (
        TRAIN + "\nplatforms: [linux/s390x]",
        "key 'platforms[0]': 'linux/s390x' is not one of",
    ),
    "an exclusion of a platform never built": (
        TRAIN + "\nplatforms: [linux/amd64]\nexclude:\n  - {platform: linux/arm64}",
        "key 'exclude[0]' matches no variant: platform is never 'linux/arm64'",
    ),
    "an axis named platform": (
        TRAIN + '\naxes:\n  platform: ["x"]',
        "key 'axes': 'platform' is a built-in field",
    ),
}


@pytest.mark.parametrize(("text", "message"), BAD.values(), ids=BAD.keys())
def test_bad_platform_specs_exit_2(tmp_path: Path, cli: CliRunner, text: str, message: str) -> None:
    images = _images(tmp_path)
    spec = images / "train-fp8" / "image.yaml"
    spec.write_text(spec.read_text().replace(TRAIN, text))
    result = cli("matrix", "--images", str(images))
    assert result.code == 2, result.out
    assert message in result.err


def _profiles_with_hosts(tmp_path: Path, hosts: dict[str, str]) -> Path:
    """A copy of the shipped profiles whose SMs in ``hosts`` come with one host only."""
    folder = tmp_path / "profiles"
    shutil.copytree(SHIPPED_PROFILES, folder)
    for sm, arch in hosts.items():
        path = folder / f"{sm}.yaml"
        lines = path.read_text().splitlines()
        kept = [line for line in lines if not line.startswith("hosts:")]
        kept = [
            line.replace(", hosts: [amd64]", "").replace(", hosts: [arm64]", "") for line in kept
        ]
        kept.insert(kept.index("products:"), f"hosts: [{arch}]")
        path.write_text("\n".join(kept) + "\n")
    return folder


def test_require_arch_per_platform_where_it_differs(tmp_path: Path, cli: CliRunner) -> None:
    """With Blackwell's sm_100 on x86 hosts only and sm_120/sm_121 on Arm only, the two
    platforms of a Blackwell tag hold different SMs, so each gets its own Dockerfile
    whose NVIDIA_REQUIRE_ARCH admits the GPUs of its own SMs."""
    profiles = _profiles_with_hosts(
        tmp_path, {"sm_100": "amd64", "sm_103": "amd64", "sm_120": "arm64", "sm_121": "arm64"}
    )
    images = _images(tmp_path)
    out = tmp_path / "build"
    gen = cli("generate", "--images", str(images), "--profiles", str(profiles), "--out", str(out))
    assert gen.code == 0, gen.err
    amd = (out / "train-fp8" / "1.4.0-cu133-blackwell.amd64.Dockerfile").read_text()
    arm = (out / "train-fp8" / "1.4.0-cu133-blackwell.arm64.Dockerfile").read_text()
    require = {
        name: next(line for line in text.splitlines() if "NVIDIA_REQUIRE_ARCH" in line)
        for name, text in (("amd64", amd), ("arm64", arm))
    }
    assert require["amd64"] != require["arm64"]
    # 10.0 and 10.3 to 10.9, not Thor's 10.1 (integrated: no desktop SASS runs there)
    assert "arch=10.0," in require["amd64"] and "arch>=10.3,arch<11.0," in require["amd64"]
    assert "arch>=12" not in require["amd64"]
    assert "arch>=10" not in require["arm64"]
    assert "arch>=12.0," in require["arm64"]
    # a spec that asks for arm64 of a family whose products have no Arm host drops it
    ada = _profiles_with_hosts(tmp_path / "ada", {"sm_89": "amd64"})
    spec = images / "train-fp8" / "image.yaml"
    spec.write_text(spec.read_text() + "platforms: [linux/amd64, linux/arm64]\n")
    result = cli(
        "matrix", "--images", str(images), "--profiles", str(ada), "--format", "json", "--explain"
    )
    assert result.code == 0, result.err
    assert (
        "train-fp8: ada-lovelace cuda 13.3.1 linux/arm64: no product of sm_89 comes with an "
        "arm64 host"
    ) in result.err


def test_an_image_offers_its_index_entries_or_its_config_platform(tmp_path: Path) -> None:
    """``ScannedImage.offered``: an index's runnable entries in index order (buildx's
    attestation manifests, platform unknown/unknown, are none), else the config's."""
    from buildmatrix.image.offered import offered_platforms
    from buildmatrix.image.open import scan_image
    from tests.images import Image, write_docker_archive, write_platform_layout

    attestation = {
        "platform": {"os": "unknown", "architecture": "unknown"},
        "annotations": {"vnd.docker.reference.type": "attestation-manifest"},
    }
    arm = {"platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}}
    amd = {"platform": {"os": "linux", "architecture": "amd64"}}

    def unread(desc: object, what: str) -> dict[str, object]:
        raise AssertionError(f"entries with a platform are not read ({what})")

    index = {"manifests": [amd, attestation, arm, amd]}
    assert offered_platforms({}, index, fetch=unread, name="t") == (
        "linux/amd64",
        "linux/arm64/v8",
    )
    entries: list[tuple[dict[str, str] | None, Image]] = [
        (
            {"os": "linux", "architecture": a},
            Image(layers=[{}], platform={"os": "linux", "architecture": a}),
        )
        for a in ("arm64", "amd64")
    ]
    layout = write_platform_layout(tmp_path / "multi", entries)
    image = scan_image(f"oci:{layout}:multi")
    assert image.offered == ("linux/arm64", "linux/amd64")
    assert image.config.platform == "linux/amd64"  # the entry containerd pulls on amd64
    single = write_docker_archive(
        tmp_path / "one.tar", Image(layers=[{}], platform={"os": "linux", "architecture": "arm64"})
    )
    assert scan_image(f"docker-archive:{single}", platform="linux/arm64").offered == (
        "linux/arm64",
    )


# ------------------------------------------------ check judges every platform offered


def _grace_index(tmp_path: Path) -> Path:
    """An index whose amd64 entry has Hopper code (sm_80, sm_90 SASS, compute_90 PTX)
    and whose arm64 entry, the one a GH200 node pulls, has sm_80 only."""
    from tests.images import Image, fixture, write_platform_layout

    def image(arch: str, lib: str) -> tuple[dict[str, str], Image]:
        platform = {"os": "linux", "architecture": arch}
        return platform, Image(layers=[{"usr/lib/libk.so": fixture(lib)}], platform=platform)

    entries = [image("amd64", "libsass_ptx.so"), image("arm64", "libsass_sm80.so")]
    return write_platform_layout(tmp_path / "grace", list(entries))


def _check_both_ways(cli: CliRunner, ref: str) -> None:
    judged = cli("check", ref, "--sm", "9.0", "--json")
    assert judged.code == 1, judged.out + judged.err
    doc = judged.json()
    validate_check_json(doc)
    assert doc["verdict"] == "fail"
    assert doc["platform"] == "linux/amd64"
    assert [(p["platform"], p["verdict"]) for p in doc["platforms"]] == [
        ("linux/amd64", "pass"),
        ("linux/arm64", "fail"),
    ]
    assert doc["problems"]
    assert all(p.startswith("linux/arm64: ") for p in doc["problems"]), doc["problems"]
    assert doc["platforms"][1]["files"][0]["sass"] == ["sm_80"]
    text = cli("check", ref, "--sm", "9.0")
    assert text.code == 1
    assert "== platform linux/arm64" in text.out
    assert "linux/amd64 pass, linux/arm64 FAIL" in text.out
    narrowed = cli("check", ref, "--sm", "9.0", "--platform", "linux/amd64", "--json")
    assert narrowed.code == 0, narrowed.out + narrowed.err
    assert [p["platform"] for p in narrowed.json()["platforms"]] == ["linux/amd64"]
    arm = cli("check", ref, "--sm", "9.0", "--platform", "linux/arm64", "--json")
    assert arm.code == 1
    # sm_80 runs on both entries: both judged, both pass
    both = cli("check", ref, "--sm", "8.0", "--json")
    assert both.code == 0, both.out
    assert [p["verdict"] for p in both.json()["platforms"]] == ["pass", "pass"]


def validate_check_json(doc: dict[str, object]) -> None:
    import json

    schema = json.loads((REPO / "buildmatrix/schemas/check.schema.json").read_text())
    validate(doc, schema)


def test_check_judges_the_arm64_entry_of_an_oci_index(tmp_path: Path, cli: CliRunner) -> None:
    _check_both_ways(cli, f"oci:{_grace_index(tmp_path)}:multi")


def test_check_judges_only_platforms_a_target_sits_behind(tmp_path: Path, cli: CliRunner) -> None:
    """GB10 (sm_121) comes with an Arm host only (arch-profiles/sm_121.yaml): for it
    the amd64 entry is not judged, and an HGX H100 (amd64) is judged on amd64 alone."""
    ref = f"oci:{_grace_index(tmp_path)}:multi"
    gb10 = cli("check", ref, "--sm", "12.1", "--json")
    assert [p["platform"] for p in gb10.json()["platforms"]] == ["linux/arm64"]
    snapshot = REPO / "tests" / "fixtures" / "nodes" / "h100-580.json"
    node = cli("check", ref, "--snapshot", str(snapshot), "--json")
    assert node.code == 0, node.out + node.err
    assert [p["platform"] for p in node.json()["platforms"]] == ["linux/amd64"]


@pytest.mark.integration
def test_check_judges_the_arm64_entry_in_a_registry(
    tmp_path: Path, cli: CliRunner, registry: Registry
) -> None:
    from tests.test_image_sources import skopeo

    layout = _grace_index(tmp_path)
    ref = f"{registry.host}/bmtest/grace:v1"
    skopeo("copy", "--all", "--dest-tls-verify=false", f"oci:{layout}:multi", f"docker://{ref}")
    _check_both_ways(cli, f"docker://{ref}")


def _node(tmp_path: Path, *, cpu: str, gpu: str) -> Path:
    """The h100-580 fixture node with another GPU name and the CPU it records."""
    import json

    doc = json.loads((REPO / "tests/fixtures/nodes/h100-580.json").read_text())
    doc["cpu"] = cpu
    for g in doc["gpus"]:
        g["name"] = gpu
    path = tmp_path / f"{cpu}.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_snapshot_judges_the_entry_its_node_pulls(tmp_path: Path, cli: CliRunner) -> None:
    """A snapshot that records the node's CPU (smoke --record writes ``cpu``) is
    judged on exactly the entry that node's runtime pulls: a GH200 node on the arm64
    entry (sm_80 only: fail), an x86 H100 node on the amd64 one (pass); a lone amd64
    image is refused for the Grace node, which would find nothing to pull."""
    from tests.images import Image, fixture, write_docker_archive

    ref = f"oci:{_grace_index(tmp_path)}:multi"
    grace = _node(tmp_path, cpu="arm64", gpu="NVIDIA GH200 480GB")
    hgx = _node(tmp_path, cpu="amd64", gpu="NVIDIA H100 80GB HBM3")
    on_grace = cli("check", ref, "--snapshot", str(grace), "--json")
    assert on_grace.code == 1, on_grace.out + on_grace.err
    assert [p["platform"] for p in on_grace.json()["platforms"]] == ["linux/arm64"]
    assert on_grace.json()["files"][0]["sass"] == ["sm_80"]
    on_hgx = cli("check", ref, "--snapshot", str(hgx), "--json")
    assert on_hgx.code == 0, on_hgx.out + on_hgx.err
    assert [p["platform"] for p in on_hgx.json()["platforms"]] == ["linux/amd64"]
    lone = write_docker_archive(
        tmp_path / "amd.tar", Image(layers=[{"usr/lib/libk.so": fixture("libsass_ptx.so")}])
    )
    refused = cli("check", f"docker-archive:{lone}", "--snapshot", str(grace))
    assert refused.code == 2, refused.out
    assert "no image for platform linux/arm64" in refused.err
    assert cli("check", f"docker-archive:{lone}", "--snapshot", str(hgx)).code == 0
    # a smoke on the recorded Grace node judges the arm64 entry too
    smoke = cli("smoke", "--snapshot", str(grace), "--image", ref, "--json")
    assert smoke.code == 1, smoke.out
    failed = [c["message"] for c in smoke.json()["checks"] if not c["ok"]]
    assert any("sm_80" in m for m in failed), failed
    assert cli("smoke", "--snapshot", str(hgx), "--image", ref).code == 0


def test_the_probe_records_the_cpu_as_the_kubelet_names_it() -> None:
    import platform

    from buildmatrix.node.probe import host_cpu

    machine = platform.machine()
    expected = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    assert host_cpu() == expected
