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
from bisect import bisect_right
from itertools import accumulate, count
from operator import attrgetter, itemgetter
from collections import defaultdict

import networkx as nx

from hcsim.engine.options import COMM_KIND, COMM_KINDS
from hcsim.errors import ConfigError, HcsimError, SimulationError
from hcsim.limits import collector_paused
from hcsim.workload.graph import WAITS, extension, typed_array

__all__ = ["build_arrays", "run_workload"]

START, RECOMPUTE, CPU_STEP, MOVE = 1, 2, 4, 8
FLOW, ANALYTIC, STEP = 0, 1, 2


ARRAY_TYPES = (
    ("v_kind", "B"), ("v_flags", "B"), ("v_comm_kind", "B"), ("v_units", "q"), ("v_succs", "q"), ("v_job", "i"),
    ("j_iterations", "i"), ("v_xrow", "q"),
    ("v_rrow", "q"), ("v_crow", "q"), ("v_grow", "q"), ("v_group0", "q"), ("v_gtab", "q"),
    ("u_xpu", "i"), ("u_required", "q"), ("u_flops", "d"), ("u_read", "d"), ("u_read_src", "i"),
    ("u_compute_s", "d"), ("u_copy", "d"), ("u_copy_src", "i"), ("u_peer", "i"), ("u_group", "i"), ("e_succ", "i"),
    ("e_skip", "B"), ("e_same_rank", "B"), ("e_bucket_of", "q"), ("bucket_of", "i"), ("b_units", "q"),
    ("b_unit", "i"), ("g_offset", "q"), ("g_size", "i"), ("g_mode", "B"), ("g_seconds", "d"), ("g_plan", "i"),
    ("g_call_latency", "d"), ("g_region", "i"), ("p_phases", "q"), ("ph_lane", "i"), ("ph_steps", "i"), ("ph_transfers", "q"),
    ("t_src", "i"), ("t_dst", "i"), ("t_bytes", "d"), ("t_latency", "d"), ("t_feeds", "q"), ("feed", "i"),
    ("q_lanes", "i"), ("q_sequences", "q"), ("rl_steps", "q"), ("st_sends", "q"), ("st_recvs", "i"),
    ("sd_dst", "i"), ("sd_bytes", "d"))
_UNIT_ARRAYS = ("u_flops", "u_read", "u_read_src", "u_compute_s", "u_copy", "u_copy_src", "u_peer")
_WAITS = (*WAITS, None)  # an edge's wait by its code in VertexNumbering.flags (3: none of WAITS: validation refuses it)


class _Alike:
    """What alike vertices (one per layer and micro-batch: the same shape, flags, job and compute row) put in each
    vertex column, made once; their traffic's source for :func:`pair_bytes`."""

    __slots__ = ("kind", "flags", "comm_kind", "job", "xrow", "crow", "grow", "gtab", "group_count", "source")


def build_arrays(rules, hosts: dict[str, int]) -> tuple[dict[str, array], list]:
    """The flat arrays of workload.hpp for `rules`'s vertices, and what each vertex's traffic follows from (for
    :func:`pair_bytes`); `hosts` maps host names to numbers (the XPUs first, in clock order; memory hosts are
    added as needed).

    Alike vertices (one per layer and micro-batch: the same XPUs, sizes and groups) have the same units: the
    u_ arrays are tables of rows, each distinct set of units' rows made once, and each vertex names its first
    row in them (v_xrow, v_rrow, v_crow, v_grow). One pass reads each vertex's attributes from networkx's own
    dicts in the order they were added (where they lie in memory; the executor's order jumps around them: a
    million vertices read in that order took twice as long); the rows are made per alike vertices, in the
    executor's order of their first, and the columns follow from them at C speed. The edges are classed in C++
    from the graph's numbering (:func:`_edges`): their rows are made once per class."""
    a = {name: array(code) for name, code in ARRAY_TYPES}
    for name in ("v_units", "v_succs", "b_units", "p_phases", "ph_transfers", "t_feeds", "q_sequences", "rl_steps",
                 "st_sends"):
        a[name].append(0)
    a["j_iterations"].extend(job_iterations(rules.workload, rules.options.iterations))
    a["v_units"].extend(rules.offsets[1:])
    slots, samples = _read_vertices(rules)
    alike = _alike_rows(a, rules, slots, samples, hosts)
    row_of = list(map(alike.__getitem__, slots))  # each vertex's, in the executor's order
    # the columns at C speed (map; lists for fromlist, which sizes the array once): a million vertices, a few
    # hundred distinct rows
    for name in ("kind", "flags", "comm_kind", "job", "xrow", "crow", "grow", "gtab"):
        a[f"v_{name}"].fromlist(list(map(attrgetter(name), row_of)))
    counts = list(map(attrgetter("group_count"), row_of))
    a["v_group0"].fromlist([first if row.kind else -1 for first, row in zip(accumulate(counts, initial=0), row_of)])
    _edges(a, rules)
    return a, [row.source for row in row_of]


