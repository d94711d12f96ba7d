"""Transformer Engine's TP communication overlap (training.tp_comm_overlap, Megatron-LM's --tp-comm-overlap): the
graph's rule (each sequence-parallel block's reduce-scatter and all-gather in t chunks, one exposed after the block,
the other t - 1 beside it) and what a run makes of it (tests/study/test_plan.py: the estimate follows the engine); and
the interleaved schedule's sends overlapped in its steady state (training.overlap_p2p_comm, Megatron-LM's default)."""

import logging

import pytest

from hcsim.errors import ConfigError
from hcsim.run.scenario import load_scenario
from hcsim.run.simulation import simulate
from hcsim.workload import load_workload_spec, validate_workload
from hcsim.workload.hybrid import Parallelism, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout

GPT = {"model.decoders": 4, "model.hidden": 64, "model.heads": 4, "model.ffn": 256, "model.sequence": 32,
       "model.vocabulary": 0, "training.precision": "bf16"}  # no embedding or head: a pass begins with a block


def build(tp: int, sequence_parallel: bool, overlap: bool, **overrides):
    spec = load_workload_spec("gpt3-175b", {**GPT, "training.tp_comm_overlap": overlap, **overrides})
    par = Parallelism(tp=tp, pp=1, dp=1, micro_batch=1, global_batch=2, sequence_parallel=sequence_parallel,
                      megatron_comm=True)
    xpus = [f"x{i}" for i in range(tp)]
    graph = build_hybrid_graph(spec, par, ParallelLayout(xpus, {"tp": tp, "pp": 1, "dp": 1}))
    validate_workload(graph, xpus)
    return graph


def tp_vertices(graph):
    return {v: d for v, d in graph.nodes(data=True) if d.get("phase") == "tp"}


@pytest.mark.parametrize("overlap", [False, True])
def test_fp8_gathers_of_a_dense_model_move_half_the_bytes(overlap):
    """Transformer Engine gathers an FP8 GEMM's sequence-parallel input in FP8 (1 B an element) and reduce-scatters
    in BF16: in FP8 every all-gather moves half of its reduce-scatter's bytes, in BF16 as many, and a mixture of
    experts (whose dispatcher gathers in BF16) keeps them whole."""
    def sizes(**overrides):
        found = {}
        for data in tp_vertices(build(4, True, overlap, **overrides)).values():
            found.setdefault(data["collective"], set()).add(data["bytes"])
        return found

    bf16, fp8 = sizes(), sizes(**{"training.precision": "fp8"})
    moe = sizes(**{"training.precision": "fp8", "model.experts": 2, "model.top_k": 1})
    assert bf16["all_gather"] == bf16["reduce_scatter"] == fp8["reduce_scatter"] == moe["all_gather"]
    assert fp8["all_gather"] == {size / 2 for size in fp8["reduce_scatter"]}


@pytest.mark.parametrize("tp", [2, 4])
def test_each_block_exposes_one_chunk_and_runs_the_rest_beside_itself(tp):
    """Every block's collectives: t - 1 chunks starting when the block may (after the vertex before it, or for a
    pass's first block after what that block waits for, by the same rules and iteration), the last chunk after
    both; the same bytes in all as without the overlap."""
    graph, plain = build(tp, True, True), build(tp, True, False)
    activation = next(d["bytes"] for d in tp_vertices(plain).values())
    split = tp_vertices(graph)
    hidden = {v: d for v, d in split.items() if v.endswith(".hidden")}
    assert len(hidden) == len(tp_vertices(plain)) == len(split) / 2  # every collective split in two
    for v, d in hidden.items():
        assert d["bytes"] == activation * (tp - 1) / tp and split[v.removesuffix(".hidden")]["bytes"] == activation / tp
        block = v.split(".tp.")[0]  # the block the collective follows
        if v.endswith("reduce_scatter.hidden"):  # starts when the block may: the same edges, the same start
            edges = {u: (e["wait"], e["skip_first_iteration"]) for u, e in graph.pred[v].items()}
            assert edges == {u: (e["wait"], e["skip_first_iteration"]) for u, e in graph.pred[block].items()}
            assert d["start"] == graph.nodes[block]["start"]
        else:  # the all-gather's chunks follow the reduce-scatter's, and the exposed chunks follow both and the block
            assert list(graph.predecessors(v)) == [v.replace("all_gather", "reduce_scatter")]
            exposed = v.replace("all_gather.hidden", "reduce_scatter")
            assert set(graph.predecessors(exposed)) == {block, v}
    total = sum(d["bytes"] for d in tp_vertices(plain).values())
    assert sum(d["bytes"] for d in split.values()) == pytest.approx(total)


