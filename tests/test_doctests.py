"""The examples in hcsim's docstrings run and print what they show (doctest), so a docstring cannot drift from
the code it documents."""

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(".".join(path.relative_to(ROOT).with_suffix("").parts)
                 for path in (ROOT / "hcsim").rglob("*.py") if ">>> " in path.read_text())


def test_there_are_examples_to_run():
    assert len(MODULES) > 20 and "hcsim.engine.compute_model" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_of_a_module_hold(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed (run with -s to see)"
