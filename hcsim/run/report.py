"""Reporting a run: from an engine outcome to its result record, its CSVs and pictures.

:func:`summarize` makes the result record (throughput, breakdown, memory, provenance);
:func:`write_outputs` writes it and the per-link and per-XPU tables to a results folder.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import os
import platform as host_platform
import resource
import tempfile
from pathlib import Path
from typing import Any

import networkx as nx

from hcsim.errors import ConfigError, WorkloadError, brief, shadowed_package

try:
    from hcsim import __version__
except ImportError as _error:  # a folder named hcsim shadows the package: say so, not "cannot import name"
    raise shadowed_package(_error) from _error
from hcsim.run.prepare import Prepared, spill_policy
from hcsim.run.stragglers import straggler_report
from hcsim.run.results import (SPLIT_PARTS, TIME_PARTS, XPU_COLUMNS, XpuTimes, csv_cell, pace_setters,
                               per_xpu_times, resolve_scenario, xpu_rows)

__all__ = ["RUN_OUTPUTS", "BREAKDOWN", "LINK_COLUMNS", "check_results_folder", "clear_outputs", "summarize",
           "throughput", "link_loads", "write_outputs", "atomic_write", "xpu_spans"]

log = logging.getLogger(__name__)


def _peak_rss_mb() -> float:
    """This process's peak resident memory in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# what a run writes: a training run's, then a serving run's (hcsim.run.serving)
RUN_OUTPUTS = ("result.json", "links.csv", "xpus.csv", "xpus.png", "trace.csv", "trace.json", "requests.csv", "kv.csv",
               "kv.png", "latency.png")


def check_results_folder(out: str | Path, overwrite: bool = False, what: str = "--out") -> Path:
    """Make sure a run's results can go to folder `out` before it runs: writable (created if missing), and
    holding no earlier run's results (:data:`RUN_OUTPUTS`) unless `overwrite`, in which case
    :func:`write_outputs` removes them before writing its own.

    Raises
    ------
    ConfigError
        naming the folder and the earlier results, with the fix.
    """
    from hcsim.config import check_output_folder

    path = check_output_folder(out, what)
    earlier = [name for name in RUN_OUTPUTS if (path / name).exists()]
    if earlier and not overwrite:
        raise ConfigError(f"{what} {path}: holds the results of an earlier run ({', '.join(earlier)}); give another "
                          f"folder, or --overwrite to replace them (overwrite=True in Python)")
    return path


def clear_outputs(out: Path) -> None:
    """Create `out` and remove an earlier run's results from it (checked before the run by
    :func:`check_results_folder`): none is left beside this run's."""
    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_OUTPUTS:
        (out / name).unlink(missing_ok=True)


def summarize(prepared: Prepared, outcome, setup_s: float, wall_s: float, compute_model=None) -> dict[str, Any]:
    """The result record of a run: throughput, breakdown, counts, provenance. `compute_model`: the roofline
    ComputeModel the run timed its kernels with (None: the peak model). A run of several jobs: see
    :func:`summarize_jobs`."""
    if prepared.jobs:
        return summarize_jobs(prepared, outcome, setup_s, wall_s, compute_model)
    timing = _iteration_keys(outcome.iteration_ends)
    iteration_time = timing["iteration_time_s"]
    scenario, graph = prepared.scenario, prepared.workload.graph
    if not iteration_time > 0:  # no throughput to report: every vertex has no work
        raise WorkloadError(f"scenario {scenario.name!r}: workload {brief(graph.get('name', '?'))}: an iteration "
                            f"takes 0 s (no vertex has flops, bytes or a duration > 0); give its vertices their work")
    per_xpu = per_xpu_times(outcome.xpu_times)
    return {
        "scenario": scenario.name,
        "xpus": len(prepared.xpus),
        "devices": _device_counts(prepared),
        "coherent": prepared.coherent,
        "precision": graph.get("precision", "fp32"),
        **_compute_used(scenario, graph, compute_model),
        "gemm_clocks": outcome.gemm_clocks,
        **_cxl_link(prepared.platform_spec),
        **timing,
        **throughput(prepared.platform, prepared.workload, prepared.xpus, iteration_time),
        "breakdown": _breakdown(prepared, per_xpu),
        "stages": _stage_breakdown(prepared, per_xpu),
        "pace": pace_setters(per_xpu, _device_of(prepared)),
        **straggler_report(prepared.platform, prepared.xpus, per_xpu),
        "memory": _memory(prepared),
        "spill": spill_policy(scenario, prepared.platform_spec) if prepared.platform_spec is not None else None,
        **_batch_split_report(prepared),
        **_tp_across_servers(prepared),
        **_run_keys(prepared, outcome, setup_s, wall_s,
                    scenario.digest() + (f"+{graph['source_digest']}" if "source_digest" in graph else ""),
                    graph.get("layout")),
    }


