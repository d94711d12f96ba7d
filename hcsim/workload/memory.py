"""Closed-form memory and traffic of data-parallel training state, activations and pipeline schedules.

Pure functions, each with its source (``/work/shared/REFERENCE.md`` collects them):

- :func:`state_bytes_per_parameter`: training state per parameter (FP32 + Adam
  16 B = 4 + 4 + 8; mixed precision + Adam 16 B = 2 + 2 + 12).
- :func:`zero_state` / :func:`zero_bytes_per_parameter`: weights, gradients and
  optimizer state per XPU for ZeRO stage 0-3 over N_d data-parallel ranks
  (16Ψ, 4Ψ + 12Ψ/N_d, 2Ψ + 14Ψ/N_d, 16Ψ/N_d in mixed precision with Adam);
  :func:`distributed_optimizer_bytes_per_parameter`: Megatron-LM's distributed
  optimizer (6 + 12/d with BF16 weights and FP32 gradients).
- :func:`zero_traffic_elements`: data-parallel communication per rank per
  iteration, 2Ψ elements for ZeRO 0-2 and 3Ψ for ZeRO-3.
- :func:`layer_activation_bytes`: a GPT layer's activations per micro-batch
  (Korthikanti et al. 2022), with tensor / sequence parallelism and
  recomputation; :func:`output_activation_bytes`: the embedding and output
  layers'. (:meth:`hcsim.workload.transformer.Block.activation_bytes` gives
  the same, op by op, for any shape and precision.)
- :func:`in_flight_microbatches`: micro-batches whose activations a pipeline
  stage holds at its peak, per schedule (:data:`SCHEDULES`).
- :func:`stage_memory`: all of it for one XPU of a pipeline stage, from the
  op-level costs of :mod:`hcsim.workload.transformer`.

Units: bytes, elements (counts), parameters (counts).
"""

from __future__ import annotations

from dataclasses import dataclass

from hcsim.errors import ConfigError
from hcsim.workload.model import RECOMPUTATION, ModelShape, element_sizes
from hcsim.workload.ops import INVENTORIES
from hcsim.workload.schedules import SCHEDULES
from hcsim.workload.transformer import decoder_layer, embedding, lm_head

__all__ = ["ZERO_STAGES", "SCHEDULES", "ZeroState", "state_bytes_per_parameter", "zero_state",
           "zero_bytes_per_parameter", "distributed_optimizer_bytes_per_parameter", "zero_traffic_elements",
           "layer_activation_bytes", "output_activation_bytes", "in_flight_microbatches", "StageMemory",
           "stage_memory", "framework_reserve", "CUDA_WORKSPACES", "ALLOCATOR_RESERVE"]

ZERO_STAGES = (0, 1, 2, 3)


