"""The executor's rules, on a fake kernel with closed-form durations (no SimGrid: see fake_backend.py).

Compute takes FLOPs / FLOP/s, so a vertex of H100.fp32_flops FLOP takes 1 s; transfers are alone on
their route (latency + size / bandwidth), so tiny collectives cost microseconds.
"""

import subprocess
import sys
from collections import defaultdict

import pytest

from hcsim.workload import add_comm, add_compute, add_dependency, new_workload, validate_workload
from cases import M, P, SECOND, TINY, T_B, T_F, one_f_one_b, pipeline_graph, run, wait_graph


def test_per_xpu_group_and_barrier_edges():
    """c waits per XPU for a (xpu0, 1 s) and a2 (xpu1, 2 s); the all-reduce r waits for its members, then d on xpu0
    waits for r's unit on xpu0 (wait xpu), e on xpu1 for the whole group of r (wait group), f on xpu2 for
    every unit of c (wait all): ends c 2|3, r ~3 on both, d 4, e 4, f 4."""
    g = new_workload("rules")
    add_compute(g, "a", xpus=["xpu0"], flops=SECOND, start=True)
    add_compute(g, "a2", xpus=["xpu1"], flops=2 * SECOND, start=True)
    add_compute(g, "c", xpus=["xpu0", "xpu1"], flops=SECOND)
    add_comm(g, "r", groups=[["xpu0", "xpu1"]], bytes=TINY, collective="all_reduce", algorithm="ring")
    add_compute(g, "d", xpus=["xpu0"], flops=SECOND)
    add_compute(g, "e", xpus=["xpu1"], flops=SECOND)
    add_compute(g, "f", xpus=["xpu2"], flops=SECOND)
    add_dependency(g, "a", "c")
    add_dependency(g, "a2", "c")
    add_dependency(g, "c", "r")
    add_dependency(g, "r", "d")
    add_dependency(g, "r", "e", wait="group")
    add_dependency(g, "c", "f", wait="all")
    _, spans, _ = run(g, 3, iterations=1)
    end = {(name, xpu): spans[1, xpu, name][1] for _, xpu, name in spans}
    assert end["c", "xpu0"] == pytest.approx(2) and end["c", "xpu1"] == pytest.approx(3)
    assert end["r", "xpu0"] == pytest.approx(3, abs=1e-5) and end["r", "xpu1"] == pytest.approx(3, abs=1e-5)
    assert end["d", "xpu0"] == pytest.approx(4, abs=1e-5) and end["e", "xpu1"] == pytest.approx(4, abs=1e-5)
    assert end["f", "xpu2"] == pytest.approx(4)


def test_group_edge_into_a_collective_waits_for_every_member():
    """A p2p pair after a compute on its sender only (wait group): the receiver's unit waits for the sender."""
    g = new_workload("p2p")
    add_compute(g, "send", xpus=["xpu0"], flops=SECOND, start=True)
    add_comm(g, "act", pairs=[("xpu0", "xpu1")], bytes=TINY, collective="p2p")
    add_compute(g, "recv", xpus=["xpu1"], flops=SECOND)
    add_dependency(g, "send", "act", wait="group")
    add_dependency(g, "act", "recv")
    _, spans, _ = run(g, 2, iterations=1)
    assert spans[1, "xpu1", "act"][0] == pytest.approx(1)  # the receive joins when the send is ready
    assert spans[1, "xpu1", "recv"][1] == pytest.approx(2, abs=1e-5)


def test_start_vertices_alone_start_and_back_edges_hold_from_iteration_two():
    """a (start) -> b -> back to a: iteration k of a waits for iteration k-1 of b; a vertex that is not a
    start vertex and waits for nothing is refused before the run."""
    g = new_workload("loop")
    add_compute(g, "a", xpus=["xpu0"], flops=SECOND, start=True)
    add_compute(g, "b", xpus=["xpu0"], flops=2 * SECOND)
    add_dependency(g, "a", "b")
    add_dependency(g, "b", "a", skip_first_iteration=True)
    ends, spans, _ = run(g, 1, iterations=3)
    assert ends == pytest.approx([3, 6, 9])
    assert spans[2, "xpu0", "a"][0] == pytest.approx(3)
    add_compute(g, "stray", xpus=["xpu0"], flops=SECOND)
    with pytest.raises(Exception, match=r"'stray': its units on 1 XPUs \(xpu0\) wait for nothing"):
        validate_workload(g)


