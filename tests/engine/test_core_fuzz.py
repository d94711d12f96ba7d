"""The engine on hypothesis-generated workload graphs: every graph, valid or not, runs to a result
that keeps the run's invariants (cases.check_invariants: clock parts, every wait rule in the trace) and the
closed forms' lower bounds (a compute unit no shorter than FLOPs / FLOP/s, a transfer no shorter than
α + size / B), or is refused before the run with a clear error (the graph contract's, or an algorithm's that its
group cannot run); it never takes the process down.

Graphs: 2 to 5 vertices on 2 to 4 XPUs of one switch, computes of random lengths on random XPUs, all-reduces
(every registered algorithm) and p2p sends of random sizes, forward edges of random wait rules and a back edge
that closes the iteration; some edges and back edges break the graph contract on purpose. Several jobs on one
fabric: two such graphs joined (hcsim.run.jobs), each for its own iterations, on one switch or on the new
platforms (gh200, gb200-nvl72, cxl-pool), each job keeping the invariants over its own iterations.
"""

import os

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from hcsim.engine.collectives import algorithms
from hcsim.engine.api import RunOptions
from hcsim.errors import ConfigError, HcsimError, SimulationError
from hcsim.platform.builders import single_switch
from hcsim.run.jobs import join_graphs
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import add_comm, add_compute, add_dependency, new_workload, validate_workload
from cases import A, B, H100, LINK_LAT, SECOND, check_invariants, pooled_switch, spans_of  # tests/engine is on sys.path

ALGORITHMS = tuple(algorithms()["all_reduce"])


@st.composite
def graphs(draw, first: int = 0):
    """(n, graph) on XPUs xpu{first} to xpu{first + n - 1}."""
    n = draw(st.integers(2, 4))
    xpus = [f"xpu{first + i}" for i in range(n)]
    some = st.lists(st.sampled_from(xpus), min_size=1, max_size=n, unique=True)
    g = new_workload("fuzz")
    names = []
    for i in range(draw(st.integers(2, 5))):
        name, start = f"v{i}", i == 0
        kind = draw(st.sampled_from(("compute", "compute", "all_reduce", "p2p")))
        if kind == "compute":
            add_compute(g, name, xpus=sorted(draw(some)), flops=SECOND * draw(st.integers(1, 8)) / 4, start=start)
        elif kind == "all_reduce":
            group = sorted(draw(st.lists(st.sampled_from(xpus), min_size=2, max_size=n, unique=True)))
            add_comm(g, name, xpus=group, bytes=float(draw(st.sampled_from((8, 1e6, 1e9)))), collective="all_reduce",
                     algorithm=draw(st.sampled_from(ALGORITHMS)), start=start)
        else:
            pair = tuple(draw(st.lists(st.sampled_from(xpus), min_size=2, max_size=2, unique=True)))
            add_comm(g, name, pairs=[pair], bytes=float(draw(st.sampled_from((8, 1e8)))), collective="p2p",
                     start=start)
        if i:
            for before in draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True)):
                add_dependency(g, before, name, wait=draw(st.sampled_from(("xpu", "group", "all"))))
        names.append(name)
    # the back edge closes the iteration; without skip_first_iteration it makes a cycle the contract refuses
    add_dependency(g, names[-1], names[0], wait=draw(st.sampled_from(("xpu", "group", "all"))),
                   skip_first_iteration=draw(st.sampled_from((True, True, True, False))))
    return n, g


def outcome(n, graph, model):
    """The run's result (every XPU traced), or the error it raised (its class and message), on n H100 of one switch
    that share a memory device on a port like theirs (pooled_memory's region; the other algorithms never use it)."""
    try:
        return simulate_graphs(pooled_switch(n, B, LINK_LAT), graph,
                               RunOptions(iterations=3, collective_model=model,
                                          trace_xpus=frozenset(f"xpu{i}" for i in range(n))))
    except HcsimError as err:
        return type(err), str(err)


