"""swalab's modules import downward only: the layers contract of pyproject.toml holds, and no import circle exists
anywhere in the package (each module reached from itself through its imports), lazy imports inside functions
included. A change that imports upward fails here with the import named. No function of the package is longer than
MAX_FUNCTION_LINES, counted from its first decorator to its last line (issue 41)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 60


def lint_imports() -> str:
    script = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if script is None:
        pytest.skip("import-linter is not installed: pip install -e '.[test]'")
    return script


def test_every_module_imports_only_from_the_layers_below_its_own():
    done = subprocess.run([lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 kept, 0 broken" in done.stdout


def import_circles() -> list[list[str]]:
    """The strongly connected components of swalab's import graph with more than one module (Tarjan)."""
    import grimp

    graph = grimp.build_graph("swalab")
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & graph.modules for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
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
                circles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return circles


def test_no_module_reaches_itself_through_its_imports():
    pytest.importorskip("grimp", reason="import-linter (which brings grimp) is not installed: pip install -e '.[test]'")
    assert import_circles() == []


def test_the_circle_finder_finds_a_circle(tmp_path, monkeypatch):
    """The check above can fail: a package whose two modules import each other is reported."""
    pytest.importorskip("grimp")
    import grimp

    package = tmp_path / "circular"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from circular import b\n")
    (package / "b.py").write_text("from circular import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = grimp.build_graph
    monkeypatch.setattr(grimp, "build_graph", lambda name: real("circular"))
    assert import_circles() == [["circular.a", "circular.b"]]


def long_functions(package: Path) -> list[str]:
    """``<module>:<qualified name> <n> lines`` for each function under ``package`` (methods and nested ones too)
    longer than MAX_FUNCTION_LINES, its decorators and docstring counted."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        scope: dict[ast.AST, str] = {tree: ""}  # each node's enclosing classes and functions, outermost first
        for parent in ast.walk(tree):  # breadth first: a parent's scope is known before its children's
            for node in ast.iter_child_nodes(parent):
                defines = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                scope[node] = f"{scope[parent]}.{node.name}".lstrip(".") if defines else scope[parent]
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1
                    if lines > MAX_FUNCTION_LINES:
                        found.append(f"{path.relative_to(package).as_posix()}:{scope[node]} {lines} lines")
    return found


def test_no_function_is_longer_than_60_lines():
    found = long_functions(ROOT / "src" / "swalab")
    assert not found, f"longer than {MAX_FUNCTION_LINES} lines (split out a part of one job): " + "; ".join(found)


def test_the_length_check_names_a_long_function_with_its_length(tmp_path):
    """The check above can fail: a decorated method of 61 lines is named, one of 60 is not."""
    body = "".join(f"        x{i} = {i}\n" for i in range(58))
    (tmp_path / "m.py").write_text(f"class C:\n    @staticmethod\n    def long():\n{body}        return 1\n\n"
                                   f"    def short():\n{body}        return 1\n")
    assert long_functions(tmp_path) == ["m.py:C.long 61 lines"]
