"""The FROM instructions of a Dockerfile as BuildKit reads them (Dockerfile reference:
"FROM", "Parser directives" (escape), line continuation with the escape character,
comment lines inside a continued instruction, "Here-Documents"), and the pins and the
mirror of images/bases.yaml written at the reference itself
(buildmatrix.bases.external_refs, apply)."""

from __future__ import annotations

import pytest

from buildmatrix.bases import Bases, apply, external_refs, nvidia_cuda_tags
from buildmatrix.errors import InputError

CASES = {
    "one line": (
        "FROM nvidia/cuda:12.9.1-devel-ubuntu24.04 AS build\n",
        ["nvidia/cuda:12.9.1-devel-ubuntu24.04"],
    ),
    "flag, continued": (
        "FROM --platform=linux/amd64 \\\n"
        "    nvidia/cuda:12.9-devel-ubuntu24.04 AS build\nFROM build\n",
        ["nvidia/cuda:12.9-devel-ubuntu24.04"],
    ),
    "stage name continued": (
        "FROM ubuntu:24.04 \\\n  AS base\nFROM base\nFROM Base\n",
        ["ubuntu:24.04"],
    ),
    "comment inside": (
        "FROM \\\n# the toolkit's image\n  nvidia/cuda:12.9.1-base-ubuntu24.04\n",
        ["nvidia/cuda:12.9.1-base-ubuntu24.04"],
    ),
    "lower case": ("from ubuntu:24.04 as b\nfrom b\n", ["ubuntu:24.04"]),
    "heredoc body": (
        "FROM ubuntu:24.04\nRUN <<EOT\nFROM nvidia/cuda:12.9-devel\necho hi\nEOT\n"
        "RUN <<-'EOF' bash\n\tFROM alpine\n\tEOF\nFROM busybox\n",
        ["ubuntu:24.04", "busybox"],
    ),
    "escape directive": (
        "# escape=`\nFROM --platform=linux/arm64 `\n  ubuntu:24.04\nRUN echo \\\nFROM alpine\n",
        ["ubuntu:24.04", "alpine"],
    ),
    # a heredoc only in RUN, COPY and ADD, as a whole word: these are no heredocs
    "heredoc-like text": (
        'FROM a\nLABEL x="<<EOF"\nRUN echo "std::cout<<value;" $((1<<SHIFT))\n'
        "RUN cat<<EOF\nFROM b\n",
        ["a", "b"],
    ),
    # BuildKit's word: <<NAME with any name, its quotes removed
    "heredoc names": (
        'FROM a\nRUN <<END-OF-SCRIPT\nFROM x\nEND-OF-SCRIPT\nRUN <<E"O"F\nFROM y\nEOF\n'
        "RUN <<1\nFROM z\n1\nFROM b\n",
        ["a", "b"],
    ),
    "unknown directive first": (
        "# foo=bar\n# escape=`\nFROM nvidia/cuda:12.9.1-devel-ubuntu24.04 `\nFROM busybox:1\n",
        ["nvidia/cuda:12.9.1-devel-ubuntu24.04", "busybox:1"],
    ),
    "byte order mark": ("\ufeffFROM ubuntu:24.04\n", ["ubuntu:24.04"]),
    "only \\n ends a line": (
        "FROM\x0bubuntu:24.04\nRUN <<EOF\necho x\u2028EOF\nFROM c\nEOF\n",
        ["ubuntu:24.04"],
    ),
    "quoted reference": (
        'FROM "nvidia/cuda:12.9.1-base-ubuntu24.04" AS q\n',
        ["nvidia/cuda:12.9.1-base-ubuntu24.04"],
    ),
    "scratch, ARG, stage": (
        "ARG B=ubuntu:24.04\nFROM $B AS one\nFROM scratch\nFROM one\n",
        [],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_images_pulled(case: str) -> None:
    text, refs = CASES[case]
    assert external_refs(text) == refs


@pytest.mark.parametrize("case", list(CASES))
def test_pins_and_the_mirror_are_written_at_the_reference(case: str) -> None:
    """Every pulled reference is pinned and mirrored where it stands, continued lines,
    comments and heredoc bodies untouched."""
    text, refs = CASES[case]
    pins = dict.fromkeys(refs, "sha256:" + "a" * 64)
    out = apply(text, Bases(registry="mirror.example", pins=pins))
    got = external_refs(out)
    assert len(got) == len(refs)
    for ref, new in zip(refs, got, strict=True):
        path = ref if "/" in ref.split(":")[0] else f"library/{ref}"
        assert new == f"mirror.example/{path}@{pins[ref]}"
    # only the references changed: the rest of the text is as it was
    rest = out
    for new in got:
        rest = rest.replace(new, "", 1)
    original = text
    for ref in refs:
        original = original.replace(ref, "", 1)
    assert rest == original


def test_a_continued_from_hides_no_nvidia_cuda_tag() -> None:
    text, _ = CASES["flag, continued"]
    assert nvidia_cuda_tags(text) == [
        ("nvidia/cuda:12.9-devel-ubuntu24.04", "12.9-devel-ubuntu24.04")
    ]


def test_a_reference_split_over_lines_is_refused() -> None:
    with pytest.raises(InputError, match="split over lines"):
        external_refs("FROM nvidia/cu\\\nda:12.9.1-base-ubuntu24.04\n")


@pytest.mark.parametrize("host", ["", "docker.io/", "index.docker.io/", "registry-1.docker.io/"])
def test_each_name_of_docker_hub_is_docker_hub(host: str) -> None:
    """Docker Hub by any of its names: the nvidia/cuda tag is checked and the mirror
    stands in for it."""
    text = f"FROM {host}nvidia/cuda:12.9-devel-ubuntu24.04\n"
    assert nvidia_cuda_tags(text) == [
        (f"{host}nvidia/cuda:12.9-devel-ubuntu24.04", "12.9-devel-ubuntu24.04")
    ]
    assert external_refs(apply(text, Bases(registry="m.example"))) == [
        "m.example/nvidia/cuda:12.9-devel-ubuntu24.04"
    ]
