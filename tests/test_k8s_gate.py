"""The GPU Pod gate (``k8s gate``), evaluated as rendered.

The policy's CEL is evaluated by cel-python (a CEL implementation buildmatrix did not
write) through tests/admission_policy.py, the stand-in for the API server's policy
plugin (no API server runs here), over Pods x placements: each fault denied by exactly
its rule, Pods without GPUs untouched. Every object is validated offline against the
Kubernetes OpenAPI schemas (kubernetes-validate), and the placements against the
schema of the CRD rendered beside them.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmatrix.labelkeys import COMPUTE_CAPABILITY, DRIVER_VERSION
from tests.admission_policy import denials
from tests.conftest import CliRunner, validate
from tests.images import Image, fixture, write_oci_layout

K8S_VERSION = "1.34.0"
HEX_A, HEX_B = "a" * 64, "b" * 64
IMAGE_A = f"ghcr.io/org/train@sha256:{HEX_A}"
IMAGE_B = f"ghcr.io/org/serve@sha256:{HEX_B}"
HOPPER = {"key": COMPUTE_CAPABILITY, "operator": "In", "values": ["9.0"]}
DRIVER = {"key": DRIVER_VERSION, "operator": "Gt", "values": ["525060012"]}
ARCH = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
TERMS = [{"matchExpressions": [HOPPER, DRIVER]}]
PLACEMENTS = {
    f"sha256:{HEX_A}": {"nodeSelectorTerms": TERMS},
    f"sha256:{HEX_B}": {"claimTemplate": "hopper-gpu"},
}


def rendered(cli: CliRunner, *args: str) -> list[Any]:
    r = cli("k8s", "gate", *args)
    assert r.code == 0, r.err
    return [d for d in yaml.safe_load_all(r.out) if d]


@pytest.fixture(scope="module")
def objects() -> list[Any]:
    from click.testing import CliRunner as Click

    from buildmatrix.cli import cli

    out = Click().invoke(cli, ["k8s", "gate"]).output
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def policy(objects: list[Any]) -> Any:
    (found,) = [d for d in objects if d["kind"] == "ValidatingAdmissionPolicy"]
    return found


def params(entries: dict[str, Any] = PLACEMENTS) -> Any:
    from buildmatrix.k8s_gate import placements

    return placements(entries, {})


def pod(*containers: Any, init: Any = (), terms: Any = None, claims: Any = None) -> Any:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if terms is not None:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    if claims is not None:
        spec["resourceClaims"] = claims
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def container(image: str, *, gpu: str | None = "limits", claim: str | None = None) -> Any:
    c: dict[str, Any] = {"name": f"c{abs(hash((image, gpu, claim))) % 1000}", "image": image}
    resources: dict[str, Any] = {}
    if gpu is not None:
        resources[gpu] = {"nvidia.com/gpu": "1"}
    if claim is not None:
        resources["claims"] = [{"name": claim}]
    if resources:
        c["resources"] = resources
    return c


def review(obj: Any, param: Any, operation: str = "CREATE") -> Any:
    return {
        "request": {
            "operation": operation,
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "userInfo": {"username": "alice", "extra": {}},
        },
        "object": obj,
        "oldObject": None,
        "params": param,
    }


def messages(policy: Any) -> dict[str, str]:
    from buildmatrix.k8s_gate import rules

    names = [r.name for r in rules()]
    return dict(zip(names, (v["message"] for v in policy["spec"]["validations"]), strict=True))


def test_every_object_validates_against_the_kubernetes_schemas(objects: list[Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    assert [d["kind"] for d in objects] == [
        "CustomResourceDefinition",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    for d in objects:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    crd, vap, binding = objects
    assert vap["spec"]["paramKind"] == {
        "apiVersion": f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}",
        "kind": crd["spec"]["names"]["kind"],
    }
    assert binding["spec"]["paramRef"]["parameterNotFoundAction"] == "Deny"
    assert binding["spec"]["paramRef"]["name"] == params()["metadata"]["name"]


def test_the_placements_match_the_crd_schema(objects: list[Any]) -> None:
    schema = objects[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    validate(params(), schema)
    bad = params()
    bad["spec"]["images"][f"sha256:{HEX_A}"]["nodeSelectorTerms"][0]["matchExpressions"][0][
        "operator"
    ] = "Near"
    with pytest.raises(Exception, match="Near"):
        validate(bad, schema)


def test_a_placed_pod_with_the_affinity_is_allowed(policy: Any) -> None:
    for where in ("limits", "requests"):
        assert (
            denials(policy, review(pod(container(IMAGE_A, gpu=where), terms=TERMS), params())) == []
        )
    # affinity --into ANDs the placement into each term the workload had: still allowed
    merged = [{"matchExpressions": [ARCH, HOPPER, DRIVER]}, {"matchExpressions": [HOPPER, DRIVER]}]
    assert denials(policy, review(pod(container(IMAGE_A), terms=merged), params())) == []
    # a DRA Pod using a claim made from its placement's template
    claims = [{"name": "gpu", "resourceClaimTemplateName": "hopper-gpu"}]
    ok = pod(container(IMAGE_B, gpu=None, claim="gpu"), claims=claims)
    assert denials(policy, review(ok, params())) == []


def test_pods_without_gpus_are_untouched(policy: Any) -> None:
    """Whatever their images, affinity or the placements: no nvidia.com/gpu, no claim
    from a GPU template, no denial (also with no placements at all)."""
    for image, terms, param in itertools.product(
        ("nginx:latest", IMAGE_A, "busybox@sha256:" + "c" * 64),
        (None, [], [{"matchExpressions": [ARCH]}]),
        (params(), params({})),
    ):
        plain = pod(container(image, gpu=None), init=[container("busybox", gpu=None)], terms=terms)
        assert denials(policy, review(plain, param)) == [], (image, terms)
        other = copy.deepcopy(plain)
        other["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2", "memory": "1Gi"}}
        other["spec"]["resourceClaims"] = [{"name": "x", "resourceClaimTemplateName": "fpga"}]
        assert denials(policy, review(other, param)) == [], (image, terms)


def test_each_fault_is_denied_by_exactly_its_rule(policy: Any) -> None:
    said = messages(policy)
    claims = [{"name": "gpu", "resourceClaimTemplateName": "hopper-gpu"}]
    cases = {
        "pinned": [
            pod(container("ghcr.io/org/train:v1"), terms=TERMS),
            pod(container(IMAGE_A, gpu=None), init=[container("ghcr.io/org/init:1")], terms=TERMS),
        ],
        "placed": [
            pod(container("ghcr.io/org/x@sha256:" + "c" * 64), terms=TERMS),
            # the digest must be the image's whole digest, not a prefix of one
            pod(container("ghcr.io/org/x@sha256:" + HEX_A + "0"), terms=TERMS),
        ],
        "affinity": [
            pod(container(IMAGE_A)),  # no affinity at all
            pod(container(IMAGE_A), terms=[{"matchExpressions": [HOPPER]}]),  # driver dropped
            # one term of several lacks the placement: the Pod may land there
            pod(container(IMAGE_A), terms=[*TERMS, {"matchExpressions": [ARCH]}]),
            pod(
                container(IMAGE_A),
                terms=[{"matchExpressions": [HOPPER, {**DRIVER, "values": ["1"]}]}],
            ),
            # more GPUs than the placement allows
            pod(
                container(IMAGE_A),
                terms=[{"matchExpressions": [{**HOPPER, "values": ["8.0", "9.0"]}, DRIVER]}],
            ),
            # an init container is judged like the others
            pod(container("nginx", gpu=None), init=[container(IMAGE_A, gpu="requests")]),
        ],
        "claim": [
            pod(container(IMAGE_B)),  # asks for nvidia.com/gpu, uses no claim
            pod(
                container(IMAGE_B, claim="gpu"),
                claims=[{"name": "gpu", "resourceClaimTemplateName": "a100"}],
            ),
            pod(
                container(IMAGE_B, claim="other"),
                claims=[*claims, {"name": "other", "resourceClaimName": "x"}],
            ),
        ],
    }
    for rule, pods in cases.items():
        for p in pods:
            assert denials(policy, review(p, params())) == [said[rule]], (rule, p)


def test_a_gpu_claim_makes_a_gpu_pod(policy: Any) -> None:
    """A container that asks for no nvidia.com/gpu but uses a claim made from a GPU
    template named by a placement is judged: unpinned, it is denied."""
    claims = [{"name": "gpu", "resourceClaimTemplateName": "hopper-gpu"}]
    p = pod(container("ghcr.io/org/serve:v2", gpu=None, claim="gpu"), claims=claims)
    assert denials(policy, review(p, params())) == [messages(policy)["pinned"]]


def test_updates_are_judged_too(policy: Any) -> None:
    p = pod(container("ghcr.io/org/train:v1"), terms=TERMS)
    assert denials(policy, review(p, params(), "UPDATE")) == [messages(policy)["pinned"]]


def test_placements_refuse_what_is_no_digest() -> None:
    from buildmatrix.errors import InputError
    from buildmatrix.k8s_gate import placements

    for digest in ("sha256:abc", HEX_A, "sha512:" + HEX_A, "sha256:" + "A" * 64):
        with pytest.raises(InputError, match="not an image digest"):
            placements({digest: {"nodeSelectorTerms": TERMS}}, {})
    with pytest.raises(InputError, match="nothing a Pod must require"):
        placements({f"sha256:{HEX_A}": {}}, {})


@pytest.mark.integration
def test_image_placements_are_what_affinity_prints(cli: CliRunner, tmp_path: Path) -> None:
    """``k8s gate --image`` maps the image's digest to the terms ``affinity`` prints for
    it, and a Pod that ``affinity --into`` placed passes the gate with them."""
    layout = write_oci_layout(
        tmp_path / "img", Image(layers=[{"usr/lib/libsass_ptx.so": fixture("libsass_ptx.so")}])
    )
    ref = f"oci:{layout}"
    (placed,) = rendered(cli, "--image", ref)
    objects = rendered(cli)
    # a custom resource: held to the CRD's schema, not the Kubernetes API's
    validate(placed, objects[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    (digest,) = placed["spec"]["images"]
    aff = cli("affinity", ref, "--format", "json").json()["affinity"]
    required = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert placed["spec"]["images"][digest] == {"nodeSelectorTerms": required["nodeSelectorTerms"]}
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(pod(container(f"reg.example/train@{digest}"))))
    merged = yaml.safe_load(cli("affinity", ref, "--into", str(manifest)).out)
    assert denials(objects[1], review(merged, placed)) == []
    manifest.write_text(yaml.safe_dump(pod(container(f"reg.example/train@{digest}"))))
    assert denials(objects[1], review(yaml.safe_load(manifest.read_text()), placed)) == [
        messages(objects[1])["affinity"]
    ]
    claimed = rendered(cli, "--image", ref, "--claim-template", "hopper-gpu")[0]
    assert claimed["spec"]["images"] == {digest: {"claimTemplate": "hopper-gpu"}}


def test_image_without_digest_is_refused(cli: CliRunner, tmp_path: Path) -> None:
    folder = tmp_path / "root" / "usr" / "lib"
    folder.mkdir(parents=True)
    (folder / "libsass_ptx.so").write_bytes(fixture("libsass_ptx.so"))
    r = cli("k8s", "gate", "--image", f"dir:{tmp_path / 'root'}")
    assert r.code == 2
    assert "has no digest" in r.err and "Traceback" not in r.err
    r = cli("k8s", "gate", "--claim-template", "hopper-gpu")
    assert r.code == 2 and "give --image" in r.err


def test_kyverno_policy(cli: CliRunner) -> None:
    from buildmatrix.attest import PREDICATE_TYPE

    (doc,) = rendered(
        cli,
        "--engine",
        "kyverno",
        "--kyverno-images",
        "ghcr.io/org/*",
        "--identity",
        "https://github.com/org/repo/.github/workflows/build-images.yml@refs/heads/main",
    )
    (rule,) = doc["spec"]["rules"]
    (verify,) = rule["verifyImages"]
    (attestation,) = verify["attestations"]
    assert attestation["type"] == PREDICATE_TYPE
    assert verify["verifyDigest"] is True and verify["required"] is True
    assert attestation["conditions"] == [
        {
            "all": [
                {
                    "key": "{{ verdict }}",
                    "operator": "Equals",
                    "value": "pass",
                    "message": "buildmatrix check did not pass this image",
                }
            ]
        }
    ]
    r = cli("k8s", "gate", "--engine", "kyverno")
    assert r.code == 2 and "--identity" in r.err
    r = cli("k8s", "gate", "--identity", "x")
    assert r.code == 2 and "cannot be used together" in r.err


def test_every_combination_is_denied_by_the_rules_it_breaks(policy: Any) -> None:
    """Exhaustively over one container's image (by tag, unplaced, placed by terms,
    placed by claim) x how it asks for a GPU (not, limits, requests, a claim) x
    container or init container, x the Pod's affinity (none, the placement's, a part
    of it) x its claims (none, one from the placement's template), beside a plain
    container: the denials are exactly those of the rules the Pod breaks, in order."""
    said = messages(policy)
    images = {
        "tag": "ghcr.io/org/train:v1",
        "unplaced": "ghcr.io/org/x@sha256:" + "c" * 64,
        "terms": IMAGE_A,
        "claim": IMAGE_B,
    }
    affinities = {"none": None, "placed": TERMS, "partial": [{"matchExpressions": [HOPPER]}]}
    claimed = [{"name": "gpu", "resourceClaimTemplateName": "hopper-gpu"}]
    for kind, asks, init, aff, has_claims in itertools.product(
        images, (None, "limits", "requests", "claim"), (False, True), affinities, (False, True)
    ):
        gpu = asks if asks in ("limits", "requests") else None
        c = container(images[kind], gpu=gpu, claim="gpu" if asks == "claim" else None)
        plain = container("nginx:latest", gpu=None)
        p = pod(
            *([plain] if init else [c, plain]),
            init=[c] if init else [],
            terms=affinities[aff],
            claims=claimed if has_claims else None,
        )
        uses_claim = asks == "claim" and has_claims
        is_gpu = gpu is not None or uses_claim
        broken = []
        if is_gpu:
            if kind == "tag":
                broken.append("pinned")
            elif kind == "unplaced":
                broken.append("placed")
            elif kind == "terms" and aff != "placed":
                broken.append("affinity")
            elif kind == "claim" and not uses_claim:
                broken.append("claim")
        want = [said[r] for r in broken]
        assert denials(policy, review(p, params())) == want, (kind, asks, init, aff, has_claims)