# derandomized: CI runs the same graphs every time (HCSIM_FUZZ_EXAMPLES=300 for more)
@settings(max_examples=int(os.environ.get("HCSIM_FUZZ_EXAMPLES", 40)), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=graphs(), model=st.sampled_from(("flow", "step")))
def test_random_graphs_keep_the_run_invariants_or_are_refused_before_the_run(case, model):
    n, graph = case
    note(f"vertices {dict(graph.nodes(data=True))}; edges {list(graph.edges(data=True))}")
    result = outcome(n, graph, model)
    event("refused" if isinstance(result, tuple) else "ran")
    if isinstance(result, tuple):
        assert result[0] is not SimulationError, result  # the engine never fails on a graph the contract admits
        try:
            validate_workload(graph)
        except HcsimError as err:  # the graph contract's own error, before any engine
            assert (type(err), str(err)) == result
            return
        # else the engine's set-up refused an algorithm on its group (halving_doubling on 3 ranks), by name
        assert result[0] is ConfigError and any(f"{d.get('algorithm')} " in result[1]
                                                for _, d in graph.nodes(data=True) if d.get("algorithm")), result
        return
    check_invariants(graph, result, 3)
    spans = spans_of(result)
    tol = 1e-9  # s: SimGrid's timing precision (precision/timing); a few bytes' picoseconds may vanish below it
    for (_, xpu, name), (start, end) in spans.items():
        data = graph.nodes[name]
        if data["kind"] == "compute":
            assert end - start >= data["flops"] / H100.fp32_flops - tol, (name, xpu, start, end)
    for _, src, dst, _, size, start, end in result["transfers"]:
        assert end - start >= A + size / B - tol, (src, dst, size, start, end)


def test_a_tiny_coherent_ring_beside_p2p_sends():
    """Found by the fuzzer (the two engines differed by 2.2e-12 s per iteration): v0 (xpu1 -> xpu2, S = 100 MB),
    then an 8-byte coherent ring on (xpu0, xpu1), then v2 (xpu0 -> xpu3, S), and v2's back edge into v0 waits
    (wait group) for none of v2's units, so v0's run k+1 starts as soon as its run k ends: at k·t0, t0 = α + S/B.
    Each ring then shares a sender's uplink with a 100 MB send for its few picoseconds, which SimGrid settles
    within its precision (a few s/B, s = 4 bytes a direction); apart from that the ends are the uncontended
    closed form: iteration k ends when v2's run k does, (k + 1)·t0 + α + s/B."""
    g = new_workload("tiny-coherent-ring")
    add_comm(g, "v0", pairs=[("xpu1", "xpu2")], bytes=1e8, collective="p2p", start=True)
    add_comm(g, "v1", xpus=["xpu0", "xpu1"], bytes=8.0, collective="all_reduce", algorithm="coherent_ring")
    add_comm(g, "v2", pairs=[("xpu0", "xpu3")], bytes=1e8, collective="p2p")
    add_dependency(g, "v0", "v1", wait="group")
    add_dependency(g, "v1", "v2", wait="group")
    add_dependency(g, "v2", "v0", wait="group", skip_first_iteration=True)
    t0, ring, settle = A + 1e8 / B, A + 4 / B, 3 * 4 / B
    for model in ("flow", "step"):
        result = outcome(4, g, model)
        check_invariants(g, result, 3, settle)
        spans = spans_of(result)
        assert [spans[k, "xpu1", "v0"][0] for k in (1, 2, 3)] == pytest.approx([0, t0, 2 * t0], abs=settle)
        assert [spans[k, "xpu0", "v1"][1] - spans[k, "xpu0", "v1"][0] for k in (1, 2, 3)] == pytest.approx(
            [ring] * 3, abs=settle)
        assert result["iteration_ends"] == pytest.approx([(k + 1) * t0 + ring for k in (1, 2, 3)], abs=settle)


