"""The kernels a framework launches (hcsim.workload.ops: training.kernels) and the memory that follows them."""

import pytest

from hcsim.workload.hybrid import Parallelism, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.memory import CUBLAS_WORKSPACE, CUDA_CONTEXT, eager_memory, stage_memory
from hcsim.workload.model import ModelShape
from hcsim.workload.ops import (UPCAST, eager_embedding_ops, eager_head_ops, eager_layer_ops, optimizer_step_ops,
                                ops_flops)
from hcsim.workload.spec import WorkloadSpec, load_workload_spec
from hcsim.workload.transformer import model_parameters
from hcsim.config import REPO_ROOT
from hcsim.errors import ConfigError

LLAMA = ModelShape(name="llama", decoders=2, hidden=512, heads=8, kv_heads=2, ffn=1408, mlp="swiglu", norm="rmsnorm",
                   dropout=False, sequence=256, vocabulary=1000, positions="rope")
GPT2 = ModelShape(name="gpt2", decoders=2, hidden=512, heads=8, ffn=2048, mlp="gelu", norm="layernorm", dropout=True,
                  sequence=256, vocabulary=1000, positions="learned", bias=True, tied_embeddings=True)


def kinds(ops, kind):
    return [op for op in ops if op.kind == kind]


@pytest.mark.parametrize("shape", [LLAMA, GPT2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("compiled", [False, True])
def test_a_layers_gemms_and_attention_do_the_models_flops(shape, compiled):
    """Forward GEMMs 2·T·(weights of the linear layers), the causal flash kernel 2·b·s²·h (half the square);
    backward twice the GEMMs and 2.5x the attention (it recomputes Q·Kᵀ)."""
    b = 2
    attn, mlp, _ = eager_layer_ops(shape, b, compiled)
    h, kv, f, t = shape.hidden, shape.kv_hidden, shape.ffn, b * shape.sequence
    linear = h * (h + 2 * kv) + h * h + (3 if shape.mlp == "swiglu" else 2) * h * f
    forward = attn.forward + mlp.forward
    backward = attn.backward + mlp.backward
    assert ops_flops(kinds(forward, "gemm")) == 2 * t * linear
    assert ops_flops(kinds(backward, "gemm")) == 4 * t * linear
    assert ops_flops(kinds(forward, "attention")) == 2 * b * shape.sequence ** 2 * h
    assert ops_flops(kinds(backward, "attention")) == 2.5 * 2 * b * shape.sequence ** 2 * h


def test_the_eager_llama_layer_launches_what_the_modeling_code_runs():
    """LlamaDecoderLayer under autocast: RMSNorm 6 kernels on the FP32 residual (pow, mean, + eps, rsqrt, x·r,
    weight·x), q/k/v each casting input and weight then a GEMM (9), rotary on q and k (6 each: two FP32 products,
    neg, cat, the sum, sdpa's cast back to BF16), sdpa (grouped K, V as they are; cuDNN's output needs no copy),
    o_proj (weight cast, GEMM), the residual add; RMSNorm, gate and up (3 each), SiLU, the product, down_proj
    (2), the residual add. Counted against torch.profiler (experiments/calibration/steps)."""
    attn, mlp, _ = eager_layer_ops(LLAMA, 1)
    assert len(attn.forward) == 6 + 9 + 12 + 1 + 2 + 1
    assert len(mlp.forward) == 6 + 6 + 2 + 2 + 1
    gpt_attn, gpt_mlp, _ = eager_layer_ops(GPT2, 1)  # LayerNorm 1, c_attn with bias 4, sdpa, c_proj 3, dropout, add
    assert len(gpt_attn.forward) == 1 + 4 + 1 + 3 + 1 + 1
    assert len(gpt_mlp.forward) == 1 + 4 + 9 + 4 + 1 + 1  # ... c_fc 4, GELU-tanh 9, c_proj 4, dropout, add
    cached = eager_layer_ops(GPT2, 1, use_cache=True)[0]  # DynamicCache concatenates the keys and the values
    assert len(cached.forward) == len(gpt_attn.forward) + 2
    assert [op.kind for op in cached.forward if op.name.startswith("cache_")] == ["cat", "cat"]  # torch.cat


def test_autocast_runs_gpt2s_gelu_in_fp32_and_its_attention_with_dropout():
    """torch.pow is on autocast's FP32 list: GELU-tanh's kernels after it move FP32, its output is FP32 and
    c_proj casts it back; GPT-2 trains with attention dropout, which the attention kernel applies."""
    attn, mlp, _ = eager_layer_ops(GPT2, 1)
    n = GPT2.sequence * GPT2.ffn
    tanh = next(op for op in mlp.forward if op.name == "gelu.tanh")
    assert tanh.bytes == 2 * n * 4
    assert any(op.name == "down_proj.cast_input" for op in mlp.forward)
    assert [op.name for op in attn.forward if op.kind == "attention"] == ["flash_attention_dropout"]
    assert not any(op.name.startswith("down_proj.cast_input") for op in eager_layer_ops(LLAMA, 1)[1].forward)


def test_an_unpadded_vocabulary_is_an_unaligned_gemm_where_megatron_pads_it():
    """Hugging Face's GPT-2 multiplies by the 50257-wide embedding as it is (cuBLAS falls back to unaligned
    kernels, measured several times slower); Megatron-LM pads the vocabulary, so its head GEMM stays aligned."""
    from dataclasses import replace

    from hcsim.workload.ops import megatron_ops
    from hcsim.workload.transformer import lm_head

    odd = replace(GPT2, vocabulary=50257)
    head = eager_head_ops(odd, 1)[0]
    assert {op.kind for op in head.forward + head.backward if op.name.startswith("logits")} >= {"gemm_unaligned"}
    megatron = megatron_ops(lm_head(odd, micro_batch=1, sequence=odd.sequence, tp=1).ops)
    assert "gemm_unaligned" not in {op.kind for op in megatron.forward + megatron.backward}


def test_torch_compile_fuses_the_memory_bound_kernels_between_gemms():
    eager, compiled = eager_layer_ops(LLAMA, 2)[0], eager_layer_ops(LLAMA, 2, compiled=True)[0]
    assert kinds(compiled.forward, "gemm") == kinds(eager.forward, "gemm")
    assert len(compiled.forward) < len(eager.forward)
    assert sum(op.bytes for op in compiled.forward) < sum(op.bytes for op in eager.forward)
    for before, after in zip(compiled.forward, compiled.forward[1:]):  # no two memory-bound kernels in a row
        assert not (before.kind in ("memory", "reduction") and after.kind in ("memory", "reduction"))


def test_the_head_upcasts_the_logits_and_the_optimizer_is_fused_adamw():
    b, t, v = 2, 2 * LLAMA.sequence, LLAMA.vocabulary
    head, peak = eager_head_ops(LLAMA, b)
    names = [op.name for op in head.forward]
    assert names[-3:] == ["logits_float", "log_softmax", "nll_loss"]
    upcast = next(op for op in head.forward if op.name == "logits_float")
    assert upcast.bytes == t * v * (2 + 4)  # reads BF16 logits, writes FP32
    assert peak == t * v * (2 + 4 + 4 + 4)
    adamw = optimizer_step_ops(1e6, "bf16", "pytorch-eager", clip_grad_norm=False)
    assert sum(op.bytes for op in adamw if op.name == "adamw_fused") == 28e6  # read p, g, m, v; write p, m, v
    assert sum(op.bytes for op in optimizer_step_ops(1e6, "bf16", "megatron")) == 42e6  # no loss scaler in BF16
    assert optimizer_step_ops(1e6, "bf16", "megatron", per_parameter=20)[0].bytes == 20e6  # the workload's own


def test_eager_memory_is_fp32_weights_adam_and_the_larger_of_the_backward_peaks():
    """12 B per parameter always (FP32 weights, Adam); then either the BF16 copies, the saved activations and the
    head's logits (the start of the backward pass) or the FP32 gradients (its end), whichever weighs more."""
    b = 4
    memory = eager_memory(LLAMA, layers=LLAMA.decoders, micro_batch=b)
    p = model_parameters(LLAMA)
    saved = eager_layer_ops(LLAMA, b)[2]
    head = eager_head_ops(LLAMA, b)[1]
    expected = 12 * p + max(2 * p + LLAMA.decoders * saved + head, 4 * p) + CUBLAS_WORKSPACE + CUDA_CONTEXT
    assert memory.total == pytest.approx(expected, rel=1e-12)
    checkpointed = eager_memory(LLAMA, layers=LLAMA.decoders, micro_batch=b, recompute="full")
    inputs = LLAMA.decoders * b * LLAMA.sequence * LLAMA.hidden * 4
    assert checkpointed.total == pytest.approx(12 * p + max(2 * p + inputs + max(head, saved), 4 * p)
                                               + CUBLAS_WORKSPACE + CUDA_CONTEXT, rel=1e-12)
    assert checkpointed.total < memory.total
    via_stage = stage_memory(LLAMA, layers=LLAMA.decoders, first=True, last=True, in_flight=1, micro_batch=b,
                             kernels="pytorch-eager")
    assert via_stage.total == memory.total


def test_eager_activations_exceed_megatrons_fused_ones():
    """A Hugging Face layer in eager mode keeps what each of its unfused kernels saves (norm inputs in FP32, one
    BF16 copy of the input per projection, the GELU's intermediates): more than Korthikanti's fused count."""
    spec = load_workload_spec("gpt3-175b")
    shape = ModelShape(name="g", decoders=1, hidden=1024, heads=16, ffn=4096, sequence=1024, vocabulary=0,
                       dropout=True, bias=True, positions="learned")
    eager = eager_layer_ops(shape, 1)[2]
    fused = stage_memory(shape, layers=1, first=False, last=False, in_flight=1, precision="bf16",
                         attention="flash").activations
    assert eager > 1.5 * fused
    assert spec.kernels == "megatron"


def test_the_hybrid_graph_carries_the_inventorys_kernels_and_their_bytes():
    spec = WorkloadSpec(name="llama", model=LLAMA, precision="bf16", kernels="pytorch-eager", granularity="layer")
    par = Parallelism(tp=1, pp=1, micro_batch=2, global_batch=2)
    graph = build_hybrid_graph(spec, par, ParallelLayout(["x0"], {}))
    assert graph.graph["kernels"] == "pytorch-eager"
    attn = eager_layer_ops(LLAMA, 2, use_cache=True)[0]  # no checkpointing: transformers keeps its cache on
    vertex = graph.nodes["s0.c0.mb0.F.L0.attn"]
    assert vertex["ops"] == attn.forward
    assert vertex["memory_bytes"] == pytest.approx(sum(op.bytes for op in attn.forward), rel=1e-12)
    assert graph.nodes["s0.optimizer"]["ops"][-1].name == "adamw_fused"
    assert graph.nodes["s0.optimizer"]["ops"][0].name.startswith("clip_grad_norm")  # the Trainer's default


@pytest.mark.parametrize("key, value", [("tp", 2), ("zero", 1)])
def test_an_eager_inventory_refuses_what_a_hugging_face_ddp_run_cannot_do(key, value):
    spec = WorkloadSpec(name="llama", model=LLAMA, precision="bf16", kernels="pytorch-eager")
    par = Parallelism(micro_batch=1, global_batch=2, **{key: value})
    with pytest.raises(ConfigError, match=f"training.kernels: pytorch-eager .* not {key} {value}"):
        par.check_model(spec)


def test_an_eager_inventory_trains_under_autocast_not_fp32():
    with pytest.raises(ConfigError, match="torch.autocast"):
        WorkloadSpec(name="x", model=LLAMA, precision="fp32", kernels="pytorch-eager")


def test_the_embedding_backward_zeroes_the_table_gradient():
    ops = eager_embedding_ops(GPT2, 1)
    assert any(op.bytes == GPT2.vocabulary * GPT2.hidden * 4 for op in ops.backward)


STEPS = REPO_ROOT / "experiments" / "calibration" / "steps"
PROFILES = [  # torch.profiler of one step (benchmarks/gpu_step_kernels.py), the workload and training keys it ran: its
    # optimizer phase is optimizer.step() and zero_grad() alone, no gradient clipping
    ("h100-gpt2-b8-s1024", "gpt2-hf", "H100", {}),
    ("h200-gpt2-b8-s1024", "gpt2-hf", "H200", {}),
    ("h200-gpt2-2.7b-b4-s1024", "gpt2-hf", "H200", {"batch_per_xpu": 4}),
    ("h100-gpt2-2.7b-b4-s1024", "gpt2-hf", "H100", {"batch_per_xpu": 4}),
    ("h100-gpt2-2.7b-b2-s2048", "gpt2-hf", "H100", {"batch_per_xpu": 2}),
    ("h100-llama1b-b4-s2048-ckpt", "llama3.2-1b-hf", "H100", {}),
    ("h200-llama1b-b4-s2048-ckpt", "llama3.2-1b-hf", "H200", {}),
    ("h200-llama1b-b4-s2048", "llama3.2-1b-hf", "H200", {"recomputation": "none"}),
]
PROFILES = [(name, workload, device, {**training, "clip_grad_norm": False})
            for name, workload, device, training in PROFILES]
GPT2_27B = {"hidden": 2560, "decoders": 32, "heads": 32, "ffn": 10240}


@pytest.mark.parametrize("name, workload, device, training", PROFILES, ids=[p[0] for p in PROFILES])
def test_the_inventory_times_each_phase_of_a_profiled_step_as_its_kernels_ran(name, workload, device, training):
    """Kernel by kernel, not the step: the device time hcsim's kernels take in forward and backward within 10 %
    of the profiled kernels' sum (the optimizer within 15 %), GPT-2's GEMMs and attention kernels counted as
    launched, and the peak memory within 15 % of torch.cuda.max_memory_allocated plus the CUDA context. No factor is fitted to these
    profiles: they are the held-out check of the inventory and of the kernel factors."""
    import sys
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from step_kernels import compare

    model = {**GPT2_27B, "sequence": 2048} if "s2048" in name and "2.7b" in name else GPT2_27B if "2.7b" in name else {}
    overrides = {"training": training, "model": model}
    result = compare(STEPS / f"{name}.csv.gz", workload, device, overrides)
    for phase, bound in (("forward", 0.10), ("backward", 0.10), ("optimizer", 0.15)):
        hcsim, measured = (sum(v[i] for v in result[phase].values()) for i in (2, 3))
        assert hcsim == pytest.approx(measured, rel=bound), phase
    if workload == "gpt2-hf":
        for phase in ("forward", "backward"):
            for cls in ("gemm", "attention"):
                assert result[phase][cls][0] == result[phase][cls][1], (phase, cls)
    hcsim, measured = result["memory"]
    assert hcsim == pytest.approx(measured, rel=0.15)


def test_a_checkpointed_layer_recomputes_up_to_its_last_gemms_inputs():
    """torch.utils.checkpoint stops recomputing once the backward's tensors are saved again: the MLP's last GEMM
    (down_proj) and what follows it do not run again; everything before, its weight cast included, does."""
    from hcsim.workload.ops import checkpoint_recompute

    mlp = eager_layer_ops(LLAMA, 1)[1].forward
    again = checkpoint_recompute(mlp)
    assert [op.name for op in mlp[len(again):]] == ["down_proj", "residual_mlp"]
    assert again[-1].name == "down_proj.cast_weight"
    spec = WorkloadSpec(name="llama", model=LLAMA, precision="bf16", kernels="pytorch-eager", recomputation="full")
    par = Parallelism(micro_batch=1, global_batch=1, recompute="full")
    graph = build_hybrid_graph(spec, par, ParallelLayout(["x0"], {}))
    assert graph.nodes["s0.c0.mb0.B.L0.recompute.mlp"]["ops"] == again


def _backward(ops, prefix):
    return [op for op in ops if op.name.startswith(prefix)]


def test_rotary_backward_is_what_autograd_runs_for_apply_rotary_pos_emb():
    """transformers' ``q_embed = (q * cos) + (rotate_half(q) * sin)``, rotate_half ``cat((-x2, x1))`` on slices,
    q BF16 and cos, sin FP32 (pytorch tools/autograd/derivatives.yaml; the engine casts each gradient to its
    input's dtype). Backward of one tensor of n elements, in order (bytes):
    sdpa's ToCopyBackward0 BF16 -> FP32 (6n: an up-cast); add: none; g·sin FP32 (8n, broadcast) and its cast to
    BF16 (6n); cat: views; neg of a half (2n); two slice_backward, each a zeroed BF16 tensor (2n) and the half copied in
    (2n); their sum (6n); g·cos (8n) and its cast (6n); the sum into q's gradient (6n): 12 kernels, 56n bytes."""
    attn = eager_layer_ops(LLAMA, 1)[0]
    n = LLAMA.sequence * LLAMA.hidden
    rope = _backward(attn.backward, "rope_q.")
    assert [op.bytes / n for op in rope] == [6, 8, 6, 2, 2, 2, 2, 2, 6, 8, 6, 6]
    assert [op.kind for op in rope] == [UPCAST, "strided", "memory", "strided", "memory", "strided", "memory",
                                        "strided", "memory", "strided", "memory", "memory"]
    assert len(_backward(attn.backward, "rope_k.")) == 12
    assert sum(op.bytes for op in _backward(attn.backward, "rope_k.")) == 56 * LLAMA.sequence * LLAMA.kv_hidden


def test_gelu_backward_is_fourteen_kernels():
    """NewGELUActivation's backward (FP32 after autocast's pow): the last product's two gradients (g·0.5x mixed
    10n, g·(1+t) 12n) and the first's cast to BF16 (6n); tanh_backward 12n; the scale 8n; the sum's cast of x's
    gradient to BF16 6n; the scale 8n; pow_backward x.pow(2) 8n, ·3 8n, g· 12n; the upcast's ToCopyBackward0 6n;
    0.5x's scale in BF16 4n; x's three gradients summed, two BF16 adds of 6n: 14 kernels."""
    mlp = eager_layer_ops(GPT2, 1)[1]
    n = GPT2.sequence * GPT2.ffn
    gelu = _backward(mlp.backward, "gelu.")
    assert [op.bytes / n for op in gelu] == [10, 12, 6, 12, 8, 6, 8, 8, 8, 12, 6, 4, 6, 6]
    assert [op.kind for op in gelu][:3] == ["mixed", "memory", "memory"]


def test_a_bias_gradient_is_a_reduction_then_a_cast_and_gradients_of_a_shared_input_are_summed():
    """addmm's ``self: grad`` summed over the tokens (sum_to, BF16: reads T·n_out·2, writes n_out·2), then the
    bias cast's ToCopyBackward0 to FP32 (n_out·6). Llama's norm output feeds three casts (q, k, v) and two (gate,
    up): autograd adds the FP32 gradients, 2 and 1 adds of 12 B per element; GPT-2's one c_attn and one c_fc none."""
    t, h = GPT2.sequence, GPT2.hidden
    attn, mlp, _ = eager_layer_ops(GPT2, 1)
    bias = _backward(attn.backward, "qkv.cast_bias")
    assert [(op.kind, op.bytes) for op in bias] == [("reduction", t * 3 * h * 2 + 3 * h * 2), (UPCAST, 3 * h * 6)]
    llama_attn, llama_mlp, _ = eager_layer_ops(LLAMA, 1)
    n = LLAMA.sequence * LLAMA.hidden
    assert [op.bytes for op in _backward(llama_attn.backward, "norm_attn.grad_sum")] == [12 * n, 12 * n]
    assert [op.bytes for op in _backward(llama_mlp.backward, "norm_mlp.grad_sum")] == [12 * n]
    assert not _backward(attn.backward + mlp.backward, "norm_attn.grad_sum")
    assert not _backward(attn.backward + mlp.backward, "norm_mlp.grad_sum")


def test_views_back_to_the_projections_copy_where_the_gradient_is_laid_out_otherwise():
    """Llama's q and k come back from rotary's sums as contiguous [b, heads, s, d] gradients: the view back to
    [b, s, h] copies each (2 B read, 2 written per element); v's, from cuDNN (empty_like(value)), needs none unless
    the key/value cache's concatenation gave it a contiguous gradient. GPT-2: split's backward concatenates the
    three gradients (at::cat), and with the cache keys and values are copied back."""
    t = LLAMA.sequence
    attn = eager_layer_ops(LLAMA, 1)[0]
    assert [op.bytes for op in _backward(attn.backward, "q_view")] == [4 * t * LLAMA.hidden]
    assert [op.bytes for op in _backward(attn.backward, "k_view")] == [4 * t * LLAMA.kv_hidden]
    cached = eager_layer_ops(LLAMA, 1, use_cache=True)[0]
    assert [op.name for op in cached.backward if op.name.startswith("cache_")] == ["cache_values.bwd"]
    gpt = eager_layer_ops(GPT2, 1)[0]
    assert [op.bytes for op in _backward(gpt.backward, "qkv_split")] == [2 * 2 * GPT2.sequence * 3 * GPT2.hidden]
    gpt_cached = eager_layer_ops(GPT2, 1, use_cache=True)[0]
    assert [op.name for op in gpt_cached.backward if op.name.startswith("cache_")] == ["cache_values.bwd",
                                                                                         "cache_keys.bwd"]


def test_the_backward_launches_per_layer_what_the_code_derives():
    """Backward kernels per decoder layer (memsets inside cuBLAS, cuDNN and reduction calls, and cuDNN's own
    preprocessing kernels, not launched by PyTorch's dispatcher, aside):

    Llama (LlamaDecoderLayer), attention block 60: the residual's BF16 cast and gradient sum 2; o_proj dgrad,
    wgrad, weight cast 3; sdpa backward 1; rotary on k and q 12 each (test above); the q and k views' copies 2;
    v, k, q projections 4 each (dgrad, wgrad, weight cast, input cast); the three input gradients summed 2;
    RMSNorm 14 (weight: g·w, g·x̂, sum over tokens; x·r: g·r, g·x, sum over the row, the two summed; rsqrt 3;
    mean 1; pow 3). MLP block 31: residual 2; down_proj 3; the product 2; up 4; SiLU 1; gate 4; the sum 1;
    RMSNorm 14.

    GPT-2 (GPT2Block), attention 18 (20 with the key/value cache's two copies): residual 2; dropout 1; c_proj
    dgrad, wgrad, bias sum and cast, weight cast 5; sdpa 1; split's concatenation 1; c_attn 6 (with the input
    cast); LayerNorm 2. MLP 31: residual 2; dropout 1; c_proj 6 (its input was GELU's FP32 output); GELU 14;
    c_fc 6; LayerNorm 2."""
    attn, mlp, _ = eager_layer_ops(LLAMA, 1)
    assert (len(attn.backward), len(mlp.backward)) == (2 + 3 + 1 + 24 + 2 + 12 + 2 + 14, 2 + 3 + 2 + 4 + 1 + 4 + 1 + 14)
    gpt_attn, gpt_mlp, _ = eager_layer_ops(GPT2, 1)
    assert (len(gpt_attn.backward), len(gpt_mlp.backward)) == (2 + 1 + 5 + 1 + 1 + 6 + 2, 2 + 1 + 6 + 14 + 6 + 2)
    assert len(eager_layer_ops(GPT2, 1, use_cache=True)[0].backward) == len(gpt_attn.backward) + 2


def test_fused_adamw_and_gradient_clipping_as_the_trainer_runs_them():
    """clip_grad_norm_ reads every FP32 gradient for the norm (4 B) and scales it in place (8 B), in
    multi_tensor_apply launches of 320 blocks of 65,536 elements, beside 9 tiny kernels (two zeroed buffers,
    lpnorm_cleanup, stack, vector_norm, + 1e-6, reciprocal, · max_norm, clamp); AdamW(fused=True): the step
    counts' foreach add, then _fused_adamw_ (28 B); zero_grad(set_to_none=True) launches nothing."""
    from hcsim.engine.compute_model import load_compute_model
    from hcsim.workload.ops import MULTI_TENSOR_BLOCKS, MULTI_TENSOR_CHUNK

    p = 1.24e9  # Llama 3.2 1B: 60 launches of fused AdamW, as profiled
    ops = optimizer_step_ops(p, "bf16", "pytorch-eager")
    launches = -(-p // (MULTI_TENSOR_CHUNK * MULTI_TENSOR_BLOCKS))
    assert launches == 60
    assert sum(op.name == "adamw_fused" for op in ops) == launches
    assert sum(op.bytes for op in ops if op.name == "adamw_fused") == pytest.approx(28 * p, rel=1e-12)
    assert sum(op.bytes for op in ops if op.name.startswith("clip_grad_norm")) == pytest.approx(12 * p, rel=1e-12)
    assert len(ops) == 2 * launches + 9 + 1 + launches
    assert {op.kind for op in ops if op.bytes} == {"multi_tensor"}
    unclipped = optimizer_step_ops(p, "bf16", "pytorch-eager", clip_grad_norm=False)
    assert len(unclipped) == 1 + launches
    model = load_compute_model()  # the measured rate: 28 B per parameter at multi_tensor_efficiency
    factors = model.device("H100")
    step = model.time(unclipped, "H100", 989e12, 3.35e12)
    assert step == pytest.approx(28 * p / (3.35e12 * factors.multi_tensor_efficiency), rel=0.01)
    assert 2.5e12 < 3.35e12 * factors.multi_tensor_efficiency < 2.7e12


def test_clip_grad_norm_is_a_workload_key_on_by_default():
    spec = WorkloadSpec(name="llama", model=LLAMA, precision="bf16", kernels="pytorch-eager", granularity="layer")
    assert spec.clip_grad_norm
    par = Parallelism(tp=1, pp=1, micro_batch=1, global_batch=1)
    from dataclasses import replace

    for clip in (True, False):
        graph = build_hybrid_graph(replace(spec, clip_grad_norm=clip), par, ParallelLayout(["x0"], {}))
        ops = graph.nodes["s0.optimizer"]["ops"]
        assert any(op.name.startswith("clip_grad_norm") for op in ops) == clip
        assert graph.nodes["s0.optimizer"]["memory_bytes"] == pytest.approx(sum(op.bytes for op in ops), rel=1e-12)


def test_the_megatron_inventory_is_untouched_by_the_pytorch_optimizer_and_kernels():
    """Megatron-LM's step moves its 42 B a parameter (BF16) whatever training.clip_grad_norm says: its
    multi_tensor_apply kernels as one multi_tensor op, the gradient buffer's zeroing (4 B) as a fill; no other kernel
    of its step is a multi_tensor one."""
    from dataclasses import replace

    spec = WorkloadSpec(name="llama", model=LLAMA, precision="bf16", granularity="layer", attention="flash")
    par = Parallelism(tp=1, pp=1, micro_batch=1, global_batch=1)
    graphs = [build_hybrid_graph(replace(spec, clip_grad_norm=clip), par, ParallelLayout(["x0"], {}))
              for clip in (True, False)]
    ops = [[data.get("ops") for _, data in sorted(g.nodes(data=True))] for g in graphs]
    assert ops[0] == ops[1]
    step = graphs[0].nodes["s0.optimizer"]
    assert [(op.name, op.kind) for op in step["ops"]] == [("optimizer", "multi_tensor"), ("zero_grad_buffer", "memory")]
    assert sum(op.bytes for op in step["ops"]) == pytest.approx(42.0 * model_parameters(LLAMA), rel=1e-12)
    assert step["ops"][1].bytes == pytest.approx(4.0 * model_parameters(LLAMA), rel=1e-12)
    assert not any(op.kind == "multi_tensor" for kernels in ops[0] if kernels and kernels is not step["ops"]
                   for op in kernels)


# ---- torch.compile: what AOTAutograd's partitioner keeps, and what the compiled backward recomputes -----------

def _sizes(shape, b):
    t = b * shape.sequence
    return t, t * shape.hidden, t * shape.ffn, t * shape.kv_hidden, b * shape.heads * shape.sequence * 4


@pytest.mark.parametrize("b", [1, 3])
def test_eager_saved_bytes_per_layer_are_autograds_as_before(b):
    """The eager rule, in closed form (unchanged by the compiled one): GPT-2 keeps 24 B per hidden element (the
    FP32 inputs of both LayerNorms 8, the BF16 inputs of c_attn and c_proj 4, sdpa's q, k, v and output 8 --
    the output once more as c_proj's input --, the two dropout masks 2) and 16 B per MLP element (GELU's BF16
    input 2, its FP32 intermediates 12, c_proj's cast input 2), 8 B per token (the LayerNorms' statistics) and
    the log-sum-exp; Llama 32 B per hidden element (RMSNorm's input and normalized input in FP32, 16; q, k, v's
    three casts of the norm's output 6, gate's and up's 4, sdpa's q and output 4, o_proj's input 2), 4 per key/value
    element (k, v), 8 per MLP element (gate, up, silu(gate), the product)."""
    t, n, f, kv, lse = _sizes(GPT2, b)
    assert eager_layer_ops(GPT2, b)[2] == 24 * n + 16 * f + 16 * t + lse
    t, n, f, kv, lse = _sizes(LLAMA, b)
    assert eager_layer_ops(LLAMA, b)[2] == 32 * n + 4 * kv + 8 * f + lse


@pytest.mark.parametrize("b", [1, 3])
def test_compiled_saved_bytes_per_layer_are_the_partitioners(b):
    """torch.compile (AOTAutograd's min-cut partitioner): the FP32 residual stream twice a layer (8 B per hidden
    element), each norm's BF16 output cast once (4), the attention kernel's q, k, v and output in BF16 (GPT-2: 6 +
    2), the dropout masks (2); per MLP element GPT-2 4 B (c_fc's output, GELU's output cast for c_proj), Llama 6
    (gate, up, their product); per token the norms' statistics (LayerNorm 2 x 2 x 4 B, RMSNorm 2 x 4 B)."""
    from hcsim.workload.ops import compiled_saved

    t, n, f, kv, lse = _sizes(GPT2, b)
    gpt2 = (4 + 4 + 2 + 2 + 6 + 2 + 1 + 1) * n + (2 + 2) * f + 2 * 2 * 4 * t + lse
    assert eager_layer_ops(GPT2, b, compiled=True)[2] == sum(compiled_saved(GPT2, b).values()) == gpt2
    assert compiled_saved(GPT2, b)["mlp"] == 4 * f
    t, n, f, kv, lse = _sizes(LLAMA, b)
    llama = (4 + 4 + 2 + 2 + 2 + 2) * n + (2 + 2) * kv + (2 + 2 + 2) * f + 2 * 4 * t + lse
    assert eager_layer_ops(LLAMA, b, compiled=True)[2] == sum(compiled_saved(LLAMA, b).values()) == llama
    assert compiled_saved(LLAMA, b)["mlp"] == 6 * f


@pytest.mark.parametrize("shape", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_compiled_memory_is_less_than_eager_memory(shape):
    """Fewer saved tensors, the head's logits and their gradient in BF16: below eager with and without activation
    checkpointing, whose peak holds the compiled layer being recomputed; the state (weights, Adam, BF16 copies)
    the same."""
    b = 2
    p = model_parameters(shape)
    layer = eager_layer_ops(shape, b, compiled=True)[2]
    head = eager_head_ops(shape, b, compiled=True)[1]
    assert head == b * shape.sequence * shape.vocabulary * (2 + 2)
    assert layer < eager_layer_ops(shape, b)[2] and head < eager_head_ops(shape, b)[1]
    for recompute in ("none", "full"):
        eager = eager_memory(shape, layers=shape.decoders, micro_batch=b, recompute=recompute)
        compiled = eager_memory(shape, layers=shape.decoders, micro_batch=b, recompute=recompute, compiled=True)
        assert compiled.total < eager.total
        assert compiled.parameters == eager.parameters
    inputs = shape.decoders * b * shape.sequence * shape.hidden * 4
    checkpointed = eager_memory(shape, layers=shape.decoders, micro_batch=b, recompute="full", compiled=True)
    assert checkpointed.total == pytest.approx(12 * p + max(2 * p + inputs + max(head, layer), 4 * p)
                                               + CUBLAS_WORKSPACE + CUDA_CONTEXT, rel=1e-12)
    plain = eager_memory(shape, layers=shape.decoders, micro_batch=b, compiled=True)
    assert plain.total == pytest.approx(12 * p + max(2 * p + shape.decoders * layer + head, 4 * p)
                                        + CUBLAS_WORKSPACE + CUDA_CONTEXT, rel=1e-12)
    via_stage = stage_memory(shape, layers=shape.decoders, first=True, last=True, in_flight=1, micro_batch=b,
                             kernels="torch-compile")
    assert via_stage.total == plain.total


def _between_gemms(ops, after):
    """The fused memory-bound kernel right after the GEMM named `after` (its weight gradient)."""
    names = [op.name for op in ops]
    return ops[names.index(f"{after}.wgrad") + 1]


def test_the_compiled_backward_recomputes_what_the_partitioner_did_not_keep():
    """One fused kernel reads the tensors kept and recomputes the rest in registers: GPT-2's GELU backward reads
    the incoming BF16 gradient and c_fc's output and writes c_fc's BF16 gradient (6 B per MLP element, eager's
    largest GELU backward kernel 12: an FP32 product of FP32 intermediates); Llama's SwiGLU backward reads the
    product's gradient, gate and up and writes the gradients of gate and up (10 B per element, eager: three
    kernels of 6); the head reads the BF16 logits and writes their BF16 gradient (4 B per logit, eager's
    log_softmax backward 16)."""
    b = 3  # tokens unlike the hidden size: the weights' casts back move less than the tokens' kernels
    t, n, f, kv, lse = _sizes(GPT2, b)
    mlp = eager_layer_ops(GPT2, b, compiled=True)[1]
    assert _between_gemms(mlp.backward, "down_proj").bytes == 6 * f
    assert not _backward(mlp.backward, "gelu.")  # fused into the kernel after down_proj's GEMMs
    eager = eager_layer_ops(GPT2, b)[1]
    assert max(op.bytes for op in _backward(eager.backward, "gelu.")) == 12 * f
    t, n, f, kv, lse = _sizes(LLAMA, b)
    mlp = eager_layer_ops(LLAMA, b, compiled=True)[1]
    assert _between_gemms(mlp.backward, "down_proj").bytes == 10 * f
    eager = eager_layer_ops(LLAMA, b)[1]
    assert [op.bytes for op in _backward(eager.backward, "gate_mul.") + _backward(eager.backward, "silu.")] == \
        [6 * f] * 3
    for shape in (GPT2, LLAMA):
        logits = b * shape.sequence * shape.vocabulary
        head = eager_head_ops(shape, b, compiled=True)[0]
        assert (head.backward[0].name, head.backward[0].bytes) == ("logits_float.bwd", 4 * logits)
        assert max(op.bytes for op in eager_head_ops(shape, b)[0].backward if op.kind != "gemm") == 16 * logits


def test_the_compiled_forward_and_the_eager_kernels_are_untouched_by_the_compiled_backward():
    """The recomputation changes the compiled backward only: the compiled forward is still the eager forward
    fused, and eager's kernels are autograd's."""
    from hcsim.workload.ops import _fused

    for shape in (GPT2, LLAMA):
        for eager, compiled in zip(eager_layer_ops(shape, 2)[:2], eager_layer_ops(shape, 2, compiled=True)[:2]):
            assert compiled.forward == _fused(eager.forward)
            assert [op for op in compiled.backward if op.kind in ("gemm", "attention")] == \
                [op for op in eager.backward if op.kind in ("gemm", "attention")]


def test_only_an_fp16_megatron_step_unscales_its_gradients():
    """Megatron-LM makes a loss scaler for FP16 alone (megatron/core/optimizer/__init__.py): its unscale rewrites
    each FP32 main gradient in place (read 4, write 4 B more than BF16's step); BF16 and FP8 steps are alike but
    for FP8's weight casts, FP32 training has no 16-bit weights to copy the master into (read 4, write 2 B less)."""
    from hcsim.workload.ops import optimizer_step_ops

    def step(precision):
        return optimizer_step_ops(1e6, precision)[0].bytes / 1e6

    assert step("fp16") - step("bf16") == 8.0
    assert step("fp8") == step("bf16")
    assert step("bf16") - step("fp32") == 6.0
