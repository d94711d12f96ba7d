"""Closed forms of hcsim.workload.memory: ZeRO state and traffic, activations, in-flight micro-batches."""

import pytest

from hcsim.errors import ConfigError
from hcsim.workload import ModelShape, load_workload_spec
from hcsim.workload.memory import (distributed_optimizer_bytes_per_parameter, in_flight_microbatches,
                                   layer_activation_bytes, output_activation_bytes, stage_memory,
                                   state_bytes_per_parameter, zero_bytes_per_parameter, zero_state,
                                   zero_traffic_elements)
from hcsim.workload.transformer import model_parameters

PSI = 7.5e9  # the ZeRO paper's running example


def test_training_state_is_16_bytes_per_parameter_with_adam():
    assert state_bytes_per_parameter("fp32") == 4 + 4 + 8
    assert state_bytes_per_parameter("bf16") == state_bytes_per_parameter("fp16") == 2 + 2 + 12


@pytest.mark.parametrize("dp", [1, 2, 8, 64, 1024])
def test_zero_stages_mixed_precision(dp):
    """Rajbhandari et al. 2020, Fig. 1: 16Ψ, 4Ψ + 12Ψ/N_d, 2Ψ + 14Ψ/N_d, 16Ψ/N_d."""
    expected = [16 * PSI, 4 * PSI + 12 * PSI / dp, 2 * PSI + 14 * PSI / dp, 16 * PSI / dp]
    for stage, bytes_ in enumerate(expected):
        assert zero_state(PSI, dp, stage).total == pytest.approx(bytes_, rel=1e-12)
        assert zero_bytes_per_parameter(dp, stage) * PSI == pytest.approx(bytes_, rel=1e-12)
    assert zero_state(PSI, 64, 0).total == 120e9  # the paper's 7.5B example: 120 GB baseline ...
    assert zero_state(PSI, 64, 3).total == pytest.approx(1.875e9)  # ... 1.9 GB with stage 3 over 64 GPUs


def test_zero_stages_fp32():
    """FP32 + Adam: w = g = 4, K = 8."""
    dp = 16
    expected = [16 * PSI, 8 * PSI + 8 * PSI / dp, 4 * PSI + 12 * PSI / dp, 16 * PSI / dp]
    assert [zero_state(PSI, dp, s, precision="fp32").total for s in range(4)] == pytest.approx(expected, rel=1e-12)


def test_distributed_optimizer():
    """Megatron-LM: 6 + 12/d bytes per parameter (BF16 weights, FP32 gradients); 8 + 8/d in FP32."""
    for d in (1, 8, 128):
        assert distributed_optimizer_bytes_per_parameter(d) == 6 + 12 / d
        assert distributed_optimizer_bytes_per_parameter(d, weight=4, gradient=4, optimizer=8) == 8 + 8 / d
    # with BF16 gradients it is ZeRO stage 1
    assert distributed_optimizer_bytes_per_parameter(8, gradient=2) == zero_bytes_per_parameter(8, 1)


def test_zero_traffic():
    """2Ψ per rank for ZeRO 0-2, 3Ψ for ZeRO-3; the ring's (N_d - 1)/N_d on request."""
    assert [zero_traffic_elements(PSI, s) for s in range(4)] == [2 * PSI, 2 * PSI, 2 * PSI, 3 * PSI]
    assert zero_traffic_elements(PSI, 3, dp=4) == 3 * PSI * 3 / 4
    assert zero_traffic_elements(PSI, 0, dp=1) == 0


def test_activation_closed_forms():
    s, b, h, a = 2048, 4, 12288, 96
    sbh = s * b * h
    assert layer_activation_bytes(sequence=s, micro_batch=b, hidden=h, heads=a) == sbh * (34 + 5 * a * s / h)
    for t in (2, 8):
        kw = dict(sequence=s, micro_batch=b, hidden=h, heads=a, tp=t)
        assert layer_activation_bytes(**kw) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
        assert layer_activation_bytes(**kw, sequence_parallel=True) == pytest.approx(
            sbh * (34 + 5 * a * s / h) / t, rel=1e-12)
        assert layer_activation_bytes(**kw, recompute="selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)
        assert layer_activation_bytes(**kw, sequence_parallel=True, recompute="selective") == pytest.approx(
            sbh * 34 / t, rel=1e-12)
        assert layer_activation_bytes(**kw, recompute="full") == 2 * sbh
        assert layer_activation_bytes(**kw, sequence_parallel=True, recompute="full") == 2 * sbh / t


@pytest.mark.parametrize("p, m", [(1, 1), (4, 2), (4, 8), (8, 8), (8, 64)])
def test_in_flight_gpipe_1f1b_zb(p, m):
    for i in range(p):
        assert in_flight_microbatches("gpipe", stage=i, stages=p, microbatches=m) == m
        assert in_flight_microbatches("1f1b", stage=i, stages=p, microbatches=m) == min(p - i, m)
        assert in_flight_microbatches("zb-h1", stage=i, stages=p, microbatches=m) == min(p, m)
        assert in_flight_microbatches("interleaved", stage=i, stages=p, microbatches=m, virtual_stages=1) == \
            min(p - i, m)


@pytest.mark.parametrize("p, v", [(2, 2), (4, 2), (8, 4), (16, 3)])
def test_in_flight_interleaved(p, v):
    """Megatron-LM theoretical_memory_usage.py: the first stage holds p·(1 + (p-1)/(p·v)) micro-batches."""
    m = 4 * p
    counts = [in_flight_microbatches("interleaved", stage=i, stages=p, microbatches=m, virtual_stages=v)
              for i in range(p)]
    assert counts[0] == pytest.approx(p * (1 + (p - 1) / (p * v)), rel=1e-12)
    assert all(a > b for a, b in zip(counts, counts[1:]))  # fewer warm-up forwards further down the pipe
    assert all(c > min(p - i, m) for i, c in enumerate(counts[:-1]))  # interleaving costs memory
    # few micro-batches: every forward chunk runs before the first backward
    assert in_flight_microbatches("interleaved", stage=0, stages=p, microbatches=1, virtual_stages=v) == 1


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 1),
                                         ("interleaved", 2), ("interleaved", 3)])