def test_two_computes_at_once_on_one_xpu():
    """Four vertices of 0.25 s on xpu0: v0, then v1 and v3 at once (each at half the XPU's FLOP/s: both end
    0.5 s later), then v2; v0's next run waits for v3 only, so it shares the XPU with v2. Ends at 1.25, 2.25 and
    3 s. The measured window runs from the end of iteration 1 to the end of the last (1.25 s to 3 s, two
    iterations of 0.875 s on average), and the XPU computes all of it: 0.875 s of compute per iteration, no
    idle, parts that add up to the mean iteration."""
    g = new_workload("two-at-once")
    for i in range(4):
        add_compute(g, f"v{i}", xpus=["xpu0"], flops=SECOND / 4, start=i == 0)
    for before, after in (("v0", "v1"), ("v0", "v2"), ("v0", "v3"), ("v1", "v2")):
        add_dependency(g, before, after)
    add_dependency(g, "v3", "v0", skip_first_iteration=True)
    result = outcome(1, g, "flow")
    ends = result["iteration_ends"]
    assert ends == pytest.approx([1.25, 2.25, 3.0], rel=1e-12)
    times = result["xpu_times"]["xpu0"]
    period = (ends[2] - ends[0]) / 2
    assert (times["compute_s"], times["idle_s"]) == pytest.approx((period, 0.0), abs=1e-12)


def test_a_compute_that_starts_beside_a_running_one_shares_what_the_first_has_left():
    """On xpu0, a (1 s of FLOPs) starts at 0; b (0.25 s) starts at 0.5 s, when c (0.5 s) ends on xpu1. From 0.5 s
    both run at half the XPU's FLOP/s: b ends at 0.5 + 2 x 0.25 = 1 s, with 0.25 s of a's FLOPs done beside it,
    and a's last 0.25 s run alone: a ends at 1.25 s, and the next iteration starts when both have ended. (The core
    times an execution alone on its XPU without SimGrid's CPU model and hands it to the model, with what it has
    left, when a second one starts beside it.)"""
    g = new_workload("beside-a-running-one")
    add_compute(g, "a", xpus=["xpu0"], flops=SECOND, start=True)
    add_compute(g, "c", xpus=["xpu1"], flops=SECOND / 2, start=True)
    add_compute(g, "b", xpus=["xpu0"], flops=SECOND / 4)
    add_dependency(g, "c", "b", wait="all")
    for before, after in (("b", "a"), ("a", "c"), ("b", "c")):
        add_dependency(g, before, after, wait="all", skip_first_iteration=True)
    result = outcome(2, g, "flow")
    spans = spans_of(result)
    for k in (1, 2, 3):
        start = 1.25 * (k - 1)
        assert spans[k, "xpu0", "b"] == pytest.approx((start + 0.5, start + 1.0), rel=1e-12)
        assert spans[k, "xpu0", "a"] == pytest.approx((start, start + 1.25), rel=1e-12)
    assert result["iteration_ends"] == pytest.approx([1.25, 2.5, 3.75], rel=1e-12)


def test_two_computes_at_once_on_one_xpu_and_the_clock_of_another():
    """v0 (0.25 s) on xpu0 and xpu1, then on xpu0 v1 (0.25 s) beside a tiny p2p send to xpu1, and v0's next run
    (it waits for the send only) beside v1 on xpu0. Inside the measured window (the end of iteration 1 to the
    end of the last) xpu1 runs v0 once (run 3: its run 2 ends before the window) and waits the rest: 0.25 s of
    compute over two iterations, and its parts add up to the mean iteration."""
    g = new_workload("two-at-once-elsewhere")
    add_compute(g, "v0", xpus=["xpu0", "xpu1"], flops=SECOND / 4, start=True)
    add_compute(g, "v1", xpus=["xpu0"], flops=SECOND / 4)
    add_comm(g, "v2", pairs=[("xpu0", "xpu1")], bytes=8.0, collective="p2p")
    add_dependency(g, "v0", "v1")
    add_dependency(g, "v0", "v2")
    add_dependency(g, "v2", "v0", skip_first_iteration=True)
    result = outcome(2, g, "flow")
    spans = spans_of(result)
    ends = result["iteration_ends"]
    assert spans[2, "xpu1", "v0"][1] < ends[0] < spans[3, "xpu1", "v0"][0]  # run 2 before, run 3 inside
    times = result["xpu_times"]["xpu1"]
    period = (ends[2] - ends[0]) / 2
    assert times["compute_s"] == pytest.approx(0.25 / 2, rel=1e-12)
    assert sum(times[k] for k in ("compute_s", "memory_stall_s", "comm_s", "idle_s")) == pytest.approx(period)


