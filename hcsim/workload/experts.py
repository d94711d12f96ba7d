"""Expert parallelism for mixture-of-experts (MoE) decoders in the hybrid graph.

An MoE decoder replaces the MLP by E experts and a router that sends every
token to its top-k experts (:mod:`hcsim.workload.transformer` costs it per
rank: router, routing, dispatch, the experts' GEMMs on the k·b·s token-expert
pairs a rank computes with balanced routing, combine). Expert parallelism
(``ep``, an axis of the :class:`~hcsim.workload.layout.ParallelLayout`)
spreads the experts over each EP group: a rank holds E/ep experts. The EP ranks
see different data, so the non-expert parameters are data parallel over
ep x dp ranks and the experts over dp.

Per decoder and micro-batch the graph (:mod:`hcsim.workload.hybrid`) runs,
forward: the MLP block's dense ops (norm, router, routing, the local dispatch
and combine copies, residual), an all-to-all *dispatch* over the EP group, the
experts (:data:`EXPERT_OPS`), an all-to-all *combine*; backward: the combine's
gradient all-to-all, the experts' backward, the dispatch's gradient
all-to-all, the dense ops' backward. (The combine's local copy runs before
the dispatch in this order: a copy of k·b·s·h elements, small beside the
experts.) An all-to-all carries S = b·s·k·h activation elements per rank (its
send buffer: S/ep to every rank), over t with tensor parallelism.

Unbalanced routing, ``moe_skew`` >= 1: the most loaded rank receives
`moe_skew` times the mean number of tokens; the combine waits for it, so the
graph charges every rank of the EP group the most loaded rank's expert work
(FLOPs and bytes) and all-to-all bytes: the pace of the slowest rank.
"""

from __future__ import annotations

__all__ = ["EXPERT_OPS", "routed_elements"]

EXPERT_OPS = ("expert_in", "activation", "expert_out")  # the experts' work in transformer.decoder_layer


def routed_elements(shape, micro_batch: int, tp: int) -> float:
    """Activation elements one rank sends in one all-to-all: b·s·k·h / t (0 for a dense model)."""
    if not getattr(shape, "moe", False):
        return 0.0
    return micro_batch * shape.sequence * shape.top_k * shape.hidden / tp