def test_in_flight_closed_forms_agree_with_the_schedules(schedule, v):
    """The closed forms against the op orders of hcsim.workload.schedules (counted pass by pass)."""
    from hcsim.workload.hybrid import in_flight
    from hcsim.workload.schedules import stage_order

    for p in (1, 2, 3, 4, 8):
        for m in (1, 2, 3, 4, 5, 8, 16, 24):
            if schedule == "interleaved" and (p == 1 or m % p):
                continue  # interleaving needs pp > 1 and, as Megatron-LM's, m a multiple of p
            for i in range(p):
                order = stage_order(schedule, stages=p, micro_batches=m, stage=i, chunks=v)
                closed = in_flight_microbatches(schedule, stage=i, stages=p, microbatches=m, virtual_stages=v)
                assert in_flight(order) == closed * v, (p, m, i)


@pytest.mark.parametrize("call, message", [
    (dict(schedule="pipedream"), "schedule: 'pipedream' is not one of"),
    (dict(stage=4), "stage: 4 is not a stage of a 4-stage pipeline"),
    (dict(stage=-1), "stage: -1 is not a stage"),
    (dict(virtual_stages=2), "virtual_stages 2 needs schedule 'interleaved'"),
    (dict(microbatches=0), "microbatches: must be an integer >= 1"),
])
def test_in_flight_errors(call, message):
    arguments = dict(schedule="1f1b", stage=0, stages=4, microbatches=8) | call
    schedule = arguments.pop("schedule")
    with pytest.raises(ConfigError, match=message):
        in_flight_microbatches(schedule, **arguments)


def test_zero_errors():
    with pytest.raises(ConfigError, match="zero stage: 4 is not one of 0, 1, 2, 3"):
        zero_state(PSI, 8, 4)
    with pytest.raises(ConfigError, match="dp: must be an integer >= 1"):
        zero_state(PSI, 0, 1)
    with pytest.raises(ConfigError, match="precision: 'int8' is not one of"):
        zero_state(PSI, 8, 3, precision="int8")


def test_stage_memory_of_gpt3_on_8x8():
    """GPT-3 175B with TP 8, PP 8, SP, 1F1B, m = 64 (Korthikanti et al.'s configuration): the per-stage
    memory is the closed forms: 16 B per parameter, in-flight micro-batches x Korthikanti's activations."""
    shape = ModelShape(name="gpt3", decoders=96, hidden=12288, heads=96, ffn=4 * 12288, sequence=2048,
                       vocabulary=51200, positions="learned", bias=True, tied_embeddings=True)
    p, t, s, b, h, a, v = 8, 8, 2048, 1, 12288, 96, 51200
    stages = []
    for i in range(p):
        in_flight = in_flight_microbatches("1f1b", stage=i, stages=p, microbatches=64)
        stages.append(stage_memory(shape, layers=96 // p, first=i == 0, last=i == p - 1, in_flight=in_flight,
                                   micro_batch=b, tp=t, sequence_parallel=True, recompute="selective"))
        layer = layer_activation_bytes(sequence=s, micro_batch=b, hidden=h, heads=a, tp=t, sequence_parallel=True,
                                       recompute="selective")
        outside = 0.0
        if i == 0:  # the embedding's dropout mask
            outside += s * b * h / t
        if i == p - 1:  # final norm and logits inputs, FP32 logits
            outside += output_activation_bytes(sequence=s, micro_batch=b, hidden=h, vocabulary=v, tp=t,
                                               sequence_parallel=True) - s * b * h / t
        assert stages[-1].activations == pytest.approx(in_flight * (12 * layer + outside), rel=1e-12)
        assert stages[-1].state.total == 16 * stages[-1].parameters
    # every parameter is on some stage, the tied output layer twice (first and last stage), 1/t per rank
    # but for the replicated norms, positions and row-parallel biases
    held = sum(stage.parameters for stage in stages) * t
    replicated = s * h + 96 * (4 * h + 2 * h) + 2 * h  # positions; per layer 2 LayerNorms, 2 row-parallel biases
    assert held == model_parameters(shape) + v * h + (t - 1) * replicated
    assert stages[0].activations > stages[-1].activations  # 8 micro-batches in flight against 1


def test_stage_memory_with_zero():
    shape = load_workload_spec("llama3-8b").model
    whole = stage_memory(shape, layers=32, first=True, last=True, in_flight=1, dp=8, zero_stage=0)
    sharded = stage_memory(shape, layers=32, first=True, last=True, in_flight=1, dp=8, zero_stage=3)
    assert whole.parameters == sharded.parameters == model_parameters(shape)
    assert sharded.state.total == pytest.approx(whole.state.total / 8, rel=1e-12)
    assert sharded.activations == whole.activations
    with pytest.raises(ConfigError, match="layers: must be an integer >= 0"):
        stage_memory(shape, layers=-1, first=True, last=False, in_flight=1)