def state_bytes_per_parameter(precision: str = "bf16", optimizer: str = "adam") -> float:
    """Training-state bytes per parameter: weight + gradient + optimizer state (+ FP32 master copy).

    FP32 + Adam: 4 + 4 + 8 = 16 B (memory-optimization seed §1.1); FP16/BF16
    mixed precision + Adam: 2 + 2 + (4 master + 8 moments) = 16 B (lecture
    seed; Rajbhandari et al. 2020, ZeRO §3.1, K = 12).

    >>> state_bytes_per_parameter("fp32"), state_bytes_per_parameter("bf16")
    (16.0, 16.0)
    """
    return element_sizes(precision, optimizer).state


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroState:
    """Bytes of model state one data-parallel rank holds: weights, gradients, optimizer (incl. master)."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def _check_degree(key: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}: must be an integer >= 1, got {value!r}")


def _check_stage(stage: int) -> None:
    if stage not in ZERO_STAGES or isinstance(stage, bool):
        raise ConfigError(f"zero stage: {stage!r} is not one of {', '.join(map(str, ZERO_STAGES))}")


def zero_state(parameters: float, dp: int, stage: int, *, precision: str = "bf16",
               optimizer: str = "adam", gradient: float | None = None,
               fp8_parameters: float | None = None) -> ZeroState:
    """Model-state bytes per XPU for Ψ = `parameters` over N_d = `dp` ranks with ZeRO `stage`.

    Rajbhandari et al. 2020 (ZeRO), §5 and Fig. 1: stage 1 shards the
    optimizer state (incl. the FP32 master), stage 2 also the gradients,
    stage 3 also the weights. With w, g, K bytes of weight, gradient and
    optimizer state per parameter: stage 0 (w + g + K)Ψ; 1 (w + g)Ψ + KΨ/N_d;
    2 wΨ + (g + K)Ψ/N_d; 3 (w + g + K)Ψ/N_d. Mixed precision with Adam
    (w = g = 2, K = 12): 16Ψ, 4Ψ + 12Ψ/N_d, 2Ψ + 14Ψ/N_d, 16Ψ/N_d.

    `gradient`: bytes per gradient element (None: the precision's; 4 for Megatron-LM's FP32 main gradients,
    which make stages 0 and 1 Megatron-LM's 18Ψ and (6 + 12/N_d)Ψ, megatron/training/theoretical_memory_usage.py).
    `fp8_parameters`: the parameters Transformer Engine keeps FP8 copies of (the FP8 GEMMs' weights; None: all
    of them), held (and sharded) as the weights are.
    """
    _check_degree("dp", dp)
    _check_stage(stage)
    if not parameters >= 0:
        raise ConfigError(f"parameters: must be >= 0, got {parameters!r}")
    sizes = element_sizes(precision, optimizer)
    shard = [1.0, 1.0, 1.0]  # weights, gradients, optimizer: fraction held
    for index in range(stage):  # stage 1 shards index 2, stage 2 also 1, stage 3 also 0
        shard[2 - index] = 1.0 / dp
    copies = parameters if fp8_parameters is None else fp8_parameters
    return ZeroState(weights=(sizes.weight * parameters + sizes.fp8_copies * copies) * shard[0],
                     gradients=(sizes.gradient if gradient is None else gradient) * parameters * shard[1],
                     optimizer=sizes.optimizer * parameters * shard[2])


def zero_bytes_per_parameter(dp: int, stage: int, *, precision: str = "bf16", optimizer: str = "adam") -> float:
    """:func:`zero_state` per parameter (16, 4 + 12/N_d, 2 + 14/N_d, 16/N_d for BF16 + Adam)."""
    return zero_state(1.0, dp, stage, precision=precision, optimizer=optimizer).total


def distributed_optimizer_bytes_per_parameter(dp: int, *, weight: float = 2.0, gradient: float = 4.0,
                                              optimizer: float = 12.0) -> float:
    """Megatron-LM's distributed optimizer (ZeRO-1 over the data-parallel group): bytes per parameter.

    Weights and gradients stay whole, the optimizer state (FP32 master and
    Adam moments) is sharded over d ranks: weight + gradient + optimizer/d.
    Megatron-LM docs/source/api-guide/dist_optimizer.md: BF16 weights with FP32
    gradient accumulation 6 + 12/d (the default here), FP32 8 + 8/d
    (weight=4, gradient=4, optimizer=8).
    """
    _check_degree("dp", dp)
    return weight + gradient + optimizer / dp


def zero_traffic_elements(parameters: float, stage: int, dp: int | None = None) -> float:
    """Elements each data-parallel rank sends per iteration for the gradients (and ZeRO-3 parameters).

    Rajbhandari et al. 2020, §7: stages 0-2 reduce-scatter and all-gather (an
    all-reduce): 2Ψ; stage 3 adds one more all-gather of the parameters
    (forward and backward each gather them; the gradients are only
    reduce-scattered): 3Ψ. The paper's figures drop the ring's (N_d - 1)/N_d;
    pass `dp` to include it. Multiply by bytes per element (2 in BF16).
    """
    _check_stage(stage)
    volume = (3.0 if stage == 3 else 2.0) * parameters
    if dp is None:
        return volume
    _check_degree("dp", dp)
    return volume * (dp - 1) / dp


def layer_activation_bytes(*, sequence: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Activation bytes of one GPT layer for one micro-batch on one tensor-parallel rank (16-bit).

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
    Transformer Models"), §4 and Table 2, with s, b, h, a, t:

    - no parallelism: s·b·h·(34 + 5as/h)
    - tensor parallel: s·b·h·(10 + 24/t + 5as/(ht))
    - tensor + sequence parallel: s·b·h·(34 + 5as/h)/t
    - selective recomputation drops the 5as/h term (the a·s² tensors);
    - full recomputation keeps the layer input, 2sbh; with sequence
      parallelism that input is scattered over the t ranks, so 2sbh/t (the
      paper's Table 2 lists 2sbh for every case; Megatron-LM keeps the
      sequence-parallel layer input scattered).

    Assumes a GPT block (f = 4h, GeLU, dropout, kv heads = heads), 2-byte
    activations and 1-byte dropout masks; for other shapes and precisions use
    :meth:`hcsim.workload.transformer.Block.activation_bytes`.
    """
    if recompute not in RECOMPUTATION:
        raise ConfigError(f"recompute: {recompute!r} is not one of {', '.join(RECOMPUTATION)}")
    for key, value in (("sequence", sequence), ("micro_batch", micro_batch), ("hidden", hidden), ("heads", heads),
                       ("tp", tp)):
        _check_degree(key, value)
    s, b, h, a, t = sequence, micro_batch, hidden, heads, tp
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sequence_parallel else 1)
    scores = 0.0 if recompute == "selective" else 5.0 * a * s / (h * t)
    if sequence_parallel:
        return sbh * (34.0 / t + scores)
    return sbh * (10.0 + 24.0 / t + scores)


