"""The hybrid-parallel graph's structure: bytes per layer, FLOPs, memory in flight, errors (pure, no SimGrid)."""

import pytest

from hcsim.errors import ConfigError
from hcsim.workload import load_workload_spec, validate_workload
from hcsim.workload.hybrid import Parallelism, build_hybrid_graph, in_flight
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.schedules import stage_order

GPT = {"model.decoders": 8, "model.hidden": 64, "model.heads": 4, "model.ffn": 256, "model.sequence": 32,
       "model.vocabulary": 1000, "training.precision": "fp16", "training.attention": "standard"}


def build(par: Parallelism, **shape):
    spec = load_workload_spec("gpt3-175b", {**GPT, **shape})
    xpus = [f"x{i}" for i in range(par.tp * par.pp * par.dp)]
    graph = build_hybrid_graph(spec, par, ParallelLayout(xpus, {"tp": par.tp, "pp": par.pp, "dp": par.dp}))
    validate_workload(graph, xpus)
    return spec, graph


def test_model_flops_are_megatron_s_count():
    """72·B·s·L·h²·(1 + s/6h + V/12Lh) per iteration (Narayanan et al. 2021), B the global batch."""
    par = Parallelism(tp=2, pp=2, dp=2, micro_batch=2, global_batch=8)
    spec, graph = build(par)
    B, s, L, h, V = 8, 32, 8, 64, 1000
    assert graph.graph["model_flops"] == pytest.approx(72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)),
                                                       rel=1e-9)
    simulated = sum(d["flops"] * len(d["xpus"]) for _, d in graph.nodes(data=True)
                    if d["kind"] == "compute" and d.get("phase") in ("fwd", "bwd"))
    assert simulated == pytest.approx(graph.graph["model_flops"], rel=1e-9)


def test_full_recomputation_adds_exactly_one_forward_pass():
    def flops(graph, phase):
        return sum(d["flops"] * len(d["xpus"]) for _, d in graph.nodes(data=True)
                   if d["kind"] == "compute" and d.get("phase") == phase)

    par = dict(tp=2, pp=2, dp=1, global_batch=4)
    _, plain = build(Parallelism(**par))
    _, full = build(Parallelism(**par, recompute="full"))
    head = 2 * 4 * 32 * 64 * 1000  # the LM head's forward is not recomputed (it is not a decoder)
    assert flops(plain, "recompute") == 0
    assert flops(full, "recompute") == pytest.approx(flops(plain, "fwd") - head, rel=1e-12)
    for phase in ("fwd", "bwd"):
        assert flops(full, phase) == pytest.approx(flops(plain, phase), rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallelism_moves_b_s_h_per_block_and_pass(sp):
    """Megatron: 2 all-reduces of b·s·h elements forward and 2 backward per decoder and micro-batch; with
    sequence parallelism a reduce-scatter and an all-gather of the same bytes instead of each."""
    b, s, h, m, L = 2, 32, 64, 4, 8
    par = Parallelism(tp=2, pp=2, dp=1, micro_batch=b, global_batch=b * m, sequence_parallel=sp)
    _, graph = build(par)
    tp = [d for _, d in graph.nodes(data=True) if d.get("phase") == "tp"]
    kinds = {d["collective"] for d in tp}
    assert kinds == ({"reduce_scatter", "all_gather"} if sp else {"all_reduce"})
    per_kind = 4 * L * m  # (2 forward + 2 backward) per decoder and micro-batch
    for kind in kinds:
        vertices = [d for d in tp if d["collective"] == kind]
        assert len(vertices) == per_kind
        assert all(d["bytes"] == b * s * h * 2 and len(d["groups"]) == 1 and len(d["groups"][0]) == 2 for d in vertices)


def test_pipeline_sends_activations_forward_and_gradients_back_per_micro_batch():
    b, m = 2, 4
    _, graph = build(Parallelism(tp=2, pp=4, dp=2, micro_batch=b, global_batch=b * m * 2))
    p2p = [d for _, d in graph.nodes(data=True) if d.get("phase") == "p2p"]
    assert len(p2p) == 2 * (4 - 1) * m
    for d in p2p:
        assert d["bytes"] == b * 32 * 64 * 2 and len(d["groups"]) == 4  # one pair per (tp, dp) rank


def test_one_communication_vertex_carries_every_tensor_parallel_group():
    _, graph = build(Parallelism(tp=2, pp=1, dp=4, global_batch=4))
    groups = {d["groups"] for _, d in graph.nodes(data=True) if d.get("phase") == "tp"}
    assert groups == {(("x0", "x1"), ("x2", "x3"), ("x4", "x5"), ("x6", "x7"))}
    grads = {d["groups"] for _, d in graph.nodes(data=True) if d.get("phase") == "allreduce"}
    assert grads == {(("x0", "x2", "x4", "x6"), ("x1", "x3", "x5", "x7"))}


@pytest.mark.parametrize("schedule, v, expected", [
    ("gpipe", 1, lambda p, s, m: m),
    ("1f1b", 1, lambda p, s, m: min(p - s, m)),
    ("zb-h1", 1, lambda p, s, m: min(p, m)),
])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 2)])
def test_micro_batches_in_flight_per_stage(schedule, v, expected, p, m):
    for stage in range(p):
        order = stage_order(schedule, stages=p, micro_batches=m, stage=stage, chunks=v)
        assert in_flight(order) == expected(p, stage, m)


