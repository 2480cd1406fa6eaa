"""``buildmatrix k8s drivers``: GPU Operator ``NVIDIADriver`` objects, one per pool.

Validated offline against the NVIDIADriver CRD's own schema (NVIDIA/gpu-operator
``deployments/gpu-operator/crds/nvidia.com_nvidiadrivers.yaml`` at commit a22dbf67,
v26.7.0; tests/fixtures/crds/nvidia.com_nvidiadrivers.yaml). The CRD's one CEL rule
(``default NVIDIADriver must not use nodeSelector``) cannot be run by jsonschema; it is
restated below from the CRD text, and the operator's rule that no two objects select
the same node (``internal/validator/validator.go``) is checked over the pools' labels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import REPO, CliRunner, validate
from tests.driver_fleet import Fleet, build_fleet

CRD = REPO / "tests" / "fixtures" / "crds" / "nvidia.com_nvidiadrivers.yaml"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    return build_fleet(tmp_path_factory.mktemp("fleet"))


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "NVIDIADriver"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    return dict(version["schema"]["openAPIV3Schema"])


def _cel_default_without_node_selector(spec: dict[str, Any]) -> bool:
    """The CRD's x-kubernetes-validations rule on spec, as written there:
    has(self.default) && self.default ? !has(self.nodeSelector) ||
    size(self.nodeSelector) == 0 : true"""
    if spec.get("default"):
        return "nodeSelector" not in spec or len(spec["nodeSelector"]) == 0
    return True


def _objects(cli: CliRunner, fleet: Fleet, *args: str) -> list[dict[str, Any]]:
    r = cli("k8s", "drivers", "--pools", str(fleet.pools), *args)
    assert r.code == 0, r.err
    return [d for d in yaml.safe_load_all(r.out) if d is not None]


def test_one_valid_object_per_pool(cli: CliRunner, fleet: Fleet) -> None:
    proposed = {
        "training-hopper": "580.82.07",
        "training-ampere": "580.65.06",
        "training-blackwell": "590.44.01",
        "general": "570.172.08",
    }
    objects = _objects(cli, fleet, *(f"--driver={p}={v}" for p, v in proposed.items()))
    schema = _schema()
    assert [o["spec"]["nodeSelector"] for o in objects] == [{"gpu-pool": p} for p in proposed]
    for obj, (pool, version) in zip(objects, proposed.items(), strict=True):
        validate(obj, schema)
        assert (obj["apiVersion"], obj["kind"]) == ("nvidia.com/v1alpha1", "NVIDIADriver")
        assert obj["spec"]["version"] == version
        assert obj["spec"]["default"] is False
        assert obj["metadata"]["name"] == pool
        assert _cel_default_without_node_selector(obj["spec"])
        # The API server prunes fields its structural schema does not name: every
        # field written must be one the CRD has, or it would silently vanish.
        assert set(obj["spec"]) <= set(schema["properties"]["spec"]["properties"])
    # No node is selected by two objects (the operator refuses that): one gpu-pool
    # value per object, and a node carries one value.
    values = [o["spec"]["nodeSelector"]["gpu-pool"] for o in objects]
    assert len(set(values)) == len(values)


def test_the_schema_rejects_what_the_operator_rejects(cli: CliRunner, fleet: Fleet) -> None:
    """The fixture schema can fail: without a required key, or with a driverType the
    CRD does not list, the object is refused."""
    (obj,) = _objects(cli, fleet, "--driver", "training-hopper=580.82.07")
    schema = _schema()
    for broken in (
        {**obj, "spec": {k: v for k, v in obj["spec"].items() if k != "image"}},
        {**obj, "spec": {**obj["spec"], "driverType": "gpu-passthrough"}},
        {**obj, "spec": {**obj["spec"], "nodeSelector": {"gpu-pool": 3}}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate(broken, schema)
    assert not _cel_default_without_node_selector({**obj["spec"], "default": True})


def test_a_driver_below_the_pools_floor_is_refused(cli: CliRunner, fleet: Fleet) -> None:
    """training-hopper's floor is the fixtures' CUDA 13.0 runtime floor, 580.65.06."""
    r = cli("k8s", "drivers", "--pools", str(fleet.pools), "--driver", "training-hopper=580.65.05")
    assert r.code == 2
    assert "needs driver >= 580.65.06" in r.err and r.out == ""
    assert _objects(cli, fleet, "--driver", "training-hopper=580.65.06")
    r = cli("k8s", "drivers", "--pools", str(fleet.pools))
    assert r.code == 2 and "--driver" in r.err


def test_repository_and_image_and_json(cli: CliRunner, fleet: Fleet, tmp_path: Path) -> None:
    r = cli(
        "k8s", "drivers", "--pools", str(fleet.pools), "--driver", "general=580.82.07",
        "--repository", "registry.example.com/nvidia", "--image", "driver-signed",
        "--format", "json",
    )  # fmt: skip
    assert r.code == 0, r.err
    (obj,) = r.json()["items"]
    assert obj["spec"]["repository"] == "registry.example.com/nvidia"
    assert obj["spec"]["image"] == "driver-signed"
    validate(obj, _schema())


def test_the_toleration_follows_the_taint_key(cli: CliRunner, fleet: Fleet) -> None:
    """--taint-key: each NVIDIADriver tolerates that admission taint (docs/kubernetes.md,
    Day 2), valid against the CRD; a key the API server would refuse is exit 2."""
    key = "startup-taint.cluster-autoscaler.kubernetes.io/buildmatrix-unverified"
    objects = _objects(cli, fleet, "--driver=training-hopper=580.82.07", "--taint-key", key)
    for obj in objects:
        validate(obj, _schema())
        assert obj["spec"]["tolerations"] == [
            {"key": key, "operator": "Exists", "effect": "NoSchedule"}
        ]
    r = cli("k8s", "drivers", "--pools", str(fleet.pools), "--driver=training-hopper=580.82.07",
            "--taint-key", "only/one/slash")  # fmt: skip
    assert r.code == 2
    assert "not a taint key the API server accepts" in r.err
