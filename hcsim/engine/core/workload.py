"""A workload graph in the C++ core's input: flat arrays built from :class:`hcsim.engine.rules.WorkloadRules`.

The core (``executor.cpp``) applies the executor's run rules (paper Fig. 5) to plain S4U activities: when a
unit starts, when it completes, what a completion releases, a collective's steps and flow phases, the
per-XPU clocks. What follows from the graph and the platform alone (vertex order, required counts, which
units a completion counts for, collective algorithms, fidelities and flow phases, analytic closed forms,
compute costs and memory forms, wire bytes and route latencies) comes from the rules, once, and is laid out
here as ``hcsim/engine/core/workload.hpp`` names each array (:data:`ARRAY_TYPES`; the layout test checks
the three agree). The core returns iteration ends and per-XPU clocks; link bytes follow from the arrays
(every unit runs every iteration).

What the core runs: compute vertices at the peak model (FLOPs / FLOP/s, or a measured duration) or the
kernel model (kernel times, wire bytes and call latencies) beside their memory reads in the forms of paper
Fig. 3 (local, ``local_access`` analytic or simulated; spilled and read in place on a coherent system;
spilled and copied first without coherence); offload (CPU steps on the host CPU beside their reads, moves
between an XPU and its offload memory); collectives at the step and flow models and local collectives
analytic; the graph contract v2 (waits xpu, group, all; skip_first_iteration edges); per-XPU clocks; traces
(a TraceRecorder filled from the core's events, in the order they ended).
"""

from __future__ import annotations

import time
from array import array
from collections import defaultdict

import networkx as nx

from hcsim.engine.options import COMM_KINDS
from hcsim.errors import ConfigError, HcsimError, SimulationError
from hcsim.limits import collector_paused

__all__ = ["build_arrays", "run_workload"]

START, RECOMPUTE, CPU_STEP, MOVE = 1, 2, 4, 8
FLOW, ANALYTIC, STEP = 0, 1, 2


ARRAY_TYPES = (
    ("v_kind", "B"), ("v_flags", "B"), ("v_comm_kind", "B"), ("v_units", "q"), ("v_succs", "q"), ("v_job", "i"),
    ("j_iterations", "i"), ("v_xrow", "q"),
    ("v_rrow", "q"), ("v_crow", "q"), ("v_grow", "q"), ("v_group0", "q"),
    ("u_xpu", "i"), ("u_required", "q"), ("u_flops", "d"), ("u_read", "d"), ("u_read_src", "i"),
    ("u_compute_s", "d"), ("u_copy", "d"), ("u_copy_src", "i"), ("u_peer", "i"), ("u_group", "i"), ("e_succ", "i"),
    ("e_skip", "B"), ("e_same_rank", "B"), ("e_bucket_of", "q"), ("bucket_of", "i"), ("b_units", "q"),
    ("b_unit", "i"), ("g_first", "q"), ("g_size", "i"), ("g_mode", "B"), ("g_seconds", "d"), ("g_plan", "i"),
    ("g_call_latency", "d"), ("g_region", "i"), ("p_phases", "q"), ("ph_lane", "i"), ("ph_steps", "i"), ("ph_transfers", "q"),
    ("t_src", "i"), ("t_dst", "i"), ("t_bytes", "d"), ("t_latency", "d"), ("t_feeds", "q"), ("feed", "i"),
    ("q_lanes", "i"), ("q_sequences", "q"), ("rl_steps", "q"), ("st_sends", "q"), ("st_recvs", "i"),
    ("sd_dst", "i"), ("sd_bytes", "d"))
_UNIT_ARRAYS = ("u_flops", "u_read", "u_read_src", "u_compute_s", "u_copy", "u_copy_src", "u_peer")
_GROUP_ARRAYS = ("g_size", "g_mode", "g_seconds", "g_plan", "g_call_latency", "g_region")


