"""The engine against the closed forms of its own model.

Each case runs in a fresh process (one SimGrid Engine per process, ever).
"""

import math

import pytest

from hcsim.engine.api import RunOptions
from hcsim.platform.builders import single_switch
from hcsim.platform.devices import builtin_catalog
from hcsim.platform.topology import add_link, add_memory
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import add_comm, add_compute, add_dependency, new_workload, skeleton_graph

H100 = builtin_catalog()["H100"]
LINK_BW, LINK_LAT = 900e9, 100e-9  # single_switch defaults (Table 5 XPU_link)
ALPHA = 2 * LINK_LAT  # XPU -> switch -> XPU


def close(actual, expected, rel=1e-6):
    return math.isclose(actual, expected, rel_tol=rel)


def test_compute_alone_is_flops_over_flops_per_second():
    graph = new_workload("one")
    add_compute(graph, "c", xpus=["xpu0"], flops=3e12, start=True)
    result = simulate_graphs(single_switch(1, H100), graph)
    assert close(result["iteration_ends"][0], 3e12 / H100.fp32_flops, 1e-9)


def test_one_transfer_costs_latency_plus_size_over_bandwidth():
    graph = new_workload("p2p")
    add_comm(graph, "send", xpus=["xpu0", "xpu1"], bytes=5e8, collective="p2p", start=True)
    result = simulate_graphs(single_switch(2, H100), graph)
    assert close(result["iteration_ends"][0], ALPHA + 5e8 / LINK_BW, 1e-9)


def test_two_transfers_sharing_a_link_each_get_half():
    graph = new_workload("incast")
    for src in ("xpu0", "xpu2"):
        add_comm(graph, f"from-{src}", xpus=[src, "xpu1"], bytes=5e8, collective="p2p", start=True)
    result = simulate_graphs(single_switch(3, H100), graph, RunOptions(trace_xpus=frozenset({"xpu0", "xpu2"})))
    ends = [end for *_, end in result["vertices"]]
    assert len(ends) == 2
    for end in ends:
        assert close(end, ALPHA + 5e8 / (LINK_BW / 2), 1e-9)


@pytest.mark.parametrize("n", [2, 3, 8, 16])
@pytest.mark.parametrize("size", [1e6, 3.3e8])
@pytest.mark.parametrize("algorithm,steps", [("ring", lambda n: 2 * (n - 1)), ("coherent_ring", lambda n: n - 1)])
@pytest.mark.parametrize("fidelity", ["step", "flow"])
def test_skeleton_ring_all_reduce_matches_closed_form(n, size, algorithm, steps, fidelity):
    xpus = [f"xpu{i}" for i in range(n)]
    flops = 1e12
    result = simulate_graphs(single_switch(n, H100), skeleton_graph(xpus, flops, size, algorithm),
                             RunOptions(collective_model=fidelity))
    expected = flops / H100.fp32_flops + steps(n) * ALPHA + steps(n) / n * size / LINK_BW
    assert close(result["iteration_ends"][0], expected)


def _spilled_platform(ext_bw, ext_lat):
    graph = single_switch(1, H100)
    add_memory(graph, "ext0", capacity=math.inf, role="cxl_type3", owner="xpu0")
    add_link(graph, "ext0", "xswitch", bandwidth=ext_bw, latency=ext_lat, kind="cxl")
    graph.nodes["xpu0"]["extended_memory"] = "ext0"
    return graph


@pytest.mark.parametrize("flops", [1e11, 5e13])  # memory-bound and compute-bound
@pytest.mark.parametrize("form", ["local", "coherent", "copy"])
def test_memory_forms(flops, form):
    ext_bw, ext_lat, size = 128e9, 200e-9, 4e9
    graph = new_workload("layer")
    add_compute(graph, "layer", xpus=["xpu0"], flops=flops, memory_bytes=size, start=True)
    if form != "local":
        graph.nodes["layer"]["spilled_xpus"] = frozenset({"xpu0"})
    result = simulate_graphs(_spilled_platform(ext_bw, ext_lat), graph, RunOptions(coherent=form != "copy"))
    compute = flops / H100.fp32_flops
    local = 100e-9 + size / H100.memory_bandwidth  # single_switch's HBM latency default
    remote = ext_lat + LINK_LAT + size / ext_bw
    expected = {"local": max(compute, local), "coherent": max(compute, remote), "copy": remote + max(compute, local)}
    assert close(result["iteration_ends"][0], expected[form], 1e-9)


