"""Stand-ins for what the build workflow's push path runs and the test machines lack
(docs/development.md: the test engine has no buildx), writing to the tests' real
registry (tests/services.py) what the real tools write there:

- :func:`push_by_digest`: docker/build-push-action with ``push-by-digest=true``,
  ``sbom: true`` and ``provenance: mode=max``: the image, and beside it an attestation
  manifest (an in-toto SBOM and provenance), joined by an index pushed untagged; its
  digest is the action's ``digest`` output; ``manifest:`` annotations go on the
  image manifest (docker docs, "Annotations", build-push-action's ``annotations``
  input). The index's shape is buildx's
  (docker/buildx ``docs/reference/buildx_history_inspect_attachment.md``, "Index":
  the attestation entry has platform ``unknown/unknown`` and the annotations
  ``vnd.docker.reference.type: attestation-manifest`` and
  ``vnd.docker.reference.digest``, the image manifest it is about).
- ``python -m tests.buildx_standin buildx imagetools create|inspect``: the two
  ``docker buildx imagetools`` commands the promote job runs, as docker/buildx
  ``util/imagetools/create.go`` (``Resolver.combine``) and ``printers.go``
  (``Printer.Print``, ``--raw``) do them: one index source without ``--annotation`` is
  pushed as its own bytes; otherwise the sources are flattened into one index of
  their entries (each digest once), ``index:`` annotations on it
  (``util/buildflags/export.go``, ``ParseAnnotations``), written by Go's
  ``json.MarshalIndent(index, "", "  ")`` (map keys sorted); ``--raw`` prints the
  stored bytes with no newline added.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

if TYPE_CHECKING:  # the promote job runs this module as docker, once per call
    from tests.images import Image

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
IN_TOTO = "application/vnd.in-toto+json"
_ACCEPT = ", ".join(
    [
        OCI_INDEX,
        OCI_MANIFEST,
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _split(ref: str) -> tuple[str, str, str]:
    """``HOST/REPO@DIGEST`` or ``HOST/REPO:TAG`` -> (host, repository, reference)."""
    if "@" in ref:
        name, reference = ref.split("@", 1)
    else:
        slash = ref.rfind("/")
        colon = ref.rfind(":")
        if colon <= slash:
            raise SystemExit(f"stand-in: no tag or digest in {ref}")
        name, reference = ref[:colon], ref[colon + 1 :]
    host, _, repository = name.partition("/")
    return host, repository, reference


def _request(
    method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> Any:
    req = urllib.request.Request(url, data=body or None, method=method, headers=headers or {})
    return urllib.request.urlopen(req, timeout=30)


def push_blob(host: str, repository: str, data: bytes) -> dict[str, Any]:
    """The blob uploaded (POST, then PUT with its digest: the distribution spec's
    monolithic upload); its descriptor without a media type."""
    digest = _sha(data)
    with _request("POST", f"http://{host}/v2/{repository}/blobs/uploads/") as r:
        location = r.headers["Location"]
    if location.startswith("/"):
        location = f"http://{host}{location}"
    sep = "&" if "?" in location else "?"
    with _request(
        "PUT", f"{location}{sep}digest={digest}", data, {"Content-Type": "application/octet-stream"}
    ):
        pass
    return {"digest": digest, "size": len(data)}


def put_manifest(host: str, repository: str, reference: str, body: bytes, media_type: str) -> str:
    with _request(
        "PUT",
        f"http://{host}/v2/{repository}/manifests/{reference}",
        body,
        {"Content-Type": media_type},
    ):
        pass
    return _sha(body)


def get_manifest(host: str, repository: str, reference: str) -> tuple[bytes, str] | None:
    """The stored bytes and media type, or None where the registry has none (404)."""
    try:
        with _request(
            "GET",
            f"http://{host}/v2/{repository}/manifests/{reference}",
            headers={"Accept": _ACCEPT},
        ) as r:
            return r.read(), str(r.headers["Content-Type"])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def _manifest(
    host: str,
    repository: str,
    config: bytes,
    layers: list[tuple[bytes, str, dict[str, str]]],
    annotations: dict[str, str] | None = None,
) -> bytes:
    descs = []
    for data, media_type, notes in layers:
        desc = {"mediaType": media_type, **push_blob(host, repository, data)}
        if notes:
            desc["annotations"] = notes
        descs.append(desc)
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, **push_blob(host, repository, config)},
        "layers": descs,
    }
    if annotations:
        doc["annotations"] = dict(sorted(annotations.items()))
    return json.dumps(doc).encode()


@dataclass(frozen=True, kw_only=True)
class Pushed:
    index: str  # the action's `digest` output: the index of image and attestations
    manifest: str  # the image manifest in it, the one a node of its platform pulls
    attestation: str


def push_by_digest(
    host: str, repository: str, image: Image, annotations: dict[str, str] | None = None
) -> Pushed:
    """``image`` pushed as build-push-action pushes it by digest with an SBOM and
    provenance attached, ``annotations`` on its manifest: nothing is tagged."""
    from tests.images import layer_tar

    tars = [layer_tar(layer) for layer in image.layers]
    image_body = _manifest(
        host,
        repository,
        image.config([_sha(t) for t in tars]),
        [(t, "application/vnd.oci.image.layer.v1.tar", {}) for t in tars],
        annotations,
    )
    manifest = put_manifest(host, repository, _sha(image_body), image_body, OCI_MANIFEST)
    subject = [{"name": f"pkg:docker/{repository}", "digest": {"sha256": manifest.split(":")[1]}}]
    statements = [
        (
            predicate,
            json.dumps(
                {
                    "_type": "https://in-toto.io/Statement/v0.1",
                    "predicateType": predicate,
                    "subject": subject,
                    "predicate": {},
                }
            ).encode(),
        )
        for predicate in ("https://spdx.dev/Document", "https://slsa.dev/provenance/v0.2")
    ]
    config = json.dumps(
        {
            "architecture": "unknown",
            "os": "unknown",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [_sha(s) for _, s in statements]},
        }
    ).encode()
    att_body = _manifest(
        host,
        repository,
        config,
        [(s, IN_TOTO, {"in-toto.io/predicate-type": p}) for p, s in statements],
    )
    attestation = put_manifest(host, repository, _sha(att_body), att_body, OCI_MANIFEST)
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {
                "mediaType": OCI_MANIFEST,
                "digest": manifest,
                "size": len(image_body),
                "platform": image.platform,
            },
            {
                "mediaType": OCI_MANIFEST,
                "digest": attestation,
                "size": len(att_body),
                "annotations": {
                    "vnd.docker.reference.digest": manifest,
                    "vnd.docker.reference.type": "attestation-manifest",
                },
                "platform": {"architecture": "unknown", "os": "unknown"},
            },
        ],
    }
    body = json.dumps(index, indent=2).encode()
    return Pushed(
        index=put_manifest(host, repository, _sha(body), body, OCI_INDEX),
        manifest=manifest,
        attestation=attestation,
    )


def combine(sources: list[str], annotations: dict[str, str] | None = None) -> tuple[bytes, str]:
    """buildx ``Resolver.combine`` over ``HOST/REPO@DIGEST`` or ``HOST/REPO:TAG``
    sources, ``annotations`` (index level) on the index."""
    fetched = []
    for src in sources:
        host, repository, reference = _split(src)
        got = get_manifest(host, repository, reference)
        if got is None:
            raise SystemExit(f"ERROR: {src}: not found")
        fetched.append((host, repository, *got))
    if len(fetched) == 1 and fetched[0][3] == OCI_INDEX and not annotations:
        return fetched[0][2], OCI_INDEX  # "on single source, return original bytes"
    descs: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for host, repository, body, media_type in fetched:
        doc = json.loads(body)
        if media_type == OCI_INDEX:
            entries = doc["manifests"]
        else:  # a lone manifest: its platform from its config (loadPlatform)
            with _request(
                "GET", f"http://{host}/v2/{repository}/blobs/{doc['config']['digest']}"
            ) as r:
                cfg = json.loads(r.read())
            platform = {"architecture": cfg["architecture"], "os": cfg["os"]}
            entries = [
                {
                    "mediaType": media_type,
                    "digest": _sha(body),
                    "size": len(body),
                    "platform": platform,
                }
            ]
        for d in entries:
            if d["digest"] in seen:
                old = descs[seen[d["digest"]]]
                old.setdefault("annotations", {}).update(d.get("annotations") or {})
                continue
            seen[d["digest"]] = len(descs)
            descs.append(d)
    order = (
        "mediaType",
        "digest",
        "size",
        "urls",
        "annotations",
        "data",
        "platform",
        "artifactType",
    )
    descs = [{k: d[k] for k in order if k in d} for d in descs]
    index: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": descs}
    if annotations:
        index["annotations"] = dict(sorted(annotations.items()))
    return json.dumps(index, indent=2).encode(), OCI_INDEX


def main(argv: list[str], out: BinaryIO | None = None, err: TextIO | None = None) -> int:
    """``docker ARGV``: the exit status; what it prints goes to ``out`` and ``err``
    (default: this process's stdout and stderr). A refusal deeper down raises
    SystemExit with its message, as the process exits with it."""
    out = out if out is not None else sys.stdout.buffer
    err = err if err is not None else sys.stderr
    if argv[:3] == ["buildx", "imagetools", "create"]:
        tags, sources, args = [], [], argv[3:]
        notes: dict[str, str] = {}
        while args:
            arg = args.pop(0)
            if arg in ("--tag", "-t"):
                tags.append(args.pop(0))
            elif arg == "--annotation":
                level, _, note = args.pop(0).partition(":")
                if level != "index":
                    print(f"stand-in: annotation level {level} is not stood in for", file=err)
                    return 2
                key, _, value = note.partition("=")
                notes[key] = value
            else:
                sources.append(arg)
        if not tags:
            print(
                "ERROR: can't push with no tags specified, please set --tag or --dry-run",
                file=err,
            )
            return 1
        body, media_type = combine(sources, notes)
        for tag in tags:
            host, repository, reference = _split(tag)
            put_manifest(host, repository, reference, body, media_type)
        return 0
    if argv[:4] == ["buildx", "imagetools", "inspect", "--raw"] and len(argv) == 5:
        got = get_manifest(*_split(argv[4]))
        if got is None:
            print(f"ERROR: {argv[4]}: not found", file=err)
            return 1
        out.write(got[0])
        return 0
    print(f"stand-in: docker {' '.join(argv)} is not stood in for", file=err)
    return 2


def called(argv: list[str]) -> tuple[int, bytes, str]:
    """:func:`main` as a process would end it: (exit status, stdout, stderr), a
    SystemExit's message, or an uncaught exception's traceback, on stderr with status 1
    (Python's own handling of them)."""
    out, err = io.BytesIO(), io.StringIO()
    try:
        status = main(argv, out, err)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=err)
            status = 1
    except Exception:  # an uncaught error: the traceback, status 1
        traceback.print_exc(file=err)
        status = 1
    return status, out.getvalue(), err.getvalue()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
