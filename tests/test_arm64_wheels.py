"""The tool's image also runs on arm64 (Grace: GH200, GB200, GB300, GB10): every runtime
dependency, resolved, has a wheel for linux/aarch64 at the image's Python, or a pure
Python one.

The image installs from wheels only (Dockerfile: ``pip install --no-index --find-links``),
so a dependency without such a wheel would make the arm64 build fail in CI. pip resolves
the dependencies of pyproject.toml for the target (``--platform``, ``--python-version``,
``--implementation``, ``--only-binary=:all:``) with ``--dry-run``, reading the package
index, so the test needs the index and skips with the reason where it is unreachable.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from tests.conftest import REPO

# python:3.11-slim is Debian 12 (glibc 2.36): manylinux_2_17 (manylinux2014) up to
# manylinux_2_36 wheels install there (PEP 600).
GLIBC_MINOR = range(17, 37)
_UNREACHABLE = (
    "Could not fetch URL",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Max retries exceeded",
    "Read timed out",
)


def image_python() -> str:
    """X.Y of the Dockerfile's default base image (ARG PYTHON_BASE=python:X.Y-...)."""
    text = (REPO / "Dockerfile").read_text()
    match = re.search(r"^ARG PYTHON_BASE=python:(\d+\.\d+)\b", text, re.MULTILINE)
    assert match, "the Dockerfile no longer says ARG PYTHON_BASE=python:X.Y-..."
    return match.group(1)


def runtime_dependencies() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps: list[str] = project["dependencies"]
    return deps


def test_the_image_python_is_read_from_the_dockerfile() -> None:
    assert re.fullmatch(r"3\.\d+", image_python())


@pytest.mark.integration
@pytest.mark.index
def test_every_runtime_dependency_has_an_aarch64_wheel(tmp_path: Path) -> None:
    python = image_python()
    platforms = [a for m in GLIBC_MINOR for a in ("--platform", f"manylinux_2_{m}_aarch64")]
    report = tmp_path / "report.json"
    deps = runtime_dependencies()
    cmd = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
        "--target", str(tmp_path / "target"), "--report", str(report),
        "--only-binary=:all:", *platforms, "--python-version", python,
        "--implementation", "cp", "--timeout", "20", "--retries", "1", *deps,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 and any(s in proc.stderr for s in _UNREACHABLE):
        pytest.skip(f"the package index is unreachable: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, (
        f"no linux/aarch64 wheel for Python {python} (or pure Python wheel) for some "
        f"dependency:\n{proc.stderr[-2000:]}"
    )
    installed = json.loads(report.read_text())["install"]
    names = {canonicalize_name(i["metadata"]["name"]) for i in installed}
    for dep in deps:
        assert canonicalize_name(Requirement(dep).name) in names, dep
    cp = "cp" + python.replace(".", "")
    for item in installed:
        filename = item["download_info"]["url"].rsplit("/", 1)[-1]
        assert filename.endswith(".whl"), filename
        _, _, _, tags = parse_wheel_filename(filename)
        ok = [
            t
            for t in tags
            if (t.platform == "any" or t.platform.endswith("_aarch64"))
            and (t.interpreter in (cp, "py3", "py2.py3") or t.abi == "abi3")
        ]
        assert ok, f"{filename} is not for linux/aarch64 at {cp}"


def test_ci_builds_the_tool_image_for_both_platforms() -> None:
    """ci.yml's image job: QEMU for arm64, a build and a --version run per platform, one
    push of both; the arm64 wheels are fetched for the Python the Dockerfile names."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    steps = workflow["jobs"]["image"]["steps"]
    uses = [s.get("uses", "").split("@")[0] for s in steps]
    assert uses.index("docker/setup-qemu-action") < uses.index("docker/setup-buildx-action")
    qemu = steps[uses.index("docker/setup-qemu-action")]
    assert "arm64" in qemu["with"]["platforms"]
    runs = [s.get("run", "") for s in steps]
    build = next(r for r in runs if "--load" in r)
    assert "for platform in linux/amd64 linux/arm64" in build
    assert "--version" in build
    push = next(s for s in steps if "--push" in s.get("run", ""))
    assert "--platform linux/amd64,linux/arm64" in push["run"]
    assert push["if"] == "github.event_name == 'push'"
    wheels = next(r for r in runs if "pip download" in r)
    assert "_aarch64" in wheels and "--only-binary=:all:" in wheels
    # the step's own line that reads the Python version, run on the Dockerfile
    line = next(x.strip() for x in wheels.splitlines() if x.strip().startswith("py="))
    proc = subprocess.run(
        ["bash", "-c", f'{line}; echo "$py"'], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == image_python()
