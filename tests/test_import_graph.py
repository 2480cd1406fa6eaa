"""The package's layers, as docs/development.md ("Layers") draws them, held to the code.

The import graph of ``buildmatrix/`` is built from the source (Python's own parser,
:mod:`ast`): every import counts, at module level, inside a function or under
``TYPE_CHECKING``, since each is a dependency a reader has to follow. Three rules:

- no cycle between modules (no two modules import each other, however indirectly);
- no import upwards: a module imports only from a lower layer or its own group
  (:data:`LAYERS`, the table the drawing in docs/development.md shows);
- only ``buildmatrix/cli/`` prints (``print``, ``click.echo``/``secho``, writes to
  ``sys.stdout``/``sys.stderr``).

Each rule is also run on a small package written by the test with one violation of
each kind, so a checker that finds nothing fails too.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.conftest import REPO

# (layer rank, group, module prefixes). A module may import from a group of lower
# rank, or from its own group; groups of one rank do not import each other.
LAYERS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (
        0,
        "facts",
        (
            "buildmatrix",  # the package itself: its version, the path of its files
            "buildmatrix.errors",
            "buildmatrix.yamlio",
            "buildmatrix.schema",
            "buildmatrix.arch",
            "buildmatrix.cuda",
            "buildmatrix.loaders",
            "buildmatrix.verdict",
            "buildmatrix.labelkeys",
            "buildmatrix.snapshot",
            "buildmatrix.profiles",
            "buildmatrix.profile_files",
        ),
    ),
    (1, "binary readers", ("buildmatrix.binary",)),
    (
        2,
        "toolkit lookup",
        (
            "buildmatrix.forward",
            "buildmatrix.forward_conf",
            "buildmatrix.forward_devices",
            "buildmatrix.forward_legacy",
            "buildmatrix.ldconfig",
            "buildmatrix.ldshadow",
            "buildmatrix.ldsoconf",
            "buildmatrix.forward_semver",
        ),
    ),
    (3, "image sources", ("buildmatrix.image",)),
    (
        4,
        "rules",
        (
            "buildmatrix.jit",
            "buildmatrix.compat",
            "buildmatrix.units",
            "buildmatrix.forward_choice",
            "buildmatrix.constraint",
            "buildmatrix.check_targets",
            "buildmatrix.check",
            "buildmatrix.check_refs",
            "buildmatrix.target_verdict",
            "buildmatrix.optional",
            "buildmatrix.optional_choice",
            "buildmatrix.sibling_release",
            "buildmatrix.container_env",
            "buildmatrix.toolkit_require",
            "buildmatrix.runtime_sources",
            "buildmatrix.selector",
            "buildmatrix.affinity",
            "buildmatrix.drivers",
            "buildmatrix.driver_report",
            "buildmatrix.multiplatform",
            "buildmatrix.attest",
            "buildmatrix.causes",
            "buildmatrix.specs",
            "buildmatrix.matrix",
            "buildmatrix.variant",
            "buildmatrix.render",
            "buildmatrix.bases",
            "buildmatrix.content_key",
            "buildmatrix.pipeline",
            "buildmatrix.bake",
            "buildmatrix.pins",
        ),
    ),
    (5, "node side", ("buildmatrix.node",)),
    (
        5,
        "k8s renderers",
        (
            "buildmatrix.k8s",
            "buildmatrix.k8s_daemonset",
            "buildmatrix.k8s_drivers",
            "buildmatrix.k8s_dra",
            "buildmatrix.k8s_example",
            "buildmatrix.k8s_gate",
            "buildmatrix.k8s_kyverno",
            "buildmatrix.k8s_nfd",
            "buildmatrix.k8s_nodes",
            "buildmatrix.k8s_policy",
            "buildmatrix.k8s_repair",
            "buildmatrix.k8s_values",
        ),
    ),
    (6, "cli", ("buildmatrix.cli", "buildmatrix.__main__")),
)
PRINTS_ALLOWED = "buildmatrix.cli"


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file of every module under ``root/package``."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> Iterator[str]:
    """The dotted names an import statement may mean (a module, or a name in one)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        parts = name.split(".")
        if not is_package:
            parts.pop()
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    for alias in node.names:
        yield f"{base}.{alias.name}"  # `from pkg import module`
        yield base


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its source."""
    modules = modules_of(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for dotted in _imported(node, name, path.name == "__init__.py"):
                target = dotted
                while target and target not in modules:  # `a.b.Name` -> module `a.b`
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str, layers: tuple[tuple[int, str, tuple[str, ...]], ...]) -> tuple[int, str]:
    """(rank, group) of the longest prefix that names the module or its package."""
    best: tuple[int, int, str] | None = None
    for rank, group, prefixes in layers:
        for prefix in prefixes:
            named = module == prefix or module.startswith(prefix + ".")
            if named and (best is None or len(prefix) > best[0]):
                best = (len(prefix), rank, group)
    if best is None:
        raise LookupError(f"{module} is in no layer of the table")
    return best[1], best[2]


def upward_edges(
    graph: Mapping[str, set[str]], layers: tuple[tuple[int, str, tuple[str, ...]], ...]
) -> list[str]:
    """Each import of a module from a higher layer or another group of its rank."""
    bad = []
    for a in sorted(graph):
        rank_a, group_a = layer_of(a, layers)
        for b in sorted(graph[a]):
            rank_b, group_b = layer_of(b, layers)
            if group_b != group_a and rank_b >= rank_a:
                bad.append(f"{a} ({group_a}) imports {b} ({group_b})")
    return bad


_PRINTERS = {("click", "echo"), ("click", "secho"), ("sys.stdout", "write")}
_PRINTERS |= {("sys.stderr", "write")}


def printing_calls(root: Path, package: str, allowed: str) -> list[str]:
    """``file:line`` of each print outside ``allowed`` (and its submodules)."""
    found = []
    for name, path in modules_of(root, package).items():
        if name == allowed or name.startswith(allowed + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = ast.unparse(func)
            owner, _, attr = called.rpartition(".")
            if called in ("print", "echo", "secho") or (owner, attr) in _PRINTERS:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {called}()")
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    """buildmatrix's import graph, parsed once for the tests that read it."""
    return import_graph(REPO, "buildmatrix")