def build_arrays(rules, hosts: dict[str, int]) -> dict[str, array]:
    """The flat arrays of workload.hpp for `rules`'s vertices; `hosts` maps host names to numbers (the XPUs
    first, in clock order; memory hosts are added as needed).

    Alike vertices (one per layer and micro-batch: the same XPUs, sizes and groups) have the same units: the
    u_ arrays are tables of rows, each distinct set of units' rows made once (`cache`), and each vertex names
    its first row in them (v_xrow, v_rrow, v_crow, v_grow)."""
    a = {name: array(code) for name, code in ARRAY_TYPES}
    for name in ("v_units", "v_succs", "b_units", "p_phases", "ph_transfers", "t_feeds", "q_sequences", "rl_steps",
                 "st_sends"):
        a[name].append(0)
    analytic_access = rules.options.local_access == "analytic"
    plans: dict[tuple, int] = {}
    step_plans: dict[tuple, tuple[int, object]] = {}
    xpu_cache: dict = {}  # alike compute vertices -> their compute row
    edge_buckets: dict[tuple, int] = {}
    cache: dict = {}  # ("xpu", xpus id) / ("required", ...) / ("groups", algorithms id) -> a row, keyed objects

    v_kind, v_flags, v_comm_kind, v_units, v_succs = (a[name] for name in ("v_kind", "v_flags", "v_comm_kind",
                                                                           "v_units", "v_succs"))
    a["j_iterations"].extend(job_iterations(rules.workload, rules.options.iterations))
    v_job = a["v_job"]
    v_xrow, v_rrow, v_crow, v_grow, v_group0 = (a[name] for name in ("v_xrow", "v_rrow", "v_crow", "v_grow",
                                                                     "v_group0"))
    u_xpu, u_required = a["u_xpu"], a["u_required"]
    e_succ, e_skip, e_same_rank, e_bucket_of = a["e_succ"], a["e_skip"], a["e_same_rank"], a["e_bucket_of"]
    for vertex in rules.vertices:
        data, xpus = vertex.data, vertex.xpus
        n = len(xpus)
        compute = vertex.kind == "compute"
        v_kind.append(0 if compute else 1)
        v_flags.append((START if data.get("start") else 0) | (RECOMPUTE if vertex.recompute else 0)
                       | (CPU_STEP if compute and data.get("host") == "cpu" else 0)
                       | (MOVE if compute and data.get("move") else 0))
        v_comm_kind.append(COMM_KINDS.index(vertex.comm_kind))
        v_job.append(data.get("job", 0))
        v_units.append(vertex.offset + n)
        key = ("xpu", id(xpus))
        if key not in cache:
            cache[key] = (len(u_xpu), xpus)  # keep xpus alive: ids stay unique
            u_xpu.extend([hosts[xpu] for xpu in xpus])
        v_xrow.append(cache[key][0])
        if vertex.required is not None:  # every unit needs the same (WorkloadRules.uniform_requirement)
            key = ("required", vertex.required, n)
            if key not in cache:
                cache[key] = len(u_required) // 2
                u_required.extend(vertex.required * n)
            v_rrow.append(cache[key])
        else:
            v_rrow.append(_requirements(rules, vertex, cache, u_required))
        if compute:
            v_crow.append(_compute_units(a, rules, vertex, hosts, analytic_access, xpu_cache))
            v_grow.append(-1)
            v_group0.append(-1)
        else:
            v_crow.append(-1)
            v_group0.append(len(a["g_first"]))
            v_grow.append(_groups(a, rules, vertex, plans, step_plans, cache, hosts))
        for edge in vertex.succs:
            e_succ.append(edge.vertex.index)
            e_skip.append(edge.skip)
            e_same_rank.append(edge.same_rank)
            e_bucket_of.append(-1 if edge.same_rank else _buckets(a, rules, vertex, edge, edge_buckets))
        v_succs.append(len(e_succ))
    if not a["bucket_of"]:
        a["bucket_of"].append(-1)
    return a


def job_iterations(workload: nx.DiGraph, iterations: int) -> list[int]:
    """Each job's iterations: the workload graph's ``jobs`` (several jobs on one fabric, each vertex's ``job``
    its index in it), else one job of `iterations`."""
    jobs = workload.graph.get("jobs")
    return [job["iterations"] for job in jobs] if jobs else [iterations]


