"""A PTX module's ``.version`` and ``.target`` read as ptxas reads them
(buildmatrix/binary/ptx.py; docs/security.md, "Device code that tries not to be seen").

The driver's JIT compiles PTX for the ``.target`` its text names and refuses a
``.version`` newer than it knows. Comments (``//`` and ``/* */``) may come before and
between the directives; one that holds a ``.version`` or ``.target`` is no directive.
ptxas, NVIDIA's PTX compiler (the driver's JIT front end), is the oracle: for heads
drawn by hypothesis, whatever buildmatrix reads must be what ptxas compiles.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import Version

from buildmatrix.arch import ComputeCapability
from buildmatrix.binary.ptx import PTX_HEAD, looks_like_ptx, ptx_directives
from buildmatrix.binary.scan import read_head
from buildmatrix.cuda import CudaFacts, load_cuda_facts
from buildmatrix.jit import ptx_targets
from tests.conftest import CliRunner
from tests.fixtures.build import BIN
from tests.images import (
    Entry,
    Image,
    layer_tar,
    scan_in_place,
    write_docker_archive,
    write_oci_layout,
)

_BODY = b"""
.address_size 64

.visible .entry _Z1kPf(
\t.param .u64 _Z1kPf_param_0
)
{
\tret;
}
"""
# The GPUs ptxas compiles each head for: plain, arch-specific, a newer major.
_SMS = ("sm_80", "sm_90a", "sm_100")
_HAVE_PTXAS = shutil.which("ptxas") is not None
_SKIP = pytest.mark.skipif(not _HAVE_PTXAS, reason="ptxas is the oracle; .ci/run has it")


def needs_ptxas(test: Callable[..., None]) -> Callable[..., None]:
    """Runs ptxas, of the CUDA toolchain: marked ``nvcc`` (so ``integration``, not among
    the engine-free tests) and skipped where ptxas is missing."""
    return cast(Callable[..., None], pytest.mark.nvcc(_SKIP(test)))


def _ptxas_isa(facts: CudaFacts) -> Version:
    """The newest PTX ISA the installed ptxas compiles (its release's, from the table)."""
    out = subprocess.run(["ptxas", "--version"], capture_output=True, text=True, check=True)
    found = re.search(r"release (\d+)\.(\d+)", out.stdout)
    assert found, out.stdout
    release = Version(f"{found[1]}.{found[2]}")
    return next(tk.ptx_isa for tk in facts.toolkits if tk.version == release)


def ptxas(tmp_path: Path, text: bytes, sm: str) -> subprocess.CompletedProcess[str]:
    """ptxas compiling the PTX ``text`` for ``sm`` (in ``tmp_path``)."""
    source = tmp_path / "k.ptx"
    source.write_bytes(text)
    return subprocess.run(
        ["ptxas", f"-arch={sm}", str(source), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
        check=False,
    )


def _compiles(tmp_path: Path, text: bytes, sm: str) -> bool:
    return ptxas(tmp_path, text, sm).returncode == 0


_FAKE = st.sampled_from([b".version 7.0", b".target sm_80", b".version 9.9", b".target sm_90a"])
_GAP = st.lists(
    st.one_of(
        st.sampled_from([b" ", b"\n", b"\t", b"\r\n"]),
        _FAKE.map(lambda d: b"// " + d + b"\n"),
        _FAKE.map(lambda d: b"/* " + d + b" */"),
        _FAKE.map(lambda d: b"/*\n" + d + b"\n*/"),
    ),
    max_size=3,
).map(b"".join)
_SM_NAME = st.sampled_from([b"sm_80", b"sm_87", b"sm_90a", b"sm_90", b"sm_100", b"sm_100f"])
# What may follow the targets: the address size ptxas takes (64, as any PTX integer),
# sizes it refuses (32: "32-Bit compilation is no longer supported"; 52), none at all,
# or a directive of the head once more ("Parsing error").
_ADDRESS = st.sampled_from(
    [
        b".address_size 64",
        b".address_size 0x40",
        b".address_size 64U",
        b".address_size 32",
        b".address_size 064",
        b"",
        b".address_size 64\n.address_size 64",
        b".address_size 64\n.target sm_90",
    ]
)
# Target options ptxas takes, one it refuses for every SM drawn, and one it knows not.
_OPTION = st.sampled_from(
    [b"texmode_independent", b"texmode_unified", b"map_f64_to_f32", b"bogus_option"]
)


@st.composite
def _heads(draw: st.DrawFn) -> bytes:
    """A module head: comments with fake directives anywhere between the tokens, a
    ``.version``, and one or two ``.target`` directives of one or two names."""
    # 9.0 can target every SM drawn; 9.9 is newer than any ptxas knows; 8.9 and 6.6
    # are no ISA; the others are too old for some targets (sm_100f needs 8.8, sm_100
    # 8.6, sm_90a 8.0, sm_87 7.4).
    versions = [b"9.0", b"9.9", b"8.9", b"8.6", b"8.4", b"7.8", b"7.0", b"6.6"]
    version = draw(st.sampled_from(versions))
    head = draw(_GAP) + b".version" + draw(_GAP).replace(b"\n", b" ") + b" " + version
    for _ in range(draw(st.integers(1, 2))):
        names = [draw(_SM_NAME), *draw(st.lists(st.one_of(_SM_NAME, _OPTION), max_size=2))]
        head += b"\n" + draw(_GAP) + b".target " + (b"," + draw(_GAP)).join(names)
    head += b"\n" + draw(_GAP) + draw(_ADDRESS)
    return head + b"\n" + draw(_GAP) + _BODY.replace(b".address_size 64\n", b"", 1)


@needs_ptxas
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(text=_heads())
def test_what_is_read_is_what_ptxas_compiles(tmp_path: Path, text: bytes) -> None:
    """Where buildmatrix reads a target and a version, ptxas compiles the module for
    exactly the GPUs that target serves (PTX JIT rules) and only if that version is
    one it knows; where it reads none, the check fails closed (never a pass)."""
    found = ptx_directives(text)
    if found is None:
        return
    arch, isa = found
    newest = _ptxas_isa(load_cuda_facts())
    for sm in _SMS:
        cc = ComputeCapability.from_number(int(re.sub(r"\D", "", sm)))
        expected = ptx_targets(arch, cc) and isa <= newest
        assert _compiles(tmp_path, text, sm) == expected, (sm, arch, isa, text[:200])


@pytest.mark.parametrize(
    "head",
    [
        b"/*\n.version 7.0\n.target sm_80\n*/\n.version 9.0\n.target sm_90a\n",
        b"// .target sm_80\n.version 9.0\n.target sm_90a\n",
        b".version 9.0\n.target /* sm_80, */ sm_90a\n",
    ],
)
def test_directives_inside_comments_are_no_directives(head: bytes) -> None:
    found = ptx_directives(head + _BODY)
    assert found is not None
    assert (str(found[0]), str(found[1])) == ("compute_90a", "9.0")


@pytest.mark.parametrize(
    "head",
    [
        b".version 9.0\n.target sm_90a, debug\n",  # nvcc -G writes this
        b".version 9.0\n.target sm_90a, texmode_unified, texmode_unified\n",
        b".version 9.0\n.target sm_90a\n.target texmode_independent\n",
    ],
)
def test_target_options_ptxas_takes_are_read_past(head: bytes) -> None:
    found = ptx_directives(head + _BODY)
    assert found is not None
    assert (str(found[0]), str(found[1])) == ("compute_90a", "9.0")


@pytest.mark.parametrize(
    "head",
    [
        b".version 9.0\n.target sm_80\n.target sm_90a\n",  # ptxas takes the last SM
        b".version 9.0\n.target sm_90a, sm_80\n",
        b".target sm_90a\n.version 9.0\n",  # ptxas: "Missing .version directive"
        b".version 9.0\n.address_size 64\n.target sm_90a\n",  # "Missing .target"
        b".version 9.0\n.target texmode_independent, sm_90a\n",  # "not defined"
        b".version 9.0\n.target sm_80, map_f64_to_f32\n",  # "not supported with SM 1.3"
        b".version 9.0\n.target sm_80, bogus\n",  # "Unsupported .target 'bogus'"
        b".version 9.0\n.target sm_80, TEXMODE_UNIFIED\n",  # names are case-sensitive
        b".version 9.0\n.target sm_80, texmode_unified\n.target texmode_independent\n",
        b"/* unterminated\n.version 9.0\n.target sm_90a\n",
    ],
)
def test_heads_ptxas_refuses_or_that_name_two_sms_are_refused(head: bytes) -> None:
    assert ptx_directives(head + _BODY) is None


def test_a_ptx_file_that_starts_with_a_comment_is_ptx() -> None:
    assert looks_like_ptx(b"/* kernels */\n// by hand\n.version 9.0\n.target sm_90a\n", "k")
    assert not looks_like_ptx(b"/* .version 9.0 */ nothing\n", "k")


@needs_ptxas
@pytest.mark.nvcc
def test_a_ptx_file_is_judged_by_its_real_target(cli: CliRunner, tmp_path: Path) -> None:
    """nvcc's ``sm_90a`` PTX behind a comment that names ``.version 7.0`` and
    ``.target sm_80``: ptxas compiles it for 9.0 alone, so it fails on 8.0 and on
    10.0, and on a driver of CUDA 12.2 (ISA 8.2) too; read as before (the first
    directive-like lines), it passed all three."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc writes the PTX")
    (tmp_path / "k.cu").write_text("__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n")
    subprocess.run(
        ["nvcc", "-arch=compute_90a", "-ptx", "k.cu", "-o", "k.ptx"], cwd=tmp_path, check=True
    )
    real = (tmp_path / "k.ptx").read_bytes()
    text = b"/*\n.version 7.0\n.target sm_80\n*/\n" + real
    root = tmp_path / "img"
    root.mkdir()
    (root / "kernels.ptx").write_bytes(text)
    assert not _compiles(tmp_path, text, "sm_80") and not _compiles(tmp_path, text, "sm_100")
    assert _compiles(tmp_path, text, "sm_90a")
    for args in (["--sm", "8.0"], ["--sm", "10.0", "--driver", "580.65.06"]):
        result = cli("check", f"dir:{root}", *args, "--json")
        assert result.code == 1, (args, result.out, result.err)
    result = cli("check", f"dir:{root}", "--sm", "9.0", "--driver", "535.104.05", "--json")
    assert result.code == 1, result.out
    assert "PTX ISA 9.0" in result.out
    result = cli("check", f"dir:{root}", "--sm", "9.0", "--driver", "580.65.06", "--json")
    assert result.code == 0, result.out


# nvcc's sm_90a PTX (ISA 9.0) behind a licence header, under a name that is not .ptx:
# cuModuleLoad takes PTX by content whatever its name, so the image readers must find
# it past the first 64 bytes they judge other files by (buildmatrix.binary.scan.read_head).
_LICENCE = b"".join(b"// Copyright (c) 2025 Example Corp. Licensed under Apache-2.0. %d\n" % i
                    for i in range(3))  # fmt: skip
_BLOCK = b"/*\n" + b" * SPDX-License-Identifier: Apache-2.0 and a long notice.\n" * 90 + b" */\n"
_HEADS = {"line comments (198 bytes)": _LICENCE, "a block comment (5 KiB)": _BLOCK}


def _sources(tmp_path: Path, files: dict[str, bytes]) -> dict[str, str]:
    """The same one-layer image as a folder, a docker-archive (read in place) and an
    OCI layout (gzip: streamed)."""
    root = tmp_path / "root"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    layer: dict[str, Entry] = dict(files)
    image = Image(layers=[layer])
    return {
        "dir": f"dir:{root}",
        "docker-archive": f"docker-archive:{write_docker_archive(tmp_path / 'a.tar', image)}",
        "oci": f"oci:{write_oci_layout(tmp_path / 'oci', image)}:latest",
    }


@pytest.mark.parametrize("head", list(_HEADS.values()), ids=list(_HEADS))
def test_ptx_behind_a_long_comment_is_found_under_any_name(
    cli: CliRunner, tmp_path: Path, head: bytes
) -> None:
    """Before, a head of comments longer than 64 bytes hid the PTX: ISA 9.0, which a
    CUDA 12.2 driver (535) cannot JIT, passed on it."""
    assert len(head) > 64
    ptx = head + (BIN / "kernels_sm90a.ptx").read_bytes()
    for ref in _sources(tmp_path, {"opt/app/kernels.bin": ptx}).values():
        result = cli("check", ref, "--sm", "9.0", "--driver", "535.104.05", "-v")
        assert result.code == 1, (ref, result.out)
        assert "opt/app/kernels.bin" in result.out, ref
        assert "PTX ISA 9.0" in result.out, ref
        assert cli("check", ref, "--sm", "9.0", "--driver", "580.65.06").code == 0, ref


def test_a_text_of_comments_past_the_head_fails_closed(cli: CliRunner, tmp_path: Path) -> None:
    """A text still only comments after the 64 KiB read_head reads may be PTX behind
    them (ptxas takes it): it is read as PTX and refused, as a .ptx file's would be,
    under any name; before, it was skipped and the image passed."""
    comment = b"/*\n" + b" * a very long notice\n" * 4000 + b" */\n"
    assert len(comment) > 64 * 1024
    ptx = comment + (BIN / "kernels_sm90a.ptx").read_bytes()
    for ref in _sources(tmp_path, {"opt/app/kernels.bin": ptx}).values():
        result = cli("check", ref, "--sm", "9.0", "--driver", "580.65.06", "-v")
        assert result.code == 1, (ref, result.out)
        assert "opt/app/kernels.bin" in result.out + result.err, ref


def test_a_source_file_behind_a_long_comment_is_no_ptx(cli: CliRunner, tmp_path: Path) -> None:
    """A C header opens with a licence too: read a little further, it is not PTX."""
    header = _BLOCK + b"#pragma once\n// .version 9.0\n.version 9.0\n"
    for ref in _sources(tmp_path, {"usr/include/k.h": header}).values():
        result = cli("check", ref, "--sm", "9.0", "--allow-empty", "-v")
        assert result.code == 0, (ref, result.out, result.err)
        assert "files    0 with device code" in result.out, ref


@pytest.mark.parametrize(
    ("text", "read"),
    [
        (b"\x7fELF" + b"\0" * 9000, 64),  # not a text: 64 bytes decide
        (b"#!/bin/sh\n" + b"echo\n" * 2000, 64),
        (_LICENCE + b"int x;\n" * 2000, 4096),  # the code after the comment decides
        (
            b"// 62 bytes of a comment, then a .version cut at byte 64.....\n.ver"
            + b"sion 9.0\n.target sm_90a\n"
            + b"\n" * 9000,
            4096,
        ),
        (_BLOCK + b"int x;\n" * 20_000, PTX_HEAD),
        (b"/*" + b" " * 100_000, PTX_HEAD),  # a comment that never closes: bounded
        (b"// short\n", 9),
    ],
)
def test_the_head_is_read_further_only_behind_comments(text: bytes, read: int) -> None:
    reads: list[int] = []

    def read_at(offset: int, n: int) -> bytes:
        assert offset == sum(reads)  # on from where the last read stopped: a stream too
        reads.append(len(text[offset : offset + n]))
        return text[offset : offset + n]

    head = read_head(read_at)
    assert len(head) == read
    assert len([n for n in reads if n]) <= 3  # 64 bytes, then 4 KiB, then 64 KiB at most
    assert looks_like_ptx(head, "k") == (b".target" in text[:read] and b"\n.ver" in text)


def test_the_two_layer_readers_read_the_head_as_the_stream_does(tmp_path: Path) -> None:
    """docker-archive layers (in place) and overlay2 layer folders judge a file by
    read_head too, as the tar stream does."""
    from buildmatrix.image.layers import scan_layer
    from buildmatrix.image.overlay2 import scan_layer_dir
    from buildmatrix.image.tree import merge

    files = {f"opt/{k}.bin": h + (BIN / "kernels_sm90a.ptx").read_bytes() for k, h in
             (("lines", _LICENCE), ("block", _BLOCK))}  # fmt: skip
    files["usr/include/k.h"] = _BLOCK + b"#pragma once\n"
    layer: dict[str, Entry] = dict(files)
    raw = layer_tar(layer)
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    views = [
        merge([summary]).files()
        for summary in (
            scan_layer(io.BytesIO(raw), name="layer"),
            scan_in_place(raw),
            scan_layer_dir(tmp_path, name="layer"),
        )
    ]
    found = [sorted(p for p, node in view if node.result is not None) for view in views]
    assert found == [["opt/block.bin", "opt/lines.bin"]] * 3


def test_the_in_place_workers_read_the_head_as_one_process_does() -> None:
    """A large docker-archive layer is listed by its own reader, which picks the files
    the workers inspect (buildmatrix.image.inplace): by read_head too."""
    from tests.test_in_place import _in_a_fresh_process

    out = _in_a_fresh_process(
        """
        from buildmatrix.image.tree import merge
        from tests.images import layer_tar, scan_in_place
        from tests.test_in_place import pool_everything
        from tests.test_ptx_head import _BLOCK, _LICENCE, BIN

        ptx = (BIN / "kernels_sm90a.ptx").read_bytes()
        raw = layer_tar({"opt/lines.bin": _LICENCE + ptx, "opt/block.bin": _BLOCK + ptx})
        assert pool_everything() is not None
        view = merge([scan_in_place(raw)]).files()
        print(*sorted(p for p, node in view if node.result is not None))
        """
    )
    assert out.split() == ["opt/block.bin", "opt/lines.bin"]
