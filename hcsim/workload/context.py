"""Context parallelism: a sequence split over the ranks of a CP group (long-context training).

Megatron-LM's context parallelism (``megatron/core/transformer/.../context_parallel``, Transformer Engine's
``attn_forward_func_with_cp``): each rank holds s/cp tokens of every sample, and every op but the attention
core works on its own tokens. Two ways to run the attention core:

- ``ring`` (ring attention): the ranks pass their K/V blocks around the CP group, cp - 1 steps, each step's
  transfer beside the block computation of the step before; backward passes the K/V blocks again and the
  dK/dV blocks back. With the causal mask, Megatron-LM gives each rank two chunks of the sequence (chunk r
  and chunk 2cp - 1 - r), so every rank does the same share: 1/cp of the whole causal attention;
- ``all_to_all`` (Ulysses, DeepSpeed): an all-to-all redistributes Q, K, V from sequence-split to
  head-split before the core and the output back after it (heads must divide by tp x cp); the core then
  runs on the whole sequence for heads/(tp·cp) heads, not beside any transfer.

Pure functions; units: bytes, FLOP, counts.
"""

from __future__ import annotations

from hcsim.errors import ConfigError

__all__ = ["CP_ALGORITHMS", "check_context", "kv_block_bytes", "attention_flops_per_rank", "ring_exposed_time"]

CP_ALGORITHMS = ("ring", "all_to_all")


def check_context(model, cp: int, tp: int, algorithm: str) -> None:
    """Raise ConfigError naming the key when the model cannot be split over `cp` ranks this way."""
    if algorithm not in CP_ALGORITHMS:
        raise ConfigError(f"cp_algorithm: {algorithm!r} is not one of {', '.join(CP_ALGORITHMS)}")
    if cp == 1:
        return
    if model.sequence % (2 * cp):
        raise ConfigError(f"cp: {cp} needs the sequence ({model.sequence}) split into 2 x cp = {2 * cp} equal chunks "
                          f"(causal load balancing); valid: a cp that 2 x cp divides {model.sequence} by")
    if algorithm == "all_to_all" and (model.kv_heads or model.heads) % (tp * cp):
        raise ConfigError(f"cp_algorithm: all_to_all splits the {model.kv_heads or model.heads} key/value heads over "
                          f"tp x cp = {tp * cp} ranks, which does not divide them; valid: cp_algorithm: ring, or a "
                          f"smaller cp")


def kv_block_bytes(model, micro_batch: int, tp: int, cp: int, element: float) -> float:
    """Bytes of one rank's K and V blocks: 2 x b x s/cp x kv_hidden/tp x element size.

    >>> from hcsim.workload.model import ModelShape
    >>> m = ModelShape(name="m", decoders=1, hidden=4096, heads=32, kv_heads=8, ffn=14336, sequence=8192)
    >>> kv_block_bytes(m, 1, 1, 4, 2.0) == 2 * 2048 * 1024 * 2
    True
    """
    return 2.0 * micro_batch * model.sequence / cp * model.kv_hidden / tp * element


def attention_flops_per_rank(model, micro_batch: int, tp: int, cp: int) -> float:
    """Forward FLOPs of the causal attention core on one rank: the whole sequence's 2·b·s²·h (half the square:
    the kernel skips the masked half) over tp x cp, the same on every rank with the causal load balancing."""
    return 2.0 * micro_batch * model.sequence ** 2 * model.hidden / (tp * cp)


def ring_exposed_time(steps: int, transfer: float, compute: float) -> float:
    """Seconds ring attention's exchange adds to its block computation when each of `steps` transfers runs
    beside a block computation of `compute` s: (steps)·max(0, transfer - compute).

    >>> ring_exposed_time(3, 2.0, 0.5), ring_exposed_time(3, 0.5, 2.0)
    (4.5, 0.0)
    """
    return steps * max(0.0, transfer - compute)