def _iteration_keys(ends: list[float]) -> dict[str, Any]:
    """Each iteration's time, the steady-state iteration time (the mean of the iterations after the first, or the
    only one) and which iterations it measures, from the iteration ends."""
    times = [b - a for a, b in zip([0.0] + ends, ends)]
    steady = times[1:] if len(times) > 1 else times
    return {"iteration_times_s": times, "iteration_time_s": sum(steady) / len(steady),
            "measured_iterations": f"{2 if len(times) > 1 else 1}..{len(times)}"}


def _run_keys(prepared: Prepared, outcome, setup_s: float, wall_s: float, inputs_hash: str, layout) -> dict[str, Any]:
    """The keys of a result record that belong to the whole run: its busiest links, counts, times, inputs and
    provenance (:data:`_RUN_ONLY`)."""
    scenario = prepared.scenario
    return {
        "links": _busiest_links(prepared.platform, outcome.link_bytes, outcome.iteration_ends[-1]),
        "activities": outcome.activities,
        "engine": outcome.engine,
        "collective_fidelity": sorted(set(outcome.collective_fidelity.values())),
        "wall_time_s": wall_s,
        "setup_time_s": setup_s,
        "peak_rss_mb": _peak_rss_mb(),
        "inputs": scenario.to_dict(),
        "inputs_resolved": resolve_scenario(scenario),
        "inputs_hash": inputs_hash,
        "layout": layout,
        "versions": {"hcsim": __version__, "source": _source_digest(), "simgrid": _simgrid_version(),
                     "python": host_platform.python_version()},
    }


# a job's record leaves out what belongs to the whole run (its links, counts, provenance: the run's record has them)
_RUN_ONLY = ("cxl_bandwidth", "cxl_latency", "links", "activities", "engine", "collective_fidelity",
             "wall_time_s", "setup_time_s", "peak_rss_mb", "inputs", "inputs_resolved", "inputs_hash", "versions")


def summarize_jobs(prepared: Prepared, outcome, setup_s: float, wall_s: float, compute_model=None) -> dict[str, Any]:
    """The result record of a run of several jobs on one fabric (:mod:`hcsim.run.jobs`): the run's own keys (its
    XPUs and devices, the iterations of the run, each ending when every job that runs it has ended it, the
    breakdown per device type over every XPU, links, counts, provenance) and ``jobs``, per job its record as a
    run of its own has it (iteration times, throughput, breakdown over its XPUs, stages, pace, memory), measured
    over its own iterations, with its ``name``, ``workload`` and ``xpu_names``."""
    from types import SimpleNamespace

    jobs = []
    for j, job in enumerate(prepared.jobs):
        view = SimpleNamespace(iteration_ends=outcome.job_iteration_ends[j],
                               xpu_times={x: outcome.xpu_times[x] for x in job.xpus}, link_bytes=outcome.link_bytes,
                               activities=outcome.activities, engine=outcome.engine, collective_fidelity={},
                               gemm_clocks=outcome.job_gemm_clocks[j])
        record = summarize(job, view, setup_s, wall_s, compute_model)
        jobs.append({"name": job.scenario.name, "workload": job.scenario.workload,
                     "xpu_names": csv_cell(xpu_spans(job.xpus)),
                     **{k: v for k, v in record.items() if k not in _RUN_ONLY and k != "scenario"}})
    scenario = prepared.scenario
    per_xpu = per_xpu_times(outcome.xpu_times)
    return {
        "scenario": scenario.name,
        "xpus": len(prepared.xpus),
        "devices": _device_counts(prepared),
        "coherent": prepared.coherent,
        **_cxl_link(prepared.platform_spec),
        **_iteration_keys(outcome.iteration_ends),
        "jobs": jobs,
        "breakdown": _breakdown(prepared, per_xpu),
        **straggler_report(prepared.platform, prepared.xpus, per_xpu),
        **_run_keys(prepared, outcome, setup_s, wall_s, scenario.digest(), None),
    }


