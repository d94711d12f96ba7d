"""From a scenario to results: build, place, compile, run, report.

SimGrid allows one Engine per process, ever, so :func:`simulate` runs each
simulation in a fresh process (spawned, never forked) and returns plain data;
:func:`run_here` runs in the calling process and may be called once in it.
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from hcsim.errors import ConfigError, OutputError, SimulationError, WorkloadError, brief, shadowed_package

try:
    from hcsim import __version__
except ImportError as _error:  # a folder named hcsim shadows the package: say so, not "cannot import name"
    raise shadowed_package(_error) from _error
from hcsim.results import (SPLIT_PARTS, TIME_PARTS, XPU_COLUMNS, XpuTimes, pace_setters, per_xpu_times, resolve_scenario,
                           xpu_rows)
from hcsim.scenario import Scenario

__all__ = ["Prepared", "prepare", "batch_split", "offload_memory", "spill_policy", "check_local_memory", "host_pairs",
           "execute", "run_here", "compute_model", "simulate",
           "simulate_graphs", "total_runs", "write_outputs", "atomic_write"]

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """Everything a run needs, built from a scenario: graphs, placement and the host pairs to route."""

    scenario: Scenario
    platform: nx.Graph
    workload: nx.DiGraph
    placement: Any
    xpus: list[str]
    pairs: set[tuple[str, str]]
    coherent: bool
    platform_spec: Any = None  # the checked PlatformSpec, for the resolved values a result records


def prepare(scenario: Scenario) -> Prepared:
    """Build the platform and workload graphs of `scenario`, place memory, list the host pairs used.

    Raises
    ------
    ConfigError
        if `scenario` is not a Scenario, a spec is invalid, or the run would
        cost more than the documented limits (:mod:`hcsim.limits`).
    """
    from hcsim.config import resolve_spec
    from hcsim.platform import build_platform, load_platform_spec
    from hcsim.platform.topology import xpus as platform_xpus
    from hcsim.workload import build_training_graph, load_workload_spec, place_memory, validate_workload
    from hcsim.workload.hybrid import build_hybrid_graph, place_hybrid_memory
    from hcsim.workload.layout import ParallelLayout
    from hcsim.workload.sources import is_graph_source

    from hcsim.limits import check_run_cost

    if not isinstance(scenario, Scenario):
        raise ConfigError(f"scenario: expected a hcsim.scenario.Scenario (e.g. load_scenario() or Scenario(xpus=8)), "
                          f"got {brief(scenario)}")
    base = Path(scenario.base)
    platform_path = resolve_spec(scenario.platform, "platforms", base)
    try:
        platform_spec = load_platform_spec(platform_path, scenario.platform_settings())
    except ConfigError as err:
        raise scenario.blame(err, platform_path, "platform") from err
    if scenario.xpus > platform_spec.xpus:
        raise ConfigError(f"scenario {scenario.name!r}: xpus: {scenario.xpus} XPUs asked for, but platform "
                          f"{scenario.platform!r} has {platform_spec.xpus}")
    graph = build_platform(platform_spec, scenario.xpus)
    xpus = platform_xpus(graph)[: scenario.xpus]
    from_graph = is_graph_source(scenario.workload)
    parallelism = None
    if from_graph:  # a graph file or a Chakra trace: it names its own XPUs and memory placement
        workload, xpus = graph_workload(scenario, xpus)
    else:
        workload_path = resolve_spec(scenario.workload, "workloads", base)
        try:
            workload_spec = load_workload_spec(workload_path, scenario.workload_settings())
        except ConfigError as err:
            raise scenario.blame(err, workload_path, "workload") from err
        check_algorithm(scenario, workload_spec, workload_path)
        sizes = {"tp": scenario.tp, "pp": scenario.pp, "ep": scenario.ep, "cp": scenario.cp} \
            | ({"dp": scenario.dp} if scenario.dp else {})
        try:
            layout = ParallelLayout(xpus, sizes)
        except ConfigError as err:
            raise ConfigError(f"scenario {scenario.name!r}: {err}") from err

        def order(group):
            return rank_order(graph, group, scenario, xpus)

        # a framework's kernel inventory (training.kernels) lives in the hybrid graph, one data-parallel rank per XPU
        hybrid = scenario.hybrid or workload_spec.kernels != "megatron"
        layers = layer_split(scenario, workload_spec, layout, graph) if hybrid else None
        parallelism = _parallelism(scenario, workload_spec, layout, layers=layers) if hybrid else None
        split = batch_split(scenario, workload_spec, layout, graph, parallelism)
        if parallelism and split:
            parallelism = _parallelism(scenario, workload_spec, layout, split, layers)
        check_run_cost(workload_spec, scenario.xpus, scenario.iterations, f"scenario {scenario.name!r}",
                       parallelism.micro_batches if parallelism else 1, scenario.pp,
                       sum(c for c, _ in parallelism.replica_classes()) if parallelism else len(set(split or (1,))))
        if parallelism:
            workload = build_hybrid_graph(workload_spec, parallelism, layout, order)
        else:
            workload = build_training_graph(workload_spec, layout, order, dict(zip(xpus, split)) if split else None)
    validate_workload(workload, xpus)
    coherent = bool(graph.graph.get("coherent"))
    if not coherent and any(a == "coherent_ring" for _, a in workload.nodes(data="algorithm")):
        raise ConfigError(f"scenario {scenario.name!r}: collective: coherent_ring keeps the reduced shards in "
                          f"coherent memory, which this platform (coherent: false) does not have; fix: set "
                          f"coherent: true, or collective: ring")
    nodes = graph.nodes
    capacities = {x: nodes[nodes[x]["local_memory"]]["capacity"] for x in xpus}
    extended = {x: nodes[nodes[x]["extended_memory"]]["capacity"] if nodes[x]["extended_memory"] else 0.0
                for x in xpus}
    if from_graph:
        placement = None
    elif parallelism:
        offload = offload_memory(graph, xpus, scenario, coherent)
        placement = place_hybrid_memory(workload, workload_spec, parallelism, layout, capacities, extended, offload)
    else:
        placement = place_memory(workload, capacities, workload_spec, extended,
                                 dict(zip(xpus, split)) if split else None)
    if placement is not None:
        check_local_memory(scenario, platform_spec, graph, placement, layout)
    pairs = host_pairs(graph, workload)
    return Prepared(scenario, graph, workload, placement, xpus, pairs, coherent, platform_spec)


def _cpu_flops_fix(scenario: Scenario, cpu: str) -> str:
    """The override that gives the platform's CPUs FLOP/s: its key differs by kind of platform spec."""
    from hcsim.config import resolve_spec
    from hcsim.platform import load_platform_spec

    spec = load_platform_spec(resolve_spec(scenario.platform, "platforms", Path(scenario.base)))
    if spec.dgx is not None:
        return "set platform_overrides node.cpu_flops (e.g. --set platform_overrides.node.cpu_flops=2TFLOPS)"
    if spec.topology is not None:
        return f"give node {cpu!r} of the explicit topology a flops value (e.g. flops: 2TFLOPS)"
    return "set platform_overrides server.cpu_flops (e.g. --set platform_overrides.server.cpu_flops=2TFLOPS)"


