"""End to end: buildmatrix's own image, built from the repository's Dockerfile on the
local engine, admitting nodes through the API stand-in, and a Job placed by
``affinity`` that only the admitted Hopper node can take.

The base is a STAND-IN for python:3.11-slim assembled from this machine's Python
(tests/pybase.py): nothing can be pulled here. The API server is the stand-in of
tests/kube_standin.py, reached over the host network.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, CliRunner
from tests.images import Image, fixture, write_docker_archive
from tests.kube_standin import ApiStandIn
from tests.pod_standin import one_round
from tests.scheduling import affinity_matches

pytestmark = pytest.mark.integration

NODES = REPO / "tests" / "fixtures" / "nodes"
TAG = "bmtest/buildmatrix:e2e"
BASE = "bmtest/python:3.11-slim"
ADMISSION = {"key": "buildmatrix.io/unverified", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build context: the Dockerfile, and dist/ with the wheels of buildmatrix-gpu
    and every dependency, as ci.yml's image job makes it."""
    context = tmp_path_factory.mktemp("tool-image")
    wheels = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(context / "dist"), str(REPO)],
        capture_output=True,
        text=True,
        check=False,
    )
    if wheels.returncode != 0:
        pytest.skip(f"the wheels cannot be built here: {wheels.stderr.strip()[-300:]}")
    shutil.copy(REPO / "Dockerfile", context / "Dockerfile")
    return context


@pytest.fixture(scope="module")
def engine(overlay2_host: str, context: Path) -> Iterator[Any]:
    import docker

    from tests import pybase

    # the overlay2 engine: containers start from the image's layers, not from copies
    client = docker.DockerClient(base_url=overlay2_host)
    pybase.build(client, BASE)
    client.images.build(path=str(context), tag=TAG, buildargs={"PYTHON_BASE": BASE}, rm=True)
    try:
        yield client
    finally:
        for tag in (TAG, BASE):
            client.images.remove(tag, force=True)


def _run(client: Any, args: list[str], **kw: Any) -> tuple[int, str]:
    container = client.containers.run(TAG, args, detach=True, network_mode="host", **kw)
    try:
        code = container.wait(timeout=120)["StatusCode"]
        return code, container.logs().decode()
    finally:
        container.remove(force=True)


def test_the_image_runs_buildmatrix_as_non_root(engine: Any, context: Path) -> None:
    from packaging.utils import parse_wheel_filename

    (wheel,) = (context / "dist").glob("buildmatrix_gpu-*.whl")
    code, out = _run(engine, ["--version"])
    assert code == 0
    assert out == f"buildmatrix, version {parse_wheel_filename(wheel.name)[1]}\n"
    assert engine.images.get(TAG).attrs["Config"]["User"] == "65532:65532"
    code, out = _run(
        engine,
        ["labels", "--snapshot", "/nodes/h100-535.json"],
        volumes={str(NODES): {"bind": "/nodes", "mode": "ro"}},
    )
    assert code == 0, out
    assert json.loads(out)["labels"]["nvidia.com/gpu.family"] == "hopper"


