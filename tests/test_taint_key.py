"""Day 2, ``--taint-key`` (smoke, k8s manifests): every rendered object follows the key,
the admission policy's CEL (evaluated by cel-python, tests/admission_policy.py) holds
the agent to it, ``smoke --apply`` adds and removes it through the STAND-IN API
server (tests/kube_standin.py), and a key is accepted exactly as Kubernetes accepts a
taint key (pkg/apis/core/validation ``validateNodeTaints``: ``ValidateLabelName``,
apimachinery ``IsQualifiedName``), checked on apimachinery's own test table
(``pkg/util/validation/validation_test.go``, ``TestIsQualifiedName``).

Why a key of one's own: cluster-autoscaler plans with a node that carries a taint
only if it knows the taint is a startup taint, listed with ``--startup-taint`` or
under the prefix ``startup-taint.cluster-autoscaler.kubernetes.io/``
(kubernetes/autoscaler ``cluster-autoscaler/utils/taints/taints.go``,
``StartupTaintPrefix``); a managed autoscaler (GKE, AKS) takes no flag.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmatrix.labelkeys import REPORT_ANNOTATION, TAINT_EFFECT, TAINT_KEY, GfdKeys
from buildmatrix.node.apply import plan
from tests.admission_policy import UserInfo, denials, request
from tests.conftest import REPO, CliRunner
from tests.kube_standin import ApiStandIn, apply_patch

NODES = REPO / "tests" / "fixtures" / "nodes"
CA_KEY = "startup-taint.cluster-autoscaler.kubernetes.io/buildmatrix-unverified"
KEYS = [TAINT_KEY, CA_KEY, "example.com/Gpu_Unverified-1"]
OTHER_TAINTS = {"nvidia.com/gpu", "node-role.kubernetes.io/control-plane"}
AGENT = "system:serviceaccount:buildmatrix:buildmatrix-smoke"
CLAIM = "authentication.kubernetes.io/node-name"

# apimachinery pkg/util/validation/validation_test.go, TestIsQualifiedName
QUALIFIED = [
    "simple",
    "now-with-dashes",
    "1-starts-with-num",
    "1234",
    "simple/simple",
    "now-with-dashes/simple",
    "now-with-dashes/now-with-dashes",
    "now.with.dots/simple",
    "now-with.dashes-and.dots/simple",
    "1-num.2-num/3-num",
    "1234/5678",
    "1.2.3.4/5678",
    "Uppercase_Is_OK_123",
    "example.com/Uppercase_Is_OK_123",
    "requests.storage-foo",
    "a" * 63,
    "a" * 253 + "/" + "b" * 63,
]
NOT_QUALIFIED = [
    "nospecialchars%^=@",
    "cantendwithadash-",
    "-cantstartwithadash-",
    "only/one/slash",
    "Example.com/abc",
    "example_com/abc",
    "example.com/",
    "/simple",
    "a" * 64,
    "a" * 254 + "/abc",
]


def _objects(cli: CliRunner, *args: str) -> list[Any]:
    r = cli("k8s", "manifests", *args, "--format", "json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    # several objects are one v1 List; the Helm values are one map
    return doc["items"] if doc.get("kind") == "List" else [doc]


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)


RENDERINGS = [
    (),
    ("--mode", "nfd"),
    ("--runtime-class", "--load-test", "--pools", str(NODES / "pools-images.yaml")),
    ("--gpu-operator-values",),
    ("--gpu-operator-values", "--mode", "nfd"),
    ("--nfd-values",),
]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("args", RENDERINGS, ids=lambda a: " ".join(a) or "default")
def test_every_rendered_object_follows_the_key(
    cli: CliRunner, key: str, args: tuple[str, ...], tmp_path: Path
) -> None:
    """Walk every object: each toleration or taint of effect NoSchedule that is not
    another component's is the key's; none is the default's when another key is
    given; and the DaemonSet's smoke and its --mark-failed both pass the key."""
    if "--pools" in args:
        pools = tmp_path / "pools.yaml"
        pools.write_text(
            "families: {hopper: h}\ndefault: other\npools:\n"
            "  h: {images: [registry.example.com/a:1]}\n"
            "  other: {images: [registry.example.com/b:1]}\n"
        )
        args = tuple(str(pools) if a.endswith("pools-images.yaml") else a for a in args)
    objects = _objects(cli, *args, "--taint-key", key)
    ours = [
        v
        for o in objects
        for v in _walk(o)
        if isinstance(v, dict)
        and v.get("effect") == TAINT_EFFECT
        and "key" in v
        and v["key"] not in OTHER_TAINTS
    ]
    assert ours, "no admission toleration or taint rendered"
    assert {v["key"] for v in ours} == {key}
    text = json.dumps(objects)
    if key != TAINT_KEY:
        assert TAINT_KEY not in text
    for o in objects:
        if o.get("kind") == "DaemonSet":
            script = o["spec"]["template"]["spec"]["containers"][0]["command"][2]
            flag = f"--taint-key {key}"
            assert script.count(flag) == (0 if key == TAINT_KEY else 2), script
        if o.get("kind") == "ValidatingAdmissionPolicy":
            assert f"'{key}'" in json.dumps(o["spec"]["validations"])


