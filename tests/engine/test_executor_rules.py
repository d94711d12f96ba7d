"""The executor's rules, through the engine on SimGrid: hand-built graphs on one switch of H100 against
closed forms and the run's own invariants (cases.check_invariants).

Compute takes FLOPs / FLOP/s, so a vertex of H100.fp32_flops FLOP takes 1 s. A transfer alone on its route
takes α + size / B (α = 2 x 100 ns through the switch, B = 900 GB/s), so the tiny collectives cost
microseconds; a ring all-reduce of n ranks takes 2(n-1)·α + 2(n-1)/n·S/B when every rank starts at once
(each rank sends on its own uplink and receives on its own downlink: nothing is shared).
"""

from collections import defaultdict

import pytest

from hcsim.workload import add_comm, add_compute, add_dependency, new_workload, validate_workload
from cases import (A, B, M, P, SECOND, TINY, T_B, T_F, check_invariants, one_f_one_b, pipeline_graph, run,
                   wait_graph)


def ring_all_reduce(n, size):
    return 2 * (n - 1) * A + 2 * (n - 1) / n * size / B


def test_per_xpu_group_and_barrier_edges():
    """c waits per XPU for a (xpu0, 1 s) and a2 (xpu1, 2 s); the all-reduce r waits for its members, then d on xpu0
    waits for r's unit on xpu0 (wait xpu), e on xpu1 for the whole group of r (wait group), f on xpu2 for
    every unit of c (wait all). c ends at 2 on xpu0 and 3 on xpu1; at the step model xpu0 sets off its step 0
    at 2 and both finish their second step at R = 3 + 2(α + S/(2B)); d and e end at R + 1, f at 4."""
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
    _, spans, result = run(g, 3, iterations=1, collective_model="step")
    check_invariants(g, result, 1)
    end = {(name, xpu): spans[1, xpu, name][1] for _, xpu, name in spans}
    r = 3 + ring_all_reduce(2, TINY)
    assert spans[1, "xpu0", "r"][0] == pytest.approx(2, rel=1e-12)  # a rank sets off when it is ready
    expected = {("c", "xpu0"): 2, ("c", "xpu1"): 3, ("r", "xpu0"): r, ("r", "xpu1"): r, ("d", "xpu0"): r + 1,
                ("e", "xpu1"): r + 1, ("f", "xpu2"): 4}
    assert {key: end[key] for key in expected} == pytest.approx(expected, rel=1e-12)


def test_group_edge_into_a_collective_waits_for_every_member():
    """A p2p pair after a compute on its sender only (wait group): the receiver's unit waits for the sender,
    then the transfer takes α + S/B."""
    g = new_workload("p2p")
    add_compute(g, "send", xpus=["xpu0"], flops=SECOND, start=True)
    add_comm(g, "act", pairs=[("xpu0", "xpu1")], bytes=TINY, collective="p2p")
    add_compute(g, "recv", xpus=["xpu1"], flops=SECOND)
    add_dependency(g, "send", "act", wait="group")
    add_dependency(g, "act", "recv")
    _, spans, result = run(g, 2, iterations=1)
    check_invariants(g, result, 1)
    assert spans[1, "xpu1", "act"][0] == pytest.approx(1, rel=1e-12)  # the receive joins when the send is ready
    assert spans[1, "xpu1", "act"][1] == pytest.approx(1 + A + TINY / B, rel=1e-12)
    assert spans[1, "xpu1", "recv"][1] == pytest.approx(2 + A + TINY / B, rel=1e-12)


def test_start_vertices_alone_start_and_back_edges_hold_from_iteration_two():
    """a (start) -> b -> back to a: iteration k of a waits for iteration k-1 of b; a vertex that is not a
    start vertex and waits for nothing is refused before the run."""
    g = new_workload("loop")
    add_compute(g, "a", xpus=["xpu0"], flops=SECOND, start=True)
    add_compute(g, "b", xpus=["xpu0"], flops=2 * SECOND)
    add_dependency(g, "a", "b")
    add_dependency(g, "b", "a", skip_first_iteration=True)
    ends, spans, result = run(g, 1, iterations=3)
    check_invariants(g, result, 3)
    assert ends == pytest.approx([3, 6, 9], rel=1e-12)
    assert [spans[k, "xpu0", "a"][0] for k in (1, 2, 3)] == pytest.approx([0, 3, 6], rel=1e-12)
    add_compute(g, "stray", xpus=["xpu0"], flops=SECOND)
    with pytest.raises(Exception, match=r"'stray': its units on 1 XPUs \(xpu0\) wait for nothing"):
        validate_workload(g)


@pytest.mark.parametrize("model", ["step", "flow"])
def test_time_per_xpu_adds_up_to_the_iteration_time(model):
    """xpu1 computes 1 s, xpu0 3 s, then a 1 GB all-reduce that both join at 3 s (xpu1's unit waits, wait group,
    for xpu0's slow vertex): xpu1 idles 2 s, a dependency (bubble), not waiting inside the collective."""
    graph = wait_graph()
    ends, _, result = run(graph, 2, iterations=3, collective_model=model)
    check_invariants(graph, result, 3)
    comm = ring_all_reduce(2, 1e9)  # 2 steps of S/2 over two 100 ns links at 900 GB/s
    assert [b - a for a, b in zip([0.0, *ends], ends)] == pytest.approx([3 + comm] * 3, rel=1e-12)
    for xpu, expected in (("xpu0", {"compute_s": 3, "idle_s": 0}), ("xpu1", {"compute_s": 1, "idle_s": 2})):
        times = result["xpu_times"][xpu]
        assert times["compute_s"] == pytest.approx(expected["compute_s"], rel=1e-12)
        assert times["memory_stall_s"] == 0
        assert times["idle_s"] == pytest.approx(expected["idle_s"], abs=1e-9)
        assert times["comm_s"] == pytest.approx(comm, rel=1e-9)
        assert times["idle_bubble_s"] == pytest.approx(expected["idle_s"], abs=1e-9)
        assert times["idle_peers_s"] == pytest.approx(0, abs=1e-9)
        assert times["comm_other_s"] == pytest.approx(times["comm_s"], rel=1e-12)  # a graph's own collective


