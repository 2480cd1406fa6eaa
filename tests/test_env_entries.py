"""An image's ``Env`` as the engine applies it: an entry without ``=`` (``KEY``) unsets
only a default the engine itself sets (``PATH``, ``HOSTNAME``, ``TERM``), never a value
an earlier entry of the image gave: moby ``container/env.go``
``ReplaceOrAppendEnvValues`` and containerd ``oci/spec_opts.go``
``replaceOrAppendEnvValues`` (used by its CRI plugin for Kubernetes) look the key up in
the defaults only. So ``["LD_PRELOAD=/x", "LD_PRELOAD"]`` runs with ``LD_PRELOAD=/x``.

Held to a real Docker engine (tests/services.py) running glibc's loader on the image,
as tests/test_loader_order.py does."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from buildmatrix.cli import main
from tests.images import Entry, Symlink, layer_tar, write_archive_blobs
from tests.test_ldconfig import DIR, LOADER, ROOTED, _place, _real, kit
from tests.test_loader_order import APP, COMPAT_LIB, NODE, NODE_LIB, START_C, STUB

__all__ = ["kit"]
pytestmark = pytest.mark.skipif(not ROOTED, reason="gcc builds the stand-ins")

CASES = [
    # (the image's Env entries after PATH, what glibc maps in the container, check's code)
    (["LD_PRELOAD=/usr/local/cuda/compat/libcuda.so.1", "LD_PRELOAD"], COMPAT_LIB, 1),
    (["LD_PRELOAD=/usr/local/cuda/compat/libcuda.so.1", "LD_PRELOAD="], NODE_LIB, 0),
    (["LD_LIBRARY_PATH=/usr/local/cuda/compat", "LD_LIBRARY_PATH"], COMPAT_LIB, 1),
]


def test_a_bare_key_does_not_unset_an_earlier_entry_of_the_image(
    kit: dict[str, Path], tmp_path: Path, docker_host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a node whose driver (600) is newer than the compat driver, the hook leaves the
    compat folder unused; the image's own environment still maps the compat driver
    where the engine keeps it, and check must then fail."""
    start = tmp_path / "start"
    (tmp_path / "start.c").write_text(START_C)
    subprocess.run(["gcc", "-o", str(start), str(tmp_path / "start.c")], check=True)
    layer: dict[str, Entry] = {
        "usr/local/cuda": Symlink("cuda-13.1"),
        COMPAT_LIB: kit["A"].read_bytes(),
        f"{DIR}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
        f"{STUB}/libcuda.so": kit["A"].read_bytes(),
        "usr/lib/libapp.so": APP.read_bytes(),
        "etc/ld.so.conf": b"include /etc/ld.so.conf.d/*.conf\n",
        "etc/ld.so.cache": b"",
        "etc/ld.so.conf.d/x86_64-linux-gnu.conf": f"/{NODE}\n".encode(),
        "sbin/ldconfig": kit["ldconfig"].read_bytes(),
        "which": kit["which"].read_bytes(),
        "start": start.read_bytes(),
        "lib64/ld-linux-x86-64.so.2": kit["ld.so"].read_bytes(),
        "lib/x86_64-linux-gnu/libc.so.6": kit["libc"].read_bytes(),
    }
    tar = layer_tar(layer)
    diff_id = hashlib.sha256(tar).hexdigest()
    docker = ["docker", "-H", docker_host]
    for n, (env, loaded, code) in enumerate(CASES):
        doc = {
            "os": "linux",
            "architecture": "amd64",
            "config": {"Env": ["PATH=/usr/bin:/bin", "CUDA_VERSION=13.0.0", *env]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        }
        tag = f"bmtest/env:{n}"
        name = f"{diff_id}/layer.tar"
        archive = write_archive_blobs(
            tmp_path / f"{n}.tar", json.dumps(doc).encode(), [(name, tar)], tag=tag
        )
        subprocess.run([*docker, "load", "-i", str(archive)], check=True, capture_output=True)
        mounts = ["-v", f"{kit['B']}:/{NODE_LIB}:ro"]
        run = [*docker, "run", "--rm", "--network=none", *mounts, tag, "/start"]
        out = subprocess.run(run, check=True, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip().lstrip("/") == loaded, (env, out.stdout, out.stderr)
        args = ["check", f"docker-archive:{archive}", "--sm", "8.0", "--driver", "600.10.01"]
        got = main([*args, "--no-cache", "--json"])
        problems = json.loads(capsys.readouterr().out)["problems"]
        assert got == code, (env, problems)
        subprocess.run([*docker, "rmi", "-f", tag], check=False, capture_output=True)


AUDIT_C = r"""
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <string.h>
/* An rtld-audit module (glibc elf/rtld.c, LD_AUDIT; man 7 rtld-audit): la_objsearch
   may give the loader another name for any library it searches. */
unsigned int la_version(unsigned int v) { (void)v; return LAV_CURRENT; }
char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag) {
  (void)cookie; (void)flag;
  if (strcmp(name, "libcuda.so.1") == 0) return "/usr/local/cuda/compat/libcuda.so.1";
  return (char *)name;
}
"""


def test_ld_audit_fails_closed_where_the_image_holds_a_libcuda(
    kit: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``LD_AUDIT`` in the image's environment loads a module that may rename what the
    loader searches (``la_objsearch``): glibc's loader, chrooted in the root, maps the
    compat driver on a node whose hook leaves it unused; check must fail closed."""
    from tests.images import Image, write_docker_archive
    from tests.test_loader_order import _preload_root

    audit = tmp_path / "audit.so"
    (tmp_path / "audit.c").write_text(AUDIT_C)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(audit), str(tmp_path / "audit.c")], check=True
    )
    root = tmp_path / "root"
    _preload_root(root, kit)
    (root / "opt").mkdir()
    (root / "opt/audit.so").write_bytes(audit.read_bytes())
    # The audit namespace loads libc's own ld.so dependency by its SONAME, as a
    # distribution's /lib/<arch>-linux-gnu holds it.
    _place(kit, "ld.so", root / "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    mapped = _real(root, program=(LOADER, "/which"), env={"LD_AUDIT": "/opt/audit.so"})
    assert mapped == COMPAT_LIB  # not the node's driver
    layer: dict[str, Entry] = {
        "usr/local/cuda": Symlink("cuda-13.1"),
        COMPAT_LIB: kit["A"].read_bytes(),
        f"{DIR}/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
        "usr/lib/libapp.so": APP.read_bytes(),
        "opt/audit.so": audit.read_bytes(),
        "etc/ld.so.conf": b"include /etc/ld.so.conf.d/*.conf\n",
        "etc/ld.so.cache": b"",
    }
    env = {"CUDA_VERSION": "13.0.0", "LD_AUDIT": "/opt/audit.so"}
    archive = write_docker_archive(tmp_path / "a.tar", Image(layers=[layer], env=env))
    args = ["check", f"docker-archive:{archive}", "--sm", "8.0", "--driver", "600.10.01"]
    got = main([*args, "--no-cache", "--json"])
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert got == 1, problems
    assert any("LD_AUDIT" in p for p in problems), problems


def test_a_program_naming_an_audit_module_fails_closed(
    kit: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A program linked ``--audit`` (DT_AUDIT): glibc's loader runs the module before it,
    as for ``LD_AUDIT``, and maps the compat driver the hook leaves unused."""
    from tests.test_ldconfig import WHICH_C
    from tests.test_loader_order import _preload_root

    audit, program = tmp_path / "audit.so", tmp_path / "run"
    (tmp_path / "audit.c").write_text(AUDIT_C)
    (tmp_path / "run.c").write_text(WHICH_C)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(audit), str(tmp_path / "audit.c")], check=True
    )
    link = ["gcc", "-o", str(program), str(tmp_path / "run.c"), "-Wl,--audit=/opt/audit.so"]
    subprocess.run(link, check=True)
    image, oracle = tmp_path / "image", tmp_path / "oracle"
    for root in (image, oracle):
        _preload_root(root, kit)
        (root / "opt").mkdir()
        (root / "opt/audit.so").write_bytes(audit.read_bytes())
        (root / "opt/run").write_bytes(program.read_bytes())
        (root / "opt/run").chmod(0o755)
    (image / "usr/lib/x86_64-linux-gnu/libcuda.so.600.10.01").unlink()  # the node's
    _place(kit, "ld.so", oracle / "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    assert _real(oracle, program=("/opt/run",)) == COMPAT_LIB  # not the node's driver
    (image / "libapp.so").write_bytes(APP.read_bytes())
    (image / "usr/local/cuda-13.1/lib64").mkdir(parents=True)
    (image / "usr/local/cuda-13.1/lib64/libcudart.so.13").write_bytes(b"runtime")
    args = ["check", f"dir:{image}", "--sm", "8.0", "--driver", "600.10.01", "--no-cache", "--json"]
    got = main(args)
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert got == 1, problems
    assert any("DT_AUDIT" in p for p in problems), problems
