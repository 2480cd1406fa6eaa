"""Day 2, a registry outage (node/hold.py): an admitted node stays admitted while its
pool image's source is unavailable, for ``--source-grace`` at most.

The admission DaemonSet's own command, as ``k8s manifests --source-grace`` renders it,
runs whole in the kubelet stand-in (tests/pod_standin.py, ``run_loop``), against the
STAND-IN NVML library (tests/standins/nvml.c: the recorded H100 node on R580) and
the STAND-IN API server (tests/kube_standin.py, with the rendered admission policy on
every PATCH). The registry is the real ``docker-registry`` (tests/services.py),
started here and stopped between two rounds of the loop, as an outage does.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmatrix.labelkeys import REPORT_ANNOTATION, SMOKE, UNAVAILABLE_ANNOTATION
from buildmatrix.node.hold import Transient, keep_admitted
from tests.conftest import REPO, CliRunner
from tests.kube_standin import ApiStandIn
from tests.pod_standin import Loop, run_loop
from tests.pool_registry import FITS_HOPPER, SM80_ONLY, push
from tests.services import Registry, start_registry
from tests.standins import nvml_scenario
from tests.test_kube_apply import ADMISSION, standin_with_nodes

pytestmark = pytest.mark.integration  # a real registry, images pushed by skopeo

NODES = REPO / "tests" / "fixtures" / "nodes"
H100_R580 = nvml_scenario(json.loads((NODES / "h100-580.json").read_text()))
ECC = nvml_scenario(json.loads((NODES / "h100-ecc.json").read_text()))
# seconds: k8s manifests --source-grace, short enough to see it pass, long enough for
# two rounds within it on a loaded 2-core machine (a round takes 2 to 6 s there)
GRACE = 20


@pytest.fixture
def outage_registry(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Registry]]:
    """A registry of this test's own, which the test stops."""
    root = tmp_path / "registry-root"
    root.mkdir()
    proc, host = start_registry(root)
    try:
        yield proc, Registry(host)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ApiStandIn, Path]]:
    standin = standin_with_nodes()
    server, url = standin.serve()
    try:
        yield standin, standin.kubeconfig(tmp_path / "kubeconfig", url, "smoke")
    finally:
        server.shutdown()
        server.server_close()


def _loop(
    cli: CliRunner,
    cluster: tuple[ApiStandIn, Path],
    libs: Path,
    root: Path,
    images: list[str],
    scenario: dict[str, Any],
    between: list[str],
) -> Loop:
    """The rendered DaemonSet (the hopper pool's images ``images``, --source-grace
    GRACE), one container of it, the stand-in NVML answering ``scenario``."""
    pools = root / "pools.yaml"
    root.mkdir(parents=True)
    pools.write_text(
        yaml.safe_dump(
            {
                "families": {"hopper": "training-hopper"},
                "pools": {"training-hopper": {"images": images}},
            }
        )
    )
    r = cli("k8s", "manifests", "--pools", str(pools), "--source-grace", str(GRACE))
    assert r.code == 0, r.err
    objects = {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(r.out)}
    (root / "nvml.json").write_text(json.dumps(scenario))
    _, kubeconfig = cluster
    return run_loop(
        objects["DaemonSet/buildmatrix-smoke"],
        objects=objects,
        node="gpu-1",
        root=root / "pod",
        kubeconfig=kubeconfig,
        between=between,
        host_env={
            "LD_LIBRARY_PATH": str(libs),
            "NVML_STANDIN_SCENARIO": str(root / "nvml.json"),
        },
    )


def _state(standin: ApiStandIn) -> tuple[bool, str, dict[str, str]]:
    node = standin.nodes["gpu-1"]
    admitted = (
        ADMISSION not in node["spec"]["taints"]
        and node["metadata"]["labels"].get(SMOKE) == "passed"
    )
    annotations = node["metadata"]["annotations"]
    return admitted, annotations.get(REPORT_ANNOTATION, ""), annotations


def test_an_admitted_node_outlives_a_registry_outage_for_the_grace(
    cli: CliRunner,
    cluster: tuple[ApiStandIn, Path],
    standin_libs: Path,
    outage_registry: tuple[subprocess.Popen[bytes], Registry],
    tmp_path: Path,
) -> None:
    """Round 1 reads the pool image and admits; the registry is stopped; round 2
    cannot read it (exit 3) and keeps the node admitted, saying so and since when;
    round 3, after the grace, fails the node as any failure does."""
    standin, _ = cluster
    proc, registry = outage_registry
    image = push(registry, FITS_HOPPER, "bmtest/pool:hopper", tmp_path)
    loop = _loop(
        cli,
        cluster,
        standin_libs,
        tmp_path / "run",
        [image],
        H100_R580,
        between=[
            f"kill {proc.pid}",  # the outage begins after round 1
            f"/bin/sleep {GRACE + 1}",  # the outage outlasts the grace
        ],
    )
    assert not loop.ended_by_itself
    assert loop.rounds == 3
    admitted, report, annotations = _state(standin)
    assert not admitted, report  # round 3: past the grace
    assert f"longer than --source-grace {GRACE} s" in report
    assert f"image {image}: cannot be checked" in report
    assert UNAVAILABLE_ANNOTATION not in annotations  # the node failed: no outage kept
    out = loop.proc.stdout
    assert out.count("kept admitted until") == 1, out  # round 2
    assert "admission taint added" in out


