"""genolc's modules import one another in layers: no module reaches, directly or through others, back to itself.

Every import counts, those inside functions too (a function-level import that closes a circle only moves the
failure to the first call); imports under ``if TYPE_CHECKING:`` are left out (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import genolc

PACKAGE = Path(genolc.__file__).parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("genolc",) + path.relative_to(PACKAGE).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The genolc modules ``name`` imports, each with the first line that imports it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target in modules and target != name:
            found.setdefault(target, line)

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    add(submodule if submodule in modules else base, node.lineno)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])
                elif isinstance(child, ast.excepthandler):
                    visit(child.body)

    visit(ast.parse(path.read_text()).body)
    return found


def _cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in edges:
        if node not in index:
            connect(node)
    return components


def test_no_import_cycles_inside_genolc():
    modules = _modules()
    edges = {name: _imports(name, path, modules) for name, path in modules.items()}
    shown = []
    for component in _cycles(edges):
        members = set(component)
        links = [f"{source} imports {target} (line {line})" for source in component
                 for target, line in sorted(edges[source].items()) if target in members]
        shown.append("; ".join(links))
    assert not shown, "import cycles inside genolc:\n" + "\n".join(shown)


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    """The checker itself: a cycle closed only inside a function, through a relative import, is found."""
    (tmp_path / "a.py").write_text("import genolc.b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import x\n    return x\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from genolc.a import y\n")
    modules = {f"genolc.{p.stem}": p for p in tmp_path.glob("*.py")}
    edges = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert edges == {"genolc.a": {"genolc.b": 1}, "genolc.b": {"genolc.a": 2}, "genolc.c": {}}
    assert _cycles(edges) == [["genolc.a", "genolc.b"]]


def test_layers_reach_kernels_through_dispatch_and_backends_are_named_by_what_they_are():
    """A layer takes an op from ``ops/dispatch.py`` and its helpers from modules named for them, never from a
    ``reference.py`` (the pure-torch definition of an op, for CPU and for tests); no op module is a vague ``fast``."""
    modules = _modules()
    for name, path in modules.items():
        if name.startswith("genolc.model.layers."):
            from_reference = sorted(t for t in _imports(name, path, modules) if t.endswith(".reference"))
            assert not from_reference, f"{name} imports {from_reference}"
    vague = sorted(name for name in modules if name.startswith("genolc.model.ops.") and name.rsplit(".", 1)[1]
                   in ("fast", "tilelang_fwd", "tilelang_bwd"))
    assert not vague, vague