def test_a_collective_waits_inside_for_a_late_peer():
    """The same graph with xpu1's unit of r waiting for xpu1 alone (wait xpu): at the flow model the group
    starts when its last member is ready, so xpu1 waits 2 s for its peer inside the collective, and the
    breakdown calls it waiting for peers, not a bubble."""
    graph = wait_graph()
    graph.edges["slow", "r"]["wait"] = "xpu"
    ends, _, result = run(graph, 2, iterations=3, collective_model="flow")
    check_invariants(graph, result, 3)
    comm = ring_all_reduce(2, 1e9)
    assert ends == pytest.approx([k * (3 + comm) for k in (1, 2, 3)], rel=1e-12)
    times = result["xpu_times"]["xpu1"]
    assert times["compute_s"] == pytest.approx(1, rel=1e-12)
    assert times["idle_s"] == pytest.approx(2, rel=1e-9)
    assert times["idle_peers_s"] == pytest.approx(2, rel=1e-9) and times["idle_bubble_s"] == pytest.approx(0, abs=1e-9)
    assert result["xpu_times"]["xpu0"]["idle_s"] == pytest.approx(0, abs=1e-9)


# ---- a hand-built PP 2 x TP 2 x DP 2 graph, 4 micro-batches, 1F1B ----------------------------------------


@pytest.fixture(scope="module", params=["step", "flow"])
def pipeline_run(request):
    layout, graph = pipeline_graph()
    return layout, graph, run(graph, 8, iterations=2, collective_model=request.param)


def test_the_pipeline_keeps_the_run_invariants(pipeline_run):
    _, graph, (_, _, result) = pipeline_run
    check_invariants(graph, result, 2)


def test_each_xpu_runs_its_stage_in_1f1b_order(pipeline_run):
    layout, _, (_, spans, _) = pipeline_run
    for iteration in (1, 2):
        by_xpu = defaultdict(list)
        for (k, xpu, vertex), (start, _) in spans.items():
            if k == iteration and vertex.count(".") == 1 and vertex[0] == "s" and vertex[3] in "FB":
                by_xpu[xpu].append((start, vertex.split(".")[1]))
        for xpu in layout.xpus:
            assert [op for _, op in sorted(by_xpu[xpu])] == one_f_one_b(layout.stage(xpu))


def test_1f1b_iteration_time_is_its_closed_form_with_near_free_communication(pipeline_run):
    """(M + P - 1)(T_F + T_B) of compute on the critical path, plus its tiny transfers: each all-reduce of
    8 bytes over 2 ranks or p2p send costs at most 2α + S/B (0.4 µs); fewer than 4(M + P) of them lie on it."""
    _, _, (ends, _, _) = pipeline_run
    period, compute = ends[1] - ends[0], (M + P - 1) * (T_F + T_B)
    assert compute <= period <= compute + 4 * (M + P) * ring_all_reduce(2, TINY)


def test_a_second_iteration_receive_waits_for_its_sender(pipeline_run):
    layout, _, (_, spans, _) = pipeline_run
    for sender, receiver in zip(layout.stage_xpus(0), layout.stage_xpus(1)):
        sent = spans[2, sender, "s0.F0.tp"][1]
        assert spans[2, receiver, "act0"][1] >= sent + A  # the activations cross the switch after they are sent
        assert spans[2, receiver, "s1.F0"][0] >= spans[2, receiver, "act0"][1]


CLOSED_FORMS = {  # one pass over 4 ranks of S bytes on one switch (tests/engine/test_collectives.py)
    ("ring", "all_reduce"): lambda s: ring_all_reduce(4, s),
    ("coherent_ring", "all_reduce"): lambda s: 3 * A + 3 / 4 * s / B,
    ("ring", "all_gather"): lambda s: 3 * A + 3 / 4 * s / B,
    ("halving_doubling", "all_reduce"): lambda s: 4 * A + 2 * 3 / 4 * s / B,
}


@pytest.mark.parametrize("algorithm, collective", sorted(CLOSED_FORMS))
def test_analytic_local_collectives_equal_the_simulated_flow_model_when_uncontended(algorithm, collective):
    """A collective in one server as one delay (local_collectives: analytic) takes what its flow phases take:
    two groups of 4 on one switch (no link shared) after 1 s of compute, both modes at the closed form."""
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
    period = 1 + CLOSED_FORMS[algorithm, collective](3e8)
    for mode, (ends, _, result) in runs.items():
        assert ends == pytest.approx([period, 2 * period], rel=1e-9), mode
        check_invariants(graph(), result, 2)
    assert runs["analytic"][0] == pytest.approx(runs["simulated"][0], rel=1e-12)
    assert runs["analytic"][2]["link_bytes"] == pytest.approx(runs["simulated"][2]["link_bytes"], rel=1e-12)
    assert runs["analytic"][2]["activities"] < runs["simulated"][2]["activities"]
