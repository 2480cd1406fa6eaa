"""The runs the pipeline tests make (tests/test_workflow.py, tests/test_adopt.py):
a :class:`tests.pipeline.Pipeline` run six times around edits of one variant's
template, each run held to what its content keys say changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.pipeline import Pipeline, Run


def edit_one_variant(repo: Path, variant: dict[str, Any]) -> tuple[Path, str]:
    """An edit to ``variant``'s template that changes its Dockerfile and no other's:
    a line rendered only for its tag (the template sees ``tag``, docs/generate.md).
    Returns the template and its text before."""
    spec = yaml.safe_load((repo / "images" / variant["image"] / "image.yaml").read_text())
    template = repo / "images" / variant["image"] / spec["template"]
    text = template.read_text()
    template.write_text(
        text + f'{{% if tag == "{variant["tag"]}" %}}\nENV EDITED=1\n{{% endif %}}\n'
    )
    return template, text


def _only(run: Run, variant: dict[str, Any]) -> None:
    """The run built, checked, published and signed ``variant`` and nothing else."""
    assert run.built == {(variant["key"], p) for p in variant["platforms"]}
    assert run.checked == [variant["key"]]
    assert len(run.creates) == len(run.promoted) == len(run.signed) == 1
    assert run.promoted[0].startswith(variant["repository"] + "@")


def run_scenario(pipe: Pipeline, commit: Any) -> None:
    """Six runs (``commit`` makes an edit what the workflow sees): (1) everything is
    built; the failing variant is not published, the others are, with their content
    tags, and signed; (2) unchanged: only the failed variant, which never got a
    content tag, is built and checked again, and fails again; (3) after an edit of
    that variant's template: exactly its platforms are built, checked, published
    under a new content tag and signed; (4) unchanged: nothing is built, checked,
    tagged or signed; (5) an edit of another variant publishes exactly it; (6) its
    revert builds nothing and moves its family tags back to the index of run 1."""
    first = pipe.run()
    variants = {m["key"]: m for m in first.variants}
    failing = variants[pipe.failing]
    assert first.outputs["present"] == '{"include":[]}'
    assert first.built == {(k, p) for k, m in variants.items() for p in m["platforms"]}
    assert len(first.promoted) == len(variants) - 1 == len(first.signed)
    again = pipe.run()
    assert again.built == {(pipe.failing, p) for p in failing["platforms"]}
    assert again.checked == [pipe.failing]
    assert again.creates == [] and again.promoted == again.signed == []
    edit_one_variant(pipe.cwd, failing)
    commit()
    edited = pipe.run()
    now = {m["key"]: m for m in edited.variants}
    assert {k for k in now if now[k]["content_key"] != variants[k]["content_key"]} == {pipe.failing}
    _only(edited, failing)
    last = pipe.run()
    assert last.outputs["build"] == "false"
    assert last.built == set() and last.checked == []
    assert last.creates == [] and last.promoted == last.signed == []
    assert len(json.loads(last.outputs["present"])["include"]) == len(variants)
    other = next(m for k, m in variants.items() if k != pipe.failing)
    template, text = edit_one_variant(pipe.cwd, other)
    commit()
    _only(pipe.run(), other)
    template.write_text(text)
    commit()
    back = pipe.run()
    assert back.built == set() and back.promoted == back.signed == []
    assert back.creates == [
        [x for t in other["tags"] for x in ("--tag", t)] + [other["content_tag"]]
    ]
