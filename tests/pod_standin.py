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
- the command: ``/bin/sh -c`` with the container's script, one round of its loop
  (:func:`run_once`), or the whole of it until it ends (:func:`run_loop`: a restart
  of the container is another call, which starts with the same ``emptyDir``).

The ServiceAccount token mount is replaced by ``KUBECONFIG`` (a kubeconfig for the API
stand-in), and the NVIDIA container toolkit's library mounts by ``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import REPO


class PodWouldNotStart(Exception):
    """The kubelet would leave the Pod in ContainerCreating (a volume cannot be made)."""


def _volume(volume: dict[str, Any], objects: Mapping[str, dict[str, Any]], at: Path) -> None:
    # a container started again in the same Pod (the same root) keeps its emptyDir
    at.mkdir(parents=True, exist_ok=True)
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
    """One round of the container's loop (``START; while true; do ROUND; sleep N;
    done``): what the container does first, its smoke command with ``append`` added to
    it, then what the loop does after it (``--mark-failed`` after a signal; the end of
    the container when the driver changed), ending with the smoke command's status."""
    start, _, loop = script.partition("while true; do ")
    once = loop.split("; sleep")[0]
    first, then, rest = once.partition("; rc=$?")
    end = "; exit $rc" if then else ""
    return f"{start}{first}{' ' + append if append else ''}{then}{rest}{end}"


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
    return _run(
        daemonset,
        objects=objects,
        node=node,
        root=root,
        kubeconfig=kubeconfig,
        host_env=host_env,
        script=lambda text: one_round(text, append=append),
    )


@dataclass(frozen=True)
class Loop:
    """How the whole loop ran: the shell's answer, and how many rounds it began."""

    proc: subprocess.CompletedProcess[str]
    rounds: int

    @property
    def ended_by_itself(self) -> bool:
        """The loop left ``while true`` on its own (the stand-in ``sleep`` did not
        stop it after the last step)."""
        return self.proc.returncode >= 0


def run_loop(
    daemonset: dict[str, Any],
    *,
    objects: Mapping[str, dict[str, Any]],
    node: str,
    root: Path,
    kubeconfig: Path,
    between: Sequence[str],
    host_env: Mapping[str, str] | None = None,
) -> Loop:
    """The container's whole command, as rendered (the loop and what it does first),
    as one container of it runs until it ends. Time is the stand-in: ``sleep`` (the
    loop's wait for the next round) runs at once the shell step ``between[i]`` after
    round ``i + 1`` (a driver changed, a registry stopped), and after the last round
    of ``between`` ends the loop with SIGTERM, as the kubelet stops a container."""
    steps = root / "steps"  # this container's: a new one starts from the first step
    shutil.rmtree(steps, ignore_errors=True)
    steps.mkdir(parents=True)
    for i, step in enumerate(between, start=1):
        (steps / str(i)).write_text(step + "\n")
    shim = root / "bin" / "sleep"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(
        "#!/bin/sh\n"
        f'n=$(( $(cat "{steps}/count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "{steps}/count"\n'
        f'if [ -e "{steps}/$n" ]; then . "{steps}/$n"; else kill -TERM "$PPID"; fi\n'
    )
    shim.chmod(0o755)
    proc = _run(
        daemonset,
        objects=objects,
        node=node,
        root=root,
        kubeconfig=kubeconfig,
        host_env=host_env,
        script=lambda text: text,
    )
    count = steps / "count"
    waits = int(count.read_text()) if count.exists() else 0
    return Loop(proc=proc, rounds=waits + (1 if proc.returncode >= 0 else 0))


def _run(
    daemonset: dict[str, Any],
    *,
    objects: Mapping[str, dict[str, Any]],
    node: str,
    root: Path,
    kubeconfig: Path,
    host_env: Mapping[str, str] | None,
    script: Callable[[str], str],
) -> subprocess.CompletedProcess[str]:
    """The container's command, made by ``script`` from the rendered one."""
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
    shell, flag, command = container["command"]
    assert (shell, flag) == ("/bin/sh", "-c")
    return subprocess.run(
        # what ``script`` adds names files of the test's host side (a checkout under
        # /tmp too): not rewritten into the Pod's volumes
        [shell, flag, script(local(command))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _shim(root: Path) -> Path:
    """``buildmatrix`` on PATH, as the image's entry point: this checkout's package."""
    folder = root / "bin"
    shim = folder / "buildmatrix"
    if not shim.exists():
        folder.mkdir(parents=True, exist_ok=True)
        shim.write_text(
            f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m buildmatrix "$@"\n'
        )
        shim.chmod(0o755)
    return folder
