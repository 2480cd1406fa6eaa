"""``check --attest FILE``: the verdicts as an in-toto Statement v1. Pure: results in,
a JSON document out.

The Statement layout is the in-toto attestation framework's (github.com/in-toto/
attestation, ``spec/v1/statement.md``): ``_type`` ``https://in-toto.io/Statement/v1``,
``subject`` (ResourceDescriptors: a ``name`` and a ``digest`` map of algorithm to hex),
``predicateType`` and ``predicate``. The subject is what ``check`` judged: each
manifest digest, and the index digest where the image was read through one
(``check --json``'s ``digest`` and ``index_digest``), named by the image's repository
without tag or digest. The predicate (:data:`PREDICATE_TYPE`, its JSON Schema in
``buildmatrix/schemas/check-predicate.schema.json``) carries per judged platform and
target GPU the verdict, ``driver_ok`` and the two driver floors ``check`` applies, the
CUDA runtime found, a digest of the profiles, the tool's version and the time.

``cosign attest --predicate FILE`` takes a predicate, not a Statement, and makes the
Statement itself with the digest it signs as subject; the workflow therefore hands it
``.predicate`` of this file (docs/placement.md, "The signed verdict").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from buildmatrix.check import CheckResult
from buildmatrix.cuda import CudaFacts
from buildmatrix.errors import InputError
from buildmatrix.image.ref import parse_ref
from buildmatrix.multiplatform import PlatformResults
from buildmatrix.profiles import ProfileSet
from buildmatrix.target_verdict import TargetResult

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://buildmatrix.io/check/v1"


def profiles_digest(profiles: ProfileSet) -> str:
    """sha256 over the profiles' canonical JSON (``profiles --format json``'s objects,
    keys sorted, no blanks): the same profiles give the same digest wherever read."""
    text = json.dumps(
        [p.to_json() for p in profiles], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _subject_name(ref: str) -> str:
    """The image reference without tag or digest: ``host/repository`` for an image
    named so, the path for a layout or archive."""
    parsed = parse_ref(ref)
    if parsed.repository:
        return f"{parsed.host}/{parsed.repository}" if parsed.host else parsed.repository
    return str(parsed.path) if parsed.path is not None else ref


def _descriptor(name: str, digest: str) -> dict[str, Any]:
    algorithm, _, hexa = digest.partition(":")
    return {"name": name, "digest": {algorithm: hexa}}


def subjects(judged: PlatformResults) -> list[dict[str, Any]]:
    """The digests judged, index first; an entry without a digest (a folder, a single
    file) is refused: an attestation must name the artifact it is about."""
    primary = judged.primary
    missing = [p for p, r in judged.results if not r.image.digest]
    if missing:
        raise InputError(
            f"--attest: {primary.image.ref} has no digest ({', '.join(missing)}): a folder or "
            "a single file is no artifact an attestation can name. Check the image as it is "
            "pushed (docker://HOST/NAME@sha256:...) or stored (oci:PATH, docker-archive:PATH, "
            "docker-daemon:NAME), then attest that."
        )
    name = _subject_name(primary.image.ref)
    digests = [primary.image.index_digest] if primary.image.index_digest else []
    digests += [r.image.digest for _, r in judged.results if r.image.digest]
    return [_descriptor(name, d) for d in dict.fromkeys(digests)]


def _target(t: TargetResult, result: CheckResult, facts: CudaFacts) -> dict[str, Any]:
    runtime = result.cuda_runtime
    floor = facts.runtime_floor(runtime[0].major) if runtime is not None else None
    hardware = t.target.hardware_floor
    return {
        "name": t.target.name,
        "sm": t.sm,
        "compute_capability": str(t.target.cc),
        "verdict": t.verdict.value,
        "driver_ok": t.driver_ok,
        "driver_floor": {
            # minor version compatibility: the runtime major's floor (compat.driver_floors)
            "runtime": floor.text if floor is not None else None,
            "hardware": hardware[0].text if hardware is not None else None,
        },
    }


def _platform(platform: str, result: CheckResult, facts: CudaFacts) -> dict[str, Any]:
    runtime = result.to_json()["cuda_runtime"]
    return {
        "platform": platform,
        "digest": result.image.digest,
        "verdict": "pass" if result.passed else "fail",
        "cuda_runtime": runtime,
        "driver": str(result.driver) if result.driver else None,
        "targets": [_target(t, result, facts) for t in result.targets],
    }


def predicate(
    judged: PlatformResults,
    *,
    facts: CudaFacts,
    profiles: ProfileSet,
    version: str,
    time: str,
) -> dict[str, Any]:
    """The check's predicate: the verdict over every judged platform, then each."""
    return {
        "verdict": "pass" if judged.passed else "fail",
        "image": judged.primary.image.ref,
        "index_digest": judged.primary.image.index_digest,
        "platforms": [_platform(p, r, facts) for p, r in judged.results],
        "profiles": {"digest": {"sha256": profiles_digest(profiles)}},
        "tool": {"name": "buildmatrix", "version": version},
        "time": time,
    }


def require_one(count: int) -> None:
    """Several images are refused: their predicates differ (each names its own verdicts
    and digests), and one Statement states one predicate of all its subjects; ``cosign
    attest`` attaches one per image too."""
    if count != 1:
        raise InputError(
            f"--attest: {count} images given; an attestation states one verdict about "
            "one image. Run check --attest FILE once per image."
        )


def statement(
    runs: Sequence[PlatformResults],
    *,
    facts: CudaFacts,
    profiles: ProfileSet,
    version: str,
    time: str,
) -> dict[str, Any]:
    """One Statement for one image (:func:`require_one`)."""
    require_one(len(runs))
    (judged,) = runs
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects(judged),
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate(judged, facts=facts, profiles=profiles, version=version, time=time),
    }
