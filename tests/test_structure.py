"""The package's house rules, checked from its source: one-way imports, short functions.

Imports are read with ``ast`` (module level and inside functions alike, and
``importlib.import_module`` calls with a literal name), resolved to the
package's own modules, and the resulting graph must have no cycle; the wings
must only import downwards (graph <- budget <- latency <- planning <- cli; graph <- transfer <-
planning).
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_precrop"
MAX_LINES = 60  # lines of code per function: no blank, comment or docstring lines

# Which wings each wing may import (besides itself and the shared leaf modules).
LEAVES = {"keras_precrop.errors", "keras_precrop._json", "keras_precrop._tables",
          "keras_precrop._startup", "keras_precrop.progress"}
ALLOWED = {
    "graph": set(),
    "budget": {"graph"},
    "latency": {"graph", "budget"},
    "pai": {"graph", "training"},
    "transfer": {"graph"},
    "training": set(),
    "models": set(),
}


def _modules(root):
    """``{dotted module name: path}`` of every module under the package ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name, path, known):
    """The package's modules that module ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            targets = [node.args[0].value]
        found.update(t for t in targets if t in known and t != name)
    return found


def import_graph(root):
    """``{module: set of package modules it imports}`` for the package at ``root``."""
    known = _modules(root)
    return {name: _imports(name, path, known) for name, path in known.items()}


def cycles(graph):
    """The strongly connected components of more than one module (or a self-import)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_cycle_check_finds_a_circle_inside_a_function(tmp_path):
    # The circle that came back unnoticed: a function-level import of a module that imports us.
    _write(tmp_path / "pkg", {
        "__init__.py": "",
        "planning.py": "from pkg import latency\n",
        "latency.py": "def f():\n    from pkg import planning\n    return planning\n",
        "leaf.py": "import pkg.latency\n",
    })
    assert cycles(import_graph(tmp_path / "pkg")) == [["pkg.latency", "pkg.planning"]]


def test_the_package_imports_one_way():
    assert cycles(import_graph(PACKAGE)) == []


def _wing(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_each_wing_imports_only_the_wings_below_it():
    graph = import_graph(PACKAGE)
    assert set(ALLOWED) <= {_wing(m) for m in graph}, "a wing was renamed: update ALLOWED"
    wrong = sorted((module, target) for module, targets in graph.items()
                   if _wing(module) in ALLOWED
                   for target in targets
                   if target not in LEAVES and _wing(target) != _wing(module)
                   and _wing(target) not in ALLOWED[_wing(module)])
    assert wrong == []


def _lines_of_code(lines, node):
    body = node.body
    doc = set()
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        doc = set(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for i in range(node.lineno, node.end_lineno + 1)
               if i not in doc and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#"))


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_longer_than_sixty_lines_of_code(path):
    source = path.read_text()
    lines = source.splitlines()
    long = [(node.name, node.lineno, _lines_of_code(lines, node))
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and _lines_of_code(lines, node) > MAX_LINES]
    assert long == []