def _read_vertices(rules) -> tuple[list[int], dict[int, tuple]]:
    """One pass over the graph's vertices where they lie: each vertex's alike slot (in the executor's order) and a
    (Shape, attributes) per slot."""
    shapes, model = rules.shapes, rules.options.compute_model
    keys: dict[tuple, int] = {}
    samples: dict[int, tuple] = {}
    slots = [0] * len(shapes)
    for i, data in zip(rules.position, rules.workload._node.values()):
        shape = shapes[i]
        key = (shape, data.get("start"), data.get("phase"), data.get("job", 0))
        if shape.kind == "compute":  # and what its compute row follows from
            key += _compute_key(data, model)
        slot = keys.get(key)
        if slot is None:
            slot = keys[key] = len(keys)
            samples[slot] = (shape, data)  # keeps the keyed objects alive: ids stay unique
        slots[i] = slot
    return slots, samples


def _alike_rows(a, rules, slots, samples, hosts) -> dict[int, _Alike]:
    """Each slot's _Alike, made in the executor's order of the slots' first vertices: each table's rows (and
    each memory host's number) come in the order the vertices first need them."""
    analytic_access = rules.options.local_access == "analytic"
    comm_kind = {phase: COMM_KINDS.index(kind) for phase, kind in COMM_KIND.items()}
    other = COMM_KINDS.index("other")
    plans: dict[tuple, int] = {}
    step_plans: dict[tuple, tuple[int, object]] = {}
    xpu_cache: dict = {}  # alike compute vertices -> their compute row
    cache: dict = {}  # ("xpu", xpus id) / ("groups", algorithms id) -> a row, keyed objects
    alike: dict[int, _Alike] = {}
    for slot in dict.fromkeys(slots):  # in the order of their first vertices
        shape, data = samples[slot]
        row = alike[slot] = _Alike()
        compute = shape.kind == "compute"
        row.kind = not compute
        row.flags = ((START if data.get("start") else 0) | (RECOMPUTE if data.get("phase") == "recompute" else 0)
                     | (CPU_STEP if compute and data.get("host") == "cpu" else 0)
                     | (MOVE if compute and data.get("move") else 0))
        row.comm_kind = comm_kind.get(data.get("phase"), other)
        row.job = data.get("job", 0)
        key = ("xpu", id(shape.xpus))
        if key not in cache:
            cache[key] = (len(a["u_xpu"]), shape.xpus)  # keep xpus alive: ids stay unique
            a["u_xpu"].extend([hosts[xpu] for xpu in shape.xpus])
        row.xrow = cache[key][0]
        if compute:
            row.source = _compute_units(a, rules, data, shape.xpus, hosts, analytic_access, xpu_cache)
            row.crow, row.grow, row.gtab, row.group_count = row.source[0], -1, -1, 0
        else:
            row.source, row.crow, row.group_count = shape, -1, len(shape.group_offsets)
            row.grow, row.gtab = _groups(a, rules, shape, plans, step_plans, cache, hosts)
    return alike