def xpu_spans(xpus: list[str]) -> list[str]:
    """XPU names as runs of consecutive numbers: xpu0..xpu7, xpu12 (names without a number as they are)."""
    spans: list[list] = []
    for x in xpus:
        number = int(x[3:]) if x.startswith("xpu") and x[3:].isdigit() else None
        if spans and number is not None and spans[-1][1] is not None and number == spans[-1][1] + 1:
            spans[-1][1] = number
            spans[-1][2] = x
        else:
            spans.append([x, number, x])
    return [a if a == b else f"{a}..{b}" for a, _, b in spans]


def _compute_used(scenario, graph, model) -> dict[str, Any]:
    """How the run timed its compute: ``compute_model`` (peak, or roofline when `model` is a ComputeModel),
    ``compute_factors`` (the roofline's factors file, as the scenario names it; None under peak, which reads
    none), ``kernels`` (the workload's kernel inventory, training.kernels; None for a graph workload) and
    ``precision_recipe`` (what its precision keeps in which format)."""
    from hcsim.workload.model import PRECISION_RECIPES

    return {"compute_model": "peak" if model is None else "roofline",
            "compute_factors": None if model is None else scenario.compute_factors or "platforms/compute-model.yaml",
            "kernels": graph.get("kernels"), "precision_recipe": PRECISION_RECIPES.get(graph.get("precision", "fp32"))}


def throughput(platform: nx.Graph, workload: nx.DiGraph, xpus: list[str], iteration_time: float) -> dict[str, float]:
    """Throughput metrics of an iteration time, from the workload's layout and counts.

    ``batches_per_s`` counts one batch per data-parallel replica and iteration (the paper's metric:
    XPUs / T in data parallelism); ``samples_per_s`` and ``tokens_per_s`` the job's samples and
    tokens; ``model_flops_per_s_per_xpu`` the model FLOPs (graph attribute ``model_flops``) per
    second and XPU; ``mfu`` those over the XPUs' peak FLOP/s at the workload's precision."""
    graph = workload.graph
    dp = (graph.get("layout") or {}).get("sizes", {}).get("dp", len(xpus))
    samples = graph.get("global_samples", dp * graph.get("samples_per_iteration", 1))
    metrics = {"batches_per_s": dp / iteration_time, "samples_per_s": samples / iteration_time}
    if graph.get("tokens_per_sample"):
        metrics["tokens_per_s"] = samples * graph["tokens_per_sample"] / iteration_time
    if graph.get("model_flops"):
        from hcsim.platform.devices import peak_flops

        precision = graph.get("precision", "fp32")
        peak = sum(peak_flops(platform.nodes[x], precision) for x in xpus)
        metrics["model_flops_per_s_per_xpu"] = graph["model_flops"] / iteration_time / len(xpus)
        metrics["mfu"] = graph["model_flops"] / iteration_time / peak
    return metrics


def _cxl_link(spec) -> dict[str, float | None]:
    """The CXL link bandwidth (B/s) and latency (s) the run used: the scenario's, else the platform spec's own."""
    link = spec.links.get("cxl") if spec is not None else None
    return {"cxl_bandwidth": link.bandwidth if link else None, "cxl_latency": link.latency if link else None}


