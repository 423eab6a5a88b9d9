"""The package's house rules, checked from its source: one-way imports, short functions.

Imports are read with ``ast`` (module level and inside functions alike, and
``importlib.import_module`` calls with a literal name), resolved to the
package's own modules, and the resulting graph must have no cycle; the wings
must only import downwards (graph <- budget <- latency <- planning <- cli; graph, training <-
transfer <- planning).
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_precrop"
MAX_LINES = 60  # lines of code per function: no blank, comment or docstring lines

# Which wings each wing may import (besides itself and the shared leaf modules).
LEAVES = {"keras_precrop.errors", "keras_precrop._json", "keras_precrop._tables",
          "keras_precrop._startup", "keras_precrop.progress", "keras_precrop._views"}
ALLOWED = {
    "graph": set(),
    "budget": {"graph"},
    "latency": {"graph", "budget"},
    "pai": {"graph", "training"},
    # Taylor importance's loss gradients and data checks are the training wing's (which imports
    # no wing, so the arrow is one-way), as the pruning baselines' (pai) are.
    "transfer": {"graph", "training"},
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


# -- one table of channel rankings (keras_precrop/transfer/criteria.py) -------------------------

TABLE = PACKAGE / "transfer" / "criteria.py"
DOCS = [PACKAGE.parent / "README.md", *sorted((PACKAGE.parent / "docs").rglob("*.md"))]


def _spelled_rankings(source, names):
    """Where ``source`` spells rankings' names itself: a literal tuple, list or set holding two of
    them, or a comparison with one (``importance == "taylor"``, ``in (None, "random")``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            spelled = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
            if len(spelled) >= 2:
                found.append((node.lineno, spelled))
        elif isinstance(node, ast.Compare):
            for side in node.comparators:
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                spelled = [e.value for e in items if isinstance(e, ast.Constant) and e.value in names]
                if spelled:
                    found.append((node.lineno, spelled))
    return found


def test_the_spelling_check_finds_a_copied_list_and_a_comparison():
    names = {"l1", "l2", "taylor"}
    source = ('CHOICES = ("l1", "l2")\nif importance == "taylor":\n    pass\n'
              'METHODS = ("l1", "snip")\nuse(importance="l1")\n')
    assert _spelled_rankings(source, names) == [(1, ["l1", "l2"]), (2, ["taylor"])]


def test_ranking_names_are_spelled_only_in_the_table():
    """cli.py's --importance choices, GradualPruning's, the hub's refusal, ... all read the table."""
    from keras_precrop.transfer.criteria import IMPORTANCE  # noqa: PLC0415  (light: no Keras)

    names = set(IMPORTANCE)
    spelled = {str(path.relative_to(PACKAGE)): found for path in sorted(PACKAGE.rglob("*.py"))
               if path != TABLE and (found := _spelled_rankings(path.read_text(), names))}
    assert spelled == {}


def test_the_docs_name_only_rankings_of_the_table_and_show_it():
    """A name after ``importance=`` or ``--importance`` is the table's; a list of them
    (``--importance l1|l2|...``) is what one command offers; the API page shows the table."""
    import re  # noqa: PLC0415

    from keras_precrop.transfer.criteria import IMPORTANCE, PLACES, Names  # noqa: PLC0415

    offered = {frozenset(Names(place)) for place in PLACES if place.startswith("keras-precrop")}
    unknown, lists = [], []
    for path in DOCS:
        text = path.read_text()
        unknown += [(path.name, n) for n in re.findall(r"importance=[\"'](\w+)[\"']", text)
                    if n not in IMPORTANCE]
        for spelled in re.findall(r"--importance[ =]([\w|]+)", text):
            if "|" in spelled and frozenset(spelled.split("|")) not in offered:
                lists.append((path.name, spelled))
            unknown += [(path.name, n) for n in spelled.split("|") if n not in IMPORTANCE
                        and n.islower()]
    assert (unknown, lists) == ([], [])
    assert "<!-- importance table -->" in (PACKAGE.parent / "docs" / "api" / "pruning.md").read_text()


def test_no_module_of_the_package_is_imported_by_a_name_in_a_string():
    """``importlib.import_module("keras_precrop....")`` hides an import from a reader (and from
    tests that read imports from the source): the package imports its modules with ``import``."""
    hidden = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", ""))
                    == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).startswith("keras_precrop")):
                hidden.append((str(path.relative_to(PACKAGE)), node.lineno))
    assert hidden == []


def test_the_command_line_spells_no_runtime_names():
    """``--runtime``'s choices are the runtime table's (``keras_precrop/latency/runtimes.py``): a
    tuple of runtime names in ``cli.py`` is a second list to forget a new runtime in."""
    from keras_precrop.latency.runtimes import RUNTIMES

    spelled = [node.lineno for node in ast.walk(ast.parse((PACKAGE / "cli.py").read_text()))
               if isinstance(node, (ast.Tuple, ast.List, ast.Set))
               and sum(isinstance(e, ast.Constant) and e.value in RUNTIMES for e in node.elts) >= 2]
    assert spelled == []


# -- module sizes, and the planning floor's jobs (issue 59) ------------------------------------

MAX_MODULE_LINES = 800  # a module longer than this holds more than one job: split it by job
MAX_PLANNING_LINES = 600  # planning.py orchestrates; the plan record, the subject and the checks live apart


def test_no_module_of_the_package_is_longer_than_eight_hundred_lines():
    long = {str(path.relative_to(PACKAGE)): count for path in sorted(PACKAGE.rglob("*.py"))
            if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_planning_orchestrates_and_gradual_pruning_does_not_sit_on_it():
    """``planning.py`` keeps ``plan``, ``apply_plan``, ``precrop`` and ``reconfigure``; the plan
    record (``plans.py``), the rebuilt model's checks (``verify.py``) and the budget kinds
    (``budget/kinds.py``) are its peers' too, so ``GradualPruning`` reads them, not the floor."""
    assert len((PACKAGE / "planning.py").read_text().splitlines()) < MAX_PLANNING_LINES
    assert "keras_precrop.planning" not in import_graph(PACKAGE)["keras_precrop.gradual"]


def test_budget_keywords_are_spelled_only_in_the_kinds_table():
    """A literal list of three budget keywords (``("params", "flops", "latency")``) or a dict keyed
    by them outside ``budget/kinds.py`` is a second list to forget a new kind of budget in."""
    from keras_precrop.budget.kinds import arguments  # light: no NumPy

    names = set(arguments())
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "budget" / "kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and sum(
                    isinstance(e, ast.Constant) and e.value in names for e in items) >= 3:
                spelled.append((str(path.relative_to(PACKAGE)), node.lineno))
    assert spelled == []