def _edges(a, rules) -> None:
    """The edge columns (each vertex's successors, by index, in the executor's order) with their buckets, and each
    vertex's required row. The numbering's edges are classed in C++ (hcsim/workload/order.cpp) by (the Shapes of
    their two ends, skip, wait), each class's row made once, as first met (so buckets and required rows come in
    the order the vertices first need them)."""
    native, numbering, shapes = extension(), rules.numbering, rules.shapes
    number = dict(zip(dict.fromkeys(shapes), count()))  # each distinct Shape, as first met
    distinct = list(number)
    vertex_class = array("i", map(number.__getitem__, shapes))
    e_succ, v_succs, edge_class, classes = (
        typed_array(code, data) for code, data in zip("iqii", native.edge_classes(
            numbering.order, rules.position, numbering.start, numbering.successor, numbering.flags, vertex_class)))
    rows, pred_shapes = _edge_rows(a, rules, distinct, classes)
    a["e_succ"] = e_succ
    a["v_succs"].extend(v_succs[1:])
    for name, column in (("e_skip", 0), ("e_same_rank", 1), ("e_bucket_of", 2)):
        a[name].fromlist(list(map([row[column] for row in rows].__getitem__, edge_class)))
    if not a["bucket_of"]:
        a["bucket_of"].append(-1)
    # each vertex's required row: by its Shape's XPUs, groups and kind and its predecessors' (skip, wait, XPUs,
    # groups) as a multiset (the counts are sums over them)
    kinds = dict(zip(dict.fromkeys((id(shape.xpus), id(shape.groups), shape.kind) for shape in distinct), count()))
    kind_of = array("i", (kinds[id(shape.xpus), id(shape.groups), shape.kind] for shape in distinct))
    which, requirements = native.requirement_classes(e_succ, v_succs, edge_class, array("i", map(itemgetter(3), rows)),
                                                     array("i", map(kind_of.__getitem__, vertex_class)))
    sample = {}  # a kind -> a Shape of it (the counts follow from the kind and the predecessors)
    for shape, kind in zip(distinct, kind_of):
        sample.setdefault(kind, shape)
    per_class = _required_rows(a["u_required"], rules, [(sample[kind], [pred_shapes[pred] for pred in preds])
                                                         for kind, preds in requirements])
    a["v_rrow"].fromlist(list(map(per_class.__getitem__, typed_array("i", which))))


def _edge_rows(a, rules, distinct: list, classes: array) -> tuple[list[tuple], list[tuple]]:
    """Per edge class (`classes`: the numbers of its ends' Shapes in `distinct`, skip, wait's code), its row:
    (skip, same rank, where its buckets begin, its predecessor's number); and per predecessor number its (skip,
    wait, Shape), the first met of those alike (skip, wait, XPUs, groups)."""
    rows, numbers, pred_shapes, buckets = [], {}, [], {}
    ends = zip(map(distinct.__getitem__, classes[0::4]), map(distinct.__getitem__, classes[1::4]))
    for (pred, succ), skip, wait in zip(ends, classes[2::4], map(_WAITS.__getitem__, classes[3::4])):
        same_rank = wait == "xpu" and pred.pos is succ.pos
        key = (skip, wait, id(pred.xpus), id(pred.groups))  # what the successor's counts follow from
        if key not in numbers:
            numbers[key] = len(pred_shapes)
            pred_shapes.append((skip, wait, pred))
        bucket = -1 if same_rank else _buckets(a, rules, pred, succ, wait, buckets)
        rows.append((skip, same_rank, bucket, numbers[key]))
    return rows, pred_shapes


