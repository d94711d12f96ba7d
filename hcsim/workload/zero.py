"""ZeRO data parallelism and offload of training state to CPU or CXL memory, for the hybrid graph.

ZeRO (Rajbhandari et al. 2020) shards the model state over each data-parallel
(DP) group of N_d ranks: stage 1 (= Megatron-LM's distributed optimizer) the
optimizer state, stage 2 also the gradients, stage 3 also the weights. With w,
g and K bytes of weight, gradient and optimizer state per parameter, one XPU
holds (w + g + K)Ψ, (w + g)Ψ + KΨ/N_d, wΨ + (g + K)Ψ/N_d or (w + g + K)Ψ/N_d
(:func:`zero_state_bytes`; 16Ψ, 4Ψ + 12Ψ/N_d, 2Ψ + 14Ψ/N_d, 16Ψ/N_d in mixed
precision with Adam). What the graph runs per stage (:mod:`hcsim.workload.hybrid`):

- stage 0: the gradients of each chunk are all-reduced (2Ψ per rank);
- stages 1-2: reduce-scattered instead (Ψ), each rank steps its 1/N_d shard of
  the optimizer, then the updated weights are all-gathered (Ψ): 2Ψ per rank, as
  ZeRO section 7.2.1 and Megatron's distributed optimizer do (stages 1 and 2
  differ in memory only: stage 2 frees the unsharded gradients);
- stage 3: before the forward and the backward pass of every decoder (and the
  LM head) of every micro-batch, its weights are all-gathered over the DP group,
  one layer ahead (the gather of layer l+1 runs while layer l computes; the
  gather of layer l+2 waits until layer l has finished, so at most two gathered
  layers are held); the gradients are reduce-scattered; no gather after the
  optimizer: 3Ψ per rank for one micro-batch.

Offload (``offload: cpu | cxl | coherent``, ``offload_state``: optimizer (default),
parameters, activations) keeps that state out of HBM:

- ``cpu`` (ZeRO-Offload, non-coherent): each chunk's gradient shard is copied
  to the XPU's host CPU DRAM over PCIe after its reduction, the optimizer step
  runs on the host CPU at its FLOP/s reading its DRAM, and the updated weights
  are copied back; offloaded parameters and activations are copied in from DRAM
  before each layer that reads them;
- ``cxl`` (coherent, paper Fig. 3c): the state lives in the XPU's CXL Type 3
  expander and the optimizer step (and the layers, for parameters and
  activations) read and update it in place over CXL beside their computation;
- ``coherent``: the same in place on any memory the XPU reads coherently: a
  CXL Type 3 expander, or its superchip CPU's memory over NVLink-C2C (GH200,
  GB200: the Grace CPU's LPDDR5X).

When the optimizer step is a vertex of its own (ZeRO >= 1 or offload), the
backward pass no longer reads the optimizer state (Table 4 folds the update
into it), and the step reads the whole state and writes the weights and the
optimizer state back: (w + g + K) + (w + K) bytes per parameter of its shard,
unless the workload gives ``optimizer_bytes_per_parameter``.

Units: bytes, parameters (counts).
"""

from __future__ import annotations

from hcsim.errors import ConfigError
from hcsim.workload.model import ElementSizes

__all__ = ["ZERO_STAGES", "OFFLOAD_TARGETS", "OFFLOAD_STATES", "zero_state_bytes", "optimizer_step_bytes",
           "check_zero_offload"]

ZERO_STAGES = (0, 1, 2, 3)
OFFLOAD_TARGETS = ("none", "cpu", "cxl", "coherent")  # coherent: cxl's in-place reads, on any coherent memory
OFFLOAD_STATES = ("optimizer", "parameters", "activations")


def zero_state_bytes(parameters: float, dp: int, stage: int, sizes: ElementSizes) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes one XPU holds for Ψ = `parameters` over N_d = `dp` with ZeRO
    `stage` (module docstring; Rajbhandari et al. 2020 section 5).

    >>> from hcsim.workload.model import element_sizes
    >>> sum(zero_state_bytes(1.0, 8, 2, element_sizes("bf16")))  # 2 + 14/8
    3.75
    """
    shard = 1.0 / dp
    w, g, k = sizes.weight * parameters, sizes.gradient * parameters, sizes.optimizer * parameters
    return (w * (shard if stage >= 3 else 1.0), g * (shard if stage >= 2 else 1.0), k * (shard if stage >= 1 else 1.0))


def optimizer_step_bytes(sizes: ElementSizes, given: float) -> float:
    """Bytes a separate optimizer step moves per parameter: `given` (the workload's) when > 0, else it reads
    the whole state and writes weights and optimizer state back."""
    return given if given > 0 else sizes.state + sizes.weight + sizes.optimizer


def check_zero_offload(zero: int, offload: str, offload_state: tuple[str, ...]) -> None:
    """Raise ConfigError naming the key when a ZeRO stage or an offload choice is invalid."""
    if isinstance(zero, bool) or zero not in ZERO_STAGES:
        raise ConfigError(f"zero: {zero!r} is not a ZeRO stage; valid: {', '.join(map(str, ZERO_STAGES))} "
                          f"(1 = Megatron-LM's distributed optimizer)")
    if offload not in OFFLOAD_TARGETS:
        raise ConfigError(f"offload: {offload!r} is not one of {', '.join(OFFLOAD_TARGETS)}")
    unknown = [s for s in offload_state if s not in OFFLOAD_STATES]
    if unknown or not offload_state or len(set(offload_state)) != len(offload_state):
        raise ConfigError(f"offload_state: {list(offload_state)} must list some of {', '.join(OFFLOAD_STATES)}, "
                          f"each once")
