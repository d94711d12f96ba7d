"""The transformer model (hcsim.workload.transformer) against Megatron-LM's closed forms and published model sizes."""

import math
from dataclasses import replace

import pytest

from hcsim.errors import ConfigError
from hcsim.workload import ModelShape, load_workload_spec
from hcsim.workload.memory import layer_activation_bytes, output_activation_bytes
from hcsim.workload.transformer import (OP_KINDS, Work, active_parameters, decoder_layer, embedding, iteration_flops,
                                        lm_head, model_blocks, model_parameters)


def gpt(hidden=12288, heads=96, decoders=96, sequence=2048, vocabulary=50257, **extra):
    """A GPT shape (Brown et al. 2020 / Megatron-LM): f = 4h, GeLU, LayerNorm, biases, learned positions, tied."""
    return ModelShape(name="gpt", decoders=decoders, hidden=hidden, heads=heads, ffn=4 * hidden, sequence=sequence,
                      vocabulary=vocabulary, positions="learned", bias=True, tied_embeddings=True, **extra)


GPTS = [gpt(), gpt(hidden=2304, heads=24, decoders=24, vocabulary=51200), gpt(hidden=512, heads=8, decoders=3,
                                                                              sequence=4096, vocabulary=1000)]


@pytest.mark.parametrize("shape", GPTS, ids=lambda s: f"h{s.hidden}")
@pytest.mark.parametrize("batch", [1, 8, 1536])
def test_gpt_iteration_flops_are_megatrons(shape, batch):
    """Narayanan et al. SC'21: 72·B·s·L·h²(1 + s/6h + V/12Lh);
    with full recomputation 96·B·s·L·h²(1 + s/6h + V/16Lh)."""
    s, h, L, V = shape.sequence, shape.hidden, shape.decoders, shape.vocabulary
    plain = 72 * batch * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    full = 96 * batch * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert iteration_flops(shape, batch=batch) == pytest.approx(plain, rel=1e-9)
    assert iteration_flops(shape, batch=batch, recompute="full") == pytest.approx(full, rel=1e-9)
    # selective recomputation redoes the attention core's two batched products: 4·B·s²·h per layer
    selective = iteration_flops(shape, batch=batch, recompute="selective")
    assert selective - iteration_flops(shape, batch=batch) == pytest.approx(4 * batch * s * s * h * L, rel=1e-9)


@pytest.mark.parametrize("name", ["llama2-70b", "llama3-405b", "mixtral-8x7b"])
def test_llama_iteration_flops(name):
    """Grouped-query attention and SwiGLU: per layer forward 2·b·s·(h(h + 2h_kv) + h² + 3hf_active) + 4·b·s²·h
    (f_active = top_k x expert ffn, plus the router's 2·b·s·h·E), logits 2·b·s·h·V; backward twice the forward."""
    shape = load_workload_spec(name).model
    b, s, h, hk, L, V = 4, shape.sequence, shape.hidden, shape.kv_hidden, shape.decoders, shape.vocabulary
    f = shape.top_k * shape.expert_hidden
    router = 2 * b * s * h * shape.experts if shape.moe else 0
    layer = 2 * b * s * (h * (h + 2 * hk) + h * h + 3 * h * f) + 4 * b * s * s * h + router
    assert iteration_flops(shape, batch=b) == pytest.approx(3 * (L * layer + 2 * b * s * h * V), rel=1e-12)


@pytest.mark.parametrize("shape", [GPTS[2], load_workload_spec("mixtral-8x7b").model], ids=lambda s: s.name)
def test_costs_are_affine_in_the_micro_batch(shape):
    """Every op's FLOPs and activation traffic grow linearly with b; only weight traffic is constant."""
    for t, sp in ((1, False), (4, True)):
        blocks = [model_blocks(shape, micro_batch=b, tp=t, sequence_parallel=sp) for b in (1, 2, 3)]
        for one, two, three in zip(*blocks):
            for op1, op2, op3 in zip(one.ops, two.ops, three.ops):
                for key in ("forward", "backward_input", "backward_weight"):
                    w1, w2, w3 = (getattr(op, key) for op in (op1, op2, op3))
                    assert w3.flops - w2.flops == pytest.approx(w2.flops - w1.flops, rel=1e-12, abs=0)
                    assert w2.flops == 2 * w1.flops
                    assert w3.bytes - w2.bytes == pytest.approx(w2.bytes - w1.bytes, rel=1e-12), (op1.name, key)
                assert op2.saved == 2 * op1.saved and op1.parameters == op2.parameters


def test_any_sequence_length():
    shape = gpt(hidden=1024, heads=16, decoders=4, sequence=8192, vocabulary=5000)
    for s in (128, 1000, 8192):
        b, h, L, V = 2, 1024, 4, 5000
        expected = 72 * b * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
        assert iteration_flops(shape, batch=b, sequence=s) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("shape", GPTS, ids=lambda s: f"h{s.hidden}")
