"""Collectives through a shared region on one memory device (pooled_memory): every rank stores into the region and
loads from it behind flag barriers, over the device's one port. Simulated times against the closed forms, 1 kB to
1 GB, at the step and the flow model; the device's traffic; more port bandwidth never slower; clear errors where no
memory device is shared."""

import math

import pytest

from hcsim.engine.api import RunOptions
from hcsim.engine.collectives import get_algorithm
from hcsim.errors import ConfigError
from hcsim.platform import build_platform, load_platform_spec, xpus
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import add_comm, add_compute, new_workload
from cases import B, LINK_LAT, _durations, pooled_switch  # tests/engine is on sys.path

SIZES = (1.2e3, 1.2e6, 1.2e9)  # every shard whole bytes at every n tested (the core truncates a transfer to bytes)
PORT_LATENCY = 250e-9  # the device's port: a route rank -> region is LINK_LAT + this


def pooled_memory(collective, n, s, port_bandwidth):
    """The closed form on one switch: a pass is four accesses of α (store, flag, poll, load), the bytes at
    B' = min(B, B_M/n), the device's port shared by the n ranks."""
    if n == 1:
        return 0.0
    alpha, rate = LINK_LAT + PORT_LATENCY, min(B, port_bandwidth / n)
    return {"all_reduce": 8 * alpha + (3 * n - 2) / n * s / rate,
            "reduce_scatter": 4 * alpha + 2 * (n - 1) / n * s / rate,
            "all_gather": 4 * alpha + s / rate}[collective]


@pytest.mark.parametrize("fidelity", ["step", "flow"])
@pytest.mark.parametrize("port", [256e9, 8e12])  # the port binds; the ranks' links bind (up to 8 ranks)
@pytest.mark.parametrize("n", [2, 3, 8, 16])
def test_pooled_memory_collectives_match_their_closed_forms(n, port, fidelity):
    """abs_tol 50 ps: SimGrid settles flows of a few dozen bytes within its precision, as for coherent_memory."""
    items = [(f"{c}.{s:g}", c, "pooled_memory", s) for c in ("all_reduce", "reduce_scatter", "all_gather")
             for s in SIZES]
    measured = _durations(pooled_switch(n, port, PORT_LATENCY, n + 1), [f"xpu{i}" for i in range(n)], items, f"xpu{n}", fidelity)
    wrong = [f"{name}: {measured[name]!r} s, closed form {pooled_memory(c, n, s, port)!r} s"
             for name, c, _, s in items
             if not math.isclose(measured[name], pooled_memory(c, n, s, port), rel_tol=1e-6, abs_tol=5e-11)]
    assert not wrong, "\n".join(wrong)


def test_schedule_stores_into_the_region_and_loads_from_it():
    n, size = 8, 1.6e9
    algorithm = get_algorithm("all_reduce", "pooled_memory", n, size)
    assert algorithm.endpoints == n + 1 and len(algorithm.flow_phases()) == 8 == algorithm.steps(0)
    flows = algorithm.flows()
    assert set(flows) == {(r, n) for r in range(n)} | {(n, r) for r in range(n)}  # no rank talks to a rank
    for r in range(n):
        assert math.isclose(flows[r, n], size)  # (n-1)/n·S of shards, then its reduced S/n
        assert math.isclose(flows[n, r], 2 * (n - 1) / n * size)  # its shard's n-1 parts, then n-1 reduced shards
    assert get_algorithm("all_gather", "pooled_memory", 1, size).flow_phases() == []  # one rank: nothing


def _cxl_pool_run(n, size, **overrides):
    platform = build_platform(load_platform_spec("cxl-pool", overrides), xpus=n)
    graph = new_workload("pooled")
    add_comm(graph, "c", xpus=xpus(platform)[:n], bytes=size, collective="all_reduce", algorithm="pooled_memory",
             start=True)
    return simulate_graphs(platform, graph, RunOptions(collective_model="flow"))


def test_on_a_cxl_pool_the_traffic_crosses_the_device_port_once_each_way():
    """n·S into the device and 2(n-1)·S out of it (the flows above), on the pool's own link, nowhere else."""
    n, size = 16, 1e8
    result = _cxl_pool_run(n, size)
    links = result["link_bytes"]
    assert math.isclose(links[("pool0.sw", "pool0.mem")], n * size)
    assert math.isclose(links[("pool0.mem", "pool0.sw")], 2 * (n - 1) * size)
    assert not any(u.startswith("ib") or v.startswith("ib") for u, v in links)  # no InfiniBand: hosts meet in the pool


