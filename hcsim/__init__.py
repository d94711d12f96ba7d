"""hcsim: simulate distributed AI training on heterogeneous, cache-coherent computing systems.

The public names, imported on first use so that ``import hcsim`` stays light (no SimGrid, no matplotlib):

>>> import hcsim
>>> scenario = hcsim.Scenario(xpus=8)               # or hcsim.load_scenario("my.yaml")
>>> sorted(hcsim.__all__)
['Scenario', 'load_scenario', 'simulate']

``hcsim.simulate(scenario)`` runs it in a fresh process and returns its result record. Graphs built by
hand go through the engine's front door, :func:`hcsim.engine.api.run` (once per process).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "Scenario": "hcsim.run.scenario",
    "load_scenario": "hcsim.run.scenario",
    "simulate": "hcsim.run.simulation",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"hcsim.{name}: no such name; hcsim gives {', '.join(_PUBLIC)} (the rest: import its module)")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