def test_the_outage_is_said_and_kept_once(
    cli: CliRunner,
    cluster: tuple[ApiStandIn, Path],
    standin_libs: Path,
    outage_registry: tuple[subprocess.Popen[bytes], Registry],
    tmp_path: Path,
) -> None:
    """Within the grace: the taint stays off, the labels stay, and the report and the
    outage's start are written once (round 3 changes nothing)."""
    standin, _ = cluster
    proc, registry = outage_registry
    image = push(registry, FITS_HOPPER, "bmtest/pool:hopper", tmp_path)
    loop = _loop(
        cli,
        cluster,
        standin_libs,
        tmp_path / "run",
        [image],
        H100_R580,
        between=[f"kill {proc.pid}", ""],
    )
    assert loop.rounds == 3
    admitted, report, annotations = _state(standin)
    assert admitted, report
    assert report.startswith("kept admitted until ")
    assert f"--source-grace {GRACE} s from {annotations[UNAVAILABLE_ANNOTATION]}" in report
    since = datetime.strptime(annotations[UNAVAILABLE_ANNOTATION], "%Y-%m-%dT%H:%M:%SZ")
    assert abs((datetime.now(UTC).replace(tzinfo=None) - since).total_seconds()) < 120
    labels = standin.nodes["gpu-1"]["metadata"]["labels"]
    assert labels["gpu-pool"] == "training-hopper"
    assert labels["verified.buildmatrix.io/train"] == "true"
    patches = [r for r in standin.requests if r[0] == "PATCH"]
    assert len(patches) == 2  # round 1 admits, round 2 writes the report; round 3 nothing
    assert loop.proc.stdout.count("kept admitted until") == 2


def test_a_node_that_never_passed_stays_tainted(
    cli: CliRunner,
    cluster: tuple[ApiStandIn, Path],
    standin_libs: Path,
    outage_registry: tuple[subprocess.Popen[bytes], Registry],
    tmp_path: Path,
) -> None:
    standin, _ = cluster
    proc, registry = outage_registry
    image = push(registry, FITS_HOPPER, "bmtest/pool:hopper", tmp_path)
    proc.terminate()
    proc.wait(timeout=30)
    _loop(cli, cluster, standin_libs, tmp_path / "run", [image], H100_R580, between=[])
    admitted, report, annotations = _state(standin)
    assert not admitted
    assert f"image {image}: cannot be checked" in report
    assert UNAVAILABLE_ANNOTATION not in annotations


def test_a_real_failure_during_an_outage_still_fails(
    cli: CliRunner,
    cluster: tuple[ApiStandIn, Path],
    standin_libs: Path,
    outage_registry: tuple[subprocess.Popen[bytes], Registry],
    tmp_path: Path,
) -> None:
    """An image that runs nowhere on the node fails it at once, however its registry
    answers; and a GPU that degrades while the registry is down fails it too."""
    standin, _ = cluster
    proc, registry = outage_registry
    fits = push(registry, FITS_HOPPER, "bmtest/pool:hopper", tmp_path)
    sm80 = push(registry, SM80_ONLY, "bmtest/pool:sm80", tmp_path)
    _loop(cli, cluster, standin_libs, tmp_path / "fits", [fits], H100_R580, between=[])
    assert _state(standin)[0]
    _loop(cli, cluster, standin_libs, tmp_path / "sm80", [sm80], H100_R580, between=[])
    admitted, report, _ = _state(standin)
    assert not admitted
    assert "sm_80 SASS runs only on compute capability 8.x" in report
    _loop(cli, cluster, standin_libs, tmp_path / "again", [fits], H100_R580, between=[])
    assert _state(standin)[0]
    proc.terminate()
    proc.wait(timeout=30)
    _loop(cli, cluster, standin_libs, tmp_path / "ecc", [fits], ECC, between=[])
    admitted, report, _ = _state(standin)
    assert not admitted
    assert "uncorrected ECC error(s)" in report


@pytest.mark.parametrize("offset", [0, 3599, 3600, 3601])
def test_the_grace_is_counted_from_the_outages_first_round(offset: int) -> None:
    """The rule itself (pure): kept through since + grace, failed after it; an
    unreadable start is taken as now."""
    since = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)
    stamp = {UNAVAILABLE_ANNOTATION: "2026-12-07T12:00:00Z"}
    now = since + timedelta(seconds=offset)
    kept = keep_admitted(stamp, Transient(why="x", grace=3600), now)
    assert isinstance(kept, str) == (offset > 3600)
    fresh = keep_admitted({UNAVAILABLE_ANNOTATION: "garbage"}, Transient(why="x", grace=0), now)
    assert not isinstance(fresh, str)


