"""A STAND-IN for the kubelet running one round of the admission DaemonSet's container
as a local process, for tests (no kubelet or container runtime can run a Pod here;
tests/test_tool_image.py runs the real image on the engine, in about a minute).

What it reproduces of the kubelet, for the rendered DaemonSet only:

- volumes: a ``configMap`` volume holds one file per key of the ConfigMap's ``data``;
  a ``secret`` volume with ``items`` holds each item's ``key`` (base64-decoded from the
  Secret's ``data``) at its ``path``; a missing Secret, or a missing key, of a volume
  not marked ``optional`` keeps the Pod from starting (Kubernetes
  ``pkg/volume/secret/secret.go``, ``SetUpAt`` and ``MakePayload``); ``emptyDir`` is
  empty;
- mounts: the process sees each volume at its ``mountPath`` (here: every mount path
  in the command and the environment is replaced by the volume's local folder);
- env: plain values, and ``fieldRef: spec.nodeName`` as the node's name;
- the command: ``/bin/sh -c`` with the container's script, one round of its loop.

The ServiceAccount token mount is replaced by ``KUBECONFIG`` (a kubeconfig for the API
stand-in), and the NVIDIA container toolkit's library mounts by ``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.conftest import REPO


class PodWouldNotStart(Exception):
    """The kubelet would leave the Pod in ContainerCreating (a volume cannot be made)."""


def _volume(volume: dict[str, Any], objects: Mapping[str, dict[str, Any]], at: Path) -> None:
    at.mkdir(parents=True)
    if "configMap" in volume:
        found = objects.get(f"ConfigMap/{volume['configMap']['name']}")
        if found is None:
            raise PodWouldNotStart(f"configmap {volume['configMap']['name']} not found")
        for key, text in found["data"].items():
            (at / key).write_text(text)
    elif "secret" in volume:
        name = volume["secret"]["secretName"]
        secret = objects.get(f"Secret/{name}")
        if secret is None:
            raise PodWouldNotStart(f'secret "{name}" not found')
        data = secret.get("data") or {}
        for item in volume["secret"].get("items") or [{"key": k, "path": k} for k in data]:
            if item["key"] not in data:
                raise PodWouldNotStart(f"references non-existent secret key: {item['key']}")
            (at / item["path"]).write_bytes(base64.b64decode(data[item["key"]]))
    elif "emptyDir" not in volume:
        raise NotImplementedError(f"volume kind of {volume}")


def one_round(script: str, *, append: str = "") -> str:
    """One round of the container's loop (``while true; do ROUND; sleep N; done``):
    its smoke command, with ``append`` added to it, then what the loop does after it
    (``--mark-failed`` after a signal), ending with the smoke command's exit status."""
    once = script.removeprefix("while true; do ").split("; sleep")[0]
    first, then, rest = once.partition("; rc=$?")
    end = "; exit $rc" if then else ""
    return f"{first}{' ' + append if append else ''}{then}{rest}{end}"


def run_once(
    daemonset: dict[str, Any],
    *,
    objects: Mapping[str, dict[str, Any]],
    node: str,
    root: Path,
    kubeconfig: Path,
    append: str = "",
    host_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """One round of the DaemonSet's loop on ``node``; ``objects`` by ``Kind/name``;
    ``append`` is added to the smoke command line (``--snapshot FILE``)."""
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    folders = {}
    for volume in pod["volumes"]:
        folders[volume["name"]] = root / "volumes" / volume["name"]
        _volume(volume, objects, folders[volume["name"]])
    mounts = sorted(
        ((m["mountPath"], folders[m["name"]]) for m in container["volumeMounts"]),
        key=lambda m: -len(m[0]),  # /a/b before /a
    )

    where = dict(mounts)
    # a whole path at the start of a word or a value, longest first; one pass, so that
    # a folder put in is not rewritten again (its own path starts with /tmp)
    pattern = re.compile(
        r"(?<![^\s=])(" + "|".join(re.escape(p) for p, _ in mounts) + r")(?=/|\s|$)"
    )

    def local(text: str) -> str:
        return pattern.sub(lambda m: str(where[m.group(1)]), text)

    env = {
        "PATH": f"{_shim(root)}:{os.environ['PATH']}",
        "HOME": str(root / "home"),
        "KUBECONFIG": str(kubeconfig),
        **(host_env or {}),
    }
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = local(e["value"])
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[e["name"]] = node
    shell, flag, script = container["command"]
    assert (shell, flag) == ("/bin/sh", "-c")
    return subprocess.run(
        # ``append`` names files of the test's host side (a checkout under /tmp too):
        # not rewritten into the Pod's volumes
        [shell, flag, one_round(local(script), append=append)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _shim(root: Path) -> Path:
    """``buildmatrix`` on PATH, as the image's entry point: this checkout's package."""
    folder = root / "bin"
    if not folder.exists():
        folder.mkdir(parents=True)
        shim = folder / "buildmatrix"
        shim.write_text(
            f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m buildmatrix "$@"\n'
        )
        shim.chmod(0o755)
    return folder
