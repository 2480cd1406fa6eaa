"""``buildmatrix k8s nodepools``: autoscaler templates whose labels are smoke's.

- Scale from zero: Pods carrying ``affinity``'s terms make exactly the NodePools whose
  GPUs run their image launch a node, over both pools files (tests/fixtures/nodes and
  examples), three drivers and every fixture image of tests/test_affinity.py, with and
  without ``--require-sass``. The launch decision is Karpenter's, restated in
  tests/karpenter_sim.py (each rule cited there); the truth is ``check --snapshot`` on a
  node of each of the NodePool's GPU models at its driver. Without the template labels
  no Pod scales anything (Karpenter: "label ... does not have known values").
- A template never lies: on every fixture node smoke admits, the labels of the
  NodePool holding its GPU model at its driver are exactly smoke's own for those keys.
- The NodePools validate against Karpenter's NodePool CRD (kubernetes-sigs/karpenter
  ``pkg/apis/crds/karpenter.sh_nodepools.yaml`` at commit 22664681, copied unchanged to
  tests/fixtures/crds/), its CEL rules on label keys and requirements restated.
- cluster-autoscaler's tags read back, as its AWS provider reads them, to the same
  labels and the admission taint.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from buildmatrix.labelkeys import DRIVER_FLOOR, MEMORY, MEMORY_MB, SEED_KEYS, SMOKE, TAINT_KEY
from buildmatrix.node.nodepools import AWS_GPU_NAMES, CA_LABEL_TAG, CA_TAINT_TAG
from tests import karpenter_sim
from tests.conftest import REPO, CliRunner, validate

CRD = REPO / "tests" / "fixtures" / "crds" / "karpenter.sh_nodepools.yaml"
NODES = REPO / "tests" / "fixtures" / "nodes"
POOLS_FILES = {"fixtures": NODES / "pools.yaml", "examples": REPO / "examples" / "pools.yaml"}
DRIVERS = ("535.104.05", "550.90.07", "580.65.06")
POOLS = ("training-hopper", "training-ampere", "inference-ada", "training-blackwell")
# AWS's GPU instance types by instance-gpu-name, all x86 (aws/karpenter-provider-aws
# website/content/en/preview/reference/instance-types.md: p5, p5e/p5en, p4d/p4de, g5,
# g6, g6e, g4dn, p3dn, p6-b200, p6-b300 are amd64; only g5g's t4g is arm64).
INSTANCE_TYPES = [
    {
        "karpenter.k8s.aws/instance-gpu-name": karpenter_sim.requirement("In", [name]),
        "kubernetes.io/arch": karpenter_sim.requirement("In", ["amd64"]),
    }
    for name in sorted(set(AWS_GPU_NAMES.values()))
]


def _render(cli: CliRunner, pools: Path, driver: str, *args: str) -> list[dict[str, Any]]:
    drivers = [f"--driver={p}={driver}" for p in POOLS]
    r = cli("k8s", "nodepools", "--pools", str(pools), *drivers, *args)
    assert r.code == 0, r.err
    if "cluster-autoscaler" in args:
        return [yaml.safe_load(r.out)]
    return [d for d in yaml.safe_load_all(r.out) if d is not None]


def _products(nodepool: dict[str, Any]) -> list[str]:
    return str(nodepool["metadata"]["annotations"]["buildmatrix.io/products"]).split(", ")


def _snapshot(out: Path, product: str, cc: str, driver: str) -> Path:
    """A node of one GPU of the product at the driver, on an x86 host (AWS's)."""
    path = out / f"{re.sub(r'[^A-Za-z0-9]+', '-', product)}-{driver}.json"
    gpu = {"index": 0, "name": product, "compute_capability": cc, "memory_total_mib": 81559}
    doc = {"version": 1, "hostname": path.stem, "driver_version": driver, "gpus": [gpu]}
    path.write_text(json.dumps(doc | {"errors": [], "cpu": "amd64"}))
    return path


@pytest.fixture(scope="module")
def fixture_refs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from tests.images import write_docker_archive
    from tests.test_affinity import _fixture_images

    out = tmp_path_factory.mktemp("nodepool-images")
    return {
        name: f"docker-archive:{write_docker_archive(out / f'{name}.tar', image)}"
        for name, image in _fixture_images(out).items()
    }


@pytest.mark.parametrize("sass", [False, True], ids=["any", "require-sass"])
def test_pods_scale_up_exactly_the_nodepools_whose_gpus_run_their_image(
    cli: CliRunner, fixture_refs: dict[str, str], tmp_path: Path, sass: bool
) -> None:
    flags = ["--require-sass"] if sass else []
    refs = list(fixture_refs.values())
    pods: dict[str, dict[str, Any] | None] = {}
    for name, ref in fixture_refs.items():
        r = cli("affinity", ref, "--format", "json", *flags)
        assert r.code in (0, 1), r.err
        pods[name] = r.json() if r.code == 0 else None  # exit 1: no GPU runs it
    verdicts: dict[tuple[str, str], dict[str, bool]] = {}

    def runs(product: str, cc: str, driver: str) -> dict[str, bool]:
        if (product, driver) not in verdicts:
            node = _snapshot(tmp_path, product, cc, driver)
            r = cli("check", *refs, "--snapshot", str(node), "--json", *flags)
            assert r.code in (0, 1), r.err
            docs = r.json()["images"]
            verdicts[product, driver] = {
                n: d["verdict"] == "pass" for n, d in zip(fixture_refs, docs, strict=True)
            }
        return verdicts[product, driver]

    launched: dict[tuple[str, str, str, str], bool] = {}
    expected: dict[tuple[str, str, str, str], bool] = {}
    bare: list[bool] = []
    for which, pools in POOLS_FILES.items():
        for driver in DRIVERS:
            for nodepool in _render(cli, pools, driver, "--provisioner", "karpenter"):
                labels = nodepool["spec"]["template"]["metadata"]["labels"]
                cc = labels["buildmatrix.io/gpu.compute-capability"]
                stripped = json.loads(json.dumps(nodepool))
                stripped["spec"]["template"]["metadata"]["labels"] = {}
                for name, pod in pods.items():
                    key = (which, driver, nodepool["metadata"]["name"], name)
                    expected[key] = any(runs(p, cc, driver)[name] for p in _products(nodepool))
                    launched[key] = pod is not None and karpenter_sim.launches(
                        nodepool, pod, INSTANCE_TYPES
                    )
                    if pod is not None:
                        bare.append(karpenter_sim.launches(stripped, pod, INSTANCE_TYPES))
    assert launched == expected
    assert any(expected.values()) and not all(expected.values())
    assert bare and not any(bare)  # without the labels smoke writes, nothing scales up
    if not sass:  # pairs the property must not pass by accident
        assert expected["fixtures", "580.65.06", "training-hopper", "cu13-sm90a"]
        assert not expected["fixtures", "535.104.05", "training-hopper", "cu13-sm90a"]
        assert not expected["fixtures", "580.65.06", "training-ampere-a100", "cu13-sm90a"]


def test_the_rule_the_simulation_restates_refuses_an_undefined_label() -> None:
    """Karpenter's own message for a required label no NodePool defines (#7535)."""
    template = karpenter_sim.from_expressions(
        [{"key": "gpu-pool", "operator": "In", "values": ["a"]}]
    )
    pod = karpenter_sim.from_expressions(
        [{"key": "buildmatrix.io/driver.version", "operator": "Gt", "values": ["580065005"]}]
    )
    assert karpenter_sim.compatible(template, pod) == (
        'label "buildmatrix.io/driver.version" does not have known values'
    )
    template |= karpenter_sim.from_expressions(
        [{"key": "buildmatrix.io/driver.version", "operator": "In", "values": ["580065006"]}]
    )
    assert karpenter_sim.compatible(template, pod) is None
    low = karpenter_sim.from_expressions(
        [{"key": "buildmatrix.io/driver.version", "operator": "In", "values": ["580065005"]}]
    )
    assert karpenter_sim.compatible(low, pod) is not None


def _smoke_labels(cli: CliRunner, node: Path, pools: Path) -> dict[str, str] | None:
    r = cli("smoke", "--snapshot", str(node), "--pools", str(pools), "--json")
    return dict(r.json()["labels"]) if r.code == 0 else None


def test_every_template_says_what_smoke_writes_on_the_node(cli: CliRunner) -> None:
    """Every fixture node smoke admits: the NodePool of its pool at its driver that
    holds its GPU model carries exactly smoke's labels for the keys buildmatrix owns,
    less what a round found (verdict, floor checked) and the memory (no profile records
    a model's NVML memory)."""
    pools = POOLS_FILES["fixtures"]
    compared = 0
    for node in sorted(NODES.glob("*.json")):
        doc = json.loads(node.read_text())
        labels = _smoke_labels(cli, node, pools)
        if labels is None or len({g["name"] for g in doc["gpus"]}) > 1:
            continue
        product = doc["gpus"][0]["name"]
        if product not in AWS_GPU_NAMES:
            continue  # no NodePool on AWS (the notes say so; the simulation covers it)
        r = cli(
            "k8s", "nodepools", "--pools", str(pools), "--provisioner", "karpenter",
            f"--driver={labels['gpu-pool']}={doc['driver_version']}", "--format", "json",
        )  # fmt: skip
        assert r.code == 0, r.err
        (nodepool,) = [np for np in r.json()["items"] if product in _products(np)]
        template = nodepool["spec"]["template"]["metadata"]["labels"]
        memory = {MEMORY, MEMORY_MB, SEED_KEYS[1]}
        owned = {
            k: v
            for k, v in labels.items()
            if (k.startswith("buildmatrix.io/") or k in {"gpu-pool", *SEED_KEYS})
            and k not in memory | {SMOKE, DRIVER_FLOOR}
        }
        assert template == owned, node.name
        compared += 1
    assert compared >= 5


def _cel(nodepool: dict[str, Any]) -> list[str]:
    """The CRD's x-kubernetes-validations on template labels and requirements, as
    written there (karpenter.sh domain restricted, karpenter.sh/nodepool and
    kubernetes.io/hostname refused, In needs values, Gt/Lt one integer >= 0)."""
    spec = nodepool["spec"]["template"]
    problems = []
    keys = [*spec["metadata"]["labels"], *(r["key"] for r in spec["spec"]["requirements"])]
    for key in keys:
        domain = key.split("/")[0] if "/" in key else key
        allowed = {"karpenter.sh/capacity-type", "karpenter.sh/nodepool"}
        if key not in allowed and domain.endswith("karpenter.sh"):
            problems.append(f"{key}: domain karpenter.sh is restricted")
        if key in ("karpenter.sh/nodepool", "kubernetes.io/hostname"):
            problems.append(f"{key} is restricted")
    for r in spec["spec"]["requirements"]:
        if r["operator"] == "In" and not r["values"]:
            problems.append(f"{r['key']}: In without values")
        if r["operator"] in ("Gt", "Lt", "Gte", "Lte") and (
            len(r["values"]) != 1 or int(r["values"][0]) < 0
        ):
            problems.append(f"{r['key']}: {r['operator']} needs one integer >= 0")
    return problems


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "NodePool"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1"
    return dict(version["schema"]["openAPIV3Schema"])


def test_nodepools_validate_against_karpenters_crd(cli: CliRunner) -> None:
    schema = _schema()
    seen = 0
    for pools in POOLS_FILES.values():
        for driver in DRIVERS:
            for nodepool in _render(cli, pools, driver, "--provisioner", "karpenter"):
                validate(nodepool, schema)
                assert _cel(nodepool) == []
                assert nodepool["apiVersion"] == "karpenter.sh/v1"
                assert nodepool["spec"]["template"]["spec"]["startupTaints"] == [
                    {"key": TAINT_KEY, "effect": "NoSchedule"}
                ]
                assert SMOKE not in nodepool["spec"]["template"]["metadata"]["labels"]
                seen += 1
    assert seen > 10
    (nodepool, *_) = _render(
        cli, POOLS_FILES["examples"], "580.65.06", "--provisioner", "karpenter"
    )
    broken = json.loads(json.dumps(nodepool))
    del broken["spec"]["template"]["spec"]["nodeClassRef"]
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, schema)
    broken = json.loads(json.dumps(nodepool))
    broken["spec"]["template"]["metadata"]["labels"]["karpenter.sh/x"] = "1"
    assert _cel(broken)


