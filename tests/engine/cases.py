"""Graphs, runs and checks that several engine test modules share (a test module imports no other).

Every run goes through the engine's front door on SimGrid (``simulate_graphs``: a fresh process per run, one
SimGrid Engine per process), so the closed forms are SimGrid's as this project configures it (CM02, no TCP
gamma, no cross traffic): an execution takes FLOPs / peak FLOP/s; a transfer alone on its route takes the
route's latency + size / its bottleneck bandwidth; transfers sharing a link share its bandwidth.

- the executor's rules on one switch of H100: :func:`run`, :func:`wait_graph`, :func:`pipeline_graph`
  (PP 2 x TP 2 x DP 2, 1F1B, 4 micro-batches);
- a run's own invariants (clock parts, dependencies in the trace): :func:`check_invariants`;
- collectives chained behind barriers, one process per table: :func:`_durations`; a switch whose XPUs share one
  memory device (a region for pooled_memory): :func:`pooled_switch`;
- pipeline schedules on uniform, compute-bound stages: :func:`hybrid_run`, :func:`iteration_time`.
"""

import math

import pytest

from hcsim.engine.api import RunOptions
from hcsim.platform.builders import single_switch
from hcsim.platform.devices import Device, builtin_catalog
from hcsim.platform.topology import add_link, add_memory
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import add_comm, add_compute, add_dependency, load_workload_spec, new_workload, validate_workload
from hcsim.workload.hybrid import Parallelism, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout


# ---- the executor's rules on one switch --------------------------------------------------------------------------


H100 = builtin_catalog()["H100"]


SECOND = H100.fp32_flops  # FLOP that take 1 s


TINY = 8.0  # bytes: a collective of these costs microseconds


B, LINK_LAT = 900e9, 100e-9  # single_switch defaults (Table 5 XPU_link)
A = 2 * LINK_LAT  # α: XPU -> switch -> XPU


def spans_of(result) -> dict:
    """{(run, xpu, vertex): (start, end)} of a result's traced vertex runs."""
    return {(run_, xpu, name): (start, end) for run_, xpu, name, _, start, end in result["vertices"]}


def run(graph, n, **options):
    """Run `graph` on `n` H100 of one switch, every XPU traced, in a fresh process;
    (iteration ends, {(run, xpu, vertex): (start, end)}, the result's plain data)."""
    validate_workload(graph, [f"xpu{i}" for i in range(n)])
    options = RunOptions(trace_xpus=frozenset(f"xpu{i}" for i in range(n)), **options)
    result = simulate_graphs(single_switch(n, H100), graph, options)
    return result["iteration_ends"], spans_of(result), result


def wait_graph():
    """xpu0 and xpu1 compute 1 s, xpu0 2 s more, then an all-reduce of 1 GB between them."""
    g = new_workload("wait")
    add_compute(g, "c", xpus=["xpu0", "xpu1"], flops=SECOND, start=True)
    add_compute(g, "slow", xpus=["xpu0"], flops=2 * SECOND)
    add_comm(g, "r", xpus=["xpu0", "xpu1"], bytes=1e9, collective="all_reduce", algorithm="ring")
    add_dependency(g, "c", "slow")
    add_dependency(g, "slow", "r", wait="group")
    add_dependency(g, "c", "r")
    add_dependency(g, "r", "c", skip_first_iteration=True)
    return g


P, M = 2, 4
T_F, T_B = 1.0, 2.0


def one_f_one_b(stage: int) -> list[str]:
    """The 1F1B order of one stage: p - stage - 1 warm-up forwards, then one forward one backward."""
    warmup = min(P - stage - 1, M)
    order = [f"F{j}" for j in range(warmup)]
    for j in range(M - warmup):
        order += [f"F{warmup + j}", f"B{j}"]
    return order + [f"B{j}" for j in range(M - warmup, M)]


