"""The engine: one run of a workload graph on a platform, on SimGrid.

- :mod:`hcsim.engine.api`: the front door: :class:`~hcsim.engine.api.RunOptions` in,
  :class:`~hcsim.engine.api.RunResult` out, :func:`~hcsim.engine.api.run`, the communication kinds;
- :mod:`hcsim.engine.rules`: the executor's rules that follow from the graph and the platform (vertex order,
  required counts, collective algorithms, compute costs, memory forms), once;
- :mod:`hcsim.engine.core`: the C++ core on SimGrid's S4U API that runs the executor (paper Fig. 5) on them
  (:mod:`hcsim.engine.core.workload` lays them out as its input arrays);
- :mod:`hcsim.engine.collectives`: collective algorithms as steps and flow phases;
- :mod:`hcsim.engine.compute_model`: kernel times from measured factors (the roofline model);
- :mod:`hcsim.engine.trace`: the recorded vertices and transfers, as CSV and Perfetto JSON.

Only this package imports simgrid. Import from the modules: this package imports nothing.
"""
