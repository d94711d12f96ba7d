"""Preparing a run: from a scenario to everything it needs (platform and workload graphs, layout, placement).

Pure of SimGrid: specs are resolved, batches and layers split, offload planned, ranks ordered and the host
pairs to route listed; :mod:`hcsim.run.simulation` then runs the :class:`Prepared` run in a process.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from operator import methodcaller
from pathlib import Path
from typing import Any

import networkx as nx

from hcsim.engine.api import host_pairs
from hcsim.errors import ConfigError, TopologyError, brief, say_once
from hcsim.run.scenario import Scenario
from hcsim.run.stragglers import apply_stragglers

__all__ = ["Prepared", "prepare", "batch_split", "layer_split", "offload_memory", "spill_policy", "check_local_memory",
           "coherent_memory",
           "check_algorithm", "graph_workload", "rank_order", "compute_model", "resolve_compute_model",
           "platform_devices", "traced_xpus"]

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
    jobs: list | None = None  # several jobs on one fabric: each training job's Prepared (its scenario, its graph's
    # attributes, placement and XPUs; hcsim.run.jobs); None: one job, this one
    serving: tuple | None = None  # a serving job among the jobs: (its index in scenario.jobs, its XPUs), run beside
    # the training jobs (hcsim.run.cojobs); None: none
    taken: dict | None = None  # memory node -> bytes the training jobs spill or offload there (what a serving job
    # beside them finds taken of a memory they share: a CXL pool, a CPU's DRAM)


def scenario_platform(scenario: Scenario, xpus_field: str, whole_superchips: bool = True
                      ) -> tuple[Any, nx.Graph, list[str]]:
    """The checked platform spec of `scenario`, the platform graph it runs on and its first ``scenario.xpus``
    XPUs; `xpus_field` names where the XPU count came from in the error when the platform has fewer, or when
    (`whole_superchips`) the count splits a superchip (gb200-nvl72: 2 GPUs each)."""
    from hcsim.config import resolve_spec
    from hcsim.platform import build_platform, load_platform_spec
    from hcsim.platform.topology import xpus as platform_xpus

    path = resolve_spec(scenario.platform, "platforms", Path(scenario.base))
    try:
        spec = load_platform_spec(path, scenario.platform_settings())
    except ConfigError as err:
        raise scenario.blame(err, path, "platform") from err
    if scenario.xpus > spec.xpus:
        raise ConfigError(f"{xpus_field}: {scenario.xpus} XPUs asked for, but platform {scenario.platform!r} has "
                          f"{spec.xpus}")
    if whole_superchips:
        check_whole_superchips(spec, scenario.xpus, xpus_field, scenario.platform)
    try:
        graph = build_platform(spec, scenario.xpus)
    except TopologyError as err:
        if "routes" not in scenario.platform_overrides:
            raise
        raise _blame_routes(scenario, err, path) from err
    return spec, graph, platform_xpus(graph)[: scenario.xpus]


def check_whole_superchips(spec: Any, xpus: int | list[str], xpus_field: str, platform: str) -> None:
    """Refuse `xpus` (a count, or a job's XPU names) that would build or take part of a superchip (gb200-nvl72:
    2 GPUs each; a GPU shares its superchip's C2C and Grace with the other), naming `xpus_field`, the superchip's
    size and the nearest whole counts, or the partner XPUs a list leaves out."""
    chip = spec.superchip.gpus_per_superchip if spec.superchip is not None else 1
    if not isinstance(xpus, int):
        _check_whole_superchip_names(xpus, chip, xpus_field, platform)
        xpus = len(xpus)
    if xpus % chip:
        low, high = xpus // chip * chip, (xpus // chip + 1) * chip
        nearest = " or ".join(str(n) for n in (low, high) if chip <= n <= spec.xpus)
        raise ConfigError(f"{xpus_field}: {xpus} XPUs would split a superchip of platform {platform!r}, whose "
                          f"superchips hold {chip} GPUs each (node.gpus_per_superchip); valid: a multiple of {chip}, "
                          f"nearest {nearest}")


def _check_whole_superchip_names(xpus: list[str], chip: int, xpus_field: str, platform: str) -> None:
    """Refuse XPU names (xpuN: superchip N // `chip`, as the superchip builders number them) that leave out a
    GPU of a superchip they take part of."""
    if chip == 1:
        return
    given = set(xpus)
    chips = sorted({int(x[3:]) // chip for x in xpus})
    missing = [f"xpu{n}" for c in chips for n in range(c * chip, (c + 1) * chip) if f"xpu{n}" not in given]
    if missing:
        raise ConfigError(f"{xpus_field}: would split a superchip of platform {platform!r}, whose superchips hold "
                          f"{chip} GPUs each (node.gpus_per_superchip: xpu0-xpu{chip - 1}, ...); valid: whole "
                          f"superchips: add {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")


def _blame_routes(scenario: Scenario, err: TopologyError, path: Path) -> TopologyError:
    """A route error about routes the scenario gave (``platform_overrides.routes``) blamed on the scenario key
    the user wrote, each ``routes[i]`` as ``platform_overrides.routes[i]``, not on the platform file."""
    import re

    text = str(err).removeprefix(f"{path.name}: ")
    text = re.sub(r"(?<![\w.])routes(?=\[\d+\]|:)", "platform_overrides.routes", text)
    return TopologyError(f"scenario {scenario.name!r}: {text} (routes given to platform {path.name})")


def prepare(scenario: Scenario) -> Prepared:
    """Build the platform and workload graphs of `scenario`, place memory, list the host pairs used.

    Raises
    ------
    ConfigError
        if `scenario` is not a Scenario, a spec is invalid, or the run would
        cost more than the documented limits (:mod:`hcsim.limits`).
    """
    if not isinstance(scenario, Scenario):
        raise ConfigError(f"scenario: expected a hcsim.run.scenario.Scenario (e.g. load_scenario() or Scenario(xpus=8)), "
                          f"got {brief(scenario)}")
    if scenario.jobs:
        return prepare_jobs(scenario)
    platform_spec, graph, xpus = scenario_platform(scenario, f"scenario {scenario.name!r}: xpus")
    workload, xpus, placement, coherent = _prepare_workload(scenario, platform_spec, graph, xpus)
    apply_stragglers(scenario, graph, xpus)  # each straggler's slowdown on its node (hcsim.run.stragglers)
    pairs = host_pairs(graph, workload)
    return Prepared(scenario, graph, workload, placement, xpus, pairs, coherent, platform_spec)


def prepare_jobs(scenario: Scenario) -> Prepared:
    """:func:`prepare` of a scenario with ``jobs`` (:mod:`hcsim.run.jobs`): each job's graph built and its memory
    placed as alone on its XPUs, the graphs joined into one."""
    from hcsim.limits import collector_paused
    from hcsim.platform import build_platform
    from hcsim.platform.topology import xpus as platform_xpus
    from hcsim.run.jobs import assign_xpus, job_scenarios, join_graphs

    scenarios = job_scenarios(scenario)
    serving = _serving_job(scenario, scenarios)
    training = [i for i in range(len(scenarios)) if i != serving]
    models = {i: resolve_compute_model(scenarios[i]) for i in training}
    if len(set(models.values())) > 1:
        first = models[training[0]]
        other = next(i for i in training if models[i] != first)
        raise ConfigError(f"scenario {scenario.name!r}: jobs[{other}]: its compute model resolves to {models[other]} "
                          f"and jobs[{training[0]}]'s to {first}, but one run times every job with one model (the "
                          f"roofline model where a job's graph lists kernels: tp, pp, micro_batch, ...); fix: set compute_model: "
                          f"peak (or roofline, where every job's graph lists kernels) at the top level")
    total = sum(s.xpus for s in scenarios)
    platform_spec, graph, _ = scenario_platform(dataclasses.replace(scenario, xpus=1, jobs=None, jobs_alone=False),
                                                f"scenario {scenario.name!r}: jobs", whole_superchips=False)
    named = [x for job in scenario.jobs if not isinstance(job["xpus"], int) for x in job["xpus"]]
    numbers = [int(x[3:]) for x in named if x.startswith("xpu") and x[3:].isdigit()]
    size = max([total, *(n + 1 for n in numbers)]) if len(numbers) == len(named) else platform_spec.xpus
    if total > platform_spec.xpus:
        raise ConfigError(f"scenario {scenario.name!r}: jobs: {total} XPUs asked for "
                          f"({' + '.join(str(s.xpus) for s in scenarios)}), but platform {scenario.platform!r} has "
                          f"{platform_spec.xpus}; valid: at most {platform_spec.xpus} in all")
    graph = build_platform(platform_spec, min(size, platform_spec.xpus))
    assigned = assign_xpus(scenario, platform_xpus(graph), platform_spec.xpus)
    for i, (job, xpus) in enumerate(zip(scenario.jobs, assigned)):  # a count as a count: its nearest whole ones
        check_whole_superchips(platform_spec, job["xpus"] if isinstance(job["xpus"], int) else xpus,
                               f"scenario {scenario.name!r}: jobs[{i}].xpus", scenario.platform)
    beside = (serving, assigned[serving]) if serving is not None else None
    if not training:  # a serving job alone (hcsim.run.cojobs runs it)
        return Prepared(scenario, graph, None, None, [], set(), bool(graph.graph.get("coherent")), platform_spec,
                        jobs=[], serving=beside)
    jobs, graphs = [], []
    for job, xpus in ((scenarios[i], assigned[i]) for i in training):
        workload, xpus, placement, coherent = _prepare_workload(job, platform_spec, graph, xpus)
        jobs.append(Prepared(job, graph, nx.DiGraph(**workload.graph), placement, xpus, set(), coherent,
                             platform_spec))
        graphs.append(workload)
    taken = _check_jobs_memory(scenario, graph, jobs)
    with collector_paused():
        workload = join_graphs(graphs, [job.scenario.name for job in jobs], [job.scenario.iterations for job in jobs])
        for entry, job in zip(workload.graph["jobs"], jobs):
            entry["xpus"] = job.xpus
        del graphs
    xpus = [x for x in platform_xpus(graph) if x in {x for job in jobs for x in job.xpus}]
    apply_stragglers(scenario, graph, xpus)
    pairs = host_pairs(graph, workload)
    return Prepared(scenario, graph, workload, None, xpus, pairs, jobs[0].coherent, platform_spec, jobs=jobs,
                    serving=beside, taken=taken)


def _serving_job(scenario: Scenario, jobs: list[Scenario]) -> int | None:
    """The index of the job whose workload serves (kind: serving), or None; a second one is refused: a run serves
    one workload beside its training jobs (its replicas come from its XPUs)."""
    from hcsim.workload.serving import serving_spec_path

    serving = [i for i, job in enumerate(jobs) if serving_spec_path(job.workload, Path(job.base)) is not None]
    if len(serving) > 1:
        first, second = serving[:2]
        raise ConfigError(f"scenario {scenario.name!r}: jobs[{second}].workload: {jobs[second].workload!r} serves, "
                          f"and so does jobs[{first}]'s; a run takes one serving job beside its training jobs. Fix: "
                          f"one serving job with the XPUs of both (its replicas: xpus / (tp x pp))")
    return serving[0] if serving else None


def _check_jobs_memory(scenario: Scenario, graph: nx.Graph, jobs: list[Prepared]) -> dict[str, float]:
    """A memory several jobs' XPUs spill or offload to (a CPU's DRAM, a CXL pool) holds what all of them put
    there: each job's placement was checked alone (:func:`hcsim.workload.placement.check_shared_memory`). What
    they put in each such memory (node -> bytes)."""
    from hcsim.errors import WorkloadError
    from hcsim.workload.placement import check_shared_memory

    nodes = graph.nodes
    inventory: dict = {}
    offload: dict = {}
    for job in jobs:
        if job.placement is not None:
            inventory.update(job.placement.inventory)
            if job.scenario.hybrid:
                offload.update(offload_memory(graph, job.xpus, job.scenario, job.coherent))
    extended = {x: (nodes[x]["extended_memory"], nodes[nodes[x]["extended_memory"]]["capacity"]) for x in inventory
                if nodes[x]["extended_memory"]}
    try:
        return check_shared_memory(inventory, extended, offload or None)
    except WorkloadError as err:
        raise WorkloadError(f"scenario {scenario.name!r}: jobs: together, {err}") from None


def _prepare_workload(scenario: Scenario, platform_spec, graph: nx.Graph, xpus: list[str]):
    """The workload graph of `scenario` on `xpus` of the platform `graph`, checked and its memory placed:
    (workload, the XPUs it runs on, placement, coherent)."""
    from hcsim.config import resolve_spec
    from hcsim.limits import collector_paused
    from hcsim.workload import build_training_graph, load_workload_spec, place_memory, validate_workload
    from hcsim.workload.hybrid import build_hybrid_graph, place_hybrid_memory
    from hcsim.workload.placement import check_shared_memory
    from hcsim.workload.layout import ParallelLayout
    from hcsim.workload.sources import is_graph_source

    from hcsim.limits import check_run_cost

    base = Path(scenario.base)
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
        check_precision(scenario, workload_spec, graph, xpus)
        sizes = {"tp": scenario.tp, "pp": scenario.pp, "ep": scenario.ep, "cp": scenario.cp} \
            | ({"dp": scenario.dp} if scenario.dp else {})
        try:
            layout = ParallelLayout(xpus, sizes)
        except ConfigError as err:
            raise ConfigError(f"scenario {scenario.name!r}: {err}") from err

        def order(group):
            return rank_order(graph, group, scenario, xpus)

        hybrid = scenario.hybrid or workload_spec.inventory.needs_hybrid_graph
        layers = layer_split(scenario, workload_spec, layout, graph) if hybrid else None
        kernels = resolve_compute_model(scenario, platform_spec, workload_spec) == "roofline"
        parallelism = _parallelism(scenario, workload_spec, layout, layers=layers, megatron_comm=kernels) \
            if hybrid else None
        split = batch_split(scenario, workload_spec, layout, graph, parallelism)
        if parallelism and split:
            parallelism = _parallelism(scenario, workload_spec, layout, split, layers, megatron_comm=kernels)
        check_run_cost(workload_spec, scenario.xpus, scenario.iterations, f"scenario {scenario.name!r}",
                       parallelism.micro_batches if parallelism else 1, scenario.pp,
                       sum(c for c, _ in parallelism.replica_classes()) if parallelism else len(set(split or (1,))))
        with collector_paused():  # a graph of millions of live objects
            if parallelism:
                workload = build_hybrid_graph(workload_spec, parallelism, layout, order)
            else:
                workload = build_training_graph(workload_spec, layout, order,
                                                dict(zip(xpus, split)) if split else None)
    if from_graph:  # a graph from a file is checked; hcsim's builders keep the contract (tests check it)
        with collector_paused():
            validate_workload(workload, xpus)
    coherent = bool(graph.graph.get("coherent"))
    if not coherent and "coherent_ring" in set(map(methodcaller("get", "algorithm"), workload._node.values())):
        raise ConfigError(f"scenario {scenario.name!r}: collective: coherent_ring keeps the reduced shards in "
                          f"coherent memory, which this platform (coherent: false) does not have; fix: set "
                          f"coherent: true, or collective: ring")
    check_shared_regions(scenario, graph, workload)
    nodes = graph.nodes
    capacities = {x: nodes[nodes[x]["local_memory"]]["capacity"] for x in xpus}
    extended = {x: nodes[nodes[x]["extended_memory"]]["capacity"] if nodes[x]["extended_memory"] else 0.0
                for x in xpus}
    offload = None
    if from_graph:
        placement = None
    elif parallelism:
        offload = offload_memory(graph, xpus, scenario, coherent)
        placement = place_hybrid_memory(workload, workload_spec, parallelism, layout, capacities, extended, offload)
    else:
        placement = place_memory(workload, capacities, workload_spec, extended,
                                 dict(zip(xpus, split)) if split else None)
    if placement is not None:
        check_local_memory(scenario, platform_spec, graph, placement, layout,
                           workload_spec.kernels if not from_graph else "megatron")
        check_shared_memory(placement.inventory, {x: (nodes[x]["extended_memory"], extended[x]) for x in xpus
                                                  if nodes[x]["extended_memory"]},
                            offload if parallelism else None)
    return workload, xpus, placement, coherent


def check_precision(scenario: Scenario, spec, platform: nx.Graph, xpus: list[str]) -> None:
    """ConfigError naming the key unless every device type of the run has a peak at the workload's precision
    (FP8 on an A100): said before the graph is built, not when the engine first times a kernel."""
    from hcsim.platform.devices import peak_flops

    seen = set()
    for x in xpus:
        node = platform.nodes[x]
        if node.get("device") in seen:
            continue
        seen.add(node.get("device"))
        try:
            peak_flops(node, spec.precision)
        except ConfigError as err:
            given = "" if scenario.precision is not None else f" (the workload's, {spec.name})"
            raise ConfigError(f"scenario {scenario.name!r}: precision: {spec.precision}{given}: {err}") from None


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


def check_shared_regions(scenario: Scenario, platform, workload) -> None:
    """Refuse a collective through one memory device (pooled_memory) on a group whose XPUs share none, naming the
    scenario's key: the engine would refuse it too, without saying where the algorithm was chosen."""
    from hcsim.engine.collectives import get_algorithm, shared_region

    seen: dict[tuple, tuple] = {}  # (algorithm, groups' id) -> the groups (alive: ids stay unique)
    for data in workload._node.values():  # networkx's own dict: no view per vertex
        name = data.get("algorithm")
        if data["kind"] != "comm" or not name or (name, id(data["groups"])) in seen:
            continue
        seen[name, id(data["groups"])] = data["groups"]
        if not get_algorithm(data["collective"], name, 2, 0.0).region:
            continue
        for group in data["groups"]:
            try:
                shared_region(platform, group, name)
            except ConfigError as err:
                key = "collective" if scenario.collective == name else "workload's gradients.algorithm"
                raise ConfigError(f"scenario {scenario.name!r}: {key}: {err}") from None


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


def check_local_memory(scenario: Scenario, platform_spec, platform: nx.Graph, placement, layout,
                       kernels: str = "megatron") -> None:
    """Stop a run that would spill on a platform that does not spill, as the training framework would.

    The rule is :func:`hcsim.workload.placement.out_of_memory` (``hcsim plan``'s too), applied to each XPU's
    inventory: its training state less what offload keeps away, plus what the training process holds beside
    it (:func:`hcsim.workload.memory.framework_reserve` for the `kernels` inventory: the CUDA context,
    workspaces, the allocator's reserve), must fit its local memory. Where :func:`spill_policy` says
    ``allow``, the rest spills to extended memory instead (the paper's model, which reserves nothing).

    Raises
    ------
    ConfigError
        naming the first pipeline stage that does not fit, its bytes per XPU by kind, the device and its
        capacity, and the remedies.
    """
    from hcsim.workload.memory import framework_reserve
    from hcsim.workload.placement import out_of_memory

    policy = spill_policy(scenario, platform_spec)
    if policy == "allow":
        return
    nodes = platform.nodes

    def need(held) -> float:
        return held.need + framework_reserve(held.activations, kernels)

    worst: dict[int, tuple[float, str]] = {}  # stage -> (bytes beyond local memory, its XPU) of its worst XPU
    for x, held in placement.inventory.items():
        capacity = nodes[nodes[x]["local_memory"]]["capacity"]
        stage = layout.stage(x)
        if out_of_memory(stage, need(held), capacity, nodes[x]["device"]) and \
                need(held) - capacity > worst.get(stage, (0.0, ""))[0]:
            worst[stage] = (need(held) - capacity, x)
    if not worst:
        return
    stage = min(worst)
    x = worst[stage][1]
    held = placement.inventory[x]
    parts = ", ".join(f"{kind} {value / 1e9:.1f} GB" for kind, value in (
        ("parameters", held.parameters), ("gradients", held.gradients), ("optimizer", held.optimizer),
        ("activations", held.activations), ("CUDA context, workspaces and allocator reserve",
                                            framework_reserve(held.activations, kernels))) if value) \
        + (f", less {held.offloaded / 1e9:.1f} GB offloaded" if held.offloaded else "")
    others = sorted(worst)[1:]
    also = f"; stage{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} neither" if others else ""
    why = ("spill: error" if scenario.spill else
           f"platform {scenario.platform!r} is a DGX cluster, whose frameworks (Megatron-LM, PyTorch) have no "
           f"spill to host memory")
    raise ConfigError(
        f"scenario {scenario.name!r}: out of memory: "
        f"{out_of_memory(stage, need(held), nodes[nodes[x]['local_memory']]['capacity'], nodes[x]['device'])} "
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
        memory is a CXL Type 3 expander; ``coherent`` one whose XPUs read their extended memory in place: a CXL
        Type 3 expander, or a superchip's CPU memory over NVLink-C2C.
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
            kind = coherent_memory(platform, x, memory) if coherent and memory is not None else None
            if kind is None or (scenario.offload == "cxl" and kind != "cxl_type3"):
                given = 'no extended memory' if memory is None else f"{nodes[memory].get('role')} memory"
                hint = " (offload: coherent reads it in place over NVLink-C2C)" if kind == "c2c" else ""
                raise ConfigError(f"{where}: needs a coherent platform whose XPUs have CXL Type 3 memory"
                                  f"{'' if scenario.offload == 'cxl' else ' or a superchip CPU memory'}; "
                                  f"{scenario.platform!r} (coherent: {coherent}) gives XPU {x!r} {given}{hint}; "
                                  f"valid: coherent: true on paper-cxl, cxl-pool, gh200 or gb200-nvl72, or "
                                  f"offload: cpu")
        found[x] = (memory, nodes[memory]["capacity"])
    return found


def coherent_memory(platform: nx.Graph, xpu: str, memory: str) -> str | None:
    """How `xpu` reads its extended memory `memory` in place: "cxl_type3" (a CXL expander), "c2c" (its superchip
    CPU's memory, the CPU joined to the XPU by NVLink-C2C), or None (not coherently)."""
    data = platform.nodes[memory]
    if data.get("role") == "cxl_type3":
        return "cxl_type3"
    owner = data.get("owner")
    if owner is not None and platform.has_edge(xpu, owner) and platform.edges[xpu, owner].get("kind") == "c2c":
        return "c2c"
    return None


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
                 layers: tuple[int, ...] | None = None, megatron_comm: bool = False):
    """The scenario's hybrid parallelism over `layout`, defaults filled from the workload spec; `split`: the
    resolved batch_split (micro-batches per DP replica); `layers`: the resolved layer_split; `megatron_comm`:
    Megatron-LM's communication (the kernel model's runs, :func:`resolve_compute_model`)."""
    from hcsim.workload.hybrid import Parallelism

    try:
        par = Parallelism.of_layout(spec, layout, micro_batch=scenario.micro_batch,
                                     global_batch=scenario.global_batch, recompute=scenario.recompute,
                                     schedule=scenario.schedule, virtual_stages=scenario.virtual_stages,
                                     sequence_parallel=scenario.sequence_parallel, layer_split=layers,
                                     zero=scenario.zero, offload=scenario.offload,
                                     offload_state=scenario.offload_state, moe_skew=scenario.moe_skew,
                                     batch_split=split, megatron_comm=megatron_comm,
                                     cp_algorithm=scenario.cp_algorithm)
    except ConfigError as err:
        raise ConfigError(f"scenario {scenario.name!r}: {err}") from err
    if spec.tp_comm_overlap and par.tp > 1 and not par.sequence_parallel:
        say_once(log, f"scenario {scenario.name!r}: training.tp_comm_overlap: Transformer Engine overlaps the TP "
                      f"collectives of sequence-parallel layers only (Megatron-LM's --tp-comm-overlap needs "
                      f"--sequence-parallel), so it has no effect here; set sequence_parallel: true to use it")
    return par


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


def resolve_compute_model(scenario: Scenario, platform_spec=None, workload_spec=None) -> str:
    """The compute model a run of `scenario` uses: ``peak`` or ``roofline`` (the kernel model).

    ``compute_model`` when the scenario names it. Left out (None, the default), the kernel model wherever it
    can time the run: the workload is a workload spec whose graph lists kernels (the hybrid-parallel graph:
    tp, pp, cp, ep, a batch, recomputation, ZeRO or offload, or a framework's kernel inventory,
    ``training.kernels``) and every device the platform names has kernel factors (``compute_factors``, over
    ``platforms/compute-model.yaml``: measured, calibrated, or literature ones, with the warning of
    :func:`compute_model`); else the paper's peak model (the paper's data-parallel graph, a graph file or a
    trace, a device without factors). `platform_spec` and `workload_spec`: the checked specs when the caller
    has them (read from the scenario otherwise); a spec that cannot be read leaves peak.

    >>> resolve_compute_model(Scenario(xpus=8))  # the paper's data-parallel graph
    'peak'
    >>> resolve_compute_model(Scenario(platform="dgx-h100", workload="llama3-8b", xpus=8, tp=8))
    'roofline'
    >>> resolve_compute_model(Scenario(platform="dgx-h100", workload="llama3-8b", xpus=8, tp=8, devices=["MI300X"]))
    'peak'
    """
    if scenario.compute_model is not None:
        return scenario.compute_model
    from hcsim.config import resolve_spec
    from hcsim.engine.compute_model import load_compute_model
    from hcsim.errors import HcsimError
    from hcsim.platform import load_platform_spec
    from hcsim.workload import load_workload_spec
    from hcsim.workload.sources import is_graph_source

    if is_graph_source(scenario.workload):
        return "peak"
    base = Path(scenario.base)
    try:
        if workload_spec is None:
            workload_spec = load_workload_spec(resolve_spec(scenario.workload, "workloads", base),
                                               scenario.workload_settings())
        if not (scenario.hybrid or workload_spec.inventory.needs_hybrid_graph):
            return "peak"
        if platform_spec is None:
            platform_spec = load_platform_spec(resolve_spec(scenario.platform, "platforms", base),
                                               scenario.platform_settings())
        known = load_compute_model(compute_factors_path(scenario)).devices
    except HcsimError:
        return "peak"
    devices = platform_devices(platform_spec)
    return "roofline" if devices and devices <= known.keys() else "peak"


def platform_devices(spec) -> set[str]:
    """The device names a checked platform spec puts on its XPUs: its ``devices`` list, or the devices of an
    explicit topology's XPU nodes."""
    if spec.devices:
        return set(spec.devices)
    nodes = spec.topology.nodes if spec.topology is not None else ()
    return {node.attributes["device"] for node in nodes if node.attributes.get("device")}


def compute_factors_path(scenario: Scenario) -> Path | None:
    """The kernel factors file `scenario` names (``compute_factors``, resolved beside the scenario or among the
    built-in platforms), or None for the built-in platforms/compute-model.yaml."""
    from hcsim.config import resolve_spec

    factors = scenario.compute_factors
    return resolve_spec(factors, "platforms", Path(scenario.base)) if factors else None


def compute_model(scenario: Scenario, workload: nx.DiGraph, platform: nx.Graph | None = None):
    """The scenario's roofline ComputeModel, or None where the run uses the peak model
    (:func:`resolve_compute_model`).

    A workload of PyTorch's kernels (training.kernels: pytorch-eager or torch-compile) is always timed by its
    kernels: the peak model knows nothing of them. Raises ConfigError when roofline is asked of a graph without
    op-level costs, or when a device of `platform` has no factors; warns, naming them, when its devices'
    factors are literature values."""
    from hcsim.engine.compute_model import load_compute_model
    from hcsim.platform.devices import builtin_catalog
    from hcsim.workload.ops import INVENTORIES

    path = compute_factors_path(scenario)
    run_devices = {d for _, d in (platform.nodes(data="device") if platform is not None else ()) if d}
    known = set(builtin_catalog()) | run_devices  # the devices a factors file may name
    if resolve_compute_model(scenario) == "peak" and not INVENTORIES[workload.graph.get("kernels", "megatron")].needs_kernel_model:
        if path is not None:  # checked all the same (a bad file is an error), and said to go unread
            load_compute_model(path, known)
            log.warning("compute_factors: %s is not read: this run uses the peak model (compute_model: %s), which "
                        "times FLOPs at peak FLOP/s and reads no kernel factors; set compute_model: roofline to time "
                        "its kernels with them, or leave compute_factors out", path,
                        scenario.compute_model or "peak, as resolved for this run")
        return None
    if not any(ops for _, ops in workload.nodes(data="ops")):
        raise ConfigError(f"scenario {scenario.name!r}: compute_model: roofline times the kernels (ops) of compute "
                          f"vertices, which only the hybrid-parallel graph has; fix: set tp, pp, micro_batch or "
                          f"global_batch, or compute_model: peak")
    model = load_compute_model(path, known)
    devices = sorted(run_devices)
    unmeasured = [model.device(d).name for d in devices if model.device(d).provenance == "literature"]
    if unmeasured:
        log.warning("compute_model: roofline: the kernel factors of %s are literature figures, not measured "
                    "(%s); measure the GPU with benchmarks/gpu_kernels.py and fit it with hcsim calibrate",
                    ", ".join(unmeasured), model.source)
    return model


def traced_xpus(prepared: Prepared) -> frozenset[str] | None:
    """The XPUs scenario.trace_xpus asks to trace (None: none).

    Raises
    ------
    ConfigError
        if a named XPU is not one of the run's.
    """
    wanted = prepared.scenario.trace_xpus
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
