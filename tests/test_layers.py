"""The package's layers import one way (docs/DESIGN.md): an ``ast`` walk over every module, function-local
imports included, fails on an import that points up a layer, across two packages of one layer, or closes a
circle; and the same walk catches each of those in a planted package (the negative controls)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mtad"
# lower imports nothing higher; packages of one rank do not import each other
LAYERS = {"_util": 0, "decoding": 1, "models": 2, "tasks": 3, "measure": 3, "train": 3, "report": 4,
          "harness": 5, "": 6}


def module_name(path: Path, root: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path) -> list[tuple[str, str, int, bool]]:
    """(importer, imported module, line, at module level) for every import of ``root``'s own modules."""
    modules = {module_name(p, root) for p in root.rglob("*.py")}
    out = []
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # `from pkg import mod` imports the module pkg.mod where one exists
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for t in targets:
                if t == root.name or t.startswith(root.name + "."):
                    out.append((name, t, node.lineno, id(node) in top))
    return out


def layer(module: str) -> tuple[str, int]:
    parts = module.split(".")
    pkg = parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else ""
    return pkg, LAYERS.get(pkg, LAYERS[""])


def problems(root: Path) -> list[str]:
    edges = imports(root)
    found = []
    for src, dst, line, _ in edges:
        (sp, sr), (dp, dr) = layer(src), layer(dst)
        if dr > sr or (dr == sr and sp != dp):
            found.append(f"{src}:{line} imports {dst} ({dp or 'top'} is not below {sp or 'top'})")
    graph: dict[str, set[str]] = {}
    for src, dst, _, _ in edges:
        if src != dst and not src.startswith(dst + "."):  # a module may import its own package's re-exports
            graph.setdefault(src, set()).add(dst)
    found += [f"import circle: {' -> '.join(c)}" for c in _cycles(graph)]
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [])
    return cycles


def local_imports(root: Path) -> list[str]:
    """Function-local imports of the package's own modules: the dependency graph is read from file heads."""
    # (a module run with ``python -m`` may import itself under its package name: that is no dependency)
    return [f"{src}:{line} imports {dst} inside a function" for src, dst, line, top in imports(root)
            if not top and src != dst]


def test_layers_import_one_way():
    assert problems(PACKAGE) == []


def test_own_imports_sit_at_module_heads():
    assert local_imports(PACKAGE) == []


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "mtad"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


PLANTED = {"__init__.py": "", "decoding/__init__.py": "", "decoding/core.py": "X = 1\n",
           "harness/__init__.py": "", "harness/runner.py": "from mtad.decoding.core import X\n",
           "tasks/__init__.py": "", "measure/__init__.py": ""}


def test_planted_clean_tree_passes(tmp_path):
    assert problems(_plant(tmp_path, PLANTED)) == []


@pytest.mark.parametrize("rel, text, expect", [
    ("decoding/up.py", "def f():\n    from mtad.harness import runner\n", "decoding.up:2 imports mtad.harness.runner"),
    ("tasks/side.py", "from mtad.measure import x\n", "tasks.side:1 imports mtad.measure"),
    ("decoding/a.py", "from mtad.decoding import b\n", "import circle"),
])
def test_planted_violation_is_caught(tmp_path, rel, text, expect):
    files = dict(PLANTED, **{rel: text})
    if rel == "decoding/a.py":
        files["decoding/b.py"] = "def f():\n    from mtad.decoding import a\n"
    if rel == "tasks/side.py":
        files["measure/x.py"] = ""
    found = problems(_plant(tmp_path, files))
    assert any(expect in f for f in found), found


def test_planted_local_import_is_caught(tmp_path):
    root = _plant(tmp_path, dict(PLANTED, **{"harness/lazy.py": "def f():\n    import mtad.decoding.core\n"}))
    assert local_imports(root) == ["mtad.harness.lazy:2 imports mtad.decoding.core inside a function"]
