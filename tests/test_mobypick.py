"""The manifest Docker Engine runs from containerd's image store (image/mobypick.py),
against moby ``daemon/containerd/image.go`` ``getBestPresentImageManifest`` as its
source reads: present manifests only, index order, config platform for an entry
without one. The real containerd runs in tests/test_engine_containerd.py."""

from __future__ import annotations

import itertools
import json
from hashlib import sha256
from typing import Any

import pytest

from buildmatrix.image.manifests import NoPlatformMatch
from buildmatrix.image.mobypick import moby_choose

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
    with pytest.raises(NoPlatformMatch):
        _choose([(V3, V3)], "linux/amd64")  # OnlyStrict: no fallback, no host guess


def test_os_features_both_generations() -> None:
    """Older moby (platforms before v1.0.0-rc.3) ignores os.features and runs the
    first entry; newer leaves it out for a request without the feature."""
    assert _choose([(FEATURED, AMD64), (AMD64, AMD64)], "linux/amd64") == (1, ("linux(+f)/amd64",))
    assert _choose([(AMD64, AMD64), (FEATURED, AMD64)], "linux(+f)/amd64") == (1, ("linux/amd64",))
