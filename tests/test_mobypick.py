"""The manifest Docker Engine runs from containerd's image store (image/mobypick.py),
against moby ``daemon/containerd/image.go`` ``getBestPresentImageManifest`` as its
source reads: present manifests only, index order, config platform for an entry
without one. The real containerd runs in tests/test_engine_containerd.py."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from hashlib import sha256
from pathlib import Path
from typing import Any, cast

import pytest

from buildmatrix.image.manifests import NoPlatformMatch, Picked
from buildmatrix.image.mobypick import AMD64_LEVELS, best_present, moby_choose
from buildmatrix.image.platform import config_platform, normalize, platform_vector
from tests.services import Registry
from tests.test_containerd import oci_archive
from tests.test_platform import _containerd_pick, _push_index

OCI = "application/vnd.oci.image.manifest.v1+json"


def _index(entries: list[tuple[dict[str, Any] | None, dict[str, Any]]]) -> tuple[Any, ...]:
    """(top descriptor, index, blobs by digest) of entries (entry platform, config)."""
    blobs: dict[str, dict[str, Any]] = {}

    def put(doc: dict[str, Any]) -> str:
        digest = "sha256:" + sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        blobs[digest] = doc
        return digest

    descs = []
    for i, (platform, config) in enumerate(entries):
        cfg = put({**config, "rootfs": {"diff_ids": [f"sha256:{i:064x}"]}})
        manifest = {"schemaVersion": 2, "mediaType": OCI, "config": {"digest": cfg}, "layers": []}
        desc: dict[str, Any] = {"mediaType": OCI, "digest": put(manifest)}
        if platform is not None:
            desc["platform"] = platform
        descs.append(desc)
    index = {"schemaVersion": 2, "manifests": descs}
    top = {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": put(index)}
    return top, index, blobs


def _choose(
    entries: list[tuple[dict[str, Any] | None, dict[str, Any]]],
    platform: str,
    absent: frozenset[int] = frozenset(),
) -> tuple[int, tuple[str, ...]]:
    top, index, blobs = _index(entries)
    gone = {index["manifests"][i]["digest"] for i in absent}
    picked, also = moby_choose(
        top,
        index,
        platform,
        fetch=lambda d, what: blobs[d["digest"]],
        present=lambda digest: digest in blobs and digest not in gone,
        name="t",
    )
    digests = [d["digest"] for d in index["manifests"]]
    return digests.index(picked.desc["digest"]), also


AMD64 = {"os": "linux", "architecture": "amd64"}
V3 = {**AMD64, "variant": "v3"}
ARM = {"os": "linux", "architecture": "arm64"}
FEATURED = {**AMD64, "os.features": ["f"]}
KINDS: list[tuple[dict[str, Any] | None, dict[str, Any]]] = [
    (None, AMD64),  # no platform, config linux/amd64
    (AMD64, AMD64),
    (None, ARM),
    (ARM, ARM),
]


@pytest.mark.parametrize("order", list(itertools.permutations(range(len(KINDS)))))
def test_first_present_match_in_index_order(order: tuple[int, ...]) -> None:
    """Every order of the four kinds, every subset of them absent: the first present
    entry whose entry platform, else config platform, is linux/amd64."""
    entries = [KINDS[k] for k in order]
    for n in range(len(entries) + 1):
        for absent in itertools.combinations(range(len(entries)), n):
            wanted = [
                i
                for i, (p, c) in enumerate(entries)
                if i not in absent and (p or c)["architecture"] == "amd64"
            ]
            if not wanted:
                with pytest.raises(NoPlatformMatch, match="no image for platform linux/amd64"):
                    _choose(entries, "linux/amd64", frozenset(absent))
                continue
            assert _choose(entries, "linux/amd64", frozenset(absent)) == (wanted[0], ())


def test_host_levels_are_judged_too() -> None:
    """``docker run`` without ``--platform`` on a v3 host prefers the v3 entry
    (``platforms.Only`` of the host); ``--platform linux/amd64`` runs the plain one."""
    assert _choose([(AMD64, AMD64), (V3, V3)], "linux/amd64") == (0, ("linux/amd64/v3",))
    assert _choose([(V3, V3)], "linux/amd64/v3") == (0, ())
    # a v1 host would start the v3 image, which Only(linux/amd64) does not match
    with pytest.raises(NoPlatformMatch, match="on a linux/amd64 host docker run would start"):
        _choose([(V3, V3)], "linux/amd64")


def test_os_features_both_generations() -> None:
    """Older moby (platforms before v1.0.0-rc.3) ignores os.features and runs the
    first entry; newer leaves it out for a request without the feature."""
    assert _choose([(FEATURED, AMD64), (AMD64, AMD64)], "linux/amd64") == (1, ("linux(+f)/amd64",))
    assert _choose([(AMD64, AMD64), (FEATURED, AMD64)], "linux(+f)/amd64") == (1, ("linux/amd64",))


# ------------------------------------- moby's own tables (platform_matchers_test.go)

P = {
    "amd64": AMD64,
    "amd64/v2": {**AMD64, "variant": "v2"},
    "amd64/v3": V3,
    "amd64/v4": {**AMD64, "variant": "v4"},
    "arm/v5": {"os": "linux", "architecture": "arm", "variant": "v5"},
    "arm/v6": {"os": "linux", "architecture": "arm", "variant": "v6"},
    "arm64": {"os": "linux", "architecture": "arm64", "variant": "v8"},
    "windows": {"os": "windows", "architecture": "amd64", "os.version": "10.0.14393"},
}
ARM = {"os": "linux", "architecture": "arm"}
# (host, index, strict: True/False/None for both, requested or None, first or None):
# moby daemon/containerd/platform_matchers_test.go, TestMatcherOnLinuxAmd64v4 and
# TestMatcherOnLinuxArm64v8 (testOnlyAndOnlyStrict: matchRequestedOrDefault with
# platforms.Only or OnlyStrict, the host overridden; the Windows request is left
# out, its OS version is matched only on Windows)
MOBY_TABLES: list[tuple[str, list[str], bool | None, dict[str, str] | None, str | None]] = [
    ("amd64/v4", ["amd64", "amd64/v3"], None, None, "amd64/v3"),
    ("amd64/v4", ["amd64", "amd64/v3"], None, AMD64, "amd64"),
    ("amd64/v4", ["amd64", "amd64/v3"], None, V3, "amd64/v3"),
    ("amd64/v4", ["amd64/v3"], None, None, "amd64/v3"),
    ("amd64/v4", ["amd64/v3"], None, AMD64, None),
    ("amd64/v4", ["amd64/v2", "amd64/v3"], None, None, "amd64/v3"),
    ("amd64/v4", ["amd64/v2", "amd64/v3"], True, P["amd64/v4"], None),
    ("amd64/v4", ["amd64/v2", "amd64/v3"], False, P["amd64/v4"], "amd64/v3"),
    *[
        ("arm64", ["amd64", "arm/v5", "arm/v6", "arm64", "windows"], strict, want, first)
        for strict, want, first in [
            (None, None, "arm64"),
            (None, AMD64, "amd64"),
            (True, ARM, None),
            (False, ARM, "arm/v6"),
            (None, P["arm/v5"], "arm/v5"),
            (True, {**ARM, "variant": "v8"}, None),
            (False, {**ARM, "variant": "v8"}, "arm/v6"),
            (None, {"os": "linux", "architecture": "s390x"}, None),
        ]
    ],
]


@pytest.mark.parametrize(("host", "index", "strict", "requested", "first"), MOBY_TABLES)
def test_the_pick_is_the_one_mobys_tables_name(
    host: str, index: list[str], strict: bool | None, requested: Any, first: str | None
) -> None:
    """:func:`best_present` against each row of moby's tables, with both matcher
    generations where the row has no OS features (they agree there)."""
    found = [
        (
            Picked(desc={"digest": e}, manifest={}, unplaced=False, single=False),
            config_platform(P[e]),
        )
        for e in index
    ]
    for exact in (True, False) if strict is None else (strict,):
        for legacy in (False, True):
            if requested is None:
                order = platform_vector(normalize(config_platform(P[host])))
            else:
                want = normalize(config_platform(requested))
                order = [want] if exact else platform_vector(want)
            got = best_present(found, order, legacy=legacy, match_all=requested is None)
            assert (got[0].desc["digest"] if got else None) == first, (exact, legacy)


def test_docker_run_falls_back_where_no_manifest_is_the_nodes() -> None:
    """No manifest for the node's own platform: ``docker run --platform`` finds
    none (OnlyStrict), ``docker run`` runs what ``platforms.Only(host)`` prefers,
    and that is the one judged (it was refused, exit 2): a lower arm variant, 386 on
    every amd64 level, 32-bit arm on arm64. Another CPU's image is still refused."""
    arm_v6, arm_v7 = P["arm/v6"], {**ARM, "variant": "v7"}
    i386 = {"os": "linux", "architecture": "386"}
    assert _choose([(AMD64, AMD64), (arm_v6, arm_v6)], "linux/arm/v7") == (1, ())
    assert _choose([(P["arm/v5"], P["arm/v5"]), (arm_v6, arm_v6)], "linux/arm/v7") == (1, ())
    assert _choose([(P["arm64"], P["arm64"]), (i386, i386)], "linux/amd64") == (1, ())
    assert _choose([(AMD64, AMD64), (arm_v7, arm_v7)], "linux/arm64") == (1, ())
    assert _choose([(None, arm_v6)], "linux/arm/v7") == (0, ())  # the config's platform
    # an amd64/v2 entry: v1 hosts run 386, v2 and later the v2 entry
    v2 = P["amd64/v2"]
    assert _choose([(i386, i386), (v2, v2)], "linux/amd64") == (0, ("linux/amd64/v2",))
    with pytest.raises(NoPlatformMatch, match="an image for linux/arm/v6"):
        _choose([(arm_v6, arm_v6)], "linux/arm/v5")  # arm/v5 does not run v6
    with pytest.raises(
        NoPlatformMatch, match=re.escape("platforms.Only(linux/arm64) does not match")
    ):
        _choose([(AMD64, AMD64)], "linux/arm64")


