"""The check logic on scanned images made here (no engine needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version

from buildmatrix.binary.report import FileReport
from buildmatrix.binary.scan import inspect_file
from buildmatrix.check import Options, run_check
from buildmatrix.compat import Verdict
from buildmatrix.cuda import load_cuda_facts, parse_driver_version
from buildmatrix.errors import InputError
from buildmatrix.image.scanned import ImageConfig, ScannedImage
from buildmatrix.profile_files import load_profiles
from buildmatrix.runtime_sources import cuda_runtime
from buildmatrix.snapshot import load_snapshot
from tests.conftest import SHIPPED_PROFILES
from tests.fixtures.build import BIN

PROFILES = load_profiles(SHIPPED_PROFILES)
FACTS = load_cuda_facts()


def lib(name: str, at: str | None = None) -> FileReport:
    report = inspect_file(BIN / name)
    assert report is not None
    return FileReport(path=at or f"usr/lib/{name}", format=report.format, entries=report.entries)


def image(
    *files: FileReport,
    labels: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    paths: list[str] | None = None,
    problems: list[str] | None = None,
) -> ScannedImage:
    return ScannedImage(
        ref="test:img",
        digest=None,
        config=ImageConfig(labels=labels or {}, env=env or {}),
        files=list(files),
        problems=problems or [],
        paths=paths or [f.path for f in files],
        layers=1,
    )


def verdicts(result: object) -> dict[str, str]:
    return {f"{t.target.name}/{t.sm}": t.verdict.value for t in result.targets}  # type: ignore[attr-defined]


def test_label_sets_targets_and_mislabel_fails() -> None:
    img = image(lib("libsass_sm80.so"), labels={"io.buildmatrix.family": "hopper"})
    result = run_check(img, PROFILES, Options(), FACTS)
    assert verdicts(result) == {"hopper/sm_90": "none"}
    assert not result.passed
    assert result.declared == {"family": "hopper", "source": "label"}
    assert "sm_80 SASS runs only on compute capability 8.x, not 9.0" in result.problems[0]


def test_family_expands_to_each_sm_and_flags_win_over_label() -> None:
    img = image(lib("libmulti.so"), labels={"io.buildmatrix.family": "hopper"})
    result = run_check(img, PROFILES, Options(families=["blackwell", "ampere"]), FACTS)
    assert verdicts(result) == {
        "blackwell/sm_100": "native",
        "blackwell/sm_103": "native",
        "blackwell/sm_120": "native",
        "blackwell/sm_121": "native",  # sm_120 SASS runs on 12.1
        "ampere/sm_80": "native",
        "ampere/sm_86": "native",
    }
    assert result.passed
    assert result.declared["source"] == "flags"


def test_ptx_only_is_jit_and_require_sass_fails_it() -> None:
    img = image(lib("libptx_only.so"))
    assert verdicts(run_check(img, PROFILES, Options(sms=["9.0"]), FACTS)) == {"sm_90/sm_90": "jit"}
    strict = run_check(img, PROFILES, Options(sms=["9.0"], require_sass=True), FACTS)
    assert not strict.passed
    assert "runs only by PTX JIT" in strict.problems[0]


def test_worst_file_decides_and_ignore_leaves_files_out() -> None:
    img = image(lib("libhopper_a.so"), lib("libsass_sm80.so", "opt/extra/libold.so"))
    opts = Options(families=["hopper"])
    assert verdicts(run_check(img, PROFILES, opts, FACTS)) == {"hopper/sm_90": "none"}
    ignored = run_check(img, PROFILES, Options(families=["hopper"], ignore=["*/extra/*"]), FACTS)
    assert ignored.passed
    assert ignored.ignored == ["opt/extra/libold.so"]


def test_driver_floors_runtime_and_hardware() -> None:
    """libhopper_a.so was compiled by CUDA 13.0 (its cubins' .note.nv.tkinfo): that,
    not the image's CUDA_VERSION=12.4.1, sets the runtime floor."""
    img = image(lib("libhopper_a.so"), env={"CUDA_VERSION": "12.4.1"})
    assert cuda_runtime(img) == (
        Version("13.0"),
        "device code of usr/lib/libhopper_a.so (built by CUDA 13.0)",
    )
    old = run_check(
        img, PROFILES, Options(sms=["sm_90"], driver=parse_driver_version("520.61.05")), FACTS
    )
    assert not old.passed
    (target,) = old.targets
    assert not target.driver_ok
    assert target.driver_failures == (
        "CUDA 13.0 runtime (CUDA 13.x minor version compatibility) needs driver >= 580.65.06; "
        "node has 520.61.05",
        "hardware floor for sm_90 (hopper) needs driver >= 525.60.13; node has 520.61.05",
    )
    for driver, passes in (("535.104.05", False), ("580.65.06", True)):
        got = run_check(
            img, PROFILES, Options(sms=["sm_90"], driver=parse_driver_version(driver)), FACTS
        )
        assert got.passed is passes, driver


@pytest.mark.parametrize(
    ("env", "paths", "want"),
    [
        ({"CUDA_VERSION": "11.8.0"}, ["usr/lib/libcudart.so.12"], "12.0"),
        ({"CUDA_VERSION": "12.4.1"}, ["usr/local/cuda/lib64/libcudart.so.13.0.96"], "13.0"),
        ({"CUDA_VERSION": "13.3.1"}, ["usr/lib/libcudart.so.12.9.79"], "13.3"),
    ],
)
def test_the_newest_runtime_any_source_shows_wins(
    env: dict[str, str], paths: list[str], want: str
) -> None:
    rt = cuda_runtime(image(env=env, paths=paths))
    assert rt is not None and str(rt[0]) == want


def test_ptx_jit_needs_a_driver_that_knows_the_isa() -> None:
    img = image(lib("libsass_ptx.so"))  # sm_80, sm_90, compute_90 with PTX ISA 9.0
    new = run_check(
        img, PROFILES, Options(sms=["sm_120"], driver=parse_driver_version("580.65.06")), FACTS
    )
    assert verdicts(new) == {"sm_120/sm_120": "jit"}
    old = run_check(
        img, PROFILES, Options(sms=["sm_120"], driver=parse_driver_version("575.51.03")), FACTS
    )
    assert verdicts(old) == {"sm_120/sm_120": "none"}


def test_cuda_runtime_from_env_or_libcudart() -> None:
    rt = cuda_runtime(image(env={"CUDA_VERSION": "12.4.1"}))
    assert rt is not None and str(rt[0]) == "12.4"
    rt = cuda_runtime(
        image(
            paths=[
                "usr/local/cuda-12.2/lib64/libcudart.so.12.2.140",
                "usr/lib/python3/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12",
            ]
        )
    )
    assert rt is not None and str(rt[0]) == "12.2"
    assert cuda_runtime(image()) is None


def test_empty_image_fails_unless_allowed() -> None:
    result = run_check(image(), PROFILES, Options(families=["ampere"]), FACTS)
    assert not result.passed
    assert "no CUDA device code at all" in result.problems[-1]
    assert run_check(
        image(), PROFILES, Options(families=["ampere"], allow_empty=True), FACTS
    ).passed


def test_unreadable_device_code_fails_closed() -> None:
    img = image(lib("libmulti.so"), problems=["usr/lib/libbroken.so: truncated"])
    result = run_check(img, PROFILES, Options(families=["ampere"]), FACTS)
    assert not result.passed
    assert all(t.verdict is Verdict.NONE for t in result.targets)


def test_no_label_no_flags_judges_every_profile() -> None:
    """Where does the image run? Every profile is a target; the image passes where it
    runs on one (tests/test_check_where.py holds the table to cuobjdump's lists)."""
    result = run_check(image(lib("libhopper_a.so")), PROFILES, Options(), FACTS)
    assert result.declared == {"family": None, "source": "profiles"}
    assert [t.sm for t in result.targets] == [p.sm for p in PROFILES.profiles]
    assert [t.sm for t in result.runs_on] == ["sm_90"]
    assert result.passed
    nowhere = run_check(image(lib("libhopper_a.so")), PROFILES, Options(sms=["8.0"]), FACTS)
    assert not nowhere.passed  # a target given is a requirement, as before


def test_snapshot_gives_driver_and_targets(tmp_path: Path) -> None:
    snap = tmp_path / "node.json"
    snap.write_text(
        json.dumps(
            {
                "version": 1,
                "hostname": "gpu-node-17",
                "driver_version": "535.104.05",
                "cuda_driver_version": "12.2",
                "gpus": [
                    {
                        "index": 0,
                        "name": "NVIDIA H100 80GB HBM3",
                        "compute_capability": "9.0",
                        "memory_total_mib": 81559,
                    }
                ],
                "errors": [],
            }
        )
    )
    img = image(lib("libhopper_a.so"), env={"CUDA_VERSION": "13.0.0"})
    result = run_check(img, PROFILES, Options(snapshot=load_snapshot(snap)), FACTS)
    assert result.declared["source"] == "snapshot"
    # A CUDA 13 image on an R535 node: the runtime floor fails, and the container
    # toolkit refuses to start a legacy CUDA 13.0 image (CUDA_VERSION, no
    # NVIDIA_REQUIRE_CUDA: cuda>=13.0) on a driver of CUDA 12.2 (buildmatrix.container_env).
    assert verdicts(result) == {"NVIDIA H100 80GB HBM3/sm_90": "none"}
    assert not result.passed
    assert any("580.65.06" in p for p in result.problems)
    assert any("unsatisfied condition: cuda>=13.0" in p for p in result.problems)


def test_a_label_naming_no_family_is_no_target() -> None:
    """Zero targets prove nothing: bad input, never a pass."""
    img = image(lib("libmulti.so"), labels={"io.buildmatrix.family": " , "})
    with pytest.raises(InputError, match="no target GPU to check against"):
        run_check(img, PROFILES, Options(), FACTS)


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (Options(families=["hoper"]), "Did you mean 'hopper'"),
        (Options(sms=["sm_99"]), "no arch profile for 'sm_99'"),
        (Options(sms=["gfx90a"]), "is not an SM"),
    ],
)
def test_bad_targets(opts: Options, message: str) -> None:
    with pytest.raises(InputError, match=message):
        run_check(image(lib("libmulti.so")), PROFILES, opts, FACTS)
