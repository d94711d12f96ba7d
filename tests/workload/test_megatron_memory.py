"""Memory as Megatron-LM and Transformer Engine allocate it, term by term, against Megatron-LM's own theoretical
formulas (megatron/training/theoretical_memory_usage.py: compute_weight_and_optimizer_memory's
18 or 6 + 12/d bytes per parameter, the most loaded shard's parameters, compute_activation_memory_without_sp's
sbh(10 + 24/t) per layer) and a run real clusters train: Llama-3 8B, sequence 8192, 8 H100, cp 2, the
distributed optimizer, FP8, micro-batch 1, no recomputation, flash attention. (The interleaved schedule's
in-flight micro-batches against Megatron-LM's p(1 + (p - 1)/(pv)): tests/workload/test_hybrid.py.)"""

from __future__ import annotations

import dataclasses

import pytest

from hcsim.errors import ConfigError
from hcsim.run.prepare import prepare
from hcsim.run.scenario import Scenario
from hcsim.workload import load_workload_spec
from hcsim.workload.memory import (ALLOCATOR_RESERVE, CUDA_CONTEXT, CUDA_WORKSPACES, framework_reserve, stage_memory,
                                   zero_state)
from hcsim.workload.transformer import decoder_layer

H100 = 80 * 2**30


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_fp32_main_gradients_give_megatron_s_bytes_per_parameter(d):
    """18 B per parameter without the distributed optimizer, 6 + 12/d with it (BF16 weights, FP32 main gradients,
    FP32 master weights and Adam moments)."""
    psi = 1e9
    assert zero_state(psi, d, 0, precision="bf16", gradient=4.0).total == pytest.approx(18 * psi, rel=1e-12)
    assert zero_state(psi, d, 1, precision="bf16", gradient=4.0).total == pytest.approx((6 + 12 / d) * psi, rel=1e-12)
    assert zero_state(psi, d, 1, precision="bf16").total == pytest.approx((4 + 12 / d) * psi, rel=1e-12)  # ZeRO's


def test_main_gradients_follow_megatron_in_bf16_and_nemo_s_fp8_recipes_unless_named():
    spec = load_workload_spec("llama3-8b")
    assert spec.main_gradient == 4.0  # Megatron-LM: bf16 accumulates and all-reduces gradients in FP32
    assert dataclasses.replace(spec, precision="fp8").main_gradient == 2.0  # NeMo: grad_reduce_in_fp32 False
    assert dataclasses.replace(spec, precision="fp16").main_gradient == 2.0
    assert load_workload_spec("llama3-8b", {"training.grad_reduce_in_fp32": False}).main_gradient == 2.0
    fp8 = load_workload_spec("llama3-8b", {"training.precision": "fp8", "training.grad_reduce_in_fp32": True})
    assert fp8.main_gradient == 4.0 and fp8.main_sizes.gradient == 4.0 and fp8.sizes.gradient == 2.0
    with pytest.raises(ConfigError, match="grad_reduce_in_fp32"):
        load_workload_spec("llama3-8b", {"training.grad_reduce_in_fp32": "yes"})


def _megatron_parameters(shape, tp: int, pp: int) -> float:
    """compute_weight_and_optimizer_memory's num_parameters_on_most_loaded_model_shard (a dense model, RMSNorm,
    SwiGLU, grouped-query attention, untied embeddings), as its formula writes it."""
    h, a, g, f, v, layers = shape.hidden, shape.heads, shape.kv_heads, shape.ffn, shape.vocabulary, shape.decoders
    layer = 2 * h * (f * 3 / 2 + 1) + 2 * h * h * (1 + g / a)
    block = layer * layers + h  # and the final norm
    shard = (block / pp + h * v) / tp
    return shard + (h * v / tp if pp == 1 else 0.0)


@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (1, 4), (4, 2)])
def test_the_most_loaded_shard_holds_megatron_s_parameter_count(tp, pp):
    spec = load_workload_spec("llama3-8b")
    layers = spec.model.decoders // pp
    first = stage_memory(spec.model, layers=layers, first=True, last=pp == 1, in_flight=1, tp=tp, sequence=1024)
    # the formula spreads the norms over the TP ranks and the final norm over the stages; each TP rank holds its
    # norms whole (Megatron-LM replicates them), the last stage the final norm: they differ by at most the norms
    norms = (2 * spec.model.decoders + 1) * spec.model.hidden
    assert first.parameters == pytest.approx(_megatron_parameters(spec.model, tp, pp), abs=norms)
    assert first.parameters >= _megatron_parameters(spec.model, tp, pp) - spec.model.hidden


