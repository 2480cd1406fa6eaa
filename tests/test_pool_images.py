"""Which images smoke checks on a node (buildmatrix/node/poolimages.py), the pools
file's ``pools.<name>.images`` as it is validated, and ``k8s manifests`` shipping
them with the registry Secret (validated offline by kubernetes-validate, strict)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmatrix.cuda import load_cuda_facts
from buildmatrix.errors import InputError
from buildmatrix.k8s_daemonset import REGISTRY_CONFIG_DIR
from buildmatrix.node.checks import NodeOptions, evaluate
from buildmatrix.node.labels import POOL, node_labels
from buildmatrix.node.poolimages import (
    node_platform,
    nothing_to_load,
    plan_images,
    pools_without_images,
    require_images,
)
from buildmatrix.node.pools import Pools, load_pools, pools_from_data
from buildmatrix.profiles import ProfileSet
from buildmatrix.snapshot import load_snapshot
from tests.conftest import REPO, CliRunner
from tests.pool_registry import registry_secret
from tests.services import Registry

NODES = REPO / "tests" / "fixtures" / "nodes"
FIXTURES = sorted(NODES.glob("*.json"))
K8S_VERSION = "1.34.0"  # as tests/test_affinity.py validates the other objects


def _pools_with_images(profiles: ProfileSet) -> Pools:
    """The fixture pools file, each pool given one image named after it."""
    data = yaml.safe_load((NODES / "pools.yaml").read_text())
    names = {*data["families"].values(), *data["products"].values()}
    data["default"] = "general"
    data["pools"] = {n: {"images": [f"registry.example.com/{n}:1"]} for n in [*names, "general"]}
    return pools_from_data(data, source="pools.yaml", profiles=profiles)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_a_node_is_checked_against_the_images_of_the_pool_it_is_labelled_with(
    fixture: Path, profiles: ProfileSet
) -> None:
    """For every fixture node: the images planned are those of its ``gpu-pool`` label
    (judged with --allow-mixed and without health checks failing it, so that the
    labels name a pool wherever the node has GPUs)."""
    pools = _pools_with_images(profiles)
    snap = load_snapshot(fixture)
    plan = plan_images((), snapshot=snap, profiles=profiles, pools=pools)
    report = evaluate(snap, profiles, load_cuda_facts(), options=NodeOptions(allow_mixed=True))
    labels = node_labels(snap, report, pools=pools)
    if report.passed:
        assert plan.pool == labels[POOL]
        assert plan.from_pool == (f"registry.example.com/{labels[POOL]}:1",)
    elif not snap.gpus:
        assert plan.refs == ()
    else:  # a failing node is still checked against its pool's images
        assert plan.pool is not None
        assert plan.from_pool == pools.spec(plan.pool).images


def test_given_images_first_each_once(profiles: ProfileSet) -> None:
    pools = pools_from_data(
        {"families": {"hopper": "h"}, "pools": {"h": {"images": ["r/b:1", "r/c:1"]}}},
        source="p",
        profiles=profiles,
    )
    snap = load_snapshot(NODES / "h100-580.json")
    given = ["r/a:1", "r/b:1", "r/a:1"]
    plan = plan_images(given, snapshot=snap, profiles=profiles, pools=pools)
    assert plan.given == ("r/a:1", "r/b:1")
    assert plan.from_pool == ("r/c:1",)
    assert plan.refs == ("r/a:1", "r/b:1", "r/c:1")
    assert plan_images(given, snapshot=snap, profiles=profiles, pools=None).refs == plan.given
    ampere = load_snapshot(NODES / "a100-80gb.json")  # no pool for ampere in this file
    assert plan_images((), snapshot=ampere, profiles=profiles, pools=pools).refs == ()


@pytest.mark.parametrize(
    ("with_images", "default"), list(itertools.product([0, 1, 2], [None, "misc"]))
)
def test_pools_without_images(profiles: ProfileSet, with_images: int, default: str | None) -> None:
    mapped = ["train", "infer"]
    data: dict[str, Any] = {
        "families": {"hopper": "train", "ampere": "infer"},
        "pools": {p: {"images": [f"r/{p}:1"]} for p in mapped[:with_images]},
    }
    if default:
        data["default"] = default
    pools = pools_from_data(data, source="p", profiles=profiles)
    want = sorted({*mapped[with_images:], *([default] if default else [])})
    assert pools_without_images(pools) == want


def test_a_load_test_of_nothing_is_refused(profiles: ProfileSet) -> None:
    with pytest.raises(InputError, match="no --pools file"):
        require_images((), None)
    bare = load_pools(NODES / "pools.yaml", profiles)
    with pytest.raises(InputError, match=r"lists no images \(pools.<name>.images\)"):
        require_images((), bare)
    require_images(("r/a:1",), None)  # an image given: fine
    some = pools_from_data(
        {"families": {"hopper": "h", "ampere": "a"}, "pools": {"h": {"images": ["r/h:1"]}}},
        source="p.yaml",
        profiles=profiles,
    )
    require_images((), some)  # some pool has images: decided per node
    ampere = load_snapshot(NODES / "a100-80gb.json")
    check = nothing_to_load(plan_images((), snapshot=ampere, profiles=profiles, pools=some), some)
    assert check is not None and not check.ok
    assert "its pool 'a' lists no images (add pools.a.images to p.yaml)" in check.message
    l40s = load_snapshot(NODES / "l40s.json")  # ada-lovelace: in no pool of this file
    check = nothing_to_load(plan_images((), snapshot=l40s, profiles=profiles, pools=some), some)
    assert check is not None and "falls in no pool of p.yaml" in check.message
    hopper = load_snapshot(NODES / "h100-580.json")
    assert (
        nothing_to_load(plan_images((), snapshot=hopper, profiles=profiles, pools=some), some)
        is None
    )


@pytest.mark.parametrize(
    ("ref", "i"), [("docker://", 0), ("Upper/Case:1", 1), ("oci-archive:/x.tar", 1), ("", 1)]
)
def test_a_bad_pool_image_is_refused_naming_its_key(
    cli: CliRunner, tmp_path: Path, ref: str, i: int
) -> None:
    images = ["registry.example.com/ml/train:1", ref][: i + 1] if i else [ref]
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        yaml.safe_dump({"families": {"hopper": "h"}, "pools": {"h": {"images": images}}})
    )
    for args in (
        ["smoke", "--snapshot", str(NODES / "h100-580.json"), "--pools", str(pools)],
        ["k8s", "manifests", "--pools", str(pools)],
    ):
        r = cli(*args)
        assert r.code == 2, r.out
        assert f"{pools}: key 'pools.h.images[{i}]'" in r.err


# ---------------------------------------------------------------- k8s manifests


def _pools_file(tmp_path: Path, images: dict[str, list[str]]) -> Path:
    pools = tmp_path / "pools.yaml"
    data = {
        "families": {"hopper": "training-hopper", "ampere": "training-ampere"},
        "pools": {name: {"images": refs} for name, refs in images.items()},
    }
    pools.write_text(yaml.safe_dump(data))
    return pools


def test_manifests_mount_the_registry_secret(cli: CliRunner, tmp_path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    pools = _pools_file(
        tmp_path,
        {
            "training-hopper": ["registry.example.com/ml/train:1-hopper"],
            "training-ampere": ["registry.example.com/ml/train:1-ampere"],
        },
    )
    r = cli(
        "k8s", "manifests", "--pools", str(pools), "--registry-secret", "regcred", "--load-test"
    )
    assert r.code == 0, r.err
    docs = list(yaml.safe_load_all(r.out))
    secret = registry_secret(Registry("registry.example.com", "ci", "pw"))
    secret["metadata"] = {"name": "regcred", "namespace": "buildmatrix"}
    for d in [*docs, secret]:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    pod = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if "secret" in v)
    # the Secret's one key, as config.json, in the folder $DOCKER_CONFIG names
    assert volume["secret"] == {
        "secretName": "regcred",
        "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
    }
    assert set(secret["data"]) == {".dockerconfigjson"}
    container = pod["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert mount == {"name": volume["name"], "mountPath": REGISTRY_CONFIG_DIR, "readOnly": True}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DOCKER_CONFIG"] == REGISTRY_CONFIG_DIR
    # without the flag: no Secret, no DOCKER_CONFIG
    r = cli("k8s", "manifests", "--pools", str(pools))
    pod = next(d for d in yaml.safe_load_all(r.out) if d["kind"] == "DaemonSet")
    spec = pod["spec"]["template"]["spec"]
    assert not [v for v in spec["volumes"] if "secret" in v]
    assert "DOCKER_CONFIG" not in {e["name"] for e in spec["containers"][0]["env"]}


@pytest.mark.parametrize("name", ["RegCred", "-regcred", "reg_cred", "a" * 254, ""])
def test_manifests_refuse_a_bad_secret_name(cli: CliRunner, name: str) -> None:
    r = cli("k8s", "manifests", "--registry-secret", name)
    assert r.code == 2
    # an empty one is refused before, as every empty value is (tests/test_cli_input.py)
    assert ("the value is empty" if not name else "is not a valid Secret name") in r.err


def test_manifests_load_test_needs_every_pools_images(cli: CliRunner, tmp_path: Path) -> None:
    """With --load-test, a node of a pool without images could never pass."""
    r = cli("k8s", "manifests", "--load-test")
    assert r.code == 2
    assert "without --pools no pool names any" in r.err
    half = _pools_file(tmp_path, {"training-hopper": ["registry.example.com/ml/train:1"]})
    r = cli("k8s", "manifests", "--load-test", "--pools", str(half))
    assert r.code == 2
    assert "pool(s) training-ampere list none" in r.err
    assert cli("k8s", "manifests", "--pools", str(half)).code == 0  # no load test: fine


@pytest.mark.parametrize(
    ("machine", "want"),
    [
        ("x86_64", "linux/amd64"),
        ("aarch64", "linux/arm64"),
        ("arm64", "linux/arm64"),
        ("ppc64le", "linux/ppc64le"),
        ("s390x", "linux/s390x"),
        ("riscv64", "linux/riscv64"),
        ("i686", None),
        ("", None),
    ],
)
def test_node_platform(machine: str, want: str | None) -> None:
    """``uname -m`` to the OCI image index's ``os/architecture`` (Go's GOARCH names)."""
    assert node_platform(machine) == want