def test_cluster_autoscaler_reads_the_same_labels_and_the_taint(cli: CliRunner) -> None:
    """The tags as aws_manager.go reads them (extractLabelsFromAsg: the key after the
    prefix; extractTaintsFromAsg: VALUE:EFFECT matched by (.*):(NoSchedule|NoExecute|
    PreferNoSchedule)) give each Karpenter template's labels and smoke's taint."""
    for pools in POOLS_FILES.values():
        (doc,) = _render(cli, pools, "580.65.06", "--provisioner", "cluster-autoscaler")
        assert doc["version"] == 1
        karpenter = {
            tuple(_products(np)): np["spec"]["template"]["metadata"]["labels"]
            for np in _render(cli, pools, "580.65.06", "--provisioner", "karpenter")
        }
        for group in doc["nodeGroups"]:
            tags: dict[str, str] = group["tags"]
            labels = {k.split(CA_LABEL_TAG)[1]: v for k, v in tags.items() if CA_LABEL_TAG in k}
            taints = []
            for k, v in tags.items():
                if CA_TAINT_TAG in k and re.match(
                    r"(.*):(?:NoSchedule|NoExecute|PreferNoSchedule)", v
                ):
                    value, effect = v.split(":", 1)
                    taints.append(
                        {"key": k.split(CA_TAINT_TAG)[1], "value": value, "effect": effect}
                    )
            assert taints == [{"key": TAINT_KEY, "value": "", "effect": "NoSchedule"}]
            on_aws = tuple(p for p in group["products"] if p in AWS_GPU_NAMES)
            if on_aws in karpenter:
                assert labels == karpenter[on_aws]
            assert labels["buildmatrix.io/driver.version"] == "580065006"


