"""The hybrid-parallel training graph: tensor, sequence, pipeline and data parallelism.

A :class:`Parallelism` says how a model is split (tp, pp, dp, micro-batch,
global batch, schedule, virtual stages, recomputation, sequence parallelism);
a :class:`~hcsim.workload.layout.ParallelLayout` places the split on XPUs.
:func:`build_hybrid_graph` then builds one training iteration:

- each pipeline stage holds consecutive decoders (``layer_split`` or an even
  split; with v virtual stages, stage s holds chunks s, p+s, 2p+s, ... of the
  p·v chunks); the first stage also embeds, the last computes the logits (LM
  head: 2·b·s·h·V FLOPs forward, twice that backward);
- a stage runs its passes (:mod:`hcsim.workload.schedules`) chained in the
  schedule's order on every XPU of the stage, each compute vertex running on
  all of them (one instance per XPU: every TP rank computes 1/t of a layer);
- tensor parallelism as Megatron-LM splits a decoder: the attention block and
  the MLP block each end with an all-reduce of b·s·h elements over the TP
  group in the forward pass, and their input gradients with one in the
  backward pass; with sequence parallelism each all-reduce becomes a
  reduce-scatter after the block and an all-gather before it (same bytes);
  one communication vertex carries every TP group of the stage;
- pipeline parallelism: a p2p vertex per micro-batch and chunk boundary
  carries b·s·h activation elements from each XPU of a stage to the XPU with
  the same (tp, dp) coordinates on the next stage, and their gradients back;
- data parallelism: after a chunk's last backward pass, its gradients (its
  parameters / t x gradient bytes) are all-reduced over each DP group of the
  stage; then the stage's optimizer step; the back edge from it to the stage's
  first pass closes the iteration;
- recomputation: ``full`` runs each decoder's forward again (with its TP
  all-reduces) before its backward; ``selective`` adds the attention core's
  forward FLOPs to the attention block's backward.

Per-decoder costs come from the workload's decoder table (rows before
``norm_mlp`` are the attention block, the rest the MLP block); a TP rank does
1/t of every row's FLOPs and bytes (Megatron splits heads and the MLP's
inner dimension; the norms, dropouts and adds, replicated without sequence
parallelism, are memory-bound rows of negligible FLOPs). The weight gradient
of a linear row is half its backward FLOPs (the other half is the input
gradient).
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field, replace
from itertools import product

import networkx as nx

from hcsim.errors import ConfigError
from hcsim.workload.graph import add_alike, add_comm, add_compute, add_dependency, new_workload
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.memory import stage_memory
from hcsim.workload.model import RECOMPUTATION
from hcsim.workload.schedules import Op, check_schedule, stage_order
from hcsim.workload.spec import WorkloadSpec
from hcsim.workload.ops import (ADAMW_FUSED_TRAFFIC, BACKWARD_SUFFIXES, CLIP_GRAD_NORM_TRAFFIC, GEMM_KINDS, BlockOps,
                                Op as Kernel, checkpoint_recompute, eager_embedding_ops, eager_head_ops,
                                eager_layer_ops, megatron_ops, optimizer_step_ops)
from hcsim.workload.context import check_context, kv_block_bytes
from hcsim.workload.transformer import Block, Work, decoder_layer, embedding, lm_head
from hcsim.workload.experts import EXPERT_OPS, routed_elements
from hcsim.workload.split import check_batch_split
from hcsim.workload.zero import check_zero_offload, optimizer_step_bytes

__all__ = ["Parallelism", "BlockCost", "build_hybrid_graph", "place_hybrid_memory", "stage_layers", "in_flight"]


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    """How training is split; sizes are counts, `micro_batch` and `global_batch` in samples."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    layer_split: tuple[int, ...] | None = None
    zero: int = 0  # ZeRO stage over each DP group (hcsim.workload.zero)
    offload: str = "none"  # none | cpu | cxl
    offload_state: tuple[str, ...] = ("optimizer",)  # what offload keeps out of HBM
    ep: int = 1  # expert parallelism (hcsim.workload.experts): the EP ranks also split the data
    moe_skew: float = 1.0  # most loaded EP rank's tokens / the mean (1: balanced routing)
    batch_split: tuple[int, ...] | None = None  # micro-batches per DP replica (hcsim.workload.split); None: m each
    # communicate as Megatron-LM does (the kernel model's runs): a pipeline send blocks its sender until it is
    # delivered and carries what each TP rank sends (pipeline_send), TP collectives on NCCL's channel rings
    # (algorithm nccl); False: the paper's ideal model (sends overlap the sender's next pass, every TP rank sends
    # the whole activation, plain rings)
    megatron_comm: bool = False
    cp: int = 1  # context parallelism (hcsim.workload.context): each rank holds sequence / cp tokens
    cp_algorithm: str = "ring"  # ring | all_to_all

    def __post_init__(self) -> None:
        for key in ("tp", "pp", "dp", "micro_batch", "global_batch", "virtual_stages", "ep", "cp"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key}: must be an integer >= 1, got {value!r}")
        if self.global_batch % (self.replicas * self.micro_batch):
            ep = (" x ep", f" x {self.ep}") if self.ep > 1 else ("", "")
            raise ConfigError(f"global_batch: {self.global_batch} is not a multiple of dp{ep[0]} x micro_batch = "
                              f"{self.dp}{ep[1]} x {self.micro_batch}; valid: multiples of "
                              f"{self.replicas * self.micro_batch}")
        if isinstance(self.moe_skew, bool) or not isinstance(self.moe_skew, (int, float)) or not self.moe_skew >= 1:
            raise ConfigError(f"moe_skew: must be a number >= 1 (the most loaded expert rank's tokens over the "
                              f"mean; 1 = balanced routing), got {self.moe_skew!r}")
        if self.ep > 1 and self.zero >= 1:
            raise ConfigError(f"zero: {self.zero} with ep: {self.ep} is not modelled (expert and dense parameters "
                              f"shard over different groups); valid: zero: 0 with expert parallelism")
        if self.recompute not in RECOMPUTATION:
            raise ConfigError(f"recompute: {self.recompute!r} is not one of {', '.join(RECOMPUTATION)}")
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("sequence_parallel: needs tp > 1 (it splits the tensor-parallel group's sequence)")
        check_schedule(self.schedule, self.pp, self.micro_batches, self.virtual_stages)
        if self.layer_split is not None and len(self.layer_split) != self.pp * self.virtual_stages:
            raise ConfigError(f"layer_split: gives {len(self.layer_split)} stages, expected pp x virtual_stages = "
                              f"{self.pp * self.virtual_stages}")
        check_zero_offload(self.zero, self.offload, self.offload_state)
        if self.batch_split is not None:
            self._check_batch_split()

    def _check_batch_split(self) -> None:
        check_batch_split(self.batch_split, self.dp, self.micro_batches * self.dp, "micro-batches",
                          f"global_batch / micro_batch = {self.global_batch} / {self.micro_batch}")
        if len(set(self.batch_split)) == 1:
            return
        if self.ep > 1 or self.zero == 3:
            key, valid = ("ep", "ep: 1") if self.ep > 1 else ("zero", "zero: 0, 1 or 2")
            raise ConfigError(f"batch_split: an uneven split with {key}: {getattr(self, key)} is not modelled (expert "
                              f"parallelism and ZeRO-3 run collectives inside every layer, which replicas with "
                              f"different micro-batch counts do not reach together); valid: {valid}, or "
                              f"batch_split: even")
        for count in sorted(set(self.batch_split)):
            try:
                check_schedule(self.schedule, self.pp, count, self.virtual_stages)
            except ConfigError as err:
                raise ConfigError(f"batch_split: {list(self.batch_split)} gives a replica {count} micro-batches, "
                                  f"which its schedule cannot run ({err})") from None

    @classmethod
    def of_layout(cls, spec: WorkloadSpec, layout: ParallelLayout, *, micro_batch: int | None = None,
                  global_batch: int | None = None, recompute: str | None = None, **keys) -> "Parallelism":
        """The parallelism of `layout` (its tp, pp, dp and ep) for `spec`; what is None comes from the spec:
        micro_batch its batch_per_xpu, global_batch one micro-batch per replica, recompute its recomputation."""
        sizes = layout.sizes
        micro_batch = micro_batch or spec.batch_per_xpu
        return cls(tp=sizes["tp"], pp=sizes["pp"], dp=sizes["dp"], ep=sizes["ep"], cp=sizes["cp"], micro_batch=micro_batch,
                   global_batch=global_batch or sizes["dp"] * sizes["ep"] * micro_batch,
                   recompute=recompute or spec.recomputation, **keys)

    def offloads(self, state: str) -> bool:
        """Whether `state` (optimizer, parameters, activations) is offloaded."""
        return self.offload != "none" and state in self.offload_state

    @property
    def optimizer_shards(self) -> int:
        """Ranks the optimizer state (and with ZeRO 2-3 more) is sharded over: dp x cp for Megatron-LM's
        distributed optimizer (zero 1: megatron/core/optimizer builds it on the data-parallel group with the
        context-parallel ranks, get_data_parallel_group(with_context_parallel=True)), dp for ZeRO 2-3, 1
        without ZeRO."""
        if self.zero == 0:
            return 1
        return self.dp * (self.cp if self.zero == 1 and self.ep == 1 else 1)

    @property
    def replicas(self) -> int:
        """Ranks that see different data: dp x ep (expert-parallel ranks split the batch too)."""
        return self.dp * self.ep

    @property
    def micro_batches(self) -> int:
        """m: micro-batches per iteration and data replica (the mean over the replicas with a batch_split)."""
        return self.global_batch // (self.replicas * self.micro_batch)

    def replica_classes(self) -> tuple[tuple[int, frozenset[int] | None], ...]:
        """The replicas grouped by their micro-batch count: (count, DP coordinates), in order of each count's
        first replica; one class (m, None: every replica) when all counts are equal."""
        split = self.batch_split
        if split is None or len(set(split)) == 1:
            return ((split[0] if split else self.micro_batches, None),)
        return tuple((count, frozenset(r for r, c in enumerate(split) if c == count)) for count in dict.fromkeys(split))

    def check_model(self, spec: WorkloadSpec) -> None:
        """Raise ConfigError when the model cannot be split this way."""
        model = spec.model
        if spec.costs == "table":
            raise ConfigError(f"workload {spec.name!r} takes its costs from a table (costs: table); hybrid parallelism "
                              f"derives per-rank costs from the model shape: set costs: shape (e.g. llama2-13b-shape)")
        if model.heads % self.tp:
            raise ConfigError(f"tp: {self.tp} does not divide the {model.heads} attention heads of {model.name}")
        if (model.kv_heads or model.heads) % self.tp:
            raise ConfigError(f"tp: {self.tp} does not divide the {model.kv_heads} kv heads of {model.name}")
        chunks = self.pp * self.virtual_stages
        if self.layer_split is None and model.decoders % chunks:
            raise ConfigError(f"pp: pp x virtual_stages = {chunks} does not divide the {model.decoders} decoders of "
                              f"{model.name}; give a layer_split")
        if self.layer_split is not None and (sum(self.layer_split) != model.decoders or min(self.layer_split) < 1):
            raise ConfigError(f"layer_split: {list(self.layer_split)} must be positive and sum to the "
                              f"{model.decoders} decoders of {model.name}")
        check_context(model, self.cp, self.tp, self.cp_algorithm)
        if self.cp > 1:
            refused = [text for text, bad in (("training.attention: standard (context parallelism runs flash "
                                               "attention, Transformer Engine's)", spec.attention != "flash"),
                                              ("recompute: selective", self.recompute == "selective"),
                                              ("schedule: zb-h1", self.schedule == "zb-h1"),
                                              ("a mixture-of-experts model", model.moe)) if bad]
            if refused:
                raise ConfigError(f"cp: {self.cp} is not modelled with {', '.join(refused)}; fix: cp: 1, or "
                                  f"training.attention: flash, recompute none or full, a dense model")
        if not spec.inventory.fused:
            splits = {key: getattr(self, key) for key in ("tp", "pp", "ep", "zero", "cp")
                      if getattr(self, key) > (0 if key == "zero" else 1)}
            if splits or model.moe:
                what = ", ".join(f"{key} {value}" for key, value in splits.items()) or "experts"
                raise ConfigError(f"training.kernels: {spec.kernels} models a Hugging Face model trained with plain "
                                  f"data parallelism (DDP) and a dense MLP, not {what}; fix: training.kernels: "
                                  f"megatron for tensor, pipeline, expert parallelism or ZeRO")


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCost:
    """One block (attention or MLP) of one decoder on one TP rank, per micro-batch: FLOP and bytes."""

    fwd_flops: float
    fwd_bytes: float
    input_grad_flops: float
    weight_grad_flops: float
    bwd_bytes: float
    core_flops: float = 0.0  # the attention core's forward FLOPs (what selective recomputation redoes)
    core_bytes: float = 0.0
    parameters: float = 0.0  # per TP rank

    @property
    def bwd_flops(self) -> float:
        return self.input_grad_flops + self.weight_grad_flops