def pipeline_graph():
    layout = ParallelLayout([f"xpu{i}" for i in range(8)], {"tp": 2, "pp": 2, "dp": 2})
    g = new_workload("pp2-tp2-dp2", layout=layout.to_dict())

    def name(stage, op):
        return f"s{stage}.{op}"

    for stage in range(P):
        xpus = layout.stage_xpus(stage)
        tp = tuple(grp for grp in layout.groups("tp") if grp[0] in xpus)
        order = one_f_one_b(stage)
        for op in order:
            seconds = T_F if op[0] == "F" else T_B
            add_compute(g, name(stage, op), xpus=xpus, flops=seconds * SECOND, start=op == order[0])
            add_comm(g, name(stage, op + ".tp"), groups=tp, bytes=TINY, collective="all_reduce", algorithm="ring")
            add_dependency(g, name(stage, op), name(stage, op + ".tp"))
        for before, after in zip(order, order[1:]):
            add_dependency(g, name(stage, before + ".tp"), name(stage, after))
        dp = tuple(grp for grp in layout.groups("dp") if grp[0] in xpus)
        add_comm(g, name(stage, "grads"), groups=dp, bytes=TINY, collective="all_reduce", algorithm="ring")
        add_dependency(g, name(stage, order[-1] + ".tp"), name(stage, "grads"))
        add_dependency(g, name(stage, "grads"), name(stage, order[0]), skip_first_iteration=True)
    first, second = layout.stage_xpus(0), layout.stage_xpus(1)
    for j in range(M):  # activations forward, their gradients backward, between matching (tp, dp) ranks
        add_comm(g, f"act{j}", pairs=list(zip(first, second)), bytes=TINY, collective="p2p")
        add_dependency(g, name(0, f"F{j}.tp"), f"act{j}", wait="group")
        add_dependency(g, f"act{j}", name(1, f"F{j}"))
        add_comm(g, f"grad{j}", pairs=list(zip(second, first)), bytes=TINY, collective="p2p")
        add_dependency(g, name(1, f"B{j}.tp"), f"grad{j}", wait="group")
        add_dependency(g, f"grad{j}", name(0, f"B{j}"))
    return layout, g


# ---- a run's own invariants ------------------------------------------------------------------------------------


def check_invariants(graph, result, iterations: int, settle: float = 0.0) -> None:
    """What every run must satisfy, from its result and its trace (every XPU traced):

    - one iteration end per iteration, increasing;
    - every XPU's clock parts (compute, memory stall, exposed communication, idle) add up to the mean measured
      iteration (the window from the end of iteration 1 to the end of the last, per iteration), none negative;
    - every unit of every vertex runs once per iteration; run k of a unit starts no earlier than its own run
      k-1 ended, nor than the k-th run (over a skip_first_iteration edge the (k-1)-th) of the predecessor
      units it waits for ended: wait xpu, the predecessor's unit on its XPU (if any); wait all, every unit;
      wait group, into a collective the predecessor's units in its group, into a compute the predecessor's
      group that holds its XPU (a compute predecessor's unit on its XPU);
    - the last iteration ends when the last vertex run ends.

    `settle`: seconds the clock parts may miss on top of 1e-9 of the iteration (SimGrid settles flows of a few
    bytes within its precision, picoseconds).
    """
    ends = result["iteration_ends"]
    assert len(ends) == iterations and all(b > a for a, b in zip(ends, ends[1:])), ends
    period = (ends[-1] - ends[0]) / (iterations - 1) if iterations > 1 else ends[-1]
    spans = spans_of(result)
    tol = 1e-9 * ends[-1]
    for xpu, times in result["xpu_times"].items():
        parts = [times[k] for k in ("compute_s", "memory_stall_s", "comm_s", "idle_s")]
        assert all(p >= -1e-12 * period for p in parts), (xpu, times)
        assert sum(parts) == pytest.approx(period, rel=1e-9, abs=settle), (xpu, times)
    units = {name: data["xpus"] for name, data in graph.nodes(data=True)}
    assert len(spans) == len(result["vertices"]) == iterations * sum(len(x) for x in units.values())
    assert max(end for _, end in spans.values()) == pytest.approx(ends[-1], rel=1e-12)
    for name, xpus in units.items():
        for k in range(2, iterations + 1):
            for x in xpus:
                assert spans[k, x, name][0] >= spans[k - 1, x, name][1] - tol, (name, x, k)
    for before, after, data in graph.edges(data=True):
        shift = 1 if data.get("skip_first_iteration") else 0
        wait = data.get("wait", "xpu")
        for k in range(1 + shift, iterations + 1):
            for x in units[after]:
                if wait == "all":
                    waited = units[before]
                elif wait == "xpu" or x not in units[before] and graph.nodes[after]["kind"] == "compute":
                    waited = [x] if x in units[before] else []
                elif graph.nodes[after]["kind"] == "comm":
                    group = next(g for g in graph.nodes[after]["groups"] if x in g)
                    waited = [y for y in units[before] if y in group]
                elif graph.nodes[before]["kind"] == "comm":
                    waited = next(g for g in graph.nodes[before]["groups"] if x in g)
                else:
                    waited = [x]
                if not waited:
                    continue
                ready = max(spans[k - shift, y, before][1] for y in waited)
                assert spans[k, x, after][0] >= ready - tol, (before, after, x, k, wait)


