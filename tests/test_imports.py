"""The package's import graph: one direction, no cycles (issue 8).

The graph is read from the source with ``ast``, so it sees every import, including those inside functions (which
Python runs later, but which are dependencies all the same). Imports under ``if TYPE_CHECKING:`` are annotations
only and are skipped. Layers, from the top: the CLI (``cli.py``, ``commands/``) → the application (``compare``,
``training``, ``eval``) → the library (model, methods, cache, generation, checkpoints, a run on disk (``run``), data,
the HF bridge) → the functional core (``functional``, ``fileio``). A module may import its own layer or lower ones,
never a higher one. Inside ``compare``, the renderers (``report``, ``plot``) are leaves, and no module outside the
package imports a ``_name`` of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import depthattn

from helpers import machine_timeout

ROOT = Path(depthattn.__file__).parent
CLI, APPLICATION, LIBRARY, CORE = 4, 3, 2, 1
TOP_LEVEL_LAYER = {"cli": CLI, "commands": CLI, "compare": APPLICATION, "study": APPLICATION, "training": APPLICATION, "eval": APPLICATION,
                   "run": LIBRARY, "functional": CORE, "fileio": CORE, "layout": CORE}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Import nodes anywhere in the tree (functions included) outside ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def from_target(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The module a ``from X import ...`` in module ``name`` (file ``path``) names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = (name if path.name == "__init__.py" else name.rpartition(".")[0]).split(".")
    return ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The depthattn modules ``name`` imports (``from pkg import sub`` counts as importing ``pkg.sub`` when that is
    a module; a string that names a module, as ``importlib.import_module`` and ``__import__`` take, counts too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            target = from_target(node, name, path)
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            # ``from pkg import sub`` depends on the submodule; any other name makes it depend on pkg itself
            targets = subs if len(subs) == len(node.names) else [target, *subs]
        out.update(t for t in targets if t in known)
    for node in ast.walk(tree):  # a module named in a string (importlib.import_module, __import__) is an import too
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value and node.value in known:
            out.add(node.value)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imported_modules(name, path, known) for name, path in mods.items()}


def layer(name: str) -> int:
    parts = name.split(".")
    return TOP_LEVEL_LAYER.get(parts[1], LIBRARY) if len(parts) > 1 else LIBRARY


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_function_local_and_relative_imports():
    graph = import_graph()
    assert "depthattn.cli" in graph and len(graph) > 30
    # cli.py imports its subcommands inside functions or at the top; either way they are edges
    assert any(m.startswith("depthattn.commands") for m in graph["depthattn.cli"])
    assert "depthattn.functional" in graph["depthattn.layers"]


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_cycle_detection_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_imports_flow_one_way():
    bad = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
           for a, targets in import_graph().items() for b in targets if layer(b) > layer(a)]
    assert bad == []


def test_only_the_cli_imports_commands():
    bad = [f"{a} imports {b}" for a, targets in import_graph().items() for b in targets
           if b.startswith(("depthattn.commands", "depthattn.cli")) and layer(a) != CLI]
    assert bad == []


#: The leaves of ``compare``: the renderers of ``results.json`` and what each may reach of the application layer
#: (directly or through other modules): the records' vocabulary and, for the report, the conclusions in words;
#: never the orchestration, the training or the evaluation.
COMPARE_LEAVES = {"depthattn.compare.report": {"depthattn.compare.records", "depthattn.compare.conclusions"},
                  "depthattn.compare.plot": {"depthattn.compare.records"}}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        for w in graph[stack.pop()] - seen:
            seen.add(w)
            stack.append(w)
    return seen


def test_compare_report_and_plot_are_leaves():
    graph = import_graph()
    for leaf, allowed in COMPARE_LEAVES.items():
        application = {m for m in reachable(graph, leaf) if layer(m) == APPLICATION}
        assert application <= allowed, f"{leaf} reaches {sorted(application - allowed)}"
    # the check sees through a module: the orchestration reaches the evaluation and the training
    assert {"depthattn.compare.evaluate", "depthattn.training"} <= reachable(graph, "depthattn.compare.runner")


def test_no_private_name_of_compare_is_imported_from_outside():
    """Outside the ``compare`` package (the package, scripts/, tests/) nothing imports a ``_name`` from it."""
    repo = ROOT.parents[1]
    files = [p for p in ROOT.rglob("*.py") if ROOT / "compare" not in p.parents]
    files += sorted((repo / "scripts").rglob("*.py")) + sorted((repo / "tests").rglob("*.py"))
    assert len(files) > 100
    bad = []
    for path in files:
        name = module_name(path) if ROOT in path.parents else ""
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = from_target(node, name, path)
            if target == "depthattn.compare" or target.startswith("depthattn.compare."):
                bad += [f"{path.relative_to(repo)}: {target}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert bad == []


def test_import_depthattn_leaves_transformers_out():
    import subprocess
    import sys

    code = "import sys, depthattn; print('transformers' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=machine_timeout(120))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_import_depthattn_leaves_the_vllm_plugin_out():
    """The vLLM model module (depthattn.serving) is loaded by vLLM's entry point only, never by the package."""
    import subprocess
    import sys

    code = ("import sys, depthattn, depthattn.hf, depthattn.checkpoint; "
            "print(sorted(m for m in sys.modules if m.startswith(('depthattn.serving', 'vllm'))))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=machine_timeout(120))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
    graph = import_graph()
    importers = {m for m, deps in graph.items() if any(d.startswith("depthattn.serving") for d in deps)}
    assert all(m == "depthattn.serving" or m.startswith("depthattn.serving.") for m in importers), importers


def test_no_package_module_imports_the_benchmark_harness():
    """depthattn.bench is research tooling for scripts/bench*.py, in the package only so they can import it."""
    assert "depthattn.bench" in import_graph()
    assert [m for m, deps in import_graph().items() if "depthattn.bench" in deps] == []
