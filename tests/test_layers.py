"""The rooms' import rules (docs/architecture.md, "Rules the tests enforce"): every import of every module
is read, those inside functions and under ``TYPE_CHECKING`` included, and each must go to a room the rules
allow. A lazy import for an optional dependency is still an import: it may only point where a top-level one
could. The test is tested on planted modules that cross a rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import grpokit

PACKAGE = Path(grpokit.__file__).parent

ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "data": {"core"},
    "models": {"core", "data"},
    "rollout": {"core", "data", "models"},
    "rewards": {"core", "data", "models"},
    "envs": {"core", "data", "models", "rollout", "rewards"},
    "rm": {"core", "data", "models", "rewards"},
    "eval": {"core", "data", "models", "rollout", "rewards", "envs"},
    "tasks": {"core", "data", "models", "rollout", "rewards", "envs", "eval"},
    "config": {"core", "data", "models", "rollout", "rewards", "envs"},
    "reporting": {"core", "data", "models", "rollout", "config"},
    "parallel": {"core", "data", "models", "rollout", "config"},
    "sampling": {"core", "data", "models", "rollout", "rewards", "envs", "config", "reporting"},
    "train": {
        "core", "data", "models", "rollout", "rewards", "envs", "rm", "eval", "config", "reporting",
        "parallel", "sampling",
    },
    "cli": {
        "core", "data", "models", "rollout", "rewards", "envs", "rm", "eval", "tasks", "config",
        "reporting", "parallel", "sampling", "train",
    },
    "": {"config", "rollout", "train"},  # grpokit/__init__.py: the public API
    "__main__": {"cli"},  # grpokit/__main__.py: python -m grpokit runs the command line
}
"""room -> the rooms its modules may import (a room may always import itself)."""


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every grpokit import in ``path``: top level, inside functions and classes,
    under ``if TYPE_CHECKING``, relative ones resolved."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from grpokit import train` imports the room named by the alias
            modules = [f"{target}.{alias.name}" for alias in node.names] if target == "grpokit" else [target]
            found += [(node.lineno, m) for m in modules]
    return [(line, m) for line, m in found if m == "grpokit" or m.startswith("grpokit.")]


def room_of(module: str) -> str:
    """``grpokit.train.trainer`` -> ``train``; ``grpokit`` -> "" (the package's own __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def crossings(root: Path) -> list[str]:
    """Every import that breaks ``ALLOWED``, as ``file:line: room -> room (module)``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        source_room = room_of(module_name(path, root))
        allowed = ALLOWED.get(source_room)
        for line, target in imported_modules(path, root):
            target_room = room_of(target)
            if target_room == source_room:
                continue  # within a room
            if allowed is None or target_room not in allowed:
                where = f"{path.relative_to(root.parent)}:{line}"
                out.append(f"{where}: {source_room} -> {target_room} ({target})")
    return out


def test_every_room_has_rules():
    rooms = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms == set(ALLOWED) - {"", "__main__"}  # (the package's own __init__ and __main__)


def test_no_import_crosses_a_rule():
    assert crossings(PACKAGE) == []


def test_the_rules_have_no_cycle():
    """Rooms ordered so that each imports only rooms before it: a topological order exists."""
    done: set[str] = set()
    remaining = {room: set(deps) for room, deps in ALLOWED.items() if room}
    while remaining:
        ready = [room for room, deps in remaining.items() if deps <= done]
        assert ready, f"the rules hold a cycle among {sorted(remaining)}"
        done.update(ready)
        for room in ready:
            del remaining[room]


def module_graph(root: Path) -> dict[str, set[str]]:
    """module -> the grpokit modules it imports (every import, as above): ``from pkg import name`` counts as
    ``pkg.name`` when that is a module, else as ``pkg`` (its ``__init__``)."""
    modules = {module_name(path, root): path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_back():
    """No cycle between modules either (function-local imports counted): a package's ``__init__`` imports
    its modules, and none of them imports the package (or another module that leads back) in turn."""
    assert cycles(module_graph(PACKAGE)) == []


def test_a_planted_module_cycle_is_found(tmp_path):
    root = tmp_path / "grpokit"
    (root / "tasks").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "tasks" / "__init__.py").write_text("from grpokit.tasks.cold_start import warm\n")
    (root / "tasks" / "cold_start.py").write_text("def warm():\n    from grpokit.tasks import get_task\n")
    assert cycles(module_graph(root)) == [["grpokit.tasks", "grpokit.tasks.cold_start"]]


def test_core_imports_only_torch():
    """Pure math: torch and the standard library, nothing else (no transformers, no files)."""
    import sys

    third_party = set()
    for path in (PACKAGE / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                third_party.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level:
                third_party.add((node.module or "").split(".")[0])
    assert {name for name in third_party if name not in sys.stdlib_module_names} <= {"torch", "grpokit"}


@pytest.mark.parametrize(
    ("room", "code", "crossing"),
    [
        ("eval", "def f():\n    from grpokit.train.prompts import PromptSampler\n", "eval -> train"),
        ("rollout", "if TYPE_CHECKING:\n    from grpokit.config import GRPOConfig\n", "rollout -> config"),
        ("data", "def f():\n    from ..tasks import get_task\n", "data -> tasks"),
        ("models", "def f():\n    import grpokit.eval.generic\n", "models -> eval"),
        ("envs", "class E:\n    def m(self):\n        from grpokit import tasks\n", "envs -> tasks"),
    ],
)  # fmt: skip
def test_a_planted_function_local_crossing_fails(tmp_path, room, code, crossing):
    """A copy of the package with one module that crosses a rule inside a function: the test finds it."""
    root = tmp_path / "grpokit"
    (root / room).mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / room / "__init__.py").write_text("")
    (root / room / "planted.py").write_text(code)
    found = crossings(root)
    assert len(found) == 1 and crossing in found[0], found


def test_a_planted_allowed_import_passes(tmp_path):
    root = tmp_path / "grpokit"
    (root / "eval").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "eval" / "__init__.py").write_text("def f():\n    from grpokit.rollout import make_backend\n")
    assert crossings(root) == []
