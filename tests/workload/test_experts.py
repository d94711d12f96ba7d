"""Expert parallelism in the hybrid graph: all-to-all bytes, expert FLOPs, parameters held, gradient groups,
errors (pure, no SimGrid), and the all-to-all's time on an uncontended switch (SimGrid)."""

import dataclasses

import pytest

from hcsim.errors import ConfigError
from hcsim.workload import load_workload_spec, validate_workload
from hcsim.workload.hybrid import Parallelism, build_hybrid_graph, place_hybrid_memory
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.memory import stage_memory
from hcsim.workload.transformer import decoder_layer

GPT = {"model.decoders": 4, "model.hidden": 64, "model.heads": 4, "model.ffn": 256, "model.sequence": 32,
       "model.vocabulary": 1000, "training.precision": "fp16"}
E, K, F = 8, 2, 128  # experts, top-k, expert inner size


def moe_spec(experts=E):
    spec = load_workload_spec("gpt3-175b", GPT)
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, experts=experts, top_k=K, expert_ffn=F))


def build(par: Parallelism, spec=None):
    spec = spec or moe_spec()
    xpus = [f"x{i}" for i in range(par.tp * par.pp * par.dp * par.ep)]
    layout = ParallelLayout(xpus, {"tp": par.tp, "pp": par.pp, "dp": par.dp, "ep": par.ep})
    graph = build_hybrid_graph(spec, par, layout)
    validate_workload(graph, xpus)
    return spec, layout, graph


@pytest.mark.parametrize("tp,pp,dp,ep,skew", [(1, 1, 1, 4, 1.0), (2, 2, 2, 2, 1.0), (1, 2, 1, 4, 1.5)])
def test_all_to_alls_carry_b_s_k_h_per_rank_over_each_ep_group(tp, pp, dp, ep, skew):
    """Dispatch and combine forward, and their gradients backward: 4 all-to-alls per decoder and micro-batch,
    each rank sending b·s·k·h/t elements (x moe_skew for the most loaded rank's pace)."""
    b, m = 2, 2
    par = Parallelism(tp=tp, pp=pp, dp=dp, ep=ep, micro_batch=b, global_batch=b * m * dp * ep, moe_skew=skew)
    _, layout, graph = build(par)
    a2a = [d for _, d in graph.nodes(data=True) if d.get("phase") == "ep"]
    assert len(a2a) == 4 * GPT["model.decoders"] * m
    for d in a2a:
        assert d["collective"] == "all_to_all"
        assert d["bytes"] == pytest.approx(b * 32 * K * 64 * 2 / tp * skew, rel=1e-12)
        assert {tuple(g) for g in d["groups"]} <= set(layout.groups("ep"))


@pytest.mark.parametrize("ep,skew", [(1, 1.0), (4, 1.0), (4, 2.0)])
def test_expert_flops_are_k_dense_mlps_of_the_expert_size_per_token(ep, skew):
    """Forward 2 GEMMs of h x f per token and expert (GeLU MLP), k experts per token: 4·h·f·k FLOP per token,
    three times that with the backward pass; the slowest rank's pace (skew) is charged to every rank."""
    b, m, L, s, h = 1, 2, GPT["model.decoders"], 32, 64
    par = Parallelism(dp=1, ep=ep, micro_batch=b, global_batch=b * m * ep, moe_skew=skew)
    _, _, graph = build(par)
    experts = sum(d["flops"] * len(d["xpus"]) for n, d in graph.nodes(data=True) if n.endswith(".experts"))
    tokens = b * m * ep * s
    assert experts == pytest.approx(3 * tokens * L * 4 * h * F * K * skew, rel=1e-12)