def test_interleaved_first_stage_holds_1_plus_p_minus_1_over_pv_times_1f1b():
    """Megatron-LM's theoretical_memory_usage: the first stage keeps (1 + (p-1)/(p·v)) x 1F1B's p
    micro-batches' activations, each chunk holding 1/v of them."""
    p, v, m = 4, 2, 8
    chunks = in_flight(stage_order("interleaved", stages=p, micro_batches=m, stage=0, chunks=v))
    assert chunks / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


@pytest.mark.parametrize("par, shape, message", [
    (dict(tp=3), {}, r"tp: 3 does not divide the 4 attention heads"),
    (dict(pp=3), {}, r"pp x virtual_stages = 3 does not divide the 8 decoders"),
    (dict(pp=2, virtual_stages=2, schedule="1f1b"), {}, r"virtual_stages: 2 needs schedule: interleaved"),
    (dict(pp=2, virtual_stages=2, schedule="interleaved", global_batch=3), {},
     r"interleaved needs micro-batches \(3\) to be a multiple of pp \(2\)"),
    (dict(dp=2, micro_batch=2, global_batch=6), {}, r"global_batch: 6 is not a multiple of dp x micro_batch = 2 x 2"),
    (dict(schedule="pipedream"), {}, r"schedule: 'pipedream' is not one of gpipe, 1f1b, interleaved, zb-h1"),
    (dict(recompute="some"), {}, r"recompute: 'some' is not one of none, selective, full"),
    (dict(sequence_parallel=True), {}, r"sequence_parallel: needs tp > 1"),
    (dict(pp=2, layer_split=(3, 4)), {}, r"layer_split: \[3, 4\] must be positive and sum to the 8 decoders"),
    (dict(pp=2, layer_split=(8,)), {}, r"layer_split: gives 1 stages, expected pp x virtual_stages = 2"),
])
def test_every_invalid_combination_says_which_key_and_what_is_valid(par, shape, message):
    with pytest.raises(ConfigError, match=message):
        build(Parallelism(**{"global_batch": 4, **par}), **shape)


def test_an_uneven_layer_split_puts_the_given_decoders_on_each_stage():
    _, graph = build(Parallelism(pp=2, global_batch=2, layer_split=(3, 5)))
    forwards = {s: {n for n in graph if n.startswith(f"s{s}.c0.mb0.F.L") and n.endswith(".attn")} for s in (0, 1)}
    assert (len(forwards[0]), len(forwards[1])) == (3, 5)
