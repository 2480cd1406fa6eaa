"""A fleet for the ``buildmatrix drivers`` tests: five pools and five images.

The images are docker-archive tars of the nvcc-built fixture libraries
(tests/fixtures/bin, compiled by CUDA 13.0: their runtime floor is R580) and one with
a cuda-compat driver (a STAND-IN library with NVIDIA's note, tests/standins, as
tests/test_forward_compat.py uses).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.images import DISTRO_LOADER, Image, Symlink, fixture, write_docker_archive
from tests.standins import NOTE_13_1, compat_library

COMPAT = "usr/local/cuda-13.1/compat"
# The note of NVIDIA's CUDA 13.1 compat driver 590.44.01 (tests/test_forward_compat.py).


@dataclass(frozen=True)
class Fleet:
    pools: Path
    refs: dict[str, str]  # short name -> REF
    own: dict[str, list[str]]  # pool -> its REFs


def _images(out: Path) -> dict[str, Image]:
    lib = compat_library(out, "590.44.01", NOTE_13_1).read_bytes()
    return {
        "multi": Image(layers=[{"usr/lib/libmulti.so": fixture("libmulti.so")}]),
        "ampere-sass": Image(layers=[{"usr/lib/libsass_sm80.so": fixture("libsass_sm80.so")}]),
        "ptx-only": Image(layers=[{"usr/lib/libptx_only.so": fixture("libptx_only.so")}]),
        "hopper-a": Image(layers=[{"usr/lib/libhopper_a.so": fixture("libhopper_a.so")}]),
        "compat": Image(
            layers=[
                {
                    "usr/lib/libsass_ptx.so": fixture("libsass_ptx.so"),
                    **DISTRO_LOADER,
                    f"{COMPAT}/libcuda.so.590.44.01": lib,
                    f"{COMPAT}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
                    "usr/local/cuda": Symlink("cuda-13.1"),
                }
            ],
            # a legacy image: on an older driver only without the toolkit's cuda>= check
            env={"CUDA_VERSION": "13.1.0", "NVIDIA_DISABLE_REQUIRE": "1"},
        ),
    }


def build_fleet(out: Path) -> Fleet:
    """The images as docker-archive tars under ``out`` and a pools file naming them."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the stand-in compat library (.ci/run has it)")
    refs = {
        name: f"docker-archive:{write_docker_archive(out / f'{name}.tar', image)}"
        for name, image in _images(out).items()
    }
    own = {
        "training-hopper": [refs["multi"], refs["hopper-a"], refs["compat"]],
        "training-ampere": [refs["multi"], refs["ampere-sass"]],
        "training-blackwell": [refs["multi"], refs["ptx-only"]],
        "inference-ampere": [refs["ampere-sass"]],
        "general": [],
    }
    doc = {
        "families": {
            "hopper": "training-hopper",
            "ampere": "training-ampere",
            "blackwell": "training-blackwell",
        },
        "products": {"NVIDIA A40": "inference-ampere"},
        "default": "general",
        "pools": {
            name: {"images": images}
            | (
                {"products": ["NVIDIA B200", "NVIDIA B300 SXM6 AC", "NVIDIA GeForce RTX 5090"]}
                if name == "training-blackwell"
                else {}
            )
            for name, images in own.items()
        },
    }
    pools = out / "pools.yaml"
    pools.write_text(json.dumps(doc))
    return Fleet(pools=pools, refs=refs, own=own)
