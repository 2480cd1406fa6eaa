"""``affinity`` and ``k8s manifests``.

The property: on every node ``smoke`` admits, the printed nodeAffinity matches the
node's labels (as ``smoke`` writes them) iff ``check --snapshot`` passes the image
there, over the fixture nodes and images with CUDA 12 and CUDA 13 runtimes, PTX-only
code, a family claim and a forward-compatibility driver; and per arch profile over
every driver version the CUDA table and the profiles name, iff ``check --sm
--driver`` passes. The nodeAffinity is evaluated with the scheduler's documented
rules (buildmatrix.selector.matches); manifests are validated offline against the
Kubernetes OpenAPI schemas by kubernetes-validate (strict).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmatrix.affinity import READS
from buildmatrix.check import Options, run_check
from buildmatrix.cuda import DriverVersion, load_cuda_facts, parse_driver_version
from buildmatrix.image.open import scan_image
from buildmatrix.labelkeys import owned
from buildmatrix.profile_files import load_profiles
from tests.conftest import REPO, SHIPPED_PROFILES, CliRunner
from tests.fixtures.build import BIN
from tests.images import (
    DISTRO_LOADER,
    Entry,
    Image,
    Layer,
    Symlink,
    fixture,
    write_docker_archive,
    write_platform_layout,
)
from tests.scheduling import affinity_matches

PROFILES = load_profiles(SHIPPED_PROFILES)
FACTS = load_cuda_facts()
K8S_VERSION = "1.34.0"
NODES = REPO / "tests" / "fixtures" / "nodes"


def _image(tmp_path: Path, *libs: str, name: str = "img") -> str:
    layer: Layer = {f"usr/lib/{lib}": fixture(lib) for lib in libs}
    return f"docker-archive:{write_docker_archive(tmp_path / f'{name}.tar', Image(layers=[layer]))}"


def _driver_labels(driver: str) -> dict[str, str]:
    """The driver label smoke writes (tests/test_labelkeys.py proves its order)."""
    major, minor, revision = [*driver.split("."), "0"][:3]
    return {
        "buildmatrix.io/driver.version": str(
            int(major) * 1_000_000 + int(minor) * 1000 + int(revision)
        ),
    }


def _node_labels(
    sm: str, memory: int = 81559, driver: str = "580.65.06", arch: str = "amd64"
) -> dict[str, str]:
    """A node of one profile's GPUs as smoke labels it (GFD's keys and its own), with
    the CPU architecture its kubelet labels it with (an x86 node unless said)."""
    p = PROFILES.get(sm)
    return {
        "kubernetes.io/arch": arch,
        "nvidia.com/gpu.family": p.family.value,
        "nvidia.com/gpu.memory": str(memory),
        "buildmatrix.io/gpu.compute-capability": str(p.cc),
        "buildmatrix.io/gpu.memory-mb": str(memory),
        **_driver_labels(driver),
    }


def _affinity(cli: CliRunner, ref: str, *args: str) -> tuple[int, Any]:
    r = cli("affinity", ref, "--format", "json", *args)
    return r.code, (json.loads(r.out) if r.code == 0 else r.err)


def _terms(doc: Any) -> list[list[dict[str, Any]]]:
    required = doc["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [t["matchExpressions"] for t in required["nodeSelectorTerms"]]


# Every driver where a floor or a JIT rule of the CUDA table or the profiles sits, and
# the revision just below each: the per-profile property is checked at all of them.
def _drivers() -> list[str]:
    found = {tk.driver for tk in FACTS.toolkits if tk.driver is not None}
    found |= set(FACTS.minor_compat.values())
    found |= {hw[0] for p in PROFILES if (hw := PROFILES.hardware_floor(p.cc)) is not None}
    below = set()
    for d in found:
        major, minor, revision = d.key
        key = (major, minor, revision - 1) if revision else (major, minor - 1, 99)
        below.add(DriverVersion(key, ".".join(map(str, key))))
    return [str(d) for d in sorted(found | below)]


CASES = [
    ("libsass_ptx.so",),  # sm_80 + sm_90 SASS, compute_90 PTX
    ("libhopper_a.so",),  # sm_90a only
    ("libmulti.so",),  # eight SMs
    ("libblackwell_f.so",),  # sm_100f, sm_120f
    ("kernels_sm100f.cubin",),  # part of a family
    ("libptx_only.so",),  # compute_80 PTX only (ISA 9.0)
    ("libsass_sm80.so", "libhopper_a.so"),  # one file for each: no GPU runs both
]
NEEDS = [(), ("--require", "fp8"), ("--require-sass",)]


@pytest.mark.parametrize("libs", CASES, ids="+".join)
@pytest.mark.parametrize("needs", NEEDS, ids=lambda n: " ".join(n) or "none")
def test_per_profile_and_driver_the_affinity_matches_iff_check_passes(
    cli: CliRunner, tmp_path: Path, libs: tuple[str, ...], needs: tuple[str, ...]
) -> None:
    """For every profile and every driver the tables name (and one revision below
    each), a node of that profile with that driver is matched iff ``check --sm
    --driver`` passes the image there (check's own run, one per driver)."""
    ref = _image(tmp_path, *libs)
    code, doc = _affinity(cli, ref, *needs)
    features = [needs[i + 1] for i, x in enumerate(needs) if x == "--require"]
    image = scan_image(ref)
    expected: dict[tuple[str, str], bool] = {}
    for driver in _drivers():
        opts = Options(
            sms=[p.sm for p in PROFILES],
            driver=parse_driver_version(driver),
            require_sass="--require-sass" in needs,
        )
        result = run_check(image, PROFILES, opts, FACTS)
        for p in PROFILES:
            failed = any(x.startswith(f"{p.sm} ({p.sm}):") for x in result.problems)
            expected[p.sm, driver] = not failed and all(f in p.features for f in features)
    if not any(expected.values()):
        assert code == 1
        assert "runs on none of the GPUs" in doc
        return
    assert code == 0, doc
    got = {
        (p.sm, d): affinity_matches(doc["affinity"], _node_labels(p.sm, driver=d))
        for p in PROFILES
        for d in _drivers()
    }
    assert got == expected


def test_the_seeds_fp8_case(cli: CliRunner, tmp_path: Path) -> None:
    """An FP8 image with Hopper code that needs 70000 MiB: Hopper GPUs with enough
    memory only, on a driver that runs its CUDA 13.0 code (R580: 580.65.06 or later);
    with Ada code too, both families."""
    hopper = _image(tmp_path, "libhopper_a.so", name="h")
    code, doc = _affinity(cli, hopper, "--require", "fp8", "--min-memory", "70000")
    assert code == 0, doc
    # one term: driver >= 580.65.06 is one Gt on the ordinal (580065006)
    driver = [{"key": "buildmatrix.io/driver.version", "operator": "Gt", "values": ["580065005"]}]
    head: list[dict[str, Any]] = [
        {"key": "buildmatrix.io/gpu.compute-capability", "operator": "In", "values": ["9.0"]},
    ]
    absent: list[dict[str, Any]] = [
        {"key": f"buildmatrix.io/compute-capability.{p.cc}", "operator": "DoesNotExist"}
        for p in PROFILES
        if p.cc > PROFILES.get("sm_90").cc
    ]
    memory = [{"key": "buildmatrix.io/gpu.memory-mb", "operator": "Gt", "values": ["69999"]}]
    # an amd64-only image (the archive's config) whose GPUs also sit behind Grace (GH200)
    arch = [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]
    assert _terms(doc) == [head + absent + memory + arch + driver]
    assert not affinity_matches(doc["affinity"], _node_labels("sm_90", 81559, "580.65.06", "arm64"))
    assert affinity_matches(doc["affinity"], _node_labels("sm_90", 81559, "580.65.06"))
    assert affinity_matches(doc["affinity"], _node_labels("sm_90", 81559, "590.44.01"))
    assert not affinity_matches(doc["affinity"], _node_labels("sm_90", 81559, "580.65.05"))
    assert not affinity_matches(doc["affinity"], _node_labels("sm_90", 81559, "535.104.05"))
    assert not affinity_matches(doc["affinity"], _node_labels("sm_90", 65536))
    assert not affinity_matches(doc["affinity"], _node_labels("sm_89", 81559))
    both = _image(tmp_path, "libmulti.so", name="b")  # sm_89 and sm_90 among others
    code, doc = _affinity(cli, both, "--require", "fp8")
    assert code == 0, doc
    assert {t[0]["key"] for t in _terms(doc)} == {"buildmatrix.io/gpu.compute-capability"}
    assert _terms(doc)[0][0]["values"] == ["8.9", "9.0", "10.0", "10.3", "12.0", "12.1"]


def test_the_example_job_runs_where_its_image_would(cli: CliRunner) -> None:
    """``k8s manifests --example-job``: a CUDA 13 FP8 image with SASS for every FP8 SM
    needing 70000 MiB lands, on every profile and every driver of the tables, exactly
    on FP8 GPUs with the memory and a driver meeting the CUDA 13 floor and their own."""
    r = cli("k8s", "manifests", "--example-job", "--format", "json")
    assert r.code == 0, r.err
    listed = json.loads(r.out)
    assert listed["kind"] == "List"  # several objects: one v1 List
    (job,) = [d for d in listed["items"] if d["kind"] == "Job"]
    affinity = job["spec"]["template"]["spec"]["affinity"]
    cuda13 = FACTS.runtime_floor(13)
    assert cuda13 is not None
    for p in PROFILES:
        for driver in _drivers():
            version = parse_driver_version(driver, what="driver")
            for memory in (65536, 81559):
                want = (
                    "fp8" in p.features and memory >= 70000 and version >= max(cuda13, p.min_driver)
                )
                got = affinity_matches(affinity, _node_labels(p.sm, memory, driver))
                assert got == want, (p.sm, driver, memory)


@pytest.mark.parametrize("empty", [{"affinity": None}, {"affinity": {"nodeAffinity": None}}])
def test_into_takes_an_affinity_left_null(
    cli: CliRunner, tmp_path: Path, empty: dict[str, Any]
) -> None:
    """The API server reads ``affinity: null`` (and ``nodeAffinity: null``) as absent."""
    manifest = tmp_path / "pod.yaml"
    spec: dict[str, Any] = {**empty, "containers": [{"name": "c", "image": "x"}]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}
    manifest.write_text(yaml.safe_dump(pod))
    code, doc = _affinity(cli, _image(tmp_path, "libhopper_a.so"), "--into", str(manifest))
    assert code == 0, doc
    assert _terms(doc["spec"])


def test_a_partly_covered_family_is_named_by_compute_capability(
    cli: CliRunner, tmp_path: Path
) -> None:
    """sm_100 SASS runs on 10.0 and 10.3, not on the 12.x GPUs of the same family, so
    only those capabilities are listed, and a mixed node with a 12.x GPU is left out."""
    ref = _image(tmp_path, "kernels_sm100f.cubin")
    code, doc = _affinity(cli, ref)
    assert code == 0, doc
    for term in _terms(doc):
        assert term[0] == {
            "key": "buildmatrix.io/gpu.compute-capability",
            "operator": "In",
            "values": ["10.0", "10.3"],
        }
        assert {"key": "buildmatrix.io/compute-capability.12.0", "operator": "DoesNotExist"} in term
    code, doc = _affinity(cli, _image(tmp_path, "libblackwell_f.so", name="f"))
    assert _terms(doc)[0][0]["values"] == ["10.0", "10.3", "12.0", "12.1"]


def test_every_key_the_affinity_reads_is_one_smoke_writes() -> None:
    """Whatever --gfd-keys says: the affinity works beside GFD and without it."""
    for key in READS:
        assert owned(key, gfd_keys=False), key


# ------------------------------------------------ the property over the fixture nodes


# A PTX text as CUDA 12.x's nvcc heads it: the fixture's compute_90a kernels with the
# .version (PTX ISA) and .target directives of an older toolkit; check reads only those.
def _old_ptx(isa: str, sm: str) -> bytes:
    text = (BIN / "kernels_sm90a.ptx").read_bytes()
    return text.replace(b".version 9.0", f".version {isa}".encode()).replace(
        b".target sm_90a", f".target {sm}".encode()
    )


# The note of NVIDIA's CUDA 13.1 compat driver 590.44.01 (tests/test_forward_compat.py).


def _fixture_images(out: Path) -> dict[str, Image]:
    """CUDA 13 images (the fixtures' cubins record CUDA 13.0, compressed ones too: the
    cubins are read through their compression, so a CUDA_VERSION of 12.4 does not hide
    that the code needs CUDA 13's driver), PTX-only ones of three PTX ISAs, a family
    claim, and a CUDA 13.1 image with the forward-compatibility driver 590.44.01 (a
    gcc-built STAND-IN with NVIDIA's note)."""
    from tests.standins import NOTE_13_1, compat_library

    def lib(*names: str) -> dict[str, Entry]:
        return {f"usr/lib/{n}": fixture(n) for n in names}

    images = {
        "cu13-sm80-sm90-ptx90": Image(layers=[lib("libsass_ptx.so")]),
        "cu13-sm80": Image(layers=[lib("libsass_sm80.so")]),
        "cu13-sm90a": Image(layers=[lib("libhopper_a.so")]),
        "cu13-multi": Image(layers=[lib("libmulti.so")]),
        "cu13-blackwell-f": Image(layers=[lib("libblackwell_f.so")]),
        "cu13-env-sm80-sm90": Image(
            layers=[lib("libcompressed.so")], env={"CUDA_VERSION": "13.0.0"}
        ),
        "cu13-claims-cu12.4": Image(
            layers=[lib("libcompressed.so")], env={"CUDA_VERSION": "12.4.1"}
        ),
        "cu12.2-ptx-only-isa9.0": Image(
            layers=[lib("libptx_only.so")], env={"CUDA_VERSION": "12.2.2"}
        ),
        "cu12.4-ptx-only-isa8.4": Image(
            layers=[{"opt/k/kernels.ptx": _old_ptx("8.4", "sm_80")}],
            env={"CUDA_VERSION": "12.4.1"},
        ),
        "cu12.0-ptx-only-isa8.0": Image(
            layers=[
                {
                    "opt/k/kernels.ptx": _old_ptx("8.0", "sm_75"),
                    "usr/local/cuda-12.0/lib64/libcudart.so.12.0.107": b"",
                }
            ],
        ),
        "cu13-multi-claims-hopper": Image(
            layers=[lib("libmulti.so")], labels={"io.buildmatrix.family": "hopper"}
        ),
    }
    if shutil.which("gcc") is not None:
        compat = compat_library(out, "590.44.01", NOTE_13_1).read_bytes()
        folder = "usr/local/cuda-13.1/compat"
        images["cu13.1-forward-compat"] = Image(
            layers=[
                {
                    **lib("libsass_ptx.so"),
                    **DISTRO_LOADER,
                    f"{folder}/libcuda.so.590.44.01": compat,
                    f"{folder}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
                    "usr/local/cuda": Symlink("cuda-13.1"),
                }
            ],
            # a legacy image: on an older driver only without the toolkit's cuda>= check
            env={"CUDA_VERSION": "13.1.0", "NVIDIA_DISABLE_REQUIRE": "1"},
        )
    return images


@pytest.fixture(scope="module")
def fixture_refs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("affinity-images")
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the stand-in compat library (.ci/run has it)")
    return {
        name: f"docker-archive:{write_docker_archive(out / f'{name}.tar', image)}"
        for name, image in _fixture_images(out).items()
    }


@pytest.fixture(scope="module")
def node_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every fixture node, and the mixed A100+H100 node upgraded to R580 (so that a
    CUDA 13 image is judged there by its code, not stopped by the driver first)."""
    nodes = {p.stem: p for p in sorted(NODES.glob("*.json"))}
    doc = json.loads((NODES / "mixed-a100-h100.json").read_text())
    doc |= {"driver_version": "580.65.06", "cuda_driver_version": "13.0"}
    upgraded = tmp_path_factory.mktemp("nodes") / "mixed-a100-h100-580.json"
    upgraded.write_text(json.dumps(doc))
    nodes[upgraded.stem] = upgraded
    return nodes


@pytest.mark.parametrize("sass", [False, True], ids=["any", "require-sass"])
def test_on_every_admitted_fixture_node_affinity_matches_iff_check_snapshot_passes(
    cli: CliRunner, fixture_refs: dict[str, str], node_files: dict[str, Path], sass: bool
) -> None:
    """Every (image, node) pair: the node's labels are what ``smoke --allow-mixed``
    writes, over every fixture node it admits; the answer is ``check --snapshot``."""
    flags = ["--require-sass"] if sass else []
    labels: dict[str, dict[str, str]] = {}
    for node, path in node_files.items():
        r = cli("smoke", "--snapshot", str(path), "--allow-mixed", "--json")
        if r.code == 0:  # the fixture nodes are x86 hosts: the kubelet's own label
            labels[node] = r.json()["labels"] | {"kubernetes.io/arch": "amd64"}
    assert set(labels) == set(node_files) - {
        "h100-520",  # driver below Hopper's floor
        "h200-535",  # below the H200's
        "h100-lost-gpu",
        "h100-ecc",
        "a100-remap-failure",
        "future-gpu",  # no profile
        "hgx-h100-7-of-8",  # a GPU on the PCI bus that NVML does not show
        "a100-mig-no-monitor",  # MIG without monitoring: NVML refuses the GPUs' memory
    }
    refs = list(fixture_refs.values())
    checked: dict[tuple[str, str], bool] = {}
    for node in labels:
        r = cli("check", *refs, "--snapshot", str(node_files[node]), "--json", *flags)
        assert r.code in (0, 1), r.err
        for name, doc in zip(fixture_refs, r.json()["images"], strict=True):
            checked[name, node] = doc["verdict"] == "pass"
    placed: dict[tuple[str, str], bool] = {}
    for name, ref in fixture_refs.items():
        code, doc = _affinity(cli, ref, *flags)
        assert code in (0, 1), doc
        for node, node_labels in labels.items():
            placed[name, node] = code == 0 and affinity_matches(doc["affinity"], node_labels)
    assert placed == checked
    # the pairs the property must not pass by accident
    if not sass:
        assert checked["cu13-sm80-sm90-ptx90", "h100-580"]
        assert not checked["cu13-sm80-sm90-ptx90", "h100-535"]  # R535 < CUDA 13's R580
        # CUDA_VERSION says 12.4, the (compressed) cubins CUDA 13.0: R535 is too old
        assert not checked["cu13-claims-cu12.4", "h100-535"]
        assert checked["cu13-claims-cu12.4", "h100-580"]
        assert checked["cu12.4-ptx-only-isa8.4", "a100-80gb"]  # JIT by 550.54.15
        assert not checked["cu12.4-ptx-only-isa8.4", "a100-40gb"]  # 535 cannot JIT ISA 8.4
        assert not checked["cu12.2-ptx-only-isa9.0", "h200-550"]
        assert checked["cu13.1-forward-compat", "h100-535"]  # through its compat driver
        assert not checked["cu13.1-forward-compat", "rtx-consumer"]  # a GeForce board
        assert not checked["cu13-sm80", "mixed-a100-h100-580"]  # the H100 has no code
        assert not checked["cu13-sm80", "a100-40gb"]  # R535 again
        assert checked["cu13-sm80-sm90-ptx90", "mixed-a100-h100-580"]
        assert checked["cu13-multi", "h100-580"]
        assert not checked["cu13-multi-claims-hopper", "b200"]
    else:
        assert not any(checked[n, node] for n in fixture_refs if "ptx-only" in n for node in labels)
    assert any(checked.values())
    assert not all(checked.values())


def test_the_affinity_validates_against_the_kubernetes_schema(
    cli: CliRunner, fixture_refs: dict[str, str]
) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    code, doc = _affinity(cli, fixture_refs["cu13.1-forward-compat"], "--min-memory", "40000")
    assert code == 0, doc
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x"}], **doc},
    }
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_into_merges_with_the_manifest(cli: CliRunner, tmp_path: Path) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "train"},
                "spec": {
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "affinity": {
                                "nodeAffinity": {
                                    "requiredDuringSchedulingIgnoredDuringExecution": {
                                        "nodeSelectorTerms": [
                                            {
                                                "matchExpressions": [
                                                    {
                                                        "key": "topology.kubernetes.io/zone",
                                                        "operator": "In",
                                                        "values": ["a"],
                                                    }
                                                ]
                                            }
                                        ]
                                    }
                                }
                            },
                            "containers": [{"name": "t", "image": "x"}],
                        }
                    }
                },
            }
        )
    )
    ref = _image(tmp_path, "libhopper_a.so")
    r = cli("affinity", ref, "--into", str(manifest))
    assert r.code == 0, r.err
    job = yaml.safe_load(r.out)
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    merged = _terms(pod)
    code, alone = _affinity(cli, ref)
    assert code == 0, alone
    # every term of the image's affinity, each ANDed with the manifest's zone
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    assert merged == [[zone, *t] for t in _terms(alone)]
    assert len(merged) == 1  # driver >= 580.65.06 is one Gt, so one term
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--require", "fp9"], "not a feature the profiles know"),
        (["--into", "/nonexistent/job.yaml"], "cannot read"),
    ],
)
def test_bad_input_exits_2(cli: CliRunner, tmp_path: Path, args: list[str], message: str) -> None:
    r = cli("affinity", _image(tmp_path, "libhopper_a.so"), *args)
    assert r.code == 2
    assert message in r.err


def test_into_refuses_objects_without_a_pod_template(cli: CliRunner, tmp_path: Path) -> None:
    manifest = tmp_path / "svc.yaml"
    manifest.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    r = cli("affinity", _image(tmp_path, "libhopper_a.so"), "--into", str(manifest))
    assert r.code == 2
    assert "has no pod template" in r.err


def test_manifests_validate_offline(cli: CliRunner, tmp_path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "families:\n  hopper: training-hopper\n"
        "pools:\n  training-hopper:\n    images: [registry.example.com/ml/train:1]\n"
    )
    r = cli(
        "k8s",
        "manifests",
        "--image",
        "registry.example.com/buildmatrix:1",
        "--pools",
        str(pools),
        "--namespace",
        "gpu-admission",
        "--load-test",
        "--example-job",
    )
    assert r.code == 0, r.err
    docs = list(yaml.safe_load_all(r.out))
    kinds = [d["kind"] for d in docs]
    assert kinds == [
        "Namespace",
        "ResourceQuota",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ConfigMap",
        "DaemonSet",
        "Job",
    ]
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    by_kind = {d["kind"]: d for d in docs}
    role = by_kind["ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert by_kind["ConfigMap"]["data"]["pools.yaml"] == pools.read_text()
    ds = by_kind["DaemonSet"]["spec"]["template"]["spec"]
    assert ds["containers"][0]["image"] == "registry.example.com/buildmatrix:1"
    assert "--load-test" in ds["containers"][0]["command"][-1]
    assert {t["key"] for t in ds["tolerations"]} == {"buildmatrix.io/unverified", "nvidia.com/gpu"}
    job = by_kind["Job"]["spec"]["template"]["spec"]
    for sm in ("sm_89", "sm_90", "sm_100"):
        assert affinity_matches(job["affinity"], _node_labels(sm))
    assert not affinity_matches(job["affinity"], _node_labels("sm_80"))
    assert not affinity_matches(job["affinity"], _node_labels("sm_90", 40960))


def test_manifests_refuse_a_bad_pools_file(cli: CliRunner, tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("families:\n  hoper: x\n")
    r = cli("k8s", "manifests", "--pools", str(pools))
    assert r.code == 2


# ------------------------------------------------ the CPU architecture of the node

_PLATFORM_SETS = [("amd64",), ("arm64",), ("amd64", "arm64")]


@pytest.mark.parametrize("arches", _PLATFORM_SETS, ids="+".join)
def test_the_node_arch_is_matched_iff_the_image_offers_it(
    cli: CliRunner, tmp_path: Path, arches: tuple[str, ...]
) -> None:
    """An OCI index offering ``arches`` (the same code in each entry): on a node of
    every profile and each CPU architecture, the affinity matches iff ``check --sm
    SM --platform linux/ARCH`` passes (check picks the entry containerd would pull and
    exits 2 when there is none). The arch term is there iff some GPU the image runs on
    comes with a host the image does not offer (the profiles' hosts)."""
    lib: Layer = {"usr/lib/libsass_ptx.so": fixture("libsass_ptx.so")}
    entries: list[tuple[dict[str, str] | None, Image]] = [
        (
            {"os": "linux", "architecture": a},
            Image(layers=[lib], platform={"os": "linux", "architecture": a}),
        )
        for a in arches
    ]
    ref = f"oci:{write_platform_layout(tmp_path / 'multi', entries)}:multi"
    code, doc = _affinity(cli, ref, "--platform", f"linux/{arches[0]}")
    assert code == 0, doc
    runs = {
        (p.sm, a): cli("check", ref, "--sm", p.sm, "--platform", f"linux/{a}").code == 0
        for p in PROFILES
        for a in ("amd64", "arm64")
    }
    assert any(runs.values())
    assert not all(runs.values())
    placed = {
        (sm, a): affinity_matches(doc["affinity"], _node_labels(sm, arch=a)) for sm, a in runs
    }
    assert placed == runs
    chosen = [p for p in PROFILES if runs[p.sm, arches[0]]]
    needed = {plat.split("/")[1] for plat in PROFILES.platforms(chosen)}
    has_arch = any(e["key"] == "kubernetes.io/arch" for t in _terms(doc) for e in t)
    assert has_arch is not (needed <= set(arches))


@pytest.mark.parametrize(
    "libs", [("libsass_ptx.so", "libsass_sm80.so"), ("libsass_sm80.so", "libhopper_a.so")]
)
def test_each_arch_runs_what_its_own_entry_runs(
    cli: CliRunner, tmp_path: Path, libs: tuple[str, str]
) -> None:
    """An index whose amd64 and arm64 entries hold different code: on a node of every
    profile and each CPU architecture, the affinity matches iff ``check --sm SM
    --platform linux/ARCH`` (the entry that node pulls) passes. Judging the amd64
    entry alone would send GH200 nodes (arm64, 9.0) a Pod whose arm64 entry has no
    Hopper code."""
    entries: list[tuple[dict[str, str] | None, Image]] = [
        (
            {"os": "linux", "architecture": a},
            Image(
                layers=[{"usr/lib/libk.so": fixture(lib)}],
                platform={"os": "linux", "architecture": a},
            ),
        )
        for a, lib in zip(("amd64", "arm64"), libs, strict=True)
    ]
    ref = f"oci:{write_platform_layout(tmp_path / 'multi', entries)}:multi"
    code, doc = _affinity(cli, ref)
    assert code == 0, doc
    runs = {
        (p.sm, a): cli("check", ref, "--sm", p.sm, "--platform", f"linux/{a}").code == 0
        for p in PROFILES
        for a in ("amd64", "arm64")
    }
    by_arch = {a: {sm for (sm, b), ok in runs.items() if ok and b == a} for a in ("amd64", "arm64")}
    assert by_arch["amd64"] != by_arch["arm64"]  # the entries differ where it matters
    placed = {
        (sm, a): affinity_matches(doc["affinity"], _node_labels(sm, arch=a)) for sm, a in runs
    }
    assert placed == runs