def output_activation_bytes(*, sequence: int, micro_batch: int, hidden: int, vocabulary: int, tp: int = 1,
                            sequence_parallel: bool = False) -> float:
    """Activation bytes of the embedding and output layers for one micro-batch (16-bit).

    Korthikanti et al. 2022, §4.3: the embedding dropout mask (sbh, 1 B), the
    final layer norm's input (2sbh), the output projection's input (2sbh) and
    the FP32 logits of the loss (4sbv); without parallelism 5sbh + 4sbv (the
    lecture seed's "5hs + 4sv"). The first three are split t ways with
    sequence parallelism, the logits always (vocabulary-parallel).
    """
    for key, value in (("sequence", sequence), ("micro_batch", micro_batch), ("hidden", hidden),
                       ("vocabulary", vocabulary), ("tp", tp)):
        _check_degree(key, value)
    s, b, h, v, t = sequence, micro_batch, hidden, vocabulary, tp
    return 5.0 * s * b * h / (t if sequence_parallel else 1) + 4.0 * s * b * v / t


def in_flight_microbatches(schedule: str, *, stage: int, stages: int, microbatches: int,
                           virtual_stages: int = 1) -> float:
    """Micro-batches whose activations pipeline stage `stage` (0-based) holds at its peak.

    Counted in micro-batches of the whole stage's layers (with interleaving a
    device's v chunks each hold 1/v of them). p = `stages`, m = `microbatches`,
    v = `virtual_stages`, i = `stage`:

    - "gpipe": m (every forward before any backward; Huang et al. 2019);
    - "1f1b": min(p - i, m) (PipeDream-Flush / Megatron-LM: p - i - 1 warm-up
      forwards, then one forward and one backward in turn; Narayanan et al. 2021);
    - "interleaved": Megatron-LM's warm-up of (v - 1)·p + 2(p - i - 1) chunk
      forwards, so min(m·v, v·p + p - 2i - 1)/v; on the first stage
      p·(1 + (p - 1)/(p·v)) (Megatron-LM theoretical_memory_usage.py); when
      m = p Megatron-LM runs every forward first: m;
    - "zb-h1": min(p, m) on every stage (Qi et al. 2023, §2.1: ZB-H1 delays
      stage i's weight-gradient passes by i backwards so that all stages
      have the same number of micro-batches in flight). Counted whole until
      the weight gradient; a micro-batch past its input gradient keeps less
      (the GEMM inputs and output gradients), which is why the first stage,
      p like 1F1B's, bounds the peak.
    """
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule: {schedule!r} is not one of {', '.join(SCHEDULES)}")
    for key, value in (("stages", stages), ("microbatches", microbatches), ("virtual_stages", virtual_stages)):
        _check_degree(key, value)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < stages:
        raise ConfigError(f"stage: {stage!r} is not a stage of a {stages}-stage pipeline (0 to {stages - 1})")
    if virtual_stages != 1 and schedule != "interleaved":
        raise ConfigError(f"virtual_stages {virtual_stages} needs schedule 'interleaved', got {schedule!r}. "
                          "Fix: virtual_stages 1, or schedule interleaved")
    p, m, v, i = stages, microbatches, virtual_stages, stage
    if schedule == "gpipe":
        return float(m)
    if schedule == "zb-h1":
        return float(min(p, m))
    if schedule == "1f1b" or v == 1:
        return float(min(p - i, m))
    if m == p:
        return float(m)
    return min(m * v, v * p + p - 2 * i - 1) / v


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMemory:
    """Bytes one XPU of a pipeline stage holds at its peak: model state by kind, and activations.

    parameters : the weights it holds (count, before ZeRO sharding);
    state : weights, gradients, optimizer (:class:`ZeroState`);
    activations : in-flight micro-batches x the stage's activation bytes per micro-batch.
    """

    parameters: int
    state: ZeroState
    activations: float

    @property
    def total(self) -> float:
        return self.state.total + self.activations


