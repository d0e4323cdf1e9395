"""The package's shape (docs/architecture.md): layers, no import circles, pure algorithms, small step/update
functions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lmrl"
SANITY_LINES = 600
"""Not a style rule: a module past this size holds two modules' worth (the largest is 450 lines). What keeps the
hot path small is the per-function budget below."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


LAYERS = [
    {"algorithms", "numerics", "notices", "config_base", "config_rules", "tracking", "sandbox"},
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


def test_no_verb_imports_another_verbs_modules_but_its_config():
    """A verb folder (`lmrl/trainers/<verb>/`) shares code through `lmrl/trainers/` or `lmrl/models/`, never through
    another verb's trainer; extending another verb's config class (distill's of SFT's) is fine."""

    def verb(name: str) -> str | None:  # lmrl.trainers.sft.trainer -> sft; lmrl.trainers.loop -> None
        parts = name.split(".")
        return parts[2] if len(parts) > 3 and parts[1] == "trainers" else None

    crossings = [
        f"{name} imports {target}"
        for name in sorted(MODULES)
        if verb(name)
        for target in sorted(all_imports(name))
        if verb(target) not in (None, verb(name)) and not target.endswith(".config")
    ]
    assert crossings == [], "move the shared piece down to lmrl/trainers/ (or lmrl/models/)"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_two_modules(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= SANITY_LINES, f"{name} has {lines} lines; split it by responsibility (<= {SANITY_LINES})"


HOT = re.compile(r"step|.+_step|update|.+_update")
"""The functions that run every step: `step`, `*_step`, `update`, `*_update`."""
MAX_STATEMENTS, MAX_DEPTH = 32, 3
"""Every hot function's budget: statements in its body (ast.stmt nodes, nested ones included) and levels of
for/while/if/with/try/match nesting (an elif counts as a level). The largest now: 30 statements, depth 3."""
OVER_BUDGET: dict[str, tuple[int, int]] = {}
"""(statements, depth) for the functions allowed past the budget, each with its reason."""


def nesting(node: ast.AST) -> int:
    """Levels of compound statements below and at ``node``."""
    nests = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try, ast.Match)
    return int(isinstance(node, nests)) + max((nesting(c) for c in ast.iter_child_nodes(node)), default=0)


def statements(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return sum(isinstance(node, ast.stmt) for top in fn.body for node in ast.walk(top))


def hot_functions() -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every hot function of lmrl by its qualified name (module, class, function)."""
    found = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef) and HOT.fullmatch(child.name):
                    found[name] = child
                visit(child, name)

    for module, path in MODULES.items():
        visit(ast.parse(path.read_text()), module)
    return found


HOT_FUNCTIONS = hot_functions()


COUNTED = """
def f(x):
    for a in x:
        if a:
            y = 1
        elif x:
            pass
"""
"""5 statements (for, if, assignment, elif, pass) at depth 3 (for > if > elif)."""


def test_the_budget_finds_the_hot_functions():
    assert "lmrl.trainers.rl.trainer.rl_step" in HOT_FUNCTIONS and "lmrl.trainers.update.update" in HOT_FUNCTIONS
    assert set(OVER_BUDGET) <= set(HOT_FUNCTIONS), "an exception names a function that is gone: remove it"
    fn = ast.parse(COUNTED).body[0]
    assert statements(fn) == 5 and nesting(fn) == 3


@pytest.mark.parametrize("name", sorted(HOT_FUNCTIONS))
def test_step_and_update_functions_stay_small(name):
    fn = HOT_FUNCTIONS[name]
    count, depth = statements(fn), nesting(fn)
    most, deepest = OVER_BUDGET.get(name, (MAX_STATEMENTS, MAX_DEPTH))
    assert count <= most and depth <= deepest, (
        f"{name} has {count} statements and depth {depth}; budget {most} statements, depth {deepest}: "
        "move a concern behind a name"
    )


def test_the_rl_update_reads_top_to_bottom():
    """`lmrl.trainers.update.update`: at most 40 lines and 3 levels of nesting (the concerns behind names)."""
    fn = HOT_FUNCTIONS["lmrl.trainers.update.update"]
    assert fn.end_lineno - fn.lineno + 1 <= 40 and nesting(fn) <= 3