def test_gpt_parameters(shape):
    """Lecture seed / REFERENCE.md: L(12h² + 13h) + hv + h(s + 1), where the final LayerNorm's β adds one more h."""
    h, L, V, s = shape.hidden, shape.decoders, shape.vocabulary, shape.sequence
    assert model_parameters(shape) == L * (12 * h**2 + 13 * h) + h * V + h * (s + 1) + h
    untied = replace(shape, tied_embeddings=False)
    assert model_parameters(untied) - model_parameters(shape) == V * h


# published sizes: Hugging Face model pages (safetensors parameter counts), Mistral AI for Mixtral
PUBLISHED = {"llama2-7b": 6.74e9, "llama2-13b": 13.0e9, "llama2-13b-shape": 13.0e9, "llama2-70b": 69.0e9,
             "llama3-8b": 8.03e9, "llama3-70b": 70.6e9, "llama3-405b": 406e9, "mixtral-8x7b": 46.7e9,
             "gpt3-175b": 175e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shipped_models_have_their_published_sizes(name):
    shape = load_workload_spec(name).model
    assert model_parameters(shape) == pytest.approx(PUBLISHED[name], rel=0.01)


def test_mixtral_active_parameters():
    """Mistral AI: 12.9e9 of the 46.7e9 parameters are used per token (2 of 8 experts)."""
    shape = load_workload_spec("mixtral-8x7b").model
    assert active_parameters(shape) == pytest.approx(12.9e9, rel=0.01)
    dense = load_workload_spec("llama3-8b").model
    assert active_parameters(dense) == model_parameters(dense)


def _shapes():
    return [gpt(hidden=256, heads=8, decoders=2, sequence=64, vocabulary=512)] + [
        load_workload_spec(name).model for name in ("llama2-70b", "llama3-8b", "mixtral-8x7b")]


@pytest.mark.parametrize("shape", _shapes(), ids=lambda s: s.name)
@pytest.mark.parametrize("tp, sp", [(1, False), (2, False), (4, True), (8, True)])
def test_backward_is_input_plus_weight_gradient(shape, tp, sp):
    for block in model_blocks(shape, micro_batch=2, sequence=64, tp=tp, sequence_parallel=sp):
        total = block.backward
        assert total.flops == sum(op.backward_input.flops + op.backward_weight.flops for op in block.ops)
        assert total.bytes == pytest.approx(sum(op.backward_input.bytes + op.backward_weight.bytes for op in block.ops))
        for op in block.ops:
            assert op.kind in OP_KINDS
            assert op.backward.flops == op.backward_input.flops + op.backward_weight.flops
            if op.kind == "gemm":  # dX = dY·Wᵀ and dW = Xᵀ·dY each cost the forward product
                assert op.backward_input.flops == op.backward_weight.flops == op.forward.flops > 0
            elif op.kind == "attention":  # no weights: two products backward per product forward
                assert op.backward_weight == Work() and op.backward_input.flops == 2 * op.forward.flops
            else:
                assert op.forward.flops == op.backward.flops == 0 and op.forward.bytes > 0
            # weights have a gradient; the tied logits accumulate theirs into the embedding's
            assert (op.parameters > 0 or op.name == "logits") == (op.backward_weight.bytes > 0)


REPLICATED_WITHOUT_SP = {"norm_attention", "norm_mlp", "final_norm", "dropout_attention", "dropout_mlp",
                         "residual_attention", "residual_mlp", "embedding_dropout", "router", "routing"}


@pytest.mark.parametrize("shape", _shapes(), ids=lambda s: s.name)
@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallelism_divides_the_matrix_products_by_t(shape, sp):
    base = {block.kind: block for block in model_blocks(shape, micro_batch=2, sequence=64)}
    for t in (2, 4, 8):
        for block in model_blocks(shape, micro_batch=2, sequence=64, tp=t, sequence_parallel=sp):
            for op in block.ops:
                one = base[block.kind].op(op.name)
                if op.kind in ("gemm", "attention") and op.name != "router":
                    for key in ("forward", "backward_input", "backward_weight"):
                        assert getattr(op, key).flops * t == getattr(one, key).flops, (op.name, key, t)
                elif op.name in REPLICATED_WITHOUT_SP:  # outside the TP regions: s/t tokens only with SP
                    moved, moved1 = (x.forward.bytes - 2 * x.parameters for x in (op, one))  # BF16 weights aside
                    assert op.parameters == one.parameters
                    assert moved * (t if sp else 1) == pytest.approx(moved1, rel=1e-12), (op.name, t)
    # per-rank weights of the column- and row-parallel GEMMs are 1/t (the replicated row-parallel bias aside)
    layer1 = decoder_layer(shape, micro_batch=1, sequence=64)
    layer8 = decoder_layer(shape, micro_batch=1, sequence=64, tp=8)
    h = shape.hidden
    for name in ("qkv", "attention_projection"):
        bias = h if (shape.bias and name == "attention_projection") else 0
        assert (layer8.op(name).parameters - bias) * 8 == layer1.op(name).parameters - bias


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_op_by_op_activations_are_korthikanti(t, sp, mode):
    """Each op's saved tensors add up to Korthikanti et al.'s closed forms for a 16-bit GPT layer."""
    shape = gpt(hidden=1024, heads=16, decoders=2, sequence=512, vocabulary=4096)
    layer = decoder_layer(shape, micro_batch=3, tp=t, sequence_parallel=sp, precision="bf16")
    closed = layer_activation_bytes(sequence=512, micro_batch=3, hidden=1024, heads=16, tp=t, sequence_parallel=sp,
                                    recompute=mode)
    assert layer.activation_bytes(mode) == pytest.approx(closed, rel=1e-12)
    first, head = embedding(shape, micro_batch=3, tp=t, sequence_parallel=sp), \
        lm_head(shape, micro_batch=3, tp=t, sequence_parallel=sp)
    outside = output_activation_bytes(sequence=512, micro_batch=3, hidden=1024, vocabulary=4096, tp=t,
                                      sequence_parallel=sp)
    assert first.activation_bytes(mode) + head.activation_bytes(mode) == pytest.approx(outside, rel=1e-12)


def test_gpt3_activations_are_the_lectures_32895_gib():
    """REFERENCE.md / lecture seed: GPT-3 175B (h 12288, s 2048, L 96, a 96, b 128, v 50000) keeps 32,895
    "GB" of activations. That is GiB (2^30 B) for Korthikanti's 16-bit count without tensor or sequence
    parallelism and without recomputation, all 96 layers plus the embedding and output layers:
    L·sbh(34 + 5as/h) + 5sbh + 4sbv = 32,895.8 GiB (the layers alone: 32,832 GiB)."""
    s, h, L, a, b, v = 2048, 12288, 96, 96, 128, 50000
    layers = L * layer_activation_bytes(sequence=s, micro_batch=b, hidden=h, heads=a)
    outside = output_activation_bytes(sequence=s, micro_batch=b, hidden=h, vocabulary=v)
    assert layers == L * s * b * h * (34 + 5 * a * s / h) and outside == 5 * s * b * h + 4 * s * b * v
    assert math.floor((layers + outside) / 2**30) == 32_895
    assert layers / 2**30 == 32_832
    # the same from the ops of the model
    shape = gpt(hidden=h, heads=a, decoders=L, sequence=s, vocabulary=v)
    first, layer, head = model_blocks(shape, micro_batch=b, precision="fp16")
    assert first.activation_bytes() + L * layer.activation_bytes() + head.activation_bytes() == layers + outside


def test_recomputation():
    shape = load_workload_spec("llama3-8b").model
    layer = decoder_layer(shape, micro_batch=2, tp=4, sequence_parallel=True)
    assert layer.recompute("none").flops == 0
    assert layer.recompute("full") == layer.forward  # full: one more forward pass of the layer
    core = sum(op.forward.flops for op in layer.ops if op.attention_core)
    assert layer.recompute("selective").flops == core == 4 * 2 * shape.sequence**2 * shape.hidden / 4
    for block in (embedding(shape), lm_head(shape)):
        assert block.recompute("full").flops == 0 and block.recompute("full").bytes == 0
    assert layer.activation_bytes("full") == layer.input_bytes == 2 * shape.sequence * shape.hidden * 2 / 4
    assert layer.activation_bytes("selective") < layer.activation_bytes("none")


@pytest.mark.parametrize("name", ["gpt3-175b", "llama3-8b"])
def test_flash_attention_keeps_no_score_matrices(name):
    """Dao et al. 2022: the fused core keeps Q, K, V and one FP32 log-sum-exp per row, recomputes QKᵀ backward."""
    shape = load_workload_spec(name).model
    b, s, t = 2, 1024, 4
    standard = decoder_layer(shape, micro_batch=b, sequence=s, tp=t, sequence_parallel=True)
    flash = decoder_layer(shape, micro_batch=b, sequence=s, tp=t, sequence_parallel=True, attention="flash")
    core = flash.op("flash_attention")
    products = 2 * b * s * s * shape.hidden / t  # one of QKᵀ, P·V
    # causal: the kernel skips the masked half (one product's worth forward), recomputes QKᵀ backward
    assert core.forward.flops == products and core.backward_input.flops == 2.5 * products
    assert flash.forward.flops == standard.forward.flops - products
    assert flash.backward.flops == standard.backward.flops - 1.5 * products
    lse = b * shape.heads / t * s * 4
    # flash keeps what selective recomputation keeps, plus the log-sum-exp, and no dropout masks of the scores
    assert flash.activation_bytes() == pytest.approx(standard.activation_bytes("selective") + lse, rel=1e-12)
    assert flash.forward.bytes < standard.forward.bytes
    assert [op.name for op in flash.ops if op.attention_core] == ["flash_attention"]
    with pytest.raises(ConfigError, match="attention 'paged' is not one of standard, flash"):
        decoder_layer(shape, attention="paged")


def test_element_sizes_follow_the_precision():
    shape = load_workload_spec("llama2-7b").model  # no dropout: no 1-byte masks
    half, full = (decoder_layer(shape, micro_batch=1, sequence=256, precision=p) for p in ("bf16", "fp32"))
    assert full.activation_bytes() == 2 * half.activation_bytes()
    assert full.forward.bytes == pytest.approx(2 * half.forward.bytes, rel=1e-12)
    assert full.forward.flops == half.forward.flops


def test_mixture_of_experts_computes_top_k_experts_per_token():
    moe = load_workload_spec("mixtral-8x7b").model
    dense = replace(moe, experts=1, top_k=1)
    m, d = (decoder_layer(x, micro_batch=2, sequence=128, tp=2) for x in (moe, dense))
    experts = m.op("expert_in").forward.flops + m.op("expert_out").forward.flops
    assert experts == moe.top_k * (d.op("mlp_in").forward.flops + d.op("mlp_out").forward.flops)
    assert m.op("router").forward.flops == 2 * 2 * 128 * moe.hidden * moe.experts  # replicated, b·s tokens
    assert m.op("expert_in").parameters == moe.experts * d.op("mlp_in").parameters
    # expert parallelism spreads the experts' weights, not their work (balanced routing)
    ep4 = decoder_layer(moe, micro_batch=2, sequence=128, tp=2, ep=4)
    assert ep4.op("expert_in").parameters * 4 == m.op("expert_in").parameters
    assert ep4.op("expert_in").forward.flops == m.op("expert_in").forward.flops


def test_tied_copy_on_a_separate_last_stage():
    shape = gpt(hidden=256, heads=8, decoders=2, sequence=64, vocabulary=512)
    assert lm_head(shape).op("logits").parameters == 0
    assert lm_head(shape, tied_copy=True, tp=2).op("logits").parameters == 256 * 512 // 2


@pytest.mark.parametrize("keywords, message", [
    ({"tp": 5}, "heads 96 is not a multiple of tp 5"),
    ({"tp": 16, "sequence": 2048, "sequence_parallel": True}, "kv_heads 8 is not a multiple of tp 16"),
    ({"tp": 2, "sequence": 1001, "sequence_parallel": True}, "sequence 1001 is not a multiple of tp 2"),
    ({"ep": 2}, "ep 2 needs a mixture-of-experts model"),
    ({"micro_batch": 0}, "micro_batch must be an integer >= 1"),
    ({"precision": "fp4"}, "precision: 'fp4' is not one of"),
])
def test_invalid_configurations_name_the_key(keywords, message):
    shape = ModelShape(name="m", decoders=2, hidden=96 * 64, heads=96, kv_heads=8, ffn=1024, sequence=2048)
    with pytest.raises(ConfigError, match=message):
        decoder_layer(shape, **keywords)


def test_other_errors():
    with pytest.raises(ConfigError, match="vocabulary must be >= 1"):
        lm_head(ModelShape(name="m", decoders=1, hidden=64, heads=4, ffn=256, sequence=32))
    with pytest.raises(ConfigError, match="exceeds the 64 learned positions"):
        embedding(gpt(hidden=256, heads=8, decoders=2, sequence=64, vocabulary=512), sequence=128)
    with pytest.raises(ConfigError, match="experts 8 is not a multiple of ep 3"):
        decoder_layer(load_workload_spec("mixtral-8x7b").model, ep=3)
    with pytest.raises(ConfigError, match="recompute: 'some' is not one of"):
        decoder_layer(GPTS[2]).recompute("some")
    with pytest.raises(ConfigError, match="top_k 3 exceeds experts 2"):
        ModelShape(name="m", decoders=1, hidden=64, heads=4, ffn=256, sequence=32, experts=2, top_k=3)


def test_the_table4_generator_refuses_experts():
    from hcsim.workload import element_sizes, generate_decoder_table

    with pytest.raises(ConfigError, match="models dense MLPs only"):
        generate_decoder_table(load_workload_spec("mixtral-8x7b").model, element_sizes("bf16"))