def _promising(tmp_path: Path, **spec: Any) -> Path:
    doc = yaml.safe_load(POOLS_FILES["fixtures"].read_text())
    doc["pools"] = {"training-hopper": spec}
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_smoke_fails_a_node_off_its_pools_promise(cli: CliRunner, tmp_path: Path) -> None:
    """Driver drift and model drift fail the node (check ``pool``); a node as promised
    passes; a pool that promises nothing adds no check."""
    node = str(NODES / "h100-580.json")

    def smoke(pools: Path) -> tuple[int, dict[str, Any]]:
        r = cli("smoke", "--snapshot", node, "--pools", str(pools), "--json")
        checks = {c["name"]: c for c in r.json()["checks"]}
        return r.code, checks

    code, checks = smoke(_promising(tmp_path, driver="580.65.06"))
    assert code == 0 and checks["pool"]["ok"]
    code, checks = smoke(_promising(tmp_path, driver="580.82.07"))
    assert code == 1 and not checks["pool"]["ok"]
    assert (
        "580.65.06 is not the 580.82.07 pools.training-hopper.driver promises"
        in (checks["pool"]["message"])
    )
    code, checks = smoke(_promising(tmp_path, products=["NVIDIA H200"]))
    assert code == 1 and "NVIDIA H100 80GB HBM3 is not among" in checks["pool"]["message"]
    code, checks = smoke(POOLS_FILES["fixtures"])
    assert code == 0 and "pool" not in checks