def stage_memory(shape: ModelShape, *, layers: int, first: bool, last: bool, in_flight: float, micro_batch: int = 1,
                 sequence: int | None = None, tp: int = 1, sequence_parallel: bool = False, ep: int = 1,
                 precision: str = "bf16", attention: str = "standard", optimizer: str = "adam",
                 recompute: str = "none", dp: int = 1, zero_stage: int = 0, kernels: str = "megatron",
                 gradient: float | None = None) -> StageMemory:
    """Memory of one XPU of a pipeline stage holding `layers` decoder layers.

    Parameters: the layers' (per tensor-parallel rank), plus the embedding on
    the `first` stage and the output layer on the `last` (a tied output layer
    on a last stage that is not also the first keeps a copy, as in
    Megatron-LM); model state by :func:`zero_state` over the `dp` ranks the
    optimizer state is sharded over (Megatron-LM's distributed optimizer: the
    data-parallel group with the context-parallel ranks, dp x cp), with
    `gradient` bytes per gradient element (None: the precision's;
    :attr:`hcsim.workload.spec.WorkloadSpec.main_gradient`) and, in FP8, the
    FP8 weight and its transpose that Transformer Engine caches over a step's
    micro-batches for the weights of its FP8 GEMMs only (the embedding and the
    output layer stay BF16); activations = `in_flight`
    (:func:`in_flight_microbatches`) x (the layers'
    :meth:`~hcsim.workload.transformer.Block.activation_bytes` for `recompute`,
    plus the embedding's and the head's where they are). Other keywords as
    :func:`hcsim.workload.transformer.decoder_layer`.

    Not counted here: the working set of the layer being recomputed or
    back-propagated, communication buffers, the CUDA context and the
    allocator's reserve (:func:`framework_reserve` adds the last ones where
    out of memory is decided); experts are sharded over the same `dp` ranks
    as the rest. `kernels` other than "megatron": :func:`eager_memory` (a
    whole model on one data-parallel rank).
    """
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
        raise ConfigError(f"layers: must be an integer >= 0, got {layers!r}")
    if not in_flight >= 0:
        raise ConfigError(f"in_flight: must be >= 0 micro-batches, got {in_flight!r}")
    inventory = INVENTORIES[kernels]
    if not inventory.fused:
        return eager_memory(shape, layers=layers, micro_batch=micro_batch, in_flight=in_flight, recompute=recompute,
                            compiled=inventory.compiled)
    keywords = dict(micro_batch=micro_batch, sequence=sequence, tp=tp, sequence_parallel=sequence_parallel, ep=ep,
                    precision=precision, attention=attention)
    layer = decoder_layer(shape, **keywords)
    blocks = [(layer, layers)]
    if first:
        blocks.append((embedding(shape, **keywords), 1))
    if last:
        blocks.append((lm_head(shape, tied_copy=not first, **keywords), 1))
    parameters = sum(block.parameters * count for block, count in blocks)
    fp8 = sum(op.parameters * count for block, count in blocks for op in block.ops if op.kernel == "gemm8")
    activations = sum(block.activation_bytes(recompute) * count for block, count in blocks)
    return StageMemory(parameters=parameters, activations=in_flight * activations,
                       state=zero_state(parameters, dp, zero_stage, precision=precision, optimizer=optimizer,
                                        gradient=gradient, fp8_parameters=fp8))


CUBLAS_WORKSPACE = 32 * 2**20  # PyTorch's default cuBLAS workspace on Hopper (CUBLAS_WORKSPACE_CONFIG :4096:8)
# What a PyTorch process holds on the GPU beside its tensors (the CUDA context, cuBLAS and cuDNN handles and
# kernels): 0.75 GiB, measured on an H100 after a training step (total - free - reserved of mem_get_info;
# PyTorch 2.11, CUDA 13). It decides out of memory: GPT-2 2.7B at batch 6 x 1024 ran out on an H100 with 76.1
# GiB allocated, 2.2 GiB reserved but free, 0.75 GiB of context, of the 79.18 GiB CUDA reports.
CUDA_CONTEXT = 0.75 * 2**30


