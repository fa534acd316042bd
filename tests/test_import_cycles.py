"""No import inside a function hides a cycle: a module imported lazily does not import its importer back,
at import time or inside a function of its own."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"freespec": "freespec", "freespec.vllm_plugins": "vllm_plugins", "freespec.proposers": "proposers",
           "freespec.scorers": "scorers", "freespec.kernels": "kernels", "freespec.cli": "cli"}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if package == "freespec" and parts and f"freespec.{parts[0]}" in FOLDERS:
                continue
            found[".".join([package, *parts])] = path
    return found


def _imports(modules: dict[str, pathlib.Path]):
    """Per module: the freespec modules it imports at import time, and those it imports inside functions."""
    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    eager: dict[str, set[str]] = {m: set() for m in modules}
    lazy: dict[str, set[str]] = {m: set() for m in modules}

    for module, path in modules.items():
        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue  # for type checkers only
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    if isinstance(child, ast.Import):
                        names = [a.name for a in child.names]
                    else:
                        names = [child.module or ""] + [f"{child.module}.{a.name}" for a in child.names]
                    for target in filter(None, map(resolve, names)):
                        if target != module:
                            (lazy if in_function else eager)[module].add(target)
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        visit(ast.parse(path.read_text()), False)
    return eager, lazy


def _ancestors(module: str) -> set[str]:
    """The packages above ``module``: Python imports them before it, so an import of one is no cycle."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def hidden_cycles(eager: dict[str, set[str]], lazy: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The function-level imports ``(module, target)`` whose target imports ``module`` back, directly or
    through other modules, at import time or inside functions."""
    edges = {m: (eager[m] | lazy[m]) - _ancestors(m) for m in eager}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(edges[m])
        return False

    return {(m, target) for m, targets in lazy.items() for target in targets - _ancestors(m)
            if reaches(target, m)}


def test_a_cycle_of_two_function_level_imports_is_found():
    eager = {"a": set(), "b": set(), "c": set()}
    lazy = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert hidden_cycles(eager, lazy) == {("a", "b"), ("b", "a")}
    assert hidden_cycles(eager, {"a": {"b"}, "b": set(), "c": {"a"}}) == set()


def test_no_function_level_import_hides_an_import_cycle():
    modules = _modules()
    assert hidden_cycles(*_imports(modules)) == set()
