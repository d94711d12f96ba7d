"""Context parallelism (hcsim.workload.context, cp): closed forms per rank, and the ring's exposed exchange."""

import math

import pytest

from hcsim.engine.api import RunOptions
from hcsim.errors import ConfigError
from hcsim.platform.builders import single_switch
from hcsim.platform.devices import builtin_catalog
from hcsim.run.simulation import simulate_graphs
from hcsim.workload.context import attention_flops_per_rank, kv_block_bytes, ring_exposed_time
from hcsim.workload.hybrid import Parallelism, block_costs, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.memory import stage_memory
from hcsim.workload.model import ModelShape
from hcsim.workload.spec import WorkloadSpec

SHAPE = ModelShape(name="llama", decoders=1, hidden=1024, heads=16, kv_heads=4, ffn=2816, mlp="swiglu",
                   norm="rmsnorm", dropout=False, sequence=8192, vocabulary=0, positions="rope")
SPEC = WorkloadSpec(name="llama", model=SHAPE, precision="bf16", attention="flash", granularity="layer")


@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_a_cp_rank_does_a_cp_th_of_the_causal_attention_and_holds_a_cp_th_of_the_tokens(cp):
    attn, mlp = block_costs(SPEC, 2, 2, cp=cp)
    assert attn.core_flops == pytest.approx(attention_flops_per_rank(SHAPE, 2, 2, cp), rel=1e-12)
    whole_attn, whole_mlp = block_costs(SPEC, 2, 2)
    assert mlp.fwd_flops == pytest.approx(whole_mlp.fwd_flops / cp, rel=1e-12)  # the MLP on s/cp tokens
    assert attn.fwd_flops - attn.core_flops == pytest.approx((whole_attn.fwd_flops - whole_attn.core_flops) / cp)
    memory = stage_memory(SHAPE, layers=1, first=False, last=False, in_flight=1, micro_batch=2, tp=2,
                          sequence=SHAPE.sequence // cp, attention="flash")
    whole = stage_memory(SHAPE, layers=1, first=False, last=False, in_flight=1, micro_batch=2, tp=2, attention="flash")
    assert memory.activations == pytest.approx(whole.activations / cp, rel=1e-12)


@pytest.mark.parametrize("algorithm", ["ring", "all_to_all"])
def test_the_exchange_moves_the_kv_blocks_or_the_heads(algorithm):
    cp = 4
    par = Parallelism(cp=cp, micro_batch=1, global_batch=1, cp_algorithm=algorithm)
    graph = build_hybrid_graph(SPEC, par, ParallelLayout([f"x{i}" for i in range(cp)], {"cp": cp}))
    exchanges = {n: d for n, d in graph.nodes(data=True) if d.get("phase") == "cp"}
    block = kv_block_bytes(SHAPE, 1, 1, cp, 2.0)
    assert block == 2 * SHAPE.sequence / cp * SHAPE.kv_hidden * 2
    if algorithm == "ring":  # forward: each rank's K, V around the ring; backward: and their gradients
        sizes = sorted(d["bytes"] for d in exchanges.values())
        assert sizes == [cp * block, 2 * cp * block] and {d["collective"] for d in exchanges.values()} == {"all_gather"}
    else:
        qkv = SHAPE.sequence / cp * (SHAPE.hidden + 2 * SHAPE.kv_hidden) * 2
        out = SHAPE.sequence / cp * SHAPE.hidden * 2
        assert sorted(d["bytes"] for d in exchanges.values()) == sorted([qkv, out, out, qkv])
        assert {d["collective"] for d in exchanges.values()} == {"all_to_all"}


@pytest.mark.parametrize("bandwidth", [2e9, 2e13])
def test_the_ring_exchange_is_exposed_only_when_a_block_computes_faster_than_it_moves(bandwidth):
    """Forward attention core of a CP rank: c + (cp - 1)·max(c, t) for a block computation c and a ring step
    t = 2α + block/B; the exchange adds (cp - 1)·max(0, t - c) (context.ring_exposed_time)."""
    cp, h100 = 4, builtin_catalog()["H100"]
    par = Parallelism(cp=cp, micro_batch=1, global_batch=1)
    xpus = [f"xpu{i}" for i in range(cp)]
    graph = build_hybrid_graph(SPEC, par, ParallelLayout(xpus, {"cp": cp}))
    platform = single_switch(cp, h100, xpu_link_bandwidth=bandwidth)
    result = simulate_graphs(platform, graph, RunOptions(iterations=1, trace_xpus=frozenset(xpus)))
    spans = {name: (start, end) for _, xpu, name, _, start, end in result["vertices"] if xpu == "xpu0"}
    core = graph.nodes["s0.c0.mb0.F.L0.attn.core"]
    block_time = core["flops"] / (cp - 1) / h100.peaks["bf16"]
    step = 2 * 100e-9 + kv_block_bytes(SHAPE, 1, 1, cp, 2.0) / bandwidth
    start = spans["s0.c0.mb0.F.L0.attn.core"][0]
    end = spans["s0.c0.mb0.F.L0.attn.last"][1]
    assert end - start == pytest.approx(block_time + (cp - 1) * max(block_time, step), rel=1e-6)
    exposed = end - start - cp * block_time
    assert exposed == pytest.approx(ring_exposed_time(cp - 1, step, block_time), rel=1e-6, abs=1e-12)
    assert (exposed > 0) == (step > block_time)


def test_cp_needs_flash_attention_and_an_even_split():
    with pytest.raises(ConfigError, match="flash attention"):
        Parallelism(cp=2, micro_batch=1, global_batch=1).check_model(
            WorkloadSpec(name="x", model=SHAPE, precision="bf16"))
    odd = WorkloadSpec(name="x", model=ModelShape(name="m", decoders=1, hidden=1024, heads=16, ffn=2816,
                                                  sequence=8190), precision="bf16", attention="flash")
    with pytest.raises(ConfigError, match="2 x cp = 4 equal chunks"):
        Parallelism(cp=2, micro_batch=1, global_batch=1).check_model(odd)


def test_the_model_flops_of_a_cp_run_are_the_whole_jobs():
    """Model FLOPs (and so MFU) count every CP rank's share: the same job split over cp = 1 or 4 ranks."""
    def flops(cp):
        par = Parallelism(cp=cp, micro_batch=1, global_batch=1)
        return build_hybrid_graph(SPEC, par, ParallelLayout([f"x{i}" for i in range(cp)], {"cp": cp})).graph["model_flops"]
    assert flops(4) == pytest.approx(flops(1), rel=1e-9)
