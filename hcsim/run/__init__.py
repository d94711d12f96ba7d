"""One simulation: its scenario, preparing it, running it in a process, reporting its result.

- :mod:`hcsim.run.scenario`: the scenario, one simulation to run;
- :mod:`hcsim.run.prepare`: from a scenario to graphs, layout and placement (:class:`~hcsim.run.prepare.Prepared`);
- :mod:`hcsim.run.simulation`: running it, here or in a fresh process (:func:`~hcsim.run.simulation.simulate`);
- :mod:`hcsim.run.report`: the result record, its CSVs and pictures;
- :mod:`hcsim.run.pictures`: the pictures of one run (xpus.png, a serving run's kv.png and latency.png);
- :mod:`hcsim.run.results`: pure functions over results (per-XPU times, CSV columns);
- :mod:`hcsim.run.serving`: a serving run (continuous batching, the KV cache), in place of a training graph.

Import from the modules: this package imports nothing, so ``import hcsim.run.scenario`` stays light.
"""
