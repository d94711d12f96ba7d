"""Megatron-LM's pipeline and tensor-parallel communication (Parallelism.megatron_comm, the kernel model's runs)."""

from dataclasses import replace

import pytest

from hcsim.workload.hybrid import Parallelism, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.model import ModelShape
from hcsim.workload.spec import WorkloadSpec

SHAPE = ModelShape(name="gpt", decoders=4, hidden=512, heads=8, ffn=2048, sequence=256, vocabulary=1024)
SPEC = WorkloadSpec(name="gpt", model=SHAPE, precision="fp16", granularity="layer")


def graph(megatron, sequence_parallel=False, tp=2, spec=SPEC):
    par = Parallelism(tp=tp, pp=2, micro_batch=1, global_batch=4, sequence_parallel=sequence_parallel,
                      megatron_comm=megatron)
    return build_hybrid_graph(spec, par, ParallelLayout([f"x{i}" for i in range(2 * tp)], {"tp": tp, "pp": 2}))


def test_each_tp_rank_sends_its_share_and_the_receivers_gather_it():
    """Megatron-LM's scatter-gather (before March 2023, training.pipeline_scatter_gather): each TP rank sends
    b·s·h/t, the receiving TP group all-gathers b·s·h."""
    activation = 1 * SHAPE.sequence * SHAPE.hidden * 2
    ideal, megatron = graph(False), graph(True, spec=replace(SPEC, pipeline_scatter_gather=True))
    name = "p2p.q0.mb0.act"
    assert ideal.nodes[name]["bytes"] == activation
    assert megatron.nodes[name]["bytes"] == activation / 2
    gather = megatron.nodes[f"{name}.all_gather"]
    assert gather["collective"] == "all_gather" and gather["bytes"] == activation and gather["algorithm"] == "nccl"
    assert f"{name}.all_gather" in megatron.successors(name)
    assert not any(v.startswith("s1.") for v in megatron.successors(name))  # stage 1 waits for the gather
    assert any(v.startswith("s1.") for v in megatron.successors(f"{name}.all_gather"))


@pytest.mark.parametrize("tp", [2, 4])
def test_today_each_tp_rank_sends_its_whole_activation_or_its_sequence_parallel_slice(tp):
    """Megatron-LM since March 2023 (megatron/core's get_tensor_shapes): without sequence parallelism every TP rank
    sends the whole [s, b, h] activation, with it its [s/t, b, h] slice; nothing is gathered after the send."""
    activation = 1 * SHAPE.sequence * SHAPE.hidden * 2
    for sequence_parallel, sent in ((False, activation), (True, activation / tp)):
        g = graph(True, sequence_parallel, tp)
        assert all(d["bytes"] == sent for n, d in g.nodes(data=True) if n.startswith("p2p") and n.endswith(".act"))
        assert not any(n.endswith(".all_gather") and n.startswith("p2p") for n in g.nodes)


def test_a_send_blocks_its_sender_until_delivered():
    """1F1B's send_forward / send_backward wait for completion: the sender's next pass follows the transfer."""
    g = graph(True, tp=1)
    send = "p2p.q0.mb0.act"
    nexts = [v for v in g.successors(send) if v.startswith("s0.")]
    assert nexts, "stage 0's next pass does not wait for its send"
    assert all(g.nodes[v]["xpus"] == g.nodes["s0.c0.mb0.F.embedding"]["xpus"] for v in nexts)
    assert not [v for v in graph(False, tp=1).successors(send) if v.startswith("s0.")]


@pytest.mark.parametrize("megatron", [False, True])
def test_ring_collectives_run_on_nccl_channel_rings_only_with_megatron_comm(megatron):
    """TP collectives, and DP gradient all-reduces that the workload runs as rings."""
    algorithms = {d["algorithm"] for _, d in graph(megatron).nodes(data=True) if d.get("phase") == "tp"}
    assert algorithms == ({"nccl"} if megatron else {"ring"})
    par = Parallelism(tp=2, dp=2, micro_batch=1, global_batch=2, megatron_comm=megatron)
    dp = build_hybrid_graph(SPEC, par, ParallelLayout([f"x{i}" for i in range(4)], {"tp": 2, "dp": 2}))
    grads = {d["algorithm"] for _, d in dp.nodes(data=True) if d.get("phase") == "allreduce"}
    assert grads == ({"nccl"} if megatron else {"ring"})