def test_time_per_xpu_adds_up_to_the_iteration_time():
    """xpu1 computes 1 s, xpu0 3 s, then a tiny all-reduce: xpu1 idles ~2 s waiting for its peer."""
    ends, _, result = run(wait_graph(), 2, iterations=3)
    period = ends[-1] - ends[-2]
    comm = 2 * (100e-9 * 2) + 1e9 / 900e9  # ring of 2: 2 steps of S/2 over two 100 ns links at 900 GB/s
    assert period == pytest.approx(3 + comm, rel=1e-9)
    for xpu, expected in (("xpu0", {"compute_s": 3, "idle_s": 0}), ("xpu1", {"compute_s": 1, "idle_s": 2})):
        times = result.xpu_times[xpu]
        assert sum(times[k] for k in ("compute_s", "memory_stall_s", "comm_s", "idle_s")) == pytest.approx(period,
                                                                                                       rel=1e-12)
        assert times["compute_s"] == pytest.approx(expected["compute_s"], rel=1e-9)
        assert times["idle_s"] == pytest.approx(expected["idle_s"], abs=1e-9)
        assert times["comm_s"] == pytest.approx(comm, rel=1e-6)
        # r's unit on xpu1 waits (wait: group) for slow on xpu0: a dependency, so idle outside the collective
        assert times["idle_bubble_s"] == pytest.approx(expected["idle_s"], abs=1e-9)
        assert times["idle_peers_s"] == pytest.approx(0, abs=1e-9)
        assert times["comm_other_s"] == pytest.approx(times["comm_s"], rel=1e-12)  # a graph's own collective


# ---- a hand-built PP 2 x TP 2 x DP 2 graph, 4 micro-batches, 1F1B ----------------------------------------


@pytest.fixture(scope="module")
def pipeline_runs():
    layout, graph = pipeline_graph()
    return layout, graph, {fidelity: run(graph, 8, iterations=2, xpu_sampling=fidelity)
                           for fidelity in ("all", "representative")}


def test_each_xpu_runs_its_stage_in_1f1b_order(pipeline_runs):
    layout, _, runs = pipeline_runs
    _, spans, _ = runs["all"]
    for iteration in (1, 2):
        by_xpu = defaultdict(list)
        for (k, xpu, vertex), (start, _) in spans.items():
            if k == iteration and vertex.count(".") == 1 and vertex[0] == "s" and vertex[3] in "FB":
                by_xpu[xpu].append((start, vertex.split(".")[1]))
        for xpu in layout.xpus:
            assert [op for _, op in sorted(by_xpu[xpu])] == one_f_one_b(layout.stage(xpu))


def test_1f1b_iteration_time_is_its_closed_form_with_near_free_communication(pipeline_runs):
    _, _, runs = pipeline_runs
    ends, _, _ = runs["all"]
    assert ends[1] - ends[0] == pytest.approx((M + P - 1) * (T_F + T_B), rel=1e-5)


def test_a_second_iteration_receive_waits_for_its_sender(pipeline_runs):
    layout, _, runs = pipeline_runs
    _, spans, _ = runs["all"]
    for sender, receiver in zip(layout.stage_xpus(0), layout.stage_xpus(1)):
        sent = spans[2, sender, "s0.F0.tp"][1]
        assert spans[2, receiver, "act0"][1] >= sent
        assert spans[2, receiver, "s1.F0"][0] >= spans[2, receiver, "act0"][1]


def test_representative_xpus_give_the_same_times_as_all_xpus(pipeline_runs):
    _, _, runs = pipeline_runs
    (all_ends, all_spans, _), (rep_ends, rep_spans, result) = runs["all"], runs["representative"]
    assert len(set(result.representatives.values())) == 2  # one class per stage
    assert rep_ends == pytest.approx(all_ends, rel=1e-12)
    assert rep_spans.keys() == all_spans.keys()
    for key, (start, end) in all_spans.items():
        assert rep_spans[key] == pytest.approx((start, end), rel=1e-12, abs=1e-15)


def test_the_rules_run_without_importing_simgrid():
    code = ("import sys, pytest; code = pytest.main(['-q', '-p', 'no:cacheprovider', "
            "'tests/engine/test_executor_rules.py', '-k', 'not without_importing']); "
            "assert 'simgrid' not in sys.modules, 'simgrid was imported'; sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.parametrize("algorithm, collective", [("ring", "all_reduce"), ("coherent_ring", "all_reduce"),
                                                   ("ring", "all_gather"), ("halving_doubling", "all_reduce")])
def test_analytic_local_collectives_equal_the_simulated_flow_model_when_uncontended(algorithm, collective):
    """A collective in one server as one delay (local_collectives: analytic) takes what its flow phases take."""
    def graph():
        g = new_workload("tp")
        add_compute(g, "c", xpus=[f"xpu{i}" for i in range(8)], flops=SECOND, start=True)
        add_comm(g, "ar", groups=[[f"xpu{i}" for i in range(4)], [f"xpu{i}" for i in range(4, 8)]], bytes=3e8,
                 collective=collective, algorithm=algorithm)
        add_dependency(g, "c", "ar")
        add_dependency(g, "ar", "c", skip_first_iteration=True)
        return g

    runs = {mode: run(graph(), 8, iterations=2, collective_model="flow", local_collectives=mode)
            for mode in ("simulated", "analytic")}
    assert runs["analytic"][0] == pytest.approx(runs["simulated"][0], rel=1e-12)
    assert runs["analytic"][2].link_bytes == pytest.approx(runs["simulated"][2].link_bytes, rel=1e-12)
    assert runs["analytic"][2].activities < runs["simulated"][2].activities
