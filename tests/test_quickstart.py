"""README's quickstart, run as written in a fresh clone and a fresh virtual environment.

Each line of the README's quickstart block runs in its own bash in the clone, after the
first line's ``. .venv/bin/activate`` (a reader types them in one shell). The exit code
each line must end with is read from its comment: ``# PASS`` 0, ``# FAIL`` 1, else 0.

Stand-ins, for what cannot run here: no registry can be reached, so the engine holds
stand-ins for the two ``nvidia/cuda`` base images the generated Dockerfile names. The
runtime one carries what the real one sets that ``check`` reads (``CUDA_VERSION``, the
toolkit's device variables; NVIDIA's nvidia/container-images ``cuda`` Dockerfiles,
base stage); the devel one has busybox and an ``nvcc`` that hands out the library the
real nvcc built on this machine with exactly the arguments of the Dockerfile's RUN line
(any other arguments fail the build). The README's ``docker build`` line itself runs
unchanged, with the real engine.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO, CliRunner
from tests.fixtures.build import have_nvcc
from tests.release import fresh_clone

CUDA = "13.0.0"


def quickstart() -> list[str]:
    """The lines of README's first bash block under "## Quickstart"."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None, "README's quickstart has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def _expected_code(line: str) -> int:
    comment = line.partition("  #")[2]
    return 1 if comment.strip().startswith("FAIL") else 0


def test_the_quickstart_is_short() -> None:
    lines = quickstart()
    assert len(lines) <= 8
    assert lines[0].startswith("python3 -m venv .venv && .venv/bin/pip install")
    assert sum(line.startswith("docker build") for line in lines) == 1


def test_the_readme_counts_the_dockerfiles_the_first_command_writes(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's number is generate's, on the shipped defaults, and build/ holds them."""
    said = re.search(r"regenerates the (\d+) Dockerfiles", (REPO / "README.md").read_text())
    assert said is not None
    monkeypatch.chdir(REPO)
    result = cli("generate", "--out", str(tmp_path / "build"))
    assert result.code == 0, result.err
    count = int(result.out.split()[0])
    assert int(said.group(1)) == count
    assert len(list((REPO / "build").rglob("*.Dockerfile"))) == count


def _tar(files: dict[str, bytes | str], *, links: dict[str, str]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(raw), 0o755
            tar.addfile(info, io.BytesIO(raw))
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    buf.seek(0)
    return buf


_NVCC = """#!/bin/sh
# Stand-in nvcc (tests/test_quickstart.py): the library the real nvcc built on the test
# machine with these arguments, or a failed build.
key=$(echo "$*" | md5sum | cut -c1-12)
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out="$a"
  prev="$a"
done
[ -f "/prebuilt/$key.so" ] || { echo "nvcc stand-in: no build for: $*" >&2; exit 1; }
cp "/prebuilt/$key.so" "$out"
"""


def _stand_in_bases(docker_host: str, dockerfile: Path, context: Path, work: Path) -> None:
    """nvidia/cuda:CUDA-devel-ubuntu24.04 and -runtime- stand-ins in the engine."""
    import docker

    run = next(line for line in dockerfile.read_text().splitlines() if line.startswith("RUN nvcc"))
    args = shlex.split(run.removeprefix("RUN nvcc "))
    key = hashlib.md5((" ".join(args) + "\n").encode()).hexdigest()[:12]
    out = work / f"{key}.so"
    host_args = [str(context / "hello.cu") if a == "/src/hello.cu" else a for a in args]
    host_args[host_args.index("-o") + 1] = str(out)
    subprocess.run(["nvcc", *host_args], check=True, capture_output=True)
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox (busybox-static) is needed for the devel stand-in's RUN step")
    env = (
        f"ENV CUDA_VERSION={CUDA} NVIDIA_VISIBLE_DEVICES=all "
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility PATH=/usr/local/bin:/usr/bin:/bin\n"
    )
    client = docker.DockerClient(base_url=docker_host)
    tools = ["sh", "md5sum", "cut", "cp", "echo", "mkdir"]
    devel = _tar(
        {
            "Dockerfile": f"FROM scratch\nCOPY . /\n{env}",
            "bin/busybox": Path(busybox).read_bytes(),
            "usr/local/bin/nvcc": _NVCC,
            f"prebuilt/{key}.so": out.read_bytes(),
        },
        links={f"bin/{t}": "busybox" for t in tools},
    )
    client.images.build(
        fileobj=devel, custom_context=True, tag=f"nvidia/cuda:{CUDA}-devel-ubuntu24.04", rm=True
    )
    runtime = _tar({"Dockerfile": f"FROM scratch\n{env}"}, links={})
    client.images.build(
        fileobj=runtime, custom_context=True, tag=f"nvidia/cuda:{CUDA}-runtime-ubuntu24.04", rm=True
    )


@pytest.mark.integration
@pytest.mark.index  # pip install . in a fresh virtual environment
@pytest.mark.nvcc
def test_the_quickstart_runs_as_written(docker_host: str, tmp_path: Path) -> None:
    if not have_nvcc() or shutil.which("docker") is None:
        pytest.skip("nvcc and the docker CLI are needed")
    clone = fresh_clone(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"DOCKER_HOST": docker_host, "DOCKER_BUILDKIT": "0", "BUILDMATRIX_PROFILES": ""}
    outputs: list[str] = []
    for n, line in enumerate(quickstart()):
        if line.startswith("docker build"):
            generated = clone / shlex.split(line)[shlex.split(line).index("-f") + 1]
            _stand_in_bases(docker_host, generated, clone / shlex.split(line)[-1], tmp_path)
        script = line if n == 0 else f". .venv/bin/activate && {line}"
        proc = subprocess.run(
            ["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, check=False
        )
        said = proc.stdout + proc.stderr
        assert proc.returncode == _expected_code(line), f"{line}\n{said}"
        assert "Traceback" not in said
        outputs.append(proc.stdout)
    generate, _build, passed, failed, affinity = outputs[1:]
    assert generate.startswith("2 Dockerfiles in quickstart: 2 written")
    assert "PASS" in passed and "hopper  sm_90  native   ok" in passed
    assert "FAIL" in failed and "sm_80" in failed
    assert "nodeAffinity" in affinity and "driver" in affinity