def check_algorithm(scenario: Scenario, spec, path: Path) -> None:
    """Refuse a gradient all-reduce algorithm that is not registered, naming where it was written."""
    from hcsim.engine.collectives import algorithms

    name = spec.algorithm
    known = algorithms().get("all_reduce", [])
    if not name or ":" in name or name in known:
        return
    key = "gradients.algorithm"
    where = (f"scenario {scenario.name!r}: workload_overrides.{key}" if key in scenario.workload_overrides
             else f"{path.name}: {key}")
    raise ConfigError(f"{where}: {brief(name)} is not an all-reduce algorithm{_close(name, known)}; known: "
                      f"{', '.join(known)}, or module:Class of your own")


def _close(value: str, options) -> str:
    import difflib

    close = difflib.get_close_matches(value, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def spill_policy(scenario: Scenario, platform_spec) -> str:
    """``error`` or ``allow``: the scenario's ``spill``, else the platform's (:attr:`PlatformSpec.spill`)."""
    return scenario.spill or platform_spec.spill


def check_local_memory(scenario: Scenario, platform_spec, platform: nx.Graph, placement, layout) -> None:
    """Stop a run that would spill on a platform that does not spill, as the training framework would.

    The rule is :func:`hcsim.workload.placement.out_of_memory` (``hcsim plan``'s too), applied to each XPU's
    inventory: its training state less what offload keeps away must fit its local memory. Where
    :func:`spill_policy` says ``allow``, the rest spills to extended memory instead (the paper's model).

    Raises
    ------
    ConfigError
        naming the first pipeline stage that does not fit, its bytes per XPU by kind, the device and its
        capacity, and the remedies.
    """
    from hcsim.workload.placement import out_of_memory

    policy = spill_policy(scenario, platform_spec)
    if policy == "allow":
        return
    nodes = platform.nodes
    worst: dict[int, tuple[float, str]] = {}  # stage -> (bytes beyond local memory, its XPU) of its worst XPU
    for x, held in placement.inventory.items():
        capacity = nodes[nodes[x]["local_memory"]]["capacity"]
        stage = layout.stage(x)
        if out_of_memory(stage, held.need, capacity, nodes[x]["device"]) and \
                held.need - capacity > worst.get(stage, (0.0, ""))[0]:
            worst[stage] = (held.need - capacity, x)
    if not worst:
        return
    stage = min(worst)
    x = worst[stage][1]
    held = placement.inventory[x]
    parts = ", ".join(f"{kind} {value / 1e9:.1f} GB" for kind, value in (
        ("parameters", held.parameters), ("gradients", held.gradients), ("optimizer", held.optimizer),
        ("activations", held.activations)) if value) \
        + (f", less {held.offloaded / 1e9:.1f} GB offloaded" if held.offloaded else "")
    others = sorted(worst)[1:]
    also = f"; stage{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} neither" if others else ""
    why = ("spill: error" if scenario.spill else
           f"platform {scenario.platform!r} is a DGX cluster, whose frameworks (Megatron-LM, PyTorch) have no "
           f"spill to host memory")
    raise ConfigError(
        f"scenario {scenario.name!r}: out of memory: "
        f"{out_of_memory(stage, held.need, nodes[nodes[x]['local_memory']]['capacity'], nodes[x]['device'])} "
        f"({parts}){also}; {why}. Fix: offload (offload=cpu), ZeRO (zero=1, 2 or 3), more pipeline stages (pp), "
        f"recomputation (recompute=full), a smaller micro_batch, or allow spilling to extended memory with "
        f"--set spill=allow")


def offload_memory(platform: nx.Graph, xpus: list[str], scenario: Scenario, coherent: bool) -> dict:
    """XPU -> (memory node, capacity in bytes) that `scenario.offload` puts state in; {} without offload.

    Raises
    ------
    ConfigError
        when the platform lacks that memory: ``cpu`` needs every XPU's host DRAM (``host_memory``) and a
        CPU with FLOP/s to run the optimizer step on; ``cxl`` needs a coherent platform whose XPUs' extended
        memory is a CXL Type 3 expander.
    """
    if scenario.offload == "none":
        return {}
    nodes = platform.nodes
    where = f"scenario {scenario.name!r}: offload: {scenario.offload}"
    found = {}
    for x in xpus:
        if scenario.offload == "cpu":
            memory = nodes[x].get("host_memory")
            if memory is None:
                raise ConfigError(f"{where}: XPU {x!r} has no host CPU memory on platform {scenario.platform!r}; "
                                  f"valid: offload: cxl or none, or a platform whose servers have CPUs")
            cpu = nodes[memory]["owner"]
            if "optimizer" in scenario.offload_state and not nodes[cpu].get("flops"):
                raise ConfigError(f"{where}: CPU {cpu!r} has no FLOP/s to run the offloaded optimizer step; "
                                  f"fix: {_cpu_flops_fix(scenario, cpu)}")
        else:
            memory = nodes[x].get("extended_memory")
            if not coherent or memory is None or nodes[memory].get("role") != "cxl_type3":
                raise ConfigError(f"{where}: needs a coherent platform whose XPUs have CXL Type 3 memory; "
                                  f"{scenario.platform!r} (coherent: {coherent}) gives XPU {x!r} "
                                  f"{'no extended memory' if memory is None else nodes[memory].get('role')}; "
                                  f"valid: coherent: true on paper-cxl, or offload: cpu")
        found[x] = (memory, nodes[memory]["capacity"])
    return found


def batch_split(scenario: Scenario, spec, layout, platform: nx.Graph, parallelism) -> tuple[int, ...] | None:
    """The scenario's batch_split resolved (hcsim.workload.split): micro-batches per DP replica of the hybrid
    `parallelism`, or samples per XPU of the paper's data-parallel graph (`parallelism` None); None when
    even. A replica's speed is the peak FLOP/s at the workload's precision of its slowest XPU.

    Raises
    ------
    ConfigError
        naming the scenario and batch_split, for a list of the wrong length, sum or values, or a
        proportional split that leaves a replica nothing.
    """
    from hcsim.platform.devices import peak_flops
    from hcsim.workload.split import resolve_batch_split

    if scenario.batch_split == "even":
        return None
    nodes = platform.nodes
    slowest = layout.slowest("dp", lambda x: peak_flops(nodes[x], spec.precision))
    if parallelism:
        total, unit = parallelism.micro_batches * parallelism.dp, "micro-batches"
        text = f"global_batch / micro_batch = {parallelism.global_batch} / {parallelism.micro_batch}"
    else:
        total, unit = spec.batch_per_xpu * len(layout.xpus), "samples"
        text = f"training.batch_per_xpu x xpus = {spec.batch_per_xpu} x {len(layout.xpus)}, the paper's " \
               f"data-parallel graph"
    try:
        return resolve_batch_split(scenario.batch_split, [peak_flops(nodes[x], spec.precision) for x in slowest],
                                   total, unit, text, [f"slowest XPU {x}, {nodes[x]['device']}" for x in slowest])
    except ConfigError as err:
        raise ConfigError(f"scenario {scenario.name!r}: {err}") from None


def layer_split(scenario: Scenario, spec, layout, platform: nx.Graph) -> tuple[int, ...] | None:
    """The scenario's layer_split resolved: decoders per (virtual) stage, `proportional` to each stage's speed
    (the peak FLOP/s at the workload's precision of its slowest XPU; every chunk of a stage weighs the same),
    rounded by the largest remainders; None when even.

    Raises
    ------
    ConfigError
        naming the scenario and layer_split when a proportional split leaves a stage no decoder.
    """
    from hcsim.platform.devices import peak_flops
    from hcsim.workload.split import largest_remainder

    if scenario.layer_split != "proportional":
        return scenario.layer_split
    def speed(x):
        return peak_flops(platform.nodes[x], spec.precision)

    speeds = [speed(x) for x in layout.slowest("pp", speed)]
    counts = largest_remainder(spec.model.decoders, speeds * scenario.virtual_stages)  # chunk c of stage s: c*pp+s
    if min(counts) < 1:
        stage = counts.index(0) % scenario.pp
        raise ConfigError(f"scenario {scenario.name!r}: layer_split: proportional gives pipeline stage {stage} "
                          f"none of the {spec.model.decoders} decoders (stage speeds "
                          f"{', '.join(f'{s / 1e12:g}' for s in speeds)} TFLOP/s); valid: fewer stages, an "
                          f"explicit list of decoder counts >= 1, or even")
    return counts


def _parallelism(scenario: Scenario, spec, layout, split: tuple[int, ...] | None = None,
                 layers: tuple[int, ...] | None = None):
    """The scenario's hybrid parallelism over `layout`, defaults filled from the workload spec; `split`: the
    resolved batch_split (micro-batches per DP replica); `layers`: the resolved layer_split."""
    from hcsim.workload.hybrid import Parallelism

    try:
        return Parallelism.of_layout(spec, layout, micro_batch=scenario.micro_batch,
                                     global_batch=scenario.global_batch, recompute=scenario.recompute,
                                     schedule=scenario.schedule, virtual_stages=scenario.virtual_stages,
                                     sequence_parallel=scenario.sequence_parallel, layer_split=layers,
                                     zero=scenario.zero, offload=scenario.offload,
                                     offload_state=scenario.offload_state, moe_skew=scenario.moe_skew,
                                     batch_split=split, megatron_comm=scenario.compute_model == "roofline",
                                     cp_algorithm=scenario.cp_algorithm)
    except ConfigError as err:
        raise ConfigError(f"scenario {scenario.name!r}: {err}") from err


def graph_workload(scenario: Scenario, xpus: list[str]) -> tuple[nx.DiGraph, list[str]]:
    """The workload graph of a scenario whose ``workload`` is a graph file or a Chakra trace, on the run's
    XPUs (:mod:`hcsim.workload.sources`), with the scenario's collective keys applied: ``collective`` sets
    every all-reduce's algorithm, ``collective_chunks`` every collective's chunks. Returns the graph and the
    XPUs it runs on."""
    from hcsim.workload.sources import load_graph_source, place_graph

    where = f"scenario {scenario.name!r}"
    spec_only = {"granularity": scenario.granularity is not None, "workload_overrides": bool(scenario.workload_overrides),
                 "precision": scenario.precision is not None,
                 "ring_order": scenario.ring_order != "topology",
                 "tp, pp, dp, micro_batch, global_batch, recompute, layer_split": scenario.hybrid or bool(scenario.dp),
                 "batch_split": scenario.batch_split != "even"}
    for key, given in spec_only.items():
        if given:
            raise ConfigError(f"{where}: {key}: applies to workload specs only, and workload {scenario.workload!r} "
                              f"is a graph; fix: remove {key}, or edit the graph")
    workload, used = place_graph(load_graph_source(scenario.workload, scenario.base), xpus, f"{where}: workload")
    for _, data in workload.nodes(data=True):
        if data.get("kind") != "comm" or data.get("collective") == "p2p":
            continue
        if scenario.collective is not None and data.get("collective") == "all_reduce":
            data["algorithm"] = scenario.collective
        if scenario.collective_chunks is not None:
            data["chunks"] = scenario.collective_chunks
    return workload, used


def rank_order(platform: nx.Graph, xpus: list[str], scenario: Scenario, run_xpus: list[str] | None = None) -> list[str]:
    """A collective group's XPUs in rank order (scenario.ring_order), `xpus` being in topology order.

    `run_xpus` are all XPUs of the run (default: `xpus`): an explicit order must list each once, and
    orders each group by the positions of its members in that list."""
    order = scenario.ring_order
    if order == "topology":
        return xpus
    if order == "interleaved":  # round robin over the servers: rank i+1 is on another server than rank i
        by_server: dict[object, list[str]] = {}
        for xpu in xpus:
            by_server.setdefault(platform.nodes[xpu].get("server"), []).append(xpu)
        columns = list(by_server.values())
        return [column[i] for i in range(max(map(len, columns))) for column in columns if i < len(column)]
    run_xpus = xpus if run_xpus is None else run_xpus
    if sorted(order) != sorted(run_xpus):
        missing, extra = sorted(set(run_xpus) - set(order)), sorted(set(order) - set(run_xpus))
        raise ConfigError(f"scenario {scenario.name!r}: ring_order: must list each of the {len(run_xpus)} XPUs once"
                          + (f"; missing {', '.join(missing[:5])}" if missing else "")
                          + (f"; not in this run: {', '.join(extra[:5])}" if extra else "")
                          + ("" if missing or extra else "; some are listed twice"))
    members = set(xpus)
    return [x for x in order if x in members]


def host_pairs(platform: nx.Graph, workload: nx.DiGraph) -> set[tuple[str, str]]:
    """The ordered host pairs a run transfers between: memory reads and collective traffic."""
    from hcsim.engine.collectives import get_algorithm, server_groups
    from hcsim.engine.executor import form_transfers, memory_form

    nodes = platform.nodes
    pairs: set[tuple[str, str]] = set()
    done = set()  # collectives already counted: the same algorithm and size on the same group
    for _, data in workload.nodes(data=True):
        if data["kind"] == "compute":
            offloads = data.get("host") or data.get("move") or data.get("offload")
            for x in data["xpus"]:
                pairs.add((nodes[x]["local_memory"], x))
                if offloads:
                    for coherent in (True, False):
                        pairs.update(form_transfers(nodes, data, x, memory_form(nodes, data, x, coherent)))
            for x in data["spilled_xpus"]:
                pairs.add((nodes[x]["extended_memory"], x))
            continue
        collective = data["collective"]
        name = data.get("algorithm") or ("direct" if collective == "p2p" else None)
        for group in data["groups"]:
            if (key := (collective, name, group, data["bytes"], data.get("chunks"))) in done:
                continue
            done.add(key)
            algorithm = get_algorithm(collective, name, len(group), data["bytes"], server_groups(platform, group),
                                      data.get("chunks"))
            pairs.update((group[s], group[d]) for s, d in algorithm.pairs())
    return pairs


def execute(platform: nx.Graph, workload: nx.DiGraph, options, pairs=None, progress=None):
    """Compile `platform` for the pairs `workload` uses and run it here (once per process).

    `progress(n)` is called as vertex runs complete (see :meth:`total_runs`)."""
    from hcsim.engine.backend import SimgridBackend
    from hcsim.engine.executor import Executor
    from hcsim.platform import compile_platform

    compiled = compile_platform(platform, pairs if pairs is not None else host_pairs(platform, workload),
                                workload.graph.get("precision", "fp32"))
    with tempfile.TemporaryDirectory(prefix="hcsim-") as folder:
        xml = Path(folder) / "platform.xml"
        xml.write_text(compiled.xml)
        if options.engine == "core":  # the executor's rules in C++ (issue 27); it refuses what it lacks
            from hcsim.engine.core.workload import run_workload

            return run_workload(platform, workload, compiled.routes, xml, options)
        backend = SimgridBackend(xml)
    return Executor(platform, workload, compiled.routes, backend, options, progress).run()


def total_runs(workload: nx.DiGraph, iterations: int) -> int:
    """How many vertex runs a simulation of `iterations` iterations completes."""
    return iterations * sum(len(xpus) for _, xpus in workload.nodes(data="xpus"))


def _execute_child(platform, workload, options) -> dict[str, Any]:
    wall = time.perf_counter()
    outcome = execute(platform, workload, options)
    trace = outcome.trace
    return {"iteration_ends": outcome.iteration_ends, "activities": outcome.activities, "busy": outcome.busy,
            "collective_fidelity": outcome.collective_fidelity, "link_bytes": outcome.link_bytes,
            "xpu_times": outcome.xpu_times, "representatives": outcome.representatives,
            "vertices": trace.vertices if trace else [], "transfers": trace.transfers if trace else [],
            "wall_time_s": time.perf_counter() - wall, "peak_rss_mb": _peak_rss_mb()}


def _peak_rss_mb() -> float:
    """This process's peak resident memory in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def simulate_graphs(platform: nx.Graph, workload: nx.DiGraph, options=None) -> dict[str, Any]:
    """Run a platform graph and a workload graph in a fresh process; plain data back.

    Returns ``iteration_ends`` (s), ``activities``, ``busy`` (xpu -> [compute s,
    memory stall s]), ``xpu_times`` (xpu -> compute_s, memory_stall_s, comm_s, idle_s
    per measured iteration), ``representatives`` (follower -> representative XPU),
    ``collective_fidelity`` (vertex -> step | flow), ``link_bytes`` ((u, v) -> bytes),
    the traced ``vertices`` and ``transfers``, ``wall_time_s`` (the worker's compile
    and run) and ``peak_rss_mb`` (the worker's peak memory, MB).

    The worker is a spawned process that imports the calling script again:
    call this under ``if __name__ == "__main__":`` (a SimulationError says so).
    """
    from hcsim.engine.executor import RunOptions
    from hcsim.workload import validate_workload

    _check_main_guard()
    validate_workload(workload)
    return _in_fresh_process(_execute_child, platform, workload, options or RunOptions())


def compute_model(scenario: Scenario, workload: nx.DiGraph, platform: nx.Graph | None = None):
    """The scenario's roofline ComputeModel, or None for ``compute_model: peak``.

    A workload of PyTorch's kernels (training.kernels: pytorch-eager or torch-compile) is always timed by its
    kernels: the peak model knows nothing of them. Raises ConfigError when roofline is asked of a graph without
    op-level costs, or when a device of `platform` has no factors; warns, naming them, when its devices'
    factors are literature values."""
    if scenario.compute_model == "peak" and workload.graph.get("kernels", "megatron") == "megatron":
        return None
    from hcsim.config import resolve_spec
    from hcsim.engine.compute_model import load_compute_model

    if not any(ops for _, ops in workload.nodes(data="ops")):
        raise ConfigError(f"scenario {scenario.name!r}: compute_model: roofline times the kernels (ops) of compute "
                          f"vertices, which only the hybrid-parallel graph has; fix: set tp, pp, micro_batch or "
                          f"global_batch, or compute_model: peak")
    path = resolve_spec(scenario.compute_factors, "platforms", Path(scenario.base)) if scenario.compute_factors else None
    model = load_compute_model(path)
    devices = sorted({d for _, d in (platform.nodes(data="device") if platform is not None else ()) if d})
    unmeasured = [model.device(d).name for d in devices if model.device(d).provenance == "literature"]
    if unmeasured:
        log.warning("compute_model: roofline: the kernel factors of %s are literature figures, not measured "
                    "(%s); measure the GPU with benchmarks/gpu_kernels.py and fit it with hcsim calibrate",
                    ", ".join(unmeasured), model.source)
    return model


RUN_OUTPUTS = ("result.json", "links.csv", "xpus.csv", "xpus.png", "trace.csv", "trace.json")  # what a run writes


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


def run_here(scenario: Scenario, out: Path | None = None, progress=None, check=None, overwrite: bool = False
             ) -> dict[str, Any]:
    """Run `scenario` in this process (SimGrid: once per process); write outputs to `out` if given (a folder
    with an earlier run's results only with `overwrite`: :func:`check_results_folder`).

    `progress`, if given, is a factory called with the total number of vertex
    runs; it returns a callable that receives how many more have completed.
    `check`, if given, is called with the :class:`Prepared` run before it runs (it may raise)."""
    from hcsim.engine.executor import RunOptions

    wall = time.perf_counter()
    if out is not None:
        check_results_folder(out, overwrite, "out")
    from hcsim.serving import serving_workload, simulate_serving, write_serving_outputs

    serving = serving_workload(scenario)
    if serving is not None:  # an inference workload: continuous batching (hcsim.serving), no training graph
        result = simulate_serving(scenario, serving)
        if out is not None:
            write_serving_outputs(Path(out), result)
        return result
    prepared = prepare(scenario)
    if check is not None:
        check(prepared)
    setup_s = time.perf_counter() - wall
    traced = traced_xpus(prepared) if out is not None else None
    options = RunOptions(iterations=scenario.iterations, coherent=prepared.coherent,
                         collective_model=scenario.collective_model, step_limit=scenario.step_limit,
                         local_access=scenario.local_access, xpu_sampling=scenario.xpu_sampling,
                         local_collectives=scenario.local_collectives, engine=scenario.engine,
                         compute_model=compute_model(scenario, prepared.workload, prepared.platform),
                         trace_xpus=traced,
                         trace_iterations=frozenset(scenario.trace_iterations) if scenario.trace_iterations else None)
    update = progress(total_runs(prepared.workload, scenario.iterations)) if progress else None
    outcome = execute(prepared.platform, prepared.workload, options, prepared.pairs, update)
    result = summarize(prepared, outcome, setup_s, time.perf_counter() - wall)
    if out is not None:
        try:
            write_outputs(Path(out), result, outcome, prepared.platform, prepared.workload)
        except OSError as err:
            raise OutputError(f"{err.filename or out}: could not write the outputs ({err.strerror or err}); the run "
                              "finished and its result is kept, but nothing more was saved", result) from None
    return result


def traced_xpus(prepared: Prepared) -> frozenset[str] | str | None:
    """The XPUs scenario.trace_xpus asks to trace (None: none; "per-class": decided by the executor).

    Raises
    ------
    ConfigError
        if a named XPU is not one of the run's.
    """
    wanted = prepared.scenario.trace_xpus
    if wanted == "per-class":
        return wanted
    if wanted in ("per-device", "per-stage"):
        stage = _stage_of(prepared) if wanted == "per-stage" else {}
        first: dict[tuple, str] = {}
        for x in prepared.xpus:
            first.setdefault((stage.get(x, 0), prepared.platform.nodes[x]["device"]), x)
        return frozenset(first.values())
    if isinstance(wanted, int):
        return frozenset(prepared.xpus[:wanted]) or None
    unknown = sorted(set(wanted) - set(prepared.xpus))
    if unknown:
        raise ConfigError(f"scenario {prepared.scenario.name!r}: trace_xpus: {', '.join(unknown[:5])} "
                          f"{'is' if len(unknown) == 1 else 'are'} not among this run's XPUs "
                          f"({prepared.xpus[0]}..{prepared.xpus[-1]})")
    return frozenset(wanted) or None


def _stage_of(prepared: Prepared) -> dict[str, int]:
    """Each XPU's pipeline stage ({} without pipeline parallelism)."""
    sizes = (prepared.workload.graph.get("layout") or {}).get("sizes", {})
    if sizes.get("pp", 1) == 1:
        return {}
    from hcsim.workload.layout import ParallelLayout

    layout = ParallelLayout(prepared.xpus, sizes, prepared.workload.graph["layout"]["order"])
    return {x: s for s in range(sizes["pp"]) for x in layout.stage_xpus(s)}


def summarize(prepared: Prepared, outcome, setup_s: float, wall_s: float) -> dict[str, Any]:
    """The result record of a run: throughput, breakdown, counts, provenance."""
    ends = outcome.iteration_ends
    times = [b - a for a, b in zip([0.0] + ends, ends)]
    steady = times[1:] if len(times) > 1 else times
    iteration_time = sum(steady) / len(steady)
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
        **_cxl_link(prepared.platform_spec),
        "iteration_times_s": times,
        "iteration_time_s": iteration_time,
        "measured_iterations": f"{2 if len(times) > 1 else 1}..{len(times)}",
        **throughput(prepared.platform, prepared.workload, prepared.xpus, iteration_time),
        "breakdown": _breakdown(prepared, per_xpu),
        "stages": _stage_breakdown(prepared, per_xpu),
        "pace": pace_setters(per_xpu, _device_of(prepared)),
        "memory": _memory(prepared),
        "spill": spill_policy(scenario, prepared.platform_spec) if prepared.platform_spec is not None else None,
        **_batch_split_report(prepared),
        **_tp_across_servers(prepared),
        "links": _busiest_links(prepared.platform, outcome.link_bytes, ends[-1]),
        "activities": outcome.activities,
        "collective_fidelity": sorted(set(outcome.collective_fidelity.values())),
        "wall_time_s": wall_s,
        "setup_time_s": setup_s,
        "peak_rss_mb": _peak_rss_mb(),
        "inputs": scenario.to_dict(),
        "inputs_resolved": resolve_scenario(scenario),
        "inputs_hash": scenario.digest() + (f"+{graph['source_digest']}" if "source_digest" in graph else ""),
        "layout": graph.get("layout"),
        "versions": {"hcsim": __version__, "source": _source_digest(), "simgrid": _simgrid_version(),
                     "python": host_platform.python_version()},
    }


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
    package = Path(__file__).resolve().parent
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


def write_outputs(out: Path, result: dict, outcome, platform: nx.Graph, workload: nx.DiGraph | None = None) -> None:
    """result.json, links.csv (every loaded link direction), xpus.csv and xpus.png (where each XPU's
    iteration goes), and with a trace: trace.csv and trace.json (Perfetto) in `out`."""
    from hcsim.plotting import plot_xpu_times

    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_OUTPUTS:  # an earlier run's (checked before the run): none is left beside this one's
        (out / name).unlink(missing_ok=True)
    rows = link_loads(platform, outcome.link_bytes, outcome.iteration_ends[-1])
    atomic_write(out / "links.csv", _csv_text(rows, LINK_COLUMNS))
    xpus = xpu_rows(platform, per_xpu_times(outcome.xpu_times), outcome.representatives, result["iteration_time_s"])
    atomic_write(out / "xpus.csv", _csv_text(xpus, XPU_COLUMNS))
    plot_xpu_times(xpus, out / "xpus.png", title=f"{result['scenario']}: where each XPU's iteration goes "
                   f"(iterations {result['measured_iterations']})")
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


def _child(scenario: Scenario, out: str | None, overwrite: bool = False) -> dict[str, Any]:
    return run_here(scenario, Path(out) if out else None, overwrite=overwrite)


def simulate(scenario: Scenario, out: Path | str | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Run `scenario` in a fresh process and return its result record (the Python API).

    The process is spawned: it imports the calling script again, so a script
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
        raise ConfigError(f"scenario: expected a hcsim.scenario.Scenario (e.g. load_scenario() or Scenario(xpus=8)), "
                          f"got {brief(scenario)}")
    if out is not None:
        check_results_folder(out, overwrite, "out")
    _check_main_guard()
    return _in_fresh_process(_child, scenario, str(out) if out is not None else None, overwrite)


def _in_fresh_process(function, *args):
    """`function(*args)` in a spawned process (SimGrid: one Engine per process); its result or its error."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        with _fresh_process() as pool:
            return pool.submit(function, *args).result()
    except BrokenProcessPool as err:
        raise SimulationError(f"simulation process: it died before returning a result ({err}). If this runs from "
                              "a script, put the script's top-level code under `if __name__ == \"__main__\":` "
                              "(the process is spawned and imports the script again)") from None


def _check_main_guard() -> None:
    """Refuse to spawn from a script whose top level would run again, unguarded, in the spawned process.

    A spawned process imports the ``__main__`` script again; one that calls
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
                      "simulation in a spawned process, which imports the script again; put the script's top-level "
                      "code under that guard (see the README's Python example)")



def _fresh_process():
    """A pool of one spawned (never forked) process for one task (imported here: `hcsim simulate` runs in
    its own process and needs no multiprocessing)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    return ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"), max_tasks_per_child=1)