def _device_counts(prepared: Prepared) -> dict[str, int]:
    counts: dict[str, int] = {}
    for x in prepared.xpus:
        device = prepared.platform.nodes[x]["device"]
        counts[device] = counts.get(device, 0) + 1
    return counts


def _memory(prepared: Prepared) -> dict[str, dict[str, Any]]:
    """Per device type, the largest training state an XPU holds (bytes), the most of it that spills beyond
    local memory and where to (``spilled_to``: the role of its extended memory, dram or cxl_type3; None when
    nothing spills), and the most that offload keeps away; empty for a graph workload (a graph file or trace
    says where data lives, spilled_xpus, but not how much state there is)."""
    table: dict[str, dict[str, Any]] = {}
    if prepared.placement is None:
        return table
    nodes = prepared.platform.nodes
    for x in prepared.xpus:
        held = prepared.placement.inventory[x]
        row = table.setdefault(nodes[x]["device"], {"state_bytes": 0.0, "spilled_bytes": 0.0, "spilled_to": None,
                                                    "offloaded_bytes": 0.0})
        row["state_bytes"] = max(row["state_bytes"], held.total)
        row["offloaded_bytes"] = max(row["offloaded_bytes"], held.offloaded)
        spilled = held.spilled - held.offloaded
        if spilled > row["spilled_bytes"]:
            row["spilled_bytes"], row["spilled_to"] = spilled, nodes[nodes[x]["extended_memory"]]["role"]
    return dict(sorted(table.items()))


BREAKDOWN = (*TIME_PARTS, *SPLIT_PARTS)  # compute_s, memory_stall_s, exposed_comm_s, idle_s, and their parts


def _device_of(prepared: Prepared) -> dict[str, str]:
    return {x: prepared.platform.nodes[x]["device"] for x in prepared.xpus}


def _breakdown(prepared: Prepared, xpu_times: dict[str, XpuTimes]) -> dict[str, dict[str, float]]:
    """Per device type, mean seconds per measured iteration: compute, memory stall, exposed communication
    (in a collective whose members have all arrived, computing nothing) and idle (waiting for a
    dependency, for peers or in a pipeline bubble); the four add up to the iteration time."""
    groups: dict[str, list[str]] = {}
    for x in prepared.xpus:
        groups.setdefault(prepared.platform.nodes[x]["device"], []).append(x)
    return _mean_times(groups, xpu_times)


def _batch_split_report(prepared: Prepared) -> dict[str, Any]:
    """``batch_split`` of an uneven split: its unit, the count of every DP replica, and per device type (of each
    replica's slowest XPU, the one that set its speed) the replicas and their fewest and most; {} when even."""
    from hcsim.platform.devices import peak_flops
    from hcsim.workload.layout import ParallelLayout

    graph = prepared.workload.graph
    if "batch_split" not in graph:
        return {}
    nodes = prepared.platform.nodes
    layout = ParallelLayout(prepared.xpus, graph["layout"]["sizes"], graph["layout"]["order"])
    replicas: dict[int, list[str]] = {}
    for x in prepared.xpus:
        replicas.setdefault(layout.coordinates(x)["dp"], []).append(x)
    by_device: dict[str, list[int]] = {}
    for r, count in enumerate(graph["batch_split"]):
        slowest = min(replicas[r], key=lambda x: peak_flops(nodes[x], graph["precision"]))
        by_device.setdefault(nodes[slowest]["device"], []).append(count)
    return {"batch_split": {"unit": graph["batch_split_unit"], "per_replica": list(graph["batch_split"]),
                            "by_device": {d: {"replicas": len(c), "fewest": min(c), "most": max(c)}
                                          for d, c in sorted(by_device.items())}}}