def test_without_sequence_parallelism_nothing_is_overlapped():
    assert [(v, d["bytes"]) for v, d in tp_vertices(build(4, False, True)).items()] == \
        [(v, d["bytes"]) for v, d in tp_vertices(build(4, False, False)).items()]


BASE = ["workload=llama3-8b", "platform=dgx-h100", "xpus=8", "tp=4", "pp=2", "global_batch=8", "iterations=2"]


def run(*settings):
    return simulate(load_scenario(None, BASE + list(settings)))


def test_a_run_hides_most_of_its_tp_time(caplog):
    overlapped, exposed = (run("sequence_parallel=true", f"workload_overrides={{training.tp_comm_overlap: {flag}}}")
                           for flag in ("true", "false"))
    tp = {name: r["breakdown"]["H100"]["comm_tp_s"] for name, r in (("overlapped", overlapped), ("exposed", exposed))}
    assert 0 < tp["overlapped"] < tp["exposed"] / 2
    assert overlapped["iteration_time_s"] < exposed["iteration_time_s"]

    caplog.clear()  # the run's process hands its warnings back to this one's loggers (hcsim.run.fresh)
    plain, asked = (run(f"workload_overrides={{training.tp_comm_overlap: {flag}}}") for flag in ("false", "true"))
    assert asked["iteration_time_s"] == plain["iteration_time_s"]  # no sequence parallelism: nothing to overlap
    said = [r.getMessage() for r in caplog.records if "tp_comm_overlap" in r.getMessage()]
    assert said == ["scenario 'default': training.tp_comm_overlap: Transformer Engine overlaps the TP collectives of "
                    "sequence-parallel layers only (Megatron-LM's --tp-comm-overlap needs --sequence-parallel), so it "
                    "has no effect here; set sequence_parallel: true to use it"], said  # the run that asks for it


# ---- pipeline sends under the interleaved schedule (training.overlap_p2p_comm) ---------------------------------

def test_the_steady_state_is_the_alternating_forwards_and_backwards():
    """Megatron-LM's interleaved order on stage 0 of p 2, m 4, v 2: four warmup forwards, four forward-backward
    pairs, four flush backwards; with m = p every forward comes first and there is no steady state."""
    from hcsim.workload.hybrid import steady_state
    from hcsim.workload.schedules import stage_order

    order = stage_order("interleaved", stages=2, micro_batches=4, stage=0, chunks=2)
    assert [op.kind for op in order] == ["F"] * 4 + ["F", "B"] * 4 + ["B"] * 4
    assert steady_state(order) == order[4:12]
    assert steady_state(stage_order("interleaved", stages=2, micro_batches=2, stage=0, chunks=2)) == []
    assert steady_state(stage_order("1f1b", stages=2, micro_batches=4, stage=1)) == \
        stage_order("1f1b", stages=2, micro_batches=4, stage=1)  # the last stage alternates from the start


def _interleaved(overlap: bool):
    spec = load_workload_spec("gpt3-175b", {**GPT, "model.decoders": 8, "training.overlap_p2p_comm": overlap})
    par = Parallelism(tp=1, pp=2, dp=1, micro_batch=1, global_batch=4, schedule="interleaved", virtual_stages=2,
                      megatron_comm=True)
    xpus = ["x0", "x1"]
    graph = build_hybrid_graph(spec, par, ParallelLayout(xpus, {"tp": 1, "pp": 2, "dp": 1}))
    validate_workload(graph, xpus)
    return graph


