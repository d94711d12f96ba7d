"""Decoder models: per-layer costs (paper Table 4) and the generator that derives them from a shape.

A decoder model is ``decoders`` identical decoder blocks. Each block is a
sequence of neural layers (paper Table 4's rows); each layer has forward and
backward FLOPs and memory-access bytes, all affine in the per-XPU batch b
(``constant + per_sample * b``), and a parameter count. The costs come either
from a table (``workloads/llama2-13b.yaml`` holds Table 4 as printed) or from
:func:`generate_decoder_table`, which applies the standard formulas to a
:class:`ModelShape` (docs/workload-model.md says where the two differ and why).

Units: FLOP and bytes (SI: GB = 1e9 B).
"""

from __future__ import annotations

from dataclasses import dataclass

from hcsim.errors import ConfigError
from hcsim.workload.graph import PRECISIONS

__all__ = ["Affine", "LayerCost", "DecoderTable", "ModelShape", "ElementSizes", "element_sizes",
           "generate_decoder_table", "activation_bytes", "MLP_TYPES", "NORM_TYPES", "POSITION_TYPES", "OPTIMIZERS",
           "RECOMPUTATION", "PRECISION_RECIPES"]

MLP_TYPES = ("gelu", "relu", "swiglu")
NORM_TYPES = ("layernorm", "rmsnorm")
POSITION_TYPES = ("none", "learned", "rope")
OPTIMIZERS = ("adam", "sgd")
RECOMPUTATION = ("none", "selective", "full")
# What each training precision keeps in which format (element_sizes gives the bytes): named in a run's result.
PRECISION_RECIPES = {
    "fp32": "fp32 throughout",
    "fp16": "fp16 mixed precision (fp32 master weights)",
    "bf16": "bf16 mixed precision (fp32 master weights)",
    "fp8": "fp8 GEMMs (Transformer Engine), bf16 elsewhere, fp32 master weights",
}


@dataclass(frozen=True, slots=True)
class Affine:
    """A cost ``constant + per_sample * b`` for a batch of b samples (FLOP or bytes)."""

    constant: float = 0.0
    per_sample: float = 0.0

    def __call__(self, batch: float) -> float:
        return self.constant + self.per_sample * batch

    def __add__(self, other: "Affine") -> "Affine":
        return Affine(self.constant + other.constant, self.per_sample + other.per_sample)


