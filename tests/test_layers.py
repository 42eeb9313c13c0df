"""swalab's modules import downward only: the layers contract of pyproject.toml holds, and no import circle exists
anywhere in the package (each module reached from itself through its imports), lazy imports inside functions
included. A change that imports upward fails here with the import named."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports() -> str:
    script = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if script is None:
        pytest.skip("import-linter is not installed: pip install -e '.[test]'")
    return script


def test_every_module_imports_only_from_the_layers_below_its_own():
    done = subprocess.run([lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


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
