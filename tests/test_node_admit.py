"""node/admit.py: smoke's flow as a library call, over the recorded node snapshots.

The verdicts and labels expected per fixture are test_node_checks.TABLE (written
from the snapshots by hand); what is tested here is the flow around them: the order
in which bad input is refused, the exit code of each outcome, and the NFD feature
file, read back as NFD reads it (``key=value`` lines, ``#`` comments)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from buildmatrix.cuda import load_cuda_facts
from buildmatrix.errors import InputError
from buildmatrix.labelkeys import SMOKE
from buildmatrix.node.admit import Admission, AdmitOptions, admit
from buildmatrix.node.pools import Pools, load_pools
from buildmatrix.profiles import ProfileSet
from tests.conftest import REPO
from tests.test_node_checks import TABLE

NODES = REPO / "tests" / "fixtures" / "nodes"
BIN = REPO / "tests" / "fixtures" / "bin"


@pytest.fixture(scope="module")
def pools(profiles: ProfileSet) -> Pools:
    return load_pools(NODES / "pools.yaml", profiles)


def _admit(profiles: ProfileSet, pools: Pools | None = None, **options: Any) -> Admission:
    return admit(
        AdmitOptions(**options),
        profiles=profiles,
        pools=pools,
        facts=load_cuda_facts(),
    )


def _feature_file(path: Path) -> dict[str, str]:
    """The labels NFD's local source reads from a feature file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    pairs = (line.partition("=") for line in lines if line and not line.startswith("#"))
    return {key: value or "true" for key, _, value in pairs}


def _rootfs(tmp_path: Path, lib: str) -> str:
    root = tmp_path / "rootfs"
    (root / "usr" / "lib").mkdir(parents=True)
    shutil.copy(BIN / lib, root / "usr" / "lib" / lib)
    return f"dir:{root}"


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_recorded_node(name: str, profiles: ProfileSet, pools: Pools, tmp_path: Path) -> None:
    verdict, failing, pool, product = TABLE[name]
    nfd = tmp_path / "features"
    found = _admit(profiles, pools, snapshot=NODES / f"{name}.json", nfd_file=nfd)
    assert ("pass" if found.passed else "fail") == verdict
    assert [c.name for c in found.checks if not c.ok] == failing
    assert found.exit_code == (0 if verdict == "pass" else 1)
    assert found.snapshot is not None and found.unavailable is None
    assert found.node == found.snapshot.hostname
    assert {m.name for m in found.models} == {g.name for g in found.snapshot.gpus}
    assert found.applied is None and found.loads == ()
    assert _feature_file(nfd) == dict(found.labels)
    if verdict == "fail":
        assert dict(found.labels) == {SMOKE: "failed"}
    else:
        assert found.labels["gpu-pool"] == pool
        assert found.labels["nvidia.com/gpu.product"] == product


def test_the_node_name_given_wins(profiles: ProfileSet) -> None:
    found = _admit(profiles, snapshot=NODES / "h100-535.json", node="gpu-17")
    assert found.node == "gpu-17"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"images": ("docker://",)}, "'docker://' is not a valid image reference"),
        ({"load_test": True}, "--load-test loads the images this node must run"),
        ({"apply": True}, "--apply needs the Node's name"),
    ],
)
def test_bad_input_is_refused_before_the_node_is_read(
    options: dict[str, Any], says: str, profiles: ProfileSet, tmp_path: Path
) -> None:
    """A snapshot that does not exist would be an error of its own: the option's
    error comes first, so nothing was read."""
    with pytest.raises(InputError) as refused:
        _admit(profiles, snapshot=tmp_path / "absent.json", **options)
    assert says in str(refused.value)
    assert "absent.json" not in str(refused.value)


def test_an_image_that_fits_is_verified(profiles: ProfileSet, tmp_path: Path) -> None:
    image = _rootfs(tmp_path, "libsass_ptx.so")  # sm_80 + sm_90 SASS, compute_90 PTX
    found = _admit(profiles, snapshot=NODES / "h100-580.json", images=(image,))
    assert found.exit_code == 0
    assert found.labels["verified.buildmatrix.io/rootfs"] == "true"
    assert found.plan.given == (image,) and found.plan.from_pool == ()


def test_an_image_without_code_for_the_node_fails_it(profiles: ProfileSet, tmp_path: Path) -> None:
    image = _rootfs(tmp_path, "libsass_sm80.so")
    found = _admit(profiles, snapshot=NODES / "h100-580.json", images=(image,))
    assert found.exit_code == 1
    assert [c.name for c in found.checks if not c.ok] == [f"image {image}"]
    assert dict(found.labels) == {SMOKE: "failed"}


def test_an_unreadable_image_is_bad_input_and_a_failed_node(
    profiles: ProfileSet, tmp_path: Path
) -> None:
    missing = f"oci:{tmp_path / 'nope'}"
    found = _admit(profiles, snapshot=NODES / "h100-535.json", images=(missing,))
    assert found.exit_code == 2  # bad input wins over "failed"
    failed = {c.name: c.message for c in found.checks if not c.ok}
    assert list(failed) == [f"image {missing}"]
    assert failed[f"image {missing}"].startswith("cannot be checked: ")


def test_a_node_whose_gpus_cannot_be_read(profiles: ProfileSet, tmp_path: Path) -> None:
    """Without NVML (none on this machine): failed, exit 3, the failure mark written."""
    nfd = tmp_path / "features"
    found = _admit(profiles, sysfs=tmp_path, nfd_file=nfd)
    if found.unavailable is None:
        pytest.skip("NVML answers here: the node was read")
    assert found.snapshot is None and found.models == ()
    assert found.exit_code == 3 and not found.passed
    assert [(c.name, c.ok, c.message) for c in found.checks] == [("nvml", False, found.unavailable)]
    assert dict(found.labels) == {SMOKE: "failed"} == _feature_file(nfd)
    assert found.node is None
