"""The image's ``Env`` as the NVIDIA container toolkit and the CUDA driver obey it,
through ``check`` on real images (OCI layouts of an nvcc-built library, and an image
the Docker engine built and saved). The expected verdicts follow the cited source,
each case with the step that decides it:

- nvidia-container-toolkit ``cmd/nvidia-container-runtime-hook/container_config.go``
  (``getDriverCapabilities``, ``getNvidiaConfig``) and ``internal/config/image/``
  (``cuda_image.go``: ``devicesFromEnvvars``, ``IsLegacy``, ``GetRequirements``,
  ``HasDisableRequire``; ``devices.go``: ``NewVisibleDevices``; ``capabilities.go``);
- libnvidia-container ``src/cli/configure.c`` (``configure_command``, the rules) and
  ``src/cli/dsl.c`` (``dsl_evaluate``, ``evaluate_rule``, ``dsl_compare_version``);
- the CUDA C++ Programming Guide, "CUDA Environment Variables" (CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from buildmatrix.container_env import capabilities, cuda_visible, env_finding, visible_devices
from buildmatrix.toolkit_require import Known, compare_version, evaluate
from tests.conftest import CliRunner
from tests.images import Image, fixture, write_oci_layout

LIBRARY = "libsass_ptx.so"  # sm_80 and sm_90 SASS, compute_90 PTX: native on 8.0 and 9.0
# It records CUDA 13.0 as its runtime: below 580.65.06 the driver floor fails it too,
# so there the verdicts alone say what the Env did.
R550 = "550.54.14"  # CUDA 12.4's driver
R580 = "580.65.06"  # CUDA 13.0's
R590 = "590.44.01"  # CUDA 13.1's

# (Env, driver or None, whether each of 8.0 and 9.0 runs, what a failure says)
CASES: list[tuple[dict[str, str], str | None, tuple[int, int], str]] = [
    ({}, None, (True, True), ""),
    # NVIDIA_DRIVER_CAPABILITIES: unset or empty is utility,compute; a list without
    # compute mounts no libcuda; "all" anywhere is every capability; a name outside
    # the supported set panics the hook; names are trimmed.
    ({"NVIDIA_DRIVER_CAPABILITIES": ""}, None, (True, True), ""),
    ({"NVIDIA_DRIVER_CAPABILITIES": "utility"}, None, (False, False), "without compute"),
    ({"NVIDIA_DRIVER_CAPABILITIES": "video,utility"}, None, (False, False), "without compute"),
    ({"NVIDIA_DRIVER_CAPABILITIES": "graphics"}, None, (False, False), "without compute"),
    ({"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}, None, (True, True), ""),
    ({"NVIDIA_DRIVER_CAPABILITIES": " compute "}, None, (True, True), ""),
    ({"NVIDIA_DRIVER_CAPABILITIES": "all"}, None, (True, True), ""),
    ({"NVIDIA_DRIVER_CAPABILITIES": "utility,all"}, None, (True, True), ""),
    ({"NVIDIA_DRIVER_CAPABILITIES": "none"}, None, (False, False), "unsupported capabilities"),
    ({"NVIDIA_DRIVER_CAPABILITIES": "compute,cuda"}, None, (False, False), "unsupported"),
    # a legacy CUDA image (CUDA_VERSION, no NVIDIA_REQUIRE_CUDA) without the variable
    # gets every capability, and cuda>=MAJOR.MINOR of CUDA_VERSION as a requirement
    ({"CUDA_VERSION": "13.0.0"}, R580, (True, True), ""),
    ({"CUDA_VERSION": "13.1.0"}, R580, (False, False), "unsatisfied condition: cuda>=13.1"),
    ({"CUDA_VERSION": "13.1.0"}, R590, (True, True), ""),
    ({"CUDA_VERSION": "12.8.0", "NVIDIA_REQUIRE_CUDA": ""}, R550, (False, False), "cuda>=12.8"),
    ({"CUDA_VERSION": "twelve"}, None, (False, False), "failed to get version"),
    # NVIDIA_VISIBLE_DEVICES written in the image: void, empty, none: no GPU; void
    # wins over all; the first of all and none decides otherwise.
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, None, (True, True), ""),
    ({"NVIDIA_VISIBLE_DEVICES": "0,1"}, None, (True, True), ""),
    ({"NVIDIA_VISIBLE_DEVICES": "void"}, None, (False, False), "no GPU container"),
    ({"NVIDIA_VISIBLE_DEVICES": ""}, None, (False, False), "no GPU container"),
    ({"NVIDIA_VISIBLE_DEVICES": " , "}, None, (False, False), "no GPU container"),
    ({"NVIDIA_VISIBLE_DEVICES": "all,void"}, None, (False, False), "no GPU container"),
    ({"NVIDIA_VISIBLE_DEVICES": "none"}, None, (False, False), "but no GPU"),
    ({"NVIDIA_VISIBLE_DEVICES": "0,none"}, None, (False, False), "but no GPU"),
    ({"NVIDIA_VISIBLE_DEVICES": "all,none"}, None, (True, True), ""),
    # CUDA_VISIBLE_DEVICES: entries up to the first invalid one are visible
    ({"CUDA_VISIBLE_DEVICES": "0"}, None, (True, True), ""),
    ({"CUDA_VISIBLE_DEVICES": "0,-1"}, None, (True, True), ""),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, None, (False, False), "no device"),
    ({"CUDA_VISIBLE_DEVICES": "-1,0"}, None, (False, False), "no device"),
    ({"CUDA_VISIBLE_DEVICES": ""}, None, (False, False), "no device"),
    ({"CUDA_VISIBLE_DEVICES": "none"}, None, (False, False), "no device"),
    ({"CUDA_VISIBLE_DEVICES": "all"}, None, (False, False), "no device"),
    ({"CUDA_VISIBLE_DEVICES": "1"}, None, (False, False), "more than 1 GPU"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f6c1c5e-1d2a"}, None, (False, False), "only that one"),
    # NVIDIA_REQUIRE_*: the driver's CUDA version, per GPU; the review's case first
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}, R550, (False, False), "please update your driver"),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=13.1"}, R580, (False, False), "please update your driver"),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=13.1"}, R590, (True, True), ""),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}, None, (True, True), ""),  # a warning says why
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "NVIDIA_DISABLE_REQUIRE": "true"}, R550, (1, 1), ""),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "NVIDIA_DISABLE_REQUIRE": "1"}, R550, (1, 1), ""),
    # ParseBool knows no "yes": the checks stay on
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "NVIDIA_DISABLE_REQUIRE": "yes"}, R550, (0, 0), "12.8"),
    ({"NVIDIA_REQUIRE_ARCH": "arch>=9.0"}, None, (False, True), "unsatisfied condition: arch"),
    ({"NVIDIA_REQUIRE_ARCH": "arch=8.0 arch=9.0"}, None, (True, True), ""),
    ({"NVIDIA_REQUIRE_ARCH": "arch!8.0"}, None, (False, True), "arch"),  # "!" is "!="
    ({"NVIDIA_REQUIRE_FOO": "foo>=1"}, None, (False, False), "invalid expression"),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.4-rc1"}, R550, (False, False), "invalid expression"),
    ({"NVIDIA_REQUIRE_JETPACK": "foo>=1"}, None, (True, True), ""),  # not passed on
    # an alternative that holds on some brands only, the brand unknown: fail closed
    (
        {"NVIDIA_REQUIRE_CUDA": "cuda>=13.1 brand=tesla,driver>=580,driver<581"},
        R580,
        (True, True),  # a warning says that GPUs of other brands are refused
        "",
    ),
    # a driver newer than every release the table names a driver for: its CUDA
    # version is known only to be at least 13.3's, so cuda>=13.5 cannot be shown
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=13.5"}, "999.99.99", (False, False), "exact CUDA version"),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=13.3"}, "999.99.99", (True, True), ""),
    (
        {"NVIDIA_REQUIRE_CUDA": "cuda>=13.1 brand=tesla,driver>=575,driver<576"},
        R580,
        (False, False),
        "please update your driver",
    ),
]


@pytest.mark.integration
@pytest.mark.parametrize(("env", "driver", "runs", "why"), CASES)
def test_check_obeys_the_env_as_the_toolkit_and_driver_do(
    cli: CliRunner,
    tmp_path: Path,
    env: dict[str, str],
    driver: str | None,
    runs: tuple[int, int],
    why: str,
) -> None:
    layout = write_oci_layout(
        tmp_path / "img", Image(layers=[{f"usr/lib/{LIBRARY}": fixture(LIBRARY)}], env=env)
    )
    drv = ["--driver", driver] if driver else []
    r = cli("check", f"oci:{layout}", "--sm", "8.0", "--sm", "9.0", *drv, "--json")
    doc: Any = r.json()
    got = tuple(t["verdict"] != "none" for t in doc["targets"])
    assert got == tuple(bool(x) for x in runs), (doc["targets"], r.err)
    assert r.code == (0 if all(runs) and driver != R550 else 1), r.out
    for target, ok in zip(doc["targets"], runs, strict=True):
        if not ok:
            assert any(why in reason for reason in target["reasons"]), target["reasons"]
    if "NVIDIA_REQUIRE_CUDA" in env and driver is None:
        assert any("pass --driver or --snapshot" in w for w in doc["warnings"]), doc
    if "brand=" in env.get("NVIDIA_REQUIRE_CUDA", "") and all(runs):
        assert any("GPUs of some brands" in w for w in doc["warnings"]), doc


@pytest.mark.parametrize(
    ("v1", "op", "v2", "want"),
    [
        # dsl_compare_version, step by step
        ("12.4", ">=", "12.8", 0),  # 12 = 12, then 4 < 8
        ("12.8", ">=", "12.8", 1),
        ("12.8", ">=", "12.8.0", 1),  # the rest ".0" is skipped (strspn ".0")
        ("12.8.1", "<=", "12.8", 0),  # the rest "1" is left on the left only
        ("550.54.14", "<", "551", 1),
        ("550.54.14", ">=", "550", 1),
        ("12.10", ">", "12.9", 1),  # numbers, not text
        ("12.4", "=", "12.04", 1),  # strtoumax reads 04 as 4
        ("12.4", "!=", "12.4.0", 0),
        ("12.4", ">=", "12.4-rc1", -1),  # a character outside digits and dots
        ("12.4", ">=", ".5", -1),  # a part strtoumax reads nothing of
        ("12.4", ">=", "", 1),  # nothing to compare: the rests are both empty
    ],
)
def test_versions_compare_as_dsl_c_does(v1: str, op: str, v2: str, want: int) -> None:
    assert compare_version(v1, op, v2) == want


def test_requirements_as_dsl_c_evaluates_them() -> None:
    """Alternatives, conditions, an empty predicate, and the message of a refusal."""
    known = Known(cuda="12.4", driver="550.54.14", arch="9.0", brand="Tesla")
    assert evaluate(["cuda>=12.4"], known).refused is None
    assert evaluate([""], known).refused is None  # an empty value holds
    assert evaluate(["  cuda>=12.4  "], known).refused is None  # empty alternatives skipped
    assert evaluate(["cuda>=13.0 brand=TESLA,driver>=550"], known).refused is None
    refused = evaluate(["cuda>=13.0 brand=geforce"], known).refused
    assert refused is not None and "unsatisfied condition: cuda>=13.0, please update" in refused
    assert "invalid expression" in (evaluate(["cuda>=13.0 brand>=x"], known).refused or "")
    # a condition after a false one in its alternative is never evaluated
    assert evaluate(["arch=9.0 arch=8.0,bogus>=1"], known).refused is None
    assert "invalid" in (evaluate(["arch=8.0 arch=9.0,bogus>=1"], known).refused or "")
    unknown = Known(cuda=None, driver=None, arch="9.0")
    assert evaluate(["cuda>=12.8"], unknown).maybe is not None
    assert not evaluate(["cuda>=12.8"], unknown).by_brand
    branded = Known(cuda="12.4", driver="550.54.14", arch="9.0")
    outcome = evaluate(["cuda>=12.8 brand=tesla,driver>=550,driver<551"], branded)
    assert outcome.maybe is not None and outcome.by_brand
    assert evaluate(["arch>=10.0"], unknown).refused is not None


@pytest.mark.docker
def test_an_image_the_engine_built_with_the_env(
    docker_host: str, cli: CliRunner, tmp_path: Path
) -> None:
    """``ENV`` lines of a Dockerfile, built and saved by the real engine."""
    context = tmp_path / "ctx"
    context.mkdir()
    (context / LIBRARY).write_bytes(fixture(LIBRARY))
    (context / "Dockerfile").write_text(
        f"FROM scratch\nCOPY {LIBRARY} /usr/lib/{LIBRARY}\n"
        "ENV NVIDIA_DRIVER_CAPABILITIES=video,utility CUDA_VISIBLE_DEVICES=-1\n"
    )
    docker = ["docker", "-H", docker_host]
    tag = "bmtest/container-env:v1"
    subprocess.run([*docker, "build", "-q", "-t", tag, str(context)], check=True)
    archive = tmp_path / "saved.tar"
    try:
        subprocess.run([*docker, "save", "-o", str(archive), tag], check=True)
    finally:
        subprocess.run([*docker, "rmi", "-f", tag], capture_output=True, check=False)
    r = cli("check", f"docker-archive:{archive}", "--sm", "9.0", "--json")
    doc: Any = r.json()
    assert r.code == 1, r.out
    reasons = doc["targets"][0]["reasons"]
    assert any("without compute" in x for x in reasons), reasons
    assert any("CUDA_VISIBLE_DEVICES='-1'" in x for x in reasons), reasons


_VERSION = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}", fullmatch=True)


@given(_VERSION, _VERSION)
def test_exactly_one_order_holds(a: str, b: str) -> None:
    """dsl_compare_version orders versions: of <, = and > exactly one holds, each
    operator agrees with its converse, and <= is < or =."""
    lt, eq, gt = (compare_version(a, op, b) for op in ("<", "=", ">"))
    assert sorted((lt, eq, gt)) == [0, 0, 1]
    assert compare_version(b, ">", a) == lt and compare_version(b, "=", a) == eq
    assert compare_version(a, "<=", b) == int(lt or eq)
    assert compare_version(a, ">=", b) == int(gt or eq)
    assert compare_version(a, "!=", b) == int(not eq)


_KEYS = [
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_REQUIRE_CUDA",
    "NVIDIA_REQUIRE_ARCH",
    "NVIDIA_DISABLE_REQUIRE",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_VERSION",
]
_TOKENS = st.sampled_from(
    [
        "all", "none", "void", "0", "1", "-1", "compute", "utility", "video", "bogus",
        "cuda>=12.8", "cuda<13", "arch=9.0", "arch>=8.0", "driver>=580", "brand=tesla",
        "true", "false", "12.8.0", "GPU-0f", "x>=1", "", " ",
    ]
)  # fmt: skip
_VALUES = st.lists(st.one_of(_TOKENS, st.text(max_size=6)), max_size=4).flatmap(
    lambda parts: st.sampled_from([",", " ", ""]).map(lambda sep: sep.join(parts))
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=5),
    st.sampled_from([None, "12.4", "13.0"]),
    st.sampled_from(["8.0", "9.0"]),
)
def test_any_env_is_judged_and_disable_require_only_lifts_refusals(
    env: dict[str, str], cuda: str | None, arch: str
) -> None:
    """Every Env is judged without error; with the driver known nothing is left
    undecided; NVIDIA_DISABLE_REQUIRE=true removes every refusal of a requirement
    and leaves the others as they are."""
    driver = {None: None, "12.4": "550.54.14", "13.0": "580.65.06"}[cuda]
    known = Known(cuda=cuda, driver=driver, arch=arch, brand="Tesla")
    found = env_finding(env, known)
    if driver is not None:
        assert not found.maybe
    lifted = env_finding({**env, "NVIDIA_DISABLE_REQUIRE": "true"}, known)
    direct = tuple(r for r in (visible_devices(env), capabilities(env), cuda_visible(env)) if r)
    assert lifted.refusals == direct and not lifted.maybe
    assert found.refusals[: len(direct)] == direct