def test_admission_end_to_end(engine: Any, cli: CliRunner, tmp_path: Path) -> None:
    standin = ApiStandIn(tokens={"smoke": {"get", "patch"}})
    for name in ("gpu-1", "gpu-2", "gpu-3"):  # nodes join with the admission taint set
        # and the kubelet's own kubernetes.io/arch (x86 hosts), which affinity may read
        standin.add_node(
            name, labels={"kubernetes.io/arch": "amd64"}, taints=[ADMISSION, GPU_TAINT]
        )
    server, url = standin.serve()
    try:
        kube = tmp_path / "kube"
        kube.mkdir()
        standin.kubeconfig(kube / "config", url, "smoke")
        r = cli(
            "k8s",
            "manifests",
            "--image",
            TAG,
            "--pools",
            str(NODES / "pools.yaml"),
            "--example-job",
        )
        assert r.code == 0, r.err
        docs = {d["kind"]: d for d in yaml.safe_load_all(r.out)}
        (kube / "pools.yaml").write_text(docs["ConfigMap"]["data"]["pools.yaml"])
        pod = docs["DaemonSet"]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["image"] == TAG
        mounts = {
            str(kube): {"bind": "/etc/buildmatrix", "mode": "ro"},
            str(NODES): {"bind": "/nodes", "mode": "ro"},
        }
        env = {"KUBECONFIG": "/etc/buildmatrix/config"}
        # the DaemonSet's own command, one round: no GPU here, so NVML is missing and the
        # node must stay tainted, marked failed, with the reason
        script = container["command"][-1]
        once = one_round(script)
        code, out = _run(
            engine,
            [],
            entrypoint=["/bin/sh", "-c", once],
            environment={**env, "NODE_NAME": "gpu-2"},
            volumes=mounts,
        )
        assert code == 3, out
        gpu2 = standin.nodes["gpu-2"]
        assert gpu2["spec"]["taints"] == [ADMISSION, GPU_TAINT]
        assert gpu2["metadata"]["labels"] == {
            "kubernetes.io/arch": "amd64",  # the kubelet's, kept
            "buildmatrix.io/smoke": "failed",
        }
        assert "NVML" in gpu2["metadata"]["annotations"]["buildmatrix.io/smoke-report"]
        # the same command on recorded GPU nodes: an H100 node on R580 (the CUDA 13.0 code
        # of the Job's image needs it; on R535 check --snapshot fails it) and an A100 node
        for node, snapshot in (("gpu-1", "h100-580"), ("gpu-3", "a100-80gb")):
            code, out = _run(
                engine,
                [],
                entrypoint=[
                    "/bin/sh",
                    "-c",
                    one_round(script, append=f"--snapshot /nodes/{snapshot}.json"),
                ],
                environment={**env, "NODE_NAME": node},
                volumes=mounts,
            )
            assert code == 0, out
            assert standin.nodes[node]["spec"]["taints"] == [GPU_TAINT]
        assert standin.nodes["gpu-1"]["metadata"]["labels"]["gpu-pool"] == "training-hopper"
        # a Job for an FP8 image with Hopper code only, placed by affinity: only the
        # admitted Hopper node can take it
        archive = write_docker_archive(
            tmp_path / "train.tar",
            Image(layers=[{"usr/lib/libhopper_a.so": fixture("libhopper_a.so")}]),
        )
        job_file = tmp_path / "job.yaml"
        job_file.write_text(yaml.safe_dump(docs["Job"]))
        r = cli(
            "affinity",
            f"docker-archive:{archive}",
            "--require",
            "fp8",
            "--min-memory",
            "70000",
            "--into",
            str(job_file),
        )
        assert r.code == 0, r.err
        job = yaml.safe_load(r.out)
        spec = job["spec"]["template"]["spec"]
        assert _schedulable(spec, standin) == ["gpu-1"]
        # the example Job as shipped (any FP8 GPU with 70000 MiB) could take gpu-1 too,
        # never the failed or the A100 node
        assert _schedulable(docs["Job"]["spec"]["template"]["spec"], standin) == ["gpu-1"]
    finally:
        server.shutdown()


def _schedulable(pod: dict[str, Any], standin: ApiStandIn) -> list[str]:
    """Nodes the scheduler could bind the pod to: its required node affinity matches
    and every NoSchedule taint is tolerated (a GPU request is given the toleration for
    nvidia.com/gpu by the ExtendedResourceToleration admission plugin)."""
    tolerated = {t["key"] for t in pod.get("tolerations", [])} | {"nvidia.com/gpu"}
    return sorted(
        name
        for name, node in standin.nodes.items()
        if affinity_matches(pod["affinity"], node["metadata"]["labels"])
        and all(
            t["key"] in tolerated
            for t in node["spec"]["taints"]
            if t["effect"] in ("NoSchedule", "NoExecute")
        )
    )
