"""``buildmatrix k8s gate --engine kyverno``: a Kyverno ``verifyImages`` policy that
admits an image only with a signed ``check --attest`` verdict that passed. Pure.

The other way to gate GPU Pods than the ValidatingAdmissionPolicy of
buildmatrix.k8s_gate: Kyverno (1.13 or newer: ``failureAction`` per rule) fetches the
image's attestations of type :data:`buildmatrix.attest.PREDICATE_TYPE`, verifies their
keyless signature (the CI workflow's identity, as ``cosign attest`` made it) and
evaluates ``conditions`` over the predicate (kyverno.io/docs/policy-types/
cluster-policy/verify-images, "Verifying Image Attestations": the conditions' keys are
JMESPath over the predicate). ``verifyDigest`` refuses images not pinned by digest.

Kyverno matches images by reference pattern, not by what the container asks for, so
the policy covers every image under the given patterns (GPU or not); the attestation
says where an image runs, the VAP gate holds each Pod to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from buildmatrix.attest import PREDICATE_TYPE

GITHUB_ISSUER = "https://token.actions.githubusercontent.com"


def policy(
    *,
    name: str,
    images: Sequence[str],
    subject: str,
    issuer: str,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """The ClusterPolicy (kyverno.io/v1): every Pod image under ``images`` must carry an
    attestation signed keylessly by ``subject`` (the workflow's identity) at ``issuer``,
    whose predicate's verdict is ``pass``."""
    return {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "webhookTimeoutSeconds": 30,
            "background": False,
            "rules": [
                {
                    "name": "check-verdict",
                    "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "verifyImages": [
                        {
                            "imageReferences": list(images),
                            "failureAction": "Enforce",
                            "mutateDigest": False,
                            "verifyDigest": True,
                            "required": True,
                            "attestations": [
                                {
                                    "type": PREDICATE_TYPE,
                                    "attestors": [
                                        {
                                            "entries": [
                                                {"keyless": {"subject": subject, "issuer": issuer}}
                                            ]
                                        }
                                    ],
                                    "conditions": [
                                        {
                                            "all": [
                                                {
                                                    "key": "{{ verdict }}",
                                                    "operator": "Equals",
                                                    "value": "pass",
                                                    "message": "buildmatrix check did not pass "
                                                    "this image",
                                                }
                                            ]
                                        }
                                    ],
                                }
                            ],
                        }
                    ],
                }
            ],
        },
    }