def cp_layer(spec: WorkloadSpec, micro_batch: int, tp: int, sequence_parallel: bool = False, ep: int = 1,
             cp: int = 1):
    """The decoder layer on one rank of a TP group and of a CP group: its s/cp tokens, and cp times the attention
    core of s/cp tokens (hcsim.workload.context: the causal core of the whole sequence over cp ranks)."""
    layer = decoder_layer(spec.model, micro_batch=micro_batch, sequence=spec.model.sequence // cp, tp=tp,
                          sequence_parallel=sequence_parallel, ep=ep, precision=spec.precision,
                          attention=spec.attention)
    if cp == 1:
        return layer
    scaled = tuple(replace(op, forward=Work(op.forward.flops * cp, op.forward.bytes * cp),
                           backward_input=Work(op.backward_input.flops * cp, op.backward_input.bytes * cp))
                   if op.attention_core else op for op in layer.ops)
    return replace(layer, ops=scaled)


def block_costs(spec: WorkloadSpec, micro_batch: int, tp: int, sequence_parallel: bool = False, ep: int = 1,
                cp: int = 1) -> tuple[BlockCost, BlockCost]:
    """The attention and MLP blocks of one decoder on one TP rank (hcsim.workload.transformer's ops up to
    ``norm_mlp``, and from it); for a mixture-of-experts model the MLP block without the experts
    (:func:`expert_costs`); on a CP rank (:func:`cp_layer`)."""
    layer = cp_layer(spec, micro_batch, tp, sequence_parallel, ep, cp)
    split = next(i for i, op in enumerate(layer.ops) if op.name == "norm_mlp")
    return block_cost(layer.ops[:split]), block_cost([op for op in layer.ops[split:] if op.name not in EXPERT_OPS])


# Transformer Engine's userbuffers (training.tp_comm_overlap) run a GEMM's TP collective in kernels beside it
# on SMs of its own, and with set_sm_margin the GEMM's waves run on the SMs less those: the row-parallel GEMMs'
# forward, pipelined with their reduce-scatter ("pipeline"), and the column-parallel GEMMs' input and weight
# gradients, beside the input's all-gather and the gradient's reduce-scatter ("bulk"), 16 SMs each; the
# column GEMMs' forward and the row GEMMs' input gradients exchange chunks on one SM ("ring_exchange") and
# keep the rest (TE's defaults: transformer_engine/pytorch/module/base.py, initialize_ub; NeMo's recipes tune
# num_sm per model)
USERBUFFER_SMS = 16
USERBUFFER_GEMMS = ("attention_projection", "mlp_out", "qkv.dgrad", "qkv.wgrad", "mlp_in.dgrad", "mlp_in.wgrad")


def block_kernels(spec: WorkloadSpec, micro_batch: int, tp: int, sequence_parallel: bool = False, ep: int = 1,
                  cp: int = 1, tp_comm_overlap: bool = False) -> tuple[BlockOps, BlockOps]:
    """The kernels Megatron-LM runs for the attention and MLP blocks of :func:`block_costs` (the same ops:
    :func:`hcsim.workload.ops.megatron_ops`); none for a mixture-of-experts MLP block, whose vertices keep
    FLOPs / peak FLOP/s. With `tp_comm_overlap` (:func:`overlaps_tp_comm`) the GEMMs of USERBUFFER_GEMMS leave
    USERBUFFER_SMS SMs to the collective beside them."""
    layer = cp_layer(spec, micro_batch, tp, sequence_parallel, ep, cp)
    split = next(i for i, op in enumerate(layer.ops) if op.name == "norm_mlp")
    mlp = BlockOps(forward=(), backward=()) if spec.model.moe else megatron_ops(layer.ops[split:], spec.fp8_recipe,
                                                                                 spec.gradient_add)
    blocks = megatron_ops(layer.ops[:split], spec.fp8_recipe, spec.gradient_add), mlp
    return tuple(_userbuffer_margins(b) for b in blocks) if tp_comm_overlap else blocks


def decoder_kernels(spec: WorkloadSpec, par: Parallelism) -> tuple[BlockOps, BlockOps]:
    """The kernels of a decoder's attention and MLP blocks on one rank per micro-batch, as the workload's framework
    launches them: Megatron-LM's (:func:`block_kernels`) or a PyTorch inventory's (its key/value cache's copies
    where the spec does not checkpoint)."""
    if not spec.inventory.fused:
        attn, mlp, _ = eager_layer_ops(spec.model, par.micro_batch, spec.inventory.compiled,
                                       use_cache=spec.recomputation == "none")
        return attn, mlp
    return block_kernels(spec, par.micro_batch, par.tp, par.sequence_parallel, par.ep, par.cp,
                         overlaps_tp_comm(spec, par))