def test_in_nfd_mode_the_feature_file_keeps_the_admission(
    cli: CliRunner,
    outage_registry: tuple[subprocess.Popen[bytes], Registry],
    tmp_path: Path,
) -> None:
    """--nfd-file (k8s manifests --mode nfd): the file an earlier round wrote says the
    node passed, so a round that cannot read the pool image writes its labels again,
    with why and since when as comments (NFD reads neither), for the grace; then the
    failure; a node whose file never said passed gets the failure at once."""
    proc, registry = outage_registry
    image = push(registry, FITS_HOPPER, "bmtest/pool:hopper", tmp_path)
    features = tmp_path / "features.d" / "buildmatrix"
    features.parent.mkdir()
    never = tmp_path / "features.d" / "never"
    run = ("smoke", "--snapshot", str(NODES / "h100-580.json"), "--image", image)

    def round_(path: Path, grace: int) -> tuple[int, Any]:
        r = cli(*run, "--nfd-file", str(path), "--source-grace", str(grace), "--json")
        return r.code, r.json()

    code, _ = round_(features, GRACE)
    assert code == 0
    assert "buildmatrix.io/smoke=passed" in features.read_text()
    proc.terminate()
    proc.wait(timeout=30)
    code, doc = round_(features, GRACE)
    assert code == 3
    assert doc["verdict"] == "fail"
    assert doc["held"].startswith("kept admitted until ")
    text = features.read_text()
    assert "buildmatrix.io/smoke=passed" in text
    assert "\n# buildmatrix.io/smoke-unavailable-since=" in text
    assert not any(ln.startswith("# +") for ln in text.splitlines()[2:])  # no directive
    code, doc = round_(never, GRACE)
    assert code == 3
    assert "held" not in doc
    assert "buildmatrix.io/smoke=failed" in never.read_text()
    time.sleep(2)
    code, doc = round_(features, 1)  # a grace of 1 s has passed since that round
    assert code == 3
    assert "held" not in doc
    text = features.read_text()
    assert "buildmatrix.io/smoke=failed" in text
    assert "unavailable-since" not in text


def test_a_round_that_passes_again_ends_the_outage() -> None:
    """The registry back: the pass removes the report and the outage's start (pure:
    node/patch.py plan over a node kept admitted)."""
    from buildmatrix.labelkeys import GfdKeys
    from buildmatrix.node.apply import plan

    kept = {
        "metadata": {
            "name": "gpu-1",
            "labels": {SMOKE: "passed", "gpu-pool": "training-hopper"},
            "annotations": {
                REPORT_ANNOTATION: "kept admitted until ...",
                UNAVAILABLE_ANNOTATION: "x",
            },
            "resourceVersion": "9",
        },
        "spec": {"taints": []},
    }
    labels = {SMOKE: "passed", "gpu-pool": "training-hopper"}
    body, applied = plan(kept, passed=True, labels=labels, report="", gfd_keys=GfdKeys.NEVER)
    assert body == {
        "metadata": {"annotations": {UNAVAILABLE_ANNOTATION: None, REPORT_ANNOTATION: None}}
    }
    assert applied.held is None


def test_the_policy_allows_what_a_kept_node_is_sent(cli: CliRunner) -> None:
    """The rendered admission policy (cel-python, tests/admission_policy.py) allows the
    patch that keeps an admitted node admitted and writes the outage's start, and still
    refuses any other annotation."""
    import copy

    from buildmatrix.labelkeys import GfdKeys
    from buildmatrix.node.apply import plan
    from tests.admission_policy import UserInfo, denials, request
    from tests.kube_standin import apply_patch

    r = cli("k8s", "manifests")
    (policy,) = [d for d in yaml.safe_load_all(r.out) if d["kind"] == "ValidatingAdmissionPolicy"]
    agent = UserInfo(
        "system:serviceaccount:buildmatrix:buildmatrix-smoke",
        {"authentication.kubernetes.io/node-name": ["gpu-1"]},
    )
    admitted = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-1",
            "labels": {SMOKE: "passed", "gpu-pool": "training-hopper"},
            "annotations": {},
            "resourceVersion": "9",
        },
        "spec": {"taints": []},
        "status": {},
    }
    body, applied = plan(
        admitted,
        passed=False,
        labels={SMOKE: "failed"},
        report="image x: cannot be checked",
        gfd_keys=GfdKeys.AUTO,
        transient=Transient(why="image x: cannot be checked", grace=60),
    )
    assert applied.held is not None
    new = apply_patch(admitted, body, "application/strategic-merge-patch+json")
    assert UNAVAILABLE_ANNOTATION in new["metadata"]["annotations"]
    assert denials(policy, request(agent, admitted, new)) == []
    other = copy.deepcopy(new)
    other["metadata"]["annotations"]["buildmatrix.io/other"] = "x"
    assert denials(policy, request(agent, admitted, other))
