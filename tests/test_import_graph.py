"""No import circles among turnlog's modules.

The graph has an edge for every import a module makes: at the top, inside a function, and
under ``if TYPE_CHECKING:`` alike, since a circle of type-only imports still means two modules
that cannot be read (or split) one without the other. A circle is named as the path it takes.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAYERS = ("engine", "projections", "consumers", "gateway", "examples")
"""The folders that install as ``turnlog.<name>`` (``turnlog/`` links them in)."""
NOT_TURNLOG = ("examples/my_agents",)
"""A template of the user's own package (installed as ``my_agents``, not under turnlog)."""
@dataclass(frozen=True)
class Edge:
    target: str
    how: str
    """"run" (an import that runs when the module loads), "call" (inside a function) or
    "type" (under ``if TYPE_CHECKING:``)."""
    line: int


def turnlog_modules(repo: Path = REPO) -> dict[str, Path]:
    """Every product module by its import name, read from the real files (not the links)."""
    found: dict[str, Path] = {}
    roots = [(repo / layer, ["turnlog", layer]) for layer in LAYERS] + [(repo / "turnlog", ["turnlog"])]
    for root, prefix in roots:
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if any(part == "node_modules" for part in rel.parts) or _linked(root, rel):
                continue
            if any(str(path.relative_to(repo)).startswith(skip + "/") for skip in NOT_TURNLOG):
                continue
            parts = [*prefix, *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _linked(root: Path, rel: Path) -> bool:
    """Whether ``rel`` lies under a symbolic link in ``root`` (turnlog/engine -> ../engine)."""
    here = root
    for part in rel.parts[:-1]:
        here = here / part
        if here.is_symlink():
            return True
    return False


def import_graph(modules: dict[str, Path]) -> dict[str, list[Edge]]:
    """Each module's imports of other modules in ``modules``."""
    graph: dict[str, list[Edge]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        edges: dict[str, Edge] = {}
        for node, how in _imports(tree):
            for target in _targets(name, is_package, node):
                while target and target not in modules:
                    target = target.rpartition(".")[0]  # a.b is a name in a, or a.b.c one in a.b
                if target and target != name and target not in edges:
                    edges[target] = Edge(target, how, node.lineno)
        graph[name] = list(edges.values())
    return graph


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement, with how it runs (see ``Edge.how``)."""
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []

    def visit(node: ast.AST, how: str) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, how))
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                visit(child, "type")
            for child in node.orelse:
                visit(child, how)
            return
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and how == "run":
            how = "call"
        for child in ast.iter_child_nodes(node):
            visit(child, how)

    visit(tree, "run")
    return found


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """What an import names: ``from a import b`` names module ``a.b`` if there is one, else
    ``a`` (``import_graph`` then walks up to the nearest module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        if not is_package:
            base.pop()
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join([*base, *([node.module] if node.module else [])])
    else:
        prefix = node.module or ""
    return [f"{prefix}.{alias.name}" for alias in node.names]


def circles(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for edge in graph.get(v, []):
            w = edge.target
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def path_through(graph: dict[str, list[Edge]], component: list[str]) -> str:
    """One circle inside ``component``, as ``a -(run:12)-> b -(type:30)-> a``: a shortest way
    from its first module back to itself, each step with how and where it imports."""
    inside = set(component)
    start = component[0]
    came: dict[str, tuple[str, Edge]] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for edge in graph[v]:
                if edge.target in inside and edge.target not in came:
                    came[edge.target] = (v, edge)
                    following.append(edge.target)
        if start in came:
            break
        frontier = following
    steps: list[tuple[str, Edge]] = []
    at = start
    while True:
        v, edge = came[at]
        steps.append((v, edge))
        at = v
        if at == start:
            break
    text = start
    for _, edge in reversed(steps):
        text += f" -({edge.how}:{edge.line})-> {edge.target}"
    return text


def test_no_import_circles() -> None:
    graph = import_graph(turnlog_modules())
    found = circles(graph)
    named = "\n".join(path_through(graph, c) for c in found)
    assert not found, f"import circles (break each: move what both need below them):\n{named}"


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """Circles closed by a type-only import, an import inside a function and a relative
    ``from . import x`` are all found and named; a one-way chain is not a circle."""
    files = {
        "engine/__init__.py": "",
        "engine/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "engine/b.py": "from turnlog.engine.a import thing\n",
        "engine/c.py": "def f():\n    from . import d\n",
        "engine/d.py": "from .c import f\nfrom . import e\n",
        "engine/e.py": "import json\n",
        "turnlog/__init__.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    modules = turnlog_modules(tmp_path)
    assert "turnlog.engine.e" in modules and "turnlog" in modules
    graph = import_graph(modules)
    found = circles(graph)
    assert found == [["turnlog.engine.a", "turnlog.engine.b"], ["turnlog.engine.c", "turnlog.engine.d"]]
    assert (
        path_through(graph, found[0])
        == "turnlog.engine.a -(type:3)-> turnlog.engine.b -(run:1)-> " + found[0][0]
    )
    assert (
        path_through(graph, found[1])
        == "turnlog.engine.c -(call:2)-> turnlog.engine.d -(run:1)-> " + found[1][0]
    )


def test_every_product_module_is_in_the_graph() -> None:
    modules = turnlog_modules()
    for name in ("engine.fold", "gateway.service", "cli", "examples.logistics.tools", "engine.log.kafka"):
        assert f"turnlog.{name}" in modules, name
    assert not any(name.startswith(("turnlog.turnlog", "turnlog.examples.my_agents")) for name in modules)
    assert len(modules) > 150