def _requirements(rules, vertex, cache, table) -> int:
    """The row in `table` (u_required) where rules.required_count for each unit of `vertex` and runs 1 and 2 (run
    1, later runs per unit) begins, added on first use; shared by vertices whose XPUs, groups and predecessors'
    (skip, wait, XPUs, groups) are the same: it follows from them."""
    key = ("required", vertex.kind, id(vertex.xpus), id(getattr(vertex, "groups", None)),
           tuple((edge.skip, edge.wait, id(edge.vertex.xpus), id(getattr(edge.vertex, "groups", None)))
                 for edge in vertex.preds))
    if key not in cache:
        # keep the keyed objects alive: ids stay unique
        cache[key] = (len(table) // 2, vertex.xpus, getattr(vertex, "groups", None),
                      [(edge.vertex.xpus, getattr(edge.vertex, "groups", None)) for edge in vertex.preds])
        for rank in range(len(vertex.xpus)):
            table.extend((rules.required_count(vertex, rank, 1), rules.required_count(vertex, rank, 2)))
    return cache[key][0]


def _compute_units(a, rules, vertex, hosts, analytic_access, xpu_cache) -> int:
    """The memory form's activities per unit: a copy first (spilled data without coherence), then the
    execution and the read side by side, or the longer of the two alone (local data, local_access analytic);
    the vertex's first row in the compute columns, added on first use (alike vertices share them)."""
    from hcsim.engine.rules import memory_form

    data, nodes = vertex.data, rules.nodes
    size = data["memory_bytes"]
    spilled = data.get("spilled_xpus") or ()
    duration = data.get("duration")
    model = rules.options.compute_model
    ops = data.get("ops")
    cpu_step, move = data.get("host") == "cpu", data.get("move")
    key = (id(vertex.xpus), id(spilled), data["flops"], size, duration, id(ops) if model is not None else None,
           cpu_step, move, data.get("offload"))
    if key in xpu_cache:
        return xpu_cache[key][0]

    def host(name):
        if name not in hosts:
            hosts[name] = len(hosts)
        return hosts[name]

    flops_out, read_out, src_out, time_out, copy_out, copy_src_out, peer_out = [], [], [], [], [], [], []
    for xpu in vertex.xpus:
        local = nodes[xpu]["local_memory"]
        flops, compute_time = rules.compute_cost(xpu, data)  # the rules's rule, a straggler's slowdown in it
        if cpu_step or move or xpu in spilled:
            copy_from, memory = memory_form(nodes, data, xpu, rules.options.coherent)
        else:
            copy_from, memory = None, local
        if cpu_step or move:  # offload: a CPU step beside its read, or a move
            cpu = nodes[memory]["owner"] if cpu_step else None
            flops_out.append(flops)
            read_out.append(size if cpu_step and size > 0 else 0.0)
            src_out.append(host(memory) if cpu_step else 0)
            time_out.append(compute_time)
            copy_out.append(size if move else 0.0)
            copy_src_out.append(host(copy_from) if move else 0)
            peer_out.append(host(cpu) if cpu_step else host(memory))
            continue
        read = size if size > 0 else 0.0
        run_flops = flops if flops > 0 else 0.0
        if memory == local and analytic_access and flops > 0 and size > 0:  # one activity, the longer of the two
            if compute_time >= rules.access_time(local, xpu, size):
                read = 0.0
            else:
                run_flops = 0.0
        copy = size if copy_from is not None and size > 0 else 0.0
        flops_out.append(run_flops)
        read_out.append(read)
        src_out.append(host(memory) if read > 0 else 0)
        time_out.append(compute_time)
        copy_out.append(copy)
        copy_src_out.append(host(copy_from) if copy > 0 else 0)
        peer_out.append(0)
    row = len(a["u_flops"])
    xpu_cache[key] = (row, vertex.xpus, spilled, ops)  # keep the keyed objects alive: ids stay unique
    for name, values in zip(_UNIT_ARRAYS, (flops_out, read_out, src_out, time_out, copy_out, copy_src_out,
                                           peer_out)):
        a[name].extend(values)
    return row


