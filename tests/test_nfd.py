"""buildmatrix.node.nfd: the local feature file and the ``NodeFeature`` object, held to
Node Feature Discovery's own rules.

- The feature file is read back by the NFD stand-in's parser (tests/nfd_standin.py),
  which follows ``source/local/local.go`` ``parseFeatureFile`` of
  kubernetes-sigs/node-feature-discovery (v0.20); the size limit is that file's
  ``MaxFeatureFileSize`` and ``getFeaturesFromFiles`` skips names that start with ".".
- The ``NodeFeature`` object is validated against NFD's own CRD schema
  (tests/fixtures/crds/nfd.k8s-sigs.io_nodefeatures.yaml, copied unchanged from
  ``deployment/base/nfd-crds/nfd-api-crds.yaml``); the node-name label is
  ``NodeFeatureObjNodeNameLabel`` of ``api/nfd/v1alpha1/annotations_labels.go``.
"""

from __future__ import annotations

import functools
import re
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from buildmatrix.errors import InputError
from buildmatrix.node.nfd import MAX_FEATURE_FILE, feature_file, node_feature, write_atomically
from tests.conftest import REPO, validate
from tests.nfd_standin import parse_feature_file

CRD = REPO / "tests" / "fixtures" / "crds" / "nfd.k8s-sigs.io_nodefeatures.yaml"
NFD_MAX_FEATURE_FILE_SIZE = 65536  # source/local/local.go: MaxFeatureFileSize
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"  # NodeFeatureObjNodeNameLabel

# Label keys and values as Kubernetes allows them (apimachinery validation.go:
# IsQualifiedName, IsValidLabelValue), drawn from a small alphabet.
_NAME = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,10}[a-z0-9])?", fullmatch=True)
_KEY = st.builds(lambda p, n: f"{p}/{n}" if p else n, st.sampled_from(["", "nvidia.com"]), _NAME)
_VALUE = st.from_regex(r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,20}[A-Za-z0-9])?)?", fullmatch=True)
LABELS = st.dictionaries(_KEY, _VALUE, max_size=12)
# A Node's name is a DNS-1123 subdomain (Kubernetes ValidateNodeName ->
# IsDNS1123Subdomain): dot-separated labels, no empty one.
_NODE = st.from_regex(
    r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?){0,2}",
    fullmatch=True,
)
NOW = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
)
TTL = st.timedeltas(min_value=timedelta(seconds=2), max_value=timedelta(days=30))


@settings(max_examples=200, deadline=None)
@given(labels=LABELS, now=NOW, ttl=TTL)
def test_nfd_reads_back_the_labels_until_they_expire(
    labels: dict[str, str], now: datetime, ttl: timedelta
) -> None:
    text = feature_file(labels, now=now, ttl=ttl)
    assert len(text.encode()) <= NFD_MAX_FEATURE_FILE_SIZE
    # Read by NFD a moment later, and just before the TTL runs out: every label.
    assert parse_feature_file(text, now=now) == labels
    assert parse_feature_file(text, now=now + ttl - timedelta(seconds=1)) == labels
    # After it, none: a node whose smoke stopped running loses its admission labels.
    assert parse_feature_file(text, now=now + ttl + timedelta(seconds=1)) == {}


def test_the_size_limit_is_nfds() -> None:
    assert MAX_FEATURE_FILE == NFD_MAX_FEATURE_FILE_SIZE


def test_the_file_replaces_the_old_one_and_leaves_no_file_nfd_would_read(
    tmp_path: Path,
) -> None:
    features = tmp_path / "features.d"
    features.mkdir()
    target = features / "buildmatrix"
    now = datetime(2026, 12, 1, tzinfo=UTC)
    write_atomically(target, feature_file({"a": "1"}, now=now, ttl=timedelta(hours=1)))
    write_atomically(target, feature_file({"b": "2"}, now=now, ttl=timedelta(hours=1)))
    # NFD reads every file of the folder whose name does not start with "."
    # (getFeaturesFromFiles): only ours, holding only the second run's labels.
    # No temporary file is left behind, not even a dot file.
    assert sorted(p.name for p in features.iterdir()) == ["buildmatrix"]
    assert parse_feature_file(target.read_text(), now=now) == {"b": "2"}
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_a_missing_folder_is_bad_input_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"--nfd-file .*features\.d"):
        write_atomically(tmp_path / "absent" / "buildmatrix", "x=1\n")


@functools.cache
def _schema() -> dict[str, Any]:
    """NFD's schema, read once: the examples below only read it (jsonschema does not
    change a schema it validates against)."""
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "NodeFeature"
    (version,) = crd["spec"]["versions"]
    assert f"{crd['spec']['group']}/{version['name']}" == "nfd.k8s-sigs.io/v1alpha1"
    return dict(version["schema"]["openAPIV3Schema"])


@settings(max_examples=100, deadline=None)
@given(labels=LABELS, node=_NODE)
def test_node_feature_is_valid_for_nfds_crd(labels: dict[str, str], node: str) -> None:
    obj = node_feature(labels, node=node, namespace="node-feature-discovery")
    validate(obj, _schema())
    assert obj["kind"] == "NodeFeature" and obj["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1"
    assert obj["spec"]["labels"] == labels
    assert obj["metadata"]["labels"] == {NODE_NAME_LABEL: node}
    # The object name is a DNS subdomain (apimachinery IsDNS1123Subdomain).
    name = obj["metadata"]["name"]
    assert len(name) <= 253
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name)


def test_the_crd_schema_refuses_what_nfd_refuses() -> None:
    """The oracle can fail: labels that are not strings are refused by the schema."""
    obj = node_feature({"a": "1"}, node="n", namespace="x")
    obj["spec"]["labels"] = {"a": 1}
    with pytest.raises(jsonschema.ValidationError):
        validate(obj, _schema())
