"""Kernel-level costs of the hybrid graph's compute vertices (hcsim.workload.ops)."""

import pytest

from hcsim.workload.hybrid import Parallelism, block_costs, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.model import ModelShape, element_sizes
from hcsim.workload.ops import block_ops, ops_flops
from hcsim.workload.spec import WorkloadSpec

SHAPE = ModelShape(name="gpt", decoders=4, hidden=512, heads=8, ffn=2048, sequence=256, vocabulary=1024)
SPEC = WorkloadSpec(name="gpt", model=SHAPE, precision="fp16", granularity="layer")
SIZES = element_sizes("fp16")


@pytest.mark.parametrize("attention", ["standard", "flash"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_blocks_kernels_add_up_to_its_flops(tp, attention):
    """Forward kernels = the block's forward FLOPs; backward = its input- and weight-gradient FLOPs; the core
    (what selective recomputation redoes) = the attention core's FLOPs."""
    spec = WorkloadSpec(name="gpt", model=SHAPE, precision="fp16", granularity="layer", attention=attention)
    for cost, ops in zip(block_costs(spec, 2, tp), block_ops(SHAPE, SIZES, 2, tp, attention=attention)):
        assert ops_flops(ops.forward) == pytest.approx(cost.fwd_flops, rel=1e-12)
        assert ops_flops(ops.backward) == pytest.approx(cost.bwd_flops, rel=1e-12)
        assert ops_flops(ops.core) == pytest.approx(cost.core_flops, rel=1e-12)


def test_sequence_parallelism_splits_the_replicated_kernels_over_the_tp_group():
    """Without SP every TP rank runs the norms and bias-dropout-adds on all tokens; with SP on 1/t of them."""
    tp = 4
    plain, split = (block_ops(SHAPE, SIZES, 1, tp, sequence_parallel=sp)[0] for sp in (False, True))
    for a, b in zip(plain.forward, split.forward):
        if a.name.startswith(("norm", "add")):
            assert b.bytes == pytest.approx(a.bytes / tp)
        else:
            assert b == a


def test_every_compute_vertex_of_a_hybrid_graph_carries_kernels_of_its_flops():
    par = Parallelism(tp=2, pp=2, micro_batch=1, global_batch=4, recompute="selective", sequence_parallel=True)
    graph = build_hybrid_graph(SPEC, par, ParallelLayout([f"x{i}" for i in range(4)], {"tp": 2, "pp": 2}))
    for name, data in graph.nodes(data=True):
        if data["kind"] == "compute" and data.get("phase") != "optimizer" and ".head" not in name \
                and ".embedding" not in name:
            assert ops_flops(data["ops"]) == pytest.approx(data["flops"], rel=1e-12), name
    optimizer = graph.nodes["s0.optimizer"]["ops"]
    assert [op.kind for op in optimizer] == ["memory"] and optimizer[0].bytes > 0