def _tp_across_servers(prepared: Prepared) -> dict[str, Any]:
    """``{"tp_across_servers": {"tp": t, "groups": g, "servers": s}}`` when g of the run's TP groups span s > 1
    servers each at most (a TP size beyond a server's XPUs, as real runs sometimes choose: simulated as it is,
    its all-reduces crossing the network), else nothing: a result of TP inside servers is unchanged."""
    layout_dict = prepared.workload.graph.get("layout") or {}
    if layout_dict.get("sizes", {}).get("tp", 1) == 1:
        return {}
    from hcsim.workload.layout import ParallelLayout

    layout = ParallelLayout(prepared.xpus, layout_dict["sizes"], layout_dict["order"])
    nodes = prepared.platform.nodes
    spans = [len({nodes[x].get("server", x) for x in group}) for group in layout.groups("tp")]
    across = [n for n in spans if n > 1]
    if not across:
        return {}
    return {"tp_across_servers": {"tp": layout_dict["sizes"]["tp"], "groups": len(across), "servers": max(across)}}


def _stage_breakdown(prepared: Prepared, xpu_times: dict[str, XpuTimes]) -> dict[str, dict[str, float]]:
    """As :func:`_breakdown`, per pipeline stage ("0", "1", ...; one stage without pipeline parallelism),
    where idle time is mostly the pipeline bubble."""
    sizes = (prepared.workload.graph.get("layout") or {}).get("sizes", {})
    if sizes.get("pp", 1) == 1:
        return {}
    from hcsim.workload.layout import ParallelLayout

    layout = ParallelLayout(prepared.xpus, sizes, prepared.workload.graph["layout"]["order"])
    groups = {str(s): list(layout.stage_xpus(s)) for s in range(sizes["pp"])}
    return _mean_times(groups, xpu_times)


def _mean_times(groups: dict[str, list[str]], xpu_times: dict[str, XpuTimes]) -> dict[str, dict[str, float]]:
    """Per group (sorted), its XPU count and the mean of each part over its XPUs: never across groups."""
    table = {}
    for device, members in sorted(groups.items()):
        rows = [xpu_times[x] for x in members]
        table[device] = {"xpus": len(members)}
        for part in BREAKDOWN:
            table[device][part] = sum(getattr(row, part) for row in rows) / len(rows)
    return table


LINK_COLUMNS = ("source", "target", "kind", "bandwidth_Bps", "bytes", "utilization")


def link_loads(platform: nx.Graph, link_bytes: dict, seconds: float) -> list[dict]:
    """Every loaded link direction, busiest first: bytes and mean utilization = bytes / (bandwidth x seconds)."""
    rows = []
    for (u, v), size in link_bytes.items():
        edge = platform.edges[u, v]
        rows.append({"source": u, "target": v, "kind": edge["kind"], "bandwidth_Bps": edge["bandwidth"],
                     "bytes": size, "utilization": size / (edge["bandwidth"] * seconds)})
    return sorted(rows, key=lambda r: (-r["utilization"], r["source"], r["target"]))


def _busiest_links(platform: nx.Graph, link_bytes: dict, seconds: float, top: int = 3) -> dict[str, list[dict]]:
    """Per link kind, the `top` link directions by mean utilization over the run."""
    by_kind: dict[str, list[dict]] = {}
    for row in link_loads(platform, link_bytes, seconds):
        rows = by_kind.setdefault(row["kind"], [])
        if len(rows) < top:
            rows.append({"link": f"{row['source']} -> {row['target']}", "bytes": row["bytes"],
                         "utilization": row["utilization"]})
    return dict(sorted(by_kind.items()))