def pooled_switch(n: int, port_bandwidth: float, port_latency: float, xpus: int | None = None):
    """`xpus` H100 (default n) on one switch, coherent, the first n spilling to one memory device ``pool`` on the
    switch, on a port of `port_bandwidth` B/s and `port_latency` s: a route XPU -> pool takes LINK_LAT + that."""
    graph = single_switch(n if xpus is None else xpus, H100)
    graph.graph["coherent"] = True
    add_memory(graph, "pool", capacity=math.inf, role="cxl_type3", owner=None, rack=0, server="s0")
    add_link(graph, "pool", "xswitch", bandwidth=port_bandwidth, latency=port_latency, kind="cxl")
    for i in range(n):
        graph.nodes[f"xpu{i}"]["extended_memory"] = "pool"
    return graph


# ---- collectives behind barriers -------------------------------------------------------------------------------


def _chain(graph, group, items, barrier_xpu):
    """Add collectives `items` [(name, collective, algorithm, bytes[, chunks])] on `group`, each behind a
    barrier."""
    previous = add_compute(graph, "b0", xpus=[barrier_xpu], flops=0.0, start=True)
    for index, (name, collective, algorithm, size, *chunks) in enumerate(items, start=1):
        add_comm(graph, name, xpus=group, bytes=size, collective=collective, algorithm=algorithm,
                 chunks=chunks[0] if chunks else None)
        add_dependency(graph, previous, name, wait="all")
        previous = add_compute(graph, f"b{index}", xpus=[barrier_xpu], flops=0.0)
        add_dependency(graph, name, previous, wait="all")


def _durations(platform, group, items, barrier_xpu, fidelity):
    """Simulate `items` chained on `group` in one process; {name: seconds}."""
    graph = new_workload("collectives")
    _chain(graph, group, items, barrier_xpu)
    result = simulate_graphs(platform, graph, RunOptions(collective_model=fidelity,
                                                         trace_xpus=frozenset(group) | {barrier_xpu}))
    spans: dict[str, list[float]] = {}
    for _, _, name, kind, start, end in result["vertices"]:
        if kind == "comm":
            span = spans.setdefault(name, [math.inf, -math.inf])
            span[0], span[1] = min(span[0], start), max(span[1], end)
    return {name: end - start for name, (start, end) in spans.items()}


# ---- pipeline schedules on uniform stages ----------------------------------------------------------------------


FAST = Device(name="fast", fp32_flops=1e12, fp16_flops=1e12, memory=1e15, memory_bandwidth=1e20)


HYBRID_SHAPE = {"model.decoders": 8, "model.hidden": 64, "model.heads": 4, "model.ffn": 256, "model.sequence": 32,
         "model.vocabulary": 0, "training.precision": "fp16", "training.optimizer_flops_per_parameter": 0}


def hybrid_spec():
    return load_workload_spec("gpt3-175b", HYBRID_SHAPE)


def fast_switch(n: int):
    """`n` FAST XPUs on one switch whose links make communication cost nothing measurable."""
    return single_switch(n, FAST, xpu_link_bandwidth=1e18, xpu_link_latency=1e-15, hbm_latency=1e-15)


def hybrid_run(par: Parallelism, trace: bool = False):
    """(platform, graph, result's plain data) of two iterations of `par` on the fast platform, through the engine."""
    n = par.tp * par.pp * par.dp
    platform = fast_switch(n)
    xpus = [f"xpu{i}" for i in range(n)]
    graph = build_hybrid_graph(hybrid_spec(), par, ParallelLayout(xpus, {"tp": par.tp, "pp": par.pp, "dp": par.dp}))
    validate_workload(graph, xpus)
    options = RunOptions(iterations=2, trace_xpus=frozenset(xpus) if trace else None)
    return platform, graph, simulate_graphs(platform, graph, options)


def iteration_time(par: Parallelism) -> float:
    ends = hybrid_run(par)[2]["iteration_ends"]
    return ends[1] - ends[0]


# ZeRO-3's prefetch and offload (test_zero_offload.py): decoders only, no embedding or head
ZERO_SHAPE = {"model.decoders": 8, "model.hidden": 64, "model.heads": 4, "model.ffn": 256, "model.sequence": 32,
              "model.vocabulary": 0, "training.precision": "fp16"}  # no embedding or head: decoders only
