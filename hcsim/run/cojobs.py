"""A serving job beside training jobs on one fabric (docs/jobs.md): one SimGrid run, two loops.

A scenario's ``jobs`` may hold one job whose workload serves (``kind: serving``) beside its training jobs. The
training jobs' graphs are joined and run as :mod:`hcsim.run.jobs` says; the serving job's replicas run their
steps as a serving run alone does (:mod:`hcsim.run.serving`), on its XPUs of the same platform graph. Both loops
start on one engine (the core's ``run_workload`` with ``beside``: executor.cpp's workload run and steps.cpp's
serving loop, each with its own delay host) and SimGrid runs once, so transfers of both that cross one link (a
NIC, a switch port, a PCIe or CXL link) share it by max-min and each slows the other; whichever ends first stops
and its links serve the other. The serving loop counts the links of the training jobs' routes as shared: a step's
phase that crosses one is simulated in full, never timed as if alone.

A serving job takes the job keys a serving scenario takes (workload, precision, tp, pp, workload_overrides,
spill); a training key it gives is refused, and one it would inherit from the top level is left out. It is timed
by the kernel model (``compute_model`` left out or ``roofline``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from hcsim.errors import ConfigError
from hcsim.run.prepare import Prepared
from hcsim.run.scenario import Scenario

__all__ = ["serving_job_scenario", "serving_job_run", "serving_beside", "run_serving_alone", "serving_record",
           "add_serving_record", "job_xpus", "compare_serving", "SERVING_ALONE_KEYS"]

# what a serving job's record compares with its run alone: its latencies' means and its rates
SERVING_ALONE_KEYS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")


def serving_job_scenario(scenario: Scenario, index: int) -> tuple[Scenario, Any]:
    """Job `index` of `scenario`, which serves, as a serving scenario of its own and its serving spec: the training
    keys it would inherit from the top level left out, those it gives itself refused (one ConfigError naming
    ``jobs[i].key``)."""
    from hcsim.run.jobs import job_scenario
    from hcsim.run.serving import TRAINING_KEYS, check_serving_scenario, serving_workload

    job = scenario.jobs[index]
    where = f"scenario {scenario.name!r}: jobs[{index}]"
    if scenario.compute_model not in (None, "roofline"):
        raise ConfigError(f"scenario {scenario.name!r}: compute_model: {scenario.compute_model!r}, but jobs[{index}] "
                          f"serves ({job.get('workload')!r}), which the kernel model times. Fix: compute_model: "
                          f"roofline, or leave it out")
    sub = job_scenario(scenario, index)
    inherited = {key: unset for key, (unset, _) in TRAINING_KEYS.items() if key not in job}
    sub = dataclasses.replace(sub, **inherited, compute_model=None)
    spec = serving_workload(sub)
    try:
        check_serving_scenario(sub, spec)
    except ConfigError as err:
        raise ConfigError(str(err).replace(f"scenario {sub.name!r}: ", f"{where}.")) from None
    return sub, spec


def serving_job_run(prepared: Prepared, progress=None):
    """The serving job of `prepared` set up on the run's platform graph and its XPUs, checked (nothing runs yet):
    (its scenario, its ServingRun, its XPUs); a ConfigError names ``jobs[i]``."""
    from hcsim.run.serving import ServingRun

    index, xpus = prepared.serving
    sub, spec = serving_job_scenario(prepared.scenario, index)
    graph = prepared.platform
    if prepared.taken:  # a memory the training jobs spill or offload to holds only the rest for the serving job
        graph = graph.copy()  # (the training jobs' graph keeps its capacities)
        for node, size in prepared.taken.items():
            graph.nodes[node]["capacity"] = max(0.0, graph.nodes[node]["capacity"] - size)
    try:
        run = ServingRun(sub, spec, progress, placed=(prepared.platform_spec, graph, list(xpus)))
    except ConfigError as err:
        raise ConfigError(str(err).replace(f"scenario {sub.name!r}: ", f"scenario {prepared.scenario.name!r}: "
                                           f"jobs[{index}]: ")) from None
    return sub, run, xpus


def serving_record(result: dict, xpus: list[str]) -> dict[str, Any]:
    """A serving job's record among the jobs' (its serving result less the per-request rows and the KV cache
    over time), with its ``name`` and ``xpu_names``."""
    from hcsim.run.report import xpu_spans
    from hcsim.run.results import csv_cell

    return {"name": result["scenario"], "xpu_names": csv_cell(xpu_spans(xpus)),
            **{k: v for k, v in result.items() if k not in ("per_request", "occupancy")}}


def serving_beside(prepared: Prepared, options, progress=None):
    """Run `prepared`'s training jobs with its serving job beside them in one SimGrid run: the training jobs'
    RunResult and the serving job's result (a serving result, per-request rows and KV cache over time included:
    :func:`serving_record` makes its record among the jobs')."""
    from hcsim.engine import api
    from hcsim.platform.devices import peak_flops

    wall = time.perf_counter()
    _, run, xpus = serving_job_run(prepared)
    engine = run.engine
    next_step, landed = engine.callbacks(run.schedulers, run.arrivals)
    nodes = prepared.platform.nodes
    beside = {"host_names": engine.hosts, "layout": engine.layout, "next_step": next_step, "analytic": True,
              "landed": landed, "shared_pairs": sorted(prepared.pairs),
              # the serving XPUs at the serving precision, as the serving run alone compiles them
              "speeds": {x: peak_flops(nodes[x], run.spec.precision) for x in xpus}}
    outcome = api.run(prepared.platform, prepared.workload, options, prepared.pairs | engine.pairs, progress,
                      beside)
    return outcome, run.result(outcome.beside_counters, wall)


