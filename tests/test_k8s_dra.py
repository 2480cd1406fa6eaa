"""``affinity --format dra``: the ResourceClaimTemplate for NVIDIA's DRA driver.

The property: for every fixture image and every GPU of every fixture node, turned into
the device NVIDIA's DRA driver publishes for it (tests/dra_cel.py, a STAND-IN for the
driver and for the scheduler's CEL, restated from their source; no API server or DRA
driver runs here), the claim's request selects the device iff ``check --snapshot``
passes the image on that GPU and driver (with the GPU alone in the snapshot, so that
its neighbours do not decide), and its native subrequest iff ``check --snapshot
--require-sass`` does; with --require and --min-memory as ``affinity`` reads them.
The objects are validated offline against the Kubernetes 1.34 OpenAPI schemas by
kubernetes-validate (strict).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmatrix.arch import ComputeCapability
from buildmatrix.profile_files import load_profiles
from tests import dra_cel
from tests.conftest import REPO, SHIPPED_PROFILES, CliRunner
from tests.images import write_docker_archive
from tests.test_affinity import _fixture_images

PROFILES = load_profiles(SHIPPED_PROFILES)
NODES = REPO / "tests" / "fixtures" / "nodes"
K8S_VERSION = "1.34.0"


@pytest.fixture(scope="module")
def refs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("dra-images")
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the stand-in compat library (.ci/run has it)")
    return {
        name: f"docker-archive:{write_docker_archive(out / f'{name}.tar', image)}"
        for name, image in _fixture_images(out).items()
    }


@pytest.fixture(scope="module")
def gpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dra_cel.Device]]:
    """Each distinct whole GPU of the fixture nodes (and of the mixed A100+H100 node
    upgraded to R580.65.06, a driver whose revision has a leading zero), as a snapshot
    of that GPU alone and the device the DRA driver publishes for it."""
    out = tmp_path_factory.mktemp("dra-gpus")
    docs = {p.stem: json.loads(p.read_text()) for p in sorted(NODES.glob("*.json"))}
    docs["mixed-580"] = docs["mixed-a100-h100"] | {
        "driver_version": "580.65.06",
        "cuda_driver_version": "13.0",
    }
    found: dict[str, tuple[Path, dra_cel.Device]] = {}
    seen: set[tuple[Any, ...]] = set()
    for node, doc in docs.items():
        for gpu in doc["gpus"]:
            key: tuple[Any, ...] = (gpu["name"], gpu["compute_capability"], gpu.get("mig_mode"))
            key += (gpu.get("memory_total_mib"), doc["driver_version"], doc["cuda_driver_version"])
            if key in seen:
                continue
            seen.add(key)
            one = doc | {"gpus": [gpu | {"index": 0}], "gpu_count": 1}
            path = out / f"{node}-{gpu['index']}.json"
            path.write_text(json.dumps(one))
            whole = [d for d in dra_cel.devices(one) if d.attributes["type"] == "gpu"]
            if whole:  # static MIG: no whole GPU is published
                found[f"{node}/{gpu['index']}"] = (path, whole[0])
    return found


def _gpu(gpus: dict[str, tuple[Path, dra_cel.Device]], product: str, driver: str) -> str:
    """The fixture GPU of a product (a prefix of its name) at a published driver."""
    (found,) = [
        g
        for g, (_, d) in gpus.items()
        if d.attributes["productName"].startswith(product)
        and d.attributes["driverVersion"] == dra_cel.parse_semver(driver)
    ]
    return found


def _claim(cli: CliRunner, ref: str, *args: str) -> tuple[int, Any]:
    r = cli("affinity", ref, "--format", "dra", *args)
    return r.code, (yaml.safe_load(r.out) if r.code == 0 else r.err)


def _checked(cli: CliRunner, refs: dict[str, str], path: Path, *flags: str) -> dict[str, bool]:
    r = cli("check", *refs.values(), "--snapshot", str(path), "--json", *flags)
    assert r.code in (0, 1), r.err
    return {n: d["verdict"] == "pass" for n, d in zip(refs, r.json()["images"], strict=True)}


def _subrequests(claim: Any) -> list[dict[str, Any]]:
    (request,) = claim["spec"]["spec"]["devices"]["requests"]
    return request.get("firstAvailable") or [request["exactly"]]


NEEDS = [(), ("--require-sass",), ("--require", "fp8"), ("--min-memory", "45000")]


@pytest.mark.parametrize("needs", NEEDS, ids=lambda n: " ".join(n) or "none")
def test_every_device_is_selected_iff_check_snapshot_passes(
    cli: CliRunner,
    refs: dict[str, str],
    gpus: dict[str, tuple[Path, dra_cel.Device]],
    needs: tuple[str, ...],
) -> None:
    sass = "--require-sass" in needs
    runs = {
        g: _checked(cli, refs, p, *(["--require-sass"] if sass else []))
        for g, (p, _) in gpus.items()
    }
    native = {g: _checked(cli, refs, p, "--require-sass") for g, (p, _) in gpus.items()}

    def wanted(gpu: str) -> bool:
        """Of a compute capability the profiles know (the claim, like the affinity,
        names those only: a newer GPU is left out, checked below), with the needs."""
        device = gpus[gpu][1]
        cc = device.attributes["cudaComputeCapability"]
        profile = PROFILES.by_cc(ComputeCapability(cc.major, cc.minor))
        if profile is None:
            return False
        if "--require" in needs and needs[1] not in profile.features:
            return False
        if "--min-memory" in needs:
            return device.capacity["memory"].value >= int(needs[1]) << 20
        return True

    dra_cel.SEMVER_CALLS.clear()
    placed: dict[tuple[str, str], bool] = {}
    expected: dict[tuple[str, str], bool] = {}
    for name, ref in refs.items():
        code, claim = _claim(cli, ref, *needs)
        assert code in (0, 1), claim
        subrequests = _subrequests(claim) if code == 0 else []
        for gpu, (_, device) in gpus.items():
            expected[name, gpu] = runs[gpu][name] and wanted(gpu)
            placed[name, gpu] = any(dra_cel.selected(s, device) for s in subrequests)
            if len(subrequests) == 2:  # native first, then every GPU that runs it
                assert [s["name"] for s in subrequests] == ["native", "jit"]
                assert dra_cel.selected(subrequests[0], device) is (
                    native[gpu][name] and wanted(gpu)
                ), (name, gpu)
        if code == 1:
            assert not any(expected[name, g] for g in gpus), name
    assert placed == expected
    # the pairs the property must not pass by accident
    assert any(expected.values())
    assert not all(expected.values())
    assert dra_cel.SEMVER_CALLS  # the literals, each one blang's Parse takes
    if not needs:
        h100, a100 = _gpu(gpus, "NVIDIA H100", "580.65.6"), _gpu(gpus, "NVIDIA A100", "580.65.6")
        assert expected["cu13-sm80-sm90-ptx90", h100]  # published as 580.65.6
        assert not expected["cu13-sm80-sm90-ptx90", "h100-535/0"]  # R535 < CUDA 13's R580
        assert expected["cu12.4-ptx-only-isa8.4", "a100-80gb/0"]  # JIT by 550.54.15
        assert not expected["cu12.4-ptx-only-isa8.4", "a100-40gb/0"]  # 535 cannot JIT 8.4
        assert not expected["cu13-sm80", h100]  # the H100 has no code
        assert expected["cu13-sm80", a100]  # the A100 has
        # an R100 (13.0) has no profile: PTX JIT runs there and check passes, but the
        # claim leaves it out, as affinity does (smoke admits no such node)
        assert runs["future-gpu/0"]["cu12.0-ptx-only-isa8.0"]
        assert not placed["cu12.0-ptx-only-isa8.0", "future-gpu/0"]


def test_native_is_preferred_where_some_gpus_only_jit(cli: CliRunner, refs: dict[str, str]) -> None:
    """sm_80 + sm_90 SASS and compute_90 PTX: natively on A100 and H100, by JIT on
    Blackwell; firstAvailable names the native devices first. PTX alone: one request."""
    code, claim = _claim(cli, refs["cu13-sm80-sm90-ptx90"])
    assert code == 0, claim
    (request,) = claim["spec"]["spec"]["devices"]["requests"]
    assert [s["name"] for s in request["firstAvailable"]] == ["native", "jit"]
    code, claim = _claim(cli, refs["cu13-sm80-sm90-ptx90"], "--require-sass")
    assert code == 0, claim
    assert "exactly" in claim["spec"]["spec"]["devices"]["requests"][0]
    code, claim = _claim(cli, refs["cu12.4-ptx-only-isa8.4"])
    assert code == 0, claim
    assert "exactly" in claim["spec"]["spec"]["devices"]["requests"][0]


@pytest.mark.parametrize(
    ("image", "needs"),
    [("cu13-sm80-sm90-ptx90", ()), ("cu13.1-forward-compat", ("--min-memory", "40GiB"))],
)
def test_the_claim_validates_against_the_kubernetes_schema(
    cli: CliRunner, refs: dict[str, str], image: str, needs: tuple[str, ...]
) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    code, claim = _claim(cli, refs[image], *needs)
    assert code == 0, claim
    kubernetes_validate.validate(claim, K8S_VERSION, strict=True)
    for sub in _subrequests(claim):
        (selector,) = sub["selectors"]
        # k8s.io/api resource/v1: CELSelectorExpressionMaxLength
        assert len(selector["cel"]["expression"]) <= 10 * 1024
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
        },
    }
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_no_literal_has_a_leading_zero(cli: CliRunner, refs: dict[str, str]) -> None:
    """semver() refuses 580.65.06 (blang Parse); every literal is strict semver."""
    for ref in refs.values():
        code, claim = _claim(cli, ref)
        for sub in _subrequests(claim) if code == 0 else []:
            for literal in re.findall(
                r"semver\('([^']*)'\)", sub["selectors"][0]["cel"]["expression"]
            ):
                dra_cel.parse_semver(literal)


def test_versions_as_the_driver_publishes_them() -> None:
    """Masterminds/semver v3 NewVersion + String(), as deviceinfo.go writes them."""
    assert dra_cel.published_text("580.65.06") == "580.65.6"
    assert dra_cel.published_text("8.0") == "8.0.0"
    assert dra_cel.published_text("13.0") == "13.0.0"
    assert dra_cel.published_text("535.104.05") == "535.104.5"


def test_the_semver_stand_in_is_no_looser_than_blang() -> None:
    """The examples of k8s.io/apiserver semverlib.go and blang's precedence rules."""
    for bad in ("580.65.06", "01.0.0", "1.0", "v1.0.0", "1.0.0-01", "1.0.0-", "Three"):
        with pytest.raises(ValueError, match=r"."):
            dra_cel.parse_semver(bad)
    order = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta.2", "1.0.0-beta.11"]
    order += ["1.0.0-rc.1", "1.0.0", "1.2.3", "2.0.0", "580.65.6", "580.82.7"]
    versions = [dra_cel.parse_semver(v) for v in order]
    for i, a in enumerate(versions):
        for j, b in enumerate(versions):
            assert dra_cel.compare_semver(a, b) == (i > j) - (i < j), (order[i], order[j])
    assert (
        dra_cel.compare_semver(dra_cel.parse_semver("1.0.0+b1"), dra_cel.parse_semver("1.0.0+b2"))
        == 0
    )


def test_no_gpu_qualifies_exits_1(cli: CliRunner, refs: dict[str, str]) -> None:
    r = cli("affinity", refs["cu13-sm90a"], "--format", "dra", "--require", "fp4")
    assert r.code == 1, r.out
    assert "runs on none of the GPUs" in r.err
    assert r.out == ""


def test_into_is_refused_with_dra(cli: CliRunner, refs: dict[str, str], tmp_path: Path) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text("kind: Pod\napiVersion: v1\nmetadata: {name: p}\nspec: {containers: []}\n")
    r = cli("affinity", refs["cu13-sm80"], "--format", "dra", "--into", str(pod))
    assert r.code == 2
    assert "ResourceClaimTemplate" in r.err
