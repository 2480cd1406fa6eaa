"""End to end: matrix -> generate -> docker build every variant -> check each image.

The variants' device code is compiled by nvcc with the gencode flags that
``buildmatrix matrix --format json`` hands out, built into images by the real
engine from the generated Dockerfiles, and then judged by ``check`` from the
binaries alone.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, CliRunner
from tests.fixtures.build import have_nvcc, shared_library_command

pytestmark = [pytest.mark.integration, pytest.mark.nvcc]

SPEC = REPO / "tests" / "fixtures" / "images" / "e2e-kernels"


def _base_image(client: object) -> None:
    """bmtest/cuda-base:13.0, what the template's FROM names: an empty layer."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        data = b"FROM scratch\nLABEL org.opencontainers.image.title=cuda-base\n"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    client.images.build(fileobj=buf, custom_context=True, tag="bmtest/cuda-base:13.0", rm=True)  # type: ignore[attr-defined]


def _compile(entry: dict[str, str]) -> None:
    """The variant's device code, built with the gencode flags the matrix gives."""
    out = Path(entry["context"]) / "prebuilt" / entry["family"] / "libkernels.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = shared_library_command(entry["gencode"].split(), out)
    subprocess.run(command, check=True, capture_output=True)


def test_every_variant_builds_and_checks(
    docker_host: str, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not have_nvcc():
        pytest.skip("nvcc is needed to compile the variants' device code")
    import docker

    monkeypatch.setenv("DOCKER_HOST", docker_host)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(SPEC, tmp_path / "images" / "e2e-kernels")
    result = cli("matrix", "--format", "json")
    assert result.code == 0, result.err
    entries = result.json()["entries"]
    assert [e["family"] for e in entries] == ["ampere", "hopper", "blackwell"]
    assert cli("generate").code == 0

    client = docker.DockerClient(base_url=docker_host)
    _base_image(client)
    tags = []
    try:
        for entry in entries:
            _compile(entry)
            client.images.build(
                path=entry["context"],
                rm=True,
                tag=entry["tags"][0],
                dockerfile=str(Path(entry["dockerfile"]).resolve()),
            )
            tags.append(entry["tags"][0])
            env = client.images.get(entry["tags"][0]).attrs["Config"]["Env"]
            assert f"NVIDIA_REQUIRE_ARCH={entry['nvidia_require_arch']}" in env

        def verdict(tag: str, *flags: str) -> dict[str, str]:
            r = cli("check", f"docker-daemon:{tag}", "--json", *flags)
            assert r.code in (0, 1), r.err
            return {t["sm"]: t["verdict"] for t in r.json()["targets"]}

        ampere, hopper, blackwell = tags
        # Each variant passes for the family its label names ...
        assert verdict(ampere) == {"sm_80": "native", "sm_86": "native"}
        assert verdict(hopper) == {"sm_90": "native"}
        assert verdict(blackwell) == {
            "sm_100": "native",
            "sm_103": "native",
            "sm_120": "native",
            "sm_121": "native",
        }
        # ... and not for the others; Hopper's PTX lets newer GPUs JIT it.
        assert verdict(hopper, "--family", "ampere") == {"sm_80": "none", "sm_86": "none"}
        assert verdict(ampere, "--family", "hopper") == {"sm_90": "none"}
        assert verdict(hopper, "--family", "blackwell") == {
            "sm_100": "jit",
            "sm_103": "jit",
            "sm_120": "jit",
            "sm_121": "jit",
        }
        assert cli("check", f"docker-daemon:{hopper}", "--family", "ampere").code == 1
        assert cli("check", f"docker-daemon:{blackwell}").code == 0
    finally:
        for tag in [*tags, "bmtest/cuda-base:13.0"]:
            client.images.remove(tag, force=True)


RUNTIME_WHEEL = "nvidia-cuda-runtime==13.0.96"


def _cudart(folder: Path) -> Path:
    """libcudart.so.13 from NVIDIA's runtime wheel (the file a CUDA base image holds)."""
    wheels = folder / "wheels"
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "-d",
            str(wheels),
            RUNTIME_WHEEL,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if got.returncode != 0:
        pytest.skip(f"{RUNTIME_WHEEL} cannot be downloaded here: {got.stderr.strip()[-200:]}")
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        (member,) = [n for n in z.namelist() if n.endswith("/libcudart.so.13")]
        out = folder / "libcudart.so.13"
        out.write_bytes(z.read(member))
    return out


@pytest.mark.index  # NVIDIA's runtime wheel
def test_a_variant_on_a_cuda_runtime_base_needs_its_driver(
    docker_host: str, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hopper variant on a base image that carries the real CUDA 13.0 runtime
    (libcudart from NVIDIA's wheel, CUDA_VERSION as NVIDIA's images set it): check
    reads the runtime from the image and holds the driver to R580 (13.x minor-version
    compatibility), one patch level below fails, and the constraint baked into the
    image says the same floor."""
    if not have_nvcc():
        pytest.skip("nvcc is needed to compile the variants' device code")
    import docker

    monkeypatch.setenv("DOCKER_HOST", docker_host)
    monkeypatch.chdir(tmp_path)
    base_context = tmp_path / "base"
    base_context.mkdir()
    _cudart(base_context)
    (base_context / "Dockerfile").write_text(
        "FROM scratch\nCOPY libcudart.so.13 /usr/local/cuda/lib64/libcudart.so.13\n"
        "ENV CUDA_VERSION=13.0.96\n"
    )
    shutil.copytree(SPEC, tmp_path / "images" / "e2e-kernels")
    entries = cli("matrix", "--format", "json").json()["entries"]
    (hopper,) = [e for e in entries if e["family"] == "hopper"]
    assert "driver>=580.65.06" in hopper["nvidia_require_arch"]
    assert cli("generate").code == 0
    _compile(hopper)

    client = docker.DockerClient(base_url=docker_host)
    tag = hopper["tags"][0]
    try:
        client.images.build(path=str(base_context), tag="bmtest/cuda-base:13.0", rm=True)
        client.images.build(
            path=hopper["context"],
            rm=True,
            tag=tag,
            dockerfile=str(Path(hopper["dockerfile"]).resolve()),
        )

        def check(driver: str) -> tuple[int, dict[str, object]]:
            r = cli("check", f"docker-daemon:{tag}", "--driver", driver, "--json")
            assert r.code in (0, 1), r.err
            return r.code, r.json()

        code, doc = check("575.57.08")  # R575: CUDA 12.9's driver
        assert code == 1
        assert doc["cuda_runtime"]["version"] == "13.0"  # type: ignore[index]
        assert [t["driver_ok"] for t in doc["targets"]] == [False]  # type: ignore[attr-defined]
        problems: list[str] = doc["problems"]  # type: ignore[assignment]
        assert any("needs driver >= 580.65.06" in p for p in problems), problems
        # and the constraint generate baked in refuses the container at start, as the
        # toolkit's legacy hook would
        assert any("unsatisfied condition: arch>=9.0,driver>=580.65.06" in p for p in problems)
        assert check("580.65.05")[0] == 1
        code, doc = check("580.65.06")
        assert code == 0, doc["problems"]
        assert [(t["verdict"], t["driver_ok"]) for t in doc["targets"]] == [("native", True)]  # type: ignore[attr-defined]
    finally:
        for name in (tag, "bmtest/cuda-base:13.0"):
            client.images.remove(name, force=True)