def _groups(a, rules, vertex, plans, step_plans, cache, hosts) -> int:
    """A collective vertex's groups: first unit, size, the host of its region's memory device (collectives
    through one memory device; numbered in `hosts` on first use) and the flow phases (a plan shared by alike
    groups), the step schedule (shared by groups with the same algorithm) or the analytic closed form; returns its row
    in u_group (each unit's group after the vertex's first). Vertices that share their algorithms
    (WorkloadRules._prepare_collective: the same groups, collective and size) share these but for the numbers of
    their units and groups."""
    key = ("groups", id(vertex.algorithms))
    if key not in cache:
        rows = {name: array(a[name].typecode) for name in _GROUP_ARRAYS}
        for g, group in enumerate(vertex.groups):
            algorithm, fidelity, phases = vertex.algorithms[g]
            rows["g_size"].append(len(group))
            rows["g_call_latency"].append(rules.call_latency(algorithm, group))
            ends = rules.endpoints(algorithm, group)
            rows["g_region"].append(hosts.setdefault(ends[-1], len(hosts)) if algorithm.region else -1)
            if fidelity == "analytic":
                mode, seconds, plan = ANALYTIC, phases[1], -1
            elif fidelity == "step":
                mode, seconds, plan = STEP, 0.0, _step_plan(a, rules, algorithm, group, step_plans)
            else:
                mode, seconds, plan = FLOW, 0.0, _flow_plan(a, rules, phases, ends, plans,
                                                            rules.protocol(algorithm, group))
            rows["g_mode"].append(mode)
            rows["g_seconds"].append(seconds)
            rows["g_plan"].append(plan)
        cache[key] = (rows, len(a["u_group"]), vertex.algorithms)  # keep the keyed list alive: ids stay unique
        a["u_group"].extend(vertex.group_of)
    rows, row, _ = cache[key]
    offset = vertex.offset
    a["g_first"].extend([offset + first for first in vertex.group_offsets])
    for name in _GROUP_ARRAYS:
        a[name].extend(rows[name])
    return row


def _flow_plan(a, rules, phases, group, plans, protocol) -> int:
    """The number of a group's flow plan (its phases: lanes, steps, transfers with wire bytes at the
    collective's NCCL `protocol`, route latency and feeds) in the plan arrays, added on first use; alike groups
    share it. `group`: the hosts of the plan's endpoints (:meth:`WorkloadRules.endpoints`)."""
    key = (id(phases), group)
    if key not in plans:
        plans[key] = len(plans)
        for phase in phases:
            a["ph_lane"].append(phase.lane)
            a["ph_steps"].append(phase.steps)
            for i, ((s, d), size) in enumerate(phase.transfers):
                src, dst = group[s], group[d]
                a["t_src"].append(s)
                a["t_dst"].append(d)
                a["t_bytes"].append(rules.wire_bytes(src, dst, size, protocol))
                a["t_latency"].append(rules.latency(src, dst))
                a["feed"].extend(phase.feeds[i] if phase.feeds else ())
                a["t_feeds"].append(len(a["feed"]))
            a["ph_transfers"].append(len(a["t_src"]))
        a["p_phases"].append(len(a["ph_lane"]))
    return plans[key]


def _step_plan(a, rules, algorithm, group, step_plans) -> int:
    """The number of `algorithm`'s step schedule in the step-plan arrays, added on first use: per endpoint (rank,
    then a region's memory device) and lane its steps, each with its sends (destination endpoint, wire bytes) and
    its receive count. Wire bytes depend on the group's links in the roofline model: a plan per group there, per
    algorithm at the peak model."""
    key = (id(algorithm), group if rules.options.compute_model is not None else None)
    if key in step_plans:
        return step_plans[key][0]
    number = len(a["q_lanes"])
    step_plans[key] = (number, algorithm)  # keep it alive: ids stay unique
    protocol = rules.protocol(algorithm, group)
    ends = rules.endpoints(algorithm, group)
    a["q_lanes"].append(algorithm.lanes)
    for rank in range(algorithm.endpoints):
        for lane in range(algorithm.lanes):
            for index in range(algorithm.lane_steps(rank, lane)):
                step = algorithm.lane_step(rank, index, lane)
                for dst, size in step.sends:
                    a["sd_dst"].append(dst)
                    a["sd_bytes"].append(rules.wire_bytes(ends[rank], ends[dst], size, protocol))
                a["st_sends"].append(len(a["sd_dst"]))
                a["st_recvs"].append(len(step.recvs))
            a["rl_steps"].append(len(a["st_recvs"]))
    a["q_sequences"].append(len(a["rl_steps"]) - 1)
    return number


