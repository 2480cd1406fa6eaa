"""``affinity`` and ``k8s manifests``.

The property: for every arch profile, a node labelled as smoke labels a GPU of that
profile is matched by the printed nodeAffinity iff ``check`` passes the image there
and the profile has every required feature. The nodeAffinity is evaluated with the
scheduler's documented rules (buildmatrix.affinity.matches); manifests are validated
offline against the Kubernetes OpenAPI schemas by kubernetes-validate (strict).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmatrix.affinity import matches
from buildmatrix.profiles import load_profiles
from tests.conftest import SHIPPED_PROFILES, CliRunner
from tests.images import Image, Layer, fixture, write_docker_archive

PROFILES = load_profiles(SHIPPED_PROFILES)
K8S_VERSION = "1.34.0"


def _image(tmp_path: Path, *libs: str, name: str = "img") -> str:
    layer: Layer = {f"usr/lib/{lib}": fixture(lib) for lib in libs}
    return f"docker-archive:{write_docker_archive(tmp_path / f'{name}.tar', Image(layers=[layer]))}"


def _node_labels(sm: str, memory: int = 81559) -> dict[str, str]:
    p = PROFILES.get(sm)
    return {
        "nvidia.com/gpu.family": p.family.value,
        "nvidia.com/gpu.compute-capability": str(p.cc),
        "nvidia.com/gpu.memory": str(memory),
    }


def _affinity(cli: CliRunner, ref: str, *args: str) -> tuple[int, Any]:
    r = cli("affinity", ref, "--format", "json", *args)
    return r.code, (json.loads(r.out) if r.code == 0 else r.err)


CASES = [
    ("libsass_ptx.so",),  # sm_80 + sm_90 SASS, compute_90 PTX
    ("libhopper_a.so",),  # sm_90a only
    ("libmulti.so",),  # eight SMs
    ("libblackwell_f.so",),  # sm_100f, sm_120f
    ("kernels_sm100f.cubin",),  # part of a family
    ("libsass_sm80.so", "libhopper_a.so"),  # one file for each: no GPU runs both
]
NEEDS = [(), ("--require", "fp8"), ("--require-sass",), ("--require", "fp4", "--require-sass")]


@pytest.mark.parametrize("libs", CASES, ids="+".join)
@pytest.mark.parametrize("needs", NEEDS, ids=lambda n: " ".join(n) or "none")
def test_the_affinity_admits_a_gpu_iff_check_passes_there(
    cli: CliRunner, tmp_path: Path, libs: tuple[str, ...], needs: tuple[str, ...]
) -> None:
    ref = _image(tmp_path, *libs)
    code, doc = _affinity(cli, ref, *needs)
    features = [needs[i + 1] for i, x in enumerate(needs) if x == "--require"]
    sass = "--require-sass" in needs
    expected = {}
    for p in PROFILES:
        args = ["check", ref, "--sm", p.sm, "--json"] + (["--require-sass"] if sass else [])
        r = cli(*args)
        runs = r.code == 0
        expected[p.sm] = runs and all(f in p.features for f in features)
    if not any(expected.values()):
        assert code == 1
        assert "runs on none of the GPUs" in doc
        return
    assert code == 0, doc
    got = {p.sm: matches(doc["affinity"], _node_labels(p.sm)) for p in PROFILES}
    assert got == expected


def test_the_seeds_fp8_case(cli: CliRunner, tmp_path: Path) -> None:
    """An FP8 image with Hopper code that needs 70000 MiB: Hopper GPUs with enough
    memory only; with Ada code too, both families."""
    hopper = _image(tmp_path, "libhopper_a.so", name="h")
    code, doc = _affinity(cli, hopper, "--require", "fp8", "--min-memory", "70000")
    assert code == 0, doc
    exprs = doc["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"]
    assert exprs == [
        {"key": "nvidia.com/gpu.family", "operator": "In", "values": ["hopper"]},
        {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["69999"]},
    ]
    assert matches(doc["affinity"], _node_labels("sm_90", 81559))
    assert not matches(doc["affinity"], _node_labels("sm_90", 65536))
    assert not matches(doc["affinity"], _node_labels("sm_89", 81559))
    both = _image(tmp_path, "libmulti.so", name="b")  # sm_89 and sm_90 among others
    code, doc = _affinity(cli, both, "--require", "fp8")
    assert code == 0, doc
    first = doc["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"][0]
    assert first == {
        "key": "nvidia.com/gpu.family",
        "operator": "In",
        "values": ["ada-lovelace", "blackwell", "hopper"],
    }


def test_a_partly_covered_family_is_named_by_compute_capability(
    cli: CliRunner, tmp_path: Path
) -> None:
    """sm_100 SASS runs on 10.0 and 10.3, not on the 12.x GPUs of the same family, so
    the capabilities are listed (with sm_100f and sm_120f code the family is whole)."""
    ref = _image(tmp_path, "kernels_sm100f.cubin")
    code, doc = _affinity(cli, ref)
    assert code == 0, doc
    term = doc["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    assert term["matchExpressions"][0]["key"] == "nvidia.com/gpu.compute-capability"
    assert term["matchExpressions"][0]["values"] == ["10.0", "10.3"]
    code, doc = _affinity(cli, _image(tmp_path, "libblackwell_f.so", name="f"))
    assert doc["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"][0] == {
        "key": "nvidia.com/gpu.family",
        "operator": "In",
        "values": ["blackwell"],
    }


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
    exprs = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"]
    assert [e["key"] for e in exprs] == ["topology.kubernetes.io/zone", "nvidia.com/gpu.family"]
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
    pools.write_text("families:\n  hopper: training-hopper\n")
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
    )
    assert r.code == 0, r.err
    docs = list(yaml.safe_load_all(r.out))
    kinds = [d["kind"] for d in docs]
    assert kinds == [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Job",
    ]
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    role = docs[2]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert docs[4]["data"]["pools.yaml"] == pools.read_text()
    ds = docs[5]["spec"]["template"]["spec"]
    assert ds["containers"][0]["image"] == "registry.example.com/buildmatrix:1"
    assert "--load-test" in ds["containers"][0]["command"][-1]
    assert {t["key"] for t in ds["tolerations"]} == {"buildmatrix.io/unverified", "nvidia.com/gpu"}
    job = docs[6]["spec"]["template"]["spec"]
    for sm in ("sm_89", "sm_90", "sm_100"):
        assert matches(job["affinity"], _node_labels(sm))
    assert not matches(job["affinity"], _node_labels("sm_80"))
    assert not matches(job["affinity"], _node_labels("sm_90", 40960))


def test_manifests_refuse_a_bad_pools_file(cli: CliRunner, tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("families:\n  hoper: x\n")
    r = cli("k8s", "manifests", "--pools", str(pools))
    assert r.code == 2
