"""The workload layer is pure: it never imports simgrid (STYLE.md rule 1)."""

import ast
from pathlib import Path

import hcsim.workload

FORBIDDEN = ("simgrid", "hcsim.engine", "matplotlib")


def test_the_workload_layer_never_imports_simgrid_or_the_engine():
    for path in Path(hcsim.workload.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"
