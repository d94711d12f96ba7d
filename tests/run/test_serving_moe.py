"""Mixture-of-experts serving (hcsim.workload.serving.expert_kernels): the expected distinct experts a step's
tokens route to, the bytes and FLOP each step charges for them, and Mixtral 8x7B served on the engine."""

from dataclasses import replace
from itertools import combinations, product
from math import comb

import pytest

from hcsim.engine.compute_model import load_compute_model
from hcsim.platform.devices import builtin_catalog
from hcsim.run.scenario import Scenario
from hcsim.run.serving import load_serving_spec, simulate_serving
from hcsim.workload.model import ModelShape
from hcsim.workload.serving import expert_kernels, kv_bytes_per_token, step_kernels, touched_experts
from hcsim.workload.transformer import active_parameters, model_parameters

MOE = ModelShape(name="moe", decoders=4, hidden=1024, heads=8, kv_heads=4, ffn=2048, experts=8, top_k=2,
                 mlp="swiglu", norm="rmsnorm", dropout=False, sequence=8192, vocabulary=32000, positions="rope")
MIXTRAL_4 = replace(MOE, name="mixtral-4", hidden=4096, heads=32, kv_heads=8, ffn=14336)  # Mixtral's layers, 4 of them
H100 = builtin_catalog()["H100"]


@pytest.mark.parametrize("experts, top_k, tokens", [(4, 2, 1), (4, 2, 2), (4, 2, 3), (5, 2, 3), (8, 2, 2),
                                                    (6, 3, 2), (4, 1, 4)])
def test_the_expected_distinct_experts_are_the_mean_over_every_routing(experts, top_k, tokens):
    """E·(1 - (1 - k/E)^n) against the mean, over every choice of each token's top-k set (all equally likely),
    of the number of distinct experts chosen."""
    choices = list(combinations(range(experts), top_k))
    total = sum(len(set().union(*routing)) for routing in product(choices, repeat=tokens))
    assert touched_experts(tokens, experts, top_k) == pytest.approx(total / len(choices) ** tokens, rel=1e-12)
    assert len(choices) == comb(experts, top_k)


def test_one_token_reads_its_top_k_experts_and_many_tokens_read_them_all():
    e = 2
    expert_bytes = 3 * MOE.hidden * MOE.ffn * e  # up (gate and up, SwiGLU) and down of one expert
    for tp in (1, 2):
        weights = {n: sum(op.bytes - n * MOE.top_k * (op.k + op.n) * e for op in expert_kernels(MOE, n, tp)
                          if op.name.startswith("expert_")) for n in (1, 4096)}
        assert weights[1] == pytest.approx(MOE.top_k * expert_bytes / tp, rel=1e-12)
        assert weights[4096] == pytest.approx(MOE.experts * expert_bytes / tp, rel=1e-9)  # (1 - 3/4)^4096 ~ 0


def test_the_expert_flop_are_each_token_s_top_k_experts():
    for tokens in (1, 7, 512):
        flops = sum(op.flops for op in expert_kernels(MOE, tokens, tp=2) if op.name.startswith("expert_"))
        assert flops == pytest.approx(tokens * MOE.top_k * 2 * 3 * MOE.hidden * MOE.ffn / 2, rel=1e-12)


def test_one_decode_step_of_one_sequence_reads_the_active_parameters_and_its_kv():
    """Batch 1 reads the non-expert weights and its token's top-k experts (the active parameters, less the
    embedding it looks up) and its KV cache, at the memory bandwidth (plus one token's activations, < 0.1 %)."""
    model = load_compute_model()
    factors = replace(model.device("H100"), launch=0.0)
    context = 3000
    kernels, kv = step_kernels(MIXTRAL_4, prompts=[], decode=1, context=context)
    streamed = sum(op.bytes for op in kernels) / (H100.memory_bandwidth * factors.memory_efficiency)
    time = sum(model.op_time(factors, op, H100.peaks["bf16"], H100.memory_bandwidth) for op in kernels)
    assert time == pytest.approx(streamed, rel=1e-9)
    weights = (active_parameters(MIXTRAL_4) - MIXTRAL_4.vocabulary * MIXTRAL_4.hidden) * 2
    assert active_parameters(MIXTRAL_4) < model_parameters(MIXTRAL_4)
    assert sum(op.bytes for op in kernels) == pytest.approx(weights + kv, rel=1e-3)
    assert kv == context * kv_bytes_per_token(MIXTRAL_4)


def test_mixtral_serves_every_request_once_and_a_batch_reads_more_experts_than_one_sequence():
    spec = load_serving_spec("workloads/mixtral-8x7b-serving.yaml", {"serving.requests": 24, "serving.rate": 12})
    assert (spec.model.experts, spec.model.top_k) == (8, 2)
    result = simulate_serving(Scenario(platform="dgx-h100", xpus=2, tp=2, workload="mixtral-8x7b-serving"), spec)
    assert sorted(row["request"] for row in result["per_request"]) == list(range(24))
    assert result["kv"]["weights_bytes_per_xpu"] == pytest.approx(model_parameters(spec.model) * 2 / 2)
    one = sum(op.bytes for op in expert_kernels(spec.model, 1, 2))
    sixteen = sum(op.bytes for op in expert_kernels(spec.model, 16, 2))
    assert sixteen > 3 * one  # 7.92 of 8 experts read against 2
