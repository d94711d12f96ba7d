"""The package's layers: imports flow one way (STYLE.md rule 1) and no modules import each other in a circle.

Every ``import`` counts, at module level or inside a function: a late import still ties two modules together;
only those under ``if TYPE_CHECKING:`` (for annotations, never run) do not.
"""

import ast
from pathlib import Path

import networkx as nx

import hcsim

ROOT = Path(hcsim.__file__).parent
# Each layer may import the layers before it, never one after it (the base modules sit below them all).
LAYERS = ("base", ("platform", "workload"), "engine", "run", "study", "cli")


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph() -> nx.DiGraph:
    """hcsim's modules and the hcsim modules each imports."""
    graph = nx.DiGraph()
    for path in sorted(ROOT.rglob("*.py")):
        graph.add_node(_module(path))
        for node in _runtime_nodes(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            graph.add_edges_from((_module(path), name) for name in names if name.startswith("hcsim."))
    return graph


def _runtime_nodes(tree: ast.AST):
    """Every node but those under ``if TYPE_CHECKING:`` (imports for annotations only, never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from _runtime_nodes(node)


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 2 or (len(parts) == 2 and (ROOT / parts[1]).is_dir()) else "base"
    return next(i for i, layer in enumerate(LAYERS) if top == layer or top in layer)


def test_no_module_imports_a_layer_above_its_own():
    back = [f"{u} -> {v}" for u, v in import_graph().edges if _layer(v) > _layer(u)]
    assert not back, "imports that run back up the layers: " + ", ".join(back)


def test_no_modules_import_each_other_in_a_circle():
    graph = import_graph()
    graph.remove_edges_from([(u, v) for u, v in graph.edges if v == u or v == u.rsplit(".", 1)[0]])
    # (a module's own package, or a package importing its own extension)
    circles = [" -> ".join(c) for c in nx.simple_cycles(graph)]
    assert not circles, "import circles: " + "; ".join(circles[:5])


def test_the_engine_is_reached_through_its_front_door():
    """Above the engine, only hcsim.engine.api is imported (and the modules it names for their own jobs)."""
    allowed = {"hcsim.engine.api", "hcsim.engine.compute_model", "hcsim.engine.collectives", "hcsim.engine.trace",
               "hcsim.engine.core", "hcsim.engine.simgrid_loader"}
    graph = import_graph()
    through = sorted({f"{u} -> {v}" for u, v in graph.edges
                      if _layer(u) > _layer("hcsim.engine.api") and v.startswith("hcsim.engine.") and v not in allowed})
    assert not through, "reaching past the engine's front door: " + ", ".join(through)


def test_the_layer_check_sees_a_back_arrow():
    assert _layer("hcsim.engine.trace") < _layer("hcsim.run.results")
    assert _layer("hcsim.units") < _layer("hcsim.platform.spec") == _layer("hcsim.workload.graph")
    assert ("hcsim.engine.api", "hcsim.engine.options") in import_graph().edges


def test_no_test_module_imports_another():
    """Shared graphs, runs and checks live in helper modules (tests/engine/cases.py), so a test
    module runs alone and its tests are collected once."""
    tests = Path(__file__).parent
    names = {path.stem for path in tests.rglob("test_*.py")}
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            imported = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found += [f"{path.relative_to(tests)} imports {name}" for name in imported if name.split(".")[-1] in names]
    assert not found, "; ".join(found)