@pytest.mark.parametrize("size", [1e3, 1e6, 1e9])
def test_more_port_bandwidth_is_never_slower_and_more_latency_never_faster(size):
    by_bandwidth = [_cxl_pool_run(16, size, **{"links.cxl.bandwidth": f"{b}GB/s"})["iteration_ends"][0]
                    for b in (32, 64, 128, 256)]
    assert all(later <= earlier for earlier, later in zip(by_bandwidth, by_bandwidth[1:])), by_bandwidth
    by_latency = [_cxl_pool_run(16, size, **{"links.cxl.latency": f"{t}ns"})["iteration_ends"][0] for t in (125, 250)]
    assert by_latency[0] < by_latency[1]


@pytest.mark.parametrize("platform, problem", [
    ("gh200", r"the group's 4 XPUs do not share one memory device \(their extended memories: xpu0: n0\.dram0, xpu1: n0\.dram1"),
    ("dgx-h100", r"the platform is not coherent"),
])
def test_no_shared_memory_device_is_one_clear_error(platform, problem):
    graph = build_platform(load_platform_spec(platform, {}), xpus=4)
    workload = new_workload("pooled")
    add_comm(workload, "c", xpus=xpus(graph)[:4], bytes=1e6, collective="all_reduce", algorithm="pooled_memory",
             start=True)
    with pytest.raises(ConfigError, match=r"algorithm 'pooled_memory': " + problem + r".*valid: a group whose XPUs"):
        simulate_graphs(graph, workload, RunOptions())


@pytest.mark.parametrize("n", [16, 64])
def test_flow_is_within_one_percent_of_step_on_a_cxl_pool(n):
    """On cxl-pool's links of several kinds (PCIe to the host CPU, its CXL ports, the device's heads), the two
    models of every pooled collective agree as the other algorithms' do on the paper topologies."""
    platform = build_platform(load_platform_spec("cxl-pool", {}), xpus=n + 8)  # a host more: xpu{n} the barriers
    group = xpus(platform)[:n]
    items = [(f"{c}.{s:g}", c, "pooled_memory", s) for c in ("all_reduce", "reduce_scatter", "all_gather")
             for s in (1e6, 1e8, 1e9)]
    step = _durations(platform, group, items, f"xpu{n}", "step")
    flow = _durations(platform, group, items, f"xpu{n}", "flow")
    wrong = [f"{name}: step {step[name]!r} s, flow {flow[name]!r} s" for name, *_ in items
             if not math.isclose(step[name], flow[name], rel_tol=0.01)]
    assert not wrong, "\n".join(wrong)


def test_the_region_s_traffic_shares_the_device_port_with_offload_reads():
    """A GPU outside the group reads its spilled data in place from the same device the whole time: the loads of
    every pass share the device's port with that read, n + 1 flows alike (the same route latency, so max-min gives
    each B_M/(n+1)); the stores go the other way and do not meet it (full duplex):
    8α + S/(B_M/n) + 2(n-1)/n·S/(B_M/(n+1)), against 8α + (3n-2)/n·S/(B_M/n) alone."""
    n, size, port = 4, 1.2e9, 256e9
    platform = pooled_switch(n + 1, port, PORT_LATENCY)  # xpu{n} spills there too
    graph = new_workload("beside-offload")
    add_comm(graph, "ar", xpus=[f"xpu{i}" for i in range(n)], bytes=size, collective="all_reduce",
             algorithm="pooled_memory", start=True)
    add_compute(graph, "read", xpus=[f"xpu{n}"], flops=0.0, memory_bytes=1e12, start=True)  # outlasts the all-reduce
    graph.nodes["read"]["spilled_xpus"] = frozenset({f"xpu{n}"})
    result = simulate_graphs(platform, graph, RunOptions(collective_model="flow", trace_xpus=frozenset({"xpu0"})))
    seconds = {name: end - start for _, xpu, name, _, start, end in result["vertices"] if name == "ar"}["ar"]
    alpha = LINK_LAT + PORT_LATENCY
    shared = 8 * alpha + size / (port / n) + 2 * (n - 1) / n * size / (port / (n + 1))
    assert math.isclose(seconds, shared, rel_tol=1e-6)
    assert seconds > pooled_memory("all_reduce", n, size, port)


def test_on_a_superchip_the_region_is_the_grace_memory_its_two_gpus_share():
    """GB200: two Blackwells share one Grace's LPDDR5X over NVLink-C2C: n·S into that memory, 2(n-1)·S out of it,
    and nothing over NVLink."""
    n, size = 2, 1e8
    platform = build_platform(load_platform_spec("gb200-nvl72", {}), xpus=n)
    graph = new_workload("superchip")
    add_comm(graph, "c", xpus=xpus(platform)[:n], bytes=size, collective="all_reduce", algorithm="pooled_memory",
             start=True)
    links = simulate_graphs(platform, graph, RunOptions(collective_model="step"))["link_bytes"]
    assert math.isclose(links[("n0.cpu0", "n0.dram0")], n * size)
    assert math.isclose(links[("n0.dram0", "n0.cpu0")], 2 * (n - 1) * size)
    assert not any(platform.edges[link]["kind"] == "xpu_link" for link in links)