def model_ends(spec: WorkloadSpec, par: Parallelism) -> tuple[tuple[Block, BlockOps], tuple[Block, BlockOps]] | None:
    """The model's two ends on one rank per micro-batch, each with the kernels its framework launches for it: the
    embedding (the first stage's first chunk) and the head (the last stage's last chunk: the final norm, the
    logits and the loss); None for a model without a vocabulary (tests' uniform stages)."""
    model = spec.model
    if model.vocabulary < 1:
        return None
    keywords = dict(micro_batch=par.micro_batch, sequence=model.sequence // par.cp, tp=par.tp,
                    sequence_parallel=par.sequence_parallel, precision=spec.precision, attention=spec.attention)
    first = embedding(model, **keywords)
    last = lm_head(model, tied_copy=par.pp > 1 and model.tied_embeddings, **keywords)
    if not spec.inventory.fused:
        compiled = spec.inventory.compiled
        return ((first, eager_embedding_ops(model, par.micro_batch, compiled)),
                (last, eager_head_ops(model, par.micro_batch, compiled)[0]))
    return ((first, megatron_ops(first.ops, spec.fp8_recipe, spec.gradient_add)),
            (last, megatron_ops(last.ops, spec.fp8_recipe, spec.gradient_add, spec.cross_entropy_fusion)))


def _userbuffer_margins(blocks: BlockOps) -> BlockOps:
    def margins(kernels):
        return tuple(k._replace(sm_margin=USERBUFFER_SMS) if k.kind in GEMM_KINDS and k.name in USERBUFFER_GEMMS
                     else k for k in kernels)

    return replace(blocks, forward=margins(blocks.forward), backward=margins(blocks.backward))


def fp8_gemm_weights(spec: WorkloadSpec, par: Parallelism, decoders: int) -> float:
    """Weights of the FP8 GEMMs of `decoders` decoders on one TP rank (their linear layers; 0 unless FP8): what
    Transformer Engine quantizes once a step, whole on every rank whatever the optimizer's sharding."""
    if spec.precision != "fp8" or not spec.inventory.fused:
        return 0.0
    layer = cp_layer(spec, par.micro_batch, par.tp, par.sequence_parallel, par.ep, par.cp)
    return decoders * sum(op.parameters for op in layer.ops if op.kernel == "gemm8")


def optimizer_traffic(spec: WorkloadSpec) -> float:
    """Bytes the optimizer step vertex moves per parameter of its shard (its ``memory_bytes``, what the peak model
    times): the whole state read and written (the transformer costs never fold it into the backward pass), or
    for a PyTorch inventory fused AdamW's and the gradient clipping's."""
    if spec.inventory.fused:
        return optimizer_step_bytes(spec.main_sizes, spec.optimizer_bytes_per_parameter)
    return ADAMW_FUSED_TRAFFIC + (CLIP_GRAD_NORM_TRAFFIC if spec.clip_grad_norm else 0.0)


def optimizer_kernels(spec: WorkloadSpec, par: Parallelism, parameters: float, decoders: int) -> tuple[Kernel, ...]:
    """The optimizer step's kernels on a rank that holds `parameters` (per TP rank) of `decoders` decoders
    (:func:`hcsim.workload.ops.optimizer_step_ops`): the step over its optimizer shard; the gradient buffer it
    zeroes whole under ZeRO 0-1 (Megatron-LM's distributed optimizer does not shard it), sharded under 2-3, and
    with dp x cp > 1 scales before reducing it."""
    shard = 1.0 / par.optimizer_shards
    return optimizer_step_ops(parameters * shard, spec.precision, spec.kernels, spec.optimizer_bytes_per_parameter,
                              spec.fp8_recipe, fp8_gemm_weights(spec, par, decoders), spec.clip_grad_norm,
                              spec.main_gradient, parameters * (shard if par.zero >= 2 else 1.0), par.dp * par.cp > 1)


def expert_costs(spec: WorkloadSpec, micro_batch: int, tp: int, sequence_parallel: bool = False, ep: int = 1,
                 skew: float = 1.0) -> BlockCost | None:
    """The experts of one MoE decoder on one rank of its TP and EP groups, x `skew` (the most loaded rank's
    pace: hcsim.workload.experts); None for a dense model."""
    if not spec.model.moe:
        return None
    layer = decoder_layer(spec.model, micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel, ep=ep,
                          precision=spec.precision, attention=spec.attention)
    block = block_cost([op for op in layer.ops if op.name in EXPERT_OPS])
    return replace(block, fwd_flops=block.fwd_flops * skew, fwd_bytes=block.fwd_bytes * skew,
                   input_grad_flops=block.input_grad_flops * skew, weight_grad_flops=block.weight_grad_flops * skew,
                   bwd_bytes=block.bwd_bytes * skew)


def block_cost(ops) -> BlockCost:
    """The FLOPs and bytes of transformer ops (:class:`hcsim.workload.transformer.Op`) run as one block."""
    def total(key, part):
        return sum(getattr(getattr(op, key), part) for op in ops)

    core = [op for op in ops if op.attention_core]
    return BlockCost(fwd_flops=total("forward", "flops"), fwd_bytes=total("forward", "bytes"),
                     input_grad_flops=total("backward_input", "flops"),
                     weight_grad_flops=total("backward_weight", "flops"),
                     bwd_bytes=total("backward_input", "bytes") + total("backward_weight", "bytes"),
                     core_flops=sum(op.forward.flops for op in core), core_bytes=sum(op.forward.bytes for op in core),
                     parameters=sum(op.parameters for op in ops))