@pytest.mark.parametrize("t", [1, 2, 8])
def test_flash_attention_drops_korthikanti_s_score_term(t):
    """A GPT layer (f = 4h, GeLU, dropout) keeps sbh(10 + 24/t) bytes with flash attention and no sequence
    parallelism (Korthikanti et al. 2022 without the 5as/(ht) score tensors; Megatron-LM's
    compute_activation_memory_without_sp), plus the flash kernel's FP32 log-sum-exp per score row."""
    spec = load_workload_spec("gpt3-175b", {"model.hidden": 1024, "model.heads": 16, "model.ffn": 4096})
    s, b, h, a = 2048, 2, 1024, 16
    layer = decoder_layer(spec.model, micro_batch=b, sequence=s, tp=t, precision="bf16", attention="flash")
    lse = 4.0 * b * (a / t) * s
    assert layer.activation_bytes("none") == pytest.approx(s * b * h * (10 + 24 / t) + lse, rel=1e-12)
    standard = decoder_layer(spec.model, micro_batch=b, sequence=s, tp=t, precision="bf16")
    assert standard.activation_bytes("none") == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)


def test_framework_reserve_is_the_context_the_workspaces_and_megatron_s_five_percent():
    assert framework_reserve(0.0) == CUDA_CONTEXT + CUDA_WORKSPACES
    assert framework_reserve(10e9) == pytest.approx(CUDA_CONTEXT + CUDA_WORKSPACES + ALLOCATOR_RESERVE * 10e9)
    assert ALLOCATOR_RESERVE == 0.05 and framework_reserve(10e9, "pytorch-eager") == 0.0


LLAMA3_8B_CP2 = dict(platform="dgx-h100", workload="llama3-8b", xpus=8, cp=2, zero=1, precision="fp8", micro_batch=1,
                     global_batch=32, recompute="none")


def test_llama3_8b_at_8k_tokens_cp2_fp8_with_the_distributed_optimizer_fits_an_h100_term_by_term():
    """BF16 weights (2 B) and Transformer Engine's cached FP8 weight and transpose (2 B) of the FP8 GEMMs' weights
    only, BF16 main gradients (NeMo's FP8 recipes), the FP32 master weights and Adam moments (12 B) sharded over
    dp x cp = 8; activations of 4,096 tokens per rank (cp 2) with flash attention."""
    scenario = Scenario(**LLAMA3_8B_CP2)
    prepared = prepare(scenario)  # no out-of-memory error
    held = prepared.placement.inventory[prepared.xpus[0]]
    spec = load_workload_spec("llama3-8b", {"training.precision": "fp8"})
    shape = spec.model
    h, f, hk, v, layers = shape.hidden, shape.ffn, shape.kv_heads * shape.hidden // shape.heads, shape.vocabulary, \
        shape.decoders
    gemms = layers * (h * (h + 2 * hk) + h * h + 3 * h * f)  # qkv, projection, SwiGLU's three
    psi = gemms + layers * 2 * h + h + 2 * h * v  # and the norms, the final norm, the untied embedding and head
    assert held.parameters == pytest.approx(2 * psi + 2 * gemms, rel=1e-12)
    assert held.gradients == pytest.approx(2 * psi, rel=1e-12)
    assert held.optimizer == pytest.approx(12 * psi / 8, rel=1e-12)
    layer = decoder_layer(shape, micro_batch=1, sequence=shape.sequence // 2, precision="fp8", attention="flash")
    assert held.activations > layers * layer.activation_bytes("none")  # and the head's logits
    assert held.total + framework_reserve(held.activations) < H100


def test_the_same_run_with_fp32_main_gradients_is_out_of_memory_and_says_by_how_much():
    """Megatron-LM's own default (FP32 gradient accumulation) adds 2 B per parameter: 16 GB more than an H100 has
    room for at 8k tokens."""
    scenario = Scenario(**LLAMA3_8B_CP2, workload_overrides={"training.grad_reduce_in_fp32": True})
    with pytest.raises(ConfigError, match=r"out of memory: stage 0 needs \d+\.\d GB per XPU, each H100 holds 85.9 GB "
                                          r"\(parameters 30.0 GB, gradients 32.1 GB, optimizer 12.0 GB"):
        prepare(scenario)


def test_the_distributed_optimizer_shards_over_the_context_parallel_ranks_too():
    """Megatron-LM builds the distributed optimizer on the data-parallel group with the context-parallel ranks:
    at cp 2 each rank holds half the optimizer state it holds at cp 1 with the same dp."""
    small = dict(platform="dgx-h100", workload="llama3-8b", zero=1, micro_batch=1, recompute="full",
                 workload_overrides={"model.decoders": 4})
    one = prepare(Scenario(**small, xpus=4, cp=1, global_batch=4)).placement.inventory
    two = prepare(Scenario(**small, xpus=8, cp=2, global_batch=4)).placement.inventory
    assert next(iter(two.values())).optimizer == pytest.approx(next(iter(one.values())).optimizer / 2, rel=1e-12)
