"""Running a prepared run: compile, execute, in this process or a fresh one.

SimGrid allows one Engine per process, ever, so :func:`simulate` runs each
simulation in a fresh process (forked from a fork server that never simulates,
never from the caller) and returns plain data;
:func:`run_here` runs in the calling process and may be called once in it.
Preparing a run is :mod:`hcsim.run.prepare`'s job, reporting it :mod:`hcsim.run.report`'s.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import networkx as nx

from hcsim.errors import ConfigError, OutputError, brief
from hcsim.engine import api
from hcsim.run.fresh import in_fresh_process
from hcsim.run.prepare import compute_model, prepare, traced_xpus
from hcsim.run.report import _peak_rss_mb, check_results_folder, summarize, write_outputs
from hcsim.run.scenario import Scenario

__all__ = ["run_here", "simulate", "simulate_graphs", "total_runs"]


def total_runs(workload: nx.DiGraph, iterations: int) -> int:
    """How many vertex runs a simulation of `iterations` iterations completes (several jobs: each its own)."""
    jobs = workload.graph.get("jobs")
    if jobs:
        return sum(jobs[data["job"]]["iterations"] * len(data["xpus"]) for _, data in workload.nodes(data=True))
    return iterations * sum(len(xpus) for _, xpus in workload.nodes(data="xpus"))


def _execute_child(platform, workload, options) -> dict[str, Any]:
    wall = time.perf_counter()
    outcome = api.run(platform, workload, options)
    trace = outcome.trace
    return {"iteration_ends": outcome.iteration_ends, "activities": outcome.activities, "engine": outcome.engine,
            "busy": outcome.busy,
            "collective_fidelity": outcome.collective_fidelity, "link_bytes": outcome.link_bytes,
            "xpu_times": outcome.xpu_times, "job_iteration_ends": outcome.job_iteration_ends,
            "gemm_clocks": outcome.gemm_clocks, "job_gemm_clocks": outcome.job_gemm_clocks,
            "vertices": trace.vertices if trace else [], "transfers": trace.transfers if trace else [],
            "wall_time_s": time.perf_counter() - wall, "peak_rss_mb": _peak_rss_mb()}


def simulate_graphs(platform: nx.Graph, workload: nx.DiGraph, options=None) -> dict[str, Any]:
    """Run a platform graph and a workload graph in a fresh process; plain data back.

    Returns ``iteration_ends`` (s), ``activities``, ``busy`` (xpu -> [compute s,
    memory stall s]), ``xpu_times`` (xpu -> compute_s, memory_stall_s, comm_s, idle_s
    per measured iteration),
    ``job_iteration_ends`` (a workload of several jobs, its graph's ``jobs``: each job's iteration ends, s),
    ``collective_fidelity`` (vertex -> step | flow), ``link_bytes`` ((u, v) -> bytes),
    the traced ``vertices`` and ``transfers``, ``wall_time_s`` (the worker's compile
    and run) and ``peak_rss_mb`` (the worker's peak memory, MB).

    The worker is a fresh process that imports the calling script again:
    call this under ``if __name__ == "__main__":`` (a SimulationError says so).
    """
    from hcsim.workload import validate_workload

    _check_main_guard()
    validate_workload(workload)
    return in_fresh_process(_execute_child, platform, workload, options or api.RunOptions())


def run_here(scenario: Scenario, out: Path | None = None, progress=None, check=None, overwrite: bool = False
             ) -> dict[str, Any]:
    """Run `scenario` in this process (SimGrid: once per process); write outputs to `out` if given (a folder
    with an earlier run's results only with `overwrite`: :func:`check_results_folder`).

    `progress`, if given, is a factory called with the total number of vertex
    runs; it returns a callable that receives how many more have completed.
    `check`, if given, is called with the :class:`Prepared` run before it runs (it may raise)."""

    wall = time.perf_counter()
    if out is not None:
        check_results_folder(out, overwrite, "out")
    from hcsim.run.serving import serving_workload, simulate_serving, write_serving_outputs

    serving = serving_workload(scenario)
    if serving is not None:  # an inference workload: continuous batching (hcsim.run.serving), no training graph
        result = simulate_serving(scenario, serving, progress)
        if out is not None:
            write_serving_outputs(Path(out), result)
        return result
    prepared = prepare(scenario)
    if check is not None:
        check(prepared)
    if prepared.serving is not None and not prepared.jobs:  # its only job serves
        from hcsim.run.cojobs import run_serving_alone

        result = run_serving_alone(prepared, progress)
        if out is not None:
            write_serving_outputs(Path(out), result)
        return result
    setup_s = time.perf_counter() - wall
    traced = traced_xpus(prepared) if out is not None else None
    jobs = prepared.jobs or []
    model = compute_model(scenario, prepared.workload, prepared.platform) if not jobs else next(
        (m for m in (compute_model(job.scenario, prepared.workload, prepared.platform) for job in jobs)
         if m is not None), None)  # several jobs: the kernel model where any job's resolves to it
    options = api.RunOptions(iterations=max([scenario.iterations] if not jobs else
                                            [job.scenario.iterations for job in jobs]),
                         coherent=prepared.coherent,
                         collective_model=scenario.collective_model, step_limit=scenario.step_limit,
                         local_access=scenario.local_access, local_collectives=scenario.local_collectives,
                         compute_model=model,
                         trace_xpus=traced,
                         trace_iterations=frozenset(scenario.trace_iterations) if scenario.trace_iterations else None)
    update = progress(total_runs(prepared.workload, scenario.iterations)) if progress else None
    if prepared.serving is not None:  # a serving job beside the training jobs, in the same SimGrid run
        from hcsim.run.cojobs import add_serving_record, serving_beside

        outcome, serving = serving_beside(prepared, options, update)
    else:
        outcome = api.run(prepared.platform, prepared.workload, options, prepared.pairs, update)
    result = summarize(prepared, outcome, setup_s, time.perf_counter() - wall, options.compute_model)
    if prepared.serving is not None:
        add_serving_record(result, prepared, serving)
    if jobs and scenario.jobs_alone:
        _add_alone(result, prepared)
    if out is not None:
        try:
            write_outputs(Path(out), result, outcome, prepared.platform, prepared.workload, prepared.xpus)
            if prepared.serving is not None:  # its requests and KV cache over time, in a folder of its own
                write_serving_outputs(Path(out) / serving["scenario"], serving)
        except OSError as err:
            raise OutputError(f"{err.filename or out}: could not write the outputs ({err.strerror or err}); the run "
                              "finished and its result is kept, but nothing more was saved", result) from None
    return result


def _add_alone(result: dict, prepared) -> None:
    """Each job of a run of several jobs run again alone on its XPUs of the same platform (a fresh process
    each), its iteration time there in its record as ``alone_iteration_time_s`` and what sharing cost it,
    ``slowdown`` (its iteration time in the run over alone's); a serving job's latencies and rates alone
    (:func:`hcsim.run.cojobs.compare_serving`)."""
    from hcsim.run.cojobs import compare_serving, job_xpus
    from hcsim.run.jobs import alone_scenario

    for j, (xpus, record) in enumerate(zip(job_xpus(prepared), result["jobs"])):
        alone = in_fresh_process(_child, alone_scenario(prepared.scenario, j, xpus), None)
        if record.get("kind") == "serving":
            compare_serving(record, alone)
            continue
        record["alone_iteration_time_s"] = alone["jobs"][0]["iteration_time_s"]
        record["slowdown"] = record["iteration_time_s"] / record["alone_iteration_time_s"]


def _child(scenario: Scenario, out: str | None, overwrite: bool = False) -> dict[str, Any]:
    return run_here(scenario, Path(out) if out else None, overwrite=overwrite)


def simulate(scenario: Scenario, out: Path | str | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Run `scenario` in a fresh process and return its result record (the Python API).

    The process imports the calling script again (multiprocessing's preparation), so a script
    must call this under ``if __name__ == "__main__":`` (checked here).

    Raises
    ------
    ConfigError
        if `scenario` is not a Scenario, `out` cannot be written or holds an earlier run's results (unless
        `overwrite`), or the calling script has no such guard.
    OutputError
        if the run finished but writing to `out` failed (its ``result`` is the result record).
    """
    if not isinstance(scenario, Scenario):
        raise ConfigError(f"scenario: expected a hcsim.run.scenario.Scenario (e.g. load_scenario() or Scenario(xpus=8)), "
                          f"got {brief(scenario)}")
    if out is not None:
        check_results_folder(out, overwrite, "out")
    _check_main_guard()
    return in_fresh_process(_child, scenario, str(out) if out is not None else None, overwrite)


def _check_main_guard() -> None:
    """Refuse to start a process from a script whose top level would run again, unguarded, in that process.

    A fresh process imports the ``__main__`` script again; one that calls
    :func:`simulate` outside ``if __name__ == "__main__":`` would start a
    process while starting a process, and the pool breaks.
    """
    import ast
    import sys

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not str(path).endswith(".py") or getattr(main, "__spec__", None) is not None:
        return  # an interactive session, python -c, python -m (modules are imported by name)
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return
    for node in tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test):
            return
    raise ConfigError(f"{path}: this script calls hcsim outside `if __name__ == \"__main__\":`. hcsim runs each "
                      "simulation in a fresh process, which imports the script again; put the script's top-level "
                      "code under that guard (see the README's Python example)")
