"""``CUDA_FORCE_PTX_JIT`` and ``CUDA_DISABLE_PTX_JIT`` in an image's ``Env``: the driver
loads only the code they leave (CUDA C++ Programming Guide, "CUDA Environment
Variables": with the first, "If a kernel does not have embedded PTX code, it will fail
to load"; with the second, "If a kernel does not have embedded binary code or the
embedded binary was compiled for an incompatible architecture, then it will fail to
load"). Every nvcc-built fixture library, setting and GPU, through ``check``,
against the guide's rule stated over the fixtures' cuobjdump lists."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliRunner
from tests.cuobjdump import cuobjdump_lists, find_cuobjdump
from tests.images import Image, fixture, write_oci_layout

LIBRARIES = ("libsass_sm80.so", "libptx_only.so", "libsass_ptx.so")
SETTINGS: dict[str, dict[str, str]] = {
    "none": {},
    "force": {"CUDA_FORCE_PTX_JIT": "1"},
    "disable": {"CUDA_DISABLE_PTX_JIT": "1"},
    "both": {"CUDA_FORCE_PTX_JIT": "1", "CUDA_DISABLE_PTX_JIT": "1"},
    "force-off": {"CUDA_FORCE_PTX_JIT": "0", "CUDA_DISABLE_PTX_JIT": ""},
}
GPUS = ("8.0", "8.6", "9.0", "10.0")
DRIVER = "580.65.06"  # CUDA 13.0: JIT-compiles every PTX ISA of the fixtures
# cuobjdump is the oracle of what each fixture holds
pytestmark = pytest.mark.integration


def _cc(arch: str) -> tuple[int, int]:
    digits = arch.split("_")[1]
    return int(digits[:-1]), int(digits[-1])


def _runs(sass: Iterable[str], ptx: Iterable[str], gpu: str, env: dict[str, str]) -> bool:
    """The guide's rule: native SASS of the GPU's major and a minor not above it, else
    PTX of a compute capability not above the GPU's, each only where the setting
    leaves its kind."""
    set_ = {k for k, v in env.items() if v.strip() not in ("", "0")}
    major, minor = (int(x) for x in gpu.split("."))
    native = any(_cc(a)[0] == major and _cc(a)[1] <= minor for a in sass)
    jit = any(_cc(a) <= (major, minor) for a in ptx)
    return (native and "CUDA_FORCE_PTX_JIT" not in set_) or (
        jit and "CUDA_DISABLE_PTX_JIT" not in set_
    )


@pytest.fixture(scope="module")
def listed() -> dict[str, tuple[Iterable[str], Iterable[str]]]:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (the oracle of the fixtures' contents)")
    from tests.fixtures.build import BIN

    return {name: cuobjdump_lists(tool, BIN / name) for name in LIBRARIES}


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("library", LIBRARIES)
def test_the_driver_loads_only_what_the_images_env_leaves(
    cli: CliRunner,
    tmp_path: Path,
    listed: dict[str, tuple[Iterable[str], Iterable[str]]],
    library: str,
    setting: str,
) -> None:
    env = SETTINGS[setting]
    image = Image(layers=[{f"usr/lib/{library}": fixture(library)}], env=env)
    layout = write_oci_layout(tmp_path / "img", image)
    args = [a for g in GPUS for a in ("--sm", g)]
    r = cli("check", f"oci:{layout}", *args, "--driver", DRIVER, "--json")
    doc: Any = r.json()
    sass, ptx = (list(x) for x in listed[library])
    narrowed = setting in ("force", "disable", "both")  # "0" and "" set nothing
    for target in doc["targets"]:
        want = _runs(sass, ptx, target["compute_capability"], env)
        assert (target["verdict"] != "none") is want, (target, sass, ptx)
        if not want and narrowed:
            assert any("the image's Env sets CUDA_" in x for x in target["reasons"]), target
    assert r.code == (0 if all(_runs(sass, ptx, g, env) for g in GPUS) else 1), r.err
    assert any("the image's Env sets" in w for w in doc["warnings"]) is narrowed


# Two translation units (kernels.cu, second.cu), one container each: the first with
# SASS and PTX, the second with one kind alone, so that the Env leaves the second
# with no code at all while the first still runs.
_TWO_UNITS = {
    "libforce_sass_unit.so": (
        ("arch=compute_80,code=[sm_80,compute_80]",),
        ("arch=compute_90,code=sm_90",),
        {"CUDA_FORCE_PTX_JIT": "1"},
    ),
    "libdisable_ptx_unit.so": (
        ("arch=compute_90,code=[sm_90,compute_90]",),
        ("arch=compute_80,code=compute_80",),
        {"CUDA_DISABLE_PTX_JIT": "1"},
    ),
}


@pytest.fixture(scope="module")
def two_units(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import NVCC_CACHE
    from tests.fixtures.build import Fixture, cached_build, have_nvcc

    if not have_nvcc():
        pytest.skip("nvcc and gcc build these libraries")
    out = tmp_path_factory.mktemp("two-units")
    fixtures = [
        Fixture(name=name, kind="shared", gencode=first, second=second)
        for name, (first, second, _) in _TWO_UNITS.items()
    ]
    cached_build(out, fixtures, NVCC_CACHE, jobs=1)
    return out


@pytest.mark.nvcc
@pytest.mark.parametrize("library", list(_TWO_UNITS))
def test_a_unit_the_env_leaves_without_code_fails_everywhere(
    cli: CliRunner, tmp_path: Path, two_units: Path, library: str
) -> None:
    """The second unit's kernel has no code the driver may load under the Env (SASS
    alone under CUDA_FORCE_PTX_JIT, PTX alone under CUDA_DISABLE_PTX_JIT), so it fails
    to load on every GPU, whatever the first unit holds; such a unit is not taken for
    specialised code. Without the Env each GPU of the units' code passes."""
    _, _, env = _TWO_UNITS[library]
    binary = (two_units / library).read_bytes()
    args = [a for g in ("8.0", "9.0", "10.0") for a in ("--sm", g)]
    for name, e in (("plain", {}), ("with-env", env)):
        layout = write_oci_layout(
            tmp_path / name, Image(layers=[{f"usr/lib/{library}": binary}], env=e)
        )
        r = cli("check", f"oci:{layout}", *args, "--driver", DRIVER, "--json")
        doc: Any = r.json()
        verdicts = {t["compute_capability"]: t["verdict"] for t in doc["targets"]}
        if e:
            assert set(verdicts.values()) == {"none"}, doc["targets"]
            assert all(t["specialised"] == [] for t in doc["targets"])
            assert r.code == 1
        else:
            assert verdicts["9.0"] != "none", doc["targets"]
