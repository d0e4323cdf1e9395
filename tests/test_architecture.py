"""The package's shape (docs/architecture.md): layers, no import circles, pure algorithms, small modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lmrl"
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


LAYERS = [
    {"algorithms", "numerics", "notices", "config_base", "tracking", "sandbox"},
    {"parallel"},
    {"config", "config_sections", "config_trl"},
    {"data", "report"},
    {"models"},
    {"rollout"},
    {"rewards"},
    {"eval"},
    {"trainers", "generate", "cai"},
    {"swarm"},
    {"cli", "demo"},
    {"__main__"},
]
"""docs/architecture.md's layers, lowest first: a module imports only from its own room and lower layers, at
module level or inside functions alike. A module that imports nothing of lmrl (e.g. `lmrl.eval.spec`,
`lmrl.models.gguf`) is a leaf any layer may import: no edge leaves it, so it can close no circle."""


def room(name: str) -> str:
    """The top-level room of a module: lmrl.trainers.rl.trainer -> trainers, lmrl.cli -> cli."""
    return name.split(".")[1] if name != "lmrl" else "lmrl"


def all_imports(name: str) -> set[str]:
    """lmrl modules that ``name`` imports anywhere: at module level or inside a function."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target.startswith("lmrl") and target != name:
                found.add(target)
    return found


def layer_violations() -> list[str]:
    layer_of = {r: i for i, rooms in enumerate(LAYERS) for r in rooms}
    imports = {m: all_imports(m) for m in MODULES}
    leaves = {m for m, targets in imports.items() if not targets}
    out = []
    for name, targets in sorted(imports.items()):
        if room(name) == "lmrl":
            continue
        for target in sorted(targets - leaves):
            if room(target) != room(name) and layer_of[room(target)] > layer_of[room(name)]:
                out.append(f"{name} imports {target} (layer {room(target)} is above {room(name)})")
    return out


def test_every_room_has_a_layer():
    rooms = {room(m) for m in MODULES} - {"lmrl"}
    assert rooms == set().union(*LAYERS), "add the new room to LAYERS and to docs/architecture.md"


def test_imports_follow_the_layers_also_inside_functions():
    assert layer_violations() == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
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
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            connect(v)
    return out


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles_also_through_imports_inside_functions():
    # a package's __init__ imports its own modules; only circles between modules count
    graph = {m: {t for t in all_imports(m) if not m.startswith(t + ".")} for m in MODULES}
    assert cycles(graph) == []


def test_algorithms_import_nothing_of_lmrl_but_themselves():
    for name in MODULES:
        if name.startswith("lmrl.algorithms"):
            outside = {t for t in all_imports(name) if not t.startswith("lmrl.algorithms")}
            assert not outside, f"{name} imports {outside}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by responsibility (<= {MAX_LINES})"


def test_the_rl_update_reads_top_to_bottom():
    """`lmrl.trainers.rl.update.update`: at most 40 lines and 3 levels of nesting (the concerns behind names)."""
    tree = ast.parse(MODULES["lmrl.trainers.rl.update"].read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "update")

    def depth(node: ast.AST) -> int:
        inner = [depth(c) for c in ast.iter_child_nodes(node)]
        nested = isinstance(node, (ast.For, ast.While, ast.If, ast.With, ast.Try))
        return int(nested) + max(inner, default=0)

    assert fn.end_lineno - fn.lineno + 1 <= 40 and depth(fn) <= 3