def test_iterations_follow_a_hand_computed_timeline():
    """A (compute) -> all-reduce -> B (compute) -> back edge to A, three iterations on two XPUs."""
    xpus = ["xpu0", "xpu1"]
    graph = new_workload("loop")
    add_compute(graph, "A", xpus=xpus, flops=2e12, start=True)
    add_comm(graph, "AR", xpus=xpus, bytes=1e9, collective="all_reduce", algorithm="ring")
    add_compute(graph, "B", xpus=xpus, flops=1e12)
    add_dependency(graph, "A", "AR")
    add_dependency(graph, "AR", "B")
    add_dependency(graph, "B", "A", skip_first_iteration=True)
    result = simulate_graphs(single_switch(2, H100), graph,
                             RunOptions(iterations=3, trace_xpus=frozenset(xpus)))
    t_a, t_b = 2e12 / H100.fp32_flops, 1e12 / H100.fp32_flops
    t_ar = 2 * ALPHA + 1e9 / LINK_BW  # ring, n = 2: 2 steps of S/2
    period = t_a + t_ar + t_b
    for k, end in enumerate(result["iteration_ends"], start=1):
        assert close(end, k * period, 1e-9)
    starts = {(run, xpu, name): start for run, xpu, name, _, start, _ in result["vertices"]}
    assert len(result["vertices"]) == 3 * 3 * 2  # one event per vertex run
    for k in (1, 2, 3):
        assert close(starts[k, "xpu1", "A"], (k - 1) * period, 1e-9)
        assert close(starts[k, "xpu0", "B"], (k - 1) * period + t_a + t_ar, 1e-9)


def test_dependencies_follow_shared_xpus_barriers_and_partial_overlaps():
    """Compute units of 1 s, every XPU busy with one vertex at a time. c on xpu0, xpu1 after a (xpu0, 1 s)
    and b (xpu1, 2 s): each instance waits for its own XPU's predecessor (ends at 2 and 3). d on xpu2 after b
    (wait "all": a barrier on every b instance) ends at 3. g, a start vertex on xpu4, xpu5, after f (xpu3,
    xpu4): g's xpu4 instance waits for f's, its xpu5 instance waits for nothing (ends at 2 and 1)."""
    unit = H100.fp32_flops
    graph = new_workload("deps")
    add_compute(graph, "a", xpus=["xpu0"], flops=unit, start=True)
    add_compute(graph, "b", xpus=["xpu1"], flops=2 * unit, start=True)
    add_compute(graph, "c", xpus=["xpu0", "xpu1"], flops=unit)
    add_compute(graph, "d", xpus=["xpu2"], flops=unit)
    add_compute(graph, "f", xpus=["xpu3", "xpu4"], flops=unit, start=True)
    add_compute(graph, "g", xpus=["xpu4", "xpu5"], flops=unit, start=True)
    for before, after in (("a", "c"), ("b", "c"), ("f", "g")):
        add_dependency(graph, before, after)
    add_dependency(graph, "b", "d", wait="all")
    xpus = frozenset(f"xpu{i}" for i in range(6))
    result = simulate_graphs(single_switch(6, H100), graph, RunOptions(trace_xpus=xpus, iterations=1))
    ends = {(name, xpu): end for _, xpu, name, _, _, end in result["vertices"]}
    expected = {("c", "xpu0"): 2, ("c", "xpu1"): 3, ("d", "xpu2"): 3, ("g", "xpu4"): 2, ("g", "xpu5"): 1}
    for key, units in expected.items():
        assert close(ends[key], units), (key, ends[key])


