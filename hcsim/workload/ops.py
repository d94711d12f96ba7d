"""The kernels a framework launches for a training step, for the engine's kernel (roofline) compute model.

A compute vertex's ``flops`` is all the peak model needs. The kernel model
(:mod:`hcsim.engine.compute_model`) times each GPU *kernel* on its own: a GEMM
by its shape, the fused attention kernel by sequence and head dimension, a
memory-bound kernel by its bytes, each issued by the host. So the
hybrid-parallel builder gives each compute vertex an ``ops`` attribute: a
tuple of :class:`Op` per TP rank and micro-batch, from the workload's kernel
inventory (``training.kernels``):

- ``megatron`` (:func:`megatron_ops`): Megatron-LM's kernels are the ops of
  :mod:`hcsim.workload.transformer` (one model of a decoder: the same FLOPs
  and bytes, with their GEMM shapes): fused QKV, a fused scale-mask-softmax
  or flash attention, fused LayerNorm / RMSNorm, bias-GeLU, a fused
  bias-dropout-add, a vocabulary-parallel cross-entropy over FP32 logits,
  and the mixed-precision optimizer's 42-54 B per parameter
  (:func:`optimizer_ops`); each GEMM's backward is its input-gradient
  and weight-gradient GEMMs (and, where the weight-gradient GEMM does not
  accumulate into the main gradient itself, the add that does).
- ``pytorch-eager`` (:func:`eager_layer_ops`, :func:`eager_head_ops`,
  :func:`eager_embedding_ops`): a Hugging Face model (LlamaForCausalLM,
  GPT2LMHeadModel) in PyTorch eager mode under torch.autocast(bfloat16) over
  FP32 weights, as its modeling code runs: every norm, activation, rotary
  embedding, residual add and cast its own kernel in its real dtype, the
  weights cast to BF16 in each forward, sdpa's causal flash kernel, the
  logits upcast to FP32 for the loss, fused AdamW over FP32 parameters
  (28 B per parameter); autograd's saved tensors give the memory.
- ``torch-compile``: the same under torch.compile: Inductor fuses each run of
  memory-bound kernels between GEMMs and attention into one; AOTAutograd's
  partitioner keeps fewer tensors for backward (:func:`compiled_saved`) and
  the backward recomputes the element-wise ones it dropped, inside its fused
  kernels, from the tensors it kept.

Bytes are what a kernel reads and writes; FLOPs count what the kernel does
(a causal flash kernel skips the masked half of the scores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from hcsim.errors import ConfigError
from hcsim.workload.transformer import ATTENTION as ATTENTION_KINDS, CROSS_ENTROPY, LOGIT_BYTES

__all__ = ["Op", "OP_KINDS", "GEMM_KINDS", "ATTENTION_KINDS", "BlockOps", "megatron_ops", "optimizer_ops",
           "KERNEL_INVENTORIES", "KernelInventory", "INVENTORIES", "checkpoint_recompute", "eager_layer_ops", "eager_embedding_ops", "eager_head_ops", "optimizer_step_ops",
           "OPTIMIZER_TRAFFIC", "ops_flops", "FP8_RECIPES", "fp8_quantize", "ADAMW_FUSED_TRAFFIC",
           "CLIP_GRAD_NORM_TRAFFIC", "multi_tensor_launches", "eager_optimizer_ops",
           "compiled_saved"]

# gemm_unaligned: a BF16 GEMM with a dimension that is not a multiple of 8 elements, which cuBLAS runs on kernels
# without 16-byte aligned loads (a framework that does not pad: GPT-2's vocabulary of 50257 in Hugging Face;
# Megatron-LM pads it); gemm8: a GEMM in FP8 (Transformer Engine); memory: a memory-bound kernel streaming its bytes; reduction: a
# norm's kernels that reduce along rows or over the tokens (statistics, the weight gradients): measured to reach
# less of the bandwidth; mixed: an elementwise kernel PyTorch runs unvectorised (operands of two dtypes, or one
# broadcast over the other's rows: Megatron's loss, the eager RMSNorm's products); upcast: a 16-bit tensor's copy
# to FP32 (UPCAST), unvectorised too and measured apart; decode: decode attention's read of the key/value cache
# (serving), measured apart;
# strided: one that reads or writes a transposed or sliced tensor (a broadcast over heads, a transposed copy);
# cat: torch.cat's kernel (CatArrayBatchedCopy), measured slower still (the strided rate where not measured);
# multi_tensor: one launch of PyTorch's multi_tensor_apply over a list of tensors (fused AdamW, the foreach norm
# and scaling of gradient clipping), measured at its own rate (the adamw_fused_fp32_step rows)
OP_KINDS = ("gemm", "gemm_unaligned", "gemm8", "attention", "memory", "reduction", "mixed", "upcast", "strided",
            "cat", "multi_tensor", "decode")
GEMM_KINDS = ("gemm", "gemm_unaligned", "gemm8")
# PyTorch's copy of a 16-bit tensor to FP32 (``.float()``, autograd's ToCopyBackward0 behind a down-cast) runs
# on its unvectorised path (dynamic casting) at every width: 2.0-2.1 TB/s on the H200 where FP32 to BF16 streams
# at 4.2-4.4 (experiments/calibration/measurements/h200-casts.csv): a kind of its own, at its measured rate.
UPCAST = "upcast"
# Bytes the optimizer step's multi_tensor_apply kernels move per parameter of the rank's optimizer shard, as
# Megatron-LM's mixed-precision optimizer runs them (megatron/core/optimizer/optimizer.py and distrib_optimizer.py:
# FP32 master weights, fused Adam): in FP16 only, the loss scaler's unscale and inf check
# (torch._amp_foreach_non_finite_check_and_unscale_ rewrites the FP32 main gradient in place: read 4, write 4; BF16
# and FP8 runs have no grad scaler, megatron/core/optimizer/__init__.py), the gradient norm for clipping (read it, 4;
# the clip's rescale runs only for a norm above the limit), Adam (read gradient, master weight, m, v: 16; write
# master, m, v: 12), the copy of the master into the 16-bit weights (read 4, write 2): 38 B, 46 B in FP16; FP32
# training: norm 4, Adam 16 + 12: 32 B. Beside them (:func:`optimizer_ops`): 16-bit main gradients cast to FP32
# first (read 2, write 4) and the zeroing of the gradient buffer (its element size), so 42 B a parameter in BF16
# with FP32 gradients, 46 B with 16-bit ones (FP8), 54 B in FP16, 36 B in FP32.
OPTIMIZER_TRAFFIC = {"fp16": 46.0, "bf16": 38.0, "fp8": 38.0, "fp32": 32.0}


class Op(NamedTuple):
    """One kernel: `kind` (gemm | attention | memory | reduction), FLOP, bytes read and written, and for a GEMM its
    shape m x k by k x n, `batch` times (a batched GEMM), and the SMs it leaves to communication kernels running
    beside it (`sm_margin`: Transformer Engine's userbuffers overlap with set_sm_margin); `name` for reports. A
    plain tuple, so a workload graph with ops saves to JSON (a list per op) and loads back."""

    name: str
    kind: str
    flops: float = 0.0
    bytes: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    sm_margin: int = 0


def _gemm(name: str, m: int, n: int, k: int, e: float, batch: int = 1, tokens: str = "m") -> Op:
    """C (m x n) = A (m x k) B (k x n), `batch` times; reads A and B and writes C, `e` bytes per element; a
    ``gemm_unaligned`` kernel when a dimension other than the token one (`tokens`: "m", "k" for a weight
    gradient, "" for a GEMM of no tokens) is not a multiple of 8.

    Why the token dimension is exempt: what was measured slow (cuBLAS's kernels without 16-byte aligned loads,
    about 10 % of peak) were GEMMs whose weight has an unaligned width (GPT-2's 50257-wide output layer in the
    forward, input-gradient and weight-gradient products; experiments/calibration/measurements/*kernels3.csv),
    every one with an aligned token count (2,048 or 8,192). Activations are row-major [tokens, features], so the
    leading dimension of every operand (lda, ldb, ldc: what 16-byte alignment is about) is a feature width,
    never the token count: the tokens are the rows (forward, input gradient) or the reduction (weight gradient),
    which tile predication handles at the wave model's cost. Continuous batching makes the token count any
    integer, so charging it the unaligned rate would make a 2,049-token prompt 5x slower than a 2,048 one."""
    if min(m, n, k, batch) < 1:
        raise ConfigError(f"op {name!r}: a GEMM needs m, n, k, batch >= 1, got {m}, {n}, {k}, {batch} (is tp "
                          f"larger than a dimension it splits?)")
    checked = [size for axis, size in (("m", m), ("n", n), ("k", k)) if axis != tokens]
    kind = "gemm_unaligned" if any(size % 8 for size in checked) else "gemm"
    return Op(name, kind, 2.0 * m * n * k * batch, (m * k + k * n + m * n) * e * batch, m, n, k, batch)


def _gemm_backward(op: Op, e: float) -> tuple[Op, Op]:
    """Input gradient dA = dC B^T (m x n by n x k; the tokens stay m) and weight gradient dB = A^T dC (k x m by
    m x n; the tokens become the reduction, k) of a forward GEMM."""
    return (_gemm(f"{op.name}.dgrad", op.m, op.k, op.n, e, op.batch),
            _gemm(f"{op.name}.wgrad", op.k, op.n, op.m, e, op.batch, tokens="k"))


def _memory(name: str, size: float, kind: str = "memory") -> Op:
    return Op(name, kind, 0.0, float(size))


class Reduce(float):
    """Bytes of a backward kernel that reduces (a weight or bias gradient summed over tokens, a norm's statistics):
    a ``reduction`` kernel, which reaches less of the memory bandwidth than a streaming one."""


class Typed(float):
    """Bytes of a backward kernel of a kind of its own, not its forward kernel's: a dtype conversion autograd's
    engine inserts (``memory``) behind a mixed-dtype product, a strided copy, a fill.

    >>> Typed(6.0, "memory").kind
    'memory'
    """

    def __new__(cls, size: float, kind: str):
        made = super().__new__(cls, size)
        made.kind = kind
        return made


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockOps:
    """The kernels of one block (attention or MLP) on one TP rank per micro-batch.

    forward, backward : the passes; core : the attention core's forward kernels (what selective
    recomputation redoes; empty for the MLP block)."""

    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    core: tuple[Op, ...] = ()


# Transformer Engine's FP8 scaling recipes (workload key training.fp8_recipe): "delayed" (DelayedScaling, TE's and
# NeMo's default: each tensor's scale comes from the amax history of earlier steps, the amax is recorded by the
# cast kernel itself) or "current" (Float8CurrentScaling: each tensor's amax is computed first, in a pass of its
# own over the tensor, then the cast uses it)
FP8_RECIPES = ("delayed", "current")


def fp8_quantize(name: str, elements: float, recipe: str = "delayed") -> list[Op]:
    """The kernels Transformer Engine runs to quantize a BF16 tensor of `elements` for FP8 GEMMs on Hopper: one
    fused cast-transpose (reads the BF16 tensor, writes its FP8 copy and the FP8 transpose the other GEMM of the
    pair needs: 2 + 1 + 1 B per element; cast_transpose_fused, or a quantizer with rowwise and columnwise usage),
    preceded under current scaling by the amax pass (a reduction reading the tensor: 2 B per element).

    >>> [(k.name, k.bytes) for k in fp8_quantize("qkv", 10)]
    [('qkv.cast_transpose_fp8', 40.0)]
    >>> [(k.name, k.kind, k.bytes) for k in fp8_quantize("qkv", 10, "current")]
    [('qkv.amax', 'reduction', 20.0), ('qkv.cast_transpose_fp8', 'memory', 40.0)]
    """
    if recipe not in FP8_RECIPES:
        raise ConfigError(f"fp8_recipe: {recipe!r} is not one of {', '.join(FP8_RECIPES)}")
    cast = _memory(f"{name}.cast_transpose_fp8", elements * (HALF + 2.0))
    return [_memory(f"{name}.amax", elements * HALF, "reduction"), cast] if recipe == "current" else [cast]


def megatron_ops(ops, fp8_recipe: str = "delayed", gradient_add: float = 0.0, cross_entropy: str = "native"
                 ) -> BlockOps:
    """The kernels Megatron-LM launches for transformer ops (:class:`hcsim.workload.transformer.Op`, one block on
    one TP rank, in forward order): each op's passes run as its `kernel` kind with its FLOPs and bytes, so the
    kernels of a pass add up to the block's work. A GEMM's backward is its input-gradient GEMM (m x n by
    n x k) and its weight-gradient GEMM (k x m by m x n); the unfused attention core's batched GEMMs have two
    input gradients each; a memory-bound op one backward kernel. Megatron's fused bias-dropout-add runs a
    dropout and the residual add after it as one kernel moving the bytes of the larger (the dropout's output
    stays in registers). `core`: the attention core's forward kernels (what selective recomputation redoes).
    An FP8 GEMM (``gemm8``) quantizes its input before the forward GEMM and its output gradient before the
    backward ones, each in :func:`fp8_quantize`'s kernels for `fp8_recipe` (the weight is quantized once a
    step: :func:`optimizer_step_ops`), but for an input straight from a norm (:func:`_fp8_after_norm`).
    `gradient_add` > 0: each op's weight gradients are added to the main-gradient buffer by a kernel of their own
    after its backward kernels, moving that many bytes per weight (:attr:`hcsim.workload.spec.WorkloadSpec.gradient_add`).
    The loss runs the kernels of :func:`_vocab_parallel_cross_entropy` for `cross_entropy` (its fusion).

    >>> from hcsim.workload.transformer import Op as Layer, Work
    >>> fc = Layer(name="fc", kind="gemm", forward=Work(128.0), backward_input=Work(128.0),
    ...            backward_weight=Work(128.0), parameters=8, shape=(8, 2, 4, 1))
    >>> [(k.name, k.bytes) for k in megatron_ops([fc], gradient_add=6.0).backward]
    [('fc.dgrad', 0.0), ('fc.wgrad', 0.0), ('fc.main_grad_add.wgrad', 48.0)]
    """
    forward, backward, core = [], [], []
    previous = None
    for op in ops:
        m, n, k, batch = op.shape
        if op.kernel == "attention":
            ahead = [Op(op.name, "attention", op.forward.flops, op.forward.bytes, m, n, k, batch)]
            behind = [Op(f"{op.name}.bwd", "attention", op.backward.flops, op.backward.bytes, m, n, k, batch)]
        elif op.kernel in ("gemm", "gemm8"):
            ahead = [Op(op.name, op.kernel, op.forward.flops, op.forward.bytes, m, n, k, batch)]
            if op.backward_weight.flops:  # input and weight gradients
                behind = [Op(f"{op.name}.dgrad", op.kernel, *_work(op.backward_input), m, k, n, batch),
                          Op(f"{op.name}.wgrad", op.kernel, *_work(op.backward_weight), k, n, m, batch)]
            else:  # a product of two activations: a gradient for each
                half = (op.backward_input.flops / 2, op.backward_input.bytes / 2)
                behind = [Op(f"{op.name}.a.dgrad", "gemm", *half, m, k, n, batch),
                          Op(f"{op.name}.b.dgrad", "gemm", *half, k, n, m, batch)]
        elif op.name == CROSS_ENTROPY:
            ahead, behind = _vocab_parallel_cross_entropy(m * n, op.forward.bytes / (m * n) - LOGIT_BYTES,
                                                          cross_entropy)
        else:
            ahead = [_memory(op.name, op.forward.bytes, op.kernel)] if op.forward.bytes else []
            behind = [_memory(f"{op.name}.bwd", op.backward.bytes, op.kernel)] if op.backward.bytes else []
        if gradient_add and op.parameters:  # named .wgrad: it goes with the weight gradients where those are split
            behind.append(_memory(f"{op.name}.main_grad_add.wgrad", op.parameters * gradient_add))  # off (ZB-H1)
        if op.kernel == "gemm8":  # Transformer Engine's quantization: the input (FP8 and its transpose, for the
            # weight gradient) before the GEMM; backward, the output gradient (for dgrad and, transposed, wgrad)
            if previous is not None and previous.kind == "norm":
                forward[-1], quantize = _fp8_after_norm(forward[-1], previous, op.name, m * k * batch, fp8_recipe)
            else:
                quantize = fp8_quantize(op.name, m * k * batch, fp8_recipe)
            ahead[:0] = quantize
            behind[:0] = fp8_quantize(f"{op.name}.bwd", m * n * batch, fp8_recipe)
        if forward and op.name.startswith("residual") and forward[-1].name.startswith("dropout"):
            ahead = [_fused((forward.pop(), *ahead))[0]._replace(name=f"bias_dropout_add_{op.name}")]
            behind = [_fused((*behind, backward.pop(0)))[0]._replace(name=f"bias_dropout_add_{op.name}.bwd")]
        forward += ahead
        backward[:0] = behind
        if op.attention_core:
            core += ahead
        previous = op
    return BlockOps(forward=tuple(forward), backward=tuple(backward), core=tuple(core))


# Megatron-LM's loss kernels (workload key training.cross_entropy_fusion): "none" (megatron/core/tensor_parallel/
# cross_entropy.py, unfused: Megatron-LM's default flags, and May 2022's mpu/cross_entropy.py), "native"
# (--cross-entropy-loss-fusion: megatron/core/fusions/fused_cross_entropy.py, its functions compiled by torch.compile
# (megatron/core/jit.py's jit_fuser); NeMo 2.0's GPTConfig turns it on) or "te" (--cross-entropy-fusion-impl te:
# Transformer Engine's Triton kernels, transformer_engine/common/triton/cross_entropy.py)
CROSS_ENTROPY_FUSIONS = ("none", "native", "te")


def _vocab_parallel_cross_entropy(logits: float, element: float, fusion: str = "native"
                                  ) -> tuple[list[Op], list[Op]]:
    """The forward and backward kernels of Megatron-LM's loss over one rank's `logits` (tokens x its vocabulary
    slice) from `element`-byte activations, as `fusion` (:data:`CROSS_ENTROPY_FUSIONS`) runs it. Each keeps a
    logit's 4 B for backward (the softmax, or TE's gradient); the TP all-reduces are a few bytes a token.

    - none: the upcast to FP32, the row maximum, ``sub_`` of it (in place, broadcast over the row: PyTorch's
      unvectorised kernel), ``exp`` in place, the row sum, ``div_`` by it (broadcast): 38 B a logit from BF16;
      backward ``grad_input.mul_`` by the loss's gradient (broadcast) and the upcast's backward, a cast down: 14 B.
    - native: three compiled kernels, the upcast with the maximum (writing the FP32 copy it returns), the
      subtraction, exponent and sum in place, the division in place: 22 B; backward one, the scaling and the cast
      to BF16, the scaled softmax written back as torch.compile keeps an input's mutation: 10 B.
    - te: the online softmax and the loss kernel, each reading the BF16 logits, the second writing the FP32
      gradient: 8 B; backward its scaling in place, then autograd's cast of that FP32 gradient to the logits'
      dtype: 14 B.

    >>> [(k.name, k.kind, k.bytes) for k in _vocab_parallel_cross_entropy(10, 2.0, "none")[1]]
    [('cross_entropy.scale.bwd', 'mixed', 80.0), ('cross_entropy.float.bwd', 'memory', 60.0)]
    >>> [sum(k.bytes for k in _vocab_parallel_cross_entropy(1, 2.0, f)[0]) for f in CROSS_ENTROPY_FUSIONS]
    [38.0, 22.0, 8.0]
    """
    e, r, name = element, LOGIT_BYTES, CROSS_ENTROPY
    if fusion == "none":
        return ([_memory(f"{name}.float", logits * (e + r), UPCAST if e < r else "memory"),
                 _memory(f"{name}.max", logits * r),
                 _memory(f"{name}.sub_max", 2 * logits * r, "mixed"), _memory(f"{name}.exp", 2 * logits * r),
                 _memory(f"{name}.sum", logits * r), _memory(f"{name}.div", 2 * logits * r, "mixed")],
                [_memory(f"{name}.scale.bwd", 2 * logits * r, "mixed"),
                 _memory(f"{name}.float.bwd", logits * (r + e))])
    if fusion == "native":
        return ([_memory(f"{name}.logits_max", logits * (e + r)), _memory(f"{name}.exp_sum", 2 * logits * r),
                 _memory(f"{name}.div", 2 * logits * r)],
                [_memory(f"{name}.gradients.bwd", logits * (r + r + e))])
    return ([_memory(f"{name}.online_softmax", logits * e), _memory(f"{name}.loss_gradient", logits * (e + r))],
            [_memory(f"{name}.scale.bwd", 2 * logits * r), _memory(f"{name}.cast.bwd", logits * (r + e))])


def _fp8_after_norm(norm_kernel: Op, norm, name: str, elements: float, recipe: str) -> tuple[Op, list[Op]]:
    """The norm kernel and the quantization of an FP8 GEMM whose input is that norm's output, as Transformer
    Engine's LayerNormLinear runs them (transformer_engine/pytorch/module/layernorm_linear.py, with_quantized_norm).
    Under delayed scaling the norm kernel writes FP8 itself (csrc/extensions/normalization.cpp: FULLY_FUSED), half
    its BF16 output's bytes, and the FP8 transpose the weight gradient needs follows (common/normalization/
    layernorm/ln_api.cpp: nvte_transpose, reading and writing 1 B an element of the `elements` the GEMM takes);
    under current scaling the norm records the amax as it writes BF16 (FUSED_NORM_AMAX_FP8), so only the
    cast-transpose follows, without the amax pass. `norm`: the transformer op (its saved bytes: its output's
    size in BF16)."""
    if recipe == "current":  # the cast-transpose alone, as delayed scaling's: the norm recorded the amax
        return norm_kernel, fp8_quantize(name, elements, "delayed")
    return (norm_kernel._replace(bytes=norm_kernel.bytes - norm.saved / 2),
            [_memory(f"{name}.transpose_fp8", elements * 2.0)])


def _work(work) -> tuple[float, float]:
    return work.flops, work.bytes


def optimizer_ops(parameters: float, precision: str, main_gradient: float = 4.0, buffer: float | None = None,
                  scaled: bool = False) -> tuple[Op, ...]:
    """Megatron-LM's optimizer step over `parameters` (the rank's optimizer shard) with `main_gradient`-byte main
    gradients: with 16-bit ones, each gradient's cast to FP32 first (``main_param.grad = main_grad.float()``, an
    UPCAST kernel; FP32 ones are used as they are); its multi_tensor_apply kernels (OPTIMIZER_TRAFFIC: the loss scaler's
    unscale, the gradients' L2 norm, Transformer Engine's or apex's FusedAdam, the copy of the master into the
    16-bit weights: one ``multi_tensor`` op, at the rate measured for PyTorch's fused AdamW, the same machinery);
    and the zeroing of the gradient buffer, `buffer` elements (the whole buffer the rank holds, which the
    distributed optimizer does not shard: DistributedDataParallel.zero_grad_buffer; `parameters` when None).
    `scaled` (dp x cp > 1): the buffer is also scaled by 1/(dp x cp) before its reduction, read and written once
    (megatron/core/distributed/param_and_grad_buffer.py, start_grad_sync: ``bucket.grad_data *=
    gradient_scaling_factor``), timed here in the step, not before each bucket.

    >>> [(op.name, op.kind, op.bytes) for op in optimizer_ops(1.0, "bf16")]
    [('optimizer', 'multi_tensor', 38.0), ('zero_grad_buffer', 'memory', 4.0)]
    >>> [(op.name, op.bytes) for op in optimizer_ops(1.0, "fp16", main_gradient=2.0, buffer=8.0)]
    [('main_grad_cast', 6.0), ('optimizer', 46.0), ('zero_grad_buffer', 16.0)]
    """
    buffer = parameters if buffer is None else buffer
    cast = [_memory("main_grad_cast", parameters * (main_gradient + 4.0), UPCAST)] if main_gradient < 4.0 else []
    scale = [_memory("scale_grad_buffer", 2.0 * buffer * main_gradient)] if scaled else []
    return (*cast, _memory("optimizer", parameters * OPTIMIZER_TRAFFIC[precision], "multi_tensor"),
            _memory("zero_grad_buffer", buffer * main_gradient), *scale)


def ops_flops(ops) -> float:
    """Total FLOP of a sequence of ops."""
    return sum(op.flops for op in ops)


# ---- the kernels a framework launches ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class KernelInventory:
    """What a framework launches for a training step (``training.kernels``), and what that asks of hcsim.

    fused: Megatron-LM / Transformer Engine's fused kernels, the ops of :mod:`hcsim.workload.transformer`;
    otherwise PyTorch's own kernels, one per operator, which live only in the hybrid graph (one data-parallel
    rank per XPU), only the kernel model can time, and whose memory is autograd's saved tensors
    (:func:`hcsim.workload.memory.eager_stage_memory`). compiled: under torch.compile (Inductor fuses each run of
    memory-bound kernels between GEMMs and attention). precisions: what its step can run in, the first the
    default.
    """

    name: str
    summary: str
    fused: bool
    compiled: bool = False
    precisions: tuple[str, ...]

    @property
    def needs_hybrid_graph(self) -> bool:
        """Its kernels exist only in the hybrid-parallel graph (a layer table has no PyTorch kernels)."""
        return not self.fused

    @property
    def needs_kernel_model(self) -> bool:
        """Timed by its kernels whatever compute_model says: the peak model knows nothing of PyTorch's kernels."""
        return not self.fused


INVENTORIES = {inventory.name: inventory for inventory in (
    KernelInventory(name="megatron", fused=True, precisions=("fp32", "fp16", "bf16", "fp8"),
                    summary="Megatron-LM / Transformer Engine's fused kernels (training.kernels default)"),
    # torch.autocast over FP32 weights: BF16 unless the workload says FP16
    KernelInventory(name="pytorch-eager", fused=False, precisions=("bf16", "fp16"),
                    summary="a Hugging Face model in PyTorch eager mode under bf16 autocast: every op its own kernel"),
    KernelInventory(name="torch-compile", fused=False, compiled=True, precisions=("bf16", "fp16"),
                    summary="the same under torch.compile: memory-bound chains fused by Inductor"),
)}
KERNEL_INVENTORIES = tuple(INVENTORIES)  # their names, the choices of training.kernels
BACKWARD_SUFFIXES = (".bwd", ".dgrad", ".wgrad")  # a backward kernel's name ends so (autograd's engine launches it)
BANDWIDTH_KINDS = ("memory", "reduction", "mixed", "upcast", "strided", "cat", "multi_tensor", "decode")
ADAMW_FUSED_TRAFFIC = 28.0  # torch.optim.AdamW(fused=True) over FP32 parameters: reads p, g, m, v, writes p, m, v
CLIP_GRAD_NORM_TRAFFIC = 12.0  # torch.nn.utils.clip_grad_norm_ over FP32 gradients: the norm reads g (4), the
# scaling reads and writes it (8)
# multi_tensor_apply (aten/src/ATen/native/cuda/MultiTensorApply.cuh): 65,536 elements a block (kChunkSize), at most
# 320 blocks a launch (depth_to_max_blocks with 4 KB kernel arguments, as the fused optimizers and foreach ops
# launch: the profiled steps' 60 fused AdamW launches for Llama 3.2 1B's 1.24e9 parameters)
MULTI_TENSOR_CHUNK, MULTI_TENSOR_BLOCKS = 65536, 320
DROPOUT = "dropout"  # in an attention kernel's name: the kernel applies dropout to its probabilities
RESIDUAL, HALF, MASTER = 4.0, 2.0, 4.0  # eager autocast: FP32 residual stream, BF16 GEMM operands, FP32 weights


@dataclass
class _Kernels:
    """One block's kernels as an eager framework launches them: forward in order, backward in reverse, and
    the bytes autograd keeps from forward for backward (`saved`)."""

    forward: list = None
    backward_reversed: list = None
    compiled_reversed: list = None
    saved: float = 0.0

    def __post_init__(self):
        self.forward, self.backward_reversed, self.compiled_reversed = [], [], []

    def behind(self, kernels: tuple[Op, ...], compiled: tuple[Op, ...] | None = None) -> None:
        """An op's backward kernels in eager mode, and under torch.compile (`compiled`; None: the same) before
        Inductor fuses them (:meth:`kernels`)."""
        self.backward_reversed.append(kernels)
        self.compiled_reversed.append(kernels if compiled is None else compiled)

    def memory(self, name: str, size: float, backward=(), saved: float = 0.0, kind: str = "memory",
               compiled_backward=None) -> None:
        """A memory-bound kernel of `kind` (memory, reduction, mixed, strided) moving `size` bytes; `backward`: the
        bytes of each of its backward kernels in the order autograd runs them, a reduction where :class:`Reduce`,
        a :class:`Typed`'s own kind, else of the same kind (a reduction's streaming); no forward kernel when `size`
        is 0 (a view, whose backward may still launch kernels). `compiled_backward`: the bytes of its backward
        kernels under torch.compile where they differ from eager's (None: the same): where AOTAutograd's
        partitioner saved not the op's output but the inputs it is recomputed from (:func:`compiled_saved`), the
        backward kernel reads those inputs and recomputes the op in registers."""
        if size:
            self.forward.append(_memory(name, size, kind))
        streaming = "memory" if kind == "reduction" else kind

        def ops(sizes):
            return tuple(_memory(f"{name}.bwd", b, "reduction" if isinstance(b, Reduce)
                                 else b.kind if isinstance(b, Typed) else streaming) for b in sizes)

        self.behind(ops(backward), None if compiled_backward is None else ops(compiled_backward))
        self.saved += saved

    def linear(self, name: str, tokens: int, n_in: int, n_out: int, cast_input: bool, bias: bool = False) -> None:
        """F.linear (GPT-2's Conv1D: addmm) under autocast over an FP32 weight: casts (input when FP32, weight, bias),
        one BF16 GEMM; backward: input- and weight-gradient GEMMs, the bias gradient (addmm's ``self: grad``
        summed over the tokens by autograd's engine, sum_to: a BF16 reduction), then each gradient cast back
        through its cast's ToCopyBackward0 (``grad.to(FP32)``): bias, weight, and the input where it was FP32."""
        if cast_input:
            self.memory(f"{name}.cast_input", tokens * n_in * (RESIDUAL + HALF),
                        (Typed(tokens * n_in * (HALF + RESIDUAL), UPCAST),))
        weights = n_in * n_out
        self.memory(f"{name}.cast_weight", weights * (MASTER + HALF), (Typed(weights * (HALF + MASTER), UPCAST),))
        if bias:
            self.memory(f"{name}.cast_bias", n_out * (MASTER + HALF),
                        (Reduce(tokens * n_out * HALF + n_out * HALF), Typed(n_out * (HALF + MASTER), UPCAST)))
        op = _gemm(name, tokens, n_out, n_in, HALF)
        self.forward.append(op)
        self.behind(_gemm_backward(op, HALF))
        self.saved += tokens * n_in * HALF

    def kernels(self, compiled: bool) -> BlockOps:
        """The block's kernels: eager's, or under torch.compile (`compiled`) each run of memory-bound kernels
        fused (:func:`_fused`), the backward's from the compiled backward kernels (:meth:`memory`)."""
        backward = tuple(k for group in reversed(self.compiled_reversed if compiled else self.backward_reversed)
                         for k in group)
        forward = tuple(self.forward)
        if compiled:
            forward, backward = _fused(forward), _fused(backward)
        return BlockOps(forward=forward, backward=backward)


def _fused(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """torch.compile (Inductor): each run of memory-bound kernels between GEMMs and attention becomes one
    kernel moving the bytes of the largest of them (a fused chain reads its inputs and writes its outputs
    once; its intermediates stay in registers)."""
    out: list[Op] = []
    for op in ops:
        if op.kind in BANDWIDTH_KINDS and out and out[-1].kind in BANDWIDTH_KINDS:
            kind = "reduction" if "reduction" in (op.kind, out[-1].kind) else "memory"
            out[-1] = out[-1]._replace(name=out[-1].name.split("+")[0] + "+fused", kind=kind,
                                       bytes=max(out[-1].bytes, op.bytes))
        else:
            out.append(op)
    return tuple(out)


def _rmsnorm(k: _Kernels, name: str, n: float, rows: float) -> None:
    """Hugging Face LlamaRMSNorm on an FP32 input of n elements (rows tokens): pow, mean, + eps, rsqrt,
    x * rsqrt, weight * x, each its own kernel; backward as autograd runs it (pow_backward: 3 kernels,
    the two gradients of x summed, the weight gradient reduced over the tokens). Profiled one by one on the H200
    (experiments/calibration/measurements/h200-pieces.csv): the row mean streams (PyTorch's reduce_kernel over
    contiguous rows: 3.5-4.9 TB/s), the two products broadcast a row's or the weight's value over the other
    operand on the unvectorised path (2.4-2.6 TB/s): mixed kernels."""
    r = RESIDUAL
    k.memory(f"{name}.pow", 2 * n * r, (2 * n * r, 2 * n * r, 3 * n * r), saved=n * r)
    k.memory(f"{name}.mean", n * r + rows * r, (n * r + rows * r,))
    k.memory(f"{name}.add_eps", 2 * rows * r)
    k.memory(f"{name}.rsqrt", 2 * rows * r, (2 * rows * r, 2 * rows * r, 3 * rows * r))
    # backward: g·r, g·x, its sum over the row; then the two gradients of x summed (streaming: not measured apart)
    streaming = (Typed(2 * n * r, "memory"), Typed(3 * n * r, "memory"))
    k.memory(f"{name}.mul", 2 * n * r, (*streaming, Reduce(n * r), Typed(3 * n * r, "memory")), kind="mixed")
    k.memory(f"{name}.weight", 2 * n * r, (*streaming, Reduce(n * r)), saved=n * r, kind="mixed")


def _layernorm(k: _Kernels, name: str, n: float, rows: float) -> None:
    """torch.nn.functional.layer_norm (autocast runs it in FP32): one kernel forward; backward one for the
    input gradient, one for the weight and bias gradients."""
    r = RESIDUAL
    k.memory(name, 2 * n * r, (Reduce(3 * n * r), Reduce(2 * n * r)), saved=n * r + 2 * rows * r, kind="reduction")


def _dropout(k: _Kernels, name: str, n: float, e: float) -> None:
    """Dropout in training: writes the output and a 1-byte mask; backward multiplies by the mask."""
    k.memory(name, n * (2 * e + 1), (n * (2 * e + 1),), saved=n)


def _rope(k: _Kernels, name: str, n: float) -> None:
    """apply_rotary_pos_emb on one BF16 tensor of n elements, as LlamaForCausalLM runs it under autocast over its
    FP32 residual stream: cos and sin come in FP32 (the hidden states' dtype), so q·cos and rotate_half(q)·sin
    broadcast a BF16 tensor against FP32 tables over the heads (strided kernels writing FP32), rotate_half's neg
    and cat copy halves of the last dimension, the sum is FP32, and sdpa's autocast casts it back to BF16.

    Backward, 12 kernels (transformers' modeling_llama.py ``q_embed = (q * cos) + (rotate_half(q) * sin)``;
    pytorch's tools/autograd/derivatives.yaml and the engine's validate_outputs): sdpa's cast back
    (ToCopyBackward0, BF16 to FP32); the sum passes the gradient through (AddBackward0: no kernel); the sin
    product's gradient g·sin (``mul_tensor_backward``: FP32, broadcast) cast to rotate_half's BF16 by the engine
    (the input's dtype); cat's backward is two views; neg's is a neg of one half; each slice of rotate_half
    (``x[..., :d/2]``, ``x[..., d/2:]``) backward is ``slice_backward``: a zeroed tensor of the input's shape and a
    copy of the half into it; the two summed into the input's gradient; then the cos product's g·cos, its cast to
    BF16 and its sum with them (autograd adds the gradients of a tensor used three times)."""
    e, r = HALF, RESIDUAL
    k.memory(f"{name}.cos", n * (e + r), (n * (r + r), Typed(n * (r + e), "memory"), Typed(3 * n * e, "memory")),
             kind="strided")
    k.memory(f"{name}.slices", 0.0, (Typed(n * e, "memory"), n * e, Typed(n * e, "memory"), n * e,
                                     Typed(3 * n * e, "memory")), kind="strided")
    k.memory(f"{name}.neg", n * e, (n * e,), kind="strided")
    k.memory(f"{name}.cat", 2 * n * e, (), kind="cat")
    k.memory(f"{name}.sin", n * (e + r), (n * (r + r), Typed(n * (r + e), "memory")), kind="strided")
    k.memory(f"{name}.add", 3 * n * r, ())
    k.memory(f"{name}.cast", n * (r + e), (Typed(n * (e + r), UPCAST),))


def _gelu_tanh(k: _Kernels, name: str, n: float) -> None:
    """GPT-2's NewGELUActivation in eager mode, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), on a BF16 x under
    autocast: torch.pow is on autocast's FP32 list, so x is cast up, x³ and everything after it is FP32 (two
    sums and the last product mix BF16 and FP32 operands), and the output is FP32 (the next projection casts it
    back). Autograd keeps x, x³'s input, tanh's output and both factors of the last product.

    Backward, 14 kernels (pytorch's tools/autograd/derivatives.yaml): the last product's two gradients (g·(0.5x),
    mixed, and g·(1 + t), FP32), the second cast to 0.5x's BF16 by the engine; 1 + t passes through; tanh_backward;
    the scale; the sum x + c passes c's gradient through and casts x's to BF16; the scale; pow_backward
    (``grad * (3 * x.pow(2))``: three kernels); the upcast's ToCopyBackward0 (to BF16); 0.5x's scale in BF16; and
    x's three gradients (through 0.5x, the upcast and the sum) summed: two BF16 adds.

    Under torch.compile AOTAutograd's partitioner keeps only x (the GEMM's output) of the whole chain
    (:func:`compiled_saved`), so the compiled backward is one kernel: it reads the incoming BF16 gradient (the
    down projection's input gradient, its cast back to FP32 fused in) and x, recomputes x³, tanh and 1 + t in
    registers, and writes x's BF16 gradient: 3 x 2 B per element."""
    e, r = HALF, RESIDUAL
    k.memory(f"{name}.grad_sum", 0.0, (3 * n * e, 3 * n * e), kind="memory", compiled_backward=())
    k.memory(f"{name}.half_x", 2 * n * e, (2 * n * e,), saved=n * e, compiled_backward=())
    k.memory(f"{name}.cast_up", n * (e + r), (Typed(n * (r + e), "memory"),), saved=n * r, kind=UPCAST,
             compiled_backward=())
    k.memory(f"{name}.pow", 2 * n * r, (2 * n * r, 2 * n * r, 3 * n * r), compiled_backward=())
    k.memory(f"{name}.scale", 2 * n * r, (2 * n * r,), compiled_backward=())
    k.memory(f"{name}.add", n * (e + r + r), (Typed(n * (r + e), "memory"),), kind="mixed", compiled_backward=())
    k.memory(f"{name}.scale2", 2 * n * r, (2 * n * r,), compiled_backward=())
    k.memory(f"{name}.tanh", 2 * n * r, (3 * n * r,), saved=n * r, compiled_backward=())
    k.memory(f"{name}.one_plus", 2 * n * r, saved=n * r, compiled_backward=())
    k.memory(f"{name}.mul", n * (e + r + r), (n * (r + e + r), Typed(n * (r + r + r), "memory"),
                                              Typed(n * (r + e), "memory")), kind="mixed",
             compiled_backward=(Typed(3 * n * e, "memory"),))


def _flash(k: _Kernels, name: str, b: int, s: int, heads: int, kv_heads: int, d: int) -> None:
    """scaled_dot_product_attention, causal, on its FlashAttention backend: the kernel skips the masked half
    of the scores (2·b·s²·heads·d FLOP forward, 2.5x that backward: it recomputes Q·Kᵀ). Grouped K and V go
    in as they are (transformers 5 calls sdpa with enable_gqa on PyTorch >= 2.5 when there is no mask). Reads
    Q, K, V and writes the output; keeps Q, K, V, the output and the FP32 log-sum-exp."""
    e = HALF
    q, kv = b * s * heads * d, b * s * kv_heads * d
    flops = 2.0 * b * s * s * heads * d
    io = (2 * q + 2 * kv) * e
    k.forward.append(Op(name, "attention", flops, io, s, b * heads, d))
    k.behind((Op(f"{name}.bwd", "attention", 2.5 * flops, 2 * io, s, b * heads, d),))
    k.saved += io + b * heads * s * 4


def eager_layer_ops(model, micro_batch: int, compiled: bool = False, use_cache: bool = False
                    ) -> tuple[BlockOps, BlockOps, float]:
    """The attention and MLP blocks of one decoder as a Hugging Face model runs them in PyTorch eager mode under
    torch.autocast(bfloat16) over FP32 weights (LlamaDecoderLayer for norm rmsnorm, GPT2Block for layernorm), or
    under torch.compile (`compiled`); and the bytes autograd keeps per micro-batch for the layer's backward.
    `use_cache`: the model's config asks for a key/value cache (transformers' default) and training does not
    checkpoint (gradient checkpointing turns the cache off): each layer's DynamicCache concatenates its keys and
    values into new tensors. Checked against torch.profiler on an H100 and an H200
    (experiments/calibration/steps): sdpa runs on cuDNN, whose output is already laid out for the output
    projection (no copy to merge the heads).

    Llama: the FP32 residual stream (the embedding is FP32), RMSNorm in FP32 kernels, q/k/v projections each
    casting their FP32 input, rotary embeddings on q and k, sdpa (flash, causal), the output transposed into a
    contiguous copy, o_proj, the residual add (FP32 + BF16), then RMSNorm, gate and up projections, SiLU,
    the product, down_proj, the residual add. GPT-2: LayerNorm, one QKV projection with bias, sdpa with
    dropout, c_proj, dropout, add; LayerNorm, c_fc, GELU (tanh form), c_proj, dropout, add."""
    b, s, h = micro_batch, model.sequence, model.hidden
    tokens, d = b * s, h // model.heads
    n, kv, f = tokens * h, model.kv_hidden, model.ffn
    bias, llama = model.bias, model.norm == "rmsnorm"
    attn, mlp = _Kernels(), _Kernels()
    # attention block
    norm = _rmsnorm if llama else _layernorm
    norm(attn, "norm_attn", n, tokens)
    separate = model.mlp == "swiglu" or llama
    _gradient_sum(attn, "norm_attn", n, 3 if separate else 1)
    if separate:
        for which, width in (("q", h), ("k", kv), ("v", kv)):
            attn.linear(f"{which}_proj", tokens, h, width, cast_input=True, bias=bias)
    else:
        attn.linear("qkv", tokens, h, h + 2 * kv, cast_input=True, bias=bias)
        # .split(dim=2): SplitBackward0 concatenates the three gradients (at::cat)
        attn.memory("qkv_split", 0.0, (Typed(2 * tokens * (h + 2 * kv) * HALF, "cat"),))
    rope = model.positions == "rope"
    if rope:
        # q and k, views [b, s, heads, d] -> [b, heads, s, d] of the projections, come back from rotary's sums as
        # contiguous [b, heads, s, d] gradients: ViewBackward0's reshape copies each (sdpa's own dQ, dK, dV keep
        # their inputs' layout: empty_like in _cudnn_attention_backward, so v needs none)
        for which, width in (("q", h), ("k", kv)):
            attn.memory(f"{which}_view", 0.0, (Typed(2 * tokens * width * HALF, "strided"),))
        _rope(attn, "rope_q", tokens * h)
        _rope(attn, "rope_k", tokens * kv)
    if use_cache:
        for which in ("keys", "values"):  # the concatenation's gradient is a narrow of a contiguous tensor: the view
            # back to the projection's layout copies it (rotary's already did for the keys)
            copy = () if rope and which == "keys" else (Typed(2 * tokens * kv * HALF, "strided"),)
            attn.memory(f"cache_{which}", 2 * tokens * kv * HALF, copy, kind="cat")
    _flash(attn, f"flash_attention_{DROPOUT}" if model.dropout else "flash_attention", b, s, model.heads, kv // d, d)
    attn.linear("o_proj", tokens, h, h, cast_input=False, bias=bias)
    if model.dropout:
        _dropout(attn, "dropout_attn", n, HALF)
    attn.memory("residual_attn", n * (RESIDUAL + HALF + RESIDUAL), (n * (RESIDUAL + HALF), 3 * n * RESIDUAL),
                kind="mixed")
    # MLP block
    norm(mlp, "norm_mlp", n, tokens)
    _gradient_sum(mlp, "norm_mlp", n, 2 if model.mlp == "swiglu" else 1)
    if model.mlp == "swiglu":
        mlp.linear("gate_proj", tokens, h, f, cast_input=True, bias=bias)
        mlp.linear("up_proj", tokens, h, f, cast_input=True, bias=bias)
        # compiled: the partitioner keeps gate and up (GEMM outputs) and not silu(gate) (:func:`compiled_saved`):
        # one backward kernel reads the product's gradient, gate and up, recomputes silu(gate) in registers and
        # writes the gradients of gate and up: 5 x 2 B per element
        mlp.memory("silu", 2 * tokens * f * HALF, (3 * tokens * f * HALF,), saved=tokens * f * HALF,
                   compiled_backward=())
        mlp.memory("gate_mul", 3 * tokens * f * HALF, (3 * tokens * f * HALF,) * 2, saved=2 * tokens * f * HALF,
                   compiled_backward=(5 * tokens * f * HALF,))
    else:
        mlp.linear("c_fc", tokens, h, f, cast_input=True, bias=bias)
        if model.mlp == "gelu":
            _gelu_tanh(mlp, "gelu", tokens * f)
        else:  # ReLU (OPT) in BF16 (not on autocast's FP32 list); its backward (threshold_backward) reads its
            # output, the tensor down_proj keeps as its GEMM input already: nothing more saved
            mlp.memory("relu", 2 * tokens * f * HALF, (3 * tokens * f * HALF,))
    mlp.linear("down_proj", tokens, f, h, cast_input=model.mlp == "gelu", bias=bias)  # GELU's output is FP32
    if model.dropout:
        _dropout(mlp, "dropout_mlp", n, HALF)
    mlp.memory("residual_mlp", n * (RESIDUAL + HALF + RESIDUAL), (n * (RESIDUAL + HALF), 3 * n * RESIDUAL),
               kind="mixed")
    saved = attn.saved + mlp.saved  # the layer's input among them (the first norm keeps it)
    if compiled:
        saved = sum(compiled_saved(model, micro_batch).values())
    return attn.kernels(compiled), mlp.kernels(compiled), saved


def compiled_saved(model, micro_batch: int) -> dict[str, float]:
    """The bytes one decoder layer keeps for backward under torch.compile, per micro-batch, by tensor: what
    AOTAutograd's partitioner saves of the joint graph of a Hugging Face layer under autocast(bfloat16)
    (torch/_functorch/partitioners.py, min_cut_rematerialization_partition: solve_min_cut over the default
    op lists of get_default_op_list). Its rules, as they fall on a transformer layer:

    - GEMMs, attention and random ops are never recomputed (should_ban_recomputation: not in the recomputable
      allowlist, or compute-intensive, or random), nor a tensor the backward must materialize for a kernel that
      cannot fuse it (is_materialized_backwards: the BF16 input of every GEMM, which its weight gradient reads,
      and the inputs of the attention kernel), nor a reduction whose output is 4x smaller than its input (a
      norm's statistics), nor a pointwise op used again past an unfusible op (ban_if_used_far_apart: each
      residual add, which the next norm reads and the next residual add after the GEMMs); the rest, pointwise,
      is recomputed in the backward where the min cut finds it cheaper.
    - Common-subexpression elimination first (fx_graph_cse): autocast's cast of a norm's output, once per
      projection in eager mode, is one tensor shared by q, k and v (gate and up).

    So a layer keeps its FP32 input and the FP32 residual after attention (4 B per hidden element each), each
    norm's statistics (LayerNorm's mean and 1/σ, RMSNorm's mean square: 4 B per token each), each norm's BF16
    output cast (2 B, once), the attention kernel's inputs (q, k, v in BF16: GPT-2's fused projection output,
    Llama's rotated q and k cast for sdpa and v), its output and FP32 log-sum-exp, each residual dropout's
    1-byte mask (the mask is cheaper than the random tensor it comes from, which is banned), and of the MLP:
    GPT-2's c_fc output and the BF16 cast of GELU's output for c_proj (4 B per intermediate element; eager
    keeps 16: transformers' NewGELUActivation intermediates in FP32), Llama's gate, up and their product (6 B;
    eager 8: silu(gate) too). Rotary embedding keeps nothing of its own (its backward needs only cos and sin,
    computed once per step); the attention output that the output projection reads is the kernel's own
    output, counted once. Checked against PyTorch 2.13's partitioner on written-out GPT-2 and Llama layers:
    equal per layer to a norm statistic (tests/workload/test_eager_kernels.py, where PyTorch is installed).

    >>> from hcsim.workload.model import ModelShape
    >>> gpt2 = ModelShape(name="g", decoders=1, hidden=8, heads=2, ffn=32, sequence=4, vocabulary=0,
    ...                   dropout=True, bias=True, positions="learned")
    >>> sum(compiled_saved(gpt2, 1).values()) == 32 * (4 + 4 + 2 + 2 + 6 + 2 + 1 + 1) + 4 * 4 * 4 + 128 * 4 + 2 * 4 * 4
    True
    """
    b, s, h = micro_batch, model.sequence, model.hidden
    tokens, kv, f = b * s, model.kv_hidden, model.ffn
    n = tokens * h
    statistics = 1 if model.norm == "rmsnorm" else 2  # LlamaRMSNorm: the mean of squares; layer_norm: mean, rstd
    kept = {
        "residuals": 2 * n * RESIDUAL,  # the layer's input and the residual after attention, FP32
        "norm_statistics": 2 * statistics * tokens * 4.0,
        "norm_casts": 2 * n * HALF,  # each norm's BF16 output, the projections' shared GEMM input
        "attention_inputs": tokens * (h + 2 * kv) * HALF,  # q, k, v
        "attention_output": n * HALF,  # also the output projection's GEMM input
        "attention_logsumexp": b * model.heads * s * 4.0,
    }
    if model.dropout:
        kept["dropout_masks"] = 2 * n * 1.0  # after the output projection and after the MLP
    if model.mlp == "swiglu":
        kept["mlp"] = 3 * tokens * f * HALF  # gate, up (GEMM outputs), their product (down_proj's GEMM input)
    elif model.mlp == "gelu":
        kept["mlp"] = 2 * tokens * f * HALF  # c_fc's output (GELU's input), GELU's output cast for c_proj
    else:
        kept["mlp"] = tokens * f * HALF  # ReLU's output: its backward's input and c_proj's GEMM input
    return kept


def _gradient_sum(k: _Kernels, name: str, n: float, consumers: int) -> None:
    """A norm's FP32 output cast to BF16 by each of its `consumers` projections (autocast caches no cast of a
    non-leaf tensor): in backward autograd's engine sums their FP32 input gradients as they arrive
    (InputBuffer::accumulate), one add of n elements each after the first."""
    if consumers > 1:
        k.memory(f"{name}.grad_sum", 0.0, (3 * n * RESIDUAL,) * (consumers - 1))


def checkpoint_recompute(forward: tuple[Op, ...]) -> tuple[Op, ...]:
    """The kernels torch.utils.checkpoint runs again of a layer's last block (non-reentrant, as transformers'
    gradient_checkpointing_enable() calls it, with early stop, the default): recomputation stops once every
    tensor the backward needs has been saved again, which the last GEMM does when it is called, before its
    kernel runs. So the last GEMM and what follows it (dropout, the residual add) do not run again. Seen in
    torch.profiler: 6 of Llama's 7 GEMMs per layer recomputed (experiments/calibration/steps)."""
    last = max((i for i, op in enumerate(forward) if op.kind in GEMM_KINDS), default=None)
    return forward if last is None else forward[:last]


def eager_embedding_ops(model, micro_batch: int, compiled: bool = False) -> BlockOps:
    """The token embedding (and GPT's learned positions, their sum and dropout) on the FP32 table, and its
    backward: the dense embedding gradient (a zeroed vocabulary x hidden FP32 buffer, then an index-add)."""
    tokens, h = micro_batch * model.sequence, model.hidden
    k = _Kernels()
    n = tokens * h
    k.memory("embedding", tokens * 8 + 2 * n * RESIDUAL,
             (model.vocabulary * h * RESIDUAL, 3 * n * RESIDUAL + tokens * 8))
    if model.positions == "learned":
        k.memory("position_embedding", 2 * n * RESIDUAL, (model.sequence * h * RESIDUAL, 3 * n * RESIDUAL))
        k.memory("add_positions", 3 * n * RESIDUAL, ())
    if model.dropout:
        _dropout(k, "dropout_embedding", n, RESIDUAL)
    if model.tied_embeddings:  # the output layer's gradient of the same table, added into it
        k.memory("tied_gradient_add", 0.0, (3 * model.vocabulary * h * MASTER,))
    return k.kernels(compiled)


def eager_head_ops(model, micro_batch: int, compiled: bool = False) -> tuple[BlockOps, float]:
    """The final norm, the logits GEMM (BF16 out), the logits upcast to FP32 and the cross-entropy over the whole
    vocabulary (log_softmax: three passes over the row; nll_loss) as ``F.cross_entropy(logits.float(), labels)``
    runs them, with their backward; and the bytes the head keeps at its peak: the BF16 logits (returned to the
    caller), the log-probabilities (saved) and, in backward, two FP32 gradients of the logits."""
    tokens, h, v = micro_batch * model.sequence, model.hidden, model.vocabulary
    k = _Kernels()
    norm = _rmsnorm if model.norm == "rmsnorm" else _layernorm
    norm(k, "norm_final", tokens * h, tokens)
    k.linear("logits", tokens, h, v, cast_input=True)
    _cross_entropy(k, tokens, v)
    peak = tokens * v * ((HALF + HALF) if compiled else (HALF + 4 + 4 + 4))
    return k.kernels(compiled), peak


def _cross_entropy(k: _Kernels, tokens: int, vocabulary: int) -> None:
    """F.cross_entropy(logits.float(), labels): the upcast, log_softmax (a max and a sum of exponentials over
    each row, then the write: three reads and a write), nll_loss; backward: a zeroed FP32 gradient with the
    labels scattered in, log_softmax's backward (a sum over each row, then the write), the cast back.

    Under torch.compile the partitioner keeps the BF16 logits (a GEMM's output, returned to the caller besides)
    and the rows' reductions (max, sum of exponentials: 4x smaller than their inputs), not the FP32
    log-probabilities (:func:`compiled_saved`); Inductor turns the labels scattered into zeros into a pointwise
    select (torch/_inductor/fx_passes/joint_graph.py, scatter_upon_const_tensor). So the compiled backward is
    one kernel reading the BF16 logits, recomputing the log-probabilities in registers and writing the BF16
    gradient of the logits: 2 + 2 B per logit (the head's peak then: the logits and that gradient)."""
    logits = tokens * vocabulary
    k.memory("logits_float", logits * (HALF + 4), (Typed(logits * (4 + HALF), "memory"),), kind=UPCAST,
             compiled_backward=(Typed(logits * (HALF + HALF), "memory"),))
    k.memory("log_softmax", logits * 4 * 4, (logits * 4 * 4,), compiled_backward=())
    k.memory("nll_loss", tokens * 12, (logits * 4,), compiled_backward=())


def optimizer_step_ops(parameters: float, precision: str, kernels: str = "megatron", per_parameter: float = 0.0,
                       fp8_recipe: str = "delayed", fp8_weights: float | None = None,
                       clip_grad_norm: bool = True, main_gradient: float = 4.0, buffer: float | None = None,
                       scaled: bool = False) -> tuple[Op, ...]:
    """The optimizer step of `kernels`: Megatron-LM's (OPTIMIZER_TRAFFIC) or, for a PyTorch inventory, what a
    Hugging Face training loop runs after the backward pass (:func:`eager_optimizer_ops`: `clip_grad_norm`, then
    fused AdamW); Megatron-LM's over `main_gradient`-byte main gradients in a buffer of `buffer` elements, `scaled`
    before its reduction (:func:`optimizer_ops`); `per_parameter` bytes instead when the workload gives them
    (``training.optimizer_bytes_per_parameter`` > 0). In FP8 also the weights' quantization, once a step (the
    FP8 weight and its transpose Transformer Engine caches over the step's micro-batches: :func:`fp8_quantize`
    for `fp8_recipe`, of `fp8_weights` elements, the FP8 GEMMs' weights the rank holds, or `parameters` when
    None), and under delayed scaling the update of every FP8 tensor's scale from its amax history
    (one small multi-tensor kernel, ``fp8_scale_update``: its launch and overhead, the histories' bytes
    negligible)."""
    if per_parameter > 0:
        return (_memory("optimizer", parameters * per_parameter),)
    if INVENTORIES[kernels].fused and precision == "fp8":
        weights = fp8_quantize("fp8_weights", parameters if fp8_weights is None else fp8_weights, fp8_recipe)
        update = [_memory("fp8_scale_update", 0.0)] if fp8_recipe == "delayed" else []
        return optimizer_ops(parameters, precision, main_gradient, buffer, scaled) + tuple(weights + update)
    if INVENTORIES[kernels].fused:
        return optimizer_ops(parameters, precision, main_gradient, buffer, scaled)
    return eager_optimizer_ops(parameters, clip_grad_norm)


def multi_tensor_launches(parameters: float) -> int:
    """Kernels one multi_tensor_apply call launches over `parameters` FP32 elements: a launch each 320 blocks of
    65,536 elements (the tensors' own chunk rounding and the tensor-count limit, 36-110 a launch, aside).

    >>> multi_tensor_launches(1.24e9), multi_tensor_launches(1.24e8), multi_tensor_launches(10)
    (60, 6, 1)
    """
    return max(1, math.ceil(parameters / (MULTI_TENSOR_CHUNK * MULTI_TENSOR_BLOCKS)))


def eager_optimizer_ops(parameters: float, clip_grad_norm: bool = True) -> tuple[Op, ...]:
    """What a PyTorch training loop runs between the backward pass and the next forward over `parameters` FP32
    parameters, as Hugging Face's Trainer does (``max_grad_norm`` 1.0 by default), kernel by kernel:

    - ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` when `clip_grad_norm` (torch/nn/utils/clip_grad.py):
      ``torch._foreach_norm(grads, 2)`` (aten/src/ATen/native/cuda/ForeachReduceOp.cu: two zeroed buffers, the
      multi-tensor L2 norm reading every gradient, 4 B per parameter, and ``lpnorm_cleanup``), the total norm
      ``vector_norm(stack(norms))`` (2 kernels), ``clip_coef = max_norm / (total_norm + 1e-6)`` (add; a Python
      scalar over a tensor is ``reciprocal() * max_norm``: 2), ``clamp(max=1.0)``, and
      ``torch._foreach_mul_(grads, clip_coef_clamped)`` reading and writing every gradient (8 B per parameter):
      12 B per parameter (:data:`CLIP_GRAD_NORM_TRAFFIC`), no host synchronisation;
    - ``torch.optim.AdamW(fused=True).step()`` (torch/optim/adam.py ``_fused_adam``): ``torch._foreach_add_(
      state_steps, 1)`` on the one-element step tensors (a tiny launch), then ``torch._fused_adamw_``
      (aten/src/ATen/native/cuda/fused_adamw_impl.cu, multi_tensor_apply over param, grad, exp_avg, exp_avg_sq)
      reading p, g, m, v and writing p, m, v: 28 B per parameter (:data:`ADAMW_FUSED_TRAFFIC`);
    - ``optimizer.zero_grad(set_to_none=True)``: drops the gradients, no kernel.

    The multi-tensor kernels (:func:`multi_tensor_launches` each) are ``multi_tensor`` ops, which the kernel
    model runs at the rate measured for fused AdamW; the others move no bytes worth counting (their launches).

    >>> [op.name for op in eager_optimizer_ops(1e6)]  # doctest: +NORMALIZE_WHITESPACE
    ['clip_grad_norm.zeros', 'clip_grad_norm.zeros', 'clip_grad_norm.foreach_norm', 'clip_grad_norm.cleanup',
     'clip_grad_norm.stack', 'clip_grad_norm.vector_norm', 'clip_grad_norm.add', 'clip_grad_norm.reciprocal',
     'clip_grad_norm.mul', 'clip_grad_norm.clamp', 'clip_grad_norm.foreach_mul', 'adamw.step_count', 'adamw_fused']
    >>> sum(op.bytes for op in eager_optimizer_ops(1e6)), sum(op.bytes for op in eager_optimizer_ops(1e6, False))
    (40000000.0, 28000000.0)
    """
    launches = multi_tensor_launches(parameters)

    def spread(name: str, per_parameter: float) -> list[Op]:
        return [_memory(name, parameters * per_parameter / launches, "multi_tensor")] * launches

    ops: list[Op] = []
    if clip_grad_norm:
        ops += [_memory("clip_grad_norm.zeros", 0.0)] * 2
        ops += spread("clip_grad_norm.foreach_norm", 4.0)
        ops += [_memory(f"clip_grad_norm.{step}", 0.0) for step in ("cleanup", "stack", "vector_norm", "add",
                                                                     "reciprocal", "mul", "clamp")]
        ops += spread("clip_grad_norm.foreach_mul", 8.0)
    ops.append(_memory("adamw.step_count", 0.0))
    ops += spread("adamw_fused", ADAMW_FUSED_TRAFFIC)
    return tuple(ops)
