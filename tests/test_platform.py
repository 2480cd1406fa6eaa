"""Which entry of a multi-platform index is judged: the one containerd pulls.

The oracles: containerd itself (``ctr images pull --platform P``, whose unpack
step picks the image with ``platforms.Only(P)`` and prints its chain ID), the
Docker engine's pull, and the expectations of containerd/platforms' own tests
(``compare_test.go``, ``TestOnly``; ``platforms_test.go``, ``TestParseSelector``).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest

from buildmatrix.errors import InputError
from buildmatrix.image.platform import Platform, parse_platform, rank, select_platform
from tests.conftest import CliRunner
from tests.images import Entry, Image, fixture, layer_tar, write_platform_layout
from tests.services import Registry
from tests.test_image_sources import skopeo


def _raw(spec: str) -> Platform:
    """A platform as an index entry writes it (no normalising here)."""
    os, arch, *variant = spec.split("/")
    return Platform(os=os, architecture=arch, variant=variant[0] if variant else "")


# containerd/platforms compare_test.go, TestOnly: requested platform -> entries
# that Only(requested) matches, and entries it does not.
ONLY = {
    "linux/amd64": (
        ["linux/amd64", "linux/386"],
        ["linux/amd64/v2", "linux/arm/v7", "linux/arm64"],
    ),
    "linux/amd64/v2": (
        ["linux/amd64", "linux/amd64/v1", "linux/amd64/v2", "linux/386"],
        ["linux/amd64/v3", "linux/amd64/v4", "linux/arm/v7", "linux/arm64"],
    ),
    "linux/386": (["linux/386"], ["linux/amd64", "linux/arm/v7", "linux/arm64"]),
    "linux/arm/v8": (
        ["linux/arm", "linux/arm/v5", "linux/arm/v6", "linux/arm/v7", "linux/arm/v8"],
        ["linux/amd64", "linux/arm/v4", "linux/arm64"],
    ),
    "linux/arm/v7": (
        ["linux/arm", "linux/arm/v5", "linux/arm/v6", "linux/arm/v7"],
        ["linux/amd64", "linux/arm/v4", "linux/arm/v8", "linux/arm64"],
    ),
    "linux/arm/v6": (
        ["linux/arm/v5", "linux/arm/v6"],
        ["linux/amd64", "linux/arm", "linux/arm/v4", "linux/arm/v7", "linux/arm/v8"],
    ),
    "linux/arm/v5": (["linux/arm/v5"], ["linux/arm", "linux/arm/v4", "linux/arm/v6"]),
    "linux/arm/v4": (["linux/arm/v4"], ["linux/arm", "linux/arm/v5", "linux/arm/v8"]),
    "linux/arm64/v9.6": (
        ["linux/arm", "linux/arm/v5", "linux/arm/v8", "linux/arm64", "linux/arm64/v8"]
        + [f"linux/arm64/v8.{m}" for m in range(1, 10)]
        + ["linux/arm64/v9", "linux/arm64/v9.0"]
        + [f"linux/arm64/v9.{m}" for m in range(1, 7)],
        ["linux/amd64", "linux/arm/v4", "linux/arm64/v8.10"],
    ),
    "linux/arm64/v9": (
        ["linux/arm", "linux/arm/v8", "linux/arm64", "linux/arm64/v8", "linux/arm64/v8.5"]
        + [f"linux/arm64/v9{minor}" for minor in ("", ".0")],
        ["linux/amd64", "linux/arm/v4", "linux/arm64/v8.6"],
    ),
    "linux/arm64/v8.1": (
        ["linux/arm", "linux/arm/v8", "linux/arm64", "linux/arm64/v8", "linux/arm64/v8.1"],
        ["linux/amd64", "linux/arm/v4", "linux/arm/v9", "linux/arm64/v9"],
    ),
    "linux/arm64": (
        ["linux/arm", "linux/arm/v5", "linux/arm/v8", "linux/arm64", "linux/arm64/v8"],
        ["linux/amd64", "linux/arm/v4", "linux/arm/v9", "linux/arm64/v9"],
    ),
}


@pytest.mark.parametrize("requested", sorted(ONLY))
def test_only_matches_what_containerd_tests_say(requested: str) -> None:
    yes, no = ONLY[requested]
    want = parse_platform(requested)
    assert [p for p in yes if rank(want, _raw(p)) is None] == []
    assert [p for p in no if rank(want, _raw(p)) is not None] == []
    assert rank(want, _raw("windows/amd64")) is None


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [  # containerd/platforms platforms_test.go, TestParseSelector
        ("linux/arm64", ("linux", "arm64", "")),
        ("linux/arm64/v8", ("linux", "arm64", "v8")),
        ("linux/arm", ("linux", "arm", "")),
        ("linux/arm/v6", ("linux", "arm", "v6")),
        ("linux/arm/v7", ("linux", "arm", "v7")),
        ("Linux/x86_64", ("linux", "amd64", "")),
        ("linux/aarch64", ("linux", "arm64", "")),
        ("linux/armhf", ("linux", "arm", "")),
        ("linux/armel", ("linux", "arm", "v6")),
        ("linux/i386", ("linux", "386", "")),
        ("linux/s390x", ("linux", "s390x", "")),
        ("linux/amd64/v1", ("linux", "amd64", "")),
    ],
)
def test_parse_normalises_as_containerd(spec: str, parsed: tuple[str, str, str]) -> None:
    p = parse_platform(spec)
    assert (p.os, p.architecture, p.variant) == parsed


@pytest.mark.parametrize(
    "spec", ["linux", "*/amd64", "linux/amd64/v3/x", "linux/a b", "windows/amd64"]
)
def test_unusable_platforms_are_input_errors(spec: str) -> None:
    with pytest.raises(InputError, match="--platform"):
        parse_platform(spec)


# ------------------------------------------------- against containerd's own pull

ENTRIES = ["amd64/v3", "amd64", "amd64/v2", "386", "arm64/v8", "arm/v7", "arm/v6"]
REQUESTS = [
    "linux/amd64",
    "linux/x86_64",
    "linux/amd64/v2",
    "linux/amd64/v3",
    "linux/amd64/v4",
    "linux/386",
    "linux/arm64",
    "linux/arm64/v8",
    "linux/aarch64",
    "linux/arm",
    "linux/arm/v7",
    "linux/arm/v8",
    "linux/arm/v5",
    "linux/s390x",
]


def _platform_doc(entry: str) -> dict[str, str]:
    arch, *variant = entry.split("/")
    return {"os": "linux", "architecture": arch} | ({"variant": variant[0]} if variant else {})


def _tagged_image(entry: str) -> tuple[Image, str]:
    """A one-layer image for ``entry`` and its chain ID (the layer's diff_id)."""
    layer: dict[str, Entry] = {"etc/platform": entry.encode()}
    diff_id = "sha256:" + hashlib.sha256(layer_tar(layer)).hexdigest()
    return Image(layers=[layer], platform=_platform_doc(entry)), diff_id


def _push_index(registry: Registry, tmp_path: Path, entries: list[str], name: str) -> str:
    layout = write_platform_layout(
        tmp_path / name, [(_platform_doc(e), _tagged_image(e)[0]) for e in entries]
    )
    dest = f"docker://{registry.host}/bmtest/{name}:v1"
    skopeo("copy", "--all", "--dest-tls-verify=false", f"oci:{layout}:multi", dest)
    return f"{registry.host}/bmtest/{name}:v1"


def _containerd_pick(socket: str, ref: str, requested: str, namespace: str) -> str | None:
    """The chain ID of the image containerd picks for ``requested``, or None when it
    finds none. ``ctr images pull`` fetches only the entries that equal the request
    (``platforms.Any``) and then unpacks with ``platforms.Only`` (containerd v1.6
    ``cmd/ctr/commands/images/pull.go``), so every entry is fetched first: the unpack
    then chooses among all of them, as the CRI plugin's pull does."""
    ctr = ["ctr", "-a", socket, "-n", namespace]
    subprocess.run(
        [*ctr, "content", "fetch", "--plain-http", "--all-platforms", ref],
        capture_output=True,
        check=True,
        timeout=120,
    )
    pull = ["images", "pull", "--plain-http", "--snapshotter", "native", "--print-chainid"]
    r = subprocess.run(
        [*ctr, *pull, "--platform", requested, ref],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    found = re.search(r"image chain ID: (sha256:[0-9a-f]{64})", r.stdout)
    if r.returncode != 0 or found is None:
        assert "not found" in r.stderr, r.stdout + r.stderr
        return None
    return found.group(1)


def _our_pick(index: list[dict[str, object]], requested: str, chains: dict[str, str]) -> str | None:
    try:
        desc = select_platform(index, requested, name="test")
    except InputError:
        return None
    return chains[str(desc["digest"])]


ORDERS = {
    "as-listed": ENTRIES,
    "reversed": ENTRIES[::-1],
    "no-plain-amd64": ["amd64/v3", "386", "arm/v6", "amd64/v2"],  # the fallbacks decide
}


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_the_entry_is_the_one_containerd_pulls(
    name: str, registry: Registry, containerd_socket: str, tmp_path: Path
) -> None:
    """Every request of REQUESTS against an index of ENTRIES (in two orders, and
    without the plain entries): the entry buildmatrix judges has the chain ID of the
    image containerd unpacks, or neither finds one."""
    entries = ORDERS[name]
    ref = _push_index(registry, tmp_path, entries, name)
    layout = tmp_path / name
    top = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    index = json.loads((layout / "blobs/sha256" / top.split(":")[1]).read_text())["manifests"]
    chains = {}  # manifest digest -> chain ID
    for desc in index:
        manifest = json.loads((layout / "blobs/sha256" / desc["digest"].split(":")[1]).read_text())
        config = json.loads(
            (layout / "blobs/sha256" / manifest["config"]["digest"].split(":")[1]).read_text()
        )
        chains[desc["digest"]] = config["rootfs"]["diff_ids"][0]
    differ = []
    for i, requested in enumerate(REQUESTS):
        theirs = _containerd_pick(containerd_socket, ref, requested, f"{name}-{i}")
        ours = _our_pick(index, requested, chains)
        if theirs != ours:
            differ.append((requested, theirs, ours))
    assert differ == []
    if "amd64" in entries:
        assert _our_pick(index, "linux/amd64", chains) == _tagged_image("amd64")[1]


def test_v3_first_is_not_what_a_plain_amd64_node_runs(
    registry: Registry,
    containerd_socket: str,
    docker_host: str,
    cli: CliRunner,
    tmp_path: Path,
) -> None:
    """The review's case: ``linux/amd64/v3`` (Hopper code) first, ``linux/amd64``
    (sm_80 only) second. containerd and the Docker engine pull the plain entry, so
    the image fails on 9.0; asked for ``linux/amd64/v3``, the v3 entry passes."""
    v3 = Image(
        layers=[{"usr/lib/libk.so": fixture("libhopper_a.so")}],
        labels={"io.buildmatrix.family": "hopper"},
        platform=_platform_doc("amd64/v3"),
    )
    plain = Image(
        layers=[{"usr/lib/libk.so": fixture("libsass_sm80.so")}],
        labels={"io.buildmatrix.family": "hopper"},
    )
    layout = write_platform_layout(
        tmp_path / "variants", [(_platform_doc("amd64/v3"), v3), (_platform_doc("amd64"), plain)]
    )
    ref = f"{registry.host}/bmtest/variants:v1"
    skopeo("copy", "--all", "--dest-tls-verify=false", f"oci:{layout}:multi", f"docker://{ref}")
    plain_chain = "sha256:" + hashlib.sha256(layer_tar(plain.layers[0])).hexdigest()
    assert _containerd_pick(containerd_socket, ref, "linux/amd64", "variants") == plain_chain
    docker = ["docker", "-H", docker_host]
    subprocess.run([*docker, "pull", ref], check=True, capture_output=True, timeout=120)
    try:
        inspect = subprocess.run(
            [*docker, "image", "inspect", ref], check=True, capture_output=True, text=True
        )
        assert json.loads(inspect.stdout)[0]["RootFS"]["Layers"] == [plain_chain]
    finally:
        subprocess.run([*docker, "rmi", ref], check=False, capture_output=True)
    for source in (f"docker://{ref}", f"oci:{layout}:multi"):
        judged = cli("check", source, "--sm", "9.0", "--json")
        assert judged.code == 1, judged.out + judged.err
        assert judged.json()["files"][0]["sass"] == ["sm_80"]
        asked = cli("check", source, "--sm", "9.0", "--platform", "linux/amd64/v3", "--json")
        assert asked.code == 0, asked.out + asked.err


def test_an_entry_without_a_platform_counts_by_its_config(cli: CliRunner, tmp_path: Path) -> None:
    """containerd's ``images.Manifest`` keeps entries without a platform, last, and
    takes one only if its image config's platform matches."""
    arm = Image(layers=[{"etc/x": b"arm"}], platform=_platform_doc("arm64"))
    amd = Image(layers=[{"usr/lib/libk.so": fixture("libsass_sm80.so")}])
    layout = write_platform_layout(
        tmp_path / "unplaced", [(None, amd), (_platform_doc("arm64"), arm)]
    )
    # --platform: the arm64 entry (no device code) would be judged too, A100 PCIe
    # cards sitting behind Arm hosts as well (docs/check.md, "Platforms")
    judged = cli(
        "check", f"oci:{layout}:multi", "--sm", "8.0", "--platform", "linux/amd64", "--json"
    )
    assert judged.code == 0, judged.out + judged.err
    assert judged.json()["files"][0]["sass"] == ["sm_80"]
    assert cli("check", f"oci:{layout}:multi", "--sm", "8.0").code == 1  # the arm64 entry
    wrong = write_platform_layout(tmp_path / "wrong", [(None, arm)])
    refused = cli("check", f"oci:{wrong}:multi", "--sm", "8.0")
    assert refused.code == 2
    assert "linux/arm64 (its config)" in refused.err


# containerd/platforms compare_test.go (v1.0.0-rc.3 on), TestCompareOSFeatures:
# request -> entries -> their order under Only(request).Less. The entry picked is the
# first of that order that Only(request) matches (features a subset of the request's).
OS_FEATURES = [
    (
        "linux/amd64",
        ["windows/amd64", "linux/amd64", "linux(+other)/amd64", "linux/arm64"],
        ["linux/amd64", "linux(+other)/amd64", "windows/amd64", "linux/arm64"],
    ),
    (
        "linux(+none)/amd64",
        ["windows/amd64", "linux/amd64", "linux/arm64", "linux(+other)/amd64"],
        ["linux/amd64", "linux(+other)/amd64", "windows/amd64", "linux/arm64"],
    ),
    (
        "linux(+other)/amd64",
        ["windows/amd64", "linux/amd64", "linux/arm64", "linux(+other)/amd64"],
        ["linux(+other)/amd64", "linux/amd64", "windows/amd64", "linux/arm64"],
    ),
    (
        "linux(+af+other+zf)/amd64",
        ["windows/amd64", "linux/amd64", "linux/arm64", "linux(+other)/amd64"],
        ["linux(+other)/amd64", "linux/amd64", "windows/amd64", "linux/arm64"],
    ),
    (
        "linux(+f1+f2)/amd64",
        ["linux/amd64", "linux(+f2)/amd64", "linux(+f1)/amd64", "linux(+f1+f2)/amd64"],
        ["linux(+f1+f2)/amd64", "linux(+f2)/amd64", "linux(+f1)/amd64", "linux/amd64"],
    ),
]


def _entry(spec: str) -> dict[str, object]:
    """An index entry for ``os(+f1+f2)/arch`` (containerd's FormatAll syntax)."""
    head, arch = spec.split("/")
    os, _, features = head.partition("(")
    platform: dict[str, object] = {"os": os, "architecture": arch}
    if features:
        platform["os.features"] = [f for f in features.rstrip(")").split("+") if f]
    return {"digest": spec, "platform": platform}


@pytest.mark.parametrize(("requested", "entries", "order"), OS_FEATURES)
def test_os_features_as_containerd_tests_say(
    requested: str, entries: list[str], order: list[str]
) -> None:
    """The newer matcher picks the first of containerd's own order that it matches;
    the older (containerd 1.6 to 2.2, features ignored) the first amd64 entry listed;
    and the request ``format_platform`` writes for the older one's pick (the
    request's platform with that entry's features) makes the newer matcher pick it
    too (buildmatrix.image.manifests.choose)."""
    from dataclasses import replace

    from buildmatrix.image.platform import format_platform

    index = [_entry(e) for e in entries]
    picked = select_platform(index, requested, name="t")["digest"]
    assert picked == next(e for e in order if e.startswith("linux") and "amd64" in e)
    assert rank(parse_platform(requested), _platform(str(picked))) is not None
    older = select_platform(index, requested, name="t", legacy=True)["digest"]
    assert older == next(e for e in entries if e.startswith("linux") and "amd64" in e)
    asked = parse_platform(requested)
    again = format_platform(replace(asked, os_features=_platform(str(older)).os_features))
    assert select_platform(index, again, name="t")["digest"] == older


def _platform(spec: str) -> Platform:
    p = _entry(spec)["platform"]
    assert isinstance(p, dict)
    features = p.get("os.features", [])
    return Platform(os=p["os"], architecture=p["architecture"], os_features=tuple(features))


def test_os_features_are_counted_as_the_entry_lists_them() -> None:
    """containerd's ``images.Manifest`` sorts entries by ``Less``, which prefers more
    OS features by ``len(p1.OSFeatures)`` of the entry's platform as stored (compare.go,
    ``orderedPlatformComparer.Less``): [f, f] and [f, g] tie for ``linux(+f+g)/amd64``,
    so the first in index order wins either way (counting the set, [f, g] won)."""
    twice = {"os": "linux", "architecture": "amd64", "os.features": ["f", "f"]}
    both = {"os": "linux", "architecture": "amd64", "os.features": ["f", "g"]}
    for entries in ([twice, both], [both, twice]):
        index = [{"digest": str(i), "platform": p} for i, p in enumerate(entries)]
        assert select_platform(index, "linux(+f+g)/amd64", name="t")["digest"] == "0"