def test_every_module_has_a_layer() -> None:
    for module in _graph():
        layer_of(module, LAYERS)  # raises for a module the table leaves out


def test_no_cycles() -> None:
    assert cycles(_graph()) == []


def test_no_upward_imports() -> None:
    assert upward_edges(_graph(), LAYERS) == []


def test_only_the_cli_prints() -> None:
    assert printing_calls(REPO, "buildmatrix", PRINTS_ALLOWED) == []


def test_the_drawing_lists_the_table() -> None:
    """docs/development.md's drawing starts a row with each group of the table, the
    highest layer first."""
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    drawing = text.split("## Layers", 1)[1].split("```")[1]
    rows = [row.split("  ")[0] for row in drawing.splitlines()]
    places = [rows.index(group) if group in rows else -1 for _, group, _ in LAYERS]
    assert -1 not in places, [g for (_, g, _), at in zip(LAYERS, places, strict=True) if at < 0]
    by_rank = sorted(zip(LAYERS, places, strict=True), key=lambda lp: -lp[0][0])
    assert [at for _, at in by_rank] == sorted(at for _, at in by_rank)  # top layer first


@pytest.fixture
def bad_package(tmp_path: Path) -> Path:
    """A package with one violation of each rule: ``low`` and ``mid`` import each
    other (``mid`` inside a function), ``low`` imports ``top`` (upwards, relative
    import), ``mid`` prints."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "low.py").write_text("from pkg.sub import mid\nfrom .sub.top import x\n")
    (pkg / "sub" / "mid.py").write_text("def f():\n    import pkg.low\n    print(1)\n")
    (pkg / "sub" / "top.py").write_text("import click\n\ndef g():\n    click.echo(2)\n")
    return tmp_path


BAD_LAYERS = (
    (0, "low", ("pkg",)),
    (1, "mid", ("pkg.sub.mid",)),
    (2, "top", ("pkg.sub.top", "pkg.sub")),
)


def test_the_checks_find_what_they_look_for(bad_package: Path) -> None:
    graph = import_graph(bad_package, "pkg")
    assert graph["pkg.low"] == {"pkg.sub", "pkg.sub.mid", "pkg.sub.top"}
    assert cycles(graph) == [["pkg.low", "pkg.sub.mid"]]
    assert upward_edges(graph, BAD_LAYERS) == [
        "pkg.low (low) imports pkg.sub (top)",
        "pkg.low (low) imports pkg.sub.mid (mid)",
        "pkg.low (low) imports pkg.sub.top (top)",
    ]
    assert printing_calls(bad_package, "pkg", "pkg.sub.top") == ["pkg/sub/mid.py:3: print()"]
    assert printing_calls(bad_package, "pkg", "pkg.cli") == [
        "pkg/sub/mid.py:3: print()",
        "pkg/sub/top.py:4: click.echo()",
    ]
    with pytest.raises(LookupError):
        layer_of("elsewhere", BAD_LAYERS)