def test_a_driver_off_the_promise_or_none_at_all_is_bad_input(
    cli: CliRunner, tmp_path: Path
) -> None:
    pools = _promising(tmp_path, driver="580.65.06")
    base = ("k8s", "nodepools", "--pools", str(pools), "--provisioner", "karpenter")
    r = cli(*base, "--driver", "training-hopper=580.82.07")
    assert r.code == 2 and "promises 580.65.06" in r.err and r.out == ""
    r = cli(*base)  # the promise is the driver
    assert r.code == 0, r.err
    assert "580065006" in r.out
    r = cli(
        "k8s", "nodepools", "--pools", str(POOLS_FILES["fixtures"]), "--provisioner", "karpenter"
    )
    assert r.code == 2 and "--driver POOL=VERSION" in r.err
    r = cli(*base, "--driver", "nosuchpool=580.65.06")
    assert r.code == 2 and "no pool 'nosuchpool'" in r.err


@pytest.mark.parametrize(
    "key", [TAINT_KEY, "startup-taint.cluster-autoscaler.kubernetes.io/buildmatrix-unverified"]
)
def test_the_templates_carry_the_taint_key(cli: CliRunner, key: str) -> None:
    """--taint-key, as smoke and k8s manifests take it: Karpenter's startup taint and
    cluster-autoscaler's taint tag follow it; the note asks for --startup-taint only
    where the key lacks the prefix managed autoscalers honour without flags."""
    pools = POOLS_FILES["examples"]
    karpenter = ("--provisioner", "karpenter", "--taint-key", key)
    for nodepool in _render(cli, pools, "580.65.06", *karpenter):
        assert nodepool["spec"]["template"]["spec"]["startupTaints"] == [
            {"key": key, "effect": "NoSchedule"}
        ]
    drivers = [f"--driver={p}=580.65.06" for p in POOLS]
    r = cli("k8s", "nodepools", "--pools", str(pools), *drivers, "--taint-key", key,
            "--provisioner", "cluster-autoscaler", "--format", "json")  # fmt: skip
    assert r.code == 0, r.err
    for group in r.json()["nodeGroups"]:
        assert group["tags"][CA_TAINT_TAG + key] == ":NoSchedule"
        assert not any(
            k.startswith(CA_TAINT_TAG) and k != CA_TAINT_TAG + key for k in group["tags"]
        )
    assert ("--startup-taint=" in r.err) is (key == TAINT_KEY)