def run_serving_alone(prepared: Prepared, progress=None) -> dict[str, Any]:
    """A scenario whose only job serves: the serving run of that job on its XPUs (a serving result, named after
    the job), as :func:`hcsim.run.serving.simulate_serving` runs one."""
    wall = time.perf_counter()
    _, run, _ = serving_job_run(prepared, progress)
    counters = run.engine.run(run.schedulers, run.arrivals)
    return run.result(counters, wall)


def job_xpus(prepared: Prepared) -> list[list[str]]:
    """Each job's XPUs, in the order of the scenario's jobs (the training jobs' and the serving job's)."""
    out = [job.xpus for job in prepared.jobs]
    if prepared.serving is not None:
        index, xpus = prepared.serving
        out.insert(index, list(xpus))
    return out


def add_serving_record(result: dict, prepared: Prepared, serving: dict) -> None:
    """The serving job's record (:func:`serving_record` of its result `serving`) among `result`'s jobs, at its
    place in the scenario's, and its XPUs and activities among the run's (``xpus``, ``devices``,
    ``activities``)."""
    index, xpus = prepared.serving
    record = serving_record(serving, list(xpus))
    result["jobs"].insert(index, record)
    result["xpus"] += len(xpus)
    result["activities"] += record["activities"]
    devices = result["devices"]
    for x in xpus:
        device = prepared.platform.nodes[x]["device"]
        devices[device] = devices.get(device, 0) + 1


def compare_serving(record: dict, alone: dict) -> None:
    """A serving job's record given its run `alone` on its XPUs (a serving result): ``alone`` (the means of its
    latencies, SERVING_ALONE_KEYS, its output tokens per s and goodput where an SLO is set) and ``slowdown``, each
    latency's mean in the run over alone's and the throughput alone over the run's (above 1: sharing costs it)."""
    record["alone"] = {**{key: alone[key]["mean"] for key in SERVING_ALONE_KEYS},
                       "throughput_tokens_per_s": alone["throughput_tokens_per_s"],
                       **({"goodput_requests_per_s": alone["goodput"]["requests_per_s"]} if "goodput" in alone
                          else {})}
    record["slowdown"] = {**{key: record[key]["mean"] / alone[key]["mean"] for key in SERVING_ALONE_KEYS},
                          "throughput": alone["throughput_tokens_per_s"] / record["throughput_tokens_per_s"]}
