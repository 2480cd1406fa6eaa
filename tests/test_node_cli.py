"""``smoke`` and ``labels`` from the command line: images on a node, NFD output, formats,
and ``--load-test`` through a STAND-IN ``libcuda.so.1`` (tests/standins/cuda.c)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, CliRunner
from tests.images import Image, fixture, write_docker_archive
from tests.pool_registry import FITS_HOPPER, SM80_ONLY, docker_config, push, registry_secret
from tests.services import Registry
from tests.standins import nvml_scenario, run_cli

NODES = REPO / "tests" / "fixtures" / "nodes"
BIN = REPO / "tests" / "fixtures" / "bin"
POOLS = str(NODES / "pools.yaml")


def _image(tmp_path: Path, *libs: str) -> str:
    """A root folder holding the given fixture libraries under usr/lib."""
    root = tmp_path / "rootfs"
    (root / "usr" / "lib").mkdir(parents=True, exist_ok=True)
    for lib in libs:
        shutil.copy(BIN / lib, root / "usr" / "lib" / lib)
    return f"dir:{root}"


def _smoke(cli: CliRunner, node: str, *args: str) -> tuple[int, dict[str, Any]]:
    r = cli("smoke", "--snapshot", str(NODES / f"{node}.json"), "--json", *args)
    doc: dict[str, Any] = r.json()
    return r.code, doc


def _failed(doc: dict[str, Any]) -> dict[str, str]:
    checks = doc["checks"]
    assert isinstance(checks, list)
    return {c["name"]: c["message"] for c in checks if not c["ok"]}


def test_smoke_json_contract(cli: CliRunner) -> None:
    code, doc = _smoke(cli, "h100-535", "--pools", POOLS)
    assert code == 0
    assert doc["version"] == 1
    assert doc["verdict"] == "pass"
    checks = doc["checks"]
    assert isinstance(checks, list)
    assert all(set(c) >= {"name", "ok", "message"} for c in checks)
    labels = doc["labels"]
    assert isinstance(labels, dict)
    assert labels["gpu-pool"] == "training-hopper"
    assert labels["buildmatrix.io/driver-floor"] == "525.60.13"


def test_image_that_fits_the_node_is_verified(cli: CliRunner, tmp_path: Path) -> None:
    image = _image(tmp_path, "libsass_ptx.so")  # sm_80 + sm_90 SASS, compute_90 PTX
    code, doc = _smoke(cli, "h100-580", "--image", image)
    assert code == 0, doc
    labels = doc["labels"]
    assert isinstance(labels, dict)
    assert labels["verified.buildmatrix.io/rootfs"] == "true"


def test_image_without_code_for_the_node_fails_it(cli: CliRunner, tmp_path: Path) -> None:
    image = _image(tmp_path, "libsass_sm80.so")
    code, doc = _smoke(cli, "h100-580", "--image", image, "--pools", POOLS)
    assert code == 1
    failed = _failed(doc)
    assert list(failed) == [f"image {image}"]
    assert "sm_80 SASS runs only on compute capability 8.x, not 9.0" in failed[f"image {image}"]
    assert doc["labels"] == {"buildmatrix.io/smoke": "failed"}


def test_image_ptx_too_new_for_the_driver(cli: CliRunner, tmp_path: Path) -> None:
    """compute_80 PTX of ISA 9.0 (CUDA 13.0) cannot be JIT-compiled by a 535 driver."""
    image = _image(tmp_path, "libptx_only.so")
    code, doc = _smoke(cli, "h100-535", "--image", image)
    assert code == 1
    # the node's driver reports CUDA 12.2 (nvmlSystemGetCudaDriverVersion): that decides
    assert (
        "PTX ISA 9.0 needs a driver of CUDA 13.0 or newer to JIT; the node's driver reports "
        "CUDA 12.2" in _failed(doc)[f"image {image}"]
    )
    # a CUDA 13 driver JIT-compiles it; --require-sass refuses JIT all the same
    doc13 = json.loads((NODES / "b200.json").read_text()) | {
        "driver_version": "580.65.06",
        "cuda_driver_version": "13.0",
    }
    node13 = tmp_path / "b200-580.json"
    node13.write_text(json.dumps(doc13))
    r = cli("smoke", "--snapshot", str(node13), "--image", image, "--json")
    assert r.code == 0, r.out
    r = cli("smoke", "--snapshot", str(node13), "--image", image, "--json", "--require-sass")
    assert r.code == 1
    assert "--require-sass" in _failed(r.json())[f"image {image}"]


def test_cubins_built_by_cuda_13_need_r580(cli: CliRunner, tmp_path: Path) -> None:
    """The fixtures were compiled by CUDA 13.0 (their cubins' .note.nv.tkinfo says so):
    whatever the image claims, an R535 node cannot run them."""
    image = _image(tmp_path, "libsass_ptx.so")
    code, doc = _smoke(cli, "h100-535", "--image", image)
    assert code == 1
    assert (
        "CUDA 13.0 runtime (CUDA 13.x minor version compatibility) of dir:"
        in (_failed(doc)["driver"])
    )


def test_image_runtime_floor_joins_the_driver_check(cli: CliRunner, tmp_path: Path) -> None:
    image = _image(tmp_path, "libsass_ptx.so")
    root = Path(image.removeprefix("dir:"))
    (root / "usr" / "lib" / "libcudart.so.13").write_bytes(b"\x7fELF" + b"\0" * 60)
    code, doc = _smoke(cli, "h100-535", "--image", image)
    assert code == 1
    assert (
        "CUDA 13.0 runtime (CUDA 13.x minor version compatibility) of dir:"
        in (_failed(doc)["driver"])
    )
    assert "needs driver >= 580.65.06" in _failed(doc)["driver"]


def test_image_that_cannot_be_read_fails_the_node(cli: CliRunner, tmp_path: Path) -> None:
    missing = f"oci:{tmp_path / 'nope'}"
    nfd = tmp_path / "features"
    code, doc = _smoke(cli, "h100-535", "--image", missing, "--nfd-file", str(nfd))
    assert code == 2  # bad input wins over "failed"
    assert "cannot be checked" in _failed(doc)[f"image {missing}"]
    assert "buildmatrix.io/smoke=failed" in nfd.read_text()


def test_malformed_image_reference_is_refused_before_any_work(cli: CliRunner) -> None:
    r = cli("smoke", "--snapshot", str(NODES / "h100-535.json"), "--image", "docker://")
    assert r.code == 2
    assert "buildmatrix: error:" in r.err


def test_image_label_is_a_claim_checked_against_the_node(cli: CliRunner, tmp_path: Path) -> None:
    """check --snapshot: the node's GPUs are the targets; a family label cannot replace them."""
    archive = tmp_path / "hopper.tar"
    image = Image(
        layers=[{"usr/lib/libsass_sm80.so": fixture("libsass_sm80.so")}],
        labels={"io.buildmatrix.family": "hopper"},
    )
    write_docker_archive(archive, image)  # labelled hopper, holds only sm_80 code
    r = cli("check", f"docker-archive:{archive}", "--snapshot", str(NODES / "a100-80gb.json"))
    assert r.code == 1
    assert "claims 'hopper', which does not include this GPU's family" in r.out
    assert "TARGET" in r.out and "NVIDIA A100-SXM4-80GB" in r.out
    r = cli("check", f"docker-archive:{archive}", "--snapshot", str(NODES / "h100-535.json"))
    assert r.code == 1  # the label matches the node, but the code does not
    assert "sm_80 SASS runs only on compute capability 8.x, not 9.0" in r.out


def test_nfd_file_is_written_atomically_and_replaced(cli: CliRunner, tmp_path: Path) -> None:
    nfd = tmp_path / "features.d" / "buildmatrix"
    nfd.parent.mkdir()
    code, _ = _smoke(cli, "h100-535", "--pools", POOLS, "--nfd-file", str(nfd))
    assert code == 0
    text = nfd.read_text()
    lines = text.splitlines()
    assert lines[1].startswith("# +expiry-time=")
    assert "gpu-pool=training-hopper" in lines
    assert "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in lines
    assert len(text.encode()) < 64 << 10
    assert sorted(p.name for p in nfd.parent.iterdir()) == ["buildmatrix"]  # no temp left
    code, _ = _smoke(cli, "h100-ecc", "--pools", POOLS, "--nfd-file", str(nfd))
    assert code == 1
    assert [ln for ln in nfd.read_text().splitlines() if not ln.startswith("#")] == [
        "buildmatrix.io/smoke=failed"
    ]


def test_nfd_file_in_a_missing_folder_is_bad_input(cli: CliRunner, tmp_path: Path) -> None:
    r = cli(
        "smoke",
        "--snapshot",
        str(NODES / "h100-535.json"),
        "--nfd-file",
        str(tmp_path / "no" / "gfd"),
    )
    assert r.code == 2
    assert "does not exist" in r.err


def test_snapshot_and_record_exclude_each_other(cli: CliRunner, tmp_path: Path) -> None:
    snap = str(NODES / "h100-535.json")
    r = cli("smoke", "--snapshot", snap, "--record", str(tmp_path / "x.json"))
    assert r.code == 2
    assert "exclude each other" in r.err


def test_bad_pools_file_exits_2(cli: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "pools.yaml"
    bad.write_text("families: {hoper: training}\n")
    r = cli("smoke", "--snapshot", str(NODES / "h100-535.json"), "--pools", str(bad))
    assert r.code == 2
    assert "Did you mean 'hopper'?" in r.err


def test_human_report(cli: CliRunner) -> None:
    r = cli("smoke", "--snapshot", str(NODES / "h200-535.json"))
    assert r.code == 1
    assert (
        "driver       FAIL    driver 535.104.05 is too old: hardware floor for NVIDIA H200" in r.out
    )
    assert "FAIL: the node is not admitted" in r.out


# ---------------------------------------------------------------- labels


def test_labels_formats(cli: CliRunner) -> None:
    snap = str(NODES / "l40s.json")
    r = cli("labels", "--snapshot", snap, "--pools", POOLS)
    assert r.code == 0
    labels = r.json()["labels"]
    assert labels["nvidia.com/gpu.family"] == "ada-lovelace"
    r = cli("labels", "--snapshot", snap, "--pools", POOLS, "--format", "kubectl")
    assert r.out.startswith("kubectl label node l40s-01 --overwrite ")
    assert "gpu-pool=inference-ada" in r.out
    r = cli("labels", "--snapshot", snap, "--format", "nfd")
    assert "nvidia.com/gpu.compute.minor=9" in r.out.splitlines()
    r = cli(
        "labels", "--snapshot", snap, "--pools", POOLS, "--format", "nodefeature", "--node", "n7"
    )
    obj = yaml.safe_load(r.out)
    assert obj["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1"
    assert obj["kind"] == "NodeFeature"
    assert obj["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": "n7"}
    assert obj["spec"]["labels"] == labels


def test_labels_of_a_failing_node(cli: CliRunner) -> None:
    r = cli("labels", "--snapshot", str(NODES / "h100-lost-gpu.json"))
    assert r.code == 1
    assert r.json()["labels"] == {"buildmatrix.io/smoke": "failed"}


# ---------------------------------------------------------------- --load-test


H100: dict[str, Any] = {"name": "NVIDIA H100 80GB HBM3", "cc": [9, 0], "load": "CUDA_SUCCESS"}
SMOKE_H100 = ["smoke", "--snapshot", str(NODES / "h100-580.json")]  # fixtures need R580


def _containers(lib: Path) -> int:
    """Fatbinary containers in .nv_fatbin, counted with pyelftools (an independent reader)."""
    from elftools.elf.elffile import ELFFile

    with lib.open("rb") as f:
        section = ELFFile(f).get_section_by_name(".nv_fatbin")
        assert section is not None
        data = section.data()
    count, pos = 0, 0
    while pos + 16 <= len(data):
        magic, _, hsize, size = struct.unpack_from("<IHHQ", data, pos)
        if magic != 0xBA55ED50:
            pos += 8  # padding between containers
            continue
        count += 1
        pos += hsize + size
    return count


def _load(
    libs: Path | None, tmp_path: Path, image: str, devices: list[dict[str, Any]]
) -> tuple[int, dict[str, Any]]:
    """smoke --load-test of ``image`` with the stand-in libcuda answering for ``devices``
    (``libs=None``: no libcuda at all)."""
    proc = run_cli(
        [
            "smoke",
            "--snapshot",
            str(NODES / "h100-580.json"),  # the fixtures' CUDA 13.0 cubins need R580
            "--image",
            image,
            "--load-test",
            "--json",
        ],
        libs=libs,
        tmp=tmp_path,
        cuda={"devices": devices} if libs is not None else None,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_load_test_loads_every_module_and_releases_contexts(
    standin_libs: Path, tmp_path: Path
) -> None:
    image = _image(tmp_path, "libsass_ptx.so", "libmulti.so")
    code, doc = _load(standin_libs, tmp_path, image, [H100, H100])
    assert code == 0, doc
    log = (tmp_path / "cuda.log").read_text().splitlines()
    want = _containers(BIN / "libsass_ptx.so") + _containers(BIN / "libmulti.so")
    loads = [ln for ln in log if ln.startswith("load ")]
    assert len(loads) == want  # one model, so one GPU loads each container once
    assert all(ln == "load 0 1" for ln in loads)  # device 0, a fatbinary container
    assert log.count("unload 0") == want
    assert sum(ln.startswith("retain") for ln in log) == sum(ln.startswith("release") for ln in log)
    check = next(c for c in doc["checks"] if c["name"].startswith("load-test"))
    assert check["ok"]
    assert f"{want} module(s) of 2 file(s) loaded" in check["message"]


@pytest.mark.parametrize(
    "error", ["CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"]
)
def test_load_failure_fails_the_node(standin_libs: Path, tmp_path: Path, error: str) -> None:
    image = _image(tmp_path, "libsass_ptx.so")
    code, doc = _load(standin_libs, tmp_path, image, [{**H100, "load": error}])
    assert code == 1
    failed = _failed(doc)
    name = "load-test " + image + " on NVIDIA H100 80GB HBM3 (9.0)"
    assert f"usr/lib/libsass_ptx.so (container 0): {error}" in failed[name]
    assert doc["labels"] == {"buildmatrix.io/smoke": "failed"}


def test_load_test_per_model_and_file_kinds(standin_libs: Path, tmp_path: Path) -> None:
    image = _image(tmp_path, "kernels_sm90a.cubin", "kernels_sm90a.ptx", "kernels.fatbin")
    l40s: dict[str, Any] = {"name": "NVIDIA L40S", "cc": [8, 9], "load": "CUDA_SUCCESS"}
    _, doc = _load(standin_libs, tmp_path, image, [H100, l40s])
    loads = [ln for ln in (tmp_path / "cuda.log").read_text().splitlines() if ln.startswith("load")]
    kinds = sorted({ln.split()[2] for ln in loads})
    assert kinds == ["1", "2", "3"]  # fatbin container, cubin, PTX text: each a real image
    assert {ln.split()[1] for ln in loads} == {"0", "1"}  # both models were tried
    assert [x["model"] for x in doc["load_test"]] == [
        "NVIDIA H100 80GB HBM3 (9.0)",
        "NVIDIA L40S (8.9)",
    ]


def test_load_test_without_libcuda_fails_with_the_reason(tmp_path: Path) -> None:
    image = _image(tmp_path, "libsass_ptx.so")
    code, doc = _load(None, tmp_path, image, [])
    assert code == 1
    assert "libcuda.so.1 cannot be loaded" in _failed(doc)["load-test " + image + " on this node"]


def test_load_test_reads_the_final_view_of_a_layered_image(
    standin_libs: Path, tmp_path: Path
) -> None:
    """The bytes loaded are those a container sees: a later layer's copy wins."""
    archive = tmp_path / "img.tar"
    image = Image(
        layers=[
            {"usr/lib/libops.so": fixture("libsass_sm80.so")},
            {
                "usr/lib/libops.so": fixture("libmulti.so"),
                "opt/libhopper.so": fixture("libhopper_a.so"),
            },
        ]
    )
    write_docker_archive(archive, image)
    code, doc = _load(standin_libs, tmp_path, f"docker-archive:{archive}", [H100])
    assert code == 0, doc
    loads = [ln for ln in (tmp_path / "cuda.log").read_text().splitlines() if ln.startswith("load")]
    assert len(loads) == _containers(BIN / "libmulti.so") + _containers(BIN / "libhopper_a.so")
    assert not list(Path("/tmp").glob("buildmatrix-load-*/buildmatrix-*"))  # kept bytes removed


# ---------------------------------------------------------------- the pool's images


def _pools(tmp_path: Path, images: dict[str, list[str]], name: str = "pools.yaml") -> str:
    """The fixture pools file with ``pools.<name>.images`` added."""
    data = yaml.safe_load((NODES / "pools.yaml").read_text())
    data["pools"] = {pool: {"images": refs} for pool, refs in images.items()}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _rootfs(tmp_path: Path, name: str, *libs: str) -> str:
    root = tmp_path / name / "usr" / "lib"
    root.mkdir(parents=True)
    for lib in libs:
        shutil.copy(BIN / lib, root / lib)
    return f"dir:{tmp_path / name}"


def test_smoke_checks_the_images_of_the_nodes_pool(cli: CliRunner, tmp_path: Path) -> None:
    fits = _rootfs(tmp_path, "train", "libsass_ptx.so")
    sm80 = _rootfs(tmp_path, "old", "libsass_sm80.so")
    pools = _pools(tmp_path, {"training-hopper": [fits], "training-ampere": [sm80]})
    code, doc = _smoke(cli, "h100-580", "--pools", pools)
    assert code == 0, doc
    images = [c["name"] for c in doc["checks"] if c["name"].startswith("image ")]
    assert images == [f"image {fits}"]  # the hopper pool's image, not the ampere one's
    assert doc["labels"]["verified.buildmatrix.io/train"] == "true"
    r = cli("smoke", "--snapshot", str(NODES / "h100-580.json"), "--pools", pools)
    assert f"pool     training-hopper: checks its images {fits}" in r.out
    # the same sm_80-only image in the hopper pool fails the node
    bad = _pools(tmp_path, {"training-hopper": [sm80]}, name="bad.yaml")
    code, doc = _smoke(cli, "h100-580", "--pools", bad)
    assert code == 1
    assert "sm_80 SASS runs only on compute capability 8.x" in _failed(doc)[f"image {sm80}"]
    assert doc["labels"] == {"buildmatrix.io/smoke": "failed"}


def test_given_and_pool_images_are_checked_once_each(cli: CliRunner, tmp_path: Path) -> None:
    a = _rootfs(tmp_path, "a", "libsass_ptx.so")
    b = _rootfs(tmp_path, "b", "libmulti.so")
    pools = _pools(tmp_path, {"training-hopper": [a, b]})
    code, doc = _smoke(cli, "h100-580", "--pools", pools, "--image", b)
    assert code == 0, doc
    images = [c["name"] for c in doc["checks"] if c["name"].startswith("image ")]
    assert images == [f"image {b}", f"image {a}"]


def test_an_unreadable_pool_image_fails_the_node(cli: CliRunner, tmp_path: Path) -> None:
    missing = f"oci:{tmp_path / 'gone'}"
    nfd = tmp_path / "features"
    pools = _pools(tmp_path, {"training-hopper": [missing]})
    code, doc = _smoke(cli, "h100-580", "--pools", pools, "--nfd-file", str(nfd))
    assert code == 2
    assert "cannot be checked" in _failed(doc)[f"image {missing}"]
    assert doc["labels"] == {"buildmatrix.io/smoke": "failed"}
    assert "gpu-pool" not in nfd.read_text()


def test_load_test_without_any_image_is_refused_before_any_work(
    cli: CliRunner, tmp_path: Path
) -> None:
    """No --image and no pool image anywhere: exit 2 before NVML is even opened (no
    snapshot is given, and none is needed to know there is nothing to load)."""
    for extra in ([], ["--pools", POOLS]):
        r = cli("smoke", "--load-test", *extra)
        assert r.code == 2
        assert "--load-test loads the images this node must run, and there are none" in r.err
        assert r.out == ""


def test_load_test_on_a_node_whose_pool_has_no_image_fails_it(
    cli: CliRunner, tmp_path: Path
) -> None:
    pools = _pools(tmp_path, {"training-ampere": [_rootfs(tmp_path, "a", "libsass_sm80.so")]})
    nfd = tmp_path / "features"
    code, doc = _smoke(cli, "h100-580", "--pools", pools, "--load-test", "--nfd-file", str(nfd))
    assert code == 2
    assert doc["verdict"] == "fail"
    message = _failed(doc)["load-test"]
    assert "its pool 'training-hopper' lists no images" in message
    assert doc["labels"] == {"buildmatrix.io/smoke": "failed"}
    assert "buildmatrix.io/smoke=failed" in nfd.read_text()


def test_load_test_loads_the_pools_images(standin_libs: Path, tmp_path: Path) -> None:
    image = _rootfs(tmp_path, "train", "libsass_ptx.so")
    pools = _pools(tmp_path, {"training-hopper": [image]})
    proc = run_cli(
        [*SMOKE_H100, "--pools", pools, "--load-test", "--json"],
        libs=standin_libs,
        tmp=tmp_path,
        cuda={"devices": [H100]},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    loads = [ln for ln in (tmp_path / "cuda.log").read_text().splitlines() if ln.startswith("load")]
    assert len(loads) == _containers(BIN / "libsass_ptx.so")
    assert [x["image"] for x in json.loads(proc.stdout)["load_test"]] == [image]


# ------------------------------------------- the pool's images in a registry with auth


@pytest.fixture
def private(auth_registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A fitting and an sm_80-only image in the htpasswd registry, and their pools files."""
    tmp = tmp_path_factory.mktemp("private")
    refs = {
        "fits": push(auth_registry, FITS_HOPPER, "bmtest/train:hopper", tmp),
        "sm80": push(auth_registry, SM80_ONLY, "bmtest/train:sm80", tmp),
    }
    return {
        kind: _pools(tmp, {"training-hopper": [ref]}, name=f"{kind}.yaml")
        for kind, ref in refs.items()
    } | {f"{kind}-ref": ref for kind, ref in refs.items()}


@pytest.mark.integration
@pytest.mark.parametrize("server", ["HOST", "https://HOST"])
def test_pool_images_from_a_registry_with_the_secrets_credentials(
    cli: CliRunner,
    auth_registry: Registry,
    private: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    server: str,
) -> None:
    """Credentials from the Secret kubectl writes, through $DOCKER_CONFIG: the fitting
    image passes the Hopper node on R580, the sm_80-only one fails it."""
    secret = registry_secret(auth_registry, server=server.replace("HOST", auth_registry.host))
    monkeypatch.setenv("DOCKER_CONFIG", str(docker_config(tmp_path / "cfg", secret)))
    code, doc = _smoke(cli, "h100-580", "--pools", private["fits"])
    assert code == 0, doc
    assert doc["labels"]["verified.buildmatrix.io/train"] == "true"
    assert f"image {private['fits-ref']}" in [c["name"] for c in doc["checks"]]
    code, doc = _smoke(cli, "h100-580", "--pools", private["sm80"])
    assert code == 1
    assert (
        "sm_80 SASS runs only on compute capability 8.x"
        in (_failed(doc)[f"image {private['sm80-ref']}"])
    )


@pytest.mark.integration
def test_refused_credentials_fail_the_node_with_exit_3(
    cli: CliRunner,
    auth_registry: Registry,
    private: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fail closed: a pool image that cannot be read is a failed check, never a pass,
    and the exit code says the registry refused (3)."""
    secret = registry_secret(auth_registry, password="wrong")
    monkeypatch.setenv("DOCKER_CONFIG", str(docker_config(tmp_path / "cfg", secret)))
    code, doc = _smoke(cli, "h100-580", "--pools", private["fits"])
    assert code == 3
    message = _failed(doc)[f"image {private['fits-ref']}"]
    assert f"registry {auth_registry.host} refused access" in message
    assert doc["labels"] == {"buildmatrix.io/smoke": "failed"}
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "none"))  # no credentials at all
    code, doc = _smoke(cli, "h100-580", "--pools", private["fits"])
    assert code == 3
    assert "no credentials were sent" in _failed(doc)[f"image {private['fits-ref']}"]


def _live_on(machine: str, libs: Path, tmp: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """``smoke`` reading the stand-in NVML (an H100 node on R580) in a fresh process
    whose ``platform.machine()`` answers ``machine``: the host as a Grace node sees it."""
    scenario = tmp / "nvml.json"
    scenario.write_text(
        json.dumps(nvml_scenario(json.loads((NODES / "h100-580.json").read_text())))
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NODE_NAME")}
    env |= {"LD_LIBRARY_PATH": str(libs), "NVML_STANDIN_SCENARIO": str(scenario)}
    env.pop("BUILDMATRIX_PROFILES", None)
    code = (
        "import platform, sys\n"
        f"platform.machine = lambda: {machine!r}\n"
        "from buildmatrix.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "smoke", "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_on_the_node_the_images_variant_for_its_machine_is_checked(
    standin_libs: Path, tmp_path: Path
) -> None:
    """A multi-platform image whose linux/amd64 variant fits Hopper and whose
    linux/arm64 variant holds sm_80 code only: a Grace (aarch64) node is judged by the
    arm64 variant its runtime would pull, unless --platform says otherwise."""
    from tests.test_image_sources import write_multi_platform_layout

    ref = f"oci:{write_multi_platform_layout(tmp_path)}:multi"
    code, doc = _live_on("x86_64", standin_libs, tmp_path, "--image", ref)
    assert code == 0, doc
    code, doc = _live_on("aarch64", standin_libs, tmp_path, "--image", ref)
    assert code == 1
    assert "sm_80 SASS runs only on compute capability 8.x" in _failed(doc)[f"image {ref}"]
    code, doc = _live_on(
        "aarch64", standin_libs, tmp_path, "--image", ref, "--platform", "linux/amd64"
    )
    assert code == 0, doc


def test_smoke_snapshot_of_a_node_missing_a_gpu_on_nvml_fails(cli: CliRunner) -> None:
    """7 of an HGX board's 8 GPUs under NVML, 8 on the PCI bus: the node is refused,
    the message names the missing GPU's bus id and says where to look."""
    r = cli("smoke", "--snapshot", str(NODES / "hgx-h100-7-of-8.json"), "--pools", POOLS)
    assert r.code == 1
    lines = [line for line in r.out.splitlines() if line.split()[:2] == ["gpus", "FAIL"]]
    assert len(lines) == 1
    assert (
        "the PCI bus has 8 NVIDIA GPU(s), NVML shows 7: 0000:9a:00.0 not shown by NVML"
        in (lines[0])
    )
    assert "Xid 79" in lines[0]
    assert r.out.rstrip().endswith("FAIL: the node is not admitted")


def test_smoke_snapshot_with_every_gpu_on_nvml_and_the_bus_passes(cli: CliRunner) -> None:
    code, doc = _smoke(cli, "hgx-h100-8", "--pools", POOLS, "--expect-gpus", "8")
    assert code == 0, _failed(doc)
    assert doc["labels"]["gpu-pool"] == "training-hopper"


def test_the_pool_states_the_gpu_count(cli: CliRunner, tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("families: {hopper: training-hopper}\npools: {training-hopper: {gpus: 8}}\n")
    code, doc = _smoke(cli, "h100-lost-gpu", "--pools", str(pools))
    assert code == 1
    assert (
        f"7 GPU(s) visible, 8 expected (pools.training-hopper.gpus in {pools})"
        in (_failed(doc)["gpus"])
    )
    code, doc = _smoke(cli, "h100-535", "--pools", str(pools))
    assert code == 0, _failed(doc)
    r = cli("labels", "--snapshot", str(NODES / "hgx-h100-7-of-8.json"), "--pools", str(pools))
    assert r.code == 1
    assert r.json()["labels"] == {"buildmatrix.io/smoke": "failed"}


def test_mig_strategy_option(cli: CliRunner) -> None:
    code, doc = _smoke(cli, "a100-mig-1g5gb", "--mig-strategy", "single")
    assert code == 0, _failed(doc)
    assert doc["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    code, doc = _smoke(cli, "a100-mig-1g5gb")  # GFD's default: none
    assert code == 0
    assert "nvidia.com/mig.strategy" not in doc["labels"]
    assert doc["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    r = cli("smoke", "--snapshot", str(NODES / "a100-mig-1g5gb.json"), "--mig-strategy", "all")
    assert r.code == 2


def test_image_check_on_a_mig_node_judges_the_parent_gpu(cli: CliRunner, tmp_path: Path) -> None:
    """MIG devices have no compute capability of their own (GFD's nvmlMigDevice:
    GetCudaComputeCapability not supported): an image is judged on the parent's."""
    image = _image(tmp_path, "libsass_sm80.so")
    code, doc = _smoke(cli, "a100-mig-1g5gb", "--image", image, "--mig-strategy", "single")
    assert code == 0, _failed(doc)
    assert doc["labels"]["verified.buildmatrix.io/rootfs"] == "true"
    code, doc = _smoke(cli, "h100-mig-mixed", "--image", image, "--mig-strategy", "mixed")
    assert code == 1
    assert (
        "sm_80 SASS runs only on compute capability 8.x, not 9.0" in _failed(doc)[f"image {image}"]
    )


def test_malformed_new_snapshot_keys_are_bad_input(cli: CliRunner, tmp_path: Path) -> None:
    doc = json.loads((NODES / "a100-mig-1g5gb.json").read_text())
    doc["pci_gpus"][0]["bus_id"] = "slot 3"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    r = cli("smoke", "--snapshot", str(bad))
    assert r.code == 2
    assert "pci_gpus" in r.out + r.err
    doc = json.loads((NODES / "a100-mig-1g5gb.json").read_text())
    doc["gpus"][0]["mig_devices"][0]["attributes"]["sms"] = 14
    bad.write_text(json.dumps(doc))
    r = cli("smoke", "--snapshot", str(bad))
    assert r.code == 2
    assert "mig_devices" in r.out + r.err