def _source_digest() -> str:
    """A hash of hcsim's own source, so results of two code versions can be told apart."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent.parent  # hcsim/, this module being hcsim/run/report.py
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _simgrid_version() -> str:
    from hcsim.engine.simgrid_loader import load

    return getattr(load(), "simgrid_version", "?")


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that an interruption leaves the old file or none, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    umask = os.umask(0)
    os.umask(umask)
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes 0600; give it a plain new file's mode
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _csv_text(rows: list[dict], columns) -> str:
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return table.getvalue()


def write_outputs(out: Path, result: dict, outcome, platform: nx.Graph, workload: nx.DiGraph | None = None,
                  xpus: list[str] | None = None) -> None:
    """result.json, links.csv (every loaded link direction), xpus.csv (where each XPU sits and where its
    iteration goes) and xpus.png (that, per pipeline stage and device type), and with a trace: trace.csv and
    trace.json (Perfetto) in `out`. `xpus`: the run's XPUs in topology order, as the layout places them
    (default: the platform's XPUs that ran, in that order)."""
    from hcsim.platform.topology import xpus as platform_xpus
    from hcsim.run.pictures import plot_xpu_times

    clear_outputs(out)
    rows = link_loads(platform, outcome.link_bytes, outcome.iteration_ends[-1])
    atomic_write(out / "links.csv", _csv_text(rows, LINK_COLUMNS))
    times = per_xpu_times(outcome.xpu_times)
    graph = workload.graph if workload is not None else {}
    if graph.get("jobs"):  # several jobs: each XPU's row names its job, with the job's layout and iteration time
        from hcsim.platform.topology import natural_key

        table = []
        trained = [record for record in result["jobs"] if record.get("kind") != "serving"]
        for job, record in zip(graph["jobs"], trained):
            table += _xpu_table(platform, {x: times[x] for x in job["xpus"]}, record["iteration_time_s"], job["graph"],
                                job["xpus"], job["name"])
        table.sort(key=lambda row: natural_key(row["xpu"]))
    else:
        ran = xpus if xpus is not None else [x for x in platform_xpus(platform) if x in times]
        table = _xpu_table(platform, times, result["iteration_time_s"], graph, ran, result["scenario"])
    atomic_write(out / "xpus.csv", _csv_text(table, XPU_COLUMNS))
    first, last = result["measured_iterations"].split("..")
    measured = f"iteration {last}" if first == last else f"mean of iterations {first} to {last}"
    plot_xpu_times(table, out / "xpus.png", title=f"{result['scenario']}: where the iteration goes ({measured})")
    trace = outcome.trace
    if trace is not None:
        writers = (("trace.csv", trace.write_csv), ("trace.json", lambda p: trace.write_perfetto(p, platform, workload)))
        sizes = {}
        for name, writer in writers:
            temporary = out / f".{name}.partial"
            sizes[name] = writer(temporary)
            os.replace(temporary, out / name)
        _warn_of_a_large_trace(out / "trace.json", sizes["trace.json"], trace, result)
    atomic_write(out / "result.json", json.dumps(result, indent=2) + "\n")


def _xpu_table(platform: nx.Graph, times: dict, period: float, graph: dict, ran: list[str], job: str) -> list[dict]:
    """xpus.csv's rows of one job: its XPUs `ran` (in layout order), the attributes of its workload graph."""
    layout = None
    if graph.get("layout"):
        from hcsim.workload.layout import ParallelLayout

        try:
            layout = ParallelLayout(ran, graph["layout"]["sizes"], graph["layout"]["order"])
        except (ConfigError, KeyError, TypeError):  # a graph file's own layout that does not cover its XPUs:
            layout = None  # no stage and ranks to give, and the run's results are kept
    return xpu_rows(platform, times, period, layout, (graph.get("parallelism") or {}).get("virtual_stages", 1), job)


def _warn_of_a_large_trace(path: Path, size: int, trace, result: dict) -> None:
    """Warn when trace.json is beyond what Perfetto's web UI opens briskly, saying how to narrow it."""
    from hcsim.engine.trace import TRACE_WARN_BYTES

    if size <= TRACE_WARN_BYTES:
        return
    traced = sorted(trace.xpus, key=lambda x: (len(x), x))
    iterations = sorted(trace.iterations) if trace.iterations else list(range(1, len(result["iteration_times_s"]) + 1))
    log.warning("%s: %.0f MB (%d XPUs traced over %d iterations), more than Perfetto's web UI opens briskly "
                "(~%.0f MB). Narrow it with trace_xpus (e.g. --set 'trace_xpus=[%s]'), trace_iterations (e.g. "
                "--set 'trace_iterations=[%d]') or trace_xpus=0 for no trace", path, size / 1e6, len(traced),
                len(iterations), TRACE_WARN_BYTES / 1e6, traced[0] if traced else "xpu0", iterations[-1])
