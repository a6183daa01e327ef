"""The packages' dependencies point inward (DESIGN.md "Layout"), read from the source with `ast`:
every `import` and `from … import`, at the top of a module or inside a function.

    stack/                       assembles the rest: the command, `chainstate up`
    proxy/  nodes/  workspace/   the components; none imports another
    chainstate/                  shared helpers, a leaf: imports no other package of ours
    bench/  tests/               use anything; no product package imports them

and no two modules import each other, directly or through others (an import for type
checkers only, under `if TYPE_CHECKING:`, counts: the two modules still know each other).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("chainstate", "proxy", "nodes", "workspace", "stack")
OURS = (*PRODUCT, "bench", "tests")

# {package: the packages of ours it must not import}
FORBIDDEN = {
    "chainstate": {"proxy", "nodes", "workspace", "stack", "bench", "tests"},
    "proxy": {"nodes", "workspace", "stack", "bench", "tests"},  # nodes only as URLs
    "nodes": {"proxy", "workspace", "stack", "bench", "tests"},
    "workspace": {"proxy", "nodes", "stack", "bench", "tests"},  # the chain through a callable
    "stack": {"bench", "tests"},
    "bench": {"tests"},
}

# Cycles known and left for later, each with why; a cycle not listed fails the test, and so
# does a listed one that is gone (take it out of this list).
KNOWN_CYCLES = {
    # the state node's traces are methods of its EVM methods' host: methods.py builds
    # TraceMethods, traces.py names EvmMethods for type checkers (a protocol would end it)
    frozenset({"nodes.state.evm.methods", "nodes.state.evm.traces"}),
    # `workspace.db.open_database` imports its backends when called, and they import the
    # base classes from the package
    frozenset({"workspace.db", "workspace.db.sqlite", "workspace.db.postgres"}),
}


def modules() -> dict[str, Path]:
    """{dotted module name: file} of every module of our packages."""
    out = {}
    for top in OURS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


@functools.cache
def imports(name: str, path: Path) -> tuple[tuple[int, str], ...]:
    """(line, imported name) of every import in the module, relative ones made absolute;
    `from a import b` gives `a` and `a.b` (b may be a module). Kept: both tests read every
    module, and parsing them is most of their time."""
    return tuple(_imports(name, path))


def _imports(name: str, path: Path) -> Iterator[tuple[int, str]]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def test_packages_import_only_inward() -> None:
    found: dict[str, str] = {}  # {file:line: the module it imports}
    for name, path in modules().items():
        banned = FORBIDDEN.get(name.split(".")[0], set())
        for line, imported in imports(name, path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if imported.split(".")[0] in banned and where not in found:
                found[where] = imported  # (the module comes before the names it gives)
    shown = [f"{where} imports {imported}" for where, imported in sorted(found.items())]
    assert not found, "imports against the layering:\n" + "\n".join(shown)


def graph() -> dict[str, set[str]]:
    """{module: the modules of ours it imports}."""
    mods = modules()
    out: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        for _, imported in imports(name, path):
            while imported and imported not in mods:  # `a.b.name` → the module `a.b`
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                out[name].add(imported)
    return out


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    found = set(cycles(graph()))
    new = [sorted(c) for c in found - KNOWN_CYCLES]
    assert not new, f"modules that import each other: {new}"
    gone = [sorted(c) for c in KNOWN_CYCLES - found]
    assert not gone, f"no longer a cycle, take it out of KNOWN_CYCLES: {gone}"


def test_the_checks_see_a_bad_import(tmp_path: Path) -> None:
    """The reader finds imports inside functions and relative ones, and Tarjan finds a
    cycle through three modules (else the tests above could pass on a blind reader)."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from bench.suite import x\n    from .. import sib\n")
    got = list(imports("nodes.state.m", module))
    assert (2, "bench.suite") in got and (3, "nodes.sib") in got
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [frozenset({"a", "b", "c"})]