ZERO = Affine()


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    """One neural layer of a decoder: FLOP and memory-access bytes of its forward and backward pass.

    `parameters` is the layer's weight count (its gradient is all-reduced);
    `printed` is the row's name as the source table prints it.
    """

    name: str
    fwd_flops: Affine = ZERO
    fwd_bytes: Affine = ZERO
    bwd_flops: Affine = ZERO
    bwd_bytes: Affine = ZERO
    parameters: int = 0
    printed: str = ""

    def __post_init__(self) -> None:
        for key in ("fwd_flops", "fwd_bytes", "bwd_flops", "bwd_bytes"):
            cost = getattr(self, key)
            if not (cost.constant >= 0 and cost.per_sample >= 0):
                raise ConfigError(f"layer {self.name!r}: {key} must be >= 0, got {cost}")
        if self.parameters < 0:
            raise ConfigError(f"layer {self.name!r}: parameters must be >= 0, got {self.parameters}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DecoderTable:
    """The layers of one decoder block, in forward order; the block repeats ``decoders`` times.

    `sequence` and `hidden` record the shape the table was computed for.
    """

    name: str
    layers: tuple[LayerCost, ...]
    sequence: int
    hidden: int
    source: str = ""

    def __post_init__(self) -> None:
        names = [layer.name for layer in self.layers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"decoder table {self.name!r}: layer names must be unique, repeated: {', '.join(duplicates)}")
        if not self.layers:
            raise ConfigError(f"decoder table {self.name!r}: has no layers")

    @property
    def parameters(self) -> int:
        """Parameters of one decoder block."""
        return sum(layer.parameters for layer in self.layers)

    def total(self, key: str) -> Affine:
        """Sum over the layers of one cost (``fwd_flops``, ``bwd_bytes``, ...)."""
        result = ZERO
        for layer in self.layers:
            result = result + getattr(layer, key)
        return result


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """The shape of a decoder-only transformer.

    decoders : number of decoder blocks (L); hidden : h; heads : a; kv_heads :
    key/value heads (grouped-query attention; = heads when absent); ffn : MLP
    inner size f; mlp : "gelu" or "relu" (two matrices h x f; ReLU: OPT) or "swiglu" (three);
    norm : "layernorm" (2h parameters) or "rmsnorm" (h); dropout : whether the
    block has dropout layers; sequence : s; vocabulary : v (the data-parallel
    Table-4 path does not simulate the embedding and output layers, as in the
    paper; :mod:`hcsim.workload.transformer` does).

    Read by :mod:`hcsim.workload.transformer` (the Table-4 generator
    :func:`generate_decoder_table` ignores them, as Table 4 does, and refuses
    more than one expert): positions :
    "learned" (an s x h table, GPT), "rope" (rotary, no parameters, LLaMA) or
    "none"; bias : linear layers and layer norms have biases (GPT);
    tied_embeddings : the output layer reuses the input embedding matrix;
    experts : experts per mixture-of-experts MLP (1 = a dense MLP); top_k :
    experts each token is routed to; expert_ffn : inner size of one expert
    (defaults to ffn).
    """

    name: str
    decoders: int
    hidden: int
    heads: int
    ffn: int
    sequence: int
    kv_heads: int | None = None
    mlp: str = "gelu"
    norm: str = "layernorm"
    dropout: bool = True
    vocabulary: int = 0
    positions: str = "none"
    bias: bool = False
    tied_embeddings: bool = False
    experts: int = 1
    top_k: int = 1
    expert_ffn: int | None = None

    def __post_init__(self) -> None:
        for key in ("decoders", "hidden", "heads", "ffn", "sequence"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"model {self.name!r}: {key} must be an integer >= 1, got {value!r}")
        if self.hidden % self.heads:
            raise ConfigError(f"model {self.name!r}: hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise ConfigError(f"model {self.name!r}: kv_heads {self.kv_heads} must divide heads {self.heads}")
        if self.mlp not in MLP_TYPES:
            raise ConfigError(f"model {self.name!r}: mlp {self.mlp!r} is not one of {', '.join(MLP_TYPES)}")
        if self.norm not in NORM_TYPES:
            raise ConfigError(f"model {self.name!r}: norm {self.norm!r} is not one of {', '.join(NORM_TYPES)}")
        if self.positions not in POSITION_TYPES:
            raise ConfigError(f"model {self.name!r}: positions {self.positions!r} is not one of "
                              f"{', '.join(POSITION_TYPES)}")
        for key in ("experts", "top_k") + (("expert_ffn",) if self.expert_ffn is not None else ()):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"model {self.name!r}: {key} must be an integer >= 1, got {value!r}")
        if self.top_k > self.experts:
            raise ConfigError(f"model {self.name!r}: top_k {self.top_k} exceeds experts {self.experts}: "
                              "a token is routed to at most every expert")

    @property
    def kv_hidden(self) -> int:
        """Width of the K and V projections: kv_heads x head size."""
        return (self.kv_heads or self.heads) * (self.hidden // self.heads)

    @property
    def moe(self) -> bool:
        """Whether the MLPs are mixture-of-experts layers (more than one expert)."""
        return self.experts > 1

    @property
    def expert_hidden(self) -> int:
        """Inner size of one expert's MLP (= ffn for a dense MLP)."""
        return self.expert_ffn if self.expert_ffn is not None else self.ffn


@dataclass(frozen=True, slots=True, kw_only=True)
class ElementSizes:
    """Bytes per element: weight (read by the forward pass), gradient, optimizer state per
    parameter, activation, dropout mask; `state` = weight + gradient + optimizer (+ master copy)."""

    weight: float
    gradient: float
    optimizer: float
    activation: float
    mask: float = 1.0
    fp8_copies: float = 0.0  # FP8 training: the FP8 weight and its transpose Transformer Engine keeps
    gemm_input: float | None = None  # bytes per element of a GEMM input kept for backward (None: activation)

    @property
    def state(self) -> float:
        """Training-state bytes per parameter: weight, gradient and optimizer states (and FP8 weight copies)."""
        return self.weight + self.gradient + self.optimizer + self.fp8_copies


def element_sizes(precision: str, optimizer: str = "adam") -> ElementSizes:
    """Bytes per element for a training precision and optimizer.

    FP32: 4 B weights, gradients and activations; Adam keeps m and v (8 B).
    FP16/BF16 mixed precision: 2 B weights, gradients and activations; the
    optimizer keeps an FP32 master copy (4 B) plus Adam's m and v (8 B).
    Both give 16 B of state per parameter with Adam (REFERENCE.md; ZeRO paper
    section 3.1). SGD with momentum keeps one FP32 buffer (plus the master).

    FP8 (Transformer Engine's recipe on Hopper): BF16 weights, gradients and
    activations and the FP32 master and moments as in BF16, plus an FP8 copy of
    each weight and of its transpose (1 B each, for the forward and the
    input-gradient GEMMs); a GEMM keeps its input for backward in FP8 (1 B).

    >>> element_sizes("fp32").state, element_sizes("bf16").state, element_sizes("fp8").state
    (16.0, 16.0, 18.0)
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer: {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    moments = 8.0 if optimizer == "adam" else 4.0
    if precision == "fp32":
        return ElementSizes(weight=4.0, gradient=4.0, optimizer=moments, activation=4.0)
    if precision == "fp8":
        return ElementSizes(weight=2.0, gradient=2.0, optimizer=4.0 + moments, activation=2.0, fp8_copies=2.0,
                            gemm_input=1.0)
    return ElementSizes(weight=2.0, gradient=2.0, optimizer=4.0 + moments, activation=2.0)


def _linear(name: str, n_in: int, n_out: int, rows: int, sizes: ElementSizes) -> LayerCost:
    """A matrix multiply of `rows` = s tokens per sample by an n_in x n_out weight."""
    weights = n_in * n_out
    return LayerCost(
        name=name, parameters=weights,
        fwd_flops=Affine(0.0, 2.0 * rows * weights),
        fwd_bytes=Affine(weights * sizes.weight, rows * n_in * sizes.activation),
        bwd_flops=Affine(0.0, 4.0 * rows * weights),
        bwd_bytes=Affine(weights * sizes.state, 2.0 * rows * (n_in + n_out) * sizes.activation))


def _elementwise(name: str, fwd_elements: float, bwd_elements: float, sizes: ElementSizes,
                 fwd_mask: float = 0.0, bwd_mask: float = 0.0, parameters: int = 0) -> LayerCost:
    """A layer with negligible FLOPs that reads activations (elements per sample) and masks."""
    return LayerCost(
        name=name, parameters=parameters,
        fwd_bytes=Affine(parameters * sizes.weight, fwd_elements * sizes.activation + fwd_mask * sizes.mask),
        bwd_bytes=Affine(parameters * sizes.state, bwd_elements * sizes.activation + bwd_mask * sizes.mask))


def _dense_only(shape: ModelShape) -> None:
    """The Table-4 generator models dense MLPs only: refuse a mixture-of-experts shape."""
    if shape.moe:
        raise ConfigError(f"model {shape.name!r}: has {shape.experts} experts, and the decoder table of the "
                          "data-parallel graph (Table-4 conventions) models dense MLPs only. "
                          "Fix: run it in the hybrid-parallel graph, which models experts: set ep (expert "
                          "parallelism, e.g. --set ep=8), tp, pp or micro_batch (hcsim workload show: --ep 8 --xpus 8)")


def generate_decoder_table(shape: ModelShape, sizes: ElementSizes) -> DecoderTable:
    """Per-layer costs of one decoder block from its shape, with the standard formulas.

    FLOPs count matrix multiplies only (Narayanan et al., SC'21): a linear
    layer n_in x n_out does 2·s·n_in·n_out per sample forward and twice that
    backward; self-attention does 4·s²·h forward (QKᵀ and attention x V) and
    twice that backward. Memory access follows the conventions of paper
    Table 4: forward reads the weights and the layer's input; backward reads
    the whole training state of the layer's parameters (weights, gradients,
    optimizer states: the update is folded into the backward pass) and its
    input, output and their gradients; self-attention forward also reads the
    a·s² score matrices (2 activation elements + a 1-byte dropout mask each,
    Korthikanti et al. 2022). See docs/workload-model.md.

    Parameters
    ----------
    shape : the model.
    sizes : bytes per element (:func:`element_sizes`).

    Returns
    -------
    DecoderTable with one row per layer, in forward order.
    """
    _dense_only(shape)
    s, h, f, a = shape.sequence, shape.hidden, shape.ffn, shape.heads
    hk = shape.kv_hidden
    sh = s * h
    norm_params = 2 * h if shape.norm == "layernorm" else h
    drop = 1.0 if shape.dropout else 0.0
    qkv_elements = s * (h + 2 * hk)  # Q, K and V of one sample
    rows = [
        _elementwise("norm_attn", sh, 4 * sh, sizes, parameters=norm_params),
        _linear("linear_q", h, h, s, sizes),
        _linear("linear_k", h, hk, s, sizes),
        _linear("linear_v", h, hk, s, sizes),
        LayerCost(name="self_attention",
                  fwd_flops=Affine(0.0, 4.0 * s * s * h), bwd_flops=Affine(0.0, 8.0 * s * s * h),
                  fwd_bytes=Affine(0.0, a * s * s * (2 * sizes.activation + drop * sizes.mask)
                                   + qkv_elements * sizes.activation),
                  bwd_bytes=Affine(0.0, 2.0 * qkv_elements * sizes.activation)),
        LayerCost(name="concat"),
        _linear("linear_o", h, h, s, sizes),
    ]
    if shape.dropout:
        rows.append(_elementwise("dropout_attn", 0, 0, sizes, fwd_mask=sh, bwd_mask=sh))
    rows += [_elementwise("add_attn", 2 * sh, sh, sizes),
             _elementwise("norm_mlp", sh, 4 * sh, sizes, parameters=norm_params)]
    if shape.mlp != "swiglu":
        rows += [_linear("linear_up", h, f, s, sizes),
                 _elementwise(shape.mlp, s * f, 2 * s * f, sizes),
                 _linear("linear_down", f, h, s, sizes)]
    else:
        rows += [_linear("linear_gate", h, f, s, sizes),
                 _linear("linear_up", h, f, s, sizes),
                 _elementwise("swiglu", 2 * s * f, 3 * s * f, sizes),
                 _linear("linear_down", f, h, s, sizes)]
    if shape.dropout:
        rows.append(_elementwise("dropout_mlp", 0, 0, sizes, fwd_mask=sh, bwd_mask=sh))
    rows.append(_elementwise("add_mlp", 2 * sh, sh, sizes))
    return DecoderTable(name=shape.name, layers=tuple(rows), sequence=s, hidden=h,
                        source="generated from the model shape (hcsim.workload.model)")


def activation_bytes(shape: ModelShape, sizes: ElementSizes, recomputation: str = "none") -> Affine:
    """Activation bytes one decoder block keeps from forward for backward, per batch.

    Korthikanti et al. 2022 (section 4.1) generalised to grouped-query
    attention, SwiGLU and blocks without dropout; for a GPT block (f = 4h,
    GeLU, dropout) in 2-byte precision it is s·b·h·(34 + 5·a·s/h).
    `recomputation`: "none" keeps everything; "selective" recomputes the
    attention core (drops the a·s² terms); "full" keeps only the block input.

    >>> gpt = ModelShape(name="gpt", decoders=1, hidden=64, heads=4, ffn=256, sequence=32)
    >>> activation_bytes(gpt, element_sizes("fp16")).per_sample == 32 * 64 * (34 + 5 * 4 * 32 / 64)
    True
    """
    if recomputation not in RECOMPUTATION:
        raise ConfigError(f"recomputation: {recomputation!r} is not one of {', '.join(RECOMPUTATION)}")
    _dense_only(shape)
    s, h, f, a = shape.sequence, shape.hidden, shape.ffn, shape.heads
    e, m = sizes.activation, sizes.mask
    sh = s * h
    if recomputation == "full":
        return Affine(0.0, sh * e)
    drop = 1.0 if shape.dropout else 0.0
    # attention: norm output into QKV, Q, K, V, input of the output projection; dropout mask
    attention = (sh + sh + 2 * s * shape.kv_hidden + sh) * e + drop * sh * m
    norms = 2 * sh * e  # the inputs of the two norms
    if shape.mlp == "gelu":  # input of up, GeLU input, input of down; dropout mask
        mlp = (sh + 2 * s * f) * e + drop * sh * m
    elif shape.mlp == "relu":  # input of up, ReLU's output (what its backward reads: the input of down); mask
        mlp = (sh + s * f) * e + drop * sh * m
    else:  # input of gate/up, gate and up outputs, input of down
        mlp = (sh + 3 * s * f) * e + drop * sh * m
    scores = 0.0 if recomputation == "selective" else a * s * s * ((1 + drop) * e + drop * m)
    return Affine(0.0, attention + norms + mlp + scores)
