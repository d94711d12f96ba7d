"""ZeRO and offload in the hybrid graph: memory per XPU and communication volume against the closed forms
(Rajbhandari et al. 2020, REFERENCE.md), the structure of ZeRO-3's prefetch, offload vertices, errors."""

import math

import networkx as nx
import pytest

from hcsim.engine.collectives import get_algorithm
from hcsim.errors import ConfigError, WorkloadError
from hcsim.workload import load_workload_spec, validate_workload
from hcsim.workload.hybrid import Parallelism, build_hybrid_graph, place_hybrid_memory
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.memory import stage_memory
from hcsim.workload.transformer import decoder_layer, embedding, lm_head

GPT = {"model.decoders": 8, "model.hidden": 64, "model.heads": 4, "model.ffn": 256, "model.sequence": 32,
       "model.vocabulary": 1000, "training.precision": "fp16"}


def build(par: Parallelism, **training):
    spec = load_workload_spec("gpt3-175b", {**GPT, **{f"training.{k}": v for k, v in training.items()}})
    xpus = [f"x{i}" for i in range(par.tp * par.pp * par.dp)]
    layout = ParallelLayout(xpus, {"tp": par.tp, "pp": par.pp, "dp": par.dp})
    graph = build_hybrid_graph(spec, par, layout)
    validate_workload(graph, xpus)
    return spec, layout, graph


def psi(spec, tp=1, pp=1, stage=0) -> float:
    """Ψ: parameters one XPU's DP group shares, its stage's per TP rank (hcsim.workload.memory.stage_memory)."""
    layers = spec.model.decoders // pp
    return stage_memory(spec.model, layers=layers, first=stage == 0, last=stage == pp - 1, in_flight=0, tp=tp,
                        precision=spec.precision).parameters


def dp_bytes_sent(graph, xpu: str) -> float:
    """Bytes `xpu` sends in one iteration in the data-parallel collectives, from their algorithms' flows."""
    sent = 0.0
    for _, data in graph.nodes(data=True):
        if data.get("phase") not in ("allreduce", "zero"):
            continue
        for group in data["groups"]:
            if xpu in group:
                algorithm = get_algorithm(data["collective"], data["algorithm"], len(group), data["bytes"])
                rank = group.index(xpu)
                sent += sum(size for (src, _), size in algorithm.flows().items() if src == rank)
    return sent


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("dp", [2, 4])
def test_memory_per_xpu_is_zero_s_closed_form(zero, dp):
    """Mixed precision with Adam: 16Ψ, 4Ψ + 12Ψ/N_d, 2Ψ + 14Ψ/N_d, 16Ψ/N_d bytes of model state per XPU
    (ZeRO-3 also holds two gathered layers: 2 x the largest layer's weights)."""
    par = Parallelism(dp=dp, global_batch=dp, zero=zero)
    spec, layout, graph = build(par)
    placement = place_hybrid_memory(graph, spec, par, layout, {x: 1e30 for x in layout.xpus}, {})
    P, n = psi(spec), dp
    expected = {0: 16 * P, 1: 4 * P + 12 * P / n, 2: 2 * P + 14 * P / n, 3: 16 * P / n}[zero]
    largest = max(decoder_layer(spec.model).parameters, embedding(spec.model).parameters, lm_head(spec.model).parameters)
    gathered = 2 * 2 * largest if zero == 3 else 0
    for x in layout.xpus:
        held = placement.inventory[x]
        assert held.parameters + held.gradients + held.optimizer == pytest.approx(expected + gathered, rel=1e-12)
        assert held.spilled == 0


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 4), (2, 2, 2)])
def test_communication_volume_per_rank_is_2_psi_or_3_psi(zero, tp, pp, dp):
    """One micro-batch: each rank sends 2Ψ·(N_d-1)/N_d elements for ZeRO 0-2 (all-reduce, or reduce-scatter +
    all-gather) and 3Ψ·(N_d-1)/N_d for ZeRO-3 (weights gathered for forward and backward); 2 B each in FP16.
    Ψ is what one XPU's DP group shares: its stage's parameters per TP rank."""
    par = Parallelism(tp=tp, pp=pp, dp=dp, global_batch=dp, zero=zero)
    spec, layout, graph = build(par)
    for x in layout.xpus:
        volume = (3 if zero == 3 else 2) * psi(spec, tp, pp, layout.stage(x)) * (dp - 1) / dp * 2
        assert dp_bytes_sent(graph, x) == pytest.approx(volume, rel=1e-12)


