"""Per-op costs of a decoder-only transformer on one tensor-parallel rank (the hybrid-parallel workload model).

Pure functions of a :class:`~hcsim.workload.model.ModelShape` (GPT, LLaMA,
mixture-of-experts), the micro-batch b, the sequence s, the tensor-parallel
degree t, sequence parallelism and the precision. The hybrid-parallel graph
builder places these costs on vertices; nothing here knows about pipelines,
schedules or the executor.

API
---
Three blocks make a model; each is a :class:`Block` of :class:`Op` s, in
forward order, costed for ONE rank of the tensor-parallel group::

    embedding(shape, micro_batch=b, tp=t, ...)      -> Block   (first pipeline stage)
    decoder_layer(shape, micro_batch=b, tp=t, ...)  -> Block   (x shape.decoders, all identical)
    lm_head(shape, micro_batch=b, tp=t, ...)        -> Block   (last pipeline stage: final norm, logits, loss)

All three take the same keywords: ``micro_batch`` (b, samples), ``sequence``
(s, tokens; defaults to ``shape.sequence``), ``tp`` (t), ``sequence_parallel``,
``ep`` (expert-parallel degree: experts held per rank = experts / ep),
``precision`` ("fp32" | "fp16" | "bf16", element sizes of
:func:`~hcsim.workload.model.element_sizes`) and ``attention``
(:data:`ATTENTION`: "standard" or "flash"); :func:`lm_head` also takes
``tied_copy``. Whole-model helpers: :func:`model_blocks` (the three blocks at
once), :func:`iteration_flops` (model FLOPs per iteration, Megatron-LM's
count), :func:`model_parameters` and :func:`active_parameters`.

An :class:`Op` has a ``kind`` (:data:`OP_KINDS`: "gemm", "attention",
"elementwise", "norm"; a roofline model assigns efficiencies per kind) and a
:class:`Work` (FLOP, bytes) for each pass: ``forward``, ``backward_input``
(gradient w.r.t. the op's input: the "B" pass of zero-bubble schedules) and
``backward_weight`` (gradient w.r.t. its weights: the "W" pass); ``backward``
is their sum. ``parameters`` are the weights the rank holds; ``saved`` and
``saved_selective`` the activation bytes the op keeps from forward for
backward without recomputation and with selective recomputation.
A :class:`Block` sums them: ``forward``, ``backward_input``,
``backward_weight``, ``backward``, ``recompute(mode)`` (the extra forward
work before the backward: "none" 0, "selective" the attention core, "full"
the whole forward of a decoder layer; the embedding and head are never
recomputed), ``activation_bytes(mode)`` (kept per micro-batch; "full" keeps
the layer input ``input_bytes``), ``parameters``.

Conventions (docs/workload-model.md, "The transformer model"):

- FLOPs count matrix multiplies only, 2 per multiply-add (Narayanan et al.,
  SC'21): a GEMM of n tokens by an i x o weight does 2·n·i·o forward, the
  same for the input gradient and for the weight gradient; the attention
  core does 2·b·s²·h for QKᵀ and again for the context (the full s x s
  square, as Megatron-LM counts it, not the causal half), twice each
  backward. Element-wise ops, norms, biases and the loss have 0 FLOP: they
  are memory-bound and charged bytes only. So the model FLOPs per iteration
  of a GPT are exactly 72·B·s·L·h²·(1 + s/6h + V/12Lh). With
  ``attention="flash"`` the fused core skips the masked half of the causal
  scores and recomputes QKᵀ in backward: half the core's FLOPs forward and
  2.5x that backward (hardware FLOPs, as the kernel runs).
- Bytes are the device-memory traffic of one unfused kernel per op: it reads
  its inputs (and weights) once and writes its outputs once, in the
  activation element size (masks 1 B, loss logits FP32). A weight gradient
  reads the op's input and output gradient and read-modify-writes the
  gradient accumulator (2 x gradient bytes per parameter: accumulation over
  micro-batches). The optimizer step is not in these blocks.
- Tensor parallelism (Megatron-LM): QKV, the first MLP GEMM and the logits
  are column-parallel, the attention output and the second MLP GEMM
  row-parallel; heads, kv heads, ffn split t ways, the vocabulary
  ceil(V/t) ways (padding, as Megatron pads it). Every GEMM and attention op
  does 1/t of the FLOPs; a row-parallel GEMM's bias is replicated. Norms,
  the hidden dropouts and residual adds run on all s tokens on every rank,
  or on s/t of them with sequence parallelism (then s must be a multiple of
  t). The collectives (all-reduce, or all-gather / reduce-scatter with SP)
  are not ops: the graph builder adds them between the ops that need them.
- Mixture of experts (balanced routing): a replicated router GEMM (h x E),
  a dispatch that copies each token to its top_k experts, the experts' MLPs
  on top_k·b·s tokens (their ffn split t ways, their weights ep ways) and a
  weighted combine. The all-to-alls are not ops (expert parallelism).
- Activations kept for backward follow Korthikanti et al. 2022 §4 op by op
  (16-bit: a GPT layer keeps s·b·h·(34 + 5as/h)), generalised to
  grouped-query attention, SwiGLU, no dropout, mixture of experts and other
  element sizes; layer-norm statistics and token ids are not counted.
  With sequence parallelism the inputs of QKV and of the first MLP GEMM are
  kept scattered and all-gathered again in backward (a collective the graph
  builder adds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hcsim.errors import ConfigError
from hcsim.workload.model import RECOMPUTATION, ElementSizes, ModelShape, element_sizes

__all__ = ["OP_KINDS", "ATTENTION", "BLOCK_KINDS", "LOGIT_BYTES", "CROSS_ENTROPY", "Work", "Op", "Block", "decoder_layer", "embedding",
           "lm_head", "model_blocks", "iteration_flops", "model_parameters", "active_parameters"]

OP_KINDS = ("gemm", "attention", "elementwise", "norm")
KERNEL_KINDS = ("gemm", "gemm8", "attention", "memory", "reduction")  # as hcsim.workload.ops runs them
ATTENTION = ("standard", "flash")
BLOCK_KINDS = ("embedding", "decoder", "head")
LOGIT_BYTES = 4.0  # the loss reads logits in FP32 whatever the training precision (Korthikanti et al.: 4sbv)
CROSS_ENTROPY = "cross_entropy"  # the loss op's name


@dataclass(frozen=True, slots=True)
class Work:
    """Work of one pass: `flops` (FLOP) and `bytes` (device-memory traffic, B)."""

    flops: float = 0.0
    bytes: float = 0.0

    def __post_init__(self) -> None:
        if not (self.flops >= 0 and self.bytes >= 0):
            raise ConfigError(f"work: must have FLOP >= 0 and bytes >= 0, got {self.flops!r} FLOP, {self.bytes!r} B")

    def __add__(self, other: "Work") -> "Work":
        return Work(self.flops + other.flops, self.bytes + other.bytes)


NOTHING = Work()


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One operator of a block on one tensor-parallel rank.

    name : unique within its block; kind : one of :data:`OP_KINDS`;
    forward, backward_input, backward_weight : work of each pass;
    parameters : weights the rank holds (biases included);
    saved : activation bytes kept from forward for backward (no recomputation);
    saved_selective : the same with selective recomputation (the attention
    core keeps only Q, K and V); attention_core : recomputed by selective
    recomputation; kernel : the kind of GPU kernel each pass runs as
    (:data:`KERNEL_KINDS`; by default gemm for a GEMM, gemm8 for one in FP8,
    reduction for a norm, memory otherwise) and shape : its
    forward kernel's (m, n, k, batch), a GEMM's C (m x n) = A (m x k) B (k x n)
    `batch` times, or a fused attention kernel's (sequence, heads, head
    dimension, batch).
    """

    name: str
    kind: str
    forward: Work = NOTHING
    backward_input: Work = NOTHING
    backward_weight: Work = NOTHING
    parameters: int = 0
    saved: float = 0.0
    saved_selective: float | None = None
    attention_core: bool = False
    kernel: str = ""
    shape: tuple[int, int, int, int] = (0, 0, 0, 1)

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise ConfigError(f"op {self.name!r}: kind {self.kind!r} is not one of {', '.join(OP_KINDS)}")
        if not self.kernel:
            object.__setattr__(self, "kernel", {"gemm": "gemm", "norm": "reduction"}.get(self.kind, "memory"))
        if self.kernel not in KERNEL_KINDS:
            raise ConfigError(f"op {self.name!r}: kernel {self.kernel!r} is not one of {', '.join(KERNEL_KINDS)}")
        if self.parameters < 0 or not self.saved >= 0:
            raise ConfigError(f"op {self.name!r}: parameters and saved bytes must be >= 0")
        if self.saved_selective is None:
            object.__setattr__(self, "saved_selective", self.saved)
        if not 0 <= self.saved_selective <= self.saved:
            raise ConfigError(f"op {self.name!r}: saved_selective must be between 0 and saved ({self.saved})")

    @property
    def backward(self) -> Work:
        """Both backward passes: input gradient + weight gradient."""
        return self.backward_input + self.backward_weight


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """A block of ops on one tensor-parallel rank, in forward order.

    kind : "embedding", "decoder" or "head" (:data:`BLOCK_KINDS`); ops : the operators;
    input_bytes : bytes of the block's input activation on this rank (what
    full recomputation keeps); micro_batch, sequence, tp, sequence_parallel :
    what the costs are for.
    """

    kind: str
    ops: tuple[Op, ...]
    input_bytes: float
    micro_batch: int
    sequence: int
    tp: int
    sequence_parallel: bool

    def __post_init__(self) -> None:
        if self.kind not in BLOCK_KINDS:
            raise ConfigError(f"block kind: {self.kind!r} is not one of {', '.join(BLOCK_KINDS)}")
        names = [op.name for op in self.ops]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"block {self.kind!r}: op names must be unique, repeated: {', '.join(repeated)}")

    def op(self, name: str) -> Op:
        """The op called `name`."""
        for op in self.ops:
            if op.name == name:
                return op
        raise ConfigError(f"block {self.kind!r} has no op {name!r}; ops: {', '.join(o.name for o in self.ops)}")

    def _sum(self, key: str, ops: tuple[Op, ...] | None = None) -> Work:
        total = NOTHING
        for op in self.ops if ops is None else ops:
            total = total + getattr(op, key)
        return total

    @property
    def forward(self) -> Work:
        return self._sum("forward")

    @property
    def backward_input(self) -> Work:
        return self._sum("backward_input")

    @property
    def backward_weight(self) -> Work:
        return self._sum("backward_weight")

    @property
    def backward(self) -> Work:
        return self.backward_input + self.backward_weight

    @property
    def parameters(self) -> int:
        """Weights this rank holds for the block."""
        return sum(op.parameters for op in self.ops)

    def by_kind(self, pass_name: str) -> dict[str, Work]:
        """Work of one pass ("forward", "backward_input", "backward_weight", "backward") per op kind."""
        return {kind: self._sum(pass_name, tuple(op for op in self.ops if op.kind == kind)) for kind in OP_KINDS}

    def recompute(self, mode: str) -> Work:
        """Forward work redone before the backward pass: "none" nothing; "selective" the attention core
        (scores, softmax, attention dropout, context); "full" the whole forward. Only decoder layers
        are recomputed (Megatron-LM)."""
        _check_mode(mode)
        if mode == "none" or self.kind != "decoder":
            return NOTHING
        if mode == "selective":
            return self._sum("forward", tuple(op for op in self.ops if op.attention_core))
        return self.forward

    def activation_bytes(self, mode: str = "none") -> float:
        """Activation bytes this rank keeps from one micro-batch's forward until its backward.

        "none": every op's `saved`; "selective": `saved_selective` (no a·s² tensors);
        "full": a decoder layer keeps only its input (the embedding and head keep theirs as without
        recomputation)."""
        _check_mode(mode)
        if mode == "full" and self.kind == "decoder":
            return self.input_bytes
        key = "saved_selective" if mode == "selective" else "saved"
        return sum(getattr(op, key) for op in self.ops)


