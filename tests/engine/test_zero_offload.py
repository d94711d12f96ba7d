"""ZeRO-3's prefetch and offload in time: closed forms through the engine on SimGrid.

A device of 1 TFLOP/s with 1e20 B/s memory makes every compute vertex compute-bound; with ZeRO-3 over two
ranks and links fast enough that every layer's all-gather (α + S/(2B)), even sharing its links with the
backward pass's reduce-scatter (twice as long), is shorter than the layer before it, only the first gather is
exposed, so an iteration is that gather, every compute vertex one after another, the gradient reduce-scatter
and the optimizer step.
"""

import pytest

from hcsim.engine.api import RunOptions
from hcsim.platform.builders import single_switch
from hcsim.platform.devices import Device
from hcsim.platform.routes import route_bandwidth, route_latency
from hcsim.run.prepare import prepare
from hcsim.run.scenario import load_scenario
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import load_workload_spec, validate_workload
from hcsim.workload.hybrid import Parallelism, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout
from cases import ZERO_SHAPE as SHAPE  # tests/engine is on sys.path

FAST = Device(name="fast", fp32_flops=1e12, fp16_flops=1e12, memory=1e15, memory_bandwidth=1e20)


@pytest.mark.parametrize("bandwidth", [1e11, 1e12])
def test_zero3_exposes_only_the_first_gather(bandwidth):
    n = 2
    platform = single_switch(n, FAST, xpu_link_bandwidth=bandwidth, xpu_link_latency=1e-9, hbm_latency=1e-15)
    xpus = [f"xpu{i}" for i in range(n)]
    spec = load_workload_spec("gpt3-175b", SHAPE)
    graph = build_hybrid_graph(spec, Parallelism(dp=n, global_batch=n, zero=3), ParallelLayout(xpus, {"dp": n}))
    validate_workload(graph, xpus)
    route = ["xpu0", "xswitch", "xpu1"]
    alpha, B = route_latency(platform, route), route_bandwidth(platform, route)
    assert (alpha, B) == (2e-9, bandwidth)

    def ring(size):  # (n-1)(α + S/(nB))
        return (n - 1) * (alpha + size / (n * B))

    gathers = [d for _, d in graph.nodes(data=True) if d.get("phase") == "zero"]
    computes = [d for _, d in graph.nodes(data=True) if d["kind"] == "compute"]
    serial = sum(d["flops"] for d in computes) / 1e12
    grads = graph.nodes["s0.c0.grads"]
    first = next(d for d in gathers if d["start"])
    assert 2 * max(ring(d["bytes"]) for d in gathers) < min(d["flops"] for d in computes) / 1e12  # all hideable
    ends = simulate_graphs(platform, graph, RunOptions(iterations=2))["iteration_ends"]
    expected = ring(first["bytes"]) + serial + ring(grads["bytes"])
    assert ends[1] - ends[0] == pytest.approx(expected, rel=1e-9)


TINY = {"model.decoders": 4, "model.hidden": 256, "model.heads": 4, "model.ffn": 1024, "model.sequence": 128,
        "model.vocabulary": 1000, "training.precision": "fp16"}


def offload_run(platform: str, offload: str, coherent: bool, cpu_flops: str = "1GFLOPS"):
    settings = {"platform": platform, "xpus": 8, "workload": "gpt3-175b", "workload_overrides": TINY,
                "zero": 2, "offload": offload, "coherent": coherent,
                "platform_overrides": {"server.cpu_flops": cpu_flops}}
    prepared = prepare(load_scenario(None, settings))
    options = RunOptions(iterations=2, coherent=prepared.coherent, trace_xpus=frozenset({"xpu0"}))
    return prepared, simulate_graphs(prepared.platform, prepared.workload, options)


def vertex_time(result, name, run=2):
    (start, end), = [(s, e) for r, x, n, _, s, e in result["vertices"] if (r, x, n) == (run, "xpu0", name)]
    return end - start


def test_cpu_offload_steps_on_the_shared_cpu_and_moves_shards_over_pcie():
    """ZeRO-Offload on the traditional topology: the 4 XPUs under a CPU step at once on it (4 x FLOPs / its
    FLOP/s when compute-bound), the gradient shard goes out and the weight shard comes back over the XPU's
    PCIe link (the server's ring collectives use the XPU switch)."""
    prepared, result = offload_run("paper-traditional", "cpu", False)
    graph = prepared.workload
    opt = graph.nodes["s0.optimizer"]
    assert vertex_time(result, "s0.optimizer") == pytest.approx(4 * opt["flops"] / 1e9, rel=1e-6)
    out = graph.nodes["s0.c0.offload.grads"]["memory_bytes"]
    into = graph.nodes["s0.offload.weights"]["memory_bytes"]
    links = result["link_bytes"]
    assert links["xpu0", "r0s0.pcie0"] == pytest.approx(2 * out, rel=1e-12)  # two iterations
    assert links["r0s0.pcie0", "xpu0"] == pytest.approx(2 * into, rel=1e-12)
    # the CPU reads the state of its 4 XPUs' shards, and their weights leave DRAM for the XPUs
    assert links["r0s0.dram0", "r0s0.cpu0"] == pytest.approx(2 * 4 * (opt["memory_bytes"] + into), rel=1e-12)
    assert links["r0s0.cpu0", "r0s0.dram0"] == pytest.approx(2 * 4 * out, rel=1e-12)


def test_cxl_offload_reads_the_state_in_place_beside_the_step():
    """Coherent offload (paper Fig. 3c): the step takes max(FLOPs / FLOP/s, α + bytes / B) over the XPU's
    private CXL path, and the state's bytes cross the CXL links, not PCIe."""
    prepared, result = offload_run("paper-cxl", "cxl", True)
    graph, platform = prepared.workload, prepared.platform
    opt = graph.nodes["s0.optimizer"]
    route = [n for n in __import__("networkx").shortest_path(platform, "xpu0.cxl", "xpu0")]
    from hcsim.platform.devices import peak_flops

    compute = opt["flops"] / peak_flops(platform.nodes["xpu0"], "fp16")
    access = route_latency(platform, route) + opt["memory_bytes"] / route_bandwidth(platform, route)
    assert vertex_time(result, "s0.optimizer") == pytest.approx(max(compute, access), rel=1e-6)
    assert result["link_bytes"]["xpu0.cxl", route[1]] == pytest.approx(2 * opt["memory_bytes"], rel=1e-12)
    assert ("r0s0.pcie0", "xpu0") not in result["link_bytes"]


@pytest.mark.parametrize("settings,message", [
    ({"platform": "paper-traditional", "offload": "cxl"}, "offload: cxl: needs a coherent platform"),
    ({"offload": "cpu", "platform_overrides": {"server.cpu_flops": "0FLOPS"}}, "has no FLOP/s"),
    ({"zero": 7}, "zero"),
    ({"offload_state": ["weights"]}, "offload_state"),
])
def test_offload_to_a_memory_the_platform_lacks_is_refused(settings, message):
    from hcsim.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        prepare(load_scenario(None, {"xpus": 8, "workload": "gpt3-175b", "workload_overrides": TINY, **settings}))