def eager_memory(shape: ModelShape, *, layers: int, micro_batch: int, in_flight: float = 1.0,
                 recompute: str = "none", compiled: bool = False) -> StageMemory:
    """The peak a PyTorch run of a Hugging Face model sees (torch.cuda.max_memory_allocated) on one data-parallel
    rank: torch.autocast(bfloat16) over FP32 weights, fused AdamW, gradients set to None between steps.

    FP32 weights 4 B and Adam's moments 8 B per parameter are held throughout. The peak falls at the start of
    the backward pass, holding the BF16 copies of the weights (2 B per parameter: autocast's cast cache, and
    the GEMMs save them), the activations autograd keeps (:func:`hcsim.workload.ops.eager_layer_ops`, or
    each layer's input under activation checkpointing) and the head's logits (BF16 logits, FP32
    log-probabilities and two FP32 gradients) -- unless the FP32 gradients (4 B per parameter, complete at
    the end of the backward pass) weigh more. Plus the cuBLAS workspace (:data:`CUBLAS_WORKSPACE`) and the CUDA
    context (:data:`CUDA_CONTEXT`): the memory the process holds, the caching allocator's free blocks aside.
    `compiled`: under torch.compile the layers keep what AOTAutograd's min-cut partitioner saves
    (:func:`hcsim.workload.ops.compiled_saved`: GEMM and attention inputs and outputs, the residual stream, the
    norms' statistics, dropout masks; the element-wise intermediates are recomputed in the backward), also in
    the layer being recomputed under checkpointing, and the head the BF16 logits and their BF16 gradient."""
    from hcsim.workload.ops import eager_head_ops, eager_layer_ops
    from hcsim.workload.transformer import model_parameters

    parameters = model_parameters(shape) if layers == shape.decoders else \
        decoder_layer(shape, micro_batch=micro_batch).parameters * layers
    saved = layer = eager_layer_ops(shape, micro_batch, compiled)[2]
    if recompute == "full":
        saved = micro_batch * shape.sequence * shape.hidden * 4.0  # checkpointing keeps each layer's FP32 input
    head = eager_head_ops(shape, micro_batch, compiled)[1] if shape.vocabulary and layers == shape.decoders else 0.0
    # at the head's backward, or (checkpointing) while the last layer is recomputed and back-propagated
    activations = in_flight * (layers * saved + max(head, layer if recompute == "full" else 0.0))
    copies, gradients = 2.0 * parameters, 4.0 * parameters
    at_backward = copies + activations >= gradients
    return StageMemory(parameters=parameters, activations=activations if at_backward else 0.0,
                       state=ZeroState(weights=4.0 * parameters + (copies if at_backward else 0.0) + CUBLAS_WORKSPACE
                                       + CUDA_CONTEXT,
                                       gradients=0.0 if at_backward else gradients, optimizer=8.0 * parameters))


# What a Megatron-LM process holds beside its training state, where out of memory is decided (framework_reserve):
CUDA_WORKSPACES = 2 * 32 * 2**20  # cuBLAS's workspace (32 MiB on Hopper, CUBLAS_WORKSPACE_CONFIG :4096:8) and
# Transformer Engine's own cuBLASLt workspace (32 MiB on Hopper: transformer_engine/pytorch/module/base.py,
# get_cublas_workspace_size_bytes)
ALLOCATOR_RESERVE = 0.05  # of the activations: "buffer for optimizer and miscellaneous temporaries (5% overhead)",
# Megatron-LM's compute_activation_memory_without_sp (megatron/training/theoretical_memory_usage.py)


def framework_reserve(activations: float, kernels: str = "megatron") -> float:
    """Bytes a Megatron-LM process holds on an XPU beyond the state :func:`stage_memory` counts, with
    `activations` bytes of activations: the CUDA context (:data:`CUDA_CONTEXT`, measured), the cuBLAS and
    Transformer Engine workspaces (:data:`CUDA_WORKSPACES`) and the caching allocator's temporaries
    (:data:`ALLOCATOR_RESERVE` of the activations, Megatron-LM's own allowance); 0 for a PyTorch inventory
    (`kernels` not fused), whose :func:`eager_memory` already holds the context and the workspace.

    >>> round(framework_reserve(0.0) / 2**30, 4)  # the context and two 32 MiB workspaces
    0.8125
    >>> framework_reserve(20e9) - framework_reserve(0.0) == 0.05 * 20e9
    True
    """
    if not INVENTORIES[kernels].fused:
        return 0.0
    return CUDA_CONTEXT + CUDA_WORKSPACES + ALLOCATOR_RESERVE * activations