def test_link_loads_count_every_byte_on_its_route():
    """One p2p transfer of S loads the sender's uplink and the receiver's downlink with S, nothing else; a
    compute vertex's analytic HBM read counts too, though it is folded into the compute time."""
    graph = new_workload("p2p")
    add_comm(graph, "send", xpus=["xpu0", "xpu1"], bytes=5e8, collective="p2p", start=True)
    add_compute(graph, "read", xpus=["xpu2"], flops=1e12, memory_bytes=3e9, start=True)
    result = simulate_graphs(single_switch(3, H100), graph, RunOptions(iterations=1))
    assert result["link_bytes"] == {("xpu0", "xswitch"): 5e8, ("xswitch", "xpu1"): 5e8, ("xpu2.hbm", "xpu2"): 3e9}


@pytest.mark.parametrize("fidelity", ["step", "flow"])
def test_ring_all_reduce_loads_every_xpu_link_with_its_closed_form(fidelity):
    n, size = 8, 3.3e8
    xpus = [f"xpu{i}" for i in range(n)]
    result = simulate_graphs(single_switch(n, H100), skeleton_graph(xpus, 0.0, size, "ring"),
                             RunOptions(collective_model=fidelity, iterations=1))
    loads = result["link_bytes"]
    for x in xpus:
        for link in ((x, "xswitch"), ("xswitch", x)):
            assert close(loads[link], 2 * (n - 1) / n * size, 1e-12), (link, loads[link])


@pytest.mark.parametrize("algorithm", ["ring", "halving_doubling"])
def test_an_analytic_collective_in_one_server_equals_the_simulated_one_on_simgrid(algorithm):
    """local_collectives: analytic replaces the transfers by their closed form: equal when uncontended."""
    xpus = [f"xpu{i}" for i in range(8)]
    graph = skeleton_graph(xpus, 1e12, 3.3e8, algorithm)
    ends = {mode: simulate_graphs(single_switch(8, H100), graph,
                                  RunOptions(collective_model="flow", local_collectives=mode))["iteration_ends"]
            for mode in ("simulated", "analytic")}
    assert close(ends["analytic"][0], ends["simulated"][0], 1e-9)


def test_a_measured_duration_replaces_flops_on_any_device():
    """A vertex with `duration` takes that long on an H100 and on a V100 alike (its flops ignored), beside its
    HBM read (the longer of the two); its compute time in `busy` and its trace span are the duration."""
    from hcsim.platform.topology import add_link, add_xpu

    catalog = builtin_catalog()
    platform = single_switch(1, H100)
    add_xpu(platform, "v100", catalog["V100"], hbm_latency=100e-9, rack=0, server="s0")
    add_link(platform, "v100", "xswitch", bandwidth=LINK_BW, latency=LINK_LAT, kind="xpu_link")
    duration, size = 0.25, 4e9  # the V100's HBM read (4.4 ms) hides behind it
    graph = new_workload("measured")
    add_compute(graph, "kernel", xpus=["xpu0", "v100"], flops=1e15, memory_bytes=size, duration=duration, start=True)
    add_compute(graph, "short", xpus=["v100"], flops=0.0, memory_bytes=size, duration=1e-3)  # memory-bound
    add_dependency(graph, "kernel", "short")
    result = simulate_graphs(platform, graph, RunOptions(trace_xpus=frozenset({"xpu0", "v100"})))
    spans = {(name, xpu): end - start for _, xpu, name, _, start, end in result["vertices"]}
    assert close(spans["kernel", "xpu0"], duration, 1e-9) and close(spans["kernel", "v100"], duration, 1e-9)
    assert close(spans["short", "v100"], 100e-9 + size / catalog["V100"].memory_bandwidth, 1e-9)
    assert close(result["busy"]["xpu0"][0], duration, 1e-9)
    assert close(result["busy"]["v100"][0], duration + 1e-3, 1e-9)
