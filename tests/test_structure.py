"""The package's import structure: no module imports, directly or through others, a module that
imports it back — counting the imports made inside functions (a lazy import hides a circle from
Python, not from a reader). Read from the source with `ast`; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "autoparallel"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package modules `path` imports anywhere in its body (module level or in functions)."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join(base + (node.module.split(".") if node.module else []))
            for alias in node.names:  # `from . import x` may name a module
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    names = set(files)
    return {n: _imports(p, n, names) for n, p in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _without_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Drop each module's edges to the packages that contain it (`autoparallel.cost.time` ->
    `autoparallel`, `autoparallel.cost`): a module imports its package's `__init__` to be
    imported at all, and what that `__init__` re-exports is not a dependency of its code."""
    return {n: {m for m in deps if not n.startswith(m + ".")} for n, deps in graph.items()}


def test_the_detector_sees_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_reader_resolves_relative_and_lazy_imports():
    graph = _graph()
    # module level, relative: evaluate.py imports the cost model's Arch
    assert "autoparallel.cost.arch" in graph["autoparallel.evaluate"]
    # inside a function, relative two levels up: plan_cmd imports the layout spec lazily
    assert "autoparallel.specs.layout" in graph["autoparallel.cli.plan_cmd"]


def test_no_module_imports_back_into_itself():
    cycles = _cycles(_without_packages(_graph()))
    assert cycles == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def _packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between the package's parts: each subpackage (`cost`, `search`, `output`, ...)
    one node, each top-level module its own; the root `__init__` (the public re-exports) left
    out."""
    def part(m: str) -> str:
        bits = m.split(".")
        sub = PACKAGE / bits[1] if len(bits) > 1 else None
        return ".".join(bits[:2]) if sub is not None and sub.is_dir() else m

    out: dict[str, set[str]] = {}
    for n, deps in graph.items():
        if n == "autoparallel":
            continue
        out.setdefault(part(n), set()).update(part(m) for m in deps if m != "autoparallel")
    return {n: {m for m in deps if m != n} for n, deps in out.items()}


def test_no_package_imports_back_into_one_that_imports_it():
    cycles = _cycles(_packages(_graph()))
    assert cycles == [], "circles between packages: " + "; ".join(" -> ".join(c) for c in cycles)