def test_zero3_gathers_run_one_layer_ahead():
    """The gather of unit k+1 waits for the gather of unit k but not for unit k's computation (prefetch); the
    gather of unit k+2 waits for unit k to end (two gathered layers at most); the first waits for the
    previous iteration's optimizer step."""
    _, _, graph = build(Parallelism(dp=2, global_batch=2, zero=3))
    gathers = [n for n, d in graph.nodes(data=True) if d.get("phase") == "zero"]
    assert len(gathers) == 2 * (8 + 2)  # every decoder, the embedding and the head, forward and backward
    first = {g: next(iter(graph.successors(g))) for g in gathers}
    assert all(graph.nodes[c]["kind"] == "compute" for c in first.values())
    chain = [gathers[0]]
    while True:
        nxt = [s for s in graph.successors(chain[-1]) if s in first]
        if not nxt:
            break
        chain.append(nxt[0])
    assert chain == sorted(gathers, key=chain.index) and len(chain) == len(gathers)
    assert graph.nodes[chain[0]]["start"]
    assert any(graph.edges[p, chain[0]]["skip_first_iteration"] for p in graph.predecessors(chain[0]))
    for k in range(1, len(chain)):
        computes = [p for p in graph.predecessors(chain[k]) if graph.nodes[p]["kind"] == "compute"]
        if k == 1:
            assert computes == []
        else:  # exactly the last vertex of unit k-2: after unit k-2's first, before unit k-1's first
            (last,) = computes
            assert nx.has_path(graph, first[chain[k - 2]], last) and last != first[chain[k - 1]]
            assert set(graph.successors(last)) >= {first[chain[k - 1]], chain[k]}


def test_stages_1_and_2_gather_the_updated_weights_after_the_optimizer():
    for zero in (1, 2):
        _, _, graph = build(Parallelism(dp=2, global_batch=2, zero=zero), overlap_param_gather=False)
        gather = [n for n, d in graph.nodes(data=True) if d.get("phase") == "zero"]
        assert len(gather) == 1 and list(graph.predecessors(gather[0])) == ["s0.optimizer"]
        assert graph.nodes["s0.optimizer"]["flops"] == pytest.approx(
            build(Parallelism(dp=2, global_batch=2))[2].nodes["s0.optimizer"]["flops"] / 2)


@pytest.mark.parametrize("schedule, virtual, classes", [("1f1b", 1, None), ("interleaved", 2, None),
                                                       ("1f1b", 1, (6, 2))])
def test_overlapped_param_gathers_feed_each_units_first_forward(schedule, virtual, classes):
    """ZeRO-1 with overlap_param_gather (the default): per stage one all-gather per unit (decoder, embedding,
    head), in the order the first replica class first runs them, together the bytes of the one gather after the
    optimizer; each one precedes every replica class's first forward of its unit (and no other forward), the
    first waits for the previous iteration's optimizer step, each later one for the one before it and, from the
    third on, for the first forward of the unit two before it to end."""
    par = Parallelism(pp=2, dp=2, global_batch=8, zero=1, schedule=schedule, virtual_stages=virtual,
                      batch_split=classes)
    _, _, graph = build(par)
    _, _, plain = build(par, overlap_param_gather=False)
    for stage in range(2):
        gathers = [n for n, d in graph.nodes(data=True) if d.get("phase") == "zero" and d["stage"] == stage]
        (single,) = [n for n, d in plain.nodes(data=True) if d.get("phase") == "zero" and d["stage"] == stage]
        assert math.fsum(graph.nodes[g]["bytes"] for g in gathers) == pytest.approx(plain.nodes[single]["bytes"],
                                                                                    rel=1e-12)
        assert len(gathers) == 8 // 2 + 1  # the stage's decoders, and the embedding (stage 0) or the head
        replicas = 1 if classes is None else 2
        for k, gather in enumerate(gathers):
            fed = list(graph.successors(gather))
            computes = [v for v in fed if graph.nodes[v]["kind"] == "compute"]
            assert len(computes) == replicas
            assert all(graph.nodes[v]["step"] == "F" and graph.nodes[v]["micro_batch"] == 0 for v in computes)
            before = [p for p in graph.predecessors(gather)]
            if k == 0:
                assert graph.nodes[gather]["start"]
                assert before == [f"s{stage}.optimizer"]
                assert graph.edges[before[0], gather]["skip_first_iteration"]
            else:
                assert gathers[k - 1] in before and not graph.edges[gathers[k - 1], gather]["skip_first_iteration"]
                assert len(before) == (1 if k == 1 else 2)