PLATFORMS = ("switch", "gh200", "gb200-nvl72", "cxl-pool")


def _platform(name: str, n: int):
    """`n` XPUs (whole superchips) of a built-in platform, or of one switch of H100."""
    if name == "switch":
        return single_switch(n, H100)
    from hcsim.config import resolve_spec
    from hcsim.platform import build_platform, load_platform_spec

    spec = load_platform_spec(resolve_spec(name, "platforms"))
    chip = spec.superchip.gpus_per_superchip if spec.superchip is not None else 1
    return build_platform(spec, -(-n // chip) * chip)


@st.composite
def two_jobs(draw):
    """Two random graphs on disjoint XPUs, joined as jobs a and b of 1 to 3 iterations each, and a platform."""
    n, a = draw(graphs())
    m, b = draw(graphs(first=n))
    iterations = draw(st.lists(st.integers(1, 3), min_size=2, max_size=2))
    return n + m, join_graphs([a, b], ["a", "b"], iterations), draw(st.sampled_from(PLATFORMS))


def _job_view(graph, result, j: int):
    """Job `j`'s vertices and its share of `result` (its iteration ends, its XPUs' clocks, its traced runs)."""
    names = {v for v, job in graph.nodes(data="job") if job == j}
    xpus = {x for v in names for x in graph.nodes[v]["xpus"]}
    view = {"iteration_ends": result["job_iteration_ends"][j],
            "xpu_times": {x: t for x, t in result["xpu_times"].items() if x in xpus},
            "vertices": [row for row in result["vertices"] if row[2] in names]}
    return graph.subgraph(names), view


@settings(max_examples=int(os.environ.get("HCSIM_FUZZ_EXAMPLES", 30)), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=two_jobs(), model=st.sampled_from(("flow", "step")))
def test_two_random_jobs_keep_each_jobs_invariants_on_any_platform_or_are_refused_before_the_run(case, model):
    """Each job runs its own iterations and keeps the run invariants over them (its iteration ends, its XPUs'
    clock parts over its own window, every wait rule); a compute is no shorter than FLOPs / the XPU's FLOP/s;
    the run's iterations end with the last job's; or the run is refused before it starts, never crashing."""
    n, graph, name = case
    note(f"platform {name}; vertices {dict(graph.nodes(data=True))}; edges {list(graph.edges(data=True))}")
    platform = _platform(name, n)
    iterations = [job["iterations"] for job in graph.graph["jobs"]]
    try:
        result = simulate_graphs(platform, graph, RunOptions(iterations=max(iterations), collective_model=model,
                                                             trace_xpus=frozenset(f"xpu{i}" for i in range(n))))
    except HcsimError as err:
        event("refused")
        assert not isinstance(err, SimulationError), err  # the engine never fails on a graph the contract admits
        try:
            validate_workload(graph)
        except HcsimError as contract:
            assert (type(contract), str(contract)) == (type(err), str(err))
            return
        assert isinstance(err, ConfigError) and any(f"{d.get('algorithm')} " in str(err)
                                                    for _, d in graph.nodes(data=True) if d.get("algorithm")), err
        return
    event("ran")
    assert [len(ends) for ends in result["job_iteration_ends"]] == iterations
    assert len(result["iteration_ends"]) == max(iterations)
    assert result["iteration_ends"][-1] == max(ends[-1] for ends in result["job_iteration_ends"])
    for j, k in enumerate(iterations):
        check_invariants(*_job_view(graph, result, j), k)
    tol = 1e-9
    for _, xpu, vertex, _, start, end in result["vertices"]:
        if graph.nodes[vertex]["kind"] == "compute":
            assert end - start >= graph.nodes[vertex]["flops"] / platform.nodes[xpu]["fp32_flops"] - tol
