"""Workload specs: a model, its per-layer costs, and how it is trained (YAML in ``workloads/``).

A spec names the model shape, where its per-layer costs come from (a table
such as paper Table 4, or the shape generator), the per-XPU batch, the
precision and optimizer, the gradient buckets and collective algorithm, and
the graph granularity. See ``workloads/llama2-13b.yaml`` for every key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


from hcsim.config import Fields, apply_overrides, load_yaml, resolve_spec
from hcsim.errors import ConfigError, brief, say_once
from hcsim.units import parse_quantity
from hcsim.workload.graph import PRECISIONS
from hcsim.workload.ops import CROSS_ENTROPY_FUSIONS, FP8_RECIPES, INVENTORIES, KERNEL_INVENTORIES, KernelInventory
from hcsim.workload.transformer import ATTENTION
from hcsim.workload.model import (MLP_TYPES, NORM_TYPES, OPTIMIZERS, POSITION_TYPES, RECOMPUTATION, Affine, DecoderTable,
                                  ElementSizes, LayerCost, ModelShape, activation_bytes, element_sizes,
                                  generate_decoder_table)

__all__ = ["WorkloadSpec", "load_workload_spec", "parse_workload_spec", "BUCKETS", "GRANULARITIES", "COST_SOURCES"]

log = logging.getLogger(__name__)

BUCKETS = ("layer", "decoder", "model")
GRANULARITIES = ("layer", "decoder")
COST_SOURCES = ("table", "shape")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """A data-parallel training workload.

    name : spec name; model : the shape; costs : "table" (use `table`) or
    "shape" (generate from `model`); table : the decoder table when costs is
    "table"; batch_per_xpu : samples per XPU per iteration; precision :
    "fp32" | "fp16" | "bf16"; optimizer : "adam" | "sgd";
    optimizer_flops_per_parameter : FLOP of one optimizer step per parameter;
    optimizer_bytes_per_parameter : bytes the optimizer step vertex reads per
    parameter (0 when the backward pass already reads the state, as in Table 4),
    and the optimizer kernel's traffic in the kernel model (0: the inventory's,
    42-54 B for Megatron-LM (:func:`hcsim.workload.ops.optimizer_ops`), 28 B for fused AdamW);
    recomputation : "none" | "selective" | "full" (activations kept);
    attention : "standard" | "flash" (FlashAttention-style fused core; hybrid-parallel graphs);
    grad_reduce_in_fp32 : the gradients accumulated and reduced in FP32 (4 B each, Megatron-LM's main_grad
    buffer) rather than in the weights' 16 bits; None: true in BF16 (Megatron-LM's arguments.py turns on
    accumulate_allreduce_grads_in_fp32 for --bf16 unless --grad-reduce-in-bf16), false in FP8 (NeMo's FP8
    recipes set grad_reduce_in_fp32 False) and FP16 (Megatron-LM's default); FP32 training has 4 B gradients
    either way (:attr:`main_gradient`);
    gradient_accumulation_fusion : the weight-gradient GEMMs accumulate into the main-gradient buffer themselves
    (Megatron-LM's default, into FP32 or 16-bit main gradients: fused_weight_gradient_mlp_cuda's
    wgrad_gemm_accum_fp32 / _fp16, Transformer Engine's fuse_wgrad_accumulation); false: each weight gradient is
    written on its own and added to the buffer by a kernel after every backward pass (:attr:`gradient_add`), as
    ``--no-gradient-accumulation-fusion`` does, and as Megatron-LM until September 2022 did for 16-bit main gradients
    (its arguments.py turned the fusion off unless --accumulate-allreduce-grads-in-fp32); megatron kernels only;
    overlap_param_gather : with ZeRO 1-2 (Megatron-LM's distributed optimizer), the updated weights are
    all-gathered bucket by bucket beside the next iteration's forward pass, each bucket's gather started when
    the layers before it start and waited for by its own layers (Megatron-LM's ``--overlap-param-gather``,
    which its and NeMo's recipes turn on with the distributed optimizer; the default); false: one all-gather
    after the optimizer step, exposed (Megatron-LM's bare default);
    overlap_grad_reduce : the gradients reduced bucket by bucket during the last micro-batch's backward pass,
    each bucket (max(40M, 1M x dp x cp) parameters of the first model chunk, whole decoders from the last
    layer back) as soon as its layers' gradients are ready, one after another (Megatron-LM's
    ``--overlap-grad-reduce``); false: once the chunk's backward is done. None: true where the updated
    weights' gathers overlap (``overlap_param_gather`` with ZeRO 1-2 over more than one rank: Megatron-LM
    asserts --overlap-grad-reduce with --overlap-param-gather), false elsewhere (Megatron-LM's default);
    overlap_p2p_comm : under the interleaved schedule, a pass's send to the next pipeline stage overlaps the pass
    after it in the 1F1B steady state (Megatron-LM's default: --no-overlap-p2p-communication turns it off; it
    overlaps nothing in warmup and flush, nor under the other schedules, whose sends block the next pass);
    pipeline_scatter_gather : each TP rank sends 1/t of a pipeline send's activation and the receiving TP group
    all-gathers it back, without sequence parallelism (Megatron-LM's --scatter-gather-tensors-in-pipeline, on by
    default from February 2021 until March 2023, when the pipeline code moved into megatron/core and dropped it);
    false (the default, Megatron-LM since): each TP rank sends its whole [s/cp, b, h] activation (a 1/t slice of
    it with sequence parallelism either way, megatron/core/pipeline_parallel/schedules.py get_tensor_shapes);
    tp_comm_overlap : the tensor-parallel collectives of a sequence-parallel layer pipelined with the GEMMs beside
    them, one chunk of each exposed, the GEMMs beside TE's collective kernels on the SMs those leave
    (:data:`hcsim.workload.hybrid.USERBUFFER_GEMMS`) (Megatron-LM's ``--tp-comm-overlap``, Transformer Engine's
    userbuffers, which NeMo's large-model recipes turn on; needs sequence parallelism); false: each after its block, exposed (the
    default, Megatron-LM's);
    cross_entropy_fusion : how Megatron-LM runs the loss over the logits (:data:`hcsim.workload.ops.CROSS_ENTROPY_FUSIONS`):
    "native" (the default: ``--cross-entropy-loss-fusion``, Megatron core's fused implementation, which NeMo's
    GPTConfig turns on), "none" (unfused: Megatron-LM's bare default, 52 B a logit against native's 32) or "te"
    (Transformer Engine's Triton kernels, 22 B); megatron kernels only;
    fp8_recipe : Transformer Engine's FP8 scaling, "delayed" (DelayedScaling, the default) | "current"
    (Float8CurrentScaling): which quantization kernels an FP8 GEMM runs (:data:`hcsim.workload.ops.FP8_RECIPES`);
    kernels : the framework whose kernels the roofline model times, "megatron" | "pytorch-eager" |
    "torch-compile" (:mod:`hcsim.workload.ops`; memory per XPU follows the same inventory);
    clip_grad_norm : a PyTorch inventory's step clips the gradients' norm before fused AdamW
    (``torch.nn.utils.clip_grad_norm_``, as Hugging Face's Trainer does with its default max_grad_norm 1.0:
    :func:`hcsim.workload.ops.eager_optimizer_ops`); Megatron-LM's optimizer step always computes the norm (in its
    42-54 B per parameter), so the key means nothing there;
    bucket : gradient all-reduce granularity "layer" | "decoder" | "model";
    algorithm : collective algorithm name for the engine; chunks : the
    all-reduce split into that many chunks (None: the algorithm's default;
    :mod:`hcsim.engine.collectives`); in_order : all-reduces
    run one after another (one communication stream); granularity : "layer" (one
    compute vertex per table row) or "decoder" (one fused vertex per decoder pass).
    """

    name: str
    model: ModelShape
    costs: str = "shape"
    table: DecoderTable | None = None
    batch_per_xpu: int = 1
    precision: str = "fp32"
    optimizer: str = "adam"
    optimizer_flops_per_parameter: float = 12.0
    optimizer_bytes_per_parameter: float = 0.0
    recomputation: str = "none"
    attention: str = "standard"
    grad_reduce_in_fp32: bool | None = None
    overlap_param_gather: bool = True
    overlap_grad_reduce: bool | None = None
    overlap_p2p_comm: bool = True
    pipeline_scatter_gather: bool = False
    tp_comm_overlap: bool = False
    gradient_accumulation_fusion: bool = True
    cross_entropy_fusion: str = "native"
    fp8_recipe: str = "delayed"
    kernels: str = "megatron"
    clip_grad_norm: bool = True
    bucket: str = "decoder"
    algorithm: str = "ring"
    chunks: int | None = None
    in_order: bool = True
    granularity: str = "decoder"
    description: str = ""
    source: str = ""

    @property
    def inventory(self) -> KernelInventory:
        """The kernel inventory ``kernels`` names: what the framework launches and what that asks of hcsim."""
        return INVENTORIES[self.kernels]

    def __post_init__(self) -> None:
        checks = [("costs", COST_SOURCES), ("precision", PRECISIONS), ("optimizer", OPTIMIZERS),
                  ("recomputation", RECOMPUTATION), ("attention", ATTENTION), ("kernels", KERNEL_INVENTORIES),
                  ("fp8_recipe", FP8_RECIPES), ("cross_entropy_fusion", CROSS_ENTROPY_FUSIONS),
                  ("bucket", BUCKETS),
                  ("granularity", GRANULARITIES)]
        for key, options in checks:
            if getattr(self, key) not in options:
                raise ConfigError(f"workload {self.name!r}: {key} {getattr(self, key)!r} is not one of {', '.join(options)}")
        if isinstance(self.batch_per_xpu, bool) or not isinstance(self.batch_per_xpu, int) or self.batch_per_xpu < 1:
            raise ConfigError(f"workload {self.name!r}: batch_per_xpu must be an integer >= 1, got {self.batch_per_xpu!r}")
        for key in ("optimizer_flops_per_parameter", "optimizer_bytes_per_parameter"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"workload {self.name!r}: {key} must be >= 0, got {getattr(self, key)!r}")
        if not self.algorithm:
            raise ConfigError(f"workload {self.name!r}: algorithm must be a non-empty name")
        if self.chunks is not None and (isinstance(self.chunks, bool) or not isinstance(self.chunks, int)
                                        or self.chunks < 1):
            raise ConfigError(f"workload {self.name!r}: gradients.chunks must be an integer >= 1, got {self.chunks!r}")
        if self.precision not in self.inventory.precisions:
            raise ConfigError(f"workload {self.name!r}: training.kernels {self.kernels} models torch.autocast over FP32 "
                              f"weights, in {' or '.join(self.inventory.precisions)}, not {self.precision}; fix: "
                              f"training.precision: {self.inventory.precisions[0]}, or training.kernels: megatron "
                              f"(FP8 as Transformer Engine runs it)")
        if self.costs == "table":
            if self.table is None:
                raise ConfigError(f"workload {self.name!r}: costs is 'table' but the spec has no table. "
                                  "Fix: add a table, or set costs: shape")
            if (self.table.sequence, self.table.hidden) != (self.model.sequence, self.model.hidden):
                raise ConfigError(
                    f"workload {self.name!r}: the table is for sequence {self.table.sequence} and hidden "
                    f"{self.table.hidden}, the model has {self.model.sequence} and {self.model.hidden}. "
                    "Fix: set costs: shape to derive the costs from the model shape")

    @property
    def main_gradient(self) -> float:
        """Bytes of each gradient element as accumulated and reduced: 4 with ``grad_reduce_in_fp32``, else the
        precision's own (:func:`~hcsim.workload.model.element_sizes`).

        >>> spec = load_workload_spec("llama3-8b")
        >>> [replace(spec, precision=p).main_gradient for p in ("fp32", "bf16", "fp16", "fp8")]
        [4.0, 4.0, 2.0, 2.0]
        """
        fp32 = self.grad_reduce_in_fp32
        if fp32 is None:
            fp32 = self.precision in ("fp32", "bf16")
        return 4.0 if fp32 else element_sizes(self.precision, self.optimizer).gradient

    @property
    def gradient_add(self) -> float:
        """Bytes per weight of the kernel that adds its gradient to the main-gradient buffer after each backward
        pass without ``gradient_accumulation_fusion`` (megatron/model/distributed.py's hook,
        ``param.main_grad.add_(param.grad)``: read the buffer and the gradient, write the buffer); 0 with it.

        >>> spec = load_workload_spec("gpt-megatron")
        >>> spec.gradient_add, replace(spec, gradient_accumulation_fusion=True).gradient_add
        (6.0, 0.0)
        """
        if self.gradient_accumulation_fusion or not self.inventory.fused:
            return 0.0
        return 2 * self.main_gradient + self.sizes.gradient

    @property
    def sizes(self) -> ElementSizes:
        """Bytes per element for this precision and optimizer (the paper's data-parallel graph's)."""
        return element_sizes(self.precision, self.optimizer)

    @property
    def main_sizes(self) -> ElementSizes:
        """:attr:`sizes` with the gradients as the framework accumulates and reduces them (:attr:`main_gradient`):
        what the hybrid-parallel graph's gradient collectives move and its optimizer step reads."""
        return replace(self.sizes, gradient=self.main_gradient)

    def decoder_table(self) -> DecoderTable:
        """The per-layer costs of one decoder block (the table, or generated from the shape)."""
        if self.costs == "table":
            return self.table
        return generate_decoder_table(self.model, self.sizes)

    def activation_bytes(self) -> Affine:
        """Activation bytes one decoder keeps for backward (affine in the batch)."""
        return activation_bytes(self.model, self.sizes, self.recomputation)


def load_workload_spec(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> WorkloadSpec:
    """Read a workload spec: a path or a built-in name (``llama2-13b``), with optional overrides.

    Parameters
    ----------
    name_or_path : a YAML file, or the name of one in ``workloads/``.
    overrides : dotted keys to values, e.g. ``{"training.batch_per_xpu": 4,
        "granularity": "layer"}``; a string value is read as YAML (``"4"`` is 4).

    Raises
    ------
    ConfigError
        listing every problem of the file, unknown keys with a suggestion.
    """
    path = resolve_spec(name_or_path, "workloads")
    raw = load_yaml(path)
    if isinstance(raw, dict) and "model" not in raw and {"links", "topology", "server", "node"} & set(raw):
        raise ConfigError(f"{path}: a platform spec (it has links:), not a workload spec; give it as the platform "
                          f"(--set platform={path}), and a workload such as llama2-13b")
    if isinstance(raw, dict) and raw.get("kind") == "serving":
        raise ConfigError(f"{path}: a serving workload (kind: serving), not a training one; run it with hcsim "
                          f"simulate --set workload={Path(path).stem} (hcsim.run.serving); this command takes a training "
                          f"workload such as llama3-70b")
    data = _renamed(raw, f"{path}: ")
    if overrides:
        data = apply_overrides(data, _renamed(overrides, "override "), str(path))
    return parse_workload_spec(data, str(path))


def _renamed(data: Any, where: str) -> Any:
    """`data` with the old key ``fidelity`` under its new name ``granularity`` (with a warning)."""
    if not isinstance(data, dict) or "fidelity" not in data:
        return data
    if "granularity" in data:
        raise ConfigError(f"{where}fidelity: renamed granularity, which is given too; keep only granularity")
    log.warning("%sfidelity: renamed granularity; the old key still works but will go", where)
    return {("granularity" if key == "fidelity" else key): value for key, value in data.items()}


def parse_workload_spec(data: Any, where: str = "workload") -> WorkloadSpec:
    """Build a WorkloadSpec from parsed YAML; raise one ConfigError with every problem."""
    top = Fields(_renamed(data, f"{where}: "), f"{where}: ")
    name = top.string("name", Path(where).stem)
    description = top.string("description", "")
    shape = _shape(top.sub("model"), name)
    costs = top.choice("costs", COST_SOURCES, "table" if top.has("table") else "shape")
    table = _table(top.sub("table")) if top.has("table") else None
    training = top.sub("training")
    kernels = training.choice("kernels", KERNEL_INVENTORIES, "megatron")
    values = dict(
        batch_per_xpu=training.number("batch_per_xpu", 1, kind=int, minimum=1, physical="batch_per_xpu"),
        # a PyTorch workload trains under torch.autocast: BF16 unless it says FP16
        precision=training.choice("precision", PRECISIONS, INVENTORIES[kernels or "megatron"].precisions[0]),
        optimizer=training.choice("optimizer", OPTIMIZERS, "adam"),
        optimizer_flops_per_parameter=training.number("optimizer_flops_per_parameter", 12.0, minimum=0),
        optimizer_bytes_per_parameter=training.quantity("optimizer_bytes_per_parameter", "size", 0.0, positive=False),
        recomputation=training.choice("recomputation", RECOMPUTATION, "none"),
        attention=training.choice("attention", ATTENTION, "standard"),
        grad_reduce_in_fp32=training.flag("grad_reduce_in_fp32", None),
        overlap_param_gather=training.flag("overlap_param_gather", True),
        overlap_grad_reduce=training.flag("overlap_grad_reduce", None),
        overlap_p2p_comm=training.flag("overlap_p2p_comm", True),
        pipeline_scatter_gather=training.flag("pipeline_scatter_gather", False),
        tp_comm_overlap=training.flag("tp_comm_overlap", False),
        gradient_accumulation_fusion=training.flag("gradient_accumulation_fusion", True),
        cross_entropy_fusion=training.choice("cross_entropy_fusion", CROSS_ENTROPY_FUSIONS, "native"),
        fp8_recipe=training.choice("fp8_recipe", FP8_RECIPES, "delayed"),
        kernels=kernels,
        clip_grad_norm=training.flag("clip_grad_norm", True),
    )
    training.check_unknown()
    valid = not training.problems  # a note about a value that is wrong anyway would only blur the error
    if valid and training.has("clip_grad_norm") and INVENTORIES[kernels or "megatron"].fused:
        say_once(log, f"{where}: training.clip_grad_norm applies to training.kernels pytorch-eager and "
                      f"torch-compile; Megatron-LM's optimizer step (42-54 B per parameter) computes the gradients' "
                      f"norm either way, so it has no effect here")
    for key, instead in (("gradient_accumulation_fusion", "accumulates gradients as PyTorch's autograd does"),
                         ("cross_entropy_fusion", "runs F.cross_entropy over the whole vocabulary")):
        if valid and training.has(key) and not INVENTORIES[kernels or "megatron"].fused:
            say_once(log, f"{where}: training.{key} applies to training.kernels megatron; {kernels} {instead}, so it "
                          f"has no effect here")
    if valid and training.has("fp8_recipe") and values["precision"] != "fp8":
        say_once(log, f"{where}: training.fp8_recipe: {values['fp8_recipe']!r} applies to precision fp8; this run "
                      f"trains in {values['precision']}, so it has no effect (precision=fp8 uses it)")
    if valid and values["overlap_grad_reduce"] is False and values["overlap_param_gather"]:
        say_once(log, f"{where}: training.overlap_grad_reduce: false beside overlap_param_gather (true by default): "
                      f"with ZeRO 1-2 over several ranks Megatron-LM refuses the pair (--overlap-param-gather needs "
                      f"--overlap-grad-reduce); hcsim runs it as given (overlap_param_gather: false too is "
                      f"Megatron-LM's bare default)")
    gradients = top.sub("gradients")
    values.update(bucket=gradients.choice("bucket", BUCKETS, "decoder"),
                  algorithm=gradients.string("algorithm", "ring"),
                  chunks=gradients.number("chunks", None, kind=int, minimum=1),
                  in_order=gradients.flag("in_order", True))
    gradients.check_unknown()
    values["granularity"] = top.choice("granularity", GRANULARITIES, "decoder")
    top.done()
    try:
        return WorkloadSpec(name=name, description=description, model=shape, costs=costs, table=table,
                            source=where, **values)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from err


def _shape(fields: Fields, name: str) -> ModelShape | None:
    values = dict(
        name=fields.string("name", name),
        decoders=fields.number("decoders", kind=int, minimum=1),
        hidden=fields.number("hidden", kind=int, minimum=1, physical="hidden"),
        heads=fields.number("heads", kind=int, minimum=1, physical="heads"),
        kv_heads=fields.number("kv_heads", None, kind=int, minimum=1),
        ffn=fields.number("ffn", kind=int, minimum=1, physical="ffn"),
        sequence=fields.number("sequence", kind=int, minimum=1, physical="sequence"),
        mlp=fields.choice("mlp", MLP_TYPES, "gelu"),
        norm=fields.choice("norm", NORM_TYPES, "layernorm"),
        dropout=fields.flag("dropout", True),
        vocabulary=fields.number("vocabulary", 0, kind=int, minimum=0, physical="vocabulary"),
        positions=fields.choice("positions", POSITION_TYPES, "none"),
        bias=fields.flag("bias", False),
        tied_embeddings=fields.flag("tied_embeddings", False),
        experts=fields.number("experts", 1, kind=int, minimum=1, physical="experts"),
        top_k=fields.number("top_k", 1, kind=int, minimum=1),
        expert_ffn=fields.number("expert_ffn", None, kind=int, minimum=1),
    )
    fields.check_unknown()
    if any(values[k] is None for k in ("decoders", "hidden", "heads", "ffn", "sequence")):
        return None
    try:
        return ModelShape(**values)
    except ConfigError as err:
        fields.problems.append(f"{fields.where}: {err}")
        return None


def _table(fields: Fields) -> DecoderTable | None:
    name = fields.string("name", "table")
    sequence = fields.number("sequence", kind=int, minimum=1)
    hidden = fields.number("hidden", kind=int, minimum=1)
    rows = fields.raw("rows")
    layers = []
    if not isinstance(rows, list) or not rows:
        fields.problems.append(f"{fields.path('rows')}: expected a list of layers")
        rows = []
    for index, row in enumerate(rows):
        layer = Fields(row, f"{fields.path('rows')}[{index}]", fields.problems)
        values = dict(name=layer.string("name"), printed=layer.string("printed", ""),
                      parameters=layer.number("parameters", 0, kind=int, minimum=0))
        for key, dimension in (("fwd_flops", "flop"), ("fwd_bytes", "size"), ("bwd_flops", "flop"), ("bwd_bytes", "size")):
            values[key] = _affine(layer, key, dimension)
        layer.check_unknown()
        if None not in values.values():
            layers.append(LayerCost(**values))
    fields.check_unknown()
    if sequence is None or hidden is None or len(layers) != len(rows):
        return None
    try:
        return DecoderTable(name=name, layers=tuple(layers), sequence=sequence, hidden=hidden, source=fields.where)
    except ConfigError as err:
        fields.problems.append(f"{fields.where}: {err}")
        return None


def _affine(fields: Fields, key: str, dimension: str) -> Affine | None:
    """Read ``"0.0488GB + 0.039GB*b"`` (b = batch per XPU) or ``negligible`` (0)."""
    if not fields.has(key):
        return fields._missing(key, ...)
    text = fields.raw(key)
    if text == "negligible":
        return Affine()
    if not isinstance(text, str):
        return fields._fail(key, f"expected a cost such as '195GFLOP*b' or '0.0488GB + 0.039GB*b', got {brief(text)}", None)
    constant = per_sample = 0.0
    for term in text.split("+"):
        term = term.strip()
        scaled = term.endswith("*b") or term.startswith("b*")
        if scaled:
            term = term[:-2] if term.endswith("*b") else term[2:]
        try:
            value = parse_quantity(term.strip(), dimension, fields.path(key))
        except ConfigError as err:
            fields.problems.append(f"{err} (terms are quantities, optionally times b: '0.039GB*b')")
            return None
        if value < 0:
            return fields._fail(key, f"must be >= 0, got {brief(text)}", None)
        if scaled:
            per_sample += value
        else:
            constant += value
    return Affine(constant, per_sample)
