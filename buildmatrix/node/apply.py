"""``smoke --apply``: write the verdict onto the Node object through the API server.

The only Kubernetes API I/O. With the official ``kubernetes`` client, in-cluster
credentials (the DaemonSet's ServiceAccount) or a kubeconfig:

- on pass: the labels are set, buildmatrix-owned labels an earlier run left (a pool
  that changed) are removed, and the admission taint
  ``buildmatrix.io/unverified:NoSchedule`` (or ``--taint-key``'s) is removed;
- on fail: the taint is kept (or added), the labels become ``buildmatrix.io/smoke=
  failed`` alone, and the annotation ``buildmatrix.io/smoke-report`` says why;
- nothing else is touched: not other taints, not other controllers' labels
  (buildmatrix.labelkeys.owned), and not GPU Feature Discovery's keys where GFD
  labels the node (``--gfd-keys auto``, the default: GFD's timestamp label is on the
  Node; ``never``/``--no-gfd-keys``: always left to GFD), on pass or fail alike.

Labels and annotations are map keys, merged one by one by a strategic merge patch.
``spec.taints`` is one list, replaced whole by a patch, so a read-modify-write could
drop a taint another controller added in between: the patch carries the
``metadata.resourceVersion`` it was computed from, the API server refuses it with 409
Conflict if the node changed, and the change is recomputed from a fresh read, a few
times at most (as Kubernetes' own taint helpers do: ``PatchNodeTaints``). The patch
itself is computed in node/patch.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from buildmatrix.errors import EnvironmentUnavailable, InputError
from buildmatrix.labelkeys import TAINT_KEY, GfdKeys
from buildmatrix.node.hold import Transient
from buildmatrix.node.patch import MAX_REPORT, Applied, plan, report_text

__all__ = ["MAX_REPORT", "Applied", "Conflict", "NodeApi", "apply", "plan", "report_text"]
MAX_ATTEMPTS = 5
SMP = "application/strategic-merge-patch+json"
_TIMEOUT = 15  # seconds per request


class NodeApi:
    """GET and PATCH of one Node through the official client."""

    def __init__(self, kubeconfig: Path | None) -> None:
        try:
            import yaml
            from kubernetes import client, config
        except ImportError:  # pragma: no cover - a dependency of buildmatrix
            raise EnvironmentUnavailable(
                "the kubernetes client is not installed: pip install kubernetes."
            ) from None
        cfg = client.Configuration()
        try:
            if kubeconfig is None and _in_cluster():
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
                self.where = "in-cluster ServiceAccount"
            else:
                if kubeconfig is not None and not kubeconfig.is_file():
                    raise InputError(f"--kubeconfig {kubeconfig}: no such file.")
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=str(kubeconfig) if kubeconfig else None, client_configuration=cfg
                )
                self.where = f"kubeconfig {kubeconfig or '~/.kube/config'}"
        except (yaml.YAMLError, TypeError, ValueError, AttributeError, KeyError) as exc:
            # a kubeconfig that is not YAML, or YAML of the wrong shape: the client
            # raises these from inside its loader
            raise InputError(
                f"--kubeconfig {kubeconfig or '~/.kube/config'}: not a valid kubeconfig "
                f"({type(exc).__name__}: {str(exc)[:200]}); write it as kubectl does "
                "(kubectl config view --raw)."
            ) from None
        except config.ConfigException as exc:
            raise EnvironmentUnavailable(
                f"no Kubernetes credentials ({exc}): run in the cluster with a "
                "ServiceAccount, or pass --kubeconfig FILE."
            ) from None
        cfg.retries = 1  # a down API server is reported, not waited for
        # the CA file the loader set (certificate-authority-data is written to one)
        self._ca: str | None = cfg.ssl_ca_cert
        self._client = client.ApiClient(cfg)
        self._exception = client.ApiException
        # kubernetes >= 37 (OpenAPI Generator 7) imports each API and model on first
        # use, and CoreV1Api's module imports the models of every core resource: 0.65 s
        # of CPU at each start of the agent (docs/kubernetes.md, "The agent's start").
        # There the two requests are built and sent as the generated read_node and
        # patch_node do, through ApiClient.param_serialize and call_api (the same
        # credentials, TLS, path quoting and JSON body). Before 37 the package imports
        # every model anyway, and CoreV1Api is used.
        self._core: Any = None
        if not hasattr(self._client, "param_serialize"):
            self._core = client.CoreV1Api(self._client)

    def get(self, name: str) -> dict[str, Any]:
        return self._call("GET", name, None)

    def patch(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", name, body)

    def _send(self, method: str, name: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        """(status, body) of the answer; ApiException where the client raises it."""
        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": _TIMEOUT}
        if self._core is not None:  # kubernetes < 37: non-2xx raise ApiException
            if body is None:
                answer = self._core.read_node(name, **options)
            else:
                answer = self._core.patch_node(name, body, _content_type=SMP, **options)
            return answer.status, answer.data
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = SMP
        request = self._client.param_serialize(
            method=method,
            resource_path="/api/v1/nodes/{name}",
            path_params={"name": name},
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._client.call_api(*request, _request_timeout=_TIMEOUT)
        return response.status, response.read()  # type: ignore[no-untyped-call]

    def _call(self, method: str, name: str, body: dict[str, Any] | None) -> dict[str, Any]:
        import urllib3

        verb = method.lower()
        try:
            status, data = self._send(method, name, body)
        except self._exception as exc:
            if not exc.status:  # the client's refusal before an answer (TLS: status 0)
                raise EnvironmentUnavailable(
                    f"the Kubernetes API server cannot be reached ({self.where}): {exc.reason}."
                ) from None
            status, data = exc.status, exc.body
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            hint = ""
            text = str(exc).lower()
            if "certificate_verify_failed" in text and any(
                why in text for why in ("issuer certificate", "self-signed", "self signed")
            ):
                trusted = f"the CA in {self._ca}" if self._ca else "the system's trust store"
                hint = (
                    f" The server's certificate is not signed by a CA the client trusts "
                    f"({trusted}): the kubeconfig's certificate-authority or "
                    "certificate-authority-data, or in the cluster the ServiceAccount's "
                    "ca.crt, must name the API server's CA."
                )
            raise EnvironmentUnavailable(
                f"the Kubernetes API server cannot be reached ({self.where}): {exc}.{hint}"
            ) from None
        if status == 409:
            raise Conflict
        if not 200 <= status <= 299:
            raise EnvironmentUnavailable(_api_error(verb, name, status, data))
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise EnvironmentUnavailable(
                f"the Kubernetes API server answered {verb} node {name!r} with "
                f"{str(data)[:200]}, not a JSON object."
            )
        wrong = _not_the_node(doc, name)
        if wrong:
            # a proxy or another server answering 200: nothing it says is the Node's
            # state, and a verdict applied to it would be applied to nothing
            raise EnvironmentUnavailable(
                f"the Kubernetes API server answered {verb} node {name!r} with an object "
                f"that is not that Node ({wrong}); nothing was changed on it "
                f"({self.where})."
            )
        return doc


def _not_the_node(doc: Mapping[str, Any], name: str) -> str:
    """Why ``doc`` is not the Node ``name`` as the API server returns it (TypeMeta
    ``kind: Node``, ``metadata.name``, labels and annotations maps of strings,
    ``spec.taints`` a list of objects); empty where it is."""
    meta = doc.get("metadata")
    if doc.get("kind") != "Node":
        return f"kind {doc.get('kind')!r}"
    if not isinstance(meta, dict) or meta.get("name") != name:
        return f"metadata.name {meta.get('name') if isinstance(meta, dict) else None!r}"
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is not None and not (
            isinstance(value, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        ):
            return f"metadata.{key} is not a map of strings"
    spec = doc.get("spec")
    if spec is not None and not isinstance(spec, dict):
        return "spec is not an object"
    taints = (spec or {}).get("taints")
    if taints is not None and not (
        isinstance(taints, list) and all(isinstance(t, dict) for t in taints)
    ):
        return "spec.taints is not a list of taints"
    return ""


class Conflict(EnvironmentUnavailable):
    """409: the node changed since it was read (:func:`apply` reads it again)."""


def _in_cluster() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ


def _api_error(verb: str, name: str, status: int | None, body: Any) -> str:
    message = ""
    try:
        message = json.loads(body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        message = str(body or "")[:300]
    if status == 401:
        return f"the Kubernetes API server refused the credentials (401): {message}"
    if status == 403 and "ValidatingAdmissionPolicy" in message:
        return (
            f"the cluster's admission policy refused to {verb} node {name!r} (403): "
            f"{message}. The agent may change only its own node, the labels buildmatrix "
            "owns and its taint (docs/kubernetes.md, Security); the node stays as it was"
        )
    if status == 403:
        return (
            f"not allowed to {verb} nodes (403): {message}. The ServiceAccount needs a "
            "ClusterRole with verbs get and patch on nodes (buildmatrix k8s manifests "
            "writes it); the node stays as it was"
        )
    if status == 404:
        return f"node {name!r} does not exist (404); pass --node with the Node's name"
    return f"the Kubernetes API server answered {status} to {verb} node {name!r}: {message}"


def apply(
    api: NodeApi,
    name: str,
    *,
    passed: bool,
    labels: Mapping[str, str],
    failures: Sequence[str],
    gfd_keys: GfdKeys,
    taint_key: str = TAINT_KEY,
    transient: Transient | None = None,
) -> Applied:
    """Bring the Node to the verdict; retried on 409 Conflict, MAX_ATTEMPTS at most."""
    report = report_text(failures)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        node = api.get(name)
        body, applied = plan(
            node,
            passed=passed,
            labels=labels,
            report=report,
            gfd_keys=gfd_keys,
            taint_key=taint_key,
            transient=transient,
        )
        if body:
            try:
                api.patch(name, body)
            except Conflict:
                continue
        return Applied(
            node=name,
            labels_set=applied.labels_set,
            labels_removed=applied.labels_removed,
            taint=applied.taint,
            attempts=attempt,
            gfd_keys=applied.gfd_keys,
            held=applied.held,
        )
    raise EnvironmentUnavailable(
        f"node {name!r} changed under every one of {MAX_ATTEMPTS} attempts to update it "
        "(409 Conflict each time); nothing was written. Run smoke again."
    )
