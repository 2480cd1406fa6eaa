"""Arch profiles: the shipped ones are valid, and every kind of bad file is refused
with exit 2 and a message naming the file, the key and the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml
from packaging.version import Version

from buildmatrix.arch import Family
from buildmatrix.errors import InputError
from buildmatrix.profile_files import load_profiles
from tests.conftest import REPO, SHIPPED_PROFILES, CliRunner, validate

SCHEMA = json.loads((REPO / "buildmatrix/schemas/arch-profile.schema.json").read_text())


@pytest.mark.parametrize("path", sorted(SHIPPED_PROFILES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_profile_matches_schema(path: Path) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    validate(yaml.safe_load(path.read_text()), SCHEMA)


def test_shipped_profiles_cover_the_fleet() -> None:
    profiles = load_profiles(SHIPPED_PROFILES)
    sms = {p.sm for p in profiles}
    assert {"sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_103", "sm_120"} <= sms
    products = {name for p in profiles for name in p.products}
    for name in ["NVIDIA A100-SXM4-80GB", "NVIDIA A40", "NVIDIA L40S", "NVIDIA H100 80GB HBM3",
                 "NVIDIA H200", "NVIDIA B200", "NVIDIA GB200",
                 "NVIDIA RTX PRO 6000 Blackwell Server Edition"]:  # fmt: skip
        assert name in products
    # FP8 tensor cores exactly where CC >= 8.9.
    for p in profiles:
        assert ("fp8" in p.features) is (p.cc.number >= 89), p.sm
    assert str(profiles.get("sm_90").min_driver) == "525.60.13"
    assert [p.sm for p in profiles.family("blackwell")] == ["sm_100", "sm_103", "sm_120", "sm_121"]
    assert profiles.by_product("NVIDIA H200") is profiles.get("sm_90")


def test_derived_build_flags_follow_the_toolkit() -> None:
    hopper = load_profiles(SHIPPED_PROFILES).get("sm_90")
    assert hopper.gencode(Version("12.4")) == (
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_90,code=compute_90",
    )
    # CUDA 11.8 cannot build sm_90a: it is left out rather than failing the build.
    assert hopper.gencode(Version("11.8")) == (
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    )
    assert hopper.torch_arch_list(Version("12.4")) == ("9.0+PTX", "9.0a")
    assert hopper.cmake_architectures(Version("11.8")) == ("90-real", "90-virtual")
    ampere = load_profiles(SHIPPED_PROFILES).get("sm_86")
    assert ampere.gencode() == ("-gencode=arch=compute_86,code=sm_86",)
    assert ampere.torch_arch_list() == ("8.6",)
    volta = load_profiles(SHIPPED_PROFILES).get("sm_70")
    assert volta.supports_cuda(Version("12.9"))
    assert not volta.supports_cuda(Version("13.0"))
    assert not hopper.supports_cuda(Version("11.7"))


GOOD = """\
sm: sm_90
compute_capability: "9.0"
family: hopper
products: [NVIDIA H100 80GB HBM3]
min_cuda: "11.8"
min_driver: "525.60.13"
features: [bf16, fp8]
"""


def _folder(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "profiles"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_good_minimal_profile_loads(tmp_path: Path, cli: CliRunner) -> None:
    folder = _folder(tmp_path, {"sm_90.yaml": GOOD})
    result = cli("profiles", "--profiles", str(folder), "--json")
    assert result.code == 0, result.err
    (profile,) = result.json()["profiles"]
    assert profile["ptx"] is False
    assert profile["max_cuda"] is None


BAD_CASES = {
    "wrong type": (
        GOOD.replace('min_cuda: "11.8"', "min_cuda: 11.8"),
        "key 'min_cuda': expected string, got 11.8",
    ),
    "products not a list": (
        GOOD.replace("products: [NVIDIA H100 80GB HBM3]", "products: NVIDIA H100"),
        "key 'products': expected array",
    ),
    "unknown key": (
        GOOD.replace("min_driver:", "min_drivr:"),
        "unknown key 'min_drivr'. Did you mean 'min_driver'?",
    ),
    "missing key": (
        GOOD.replace("family: hopper\n", ""),
        "'family' is a required property",
    ),
    "unknown family": (
        GOOD.replace("family: hopper", "family: hoper"),
        "key 'family': 'hoper' is not one of tesla, fermi, kepler",
    ),
    "unknown feature": (
        GOOD.replace("[bf16, fp8]", "[bf16, fp9]"),
        "key 'features[1]': 'fp9' is not one of",
    ),
    "family not matching CC": (
        GOOD.replace("family: hopper", "family: ampere"),
        "key 'family' is 'ampere' but compute capability 9.0 belongs to 'hopper'",
    ),
    "CC not matching SM": (
        GOOD.replace('"9.0"', '"8.0"'),
        "key 'compute_capability' is 8.0 but sm_90 means 9.0",
    ),
    "unparsable driver": (
        GOOD.replace('"525.60.13"', '"R525"'),
        "key 'min_driver': 'R525' does not have the expected form",
    ),
    "unparsable CUDA": (
        GOOD.replace('"11.8"', '"eleven"'),
        "key 'min_cuda': 'eleven' does not have the expected form",
    ),
    "CUDA too old for the SM": (
        GOOD.replace('"11.8"', '"11.0"'),
        "key 'min_cuda' is 11.0 but sm_90 needs CUDA 11.8 or newer",
    ),
    "max below min": (
        GOOD + 'max_cuda: "11.7"\n',
        "key 'max_cuda' (11.7) is older than min_cuda (11.8)",
    ),
    "feature the hardware lacks": (
        GOOD.replace("[bf16, fp8]", "[bf16, fp8, fp4]"),
        "lists fp4, which needs compute capability 10.0 or newer; sm_90 is 9.0",
    ),
    "empty file": ("", "the file is empty"),
    "not YAML": ("sm: [sm_90\nfamily: {", "not valid YAML at line"),
    "not a mapping": ("- sm_90\n- sm_80\n", "top level: expected object"),
    "duplicate key": (GOOD + "family: ampere\n", "duplicate key 'family'"),
}


@pytest.mark.parametrize(("text", "message"), BAD_CASES.values(), ids=BAD_CASES.keys())
def test_bad_profile_exits_2(tmp_path: Path, cli: CliRunner, text: str, message: str) -> None:
    folder = _folder(tmp_path, {"sm_90.yaml": text})
    result = cli("profiles", "--profiles", str(folder))
    assert result.code == 2
    assert result.out == ""
    assert str(folder / "sm_90.yaml") in result.err
    assert message in result.err


SM110 = """\
sm: sm_110
compute_capability: "11.0"
family: undefined
products: [NVIDIA Jetson Thor]
min_cuda: "13.0"
min_driver: "580.65.06"
features: [bf16, fp8]
arch_specific: true
"""


def test_sm_without_a_gfd_family_uses_undefined(tmp_path: Path, cli: CliRunner) -> None:
    """CC 11.x is in the CUDA facts, but GFD maps no family to it: it labels such a
    node gpu.family=undefined, and a profile says the same, then builds like any other."""
    wrong = _folder(tmp_path / "wrong", {"sm_110.yaml": SM110.replace("undefined", "blackwell")})
    result = cli("profiles", "--profiles", str(wrong))
    assert result.code == 2
    assert "belongs to 'undefined' (GPU Feature Discovery's mapping); set family: undefined" in (
        result.err
    )
    good = _folder(tmp_path / "good", {"sm_110.yaml": SM110, "sm_90.yaml": GOOD})
    profile = load_profiles(good).get("sm_110")
    assert profile.family is Family.UNDEFINED
    assert profile.gencode(Version("13.0")) == (
        "-gencode=arch=compute_110,code=sm_110",
        "-gencode=arch=compute_110a,code=sm_110a",
    )
    images = tmp_path / "images" / "thor"
    images.mkdir(parents=True)
    (images / "Dockerfile.j2").write_text("FROM scratch\n")
    (images / "image.yaml").write_text(
        "name: thor\nrepository: registry.example.com/thor\nversion: '1.0'\n"
        "template: Dockerfile.j2\ncuda: ['13.0.2']\nfamilies: [undefined, hopper]\n"
        "tag: '{version}-{family}'\n"
    )
    matrix = cli(
        "matrix", "--images", str(tmp_path / "images"), "--profiles", str(good), "--format", "json"
    )
    assert matrix.code == 0, matrix.err
    by_family = {e["family"]: e for e in matrix.json()["entries"]}
    assert by_family["undefined"]["sm"] == ["sm_110"]
    # 11.0 is Thor's, an integrated GPU: its SASS runs on 11.0 alone (docs/compatibility.md)
    assert by_family["undefined"]["nvidia_require_arch"].startswith("arch=11.0,")


def test_sm_no_toolkit_targets_is_refused(tmp_path: Path, cli: CliRunner) -> None:
    made_up = GOOD.replace("sm_90", "sm_91").replace('"9.0"', '"9.1"')
    result = cli("profiles", "--profiles", str(_folder(tmp_path, {"sm_91.yaml": made_up})))
    assert result.code == 2
    assert "no CUDA toolkit in buildmatrix's CUDA facts targets sm_91" in result.err
    assert "sm_90, sm_100, sm_103" in result.err  # the known ones, in order


def test_arch_specific_needs_an_a_target(tmp_path: Path, cli: CliRunner) -> None:
    """sm_86 has no sm_86a: arch_specific: true would silently build nothing more."""
    text = (
        'sm: sm_86\ncompute_capability: "8.6"\nfamily: ampere\nproducts: [NVIDIA A40]\n'
        'min_cuda: "11.1"\nmin_driver: "455.23.05"\nfeatures: [bf16]\narch_specific: true\n'
    )
    result = cli("profiles", "--profiles", str(_folder(tmp_path, {"sm_86.yaml": text})))
    assert result.code == 2
    assert "key 'arch_specific' is true but no CUDA toolkit builds sm_86a" in result.err
    ok = cli(
        "profiles",
        "--profiles",
        str(_folder(tmp_path / "ok", {"sm_86.yaml": text.replace("true", "false")})),
    )
    assert ok.code == 0, ok.err


def test_volta_needs_max_cuda(tmp_path: Path) -> None:
    text = (SHIPPED_PROFILES / "sm_70.yaml").read_text().replace('max_cuda: "12.9"\n', "")
    folder = _folder(tmp_path, {"sm_70.yaml": text})
    with pytest.raises(InputError, match=r'CUDA 12.9 is the last toolkit .* set max_cuda: "12.9"'):
        load_profiles(folder)


def test_duplicate_sm_across_files(tmp_path: Path, cli: CliRunner) -> None:
    folder = _folder(tmp_path, {"sm_90.yaml": GOOD, "sm_90.yml": GOOD})
    result = cli("profiles", "--profiles", str(folder))
    assert result.code == 2
    assert "sm_90 is already defined in" in result.err


def test_file_name_must_match_sm(tmp_path: Path, cli: CliRunner) -> None:
    folder = _folder(tmp_path, {"hopper.yaml": GOOD})
    result = cli("profiles", "--profiles", str(folder))
    assert result.code == 2
    assert "name the file sm_90.yaml" in result.err


def test_product_listed_twice(tmp_path: Path) -> None:
    other = GOOD.replace("sm_90", "sm_89").replace('"9.0"', '"8.9"')
    other = other.replace("hopper", "ada-lovelace")
    folder = _folder(tmp_path, {"sm_90.yaml": GOOD, "sm_89.yaml": other})
    with pytest.raises(InputError, match="'NVIDIA H100 80GB HBM3' is also listed in"):
        load_profiles(folder)


def test_missing_and_empty_folders(tmp_path: Path, cli: CliRunner) -> None:
    result = cli("profiles", "--profiles", str(tmp_path / "nope"))
    assert result.code == 2
    assert "does not exist" in result.err
    result = cli("profiles", "--profiles", str(tmp_path))
    assert result.code == 2
    assert "holds no .yaml files" in result.err


def test_env_var_selects_folder(
    tmp_path: Path, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _folder(tmp_path, {"sm_90.yaml": GOOD})
    monkeypatch.setenv("BUILDMATRIX_PROFILES", str(folder))
    result = cli("profiles", "--json")
    assert [p["sm"] for p in result.json()["profiles"]] == ["sm_90"]
    # --profiles wins over the environment.
    result = cli("profiles", "--json", "--profiles", str(SHIPPED_PROFILES))
    assert len(result.json()["profiles"]) == len(list(SHIPPED_PROFILES.glob("*.yaml")))


def test_user_folder_copy_of_shipped(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    shutil.copytree(SHIPPED_PROFILES, folder)
    (folder / "sm_75.yaml").unlink()
    assert "sm_75" not in {p.sm for p in load_profiles(folder)}


# The host CPU of each product, by its form factor as NVIDIA names it (an oracle apart
# from the profiles): Grace superchips are arm64 only; SXM boards on HGX baseboards
# have x86 hosts; PCIe, NVL (PCIe) and workstation cards sit in x86 and Arm SBSA servers.
_GRACE = ("GH200", "GB200", "GB300", "GB10")
# NVML names of SXM boards that do not say "SXM" (HGX H100/H200/H20, HGX B100/B200)
_SXM = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H20", "NVIDIA B100", "NVIDIA B200")


def _expected_hosts(product: str) -> tuple[str, ...]:
    if any(g in product for g in _GRACE):
        return ("arm64",)
    if product in _SXM or "SXM" in product:
        return ("amd64",)
    return ("amd64", "arm64")


def test_every_shipped_product_names_its_host_cpus() -> None:
    profiles = load_profiles(SHIPPED_PROFILES)
    for p in profiles:
        for product in p.products:
            assert p.hosts(product) == _expected_hosts(product), (p.sm, product)
        # an SM's platforms are exactly its products' hosts, in order
        union = {a for product in p.products for a in p.hosts(product)}
        assert p.platforms == tuple(f"linux/{a}" for a in ("amd64", "arm64") if a in union)
    for family in profiles.families:
        members = profiles.family(family.value)
        want = {f"linux/{a}" for p in members for product in p.products for a in p.hosts(product)}
        assert set(profiles.family_platforms(family.value)) == want
    assert profiles.get("sm_121").platforms == ("linux/arm64",)
    assert profiles.platforms_of_cc(profiles.get("sm_90").cc, "NVIDIA GH200 480GB") == (
        "linux/arm64",
    )
    assert profiles.platforms_of_cc(profiles.get("sm_90").cc, "NVIDIA H100 80GB HBM3") == (
        "linux/amd64",
    )


def test_hosts_default_to_every_platform_and_show(tmp_path: Path, cli: CliRunner) -> None:
    folder = _folder(tmp_path, {"sm_90.yaml": GOOD})
    loaded = load_profiles(folder)
    assert loaded.get("sm_90").hosts("NVIDIA H100 80GB HBM3") == ("amd64", "arm64")
    grace = GOOD.replace(
        "products: [NVIDIA H100 80GB HBM3]",
        "hosts: [amd64]\nproducts: [NVIDIA H100 80GB HBM3,"
        " {name: NVIDIA GH200 480GB, hosts: [arm64]}]",
    )
    (folder / "sm_90.yaml").write_text(grace)
    result = cli("profiles", "--profiles", str(folder), "--json")
    assert result.code == 0, result.err
    (profile,) = result.json()["profiles"]
    assert profile["hosts"] == {"NVIDIA H100 80GB HBM3": ["amd64"], "NVIDIA GH200 480GB": ["arm64"]}
    assert profile["platforms"] == ["linux/amd64", "linux/arm64"]
    assert result.json()["family_platforms"] == {"hopper": ["linux/amd64", "linux/arm64"]}
    shown = cli("profiles", "--profiles", str(folder), "show", "9.0")
    assert "NVIDIA GH200 480GB: arm64" in shown.out
    table = cli("profiles", "--profiles", str(folder))
    assert "hopper: linux/amd64, linux/arm64" in table.out


HOST_CASES = {
    "unknown architecture": (
        GOOD.replace("products:", "hosts: [ppc64le]\nproducts:"),
        "key 'hosts[0]': 'ppc64le' is not one of",
    ),
    "product hosts as the profile's": (
        GOOD.replace(
            "products: [NVIDIA H100 80GB HBM3]",
            "hosts: [amd64]\nproducts: [{name: NVIDIA H100 80GB HBM3, hosts: [amd64]}]",
        ),
        "has hosts ['amd64'], the same as the profile's 'hosts'",
    ),
    "floor without its source": (
        GOOD.replace(
            "products: [NVIDIA H100 80GB HBM3]",
            'products: [{name: NVIDIA H200, min_driver: "550.90.07"}]',
        ),
        "source",
    ),
}


@pytest.mark.parametrize(("text", "message"), HOST_CASES.values(), ids=HOST_CASES.keys())
def test_bad_hosts_exit_2(tmp_path: Path, cli: CliRunner, text: str, message: str) -> None:
    folder = _folder(tmp_path, {"sm_90.yaml": text})
    result = cli("profiles", "--profiles", str(folder))
    assert result.code == 2, result.out
    assert str(folder / "sm_90.yaml") in result.err
    assert message in result.err


def test_a_profile_edited_between_two_loads_is_read_anew(cli: CliRunner, tmp_path: Path) -> None:
    """load_profiles keeps what it parsed by path and text, within one process
    (profile_files._shipped_facts_profile): a file edited between two commands is
    read again, and a broken one is refused on every load, not only the first."""
    folder = tmp_path / "profiles"
    shutil.copytree(SHIPPED_PROFILES, folder)
    hopper = folder / "sm_90.yaml"
    text = hopper.read_text()
    assert str(load_profiles(folder).get("sm_90").min_driver) == "525.60.13"
    hopper.write_text(text.replace('min_driver: "525.60.13"', 'min_driver: "535.54.03"', 1))
    assert str(load_profiles(folder).get("sm_90").min_driver) == "535.54.03"
    hopper.write_text(text.replace("sm: sm_90", "sm: sm_80", 1))
    for _ in range(2):
        r = cli("profiles", "--profiles", str(folder))
        assert r.code == 2, r.out
        assert "key 'sm' is 'sm_80' but the file is named sm_90.yaml" in r.err
    hopper.write_text(text)
    assert cli("profiles", "--profiles", str(folder)).code == 0
    assert str(load_profiles(folder).get("sm_90").min_driver) == "525.60.13"