def test_os_features_are_counted_as_listed() -> None:
    """``Less`` prefers more OS features by ``len(p1.OSFeatures)`` of the entry as
    listed: a repeated feature counts twice, so [f, f] and [f, g] tie and index
    order decides (the set would put [f, g] first)."""
    twice = {**AMD64, "os.features": ["f", "f"]}
    both = {**AMD64, "os.features": ["f", "g"]}
    assert _choose([(twice, AMD64), (both, AMD64)], "linux(+f+g)/amd64")[0] == 0
    assert _choose([(both, AMD64), (twice, AMD64)], "linux(+f+g)/amd64")[0] == 0


# ------------------------------------------------ against the real containerd

# index orders where the node's own platform is often missing, so fallbacks decide
FALLBACK_ORDERS = {
    "arm-and-386": ["arm/v6", "386", "arm/v5", "amd64/v2"],
    "arm-v7-only": ["arm/v7", "s390x"],
    "v3-then-386": ["amd64/v3", "386", "arm64/v8"],
}
NODES = ["linux/amd64", "linux/amd64/v3", "linux/arm64", "linux/arm/v7", "linux/arm/v6"]


def _strict_pick(socket: str, layout: Path, platform: str, ns: str) -> str | None:
    """The chain ID ``ctr images import --platform P`` unpacks: containerd v1.6
    ``cmd/ctr/commands/images/import.go`` imports and unpacks with
    ``platforms.OnlyStrict(P)``; None where nothing matches."""
    archive = oci_archive(layout, layout.with_suffix(f".{ns}.tar"))
    ctr = ["ctr", "-a", socket, "-n", ns]
    done = subprocess.run(
        [*ctr, "images", "import", "--platform", platform, "--base-name", "bm/s", str(archive)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if done.returncode != 0:
        assert "no match for platform in manifest" in done.stderr, done.stderr
        return None
    listed = subprocess.run(
        [*ctr, "snapshots", "ls"], capture_output=True, text=True, check=True, timeout=60
    )
    keys = {line.split()[0] for line in listed.stdout.splitlines()[1:]}
    assert len(keys) <= 1, keys
    return next(iter(keys), None)


@pytest.mark.integration
@pytest.mark.parametrize("order", sorted(FALLBACK_ORDERS))
def test_each_host_runs_what_containerds_only_unpacks(
    order: str, registry: Registry, containerd_socket: str, tmp_path: Path
) -> None:
    """For a node of P, Docker runs ``OnlyStrict(P)``'s pick (``docker run
    --platform P``) or, without ``--platform``, ``getBestPresentImageManifest``
    under ``platforms.Only(host)``'s order for each host P may be (every manifest
    present, each entry with a platform: the first entry of the earliest
    ``Only(host)`` rank, which containerd's ``images.Manifest`` also takes). The real
    containerd names both: ``ctr images import --platform P`` unpacks OnlyStrict's
    pick, ``ctr images pull --platform HOST`` (every entry fetched first) Only's.
    The manifests judged for P are exactly those, the first being OnlyStrict's, else
    Only(P)'s; where a host's containerd finds none (Docker would start another
    CPU's image there) and OnlyStrict none either, the image is refused."""
    entries = FALLBACK_ORDERS[order]
    ref = _push_index(registry, tmp_path, entries, f"moby-{order}")
    layout = tmp_path / f"moby-{order}"
    top = json.loads((layout / "index.json").read_text())["manifests"][0]
    blobs = layout / "blobs" / "sha256"

    def fetch(desc: Any, what: str) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads((blobs / desc["digest"][7:]).read_text()))

    index = fetch(top, "index")
    chains = {  # manifest digest -> chain ID (its one layer's diff_id)
        d["digest"]: fetch(fetch(d, "m")["config"], "c")["rootfs"]["diff_ids"][0]
        for d in index["manifests"]
    }

    def ours(platform: str) -> tuple[str, tuple[str, ...]]:
        picked, also = moby_choose(top, index, platform, fetch=fetch, present=bool, name="t")
        return chains[str(picked.desc["digest"])], also

    for n, node in enumerate(NODES):
        hosts = [f"{node}/{v}" for v in AMD64_LEVELS] if node == "linux/amd64" else [node]
        ns = f"{order}-{n}"
        strict = _strict_pick(containerd_socket, layout, node, f"{ns}-strict")
        only = [
            _containerd_pick(containerd_socket, ref, h, f"{ns}-{h[6:].replace('/', '-')}")
            for h in hosts
        ]
        if strict is None and None in only:
            with pytest.raises(NoPlatformMatch, match="does not run it natively"):
                ours(node)
            continue
        chosen, also = ours(node)
        assert chosen == (strict or only[0]), node
        judged = {chosen} | {ours(r)[0] for r in also}
        assert judged == {c for c in (strict, *only) if c}, node
