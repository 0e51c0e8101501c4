"""The module-level import graph of clusterctl is acyclic (docs/design.md), and the layers point one way: the
supervisor loop knows nothing of the launcher, the controller nothing of the use cases, and the pure modules
nothing of transports."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "clusterctl"


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(body: list[ast.stmt], nested: bool):
    """The import statements of ``body``: top level only, or (``nested``) also those inside functions, classes
    and branches. Never those under ``if TYPE_CHECKING:`` (they do not run)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _imports(node.orelse, nested)
        elif nested:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from _imports([n for n in inner if isinstance(n, (ast.stmt, ast.excepthandler))], nested)


def _graph(nested: bool = False) -> dict[str, set[str]]:
    """Imports run when a module is imported (top level; not ``if TYPE_CHECKING:``, not inside functions); with
    ``nested``, also the imports inside functions (run on first call)."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for node in _imports(ast.parse(path.read_text()).body, nested):
            if isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names]
            elif node.module and node.level == 0:
                targets = [resolve(f"{node.module}.{a.name}") or resolve(node.module) for a in node.names]
            else:
                continue
            graph[m] |= {t for t in targets if t and t.startswith("clusterctl") and t != m}
    return graph


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for n in graph[todo.pop()]:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_no_module_imports_itself_back():
    graph = _graph()
    cycles = sorted(m for m in graph if m in _reaches(graph, m) and m != "clusterctl")
    assert cycles == []


def test_no_cycle_even_through_imports_inside_functions():
    """A lazy import is still a dependency: ``transport.base`` once imported ``transport.ssh``/``local`` inside
    ``connect()`` while both import ``base``. ``connect`` now lives in ``transport/__init__.py``; no cycle of any
    kind is allowed."""
    graph = _graph(nested=True)
    cycles = sorted(m for m in graph if m in _reaches(graph, m) and m != "clusterctl")
    assert cycles == []
    assert not {"clusterctl.transport.ssh", "clusterctl.transport.local"} & graph["clusterctl.transport.base"]


def test_layers_point_one_way():
    graph = _graph()
    assert "clusterctl.launcher" not in _reaches(graph, "clusterctl.supervisor")
    # watch.py is given its commands and connections: it knows nothing of the launcher, the plan or the pool
    watch_deps = _reaches(graph, "clusterctl.watch")
    assert not {"clusterctl.launcher", "clusterctl.plan", "clusterctl.transport.pool"} & watch_deps
    assert "clusterctl.jobs" not in _reaches(graph, "clusterctl.controller")
    assert "clusterctl.cli" not in _reaches(graph, "clusterctl.jobs")
    assert not {m for m in _reaches(graph, "clusterctl.plan") if m.startswith("clusterctl.checks")}
    for pure in ("clusterctl.plan", "clusterctl.spec", "clusterctl.supervisor", "clusterctl.causes",
                 "clusterctl.checks.model", "clusterctl.checks.registry", "clusterctl.hostport",
                 "clusterctl.observe"):
        assert not {m for m in _reaches(graph, pure) if m.startswith("clusterctl.transport")}, pure
