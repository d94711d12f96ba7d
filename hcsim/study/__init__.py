"""Many simulations: sweeps over scenario keys, their findings and plots, plans, validation against measurements.

- :mod:`hcsim.study.sweep`: an experiment file's points, run each in a fresh process, and their reports;
- :mod:`hcsim.study.findings`: the checks an experiment states about its results;
- :mod:`hcsim.study.plotting`: the pictures of sweeps and plans;
- :mod:`hcsim.study.plan`: the ways to train a model on a cluster, ranked by closed forms;
- :mod:`hcsim.study.validate`: simulated against measured iteration times;
- :mod:`hcsim.study.calibrate`: the kernel model's factors fitted to measured kernels (``hcsim calibrate``).
- :mod:`hcsim.study.journal`: a plan's or a validation's finished simulations, kept for ``--resume``.

Each builds on :mod:`hcsim.run` (one simulation). Import from the modules: this package imports nothing.
"""
