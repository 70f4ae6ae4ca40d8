"""Imports point down the floors of the house (the architecture guide's layers), and no two packages
import each other, even through others.

Every module under tram/ is parsed (not imported): its module-level imports and the ones inside
functions (the lazy ones count: they run), relative imports resolved, and `importlib.import_module`
with a literal name. (A registry that imports a module named in a variable is not an edge: that is
how config names a layer's choice without importing the layer.) Each module belongs to a
package (tram/engine/core.py to `engine`, tram/logger.py to `logger`) and each package to a floor.
A package may import a package on a lower floor; on the same floor only at the top (the tools that
sit above everything) and at the leaves (public types); so `core` and `model`, siblings, never
import each other. `config` imports nothing of Tram's at all.

`structured_output` (grammar engines, per-request matchers and the manager that fills the step's
bitmask) runs in the engine core's process beside the executor: it imports `core` for the requests
and the bitmask struct, and only `engine` imports it. The constraint a request carries
(StructuredOutputsParams) is a leaf in tram/sampling_params/, since the server and SamplingParams
need it; the bitmask crosses to the worker inside the scheduler output (tram/core/sched_output.py).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

TRAM = Path(__file__).resolve().parents[1] / "tram"

TOP, LEAF = 8, 0
FLOORS: dict[str, int] = {
    # tools above everything: the public package, the CLI, the offline LLM, `tram bench`
    "tram": TOP,
    "__main__": TOP,
    "entrypoints": TOP,
    "bench": TOP,
    "server": 7,
    "engine": 6,
    "executor": 5,
    "structured_output": 5,
    "worker": 4,
    # the proposers: the worker runs them (a draft model is a model), the engine's config names them
    "spec_decode": 3,
    "core": 2,
    "model": 2,
    "distributed": 1,
    # public types and process-wide settings, importable from every floor
    "config": LEAF,
    "envs": LEAF,
    "logger": LEAF,
    "sampling_params": LEAF,
    "outputs": LEAF,
    "version": LEAF,
}
# Leaves that import nothing of Tram's outside themselves.
ISOLATED = {"config", "envs"}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module, dotted
    line: int

    def where(self, modules: dict[str, Path]) -> str:
        return f"{modules[self.source].relative_to(TRAM.parent)}:{self.line}: {self.source} imports {self.target}"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(TRAM.rglob("*.py")):
        parts = path.relative_to(TRAM.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _package(module: str) -> str:
    """`tram.engine.core` -> engine, `tram.logger` -> logger, `tram` -> tram."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module that defines `name` (itself, or the longest prefix that is a module)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """The modules of ours that one import statement loads (the package itself only when a name is
    taken from its __init__)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".")
            if modules[module].name != "__init__.py":
                package = package[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    owners = {_owner(name, modules) for name in names if name == "tram" or name.startswith("tram.")}
    return sorted(o for o in owners if o is not None and o != module)


def _import_module_literal(node: ast.AST) -> str | None:
    """The module named by `importlib.import_module("tram....")` with a literal name, else None."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    name = node.args[0].value
    if called == "import_module" and isinstance(name, str) and name.startswith("tram."):
        return name
    return None


def import_edges() -> tuple[dict[str, Path], list[Edge]]:
    modules = _modules()
    edges = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges += [Edge(module, target, node.lineno) for target in _imported(module, node, modules)]
            elif (name := _import_module_literal(node)) and (target := _owner(name, modules)) not in (None, module):
                edges.append(Edge(module, target, node.lineno))
    return modules, sorted(edges, key=lambda e: (e.source, e.line, e.target))


def _violation(edge: Edge) -> str | None:
    src, dst = _package(edge.source), _package(edge.target)
    if src == dst:
        return None
    if src in ISOLATED:
        return f"{src} imports nothing of Tram's"
    below, above = FLOORS[dst], FLOORS[src]
    if below > above:
        return f"upward: {src} (floor {above}) -> {dst} (floor {below})"
    if below == above and above not in (TOP, LEAF):
        return f"siblings: {src} and {dst} share floor {above}"
    return None


def _package_graph(edges: list[Edge]) -> dict[str, dict[str, Edge]]:
    """package -> {imported package: the first import that makes the edge}."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        src, dst = _package(e.source), _package(e.target)
        graph.setdefault(dst, {})
        if src != dst:
            graph.setdefault(src, {}).setdefault(dst, e)
        else:
            graph.setdefault(src, {})
    return graph


def _shortest_cycle(graph: dict[str, dict[str, Edge]], start: str) -> list[str] | None:
    """The shortest path of packages from `start` back to itself, or None."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt not in parents:
                    parents[nxt] = node
                    following.append(nxt)
        frontier = following
    return None


def package_cycles(edges: list[Edge]) -> list[list[str]]:
    """One shortest cycle through each package that is on one, without repeats."""
    graph = _package_graph(edges)
    cycles: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for package in sorted(graph):
        cycle = _shortest_cycle(graph, package)
        if cycle is not None and frozenset(cycle) not in seen:
            seen.add(frozenset(cycle))
            cycles.append(cycle)
    return cycles


def test_every_package_has_a_floor() -> None:
    modules, _ = import_edges()
    missing = sorted({_package(m) for m in modules} - FLOORS.keys())
    assert not missing, f"packages without a floor (add them to FLOORS): {missing}"


def test_the_parser_sees_lazy_and_relative_imports() -> None:
    """Guards against a vacuous pass: a function-local import is an edge like any other."""
    _, edges = import_edges()
    pairs = {(e.source, e.target) for e in edges}
    assert ("tram.engine.core_client", "tram.engine.core_proc") in pairs  # inside _engine_core_main
    assert ("tram.core.scheduler", "tram.core.kv_cache_manager") in pairs
    assert len(pairs) > 300


def test_imports_point_down_the_floors() -> None:
    modules, edges = import_edges()
    bad = [f"{e.where(modules)} ({why})" for e in edges if (why := _violation(e))]
    assert not bad, "imports against the floors:\n" + "\n".join(bad)


def test_no_import_cycle_between_packages() -> None:
    modules, edges = import_edges()
    graph = _package_graph(edges)
    report = []
    for cycle in package_cycles(edges):
        report.append(" -> ".join(cycle))
        report += [f"  {graph[a][b].where(modules)}" for a, b in zip(cycle, cycle[1:])]
    assert not report, "packages that import each other:\n" + "\n".join(report)