def _check_mode(mode: str) -> None:
    if mode not in RECOMPUTATION:
        raise ConfigError(f"recompute: {mode!r} is not one of {', '.join(RECOMPUTATION)}")


@dataclass(frozen=True, slots=True)
class _Rank:
    """The quantities every op needs: tokens, per-rank sizes, element sizes."""

    shape: ModelShape
    b: int
    s: int
    t: int
    sp: bool
    ep: int
    sizes: ElementSizes
    attention: str

    @property
    def tokens(self) -> int:
        """Tokens a tensor-parallel GEMM sees: b·s (all-gathered under SP)."""
        return self.b * self.s

    @property
    def local(self) -> float:
        """Tokens of the ops outside the tensor-parallel regions: b·s, or b·s/t with SP."""
        return self.b * self.s / self.t if self.sp else self.b * self.s


def _rank(shape: ModelShape, micro_batch: int, sequence: int | None, tp: int, sequence_parallel: bool, ep: int,
          precision: str, attention: str) -> _Rank:
    """Check the parallel configuration against the shape; raise one ConfigError naming the key."""
    s = shape.sequence if sequence is None else sequence
    if attention not in ATTENTION:
        raise ConfigError(f"model {shape.name!r}: attention {attention!r} is not one of {', '.join(ATTENTION)}")
    for key, value in (("micro_batch", micro_batch), ("sequence", s), ("tp", tp), ("ep", ep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"model {shape.name!r}: {key} must be an integer >= 1, got {value!r}")
    kv_heads = shape.kv_heads or shape.heads
    divisible = [("heads", shape.heads, tp), ("kv_heads", kv_heads, tp)]
    divisible.append(("expert_ffn", shape.expert_hidden, tp) if shape.moe else ("ffn", shape.ffn, tp))
    if shape.moe:
        divisible.append(("experts", shape.experts, ep))
    elif ep != 1:
        raise ConfigError(f"model {shape.name!r}: ep {ep} needs a mixture-of-experts model (experts > 1); "
                          "valid: ep 1")
    if sequence_parallel:
        divisible.append(("sequence", s, tp))
    for key, value, degree in divisible:
        if value % degree:
            name = "ep" if key == "experts" else "tp"
            raise ConfigError(f"model {shape.name!r}: {key} {value} is not a multiple of {name} {degree}. "
                              f"Fix: choose {name} among the divisors of {value}")
    return _Rank(shape=shape, b=micro_batch, s=s, t=tp, sp=bool(sequence_parallel), ep=ep,
                 sizes=element_sizes(precision), attention=attention)


def _gemm(name: str, r: _Rank, tokens: float, n_in: float, n_out: float, *, weights: float, bias: float = 0.0,
          saved: float, fp8: bool = True) -> Op:
    """A GEMM of `tokens` rows by n_in x n_out weights on this rank: `weights` (+ `bias`) parameters held,
    more than n_in x n_out for the experts a rank holds (every token meets one of them). In FP8 training
    (Transformer Engine) it runs in FP8 and keeps its input for backward in FP8, unless `fp8` is False (the
    logits and the router stay in BF16)."""
    e, w, g = r.sizes.activation, r.sizes.weight, r.sizes.gradient
    in_fp8 = fp8 and r.sizes.gemm_input is not None
    if in_fp8:
        saved *= r.sizes.gemm_input / e
    flops = 2.0 * tokens * n_in * n_out
    held = weights + bias
    activations_in, activations_out = tokens * n_in * e, tokens * n_out * e
    return Op(name=name, kind="gemm", parameters=round(held), saved=saved, kernel="gemm8" if in_fp8 else "gemm",
              shape=(round(tokens), round(n_out), round(n_in), 1),
              forward=Work(flops, activations_in + activations_out + held * w),
              backward_input=Work(flops, activations_out + weights * w + activations_in),
              backward_weight=Work(flops, activations_in + activations_out + 2.0 * held * g))


def _elementwise(name: str, r: _Rank, *, fwd: float, bwd: float, saved: float = 0.0, kind: str = "elementwise",
                 fwd_mask: float = 0.0, bwd_mask: float = 0.0, parameters: int = 0,
                 saved_selective: float | None = None, attention_core: bool = False) -> Op:
    """A memory-bound op: `fwd` and `bwd` activation elements moved, masks in 1-byte elements; its
    parameters (a norm's) are read in both passes and their gradient accumulated in backward_weight."""
    e, w, g = r.sizes.activation, r.sizes.weight, r.sizes.gradient
    return Op(name=name, kind=kind, parameters=parameters, saved=saved, saved_selective=saved_selective,
              attention_core=attention_core,
              forward=Work(0.0, fwd * e + fwd_mask * r.sizes.mask + parameters * w),
              backward_input=Work(0.0, bwd * e + bwd_mask * r.sizes.mask + parameters * w),
              backward_weight=Work(0.0, 2.0 * parameters * g))


def _norm(name: str, r: _Rank) -> Op:
    """LayerNorm (γ, β) or RMSNorm (γ) over the local tokens: forward reads x writes y; backward reads
    x and dy, writes dx (the fused kernel also yields the γ, β partial sums)."""
    h = r.shape.hidden
    parameters = 2 * h if r.shape.norm == "layernorm" else h
    n = r.local
    return _elementwise(name, r, kind="norm", fwd=2 * n * h, bwd=3 * n * h, saved=n * h * r.sizes.activation,
                        parameters=parameters)


def _dropout(name: str, r: _Rank, elements: float, attention_core: bool = False) -> Op:
    """Dropout: forward reads x, writes y and a 1-byte mask; backward reads dy and the mask, writes dx."""
    return _elementwise(name, r, fwd=2 * elements, bwd=2 * elements, fwd_mask=elements, bwd_mask=elements,
                        saved=elements * r.sizes.mask, saved_selective=0.0 if attention_core else None,
                        attention_core=attention_core)


def _residual(name: str, r: _Rank) -> Op:
    """Residual add: forward reads two, writes one; backward adds the two gradient streams."""
    n = r.local * r.shape.hidden
    return _elementwise(name, r, fwd=3 * n, bwd=3 * n)


def _attention(r: _Rank) -> list[Op]:
    """Rotary embedding (if any), the attention core (scores, softmax, dropout, context), output projection."""
    shape, t, e = r.shape, r.t, r.sizes.activation
    h, hk, b, s = shape.hidden, shape.kv_hidden, r.b, r.s
    n = r.tokens
    q, kv = h / t, hk / t  # per-rank widths of Q and of K (= V)
    scores = b * (shape.heads / t) * s * s  # elements of the a/t score matrices
    bias = (h + 2 * hk) / t if shape.bias else 0.0
    ops = [_gemm("qkv", r, n, h, q + 2 * kv, weights=h * (q + 2 * kv), bias=bias, saved=r.local * h * e)]
    if shape.positions == "rope":
        ops.append(_elementwise("rope", r, fwd=2 * n * (q + kv), bwd=2 * n * (q + kv)))
    bmm = 2.0 * b * s * s * q  # one of QKᵀ, P·V on this rank's heads
    d, heads = h // shape.heads, b * shape.heads // t  # batched GEMMs: one per (sample, head)
    if r.attention == "flash":
        ops.append(_flash_attention(r, q, kv, bmm))
        ops.append(_gemm("attention_projection", r, n, q, h, weights=q * h, bias=h if shape.bias else 0.0,
                         saved=n * q * e))
        return ops
    ops.append(Op(name="attention_scores", kind="attention", attention_core=True, kernel="gemm", shape=(s, s, d, heads),
                  forward=Work(bmm, (n * (q + kv) + scores) * e),
                  backward_input=Work(2 * bmm, (scores + 2 * n * (q + kv)) * e),
                  saved=n * (q + kv) * e))
    ops.append(_elementwise("softmax", r, fwd=2 * scores, bwd=3 * scores, saved=scores * e, saved_selective=0.0,
                            attention_core=True))
    if shape.dropout:
        ops.append(_dropout("attention_dropout", r, scores, attention_core=True))
    probabilities = scores * e if shape.dropout else 0.0  # without dropout the softmax output is kept once
    ops.append(Op(name="attention_context", kind="attention", attention_core=True, kernel="gemm", shape=(s, d, s, heads),
                  forward=Work(bmm, (scores + n * kv + n * q) * e),
                  backward_input=Work(2 * bmm, (n * q + scores + n * kv + scores + n * kv) * e),
                  saved=probabilities + n * kv * e, saved_selective=n * kv * e))
    ops.append(_gemm("attention_projection", r, n, q, h, weights=q * h, bias=h if shape.bias else 0.0,
                     saved=n * q * e))
    return ops


def _flash_attention(r: _Rank, q: float, kv: float, bmm: float) -> Op:
    """The attention core as one fused kernel (Dao et al. 2022, FlashAttention, Algorithms 1 and 2).

    Forward reads Q, K, V and writes the output and the FP32 log-sum-exp of
    each score row; no s x s tensor reaches device memory. The mask is causal
    and the kernel skips its masked tiles: it does half the square's FLOPs
    (what the measured kernels count, experiments/calibration). Backward reads Q,
    K, V, the output, its gradient and the log-sum-exp, recomputes QKᵀ (so 5
    products to the forward's 2) and writes dQ, dK, dV. It keeps Q, K, V and
    the log-sum-exp (the output is kept as the projection's input); dropout
    masks are regenerated from the random state.
    """
    e, n = r.sizes.activation, r.tokens
    statistics = r.b * (r.shape.heads / r.t) * r.s * 4.0  # one FP32 log-sum-exp per score row
    qkv = n * (q + 2 * kv) * e
    d = r.shape.hidden // r.shape.heads
    return Op(name="flash_attention", kind="attention", attention_core=True, kernel="attention",
              shape=(r.s, r.b * r.shape.heads // r.t, d, 1), forward=Work(bmm, qkv + n * q * e + statistics),
              backward_input=Work(2.5 * bmm, qkv + 2 * n * q * e + statistics + qkv),
              saved=qkv + statistics)


def _activation(name: str, r: _Rank, tokens: float, width: float) -> Op:
    """GeLU or ReLU on `width` columns, or SwiGLU (silu(gate) x up) on 2 x `width` columns giving `width`. ReLU's
    backward reads its output, the down projection's input, which that GEMM keeps already: nothing more saved."""
    e = r.sizes.activation
    if r.shape.mlp != "swiglu":
        saved = tokens * width * e if r.shape.mlp == "gelu" else 0.0
        return _elementwise(name, r, fwd=2 * tokens * width, bwd=3 * tokens * width, saved=saved)
    return _elementwise(name, r, fwd=3 * tokens * width, bwd=5 * tokens * width, saved=2 * tokens * width * e)


def _mlp(r: _Rank) -> list[Op]:
    """The dense MLP: up (GeLU, ReLU) or gate+up (SwiGLU, one GEMM), the activation, down."""
    shape, e = r.shape, r.sizes.activation
    h, f, n = shape.hidden, shape.ffn / r.t, r.tokens
    widen = 2 if shape.mlp == "swiglu" else 1
    return [_gemm("mlp_in", r, n, h, widen * f, weights=h * widen * f, bias=widen * f if shape.bias else 0.0,
                  saved=r.local * h * e),
            _activation("activation", r, n, f),
            _gemm("mlp_out", r, n, f, h, weights=f * h, bias=h if shape.bias else 0.0, saved=n * f * e)]


def _moe(r: _Rank) -> list[Op]:
    """A mixture-of-experts MLP with balanced routing: router, dispatch, experts, combine."""
    shape, e = r.shape, r.sizes.activation
    h, experts, k = shape.hidden, shape.experts, shape.top_k
    f = shape.expert_hidden / r.t
    held = experts // r.ep  # experts whose weights this rank holds
    n, routed = r.tokens, shape.top_k * r.tokens  # tokens in, token-expert pairs computed
    widen = 2 if shape.mlp == "swiglu" else 1
    router = _gemm("router", r, r.local, h, experts, weights=h * experts, saved=r.local * h * e, fp8=False)
    return [router,
            _elementwise("routing", r, fwd=2 * r.local * experts, bwd=3 * r.local * experts,
                         saved=r.local * experts * e),
            _elementwise("dispatch", r, fwd=n * h + routed * h, bwd=routed * h + n * h),
            _gemm("expert_in", r, routed, h, widen * f, weights=held * h * widen * f,
                  bias=held * widen * f if shape.bias else 0.0, saved=routed * h * e),
            _activation("activation", r, routed, f),
            _gemm("expert_out", r, routed, f, h, weights=held * f * h, bias=held * h if shape.bias else 0.0,
                  saved=routed * f * e),
            _elementwise("combine", r, fwd=(k + 1) * n * h, bwd=(2 * k + 1) * n * h, saved=routed * h * e)]


def decoder_layer(shape: ModelShape, *, micro_batch: int = 1, sequence: int | None = None, tp: int = 1,
                  sequence_parallel: bool = False, ep: int = 1, precision: str = "bf16",
                  attention: str = "standard") -> Block:
    """One decoder layer (transformer block) on one tensor-parallel rank.

    Ops in forward order: norm_attention, qkv, [rope], attention_scores, softmax,
    [attention_dropout], attention_context, attention_projection, [dropout_attention],
    residual_attention, norm_mlp, then mlp_in, activation, mlp_out (dense) or router,
    routing, dispatch, expert_in, activation, expert_out, combine (mixture of experts),
    then [dropout_mlp], residual_mlp (brackets: only with rotary positions / dropout;
    ``attention="flash"`` replaces scores to context by one flash_attention op).

    Parameters
    ----------
    shape : the model; micro_batch : b (samples); sequence : s (tokens, default
    shape.sequence); tp : tensor-parallel degree t (divides heads, kv heads and
    ffn); sequence_parallel : norms, dropouts and adds on s/t tokens; ep :
    expert-parallel degree (divides experts); precision : element sizes;
    attention : "standard" (Megatron-LM's unfused core, the s x s scores in
    memory) or "flash" (one fused ``flash_attention`` op in place of scores,
    softmax, dropout and context: no s x s tensor kept, QKᵀ recomputed in
    backward, so its FLOPs are hardware FLOPs, above the model FLOPs).

    >>> gpt = ModelShape(name="gpt", decoders=2, hidden=64, heads=4, ffn=256, sequence=32)
    >>> decoder_layer(gpt, micro_batch=2).forward.flops == 2 * (24 * 32 * 64**2 + 4 * 32**2 * 64)
    True
    """
    r = _rank(shape, micro_batch, sequence, tp, sequence_parallel, ep, precision, attention)
    h = shape.hidden
    ops = [_norm("norm_attention", r)] + _attention(r)
    if shape.dropout:
        ops.append(_dropout("dropout_attention", r, r.local * h))
    ops += [_residual("residual_attention", r), _norm("norm_mlp", r)]
    ops += _moe(r) if shape.moe else _mlp(r)
    if shape.dropout:
        ops.append(_dropout("dropout_mlp", r, r.local * h))
    ops.append(_residual("residual_mlp", r))
    return _block("decoder", r, ops)


def _block(kind: str, r: _Rank, ops: list[Op]) -> Block:
    return Block(kind=kind, ops=tuple(ops), input_bytes=r.local * r.shape.hidden * r.sizes.activation,
                 micro_batch=r.b, sequence=r.s, tp=r.t, sequence_parallel=r.sp)


def _vocabulary(shape: ModelShape, t: int) -> int:
    """Rows of the embedding / logits this rank holds: ceil(V/t) (Megatron pads the vocabulary)."""
    if shape.vocabulary < 1:
        raise ConfigError(f"model {shape.name!r}: vocabulary must be >= 1 for the embedding and output layer, "
                          f"got {shape.vocabulary}")
    return math.ceil(shape.vocabulary / t)


def embedding(shape: ModelShape, *, micro_batch: int = 1, sequence: int | None = None, tp: int = 1,
              sequence_parallel: bool = False, ep: int = 1, precision: str = "bf16",
              attention: str = "standard") -> Block:
    """The input embedding on one tensor-parallel rank (the first pipeline stage).

    Ops: embedding_lookup (vocabulary-parallel: ceil(V/t) x h rows, the rank
    gathers the rows of its ~b·s/t tokens and writes the b·s x h output that
    the graph builder all-reduces, or reduce-scatters with SP),
    [position_embedding] (learned: an s x h table, replicated),
    [embedding_dropout]. Its backward is a weight gradient only (token ids
    have no gradient). Keywords as :func:`decoder_layer`.
    """
    r = _rank(shape, micro_batch, sequence, tp, sequence_parallel, ep, precision, attention)
    h, e, w, g = shape.hidden, r.sizes.activation, r.sizes.weight, r.sizes.gradient
    rows = _vocabulary(shape, tp)
    gathered = r.tokens / tp  # tokens whose ids fall in this rank's vocabulary slice (uniformly spread)
    ops = [Op(name="embedding_lookup", kind="elementwise", parameters=rows * h,
              forward=Work(0.0, gathered * h * w + r.tokens * h * e),
              backward_weight=Work(0.0, gathered * h * e + 2.0 * gathered * h * g))]
    if shape.positions == "learned":
        if r.s > shape.sequence:
            raise ConfigError(f"model {shape.name!r}: sequence {r.s} exceeds the {shape.sequence} learned "
                              f"positions. Fix: a sequence <= {shape.sequence}")
        positions = r.local / r.b  # rows of the s x h table this rank adds (s/t with SP)
        ops.append(Op(name="position_embedding", kind="elementwise", parameters=shape.sequence * h,
                      forward=Work(0.0, 2 * r.local * h * e + positions * h * w),
                      backward_weight=Work(0.0, r.local * h * e + 2.0 * positions * h * g)))
    if shape.dropout:
        ops.append(_dropout("embedding_dropout", r, r.local * h))
    return Block(kind="embedding", ops=tuple(ops), input_bytes=0.0, micro_batch=r.b, sequence=r.s, tp=r.t,
                 sequence_parallel=r.sp)


def lm_head(shape: ModelShape, *, micro_batch: int = 1, sequence: int | None = None, tp: int = 1,
            sequence_parallel: bool = False, ep: int = 1, precision: str = "bf16", attention: str = "standard",
            tied_copy: bool = False) -> Block:
    """The final norm, the logits GEMM and the cross-entropy loss on one rank (the last pipeline stage).

    The logits GEMM is vocabulary-parallel (h x ceil(V/t)); the loss reads the
    logits and keeps their softmax in FP32 (:data:`LOGIT_BYTES`, Korthikanti et
    al.'s 4sbv). With tied embeddings the logits reuse the embedding matrix
    and hold no parameters of their own, unless `tied_copy` (Megatron-LM keeps
    a copy on the last stage when it is not the first, and all-reduces the two
    gradients). Keywords as :func:`decoder_layer`.
    """
    r = _rank(shape, micro_batch, sequence, tp, sequence_parallel, ep, precision, attention)
    h, e = shape.hidden, r.sizes.activation
    rows = _vocabulary(shape, tp)
    n = r.tokens
    logits = _gemm("logits", r, n, h, rows, weights=h * rows, saved=r.local * h * e, fp8=False)
    if shape.tied_embeddings and not tied_copy:  # reads the embedding's weights, holds none
        logits = replace(logits, parameters=0)
    loss = Op(name=CROSS_ENTROPY, kind="elementwise", saved=n * rows * LOGIT_BYTES, shape=(n, rows, 1, 1),
              forward=Work(0.0, n * rows * (e + LOGIT_BYTES)), backward_input=Work(0.0, n * rows * (LOGIT_BYTES + e)))
    return _block("head", r, [_norm("final_norm", r), logits, loss])


def model_blocks(shape: ModelShape, **keywords) -> tuple[Block, Block, Block]:
    """(embedding, decoder layer, head) for the same keywords (those of :func:`decoder_layer`)."""
    return embedding(shape, **keywords), decoder_layer(shape, **keywords), lm_head(shape, **keywords)


def iteration_flops(shape: ModelShape, *, batch: int, sequence: int | None = None, recompute: str = "none") -> float:
    """Model FLOPs of one training iteration of `batch` samples (whole model, forward + backward + recompute).

    For a GPT (f = 4h, kv_heads = heads) this is Megatron-LM's
    72·B·s·L·h²·(1 + s/6h + V/12Lh), and with full recomputation
    96·B·s·L·h²·(1 + s/6h + V/16Lh) (Narayanan et al., SC'21, appendix).
    """
    _check_mode(recompute)
    first, layer, head = model_blocks(shape, micro_batch=batch, sequence=sequence)
    per_layer = layer.forward.flops + layer.backward.flops + layer.recompute(recompute).flops
    return shape.decoders * per_layer + sum(block.forward.flops + block.backward.flops for block in (first, head))


def model_parameters(shape: ModelShape) -> int:
    """Every parameter of the model, counted once (tied embeddings once; all experts).

    GPT (biases, layer norms, learned positions, tied): L(12h² + 13h) + Vh + sh + 2h.
    """
    first, layer, head = model_blocks(shape, micro_batch=1)
    return first.parameters + shape.decoders * layer.parameters + head.parameters


def active_parameters(shape: ModelShape) -> int:
    """Parameters one token uses: as :func:`model_parameters` with top_k of the experts (Mixtral: 12.9e9)."""
    if not shape.moe:
        return model_parameters(shape)
    layer = decoder_layer(shape, micro_batch=1)
    experts = layer.op("expert_in").parameters + layer.op("expert_out").parameters
    idle = experts * (shape.experts - shape.top_k) // shape.experts
    return model_parameters(shape) - shape.decoders * idle