def test_interleaved_sends_in_the_steady_state_do_not_hold_the_next_pass():
    """A send's edge to the sender's next pass (Megatron-LM's blocking send) stays for the passes of warmup and
    flush only: exactly the sends whose sender pass is outside its stage's steady state."""
    from hcsim.workload.hybrid import steady_state
    from hcsim.workload.schedules import Op, stage_order

    p, v = 2, 2
    steady = {(s, op) for s in range(p)
              for op in steady_state(stage_order("interleaved", stages=p, micro_batches=4, stage=s, chunks=v))}

    def sender(name):  # p2p.q{q}.mb{j}.act from (q % p, F j, chunk q // p); .grad from virtual stage q + 1's B
        q, j = int(name.split(".q")[1].split(".")[0]), int(name.split(".mb")[1].split(".")[0])
        return (q % p, Op("F", j, q // p)) if name.endswith(".act") else ((q + 1) % p, Op("B", j, (q + 1) // p))

    def held(graph):  # the sends the sender's next pass waits for
        return {name for name, d in graph.nodes(data=True) if d.get("collective") == "p2p"
                and any(graph.nodes[w].get("stage") == sender(name)[0] for w in graph.successors(name))}

    blocking, overlapped = _interleaved(False), _interleaved(True)
    sends = {name for name, d in blocking.nodes(data=True) if d.get("collective") == "p2p"}
    assert len(sends) == 2 * 4 * (p * v - 1)  # act and grad, 4 micro-batches, 3 chunk boundaries
    orders = {s: stage_order("interleaved", stages=p, micro_batches=4, stage=s, chunks=v) for s in range(p)}
    followed = {name for name in sends if sender(name)[1] != orders[sender(name)[0]][-1]}  # a pass comes next
    assert held(blocking) == followed
    assert held(overlapped) == {name for name in followed if sender(name) not in steady} < followed


def test_an_interleaved_run_with_overlapped_sends_exposes_less_pipeline_time():
    settings = BASE[:3] + ["schedule=interleaved", "virtual_stages=2", "tp=2", "pp=4", "global_batch=16",
                           "iterations=2"]
    overlapped, blocking = (simulate(load_scenario(None, settings + [
        f"workload_overrides={{training.overlap_p2p_comm: {flag}}}"])) for flag in ("true", "false"))
    pp = {name: r["breakdown"]["H100"]["comm_pp_s"] for name, r in (("overlapped", overlapped), ("blocking", blocking))}
    assert pp["overlapped"] < pp["blocking"]
    assert overlapped["iteration_time_s"] < blocking["iteration_time_s"]


def test_the_gemms_beside_userbuffers_collectives_leave_them_their_sms():
    """Transformer Engine's defaults: the row GEMMs' forward (pipelined reduce-scatter) and the column GEMMs'
    input and weight gradients (bulk all-gather and reduce-scatter) run on the SMs less 16; every other kernel is
    as without the overlap. An H100 GEMM of whole waves on 116 of 132 SMs then takes 132/116 of its time."""
    from hcsim.engine.compute_model import gemm_utilization, load_compute_model
    from hcsim.workload.hybrid import USERBUFFER_GEMMS, USERBUFFER_SMS, block_kernels

    spec = load_workload_spec("llama3-70b")
    plain, overlapped = (block_kernels(spec, 1, 4, True, tp_comm_overlap=flag) for flag in (False, True))
    marked = set()
    for a, b in zip(plain, overlapped):
        for before, after in zip(a.forward + a.backward, b.forward + b.backward):
            assert after == before._replace(sm_margin=after.sm_margin)
            if after.sm_margin:
                marked.add(after.name)
                assert after.sm_margin == USERBUFFER_SMS
    assert marked == set(USERBUFFER_GEMMS)
    h100 = load_compute_model().device("H100")
    m, n, k = 8192, 8192, 8192
    assert h100.gemm_efficiency(m, n, k, sm_margin=16) == pytest.approx(
        h100.gemm_max_efficiency * 116 / 132 * gemm_utilization(m, n, k, 116, h100.gemm_k_half))
    with pytest.raises(ConfigError, match="has none left"):
        h100.gemm_efficiency(m, n, k, sm_margin=132)
