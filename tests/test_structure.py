"""The shape of kgen/ itself: no import circle among its modules (deferred imports count), and no module
longer than a reader can hold (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "kgen"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The kgen modules ``path`` imports anywhere in its body (functions included): ``from a import b`` counts as
    importing ``a.b`` where that is a module, else ``a``."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                found.add(candidate if candidate in modules else source)
    return {m for m in found if m in modules and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_no_import_circle_among_kgen_modules():
    modules = _modules()
    graph = {name: _imports(path, name, modules) for name, path in modules.items()}
    circle = _cycle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_circle_finder_finds_a_circle_deferred_imports_included(tmp_path):
    # The check above must be able to fail: a deferred import closing a loop is a circle.
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("import pkg.b\n")
    (package / "b.py").write_text("def f():\n    from pkg import a\n")
    modules = {"pkg.a": package / "a.py", "pkg.b": package / "b.py"}
    graph = {name: _imports(path, name, modules) for name, path in modules.items()}
    assert _cycle(graph) in (["pkg.a", "pkg.b", "pkg.a"], ["pkg.b", "pkg.a", "pkg.b"])


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_module_over_the_line_limit(name):
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: it probably holds two jobs"


def test_only_the_launcher_names_private_cuda_core_modules():
    # cuda.core 1.2 exports the tensor-map swizzle enum only from a private module: kgen/launch.py is the one
    # place that imports it, and pyproject pins cuda-core to the 1.2 series, tested on the GPU (1.2.0) and here.
    modules = _modules()
    private = set()
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            private.update((name, m) for m in names
                           if m.startswith("cuda.core") and any(part.startswith("_") for part in m.split(".")))
    assert {name for name, _ in private} == {"kgen.launch"}, sorted(private)
    import tomllib

    dependencies = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "cuda-core>=1.2.0,<1.3" in dependencies