def _node(taints: list[Any], labels: dict[str, str] | None = None) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-a",
            "labels": {"kubernetes.io/hostname": "gpu-a", **(labels or {})},
            "annotations": {},
            "resourceVersion": "7",
        },
        "spec": {"taints": taints},
        "status": {},
    }


@pytest.mark.parametrize("key", KEYS[1:])
def test_the_policy_holds_the_agent_to_the_key(cli: CliRunner, key: str) -> None:
    """The rendered policy's CEL, with the key: every patch smoke computes for that key
    (nodes joined with it, admitted, failed; pass and fail) is allowed; adding or
    removing the default key's taint, or the key with another effect, is refused."""
    (policy,) = [
        o for o in _objects(cli, "--taint-key", key) if o["kind"] == "ValidatingAdmissionPolicy"
    ]
    agent = UserInfo(AGENT, {CLAIM: ["gpu-a"]})
    gpu = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    mine = {"key": key, "effect": TAINT_EFFECT}
    states = [
        _node([mine, gpu]),
        _node([gpu], {"buildmatrix.io/smoke": "passed", "gpu-pool": "p"}),
        _node([mine], {"buildmatrix.io/smoke": "failed"}),
    ]
    verdicts = [
        ({"buildmatrix.io/smoke": "failed"}, False),
        ({"buildmatrix.io/smoke": "passed"}, True),
    ]
    for old, (labels, passed) in itertools.product(states, verdicts):
        body, _ = plan(
            old, passed=passed, labels=labels, report="r", gfd_keys=GfdKeys.AUTO, taint_key=key
        )
        new = apply_patch(old, body, "application/strategic-merge-patch+json")
        assert denials(policy, request(agent, old, new)) == [], (old, labels)
        assert (mine in new["spec"]["taints"]) == (not passed)
        assert gpu in new["spec"]["taints"] or gpu not in old["spec"]["taints"]
    default = {"key": TAINT_KEY, "effect": TAINT_EFFECT}
    for old, new_taints in [
        (_node([gpu]), [gpu, default]),  # the default key added
        (_node([default, gpu]), [gpu]),  # the default key removed
        (_node([gpu]), [gpu, {"key": key, "effect": "NoExecute"}]),
    ]:
        new = copy.deepcopy(old)
        new["spec"]["taints"] = new_taints
        refused = denials(policy, request(agent, old, new))
        assert any(f"only add or remove the taint {key}:NoSchedule" in m for m in refused)


@pytest.mark.parametrize("key", QUALIFIED)
def test_a_qualified_name_is_a_taint_key(cli: CliRunner, key: str) -> None:
    r = cli("k8s", "manifests", "--taint-key", key)
    assert r.code == 0, r.err


@pytest.mark.parametrize("key", NOT_QUALIFIED)
@pytest.mark.parametrize("command", ["smoke", "manifests"])
def test_anything_else_is_bad_input(cli: CliRunner, key: str, command: str) -> None:
    args = (
        ("smoke", "--snapshot", str(NODES / "h100-535.json"))
        if command == "smoke"
        else ("k8s", "manifests")
    )
    r = cli(*args, "--taint-key", key)
    assert r.code == 2, r.out
    assert "Invalid value for '--taint-key'" in r.err
    assert "not a taint key the API server accepts" in r.err
    assert "Traceback" not in r.err


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[ApiStandIn, Path]]:
    """The stand-in API server running the policy rendered for CA_KEY, gpu-1 joined
    with CA_KEY's taint."""
    from buildmatrix.k8s import render
    from buildmatrix.k8s_daemonset import Settings
    from buildmatrix.profile_files import load_profiles
    from tests.conftest import SHIPPED_PROFILES

    objects = render(Settings(image="x", taint_key=CA_KEY), load_profiles(SHIPPED_PROFILES))
    (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    standin = ApiStandIn(
        tokens={"smoke": {"get", "patch"}},
        identities={"smoke": UserInfo(AGENT, {CLAIM: ["gpu-1"]})},
        policies=[policy],
    )
    standin.add_node(
        "gpu-1", labels={"team": "ml"}, taints=[{"key": CA_KEY, "effect": "NoSchedule"}]
    )
    server, url = standin.serve()
    try:
        yield standin, standin.kubeconfig(tmp_path / "kubeconfig", url, "smoke")
    finally:
        server.shutdown()
        server.server_close()


def test_smoke_removes_and_adds_its_own_key(cli: CliRunner, api: tuple[ApiStandIn, Path]) -> None:
    standin, kubeconfig = api
    run: tuple[str, ...] = ("smoke", "--apply", "--node", "gpu-1", "--kubeconfig", str(kubeconfig))
    run += ("--taint-key", CA_KEY, "--json")
    ok = cli(*run, "--snapshot", str(NODES / "h100-535.json"))
    assert ok.code == 0, ok.err
    assert standin.nodes["gpu-1"]["spec"]["taints"] == []
    bad = cli(*run, "--snapshot", str(NODES / "h100-520.json"))
    assert bad.code == 1, bad.err
    node = standin.nodes["gpu-1"]
    assert node["spec"]["taints"] == [{"key": CA_KEY, "effect": "NoSchedule"}]
    assert "too old" in node["metadata"]["annotations"][REPORT_ANNOTATION]
    # the default key is not this deployment's: a fail adds nothing else
    assert all(t["key"] != TAINT_KEY for t in node["spec"]["taints"])
    assert yaml.safe_load(bad.out)["applied"]["taint"] == "added"
