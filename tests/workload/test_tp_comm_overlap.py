"""Transformer Engine's TP communication overlap (training.tp_comm_overlap, Megatron-LM's --tp-comm-overlap): the
graph's rule (each sequence-parallel block's reduce-scatter and all-gather in t chunks, one exposed after the block,
the other t - 1 beside it) and what a run makes of it (tests/study/test_plan.py: the estimate follows the engine)."""

import logging

import pytest

from hcsim.run.scenario import load_scenario
from hcsim.run.simulation import simulate
from hcsim.workload import load_workload_spec, validate_workload
from hcsim.workload.hybrid import Parallelism, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout

GPT = {"model.decoders": 4, "model.hidden": 64, "model.heads": 4, "model.ffn": 256, "model.sequence": 32,
       "model.vocabulary": 0, "training.precision": "bf16"}  # no embedding or head: a pass begins with a block


def build(tp: int, sequence_parallel: bool, overlap: bool):
    spec = load_workload_spec("gpt3-175b", {**GPT, "training.tp_comm_overlap": overlap})
    par = Parallelism(tp=tp, pp=1, dp=1, micro_batch=1, global_batch=2, sequence_parallel=sequence_parallel,
                      megatron_comm=True)
    xpus = [f"x{i}" for i in range(tp)]
    graph = build_hybrid_graph(spec, par, ParallelLayout(xpus, {"tp": tp, "pp": 1, "dp": 1}))
    validate_workload(graph, xpus)
    return graph


def tp_vertices(graph):
    return {v: d for v, d in graph.nodes(data=True) if d.get("phase") == "tp"}


@pytest.mark.parametrize("tp", [2, 4])
def test_each_block_but_a_pass_s_first_exposes_one_chunk_and_runs_the_rest_beside_itself(tp):
    graph, plain = build(tp, True, True), build(tp, True, False)
    activation = next(d["bytes"] for d in tp_vertices(plain).values())
    split = tp_vertices(graph)
    hidden = {v: d for v, d in split.items() if v.endswith(".hidden")}
    assert hidden and all(d["bytes"] == activation * (tp - 1) / tp for d in hidden.values())
    for v in hidden:
        block = v.split(".tp.")[0]  # the block the collective follows
        exposed = v.removesuffix(".hidden")
        assert split[exposed]["bytes"] == activation / tp
        (before,) = graph.predecessors(block)
        if v.endswith("reduce_scatter.hidden"):  # it starts when the block does, from the vertex before it
            assert list(graph.predecessors(v)) == [before]
        else:  # the all-gather's chunks follow the reduce-scatter's
            assert list(graph.predecessors(v)) == [v.replace("all_gather", "reduce_scatter")]
    whole = [v for v, d in split.items() if not v.endswith(".hidden") and d["bytes"] == activation]
    passes = 2 * 2  # two micro-batches, a forward and a backward pass each: their first block's stay whole
    kinds = 2  # a reduce-scatter and an all-gather
    blocks = passes * 4 * 2  # four decoders of two blocks a pass
    assert len(whole) == passes * kinds and len(hidden) == (blocks - passes) * kinds
    assert all(".L0.attn." in v or ".L3.mlp." in v for v in whole)  # forward begins at L0, backward at L3
    # every block's collectives move the same bytes as without the overlap
    assert sum(d["bytes"] for d in split.values()) == pytest.approx(sum(d["bytes"] for d in tp_vertices(plain).values()))


def test_without_sequence_parallelism_nothing_is_overlapped():
    assert [(v, d["bytes"]) for v, d in tp_vertices(build(4, False, True)).items()] == \
        [(v, d["bytes"]) for v, d in tp_vertices(build(4, False, False)).items()]


BASE = ["workload=llama3-8b", "platform=dgx-h100", "xpus=8", "tp=4", "pp=2", "global_batch=8", "iterations=2"]


def run(*settings):
    return simulate(load_scenario(None, BASE + list(settings)))


def test_a_run_hides_most_of_its_tp_time(capfd):
    overlapped, exposed = (run("sequence_parallel=true", f"workload_overrides={{training.tp_comm_overlap: {flag}}}")
                           for flag in ("true", "false"))
    tp = {name: r["breakdown"]["H100"]["comm_tp_s"] for name, r in (("overlapped", overlapped), ("exposed", exposed))}
    assert 0 < tp["overlapped"] < tp["exposed"] / 2
    assert overlapped["iteration_time_s"] < exposed["iteration_time_s"]

    capfd.readouterr()
    plain, asked = (run(f"workload_overrides={{training.tp_comm_overlap: {flag}}}") for flag in ("false", "true"))
    assert asked["iteration_time_s"] == plain["iteration_time_s"]  # no sequence parallelism: nothing to overlap
    said = [line for line in capfd.readouterr().err.splitlines() if "tp_comm_overlap" in line]
    assert said == ["scenario 'default': training.tp_comm_overlap: Transformer Engine overlaps the TP collectives of "
                    "sequence-parallel layers only (Megatron-LM's --tp-comm-overlap needs --sequence-parallel), so it "
                    "has no effect here; set sequence_parallel: true to use it"], said  # the run that asks for it