def _buckets(a, rules, pred, edge, cache) -> int:
    """Where the edge's map from `pred`'s units to buckets of successor ranks begins in bucket_of: the units a
    completion of each unit of `pred` counts for (rules.waiting_units), shared by alike edges."""
    succ = edge.vertex
    key = (id(pred.xpus), id(succ.xpus), edge.wait, id(getattr(pred, "groups", None)),
           id(getattr(succ, "groups", None)))
    if key in cache:
        return cache[key][0]
    start = len(a["bucket_of"])
    seen: dict[tuple, int] = {}
    for xpu in pred.xpus:
        units = tuple(rules.waiting_units(edge, pred, xpu))
        if not units:
            a["bucket_of"].append(-1)
            continue
        if units not in seen:
            seen[units] = len(a["b_units"]) - 1
            a["b_unit"].extend(units)
            a["b_units"].append(len(a["b_unit"]))
        a["bucket_of"].append(seen[units])
    cache[key] = (start, pred.xpus, succ.xpus)  # keep the keyed objects alive: ids stay unique
    return start


def pair_bytes(rules) -> dict[tuple[str, str], float]:
    """Bytes per (src, dst) host pair over the run: every unit runs every iteration, so they follow from the
    graph (the rules counts them as they happen: the same sums, added in another order).

    Alike vertices add the same (pair, bytes) list: each distinct one is made once. When every amount is a whole
    number of bytes and every sum stays below 2**53, each float sum is exact in any order, so the sums are
    made in integers from how often each list is added; otherwise they are added one by one in vertex order."""
    runs = job_iterations(rules.workload, rules.options.iterations)  # each vertex runs its job's iterations
    lists: dict[tuple, list] = {}  # key -> [(pair, bytes), ...], then a use count and the keyed objects
    used = []  # each vertex's list, in vertex order
    for vertex in rules.vertices:
        key = _traffic_key(vertex)
        if key is None:
            continue
        iterations = runs[vertex.data.get("job", 0)]
        key += (iterations,)
        entry = lists.get(key)
        if entry is None:
            entry = lists[key] = [_traffic(rules, vertex, iterations), 0, vertex.xpus, vertex.data]
        entry[1] += 1
        used.append(entry[0])
    totals: dict[tuple[str, str], int] = {}
    exact = all(float(size).is_integer() for entry in lists.values() for _, size in entry[0])
    if exact:
        for additions, count, *_ in lists.values():  # in first use: the order pairs first appear
            for pair, size in additions:
                totals[pair] = totals.get(pair, 0) + count * int(size)
        exact = all(total < 2**53 for total in totals.values())
    if exact:
        return {pair: float(total) for pair, total in totals.items()}
    pairs: dict[tuple[str, str], float] = defaultdict(float)
    for additions in used:
        for pair, size in additions:
            pairs[pair] += size
    return pairs


def _traffic_key(vertex) -> tuple | None:
    """What a vertex's traffic (_traffic) follows from; None: it moves nothing."""
    data = vertex.data
    if vertex.kind == "compute":
        size = data["memory_bytes"]
        if not size > 0:
            return None
        spilled = data.get("spilled_xpus") or ()
        return ("compute", id(vertex.xpus), id(spilled), size, data.get("host"), data.get("move"),
                data.get("offload"))
    return ("comm", id(vertex.groups), id(vertex.algorithms))


def _traffic(rules, vertex, iterations) -> list[tuple[tuple[str, str], float]]:
    """(pair, bytes over the run) for each transfer of one vertex run per iteration, in the rules's order."""
    from hcsim.engine.rules import form_transfers, memory_form

    nodes, data, out = rules.nodes, vertex.data, []
    if vertex.kind == "compute":
        size = data["memory_bytes"]
        spilled = data.get("spilled_xpus") or ()
        offload = data.get("host") == "cpu" or data.get("move")
        for xpu in vertex.xpus:
            if not offload and xpu not in spilled:  # local: one read from its HBM (form_transfers)
                out.append(((nodes[xpu]["local_memory"], xpu), size * iterations))
                continue
            form = memory_form(nodes, data, xpu, rules.options.coherent)
            out += [(pair, size * iterations) for pair in form_transfers(nodes, data, xpu, form)]
        return out
    for group, (algorithm, fidelity, phases) in zip(vertex.groups, vertex.algorithms):
        group = rules.endpoints(algorithm, group)
        if fidelity == "step":
            out += [((group[s], group[d]), size * iterations) for (s, d), size in algorithm.flows().items()]
        elif fidelity == "analytic":
            out += [(pair, size * iterations) for pair, size in phases[0]]
        else:
            out += [((group[s], group[d]), size * iterations) for phase in phases for (s, d), size in phase.transfers]
    return out


