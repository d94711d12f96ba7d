"""Several jobs on one fabric: a scenario's ``jobs`` (docs/jobs.md).

Each job is a sub-scenario (:data:`JOB_KEYS`: its name, its XPUs, its workload and parallelism) on the one
platform of the scenario; every other key is the scenario's (its platform keys, :data:`PLATFORM_KEYS`, and the
run's, :data:`RUN_KEYS`, may not be set in a job), and a job key left out takes the scenario's value. A job's
``xpus`` is a count (the next free XPUs of the platform in order: not named by any job's list, nor taken by an
earlier job) or a list of XPU names. Each job's workload graph is built as it would be alone on its XPUs, its
vertices named ``JOBNAME/...`` and given their job's index (``job``); the graphs run together on one engine,
sharing the platform's links, each job for its own iterations (one that is done stops, and its links serve the
others).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import networkx as nx

from hcsim.errors import ConfigError, brief

if TYPE_CHECKING:
    from hcsim.run.scenario import Scenario

__all__ = ["JOB_KEYS", "PLATFORM_KEYS", "RUN_KEYS", "check_jobs", "read_jobs", "job_scenario", "job_scenarios",
           "join_graphs", "assign_xpus", "alone_scenario"]

JOB_KEYS = ("name", "xpus", "workload", "precision", "collective", "collective_chunks", "ring_order", "granularity",
            "iterations", "workload_overrides", "tp", "pp", "dp", "micro_batch", "global_batch", "schedule",
            "virtual_stages", "recompute", "sequence_parallel", "layer_split", "batch_split", "zero", "offload",
            "offload_state", "spill", "ep", "cp", "cp_algorithm", "moe_skew")
PLATFORM_KEYS = ("platform", "devices", "coherent", "cxl_bandwidth", "cxl_latency", "platform_overrides")
RUN_KEYS = ("collective_model", "step_limit", "local_access", "local_collectives", "compute_model", "compute_factors",
            "trace_xpus", "trace_iterations", "stragglers", "straggler_spread", "seed", "jobs", "jobs_alone", "base")


def _key_problem(where: str, key: str) -> str | None:
    """What is wrong with `key` inside a job (None: a job key)."""
    if key in JOB_KEYS:
        return None
    if key in PLATFORM_KEYS:
        return (f"{where}.{key}: a platform key, which stays at the top level: the jobs share the scenario's one "
                f"platform; move it out of the job")
    if key in RUN_KEYS:
        return f"{where}.{key}: a key of the whole run, set at the top level only; move it out of the job"
    import difflib

    close = difflib.get_close_matches(str(key), JOB_KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{where}.{key}: unknown key inside a job{hint}; a job's keys: {', '.join(JOB_KEYS)}"


def check_jobs(jobs: Any, where: str) -> list[str]:
    """The problems of a scenario's ``jobs`` as a whole (each job's keys, names and XPUs), [] when none: a
    non-empty list of mappings, each of job keys only, with a name (unique, no ``/``) and ``xpus`` (a count >= 1
    or a list of distinct XPU names), no XPU named by two jobs."""
    if not isinstance(jobs, (list, tuple)) or not jobs:
        return [f"{where}: expected a list of jobs, each a mapping with its name, xpus (a count or a list of XPU "
                f"names), workload and parallelism keys; got {brief(jobs)}"]
    problems, names, owner = [], {}, {}
    for i, job in enumerate(jobs):
        here = f"{where}[{i}]"
        if not isinstance(job, Mapping):
            problems.append(f"{here}: expected a mapping (name, xpus, workload, tp, ...), got {brief(job)}")
            continue
        problems += [p for p in (_key_problem(here, str(k)) for k in job) if p]
        name = job.get("name")
        if not (isinstance(name, str) and name.strip() and "/" not in name):
            problems.append(f"{here}.name: expected a name without '/' (its vertices are named NAME/...), got "
                            f"{brief(name)}")
        elif name in names:
            problems.append(f"{here}.name: {name!r} is the name of jobs[{names[name]}] too; each job has its own")
        else:
            names[name] = i
        xpus = job.get("xpus")
        if isinstance(xpus, int) and not isinstance(xpus, bool) and xpus >= 1:
            continue
        if not (isinstance(xpus, (list, tuple)) and xpus and all(isinstance(x, str) and x for x in xpus)):
            problems.append(f"{here}.xpus: expected a count >= 1 (the next free XPUs of the platform) or a list of "
                            f"XPU names (xpu0, xpu1, ...), got {brief(xpus)}")
            continue
        twice = sorted({x for x in xpus if list(xpus).count(x) > 1})
        if twice:
            problems.append(f"{here}.xpus: names {', '.join(twice[:5])} more than once")
        for x in xpus:
            if x in owner and owner[x] != i:
                problems.append(f"{here}.xpus: {x} is jobs[{owner[x]}]'s too; jobs run on disjoint XPUs: give each "
                                f"XPU to one job")
                break
            owner[x] = i
    return problems


def read_jobs(raw: Any, top: dict, where: str, base: str, origins: dict[str, str], from_mapping) -> tuple[dict, ...]:
    """A scenario file's ``jobs`` checked, each job's values read as a scenario's would be (the scenario's `top`
    keys under the job's own); returns the jobs as mappings of the keys each gives, values checked. Raises one
    ConfigError listing every problem, each naming ``jobs[i].key``."""
    head = f"{where}: jobs"
    problems = check_jobs(raw, head)
    if problems:
        raise ConfigError("\n".join(problems))
    inherited = {k: v for k, v in top.items() if k not in ("name", "xpus", "jobs", "jobs_alone")}
    jobs = []
    for i, job in enumerate(raw):
        job = dict(job)
        xpus = job["xpus"]
        count = xpus if isinstance(xpus, int) else len(xpus)
        data = {**inherited, **{k: v for k, v in job.items() if k != "xpus"}, "xpus": count}
        own = {k: f"{head}[{i}]." for k in job}
        try:
            sub = from_mapping(data, where, base, {**{k: v for k, v in origins.items() if k not in own}, **own})
        except ConfigError as err:
            problems += str(err).replace(f"{where}: jobs[{i}].", f"{head}[{i}].").splitlines()
            continue
        values = {k: getattr(sub, k) for k in job if k not in ("name", "xpus")}
        jobs.append({"name": job["name"], "xpus": xpus if isinstance(xpus, int) else tuple(xpus), **values})
    if problems:
        raise ConfigError("\n".join(dict.fromkeys(problems)))
    return tuple(jobs)


def job_scenario(scenario: Scenario, index: int) -> Scenario:
    """Job `index` of `scenario` as a scenario of its own: the scenario's keys under the job's, its xpus the
    job's count (its XPUs are :func:`assign_xpus`'s)."""
    job = scenario.jobs[index]
    values = {k: v for k, v in job.items() if k not in ("name", "xpus")}
    xpus = job["xpus"] if isinstance(job["xpus"], int) else len(job["xpus"])
    try:
        return dataclasses.replace(scenario, **values, name=job["name"], xpus=xpus, jobs=None, jobs_alone=False)
    except ConfigError as err:
        raise ConfigError(str(err).replace(f"scenario {job['name']!r}:", f"scenario {scenario.name!r}: jobs[{index}]:",
                                           1)) from None


def job_scenarios(scenario: Scenario) -> list[Scenario]:
    return [job_scenario(scenario, i) for i in range(len(scenario.jobs))]


def assign_xpus(scenario: Scenario, platform_xpus: list[str], total: int) -> list[list[str]]:
    """Each job's XPUs on a platform whose XPUs are `platform_xpus` (in order) of `total` in the platform spec:
    a list as given, a count the next free ones in order.

    Raises
    ------
    ConfigError
        naming ``jobs[i].xpus`` for an XPU the platform does not have, or more XPUs than are left.
    """
    where = f"scenario {scenario.name!r}: jobs"
    known = set(platform_xpus)
    named = {x for job in scenario.jobs if not isinstance(job["xpus"], int) for x in job["xpus"]}
    taken: set[str] = set()
    out = []
    for i, job in enumerate(scenario.jobs):
        xpus = job["xpus"]
        if not isinstance(xpus, int):
            unknown = [x for x in xpus if x not in known]
            if unknown:
                raise ConfigError(f"{where}[{i}].xpus: {', '.join(unknown[:5])} "
                                  f"{'is' if len(unknown) == 1 else 'are'} not an XPU of platform "
                                  f"{scenario.platform!r} (xpu0 to xpu{total - 1})")
            out.append(list(xpus))
            taken.update(xpus)
            continue
        free = [x for x in platform_xpus if x not in taken and x not in named]
        if len(free) < xpus:
            used = sum(len(o) for o in out) + len(named - taken)
            raise ConfigError(f"{where}[{i}].xpus: {xpus} XPUs asked for, but platform {scenario.platform!r} has "
                              f"{total}, of which {used} go to the other jobs ({len(free)} left); valid: at most "
                              f"{len(free)}, or a larger platform")
        out.append(free[:xpus])
        taken.update(free[:xpus])
    return out


def join_graphs(graphs: list[nx.DiGraph], names: list[str], iterations: list[int]) -> nx.DiGraph:
    """The jobs' workload graphs as one: each vertex named ``NAME/vertex`` with its job's index (``job``) and,
    where it differs from the first job's, its job's ``precision``; graph attribute ``jobs`` (name, iterations,
    and the job graph's own attributes under ``graph``)."""
    first = graphs[0].graph.get("precision", "fp32")
    joined = nx.DiGraph(name="+".join(names), precision=first, format_version=graphs[0].graph.get("format_version", 2),
                        samples_per_iteration=1,
                        jobs=[{"name": n, "iterations": k, "graph": dict(g.graph)}
                              for g, n, k in zip(graphs, names, iterations)])
    for j, (graph, name) in enumerate(zip(graphs, names)):
        precision = graph.graph.get("precision", "fp32")
        own = {"job": j} | ({"precision": precision} if precision != first else {})
        prefix = f"{name}/"
        joined.add_nodes_from((prefix + str(v), {**data, **own}) for v, data in graph.nodes(data=True))
        joined.add_edges_from((prefix + str(u), prefix + str(v), data) for u, v, data in graph.edges(data=True))
    return joined


def alone_scenario(scenario: Scenario, index: int, xpus: list[str]) -> Scenario:
    """Job `index` of `scenario` alone on the same platform and XPUs (`xpus`, its XPUs in the run), with the
    stragglers among its XPUs."""
    job = {**scenario.jobs[index], "xpus": tuple(xpus)}
    stragglers = {x: f for x, f in scenario.stragglers.items() if x in set(xpus)}
    return dataclasses.replace(scenario, jobs=(job,), jobs_alone=False, stragglers=stragglers,
                               name=f"{scenario.name}:{job['name']}:alone")