def test_cpu_offload_moves_the_gradient_shard_out_steps_on_the_cpu_and_moves_weights_in():
    par = Parallelism(dp=4, global_batch=4, zero=2, offload="cpu")
    spec, _, graph = build(par)
    out = [d for _, d in graph.nodes(data=True) if d.get("move") == "out"]
    into = [d for _, d in graph.nodes(data=True) if d.get("move") == "in"]
    P = psi(spec)
    assert sum(d["memory_bytes"] for d in out) == pytest.approx(P / 4 * 2)  # FP16 gradient shard
    assert sum(d["memory_bytes"] for d in into) == pytest.approx(P / 4 * 2)  # FP16 weight shard
    opt = graph.nodes["s0.optimizer"]
    assert opt["host"] == "cpu" and opt["offload"] == "cpu"
    # reads weights, gradients, master + moments and writes weights, master + moments: (16 + 2 + 12) B
    assert opt["memory_bytes"] == pytest.approx(P / 4 * 30)


def test_cxl_offload_reads_the_optimizer_state_in_place():
    spec, layout, graph = build(Parallelism(dp=2, global_batch=2, zero=1, offload="cxl"))
    opt = graph.nodes["s0.optimizer"]
    assert opt["offload"] == "cxl" and opt["spilled_xpus"] == frozenset(layout.xpus) and "host" not in opt


@pytest.mark.parametrize("state", [("optimizer",), ("optimizer", "parameters"), ("activations",)])
def test_offloaded_state_leaves_hbm(state):
    par = Parallelism(dp=2, global_batch=2, zero=1, offload="cxl", offload_state=state)
    plain = Parallelism(dp=2, global_batch=2, zero=1)
    spec, layout, graph = build(par)
    memory = {x: ("m" + x, math.inf) for x in layout.xpus}
    held = place_hybrid_memory(graph, spec, par, layout, {x: 1e30 for x in layout.xpus}, {}, memory).inventory
    base = place_hybrid_memory(build(plain)[2], spec, plain, layout, {x: 1e30 for x in layout.xpus}, {}).inventory
    x = layout.xpus[0]
    away = sum(getattr(held[x], k) for k, on in (("optimizer", "optimizer" in state),
                                                 ("parameters", "parameters" in state),
                                                 ("gradients", "parameters" in state),
                                                 ("activations", "activations" in state)) if on)
    assert held[x].total == pytest.approx(base[x].total)
    assert held[x].spilled == pytest.approx(away) and held[x].local == pytest.approx(base[x].local - away)
    decoders = [d for n, d in graph.nodes(data=True) if d["kind"] == "compute" and ".L" in n]
    assert all(d["spilled_xpus"] == (frozenset(layout.xpus) if state != ("optimizer",) else frozenset())
               for d in decoders)


def test_offload_memory_too_small_is_named():
    par = Parallelism(dp=2, global_batch=2, offload="cpu")
    spec, layout, graph = build(par)
    shared = {x: ("dram0", 1e3) for x in layout.xpus}
    with pytest.raises(WorkloadError, match="dram0"):
        place_hybrid_memory(graph, spec, par, layout, {x: 1e30 for x in layout.xpus}, {}, shared)


@pytest.mark.parametrize("kwargs,message", [
    ({"zero": 4}, "zero: 4 is not a ZeRO stage"),
    ({"zero": True}, "zero: True"),
    ({"offload": "nvme"}, "offload: 'nvme'"),
    ({"offload": "cpu", "offload_state": ("weights",)}, "offload_state"),
    ({"offload": "cpu", "offload_state": ()}, "offload_state"),
])
def test_invalid_zero_or_offload_is_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Parallelism(dp=2, global_batch=2, **kwargs)


BIG = {**GPT, "model.hidden": 2048, "model.heads": 16, "model.ffn": 8192}  # 50 M parameters a decoder: a bucket each