def xpu_times(xpus: list[str], first: array, last: array, ends: list[float], fields: int,
              ended: dict[str, int] | None = None) -> dict[str, dict]:
    """Per XPU, seconds per measured iteration (RunResult.xpu_times) from the core's clock records (workload.hpp:
    Clock::record); `ended`: per XPU, the iterations its job ended (several jobs), else len(ends) for every XPU."""
    table = {}

    def parts_of(record):
        mask = int(record[7])
        return {"busy": record[0], "comm": record[1], "idle": record[2], "idle_peers": record[3],
                **{f"comm_{kind}": record[8 + k] for k, kind in enumerate(COMM_KINDS) if mask >> k & 1},
                "recompute": record[6]}

    for x, xpu in enumerate(xpus):
        count = len(ends) if ended is None else ended[xpu]
        measured = count - 1 if count > 1 else 1
        now = last[x * fields:(x + 1) * fields]
        busy, comm, idle, compute = now[0], now[1], now[2], now[4]
        parts = parts_of(now)
        if count > 1:
            before = first[x * fields:(x + 1) * fields]
            past = parts_of(before)
            busy, comm, idle, compute = busy - before[0], comm - before[1], idle - before[2], compute - before[4]
            parts = {key: value - past.get(key, 0.0) for key, value in parts.items()}
        compute = min(compute, busy)
        table[xpu] = {"compute_s": compute / measured, "memory_stall_s": (busy - compute) / measured,
                      "comm_s": comm / measured, "idle_s": idle / measured,
                      "idle_peers_s": parts["idle_peers"] / measured,
                      "idle_bubble_s": (idle - parts["idle_peers"]) / measured,
                      "recompute_s": min(parts["recompute"], compute) / measured,
                      **{f"{key}_s": value / measured for key, value in parts.items() if key.startswith("comm_")}}
    return table


def _fill_trace(trace, rules, counters: dict, hosts: list[str], arrays: dict) -> None:
    """The core's traced events into `trace`, in the order they ended, as the rules records them."""
    unit_vertex = []
    for vertex in rules.vertices:
        unit_vertex += [vertex] * len(vertex.xpus)
    for run, unit, start, end in counters["vertices"]:
        vertex = unit_vertex[unit]
        trace.vertices.append((run, vertex.xpus[unit - vertex.offset], vertex.name, vertex.kind, start, end))
    suffix = ("", ".read", ".copy", ".move")
    for run, src, dst, index, label, size, start, end in counters["transfers"]:
        trace.transfers.append((run, hosts[src], hosts[dst], rules.vertices[index].name + suffix[label], size,
                                start, end))


def run_workload(platform: nx.Graph, workload: nx.DiGraph, compiled, options, order=None, progress=None,
                 beside=None):
    """Run `workload` on `platform` compiled (a :class:`hcsim.platform.CompiledPlatform`) in the core, in this process (once: SimGrid allows
    one Engine per process); a :class:`RunResult`. `order`: the vertices as validate_workload returned them, if
    the caller has them (computed here otherwise). `progress`, if given, is called now and then with how many
    more vertex runs have completed (from the core, which holds no Python state meanwhile). `beside`, if given,
    runs serving steps in the same SimGrid run (:func:`hcsim.engine.api.run`); the result's ``beside_counters``
    are theirs.

    Raises
    ------
    ConfigError
        when the core is not built (it says what to install), or the arrays are malformed (a bug).
    SimulationError
        when some vertex never completes every iteration.
    """
    with collector_paused():  # the set-up's objects all stay alive; the core's run makes none
        return _run_workload(platform, workload, compiled, options, order, progress, beside)


def _tables(compiled, beside) -> dict:
    """The compiled platform's tables, with the speeds `beside` gives its hosts (``speeds``: name -> FLOP/s, the
    serving XPUs' peaks at the serving precision, which may not be the workload's)."""
    tables = compiled.tables
    if not beside or not beside.get("speeds"):
        return tables
    speeds = array("d", tables["speeds"])
    for i, host in enumerate(tables["hosts"]):
        speeds[i] = beside["speeds"].get(host, speeds[i])
    return {**tables, "speeds": speeds}