def _required_rows(table: array, rules, requirements: list[tuple]) -> list[int]:
    """Each requirement's row in `table` (u_required: two per unit, predecessor completions for run 1 and later
    runs), made in order: one per (counts, units) where every unit needs the same (WorkloadRules.required), else
    one per requirement. `requirements`: (a Shape, its predecessors' (skip, wait, Shape)) each."""
    rows, uniform = [], {}
    for shape, edges in requirements:
        required = rules.required(shape, edges)
        if required is None:
            rows.append(len(table) // 2)
            for rank in range(len(shape.xpus)):
                table.extend((rules.required_count(shape, edges, rank, 1), rules.required_count(shape, edges, rank, 2)))
            continue
        key = (required, len(shape.xpus))
        if key not in uniform:
            uniform[key] = len(table) // 2
            table.extend(required * len(shape.xpus))
        rows.append(uniform[key])
    return rows


def job_iterations(workload: nx.DiGraph, iterations: int) -> list[int]:
    """Each job's iterations: the workload graph's ``jobs`` (several jobs on one fabric, each vertex's ``job``
    its index in it), else one job of `iterations`."""
    jobs = workload.graph.get("jobs")
    return [job["iterations"] for job in jobs] if jobs else [iterations]


def _compute_key(data: dict, model) -> tuple:
    """What a compute vertex's rows follow from besides its XPUs (ids of objects `data` holds: alive with it); the
    kernel tuple only where the kernel model (`model`) times it."""
    return (id(data.get("spilled_xpus") or ()), data["flops"], data["memory_bytes"], data.get("duration"),
            id(data.get("ops")) if model is not None else None, data.get("host") == "cpu", data.get("move"),
            data.get("offload"))


def _compute_units(a, rules, data, xpus, hosts, analytic_access, xpu_cache) -> tuple:
    """The memory form's activities per unit of a compute vertex with attributes `data` on `xpus`: a copy first
    (spilled data without coherence), then the execution and the read side by side, or the longer of the two
    alone (local data, local_access analytic); the vertex's first row in the compute columns, added on first use
    (alike vertices share them), with `xpus` and `data` (what its traffic follows from: :func:`pair_bytes`)."""
    from hcsim.engine.rules import memory_form

    nodes = rules.nodes
    size = data["memory_bytes"]
    spilled = data.get("spilled_xpus") or ()
    cpu_step, move = data.get("host") == "cpu", data.get("move")
    key = (id(xpus), *_compute_key(data, rules.options.compute_model))
    if key in xpu_cache:
        return xpu_cache[key]

    def host(name):
        if name not in hosts:
            hosts[name] = len(hosts)
        return hosts[name]

    flops_out, read_out, src_out, time_out, copy_out, copy_src_out, peer_out = [], [], [], [], [], [], []
    for xpu in xpus:
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
    xpu_cache[key] = (row, xpus, data)  # keeps the keyed objects (data holds spilled and ops) alive: ids stay unique
    for name, values in zip(_UNIT_ARRAYS, (flops_out, read_out, src_out, time_out, copy_out, copy_src_out,
                                           peer_out)):
        a[name].extend(values)
    return xpu_cache[key]


def _groups(a, rules, shape, plans, step_plans, cache, hosts) -> tuple[int, int]:
    """A collective shape's groups: first unit (after its vertex's first), size, the host of its region's memory
    device (collectives through one memory device; numbered in `hosts` on first use) and the flow phases (a plan
    shared by alike groups), the step schedule (shared by groups with the same algorithm) or the analytic closed
    form; rows in the g_ tables made once per shape. Returns its row in u_group (each unit's group among its
    vertex's) and its first row in the g_ tables."""
    key = ("groups", id(shape.algorithms))
    if key not in cache:
        first = len(a["g_offset"])
        a["g_offset"].extend(shape.group_offsets)
        for g, group in enumerate(shape.groups):
            algorithm, fidelity, phases = shape.algorithms[g]
            a["g_size"].append(len(group))
            a["g_call_latency"].append(rules.call_latency(algorithm, group))
            ends = rules.endpoints(algorithm, group)
            a["g_region"].append(hosts.setdefault(ends[-1], len(hosts)) if algorithm.region else -1)
            if fidelity == "analytic":
                mode, seconds, plan = ANALYTIC, phases[1], -1
            elif fidelity == "step":
                mode, seconds, plan = STEP, 0.0, _step_plan(a, rules, algorithm, group, step_plans)
            else:
                mode, seconds, plan = FLOW, 0.0, _flow_plan(a, rules, phases, ends, plans,
                                                            rules.protocol(algorithm, group))
            a["g_mode"].append(mode)
            a["g_seconds"].append(seconds)
            a["g_plan"].append(plan)
        cache[key] = (len(a["u_group"]), first, shape.algorithms)  # keep the keyed list alive: ids stay unique
        a["u_group"].extend(shape.group_of)
    return cache[key][:2]


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


def _buckets(a, rules, pred, succ, wait, cache) -> int:
    """Where the map from the units of a vertex of Shape `pred` to buckets of units of its successor (Shape `succ`,
    by rule `wait`) begins in bucket_of: the units a completion of each unit of `pred` counts for
    (rules.waiting_units), shared by alike edges."""
    key = (id(pred.xpus), id(succ.xpus), wait, id(pred.groups), id(succ.groups))  # the shapes': ids stay unique
    if key in cache:
        return cache[key]
    start = len(a["bucket_of"])
    seen: dict[tuple, int] = {}
    for xpu in pred.xpus:
        units = tuple(rules.waiting_units(wait, succ, pred, xpu))
        if not units:
            a["bucket_of"].append(-1)
            continue
        if units not in seen:
            seen[units] = len(a["b_units"]) - 1
            a["b_unit"].extend(units)
            a["b_units"].append(len(a["b_unit"]))
        a["bucket_of"].append(seen[units])
    cache[key] = start
    return start


def pair_bytes(rules, sources: list, jobs: array) -> dict[tuple[str, str], float]:
    """Bytes per (src, dst) host pair over the run: every unit runs every iteration, so they follow from the
    graph (the core counts none). `sources`: what each vertex's traffic follows from, in vertex order, as
    :func:`build_arrays` lists them (a compute row's entry, a collective's Shape); `jobs`: each vertex's job.

    Alike vertices add the same (pair, bytes) list: each distinct one is made once. When every amount is a whole
    number of bytes and every sum stays below 2**53, each float sum is exact in any order, so the sums are
    made in integers from how often each list is added; otherwise they are added one by one in vertex order."""
    runs = job_iterations(rules.workload, rules.options.iterations)  # each vertex runs its job's iterations
    lists: dict[tuple, list] = {}  # (source id, job) -> [(pair, bytes), ...], then a use count and the source
    used = []  # each vertex's list, in vertex order
    for source, job in zip(sources, jobs):
        entry = lists.get((id(source), job))
        if entry is None:
            entry = lists[id(source), job] = [_traffic(rules, source, runs[job]), 0, source]
        entry[1] += 1
        used.append(entry[0])
    totals: dict[tuple[str, str], int] = {}
    exact = all(float(size).is_integer() for entry in lists.values() for _, size in entry[0])
    if exact:
        for additions, uses, *_ in lists.values():  # in first use: the order pairs first appear
            for pair, size in additions:
                totals[pair] = totals.get(pair, 0) + uses * int(size)
        exact = all(total < 2**53 for total in totals.values())
    if exact:
        return {pair: float(total) for pair, total in totals.items()}
    pairs: dict[tuple[str, str], float] = defaultdict(float)
    for additions in used:
        for pair, size in additions:
            pairs[pair] += size
    return pairs


def _traffic(rules, source, iterations) -> list[tuple[tuple[str, str], float]]:
    """(pair, bytes over the run) for each transfer of one vertex run per iteration, in the core's order; `source`
    as :func:`pair_bytes` takes it."""
    from hcsim.engine.rules import Shape, form_transfers, memory_form

    nodes, out = rules.nodes, []
    if not isinstance(source, Shape):  # a compute row's (row, xpus, attributes)
        _, xpus, data = source
        size = data["memory_bytes"]
        if not size > 0:
            return out
        spilled = data.get("spilled_xpus") or ()
        offload = data.get("host") == "cpu" or data.get("move")
        for xpu in xpus:
            if not offload and xpu not in spilled:  # local: one read from its HBM (form_transfers)
                out.append(((nodes[xpu]["local_memory"], xpu), size * iterations))
                continue
            form = memory_form(nodes, data, xpu, rules.options.coherent)
            out += [(pair, size * iterations) for pair in form_transfers(nodes, data, xpu, form)]
        return out
    for group, (algorithm, fidelity, phases) in zip(source.groups, source.algorithms):
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
        runs = len(ends) if ended is None else ended[xpu]
        measured = runs - 1 if runs > 1 else 1
        now = last[x * fields:(x + 1) * fields]
        busy, comm, idle, compute = now[0], now[1], now[2], now[4]
        parts = parts_of(now)
        if runs > 1:
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


def _fill_trace(trace, rules, counters: dict, hosts: list[str]) -> None:
    """The core's traced events into `trace`, in the order they ended, as the rules records them."""
    offsets, order, shapes = rules.offsets, rules.order, rules.shapes
    for run, unit, start, end in counters["vertices"]:
        index = bisect_right(offsets, unit) - 1  # the vertex whose units [offsets[i], offsets[i + 1]) hold it
        shape = shapes[index]
        trace.vertices.append((run, shape.xpus[unit - offsets[index]], order[index], shape.kind, start, end))
    suffix = ("", ".read", ".copy", ".move")
    for run, src, dst, index, label, size, start, end in counters["transfers"]:
        trace.transfers.append((run, hosts[src], hosts[dst], order[index] + suffix[label], size, start, end))


def run_workload(platform: nx.Graph, workload: nx.DiGraph, compiled, options, progress=None, beside=None):
    """Run `workload` on `platform` compiled (a :class:`hcsim.platform.CompiledPlatform`) in the core, in this process (once: SimGrid allows
    one Engine per process); a :class:`RunResult`. `progress`, if given, is called now and then with how many
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
        return _run_workload(platform, workload, compiled, options, progress, beside)


def _unfinished(rules, done: array, runs: array) -> list[str]:
    """The vertices with a unit that did not complete its job's iterations (`done`: each unit's completed runs)."""
    nodes, offsets = rules.workload._node, rules.offsets
    return [name for i, name in enumerate(rules.order)
            if any(d < runs[nodes[name].get("job", 0)] for d in done[offsets[i]:offsets[i + 1]])]


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


def _run_workload(platform, workload, compiled, options, progress, beside=None):
    from hcsim.engine import core
    from hcsim.engine.options import RunResult
    from hcsim.engine.rules import WorkloadRules, check_link_loads

    wall = time.perf_counter()
    if not core.available():
        raise ConfigError(f"the engine core is not built: {core.unavailable_reason()}")
    module = core.load()
    rules = WorkloadRules(platform, workload, compiled.routes, options)
    xpus = rules.xpus
    hosts = {x: i for i, x in enumerate(xpus)}
    arrays, sources = build_arrays(rules, hosts)
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
    if done.count(iterations) < len(done):  # a unit short of its job's last run (count: C speed)
        unfinished = _unfinished(rules, done, runs)
        if unfinished:
            raise SimulationError(f"the run stopped with vertices that never completed every iteration "
                                  f"(a dependency that is never met): {', '.join(unfinished[:5])}")
    iteration_ends = list(ends[:counters["iterations_ended"]])
    per_job = [list(job_ends[j * iterations:j * iterations + job_ended[j]]) for j in range(len(runs))]
    ended = None
    if len(runs) > 1:  # each XPU's clocks measure its own job's iterations
        ended = {}
        nodes = rules.workload._node
        for name, shape in zip(rules.order, rules.shapes):
            ended.update(dict.fromkeys(shape.xpus, job_ended[nodes[name].get("job", 0)]))
    link_bytes: dict[tuple[str, str], float] = defaultdict(float)
    for pair, size in pair_bytes(rules, sources, arrays["v_job"]).items():
        route = compiled.routes[pair]
        for link in zip(route, route[1:]):
            link_bytes[link] += size
    link_bytes = dict(link_bytes)
    check_link_loads(platform, link_bytes, iteration_ends[-1] if iteration_ends else 0.0)
    if trace is not None:
        _fill_trace(trace, rules, counters, list(hosts))
    busy = {x: [last[i * fields + 4], last[i * fields + 5], last[i * fields + 6]] for i, x in enumerate(xpus)}
    result = RunResult(iteration_ends=iteration_ends, activities=counters["activities"], busy=busy,
                       wall_time_s=time.perf_counter() - wall, trace=trace, collective_fidelity=rules.fidelity_used,
                       link_bytes=link_bytes, engine="core",
                       xpu_times=xpu_times(xpus, first, last, iteration_ends, fields, ended),
                       job_iteration_ends=per_job, job_gemm_clocks=[rules.gemm_clocks(j) for j in range(len(per_job))])
    result.core_counters = counters  # run_s, run_cpu_s, setup_s of the core (docs/engine-core.md's figures)
    result.beside_counters = counters.get("beside")  # the serving steps' beside the workload (activities)
    return result