def test_a_rank_holds_the_dense_layers_and_e_over_ep_experts():
    """Parameters held: what hcsim.workload.memory.stage_memory counts with ep (E/ep experts); the dense
    gradients are all-reduced over the ep x dp ranks that share them, the experts' over dp."""
    ep = 4
    par = Parallelism(dp=2, ep=ep, global_batch=8)
    spec, layout, graph = build(par)
    placement = place_hybrid_memory(graph, spec, par, layout, {x: 1e30 for x in layout.xpus}, {})
    L = GPT["model.decoders"]
    held = stage_memory(spec.model, layers=L, first=True, last=True, in_flight=0, ep=ep, precision="fp16").parameters
    experts = L * sum(op.parameters for op in decoder_layer(spec.model, ep=ep).ops if op.name.startswith("expert_"))
    assert experts == L * E // ep * 2 * 64 * F + L * E // ep * (F + 64)  # E/ep GeLU experts: 2·h·f + biases
    assert placement.inventory[layout.xpus[0]].parameters == pytest.approx(held * 2, rel=1e-12)  # FP16 weights
    dense, expert = graph.nodes["s0.c0.grads"], graph.nodes["s0.c0.expert_grads"]
    assert {len(g) for g in dense["groups"]} == {2 * ep} and {len(g) for g in expert["groups"]} == {2}
    assert dense["bytes"] == pytest.approx((held - experts) * 2)
    assert expert["bytes"] == pytest.approx(experts * 2)


@pytest.mark.parametrize("kwargs,spec,message", [
    ({"ep": 3, "global_batch": 3}, None, "experts 8 is not a multiple of ep 3"),
    ({"ep": 2, "global_batch": 2}, "dense", "ep 2 needs a mixture-of-experts model"),
    ({"ep": 2, "global_batch": 2, "zero": 1}, None, "zero: 1 with ep: 2 is not modelled"),
    ({"ep": 2, "global_batch": 2, "moe_skew": 0.5}, None, "moe_skew: must be a number >= 1"),
    ({"ep": 2, "global_batch": 3}, None, "global_batch: 3 is not a multiple of dp x ep x micro_batch"),
])
def test_invalid_expert_parallelism_is_refused(kwargs, spec, message):
    with pytest.raises(ConfigError, match=message):
        par = Parallelism(dp=1, **kwargs)
        build(par, load_workload_spec("gpt3-175b", GPT) if spec == "dense" else None)


def test_pairwise_all_to_all_takes_n_minus_1_steps_on_an_uncontended_switch():
    """(n-1)·(α + S/(n·B)) for the dispatch of an EP group of n on a single switch (SimGrid)."""
    from hcsim.engine.api import RunOptions
    from hcsim.platform.builders import single_switch
    from hcsim.platform.devices import Device
    from hcsim.platform.routes import route_bandwidth, route_latency, shortest_routes
    from hcsim.run.simulation import simulate_graphs

    n = 4
    device = Device(name="d", fp32_flops=1e12, fp16_flops=1e12, memory=1e15, memory_bandwidth=1e15)
    platform = single_switch(n, device, xpu_link_bandwidth=1e9, xpu_link_latency=1e-6, hbm_latency=1e-9)
    xpus = [f"xpu{i}" for i in range(n)]
    par = Parallelism(ep=n, global_batch=n)
    graph = build_hybrid_graph(moe_spec(), par, ParallelLayout(xpus, {"ep": n}))
    result = simulate_graphs(platform, graph, RunOptions(iterations=1, trace_xpus=frozenset(xpus)))
    route = shortest_routes(platform, "xpu0", ["xpu1"])["xpu1"]
    alpha, B = route_latency(platform, route), route_bandwidth(platform, route)
    S = graph.nodes["s0.c0.mb0.F.L0.mlp.dispatch"]["bytes"]
    spans = [(s, e) for _, x, name, _, s, e in result["vertices"] if name == "s0.c0.mb0.F.L0.mlp.dispatch"]
    assert len(spans) == n
    start, end = max(s for s, _ in spans), max(e for _, e in spans)  # the last rank to arrive starts it
    assert end - start == pytest.approx((n - 1) * (alpha + S / (n * B)), rel=1e-6)


def test_a_mixture_of_experts_scenario_prepares_past_the_run_cost_check():
    """The run-cost check counted vertices from the data-parallel decoder table, which an MoE model has not."""
    from hcsim.limits import graph_vertices
    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import Scenario

    spec = load_workload_spec("mixtral-8x7b")
    assert graph_vertices(spec) > 2 * spec.model.decoders
    prepared = prepare(Scenario(workload="mixtral-8x7b", xpus=16, tp=2, pp=2, ep=4, global_batch=16))
    assert any("all_to_all" == data.get("collective") for _, data in prepared.workload.nodes(data=True))