def _run_workload(platform, workload, compiled, options, order, progress, beside=None):
    from hcsim.engine import core
    from hcsim.engine.options import RunResult
    from hcsim.engine.rules import WorkloadRules, check_link_loads

    wall = time.perf_counter()
    if not core.available():
        raise ConfigError(f"the engine core is not built: {core.unavailable_reason()}")
    module = core.load()
    rules = WorkloadRules(platform, workload, compiled.routes, options, order=order)
    xpus = rules.xpus
    hosts = {x: i for i, x in enumerate(xpus)}
    arrays = build_arrays(rules, hosts)
    iterations, fields = options.iterations, module.clock_fields
    runs = arrays["j_iterations"]
    if max(runs) != iterations:
        raise ConfigError(f"engine core: the run's iterations ({iterations}) must be the most of its jobs' "
                          f"({', '.join(map(str, runs))})")
    ends = array("d", [0.0]) * iterations
    job_ends, job_ended = array("d", [0.0]) * (len(runs) * iterations), array("i", [0]) * len(runs)
    first, last = array("d", [0.0]) * (len(xpus) * fields), array("d", [0.0]) * (len(xpus) * fields)
    done = array("i", [0]) * rules.total_instances
    trace = traced_xpus = traced_runs = None
    if options.trace_xpus:
        from hcsim.engine.trace import TraceRecorder

        trace = TraceRecorder(options.trace_xpus, options.trace_iterations)
        traced_xpus = array("B", [x in trace.xpus for x in xpus])
        traced_runs = array("B", [0] + [options.trace_iterations is None or run in options.trace_iterations
                                        for run in range(1, iterations + 1)])
    try:
        steps = {k: v for k, v in beside.items() if k != "speeds"} if beside else None
        counters = module.run_workload(_tables(compiled, beside), list(hosts), arrays, iterations, len(xpus), ends,
                                       first, last, done, traced_xpus, traced_runs, progress, job_ends, job_ended,
                                       steps)
    except HcsimError:  # raised by a callback beside the run (a serving scheduler): as it is
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"engine core: {err}") from err
    except RuntimeError as err:
        raise SimulationError(f"engine core: {err}") from err
    if done.count(iterations) < len(done) and (  # a unit short of its job's last run (count: C speed)
            len(runs) == 1 or any(min(done[v.offset:v.offset + len(v.xpus)]) < runs[v.data.get("job", 0)]
                                  for v in rules.vertices)):
        unfinished = [v.name for v in rules.vertices
                      if any(d < runs[v.data.get("job", 0)] for d in done[v.offset:v.offset + len(v.xpus)])]
        raise SimulationError(f"the run stopped with vertices that never completed every iteration "
                              f"(a dependency that is never met): {', '.join(unfinished[:5])}")
    iteration_ends = list(ends[:counters["iterations_ended"]])
    per_job = [list(job_ends[j * iterations:j * iterations + job_ended[j]]) for j in range(len(runs))]
    ended = None
    if len(runs) > 1:  # each XPU's clocks measure its own job's iterations
        ended = {}
        for vertex in rules.vertices:
            count = job_ended[vertex.data.get("job", 0)]
            ended.update(dict.fromkeys(vertex.xpus, count))
    link_bytes: dict[tuple[str, str], float] = defaultdict(float)
    for pair, size in pair_bytes(rules).items():
        route = compiled.routes[pair]
        for link in zip(route, route[1:]):
            link_bytes[link] += size
    link_bytes = dict(link_bytes)
    check_link_loads(platform, link_bytes, iteration_ends[-1] if iteration_ends else 0.0)
    if trace is not None:
        _fill_trace(trace, rules, counters, list(hosts), arrays)
    busy = {x: [last[i * fields + 4], last[i * fields + 5], last[i * fields + 6]] for i, x in enumerate(xpus)}
    result = RunResult(iteration_ends=iteration_ends, activities=counters["activities"], busy=busy,
                       wall_time_s=time.perf_counter() - wall, trace=trace, collective_fidelity=rules.fidelity_used,
                       link_bytes=link_bytes, engine="core",
                       xpu_times=xpu_times(xpus, first, last, iteration_ends, fields, ended),
                       job_iteration_ends=per_job)
    result.core_counters = counters  # run_s, run_cpu_s, setup_s of the core (docs/engine-core.md's figures)
    result.beside_counters = counters.get("beside")  # the serving steps' beside the workload (activities)
    for vertex in rules.vertices:  # vertices and their edges refer to each other: freed now, not by the collector
        vertex.preds = vertex.succs = None
    return result