def _grad_collectives(graph, stage: int, chunk: int) -> list[str]:
    return [n for n, d in graph.nodes(data=True) if d.get("phase") == "allreduce" and d["stage"] == stage
            and n.startswith(f"s{stage}.c{chunk}.")]


@pytest.mark.parametrize("schedule, virtual, classes", [("1f1b", 1, None), ("interleaved", 2, None),
                                                       ("1f1b", 1, (6, 2))])
def test_overlapped_gradient_buckets_wait_for_their_units_last_backward(schedule, virtual, classes):
    """ZeRO-1 with the weights' gathers overlapped (the default) reduces the first chunk's gradients bucket by
    bucket (Megatron-LM's overlap_grad_reduce): a bucket per decoder here (each above the 40 M-parameter bucket),
    from the last layer back; together the bytes of the one collective without the overlap; each waits for its
    units' backward in every replica class's last backward pass of the chunk and for the bucket before it; the
    later chunks keep one collective (Megatron-LM buckets chunk 0 only)."""
    par = Parallelism(pp=2, dp=2, global_batch=8, zero=1, schedule=schedule, virtual_stages=virtual,
                      batch_split=classes)
    spec = load_workload_spec("gpt3-175b", BIG)
    xpus = [f"x{i}" for i in range(par.pp * par.dp)]
    layout = ParallelLayout(xpus, {"pp": par.pp, "dp": par.dp})
    graph = build_hybrid_graph(spec, par, layout)
    plain = build_hybrid_graph(load_workload_spec("gpt3-175b", {**BIG, "training.overlap_grad_reduce": False}),
                               par, layout)
    validate_workload(graph, xpus)
    decoders = 8 // 2 // virtual
    for stage in range(2):
        for chunk in range(virtual):
            buckets, (single,) = _grad_collectives(graph, stage, chunk), _grad_collectives(plain, stage, chunk)
            assert math.fsum(graph.nodes[b]["bytes"] for b in buckets) == pytest.approx(plain.nodes[single]["bytes"],
                                                                                      rel=1e-12)
            if chunk:
                assert buckets == [single]
                continue
            # the head's 2 M parameters share the last decoder's bucket; the embedding's, after the first decoder
            # closed its bucket, make a last one of their own (Megatron-LM's last bucket takes what is left)
            assert len(buckets) == decoders + (stage == 0)
            for i, bucket in enumerate(buckets):
                before = set(graph.predecessors(bucket))
                passes = {(graph.nodes[v].get("micro_batch"), graph.nodes[v].get("step")) for v in before
                          if graph.nodes[v]["kind"] == "compute"}
                counts = [8 // 2] if classes is None else [6, 2]
                assert len(passes) == len(counts) and all(step == "B" for _, step in passes)
                assert {mb for mb, _ in passes} == {c - 1 for c in counts}  # each class's last micro-batch
                assert (buckets[i - 1] in before) == bool(i)


def test_overlap_grad_reduce_follows_the_gathers_unless_named():
    """Default: on exactly where the updated weights' gathers overlap (ZeRO 1-2 over more than one rank with
    overlap_param_gather: Megatron-LM asserts --overlap-grad-reduce with --overlap-param-gather); a value given
    wins; never under ZB-H1 (its weight gradients come in one deferred pass)."""
    def buckets(par, **training):
        spec = load_workload_spec("gpt3-175b", {**BIG, **{f"training.{k}": v for k, v in training.items()}})
        xpus = [f"x{i}" for i in range(par.dp)]
        graph = build_hybrid_graph(spec, par, ParallelLayout(xpus, {"dp": par.dp}))
        return len(_grad_collectives(graph, 0, 0))
    par = Parallelism(dp=2, global_batch=4, zero=1)
    assert buckets(par) == 9 and buckets(par, overlap_param_gather=False) == 1  # 8 decoders, the embedding
    assert buckets(par, overlap_grad_reduce=False) == 1
    assert buckets(Parallelism(dp=2, global_batch=4)) == 1  # ZeRO 0: Megatron-LM's default, off
    assert buckets(Parallelism(dp=2, global_batch=4), overlap_grad_reduce=True) == 9
    assert buckets(Parallelism(dp=2, global_batch=4, zero=1, schedule="zb-h1", pp=1), overlap_grad_reduce=True) == 1
