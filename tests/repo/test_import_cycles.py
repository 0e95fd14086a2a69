"""No import cycles in src/nemotron: the module graph built from the source (every `import` and `from ... import`
anywhere in a module: inside functions, since a function-level import only moves a cycle to run time, and under
`if TYPE_CHECKING:`) has no cycle. A cycle is printed as the chain of modules and the line of each import, so it
can be cut where it is."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "nemotron"


def module_names(src: Path = SRC, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is its __init__.py)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth: in functions, and under `if TYPE_CHECKING:` too (a cycle mypy must
    untangle is one a reader must too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_package: bool, known: set[str]) -> set[str]:
    """The package's modules one import statement loads: the named module (`from a import b` loads a.b when b is
    a module, else a), and the packages above it, whose __init__ runs first."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parent = here.split(".") if is_package else here.split(".")[:-1]
            parent = parent[: len(parent) - (node.level - 1)]
            base = ".".join([*parent, *([base] if base else [])])
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = set()
    for name in names:
        parts = name.split(".")
        out |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known
    return out


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}, within the package."""
    modules = module_names(src, package)
    known = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for node in _imports(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, name, path.name == "__init__.py", known):
                # a module's own parent packages are loaded before it: not an edge of its own making
                if target != name and not name.startswith(target + "."):
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [_cycle_in(graph, set(c)) for c in components]


def _cycle_in(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth first, within the component)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    return [*paths[node], start]
                if child in component and child not in paths:
                    paths[child] = [*paths[node], child]
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    return " -> ".join(
        f"{a} (line {graph[a][b]})" if i < len(cycle) - 1 else a
        for i, (a, b) in enumerate(zip(cycle, [*cycle[1:], cycle[0]], strict=True))
    )


def test_launch_has_no_import_cycles() -> None:
    graph = import_graph()
    assert (
        "nemotron.launch.lepton" in graph and "nemotron.launch.ray_lepton" in graph["nemotron.launch.lepton"]
    )
    found = [describe(graph, c) for c in cycles(graph) if any(m.startswith("nemotron.launch.") for m in c)]
    assert found == [], "import cycles through launch/:\n" + "\n".join(found)


def test_the_package_has_no_import_cycles() -> None:
    graph = import_graph()
    assert len(graph) > 100  # the scan found the package
    found = [describe(graph, c) for c in cycles(graph)]
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_a_cycle_made_by_a_function_level_import_is_found(tmp_path: Path) -> None:
    """The scanner itself: a cycle closed only inside a function, through a relative import, is reported with its
    lines, as is one closed under `if TYPE_CHECKING:`; importing a package's module is an edge to both."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("import json\n\n\ndef f():\n    from .. import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n\nimport pkg.d\n")
    (pkg / "d.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.c import X\n"
    )
    (pkg / "e.py").write_text("from pkg import sub\n")

    graph = import_graph(tmp_path, "pkg")

    assert graph["pkg.a"] == {"pkg.sub": 1, "pkg.sub.b": 1}
    assert graph["pkg.e"] == {"pkg.sub": 1} and graph["pkg.sub"] == {}
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.sub.b", "pkg.a"], ["pkg.c", "pkg.d", "pkg.c"]]
    assert describe(graph, found[0]) == "pkg.a (line 1) -> pkg.sub.b (line 5) -> pkg.a"
    assert describe(graph, found[1]) == "pkg.c (line 3) -> pkg.d (line 4) -> pkg.c"
