"""Operation-level costs of a compute vertex, for the engine's roofline compute model.

A compute vertex's ``flops`` is all the peak model needs. The roofline model
(:mod:`hcsim.engine.compute_model`) times each *operation* (one GPU kernel) on
its own: a matrix multiply by its shape, a memory-bound kernel by its bytes,
the attention core by its own term. So the hybrid-parallel builder gives each
compute vertex an ``ops`` attribute: a tuple of :class:`Op`, from the model
shape, per TP rank and micro-batch, as Megatron-LM runs a GPT block:

- attention block: layer norm; one fused QKV GEMM (T x h by h x (h + 2 h_kv)/t,
  T = b·s tokens); the attention core (standard: two batched GEMMs per
  head, a fused scale-mask-softmax and a dropout over the a/t·b·s² scores;
  flash: one fused kernel); the output projection (T x h/t by h/t x h); a
  fused bias-dropout-add;
- MLP block: layer norm; up GEMM (T x h by h x f/t, with SwiGLU gate and up
  fused: 2f/t); bias-GeLU (SwiGLU) kernel; down GEMM (T x f/t by f/t x h);
  bias-dropout-add;
- backward: each GEMM becomes its input-gradient and weight-gradient GEMMs
  (same FLOPs each), each memory-bound kernel its backward kernel;
- without sequence parallelism the norms and bias-dropout-adds are
  replicated on every TP rank (full b·s·h); with it each rank does 1/t.

Bytes are what a kernel reads and writes (activations in the workload's
precision, dropout masks 1 B, GEMM operands and result). FLOPs of the GEMMs
and attention core are those of :func:`hcsim.workload.model.generate_decoder_table`,
so the ops of a pass add up to the vertex's FLOPs (a test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hcsim.errors import ConfigError
from hcsim.workload.transformer import ATTENTION as ATTENTION_KINDS

__all__ = ["Op", "OP_KINDS", "ATTENTION_KINDS", "BlockOps", "block_ops", "head_ops", "optimizer_ops",
           "OPTIMIZER_TRAFFIC", "ops_flops"]

OP_KINDS = ("gemm", "attention", "memory")
# Bytes the optimizer step moves per parameter, as Megatron-LM's mixed-precision optimizer runs it
# (FP32 main gradients, FP32 master weights, fused Adam): unscale and inf check (read the main
# gradient, 4), gradient norm for clipping (read it again, 4), Adam (read gradient, master weight, m,
# v: 16; write master, m, v: 12), copy the master into the FP16 weights (read 4, write 2), zero the
# gradient buffer (write 4): 46 B. FP32 training: norm 4, Adam 16 + 12, zeroing 4: 36 B.
OPTIMIZER_TRAFFIC = {"fp16": 46.0, "bf16": 46.0, "fp32": 36.0}


class Op(NamedTuple):
    """One kernel: `kind` (gemm | attention | memory), FLOP, bytes read and written, and for a GEMM its
    shape m x k by k x n, `batch` times (a batched GEMM); `name` for reports. A plain tuple, so a
    workload graph with ops saves to JSON (a list per op) and loads back."""

    name: str
    kind: str
    flops: float = 0.0
    bytes: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1


def _gemm(name: str, m: int, n: int, k: int, e: float, batch: int = 1) -> Op:
    """C (m x n) = A (m x k) B (k x n), `batch` times; reads A and B and writes C, `e` bytes per element."""
    if min(m, n, k, batch) < 1:
        raise ConfigError(f"op {name!r}: a GEMM needs m, n, k, batch >= 1, got {m}, {n}, {k}, {batch} (is tp "
                          f"larger than a dimension it splits?)")
    return Op(name, "gemm", 2.0 * m * n * k * batch, (m * k + k * n + m * n) * e * batch, m, n, k, batch)


def _gemm_backward(op: Op, e: float) -> tuple[Op, Op]:
    """Input gradient dA = dC B^T (m x k by ... ) and weight gradient dB = A^T dC of a forward GEMM."""
    return (_gemm(f"{op.name}.dgrad", op.m, op.k, op.n, e, op.batch),
            _gemm(f"{op.name}.wgrad", op.k, op.n, op.m, e, op.batch))


def _memory(name: str, size: float) -> Op:
    return Op(name, "memory", 0.0, float(size))


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockOps:
    """The kernels of one block (attention or MLP) on one TP rank per micro-batch.

    forward, backward : the passes; core : the attention core's forward kernels (what selective
    recomputation redoes; empty for the MLP block)."""

    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    core: tuple[Op, ...] = ()


def block_ops(model, sizes, micro_batch: int, tp: int, sequence_parallel: bool = False,
              attention: str = "standard") -> tuple[BlockOps, BlockOps]:
    """The attention and MLP blocks of one decoder of `model` (a ModelShape) on one TP rank (module docstring).

    `sizes` : ElementSizes of the precision (activation and mask bytes)."""
    if attention not in ATTENTION_KINDS:
        raise ConfigError(f"attention: {attention!r} is not one of {', '.join(ATTENTION_KINDS)}")
    b, s, h, a, f = micro_batch, model.sequence, model.hidden, model.heads, model.ffn
    e, mask = sizes.activation, sizes.mask
    tokens = b * s
    d = h // a
    heads = a // tp
    # replicated kernels (norms, bias-dropout-add) see all tokens without SP, 1/t of them with it
    rows = tokens / tp if sequence_parallel else tokens
    act = rows * h * e
    drop = 1.0 if model.dropout else 0.0

    def norm(name):  # forward reads x, writes y; backward reads x and dy, writes dx
        return _memory(f"{name}", 2 * act), _memory(f"{name}.bwd", 3 * act)

    def residual(name):  # fused bias-dropout-add: reads x and the residual, writes y and the mask
        return (_memory(name, 3 * act + drop * rows * h * mask),
                _memory(f"{name}.bwd", 2 * act + drop * rows * h * mask))

    qkv = _gemm("qkv", tokens, (h + 2 * model.kv_hidden) // tp, h, e)
    proj = _gemm("proj", tokens, h, h // tp, e)
    scores = b * heads * s * s  # elements of the score matrices on this rank
    if attention == "flash":  # one fused kernel each way: reads Q, K, V (and O, dO backward), writes O (dQ, dK, dV)
        qkv_bytes = tokens * (h + 2 * model.kv_hidden) / tp * e
        core_fwd = (Op(name="flash_attention", kind="attention", flops=4.0 * b * s * s * h / tp,
                       bytes=qkv_bytes + tokens * h / tp * e),)
        # backward recomputes Q·Kᵀ: 5 products to the forward's 2 (FlashAttention-2 counts 2.5x forward)
        core_bwd = (Op(name="flash_attention.bwd", kind="attention", flops=10.0 * b * s * s * h / tp,
                       bytes=2 * qkv_bytes + 2 * tokens * h / tp * e),)
    else:
        qk = _gemm("qk", s, s, d, e, batch=b * heads)
        av = _gemm("av", s, d, s, e, batch=b * heads)
        softmax = _memory("softmax", 2 * scores * e)  # fused scale-mask-softmax: reads scores, writes probs
        dropout = _memory("attn_dropout", drop * (2 * scores * e + scores * mask))
        core_fwd = (qk, softmax, dropout, av) if model.dropout else (qk, softmax, av)
        core_bwd = (*_gemm_backward(av, e),
                    *((_memory("attn_dropout.bwd", 2 * scores * e + scores * mask),) if model.dropout else ()),
                    _memory("softmax.bwd", 3 * scores * e), *_gemm_backward(qk, e))
    norm_f, norm_b = norm("norm_attn")
    res_f, res_b = residual("add_attn")
    attn = BlockOps(forward=(norm_f, qkv, *core_fwd, proj, res_f),
                    backward=(res_b, *_gemm_backward(proj, e), *core_bwd, *_gemm_backward(qkv, e), norm_b),
                    core=core_fwd)
    inner = (2 * f if model.mlp == "swiglu" else f) // tp
    up = _gemm("up", tokens, inner, h, e)
    down = _gemm("down", tokens, h, f // tp, e)
    activation_in = tokens * inner * e
    act_f = _memory(model.mlp, activation_in + tokens * f / tp * e)  # reads the GEMM output, writes the activation
    act_b = _memory(f"{model.mlp}.bwd", activation_in + 2 * tokens * f / tp * e)
    norm_f, norm_b = norm("norm_mlp")
    res_f, res_b = residual("add_mlp")
    mlp = BlockOps(forward=(norm_f, up, act_f, down, res_f),
                   backward=(res_b, *_gemm_backward(down, e), act_b, *_gemm_backward(up, e), norm_b))
    return attn, mlp


def head_ops(model, sizes, micro_batch: int, tp: int) -> BlockOps:
    """The LM head on one TP rank: the logits GEMM (T x h by h x V/t) and the vocabulary-parallel
    cross entropy (FP32 logits: read, exponentiate, write; backward reads and writes them again)."""
    tokens = micro_batch * model.sequence
    e = sizes.activation
    logits = _gemm("logits", tokens, model.vocabulary // tp, model.hidden, e)
    entropy = tokens * model.vocabulary / tp * 4.0
    return BlockOps(forward=(logits, _memory("cross_entropy", 2 * entropy)),
                    backward=(_memory("cross_entropy.bwd", 2 * entropy), *_gemm_backward(logits, e)))


def optimizer_ops(parameters: float, precision: str) -> tuple[Op, ...]:
    """The optimizer step over `parameters` (per XPU): one memory-bound fused kernel (OPTIMIZER_TRAFFIC)."""
    return (_memory("optimizer", parameters * OPTIMIZER_TRAFFIC[precision]),)


def ops_flops(ops) -> float:
    """Total FLOP of a sequence of ops."""
    return sum(op.flops for op in ops)