def stage_layers(spec: WorkloadSpec, par: Parallelism) -> list[list[int]]:
    """Per pipeline stage, per chunk (virtual stage), the number of decoders it holds."""
    chunks = par.pp * par.virtual_stages
    split = par.layer_split or (spec.model.decoders // chunks,) * chunks
    return [[split[c * par.pp + s] for c in range(par.virtual_stages)] for s in range(par.pp)]


def in_flight(order: list[Op]) -> int:
    """The most micro-batch chunks whose activations a stage holds at once in `order` (a forward keeps them
    until the backward, or the weight-gradient pass when the schedule splits them)."""
    frees = "W" if any(op.kind == "W" for op in order) else "B"
    held = peak = 0
    for op in order:
        held += (op.kind == "F") - (op.kind == frees)
        peak = max(peak, held)
    return peak


@dataclass
class _Builder:
    spec: WorkloadSpec
    par: Parallelism
    layout: ParallelLayout
    group_order: object = None
    graph: nx.DiGraph = field(init=False)

    def __post_init__(self) -> None:
        self._groups: dict = {}
        self._class_xpus: dict = {}
        self._kernel_tuples: dict[tuple, tuple] = {}  # shared_kernels
        self._alike: dict[tuple, dict] = {}  # what alike vertices' attributes follow from -> the last one's (add_alike)
        self._members: dict[int, tuple] = {}  # members: id(groups) -> (groups, their XPUs)
        spec, par = self.spec, self.par
        # fixed by the spec and the layout: read for every backward unit while the graph is built
        self.overlapped_param_gather = overlaps_param_gather(spec, par)
        self.overlapped_grad_reduce = overlaps_grad_reduce(spec, par)
        self.overlapped_tp = overlaps_tp_comm(spec, par)
        self.classes = par.replica_classes()
        self.attn, self.mlp = block_costs(spec, par.micro_batch, par.tp, par.sequence_parallel, par.ep, par.cp)
        self.experts = expert_costs(spec, par.micro_batch, par.tp, par.sequence_parallel, par.ep, par.moe_skew)
        # kernels of each block for the engine's roofline model (hcsim.workload.ops; dense blocks only), as the
        # workload's framework launches them
        self.attn_ops, self.mlp_ops = decoder_kernels(spec, par)
        self.balanced = expert_costs(spec, par.micro_batch, par.tp, par.sequence_parallel, par.ep)  # model FLOPs
        self.expert_parameters = self.experts.parameters if self.experts else 0.0  # per TP rank, held
        self.dispatch = routed_elements(spec.model, par.micro_batch, par.tp) * spec.sizes.activation * par.moe_skew
        self.units: dict[int, list[tuple[str, str, float, str]]] = {}  # stage -> (first, last, params, tag)
        # stage -> (chunk, unit label) -> (params, {replica class: (first, last) of its first forward use}), in
        # the order class 0 first uses them: what an overlapped ZeRO 1-2 parameter gather feeds
        self.first_uses: dict[int, dict[tuple[int, str], tuple[float, dict[int, tuple[str, str]]]]] = {}
        # (stage, replica class, backward pass) -> (unit label, the vertex its weight gradients are ready after),
        # in backward order: what an overlapped gradient reduction's buckets wait for
        self.grads_ready: dict[tuple[int, int, Op], list[tuple[str, str]]] = {}
        self.layers = stage_layers(spec, par)
        model = spec.model
        self.activation = par.micro_batch * model.sequence // par.cp * model.hidden * spec.sizes.activation
        ends = model_ends(spec, par)
        self.vocabulary = ends is not None  # a model without one (tests: uniform stages) has no ends
        (self.embedding, self.embedding_ops), (self.head, self.head_ops) = ends or ((None, None), (None, None))
        self.graph = new_workload(spec.name, precision=spec.precision,
                                  samples_per_iteration=par.global_batch // par.replicas,
                                  layout=self.layout.to_dict(), global_samples=par.global_batch,
                                  tokens_per_sample=model.sequence,
                                  model_flops=self.model_flops(),
                                  parallelism={k: getattr(par, k) for k in ("tp", "pp", "dp", "micro_batch",
                                               "global_batch", "schedule", "virtual_stages", "recompute",
                                               "sequence_parallel", "zero", "offload", "ep", "moe_skew")},
                                  model=model.name, decoders=model.decoders, granularity=spec.granularity,
                                  kernels=spec.kernels)
        if len(self.classes) > 1:  # micro-batches per DP replica; an even split leaves the graph as it was
            self.graph.graph.update(batch_split=list(par.batch_split), batch_split_unit="micro-batches")

    def model_flops(self) -> float:
        """FLOP of one iteration of the whole job, forward and backward, no recomputation (Megatron-LM's count:
        :func:`hcsim.workload.transformer.iteration_flops`)."""
        blocks = [b for b in (self.attn, self.mlp, self.balanced) if b]
        per_rank = self.spec.model.decoders * sum(b.fwd_flops + b.bwd_flops for b in blocks)
        if self.vocabulary:
            per_rank += sum(b.forward.flops + b.backward.flops for b in (self.embedding, self.head))
        return per_rank * self.par.tp * self.par.cp * self.par.micro_batches * self.par.replicas

    def groups(self, axis: str, stage: int, k: int = 0) -> tuple[tuple[str, ...], ...]:
        """The groups of `axis` on `stage`, in ring order; one shared tuple per (axis, stage). Axis
        "replicas": the XPUs that hold the same dense parameters (the cp x ep x dp ranks with equal tp
        coordinates). With an uneven batch_split, `k` keeps the groups of an axis inside a replica (tp, ep) to
        replica class k; the groups across replicas (dp, replicas) are the stage's whatever `k`."""
        inside = axis not in ("dp", "replicas") and self.classes[k][1] is not None
        key = (axis, stage, k) if inside else (axis, stage)
        if key not in self._groups:
            members = set(self.class_xpus(stage, k) if inside else self.layout.stage_xpus(stage))
            if axis == "replicas" and (self.par.ep > 1 or self.par.cp > 1):
                by_coordinates: dict = {}
                for x in self.layout.stage_xpus(stage):
                    c = self.layout.coordinates(x)
                    by_coordinates.setdefault(c["tp"], []).append(x)  # the CP ranks hold the same parameters
                found = tuple(tuple(g) for g in by_coordinates.values())
            else:
                found = tuple(g for g in self.layout.groups("dp" if axis == "replicas" else axis) if g[0] in members)
            self._groups[key] = tuple(tuple(self.group_order(g)) for g in found) if self.group_order else found
        return self._groups[key]

    def members(self, groups: tuple[tuple[str, ...], ...], stage: int, k: int = 0) -> tuple[str, ...]:
        """The XPUs of `groups` (:meth:`groups` of `stage` and replica class k), group by group, as add_comm lists
        them: one shared tuple per groups, the class's compute vertices' own where equal, so the many vertices over
        them (a TP collective per layer and micro-batch, the blocks around it) hold the same one."""
        found = self._members.get(id(groups))
        if found is None:
            xpus = groups[0] if len(groups) == 1 else sum(groups, ())
            compute = self.class_xpus(stage, k)
            found = self._members[id(groups)] = (groups, compute if compute == xpus else xpus)
        return found[1]  # the entry keeps `groups` alive: ids stay unique

    def class_xpus(self, stage: int, k: int) -> tuple[str, ...]:
        """The XPUs of `stage` in the replicas of class k (:meth:`Parallelism.replica_classes`), topology order."""
        replicas = self.classes[k][1]
        xpus = self.layout.stage_xpus(stage)
        if replicas is None:
            return xpus
        if (stage, k) not in self._class_xpus:
            self._class_xpus[stage, k] = tuple(x for x in xpus if self.layout.coordinates(x)["dp"] in replicas)
        return self._class_xpus[stage, k]

    def class_tag(self, k: int) -> str:
        """The part of vertex names that tells replica classes apart: "" for one class, ".m5" for the class
        of replicas that run 5 micro-batches."""
        count, replicas = self.classes[k]
        return "" if replicas is None else f".m{count}"

    def build(self) -> nx.DiGraph:
        par = self.par
        self.first: dict = {}  # (stage, replica class, op) -> first vertex, last vertex
        self.following: dict = {}  # (stage, replica class, op) -> the first vertex of the next op on the stage
        self.steady: set = set()  # (stage, replica class, op) of the passes whose sends overlap the next pass
        self._first_chunks: list[tuple[str, str]] = []  # (overlapped TP chunks, the pass's first block beside them)
        for stage in range(par.pp):
            self.add_stage(stage)
        self.add_pipeline_transfers()
        self.start_first_chunks()
        return self.graph

    # ---- one stage -------------------------------------------------------------------------------------

    def add_stage(self, stage: int) -> None:
        """The stage's passes chained in schedule order, one chain per replica class (each over its micro-batch
        count), then the gradient collectives and the optimizer step, and the back edges to each chain."""
        par = self.par
        heads, tails = [], []
        last_of_chunk: dict[int, list[str]] = {}  # chunk -> per class, its last backward (or W) pass
        final_passes: dict[int, list[tuple[int, Op]]] = {}  # chunk -> per class, (class, that pass)
        for k, (count, _) in enumerate(self.classes):
            order = stage_order(par.schedule, stages=par.pp, micro_batches=count, stage=stage,
                                chunks=par.virtual_stages)
            if par.schedule == "interleaved" and self.spec.overlap_p2p_comm:
                self.steady.update((stage, k, op) for op in steady_state(order))
            previous = None
            lasts: dict[int, tuple[str, Op]] = {}
            for before, op in zip([None, *order], order):
                first, last = self.add_op(stage, op, self.class_xpus(stage, k), start=previous is None, k=k)
                self.first[stage, k, op] = (first, last)
                if previous is not None:
                    add_dependency(self.graph, previous, first)
                    self.following[stage, k, before] = first
                previous = last
                if op.kind == ("W" if par.schedule == "zb-h1" else "B"):
                    lasts[op.chunk] = (last, op)
            for chunk, (last, op) in lasts.items():
                last_of_chunk.setdefault(chunk, []).append(last)
                final_passes.setdefault(chunk, []).append((k, op))
            heads.append(self.first[stage, k, order[0]][0])
            tails.append(previous)
        end = self.add_optimizer(stage, self.layout.stage_xpus(stage), tails, last_of_chunk, final_passes)
        for head in heads:
            add_dependency(self.graph, end, head, skip_first_iteration=True)
        if par.zero == 3 and par.dp > 1:
            self.add_parameter_gathers(stage, end)
        elif self.overlapped_param_gather:
            self.add_overlapped_param_gathers(stage, end)

    def add_optimizer(self, stage: int, xpus, previous: list[str], last_of_chunk: dict[int, list[str]],
                      final_passes: dict[int, list[tuple[int, Op]]]) -> str:
        """The DP gradient collectives, the optimizer step (on its shard with ZeRO, on the host CPU or over
        CXL with offload) and, for ZeRO 1-2, the all-gather of the updated weights; returns the last vertex.

        `previous`: each replica class's last pass; `last_of_chunk`: per chunk, each class's last backward of
        it (a replica's members of a gradient collective arrive when their own backward is done);
        `final_passes`: per chunk, (class, that pass), whose units' gradients an overlapped reduction's buckets
        wait for."""
        par, spec, sizes = self.par, self.spec, self.spec.main_sizes
        shard = 1.0 / par.optimizer_shards
        parameters = sum(self.chunk_parameters(stage, c) for c in range(par.virtual_stages))
        per_parameter = optimizer_traffic(spec)
        opt = add_compute(self.graph, f"s{stage}.optimizer", xpus=xpus,
                          flops=spec.optimizer_flops_per_parameter * parameters * shard,
                          memory_bytes=per_parameter * parameters * shard)
        self.graph.nodes[opt].update(phase="optimizer", stage=stage,
                                     ops=optimizer_kernels(spec, par, parameters, sum(self.layers[stage])))
        on_cpu = par.offloads("optimizer") and par.offload == "cpu"
        if par.offloads("optimizer"):
            self.graph.nodes[opt].update(offload=par.offload, **({"host": "cpu"} if on_cpu else
                                                                 {"spilled_xpus": frozenset(xpus)}))
        for last in previous:
            add_dependency(self.graph, last, opt)
        for chunk, lasts in sorted(last_of_chunk.items()):
            parts = (("grads", "replicas", "dense"), ("expert_grads", "dp", "experts")) if par.ep > 1 \
                else (("grads", "replicas", "all"),) if par.cp > 1 else (("grads", "dp", "all"),)
            reduced = []
            for label, axis, kind in parts:
                if par.dp * (par.ep * par.cp if axis == "replicas" else 1) == 1 \
                        or not self.chunk_parameters(stage, chunk, kind):
                    continue
                buckets = self.grad_buckets(stage, final_passes[chunk], kind) if chunk == 0 \
                    and self.overlapped_grad_reduce else [(self.chunk_parameters(stage, chunk, kind), lasts)]
                for i, (bucket, ready) in enumerate(buckets):
                    name = f"s{stage}.c{chunk}.{label}" + (f".bucket{i}" if len(buckets) > 1 else "")
                    add_comm(self.graph, name, groups=self.groups(axis, stage),
                             collective="reduce_scatter" if par.zero >= 1 else "all_reduce",
                             bytes=bucket * sizes.gradient,
                             algorithm=self.ring(self.spec.algorithm if par.zero == 0 else "ring"),
                             chunks=self.spec.chunks if par.zero == 0 else None)
                    self.graph.nodes[name].update(phase="allreduce", stage=stage)
                    for vertex in ready + reduced[-1:] * bool(i):  # one bucket after another
                        add_dependency(self.graph, vertex, name)
                    reduced.append(name)
            for name in reduced[:-1]:
                add_dependency(self.graph, name, opt)
            lasts = reduced[-1:] or lasts
            if on_cpu:  # ZeRO-Offload: the chunk's gradient shard to host DRAM as soon as it is reduced
                lasts = [self.add_move(f"s{stage}.c{chunk}.offload.grads", xpus, stage, "out", lasts,
                                       self.chunk_parameters(stage, chunk) * shard * sizes.gradient)]
            for last in lasts:
                add_dependency(self.graph, last, opt)
        end = opt
        if on_cpu:
            end = self.add_move(f"s{stage}.offload.weights", xpus, stage, "in", [opt],
                                parameters * shard * sizes.weight)
        if par.zero in (1, 2) and par.optimizer_shards > 1 and not self.overlapped_param_gather:
            name = add_comm(self.graph, f"s{stage}.weights.all_gather",
                            groups=self.groups("replicas" if par.optimizer_shards > par.dp else "dp", stage),
                            collective="all_gather", bytes=parameters * sizes.weight, algorithm=self.ring())
            self.graph.nodes[name].update(phase="zero", stage=stage)
            add_dependency(self.graph, end, name)
            end = name
        return end

    def add_move(self, name: str, xpus, stage: int, direction: str, after: list[str], size: float) -> str:
        """A copy of `size` bytes between each XPU and its offload memory (`direction` in | out), after the
        vertices `after`."""
        add_compute(self.graph, name, xpus=xpus, flops=0.0, memory_bytes=size)
        self.graph.nodes[name].update(phase="offload", stage=stage, move=direction, offload=self.par.offload)
        for vertex in after:
            add_dependency(self.graph, vertex, name)
        return name

    def add_parameter_gathers(self, stage: int, optimizer: str) -> None:
        """ZeRO-3: an all-gather of each unit's weights before it runs, one unit ahead (module zero)."""
        units = self.units[stage]
        groups = self.groups("dp", stage)
        gathers = []
        for k, (first, _, parameters, tag) in enumerate(units):
            name = add_comm(self.graph, f"{tag}.gather", groups=groups, collective="all_gather",
                            bytes=parameters * self.spec.sizes.weight, algorithm=self.ring(), start=not k)
            self.graph.nodes[name].update(phase="zero", stage=stage)
            add_dependency(self.graph, name, first)
            if k:
                add_dependency(self.graph, gathers[-1], name)
            if k >= 2:
                add_dependency(self.graph, units[k - 2][1], name)
            gathers.append(name)
        add_dependency(self.graph, optimizer, gathers[0], skip_first_iteration=True)

    def add_overlapped_param_gathers(self, stage: int, optimizer: str) -> None:
        """ZeRO 1-2 with ``overlap_param_gather``: the updated weights all-gathered unit by unit (Megatron-LM's
        buckets, here a decoder, the embedding or the head) at the start of the next iteration, after that
        iteration's optimizer step (a skip_first_iteration edge: iteration 1 gathers too, as if just stepped),
        one after another on one stream; the gather of unit i starts once unit i-2's first forward has ended
        (Megatron's forward pre-hook of unit i-1 waits for its own gather and starts the next), and each
        replica class's first forward of a unit waits for its gather."""
        groups = self.groups("replicas" if self.par.optimizer_shards > self.par.dp else "dp", stage)
        gathers: list[str] = []
        uses = list(self.first_uses[stage].items())
        for i, ((chunk, label), (parameters, firsts)) in enumerate(uses):
            name = add_comm(self.graph, f"s{stage}.c{chunk}.{label}.param_gather", groups=groups,
                            collective="all_gather", bytes=parameters * self.spec.sizes.weight,
                            algorithm=self.ring(), start=not i)
            self.graph.nodes[name].update(phase="zero", stage=stage)
            for first, _ in firsts.values():
                add_dependency(self.graph, name, first)
            if i:
                add_dependency(self.graph, gathers[-1], name)
            if i >= 2:  # class 0's first forward of unit i-2 has ended
                _, earlier = uses[i - 2][1]
                add_dependency(self.graph, earlier[0][1], name)
            gathers.append(name)
        add_dependency(self.graph, optimizer, gathers[0], skip_first_iteration=True)

    def grad_buckets(self, stage: int, passes: list[tuple[int, Op]], kind: str) -> list[tuple[float, list[str]]]:
        """(parameters, the vertices whose end makes them ready: one per replica class) of each gradient bucket
        of the stage's first chunk: whole units from the last one back, a bucket closed once it holds
        max(40M, 1M x dp x cp) parameters (Megatron-LM's default bucket_size, counted in parameters of `kind`:
        dense and expert gradients sit in buffers of their own); the last bucket takes what is left."""
        size = grad_bucket_size(self.par)
        units = [self.grads_ready[stage, k, op] for k, op in passes]
        buckets, held = [], 0.0
        for i, (label, _) in enumerate(units[0]):
            held += self.unit_parameters(label, kind)
            if held and (held >= size or i == len(units[0]) - 1):
                buckets.append((held, [unit[i][1] for unit in units]))
                held = 0.0
        return buckets

    def unit_parameters(self, label: str, kind: str = "all") -> float:
        """Parameters of one unit (a decoder: any other label, the embedding, the head) on one TP rank, of
        `kind` ("all", "dense", "experts": the experts a rank holds)."""
        if label in ("embedding", "head"):
            return (self.embedding if label == "embedding" else self.head).parameters if kind != "experts" else 0.0
        dense, experts = self.attn.parameters + self.mlp.parameters, self.expert_parameters
        return {"all": dense + experts, "dense": dense, "experts": experts}[kind]

    def chunk_parameters(self, stage: int, chunk: int, kind: str = "all") -> float:
        """Parameters of one chunk on one TP rank (with the embedding's on the first, the head's on the last);
        `kind` "dense" or "experts" counts only those (the experts a rank holds)."""
        first, last = self.ends(stage, chunk)
        layers = self.layers[stage][chunk]
        dense = (layers * self.unit_parameters("decoder", "dense") + (self.unit_parameters("embedding") if first else 0)
                 + (self.unit_parameters("head") if last else 0))
        experts = layers * self.unit_parameters("decoder", "experts")
        return {"all": dense + experts, "dense": dense, "experts": experts}[kind]

    def ends(self, stage: int, chunk: int) -> tuple[bool, bool]:
        """Whether (stage, chunk) holds the model's first layers (embedding) and its last (head)."""
        return (self.vocabulary and stage == 0 and chunk == 0,
                self.vocabulary and stage == self.par.pp - 1 and chunk == self.par.virtual_stages - 1)

    def add_op(self, stage: int, op: Op, xpus, start: bool, k: int = 0) -> tuple[str, str]:
        """Add the vertices of one pass of replica class k on `xpus`, chained; return its first and last vertex."""
        par = self.par
        decoders = self.layers[stage][op.chunk]
        tag = f"s{stage}{self.class_tag(k)}.c{op.chunk}.mb{op.micro_batch}.{op.kind}"
        chain: list[str] = []
        is_first, is_last = self.ends(stage, op.chunk)

        def compute(suffix, flops, size, ops=()):
            if not self.spec.inventory.fused and ops:  # the memory traffic of the kernels the framework runs
                size = math.fsum(op.bytes for op in ops)
            ops, first = tuple(ops), start and not chain
            key = (id(xpus), suffix, op.kind, op.chunk, stage, id(ops))  # alike: one per micro-batch
            like = self._alike.get(key)
            if like is not None and like["ops"] is ops and like["flops"] == flops and like["memory_bytes"] == size:
                chain.append(add_alike(self.graph, f"{tag}.{suffix}", like, start=first, micro_batch=op.micro_batch))
                return
            phase = "recompute" if ".recompute" in suffix else {"F": "fwd", "B": "bwd", "W": "bwd"}[op.kind]
            chain.append(add_compute(self.graph, f"{tag}.{suffix}", xpus=xpus, flops=flops, memory_bytes=size,
                                     start=first, phase=phase, stage=stage, chunk=op.chunk,
                                     micro_batch=op.micro_batch, step=op.kind, ops=ops))
            self._alike[key] = self.graph.nodes[chain[-1]]

        ends = [(self.embedding, "embedding")] * is_first + [(self.head, "head")] * is_last
        if op.kind == "W":  # zero-bubble: the weight gradients of the chunk, deferred
            work = [(block.backward_weight, label) for block, label in ends]
            blocks = (self.attn, self.mlp, self.experts)
            flops = decoders * sum(b.weight_grad_flops for b in blocks if b) + sum(w.flops for w, _ in work)
            kernels = self.shared_kernels(("wgrad", decoders, is_first, is_last), lambda: tuple(
                k for k in self.attn_ops.backward + self.mlp_ops.backward if k.name.endswith(".wgrad")) * decoders
                + tuple(Kernel(f"{label}.wgrad", "memory", 0.0, w.bytes) for w, label in work))
            compute("wgrad", flops, sum(w.bytes for w, _ in work), kernels)
            return self._chain(chain)
        split = par.schedule == "zb-h1"
        units = self.units.setdefault(stage, [])  # what ZeRO-3 gathers before it runs, in execution order
        decoder = self.attn.parameters + self.mlp.parameters + self.expert_parameters

        def unit(mark: int, parameters: float, label: str) -> None:
            units.append((chain[mark], chain[-1], parameters, f"{tag}.{label}"))
            if op.kind == "B" and self.overlapped_grad_reduce:
                self.grads_ready.setdefault((stage, k, op), []).append((label, chain[-1]))
            if op.kind == "F":
                uses = self.first_uses.setdefault(stage, {}).setdefault((op.chunk, label), (parameters, {}))[1]
                uses.setdefault(k, (chain[mark], chain[-1]))

        if op.kind == "F":
            if is_first:
                compute("embedding", self.embedding.forward.flops, self.embedding.forward.bytes,
                        self.embedding_ops.forward)
                unit(len(chain) - 1, self.embedding.parameters, "embedding")
            for d in range(decoders):
                mark = len(chain)
                self.add_decoder_forward(compute, chain, stage, f"L{d}", k)
                unit(mark, decoder, f"L{d}")
            if is_last:
                compute("head", self.head.forward.flops, self.head.forward.bytes, self.head_ops.forward)
                unit(len(chain) - 1, self.head.parameters, "head")
            return self._chain(chain)
        if is_last:
            work = self.head.backward_input if split else self.head.backward
            kernels = self.shared_kernels(("head", split), lambda: (
                k for k in self.head_ops.backward if not (split and k.name.endswith(".wgrad"))))
            compute("head", work.flops, work.bytes, kernels)
            unit(len(chain) - 1, self.head.parameters, "head")
        for d in reversed(range(decoders)):
            mark = len(chain)
            if par.recompute == "full":
                self.add_decoder_forward(compute, chain, stage, f"L{d}.recompute", k, recompute=True)
            for block, ops, label in ((self.mlp, self.mlp_ops, "mlp"), (self.attn, self.attn_ops, "attn")):
                if self.experts and label == "mlp":  # the combine's gradients, experts, the dispatch's
                    self.add_all_to_all(chain, stage, f"{tag}.L{d}.combine_grad")
                    experts = self.experts
                    compute(f"L{d}.experts", experts.input_grad_flops if split else experts.bwd_flops,
                            experts.bwd_bytes)
                    self.add_all_to_all(chain, stage, f"{chain[-1]}.dispatch_grad")
                flops = block.input_grad_flops if split else block.bwd_flops
                size = block.bwd_bytes
                selective = par.recompute == "selective"
                kernels = self.shared_kernels((label, split, selective), lambda: (ops.core if selective else ()) + tuple(
                    k for k in ops.backward if not (split and k.name.endswith(".wgrad"))))
                if selective:
                    flops, size = flops + block.core_flops, size + block.core_bytes
                block_start = len(chain)
                if label == "attn" and par.cp > 1:
                    self.add_cp_attention(compute, chain, stage, f"L{d}", kernels, backward=True, k=k)
                else:
                    compute(f"L{d}.{label}", flops, size, kernels)
                self.add_tp_collective(chain, stage, f"{chain[-1]}.tp", block_start, k=k)
            unit(mark, decoder, f"L{d}")
        if is_first:
            work = self.embedding.backward_input if split else self.embedding.backward
            compute("embedding", work.flops, work.bytes, self.embedding_ops.backward if not split else
                    (Kernel("embedding.bwd", "memory", 0.0, work.bytes),))
            unit(len(chain) - 1, self.embedding.parameters, "embedding")
        return self._chain(chain)

    def shared_kernels(self, key: tuple, make) -> tuple:
        """The kernel tuple `make()` gives for `key`, made once per build: alike vertices (one per layer and
        micro-batch) then hold the same tuple, so the roofline model's time (cached per tuple) and the engine core's
        compute rows (hcsim.engine.core.workload) are worked out once, not once per vertex."""
        kernels = self._kernel_tuples.get(key)
        if kernels is None:
            kernels = self._kernel_tuples[key] = tuple(make())
        return kernels

    def add_decoder_forward(self, compute, chain, stage, label, k: int = 0, recompute: bool = False) -> None:
        """A decoder's forward (`recompute`: again in backward; a PyTorch inventory's checkpoint stops early)."""
        for block, ops, name in ((self.attn, self.attn_ops, "attn"), (self.mlp, self.mlp_ops, "mlp")):
            block_start = len(chain)
            if name == "attn" and self.par.cp > 1:
                self.add_cp_attention(compute, chain, stage, label, ops.forward, backward=False, k=k)
            elif recompute and name == "mlp" and checkpoint_stops_early(self.spec):
                kernels = self.shared_kernels(("recompute", name), lambda: checkpoint_recompute(ops.forward))
                compute(f"{label}.{name}", math.fsum(op.flops for op in kernels), block.fwd_bytes, kernels)
            else:
                compute(f"{label}.{name}", block.fwd_flops, block.fwd_bytes, ops.forward)
            if self.experts and name == "mlp":  # dispatch, experts, combine
                self.add_all_to_all(chain, stage, f"{chain[-1]}.dispatch")
                compute(f"{label}.experts", self.experts.fwd_flops, self.experts.fwd_bytes)
                self.add_all_to_all(chain, stage, f"{chain[-1]}.combine")
            self.add_tp_collective(chain, stage, f"{chain[-1]}.tp", block_start, k=k)

    def add_cp_attention(self, compute, chain, stage: int, label: str, kernels, backward: bool, k: int = 0) -> None:
        """The attention block of a context-parallel rank (hcsim.workload.context), forward or backward: the kernels
        before the attention core, the core, the kernels after it, and the CP group's exchange.

        ring: the core is cp blocks; the K/V blocks (backward: and their gradients) pass around the CP group
        beside the first cp - 1 and the last waits for them, so the block takes c + (cp - 1)·max(c, t) for a
        block computation c and a step transfer t. all_to_all: Q, K, V (backward: the output's gradient) go
        from sequence- to head-split before the core and the output (the Q, K, V gradients) back after it."""
        par, model, e = self.par, self.spec.model, self.spec.sizes.activation
        at = [i for i, op in enumerate(kernels) if op.kind == "attention"]
        before, core, after = kernels[:at[0]], kernels[at[0]:at[-1] + 1], kernels[at[-1] + 1:]
        groups = self.groups("cp", stage, k)
        tokens, width = par.micro_batch * model.sequence / par.cp, (model.hidden + 2 * model.kv_hidden) / par.tp

        def part(suffix, ops):
            compute(f"{label}.attn{suffix}", sum(op.flops for op in ops), sum(op.bytes for op in ops), ops)

        def exchange(suffix, size, collective):
            vertex = add_comm(self.graph, f"{chain[-1]}.{suffix}", groups=groups, bytes=size, collective=collective,
                              algorithm=self.ring() if collective != "all_to_all" else "pairwise")
            self.graph.nodes[vertex].update(phase="cp", stage=stage)
            return vertex

        part("", before)
        if par.cp_algorithm == "ring":
            cp = par.cp
            blocks = [[op._replace(name=_block_name(op.name, i), flops=op.flops / cp, bytes=op.bytes / cp)
                       for op in core] for i in range(cp)]
            kv = exchange("kv", (2 if backward else 1) * cp * kv_block_bytes(model, par.micro_batch, par.tp, cp, e),
                          "all_gather")  # each step one rank's K, V (and their gradients) to the next
            add_dependency(self.graph, chain[-1], kv)
            part(".core", [op for block in blocks[:-1] for op in block])
            part(".last", blocks[-1])
            add_dependency(self.graph, kv, chain[-1])
        else:
            into, out = (tokens * model.hidden / par.tp * e, tokens * width * e)
            chain.append(exchange("a2a_in", out if not backward else into, "all_to_all"))
            part(".core", [op._replace(m=model.sequence, n=op.n // par.cp) for op in core])
            chain.append(exchange("a2a_out", into if not backward else out, "all_to_all"))
        part(".post", after)

    def add_all_to_all(self, chain: list[str], stage: int, name: str) -> None:
        """An all-to-all of the tokens' activations (or their gradients) over every EP group of the stage."""
        if self.par.ep == 1:
            return
        vertex = add_comm(self.graph, name, groups=self.groups("ep", stage), bytes=self.dispatch,
                          collective="all_to_all", algorithm="pairwise")
        self.graph.nodes[vertex].update(phase="ep", stage=stage)
        chain.append(vertex)

    def add_tp_collective(self, chain: list[str], stage: int, name: str, mark: int, k: int = 0) -> None:
        """The TP collective after a block (of replica class k; the block's vertices are chain[mark:]): one
        all-reduce, or (SP) a reduce-scatter and an all-gather. Overlapped (training.tp_comm_overlap, Transformer
        Engine's userbuffers: sequence parallel only), each runs in t chunks pipelined with the GEMMs beside it, so
        only one chunk (1/t of the bytes) stays exposed after the block and the other t - 1 run beside the block,
        from when it may start: max(block, (t - 1)/t of the collectives) + their last 1/t."""
        par = self.par
        if par.tp == 1:
            return
        kinds = ("reduce_scatter", "all_gather") if par.sequence_parallel else ("all_reduce",)
        if not self.overlapped_tp:
            chain.extend(self._tp_comm(f"{name}.{kind}", stage, k, kind, 1.0) for kind in kinds)
            return
        t = par.tp
        hidden = [self._tp_comm(f"{name}.{kind}.hidden", stage, k, kind, (t - 1) / t) for kind in kinds]
        exposed = [self._tp_comm(f"{name}.{kind}", stage, k, kind, 1 / t) for kind in kinds]
        for before, after in zip(hidden, [*hidden[1:], exposed[0]]):
            add_dependency(self.graph, before, after)
        if mark > 0:  # from the end of the vertex before the block
            add_dependency(self.graph, chain[mark - 1], hidden[0])
        else:  # the pass's first block: from what it waits for, all known once the graph is built
            self._first_chunks.append((hidden[0], chain[0]))
        chain.extend(exposed)

    def start_first_chunks(self) -> None:
        """The overlapped TP chunks beside each pass's first block wait for what the block's first vertex waits
        for, by the same rules (and start the iteration where it does)."""
        graph = self.graph
        for chunks, first in self._first_chunks:
            for before, edge in list(graph.pred[first].items()):
                add_dependency(graph, before, chunks, wait=edge["wait"],
                               skip_first_iteration=edge["skip_first_iteration"])
            if graph.nodes[first]["start"]:
                graph.nodes[chunks]["start"] = True

    def _tp_comm(self, name: str, stage: int, k: int, kind: str, share: float) -> str:
        """A TP collective of `share` of a block's activation over the stage's TP groups of replica class k."""
        like = self._alike.get(("tp", stage, k, kind, share))  # alike: one per layer and micro-batch
        if like is not None:
            return add_alike(self.graph, name, like)
        groups = self.groups("tp", stage, k)
        size = self.activation * share * (tp_gather_share(self.spec) if kind == "all_gather" else 1.0)
        vertex = add_comm(self.graph, name, groups=groups, bytes=size, collective=kind,
                          algorithm=self.ring(), members=self.members(groups, stage, k), phase="tp", stage=stage)
        self._alike["tp", stage, k, kind, share] = self.graph.nodes[vertex]
        return vertex

    def ring(self, name: str = "ring") -> str:
        """The algorithm a collective named `name` runs: NCCL's channel rings for a ring under megatron_comm."""
        return "nccl" if self.par.megatron_comm and name == "ring" else name

    def _chain(self, chain: list[str]) -> tuple[str, str]:
        for before, after in zip(chain, chain[1:]):
            add_dependency(self.graph, before, after)
        return chain[0], chain[-1]

    # ---- between stages ----------------------------------------------------------------------------------

    def add_pipeline_transfers(self) -> None:
        """Activations forward and gradients backward across every chunk boundary, per micro-batch."""
        par = self.par
        p, v = par.pp, par.virtual_stages
        for k, (count, _) in enumerate(self.classes):
            tag = self.class_tag(k)
            for q in range(p * v - 1):  # virtual stage q -> q + 1
                (s, c), (t, d) = (q % p, q // p), ((q + 1) % p, (q + 1) // p)
                # one tuple for every micro-batch's transfer: shared, as the collectives' groups are
                pairs_fwd = tuple(zip(self.class_xpus(s, k), self.class_xpus(t, k)))
                pairs_bwd = tuple((dst, src) for src, dst in pairs_fwd)
                for j in range(count):
                    forward, backward = (Op("F", j, c), Op("F", j, d)), (Op("B", j, d), Op("B", j, c))
                    self.transfer(f"p2p{tag}.q{q}.mb{j}.act", pairs_fwd, (s, k, forward[0]), (t, k, forward[1]))
                    self.transfer(f"p2p{tag}.q{q}.mb{j}.grad", pairs_bwd, (t, k, backward[0]), (s, k, backward[1]))

    def transfer(self, name: str, pairs, sender: tuple, receiver: tuple) -> None:
        """The activation (or its gradient) of one micro-batch from the `sender` pass (stage, class, op) to the
        `receiver` pass, each TP rank sending its share (:func:`pipeline_send`), the receiving TP group
        all-gathering it back where Megatron-LM's scatter-gather split it; with megatron_comm the sender's next
        pass waits until its send is delivered (Megatron-LM's 1F1B sends block)."""
        par = self.par
        share, gathered = pipeline_send(self.spec, par)
        add_comm(self.graph, name, pairs=pairs, bytes=self.activation * share, collective="p2p", phase="p2p")
        add_dependency(self.graph, self.first[sender][1], name, wait="group")
        arrived = name
        if gathered:
            arrived = add_comm(self.graph, f"{name}.all_gather", groups=self.groups("tp", receiver[0], receiver[1]),
                               bytes=self.activation, collective="all_gather", algorithm="nccl", phase="p2p",
                               stage=receiver[0])
            add_dependency(self.graph, name, arrived)
        add_dependency(self.graph, arrived, self.first[receiver][0])
        if par.megatron_comm and sender in self.following and sender not in self.steady:
            add_dependency(self.graph, name, self.following[sender])


def pipeline_send(spec: WorkloadSpec, par: Parallelism) -> tuple[float, bool]:
    """(the share of a micro-batch's activation each TP rank sends to the next pipeline stage, whether the
    receiving TP group all-gathers it back). With sequence parallelism each rank holds and sends its 1/t slice;
    without it, Megatron-LM's ranks each send the whole activation (megatron/core since March 2023), or 1/t that
    the receivers gather (``training.pipeline_scatter_gather``, Megatron-LM before); the paper's ideal model
    (megatron_comm false) sends the whole activation from every rank.

    >>> spec = WorkloadSpec(name="w", model=None)
    >>> [pipeline_send(spec, Parallelism(tp=4, pp=2, sequence_parallel=sp, megatron_comm=True)) for sp in (False, True)]
    [(1.0, False), (0.25, False)]
    >>> pipeline_send(replace(spec, pipeline_scatter_gather=True), Parallelism(tp=4, pp=2, megatron_comm=True))
    (0.25, True)
    """
    if not par.megatron_comm or par.tp == 1:
        return 1.0, False
    if par.sequence_parallel:
        return 1.0 / par.tp, False
    return (1.0 / par.tp, True) if spec.pipeline_scatter_gather else (1.0, False)


def steady_state(order: list[Op]) -> list[Op]:
    """The passes of a stage's `order` in its 1F1B steady state, where forward and backward passes alternate: from
    the forward before the first backward to the backward after the last forward (Megatron-LM overlaps their
    sends with the next pass under --overlap-p2p-communication; warmup's forwards and flush's backwards block)."""
    kinds = [op.kind for op in order]
    if "B" not in kinds or "F" not in kinds:
        return []
    first_backward, last_forward = kinds.index("B"), len(kinds) - 1 - kinds[::-1].index("F")
    if last_forward < first_backward:  # every forward before every backward (m = p): warmup and flush only
        return []
    return order[first_backward - 1:last_forward + 2]


def checkpoint_stops_early(spec: WorkloadSpec) -> bool:
    """Whether a recomputed layer's last block (the MLP) runs only up to its last GEMM again: torch.utils.checkpoint
    as a PyTorch inventory's script calls it (:func:`hcsim.workload.ops.checkpoint_recompute`), on a dense model (a
    mixture of experts' MLP has no kernels listed); Megatron-LM recomputes whole blocks."""
    return not spec.inventory.fused and not spec.model.moe


def overlaps_tp_comm(spec: WorkloadSpec, par: Parallelism) -> bool:
    """The TP collectives pipelined with the GEMMs beside them (training.tp_comm_overlap: Transformer Engine's
    userbuffers, which Megatron-LM's --tp-comm-overlap runs only with sequence parallelism)."""
    return spec.tp_comm_overlap and par.sequence_parallel and par.tp > 1


def tp_gather_share(spec: WorkloadSpec) -> float:
    """What a sequence-parallel all-gather moves of a block's BF16 activation: half in FP8 training of a dense
    model, as Transformer Engine quantizes an FP8 GEMM's input before it gathers it (the norm's output in forward:
    transformer_engine/pytorch/module/layernorm_linear.py; the output gradient in backward: base.py,
    grad_output_preprocess), 1 B an element; the reduce-scatters stay in BF16. A mixture of experts' token
    dispatcher gathers its input in BF16, so its gathers are kept whole."""
    return 0.5 if spec.precision == "fp8" and not spec.model.moe else 1.0


def overlaps_param_gather(spec: WorkloadSpec, par: Parallelism) -> bool:
    """ZeRO 1-2 over more than one rank with the updated weights gathered beside the next forward pass."""
    return par.zero in (1, 2) and par.optimizer_shards > 1 and spec.overlap_param_gather


def overlaps_grad_reduce(spec: WorkloadSpec, par: Parallelism) -> bool:
    """Whether the gradients are reduced bucket by bucket during the last backward pass: the spec's
    overlap_grad_reduce, by default where the weights' gathers overlap (Megatron-LM asserts --overlap-grad-reduce
    with --overlap-param-gather). Not under ZB-H1, whose weight gradients come in one deferred pass a chunk."""
    wanted = overlaps_param_gather(spec, par) if spec.overlap_grad_reduce is None else spec.overlap_grad_reduce
    return wanted and par.schedule != "zb-h1"


def grad_bucket_size(par: Parallelism) -> float:
    """Parameters a gradient bucket holds before it closes: Megatron-LM's default bucket_size,
    max(40M, 1M x the data- and context-parallel ranks) (megatron/core/distributed)."""
    return max(40e6, 1e6 * par.dp * par.cp)


def _block_name(name: str, index: int) -> str:
    """A kernel's name with a ring attention block's index, before its backward suffix (".bwd" stays last:
    the kernel model reads it)."""
    stem, dot, suffix = name.rpartition(".")
    if dot and f".{suffix}" in BACKWARD_SUFFIXES:
        return f"{stem}.block{index}.{suffix}"
    return f"{name}.block{index}"


def build_hybrid_graph(spec: WorkloadSpec, par: Parallelism, layout: ParallelLayout, group_order=None) -> nx.DiGraph:
    """The hybrid-parallel training graph of `spec` split by `par` over `layout` (module docstring).

    Raises
    ------
    ConfigError
        when the layout's sizes differ from `par`'s or the model cannot be split that way.
    """
    sizes = layout.sizes
    if (sizes["tp"], sizes["pp"], sizes["dp"], sizes["ep"], sizes["cp"]) != (par.tp, par.pp, par.dp, par.ep, par.cp):
        raise ConfigError(f"parallel layout: {layout!r} does not match tp {par.tp} x pp {par.pp} x dp {par.dp} x "
                          f"ep {par.ep} x cp {par.cp}")
    par.check_model(spec)
    return _Builder(spec, par, layout, group_order).build()


def place_hybrid_memory(graph: nx.DiGraph, spec: WorkloadSpec, par: Parallelism, layout: ParallelLayout,
                        capacities: dict[str, float], extended: dict[str, float],
                        offload_memory: dict[str, tuple[str, float]] | None = None):
    """Per-XPU inventory of a hybrid graph and its spills; sets ``spilled_xpus`` of spilled decoders' vertices.

    An XPU of stage s holds what :func:`hcsim.workload.memory.stage_memory` says: its decoders' (and the
    embedding's or head's) model state per TP rank, sharded by ZeRO over its DP group, and the activations
    of the micro-batches the schedule keeps in flight (:func:`in_flight` of the stage's op order, per
    chunk); with ZeRO-3 also two gathered layers (the stage's largest all-gather, twice). Offloaded state
    (``par.offload_state``) lives in `offload_memory` (XPU -> (memory node, capacity), shared nodes summed)
    and counts as spilled. Decoders stay local in forward order while they fit; the rest spill to extended
    memory (the paper's policy, per stage). With parameters or activations offloaded every decoder vertex
    reads from the offload memory.

    Raises
    ------
    WorkloadError
        naming the stage, the bytes needed and the bytes available, when the spill does not fit, or the
        memory that offloaded state overflows.
    """
    from hcsim.errors import WorkloadError
    from hcsim.units import format_quantity
    from hcsim.workload.placement import Placement, StateBytes, XpuMemory

    builder = _Builder(spec, par, layout)
    keywords = dict(micro_batch=par.micro_batch, sequence=spec.model.sequence // par.cp, tp=par.tp,
                    sequence_parallel=par.sequence_parallel, ep=par.ep,
                    precision=spec.precision, attention=spec.attention, optimizer=spec.optimizer,
                    recompute=par.recompute, dp=par.optimizer_shards, zero_stage=par.zero, kernels=spec.kernels,
                    gradient=spec.main_gradient)

    def away(m) -> float:
        """Bytes of a StageMemory that offload keeps out of HBM."""
        return ((m.state.optimizer if par.offloads("optimizer") else 0.0)
                + (m.state.weights + m.state.gradients if par.offloads("parameters") else 0.0)
                + (m.activations if par.offloads("activations") else 0.0))

    inventory, spilled_by_stage, used = {}, {}, {}
    for stage, (k, (count, _)) in product(range(par.pp), enumerate(builder.classes)):
        order = stage_order(par.schedule, stages=par.pp, micro_batches=count, stage=stage,
                            chunks=par.virtual_stages)
        flight = in_flight(order) / par.virtual_stages  # micro-batches in flight per chunk
        decoders = sum(builder.layers[stage])
        first, last = builder.ends(stage, 0)[0], builder.ends(stage, par.virtual_stages - 1)[1]
        memory = stage_memory(spec.model, layers=decoders, first=first, last=last, in_flight=flight, **keywords)
        one_layer = stage_memory(spec.model, layers=1, first=False, last=False, in_flight=flight, **keywords)
        one = one_layer.total - away(one_layer)  # per decoder, in HBM or spilled
        gathered = 2 * max((d["bytes"] for _, d in graph.nodes(data=True)  # ZeRO-3: layer l and l + 1
                            if d.get("phase") == "zero" and d.get("stage") == stage), default=0.0) \
            if par.zero == 3 else 0.0
        offloaded = away(memory)
        fixed = memory.total - offloaded - decoders * one + gathered  # embedding / head, gathered layers: local
        for x in builder.class_xpus(stage, k):
            local = min(decoders, max(0, int((capacities[x] - fixed) // one))) if one else decoders
            spilled = (decoders - local) * one
            if spilled > extended.get(x, 0.0) or fixed > capacities[x]:
                raise WorkloadError(
                    f"pipeline stage {stage} does not fit on XPU {x!r}: it needs "
                    f"{format_quantity(fixed + decoders * one, 'B')} ({decoders} decoders, {format_quantity(one, 'B')} "
                    f"each with {flight:g} micro-batches in flight), its local memory holds "
                    f"{format_quantity(capacities[x], 'B')} and its extended memory "
                    f"{format_quantity(extended.get(x, 0.0), 'B')}. Fix: more tp or pp, recompute, ZeRO, offload, "
                    f"or a smaller micro_batch")
            if offloaded:
                node = offload_memory[x][0]
                used[node] = used.get(node, 0.0) + offloaded
                if used[node] > offload_memory[x][1]:
                    raise WorkloadError(
                        f"offload: {par.offload}: memory {node!r} holds {format_quantity(offload_memory[x][1], 'B')}, "
                        f"less than the {format_quantity(used[node], 'B')} offloaded to it by its XPUs. Fix: a larger "
                        f"memory, fewer offload_state kinds, or a higher zero stage")
            state = memory.state
            inventory[x] = XpuMemory(parameters=state.weights + gathered, gradients=state.gradients,
                                     optimizer=state.optimizer, activations=memory.activations,
                                     local=fixed + local * one, spilled=spilled + offloaded, offloaded=offloaded)
            marked = 0 if par.offloads("parameters") or par.offloads("activations") else local
            spilled_by_stage.setdefault(stage, {}).setdefault(marked, []).append(x)
    _mark_spills(graph, builder, spilled_by_stage,
                 par.offload if par.offloads("parameters") or par.offloads("activations") else None)
    peak = max(inventory.values(), key=lambda m: m.total)
    state = StateBytes(parameters=peak.parameters, gradients=peak.gradients, optimizer=peak.optimizer,
                       activations=peak.activations, decoders=max(sum(layers) for layers in builder.layers))
    return Placement(state=state, by_capacity=(), inventory=inventory)


def _mark_spills(graph: nx.DiGraph, builder: _Builder, spilled_by_stage: dict, offload: str | None = None) -> None:
    """Give each compute vertex of a spilled decoder the XPUs on which it spills (shared frozensets), and
    the memory its state is offloaded to (`offload`: cpu | cxl) when parameters or activations are."""
    if offload is None and all(local >= sum(builder.layers[stage])
                               for stage, by_local in spilled_by_stage.items() for local in by_local):
        return  # every decoder of every stage is local: each vertex keeps the empty set it was built with
    decoder_of: dict = {}
    for stage, layers in enumerate(builder.layers):
        index = 0
        for chunk, count in enumerate(layers):
            for d in range(count):
                decoder_of[stage, chunk, d] = index
                index += 1
    shared: dict = {}
    for name, data in graph.nodes(data=True):
        if data["kind"] != "compute" or ".L" not in name:
            continue
        stage = data["stage"]
        chunk = int(name.split(".c", 1)[1].split(".", 1)[0])
        d = int(name.split(".L", 1)[1].split(".", 1)[0])
        position = decoder_of[stage, chunk, d]
        spilled = frozenset(x for local, xs in spilled_by_stage[stage].items() if position >= local for x in xs)
        if len(builder.classes) > 1:  # the replica classes of a stage have vertices of their own
            spilled &= frozenset(data["xpus"])
        data["spilled_xpus"] = shared.setdefault(spilled, spilled)
        if offload:
            data["offload"] = offload
