"""Many simulations: sweeps over scenario keys, their findings and plots, plans, validation against measurements.

- :mod:`hcsim.study.experiment`: an experiment file: a base scenario, axes, plots, findings; its points;
- :mod:`hcsim.study.points`: running simulations, each in a fresh process, on local processes or a Dask cluster;
- :mod:`hcsim.study.store`: a sweep's results CSV (its columns, appending rows whole, reading them back) and the
  folder lock it shares with the journal;
- :mod:`hcsim.study.sweep`: the runner: every point of an experiment, its rows in the CSV;
- :mod:`hcsim.study.summary`: a sweep's report (plots, findings, the markdown summary);
- :mod:`hcsim.study.findings`: the checks an experiment states about its results;
- :mod:`hcsim.study.plotting`: the pictures of sweeps and plans;
- :mod:`hcsim.study.plan`: the ways to train a model on a cluster, ranked by closed forms;
- :mod:`hcsim.study.validate`: simulated against measured iteration times;
- :mod:`hcsim.study.calibrate`: the kernel model's factors fitted to measured kernels (``hcsim calibrate``).
- :mod:`hcsim.study.journal`: a plan's or a validation's finished simulations, kept for ``--resume``.

Each builds on :mod:`hcsim.run` (one simulation). Import from the modules: this package imports nothing.
"""
