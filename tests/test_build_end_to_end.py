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
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO, CliRunner
from tests.fixtures.build import SRC, have_nvcc

pytestmark = pytest.mark.integration

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
            out = Path(entry["context"]) / "prebuilt" / entry["family"] / "libkernels.so"
            out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [
                    "nvcc",
                    "-shared",
                    "-Xcompiler",
                    "-fPIC",
                    "-cudart",
                    "shared",
                    *entry["gencode"].split(),
                    "-o",
                    str(out),
                    str(SRC / "kernels.cu"),
                ],
                check=True,
                capture_output=True,
            )
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
        assert verdict(blackwell) == {"sm_100": "native", "sm_103": "native", "sm_120": "native"}
        # ... and not for the others; Hopper's PTX lets newer GPUs JIT it.
        assert verdict(hopper, "--family", "ampere") == {"sm_80": "none", "sm_86": "none"}
        assert verdict(ampere, "--family", "hopper") == {"sm_90": "none"}
        assert verdict(hopper, "--family", "blackwell") == {
            "sm_100": "jit",
            "sm_103": "jit",
            "sm_120": "jit",
        }
        assert cli("check", f"docker-daemon:{hopper}", "--family", "ampere").code == 1
        assert cli("check", f"docker-daemon:{blackwell}").code == 0
    finally:
        for tag in [*tags, "bmtest/cuda-base:13.0"]:
            client.images.remove(tag, force=True)
