"""Kernel-level costs of the hybrid graph's compute vertices (hcsim.workload.ops)."""

import math
from dataclasses import replace

import pytest

from hcsim.workload.hybrid import Parallelism, block_costs, block_kernels, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.model import ModelShape, element_sizes
from hcsim.workload.ops import UPCAST, megatron_ops, ops_flops
from hcsim.workload.transformer import decoder_layer, lm_head
from hcsim.workload.spec import WorkloadSpec

SHAPE = ModelShape(name="gpt", decoders=4, hidden=512, heads=8, ffn=2048, sequence=256, vocabulary=1024)
SPEC = WorkloadSpec(name="gpt", model=SHAPE, precision="fp16", granularity="layer")
SIZES = element_sizes("fp16")


@pytest.mark.parametrize("attention", ["standard", "flash"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_blocks_kernels_add_up_to_its_flops(tp, attention):
    """Forward kernels = the block's forward FLOPs; backward = its input- and weight-gradient FLOPs; the core
    (what selective recomputation redoes) = the attention core's FLOPs."""
    spec = WorkloadSpec(name="gpt", model=SHAPE, precision="fp16", granularity="layer", attention=attention)
    for cost, ops in zip(block_costs(spec, 2, tp), block_kernels(spec, 2, tp)):
        assert ops_flops(ops.forward) == pytest.approx(cost.fwd_flops, rel=1e-12)
        assert ops_flops(ops.backward) == pytest.approx(cost.bwd_flops, rel=1e-12)
        assert ops_flops(ops.core) == pytest.approx(cost.core_flops, rel=1e-12)


@pytest.mark.parametrize("attention", ["standard", "flash"])
def test_megatron_kernels_are_the_transformer_ops_with_their_gemm_shapes(attention):
    """One model of a decoder: the kernels carry the ops' FLOPs and bytes (a fused bias-dropout-add moving the
    larger of its two ops' bytes), each GEMM its forward shape and the transposed shapes of its gradients."""
    layer = decoder_layer(SHAPE, micro_batch=2, tp=2, precision="fp16", attention=attention)
    kernels = megatron_ops(layer.ops)
    qkv = layer.op("qkv")
    forward, dgrad, wgrad = (next(k for k in kernels.forward + kernels.backward if k.name == name)
                             for name in ("qkv", "qkv.dgrad", "qkv.wgrad"))
    m, n, k = 2 * SHAPE.sequence, 3 * SHAPE.hidden // 2, SHAPE.hidden
    assert (forward.m, forward.n, forward.k) == (m, n, k) and forward.flops == 2 * m * n * k == qkv.forward.flops
    assert (dgrad.m, dgrad.n, dgrad.k) == (m, k, n) and (wgrad.m, wgrad.n, wgrad.k) == (k, n, m)
    assert forward.bytes == qkv.forward.bytes and dgrad.bytes == qkv.backward_input.bytes
    fused = next(k for k in kernels.forward if k.name == "bias_dropout_add_residual_mlp")
    assert fused.bytes == max(layer.op("dropout_mlp").forward.bytes, layer.op("residual_mlp").forward.bytes)
    unfused = sum(op.forward.bytes for op in layer.ops)
    assert sum(k.bytes for k in kernels.forward) < unfused
    core = {"standard": ["attention_scores", "softmax", "attention_dropout", "attention_context"],
            "flash": ["flash_attention"]}[attention]
    assert [k.name for k in kernels.core] == core
    head = megatron_ops(lm_head(SHAPE, micro_batch=2, tp=2, precision="fp16").ops)
    assert [k.name for k in head.forward[:2]] == ["final_norm", "logits"]
    assert [k.kind for k in head.forward[:2]] == ["reduction", "gemm"]


def test_megatron_loss_runs_its_unfused_kernels_over_fp32_logits():
    """Megatron-LM's vocabulary-parallel cross-entropy unfused: the upcast (an UPCAST kernel), max, sub, exp, sum,
    div over each logit of the rank's vocabulary slice (38 B a logit from FP16), backward the scaling and the cast
    back (14 B); the products with a row's value (broadcast) unvectorised, first in backward."""
    tp, b = 2, 2
    head = megatron_ops(lm_head(SHAPE, micro_batch=b, tp=tp, precision="fp16").ops, cross_entropy="none")
    logits = b * SHAPE.sequence * math.ceil(SHAPE.vocabulary / tp)
    loss = [k for k in head.forward if k.name.startswith("cross_entropy")]
    assert [k.name.split(".")[1] for k in loss] == ["float", "max", "sub_max", "exp", "sum", "div"]
    assert [k.kind for k in loss] == [UPCAST, "memory", "mixed", "memory", "memory", "mixed"]
    assert sum(k.bytes for k in loss) == 38 * logits
    back = [k for k in head.backward if k.name.startswith("cross_entropy")]
    assert [k.kind for k in back] == ["mixed", "memory"] and sum(k.bytes for k in back) == 14 * logits
    assert head.backward[:2] == tuple(back)


@pytest.mark.parametrize("fusion, forward, backward", [("none", 38, 14), ("native", 22, 10), ("te", 8, 14)])
def test_the_loss_kernels_follow_the_workload_s_cross_entropy_fusion(fusion, forward, backward):
    """training.cross_entropy_fusion reaches the graph's head: its loss kernels move the fusion's bytes a logit
    (BF16 logits), the rest of the head unchanged."""
    spec = replace(SPEC, precision="bf16", cross_entropy_fusion=fusion)
    par = Parallelism(tp=2, micro_batch=1, global_batch=1)
    graph = build_hybrid_graph(spec, par, ParallelLayout(["x0", "x1"], {"tp": 2}))
    logits = SHAPE.sequence * math.ceil(SHAPE.vocabulary / 2)
    for phase, expected in (("fwd", forward), ("bwd", backward)):
        head = next(d for n, d in graph.nodes(data=True) if n.endswith(".head") and d.get("phase") == phase)
        loss = [k for k in head["ops"] if k.name.startswith("cross_entropy")]
        assert sum(k.bytes for k in loss) == pytest.approx(expected * logits)
        assert len(head["ops"]) - len(loss) == (2 if phase == "fwd" else 3)  # norm and GEMM; backward its two gradients and the norm's


def test_sequence_parallelism_splits_the_replicated_kernels_over_the_tp_group():
    """Without SP every TP rank runs the norms and bias-dropout-adds on all tokens; with SP on 1/t of them."""
    tp = 4
    plain, split = (block_kernels(SPEC, 1, tp, sequence_parallel=sp)[0] for sp in (False, True))
    for a, b in zip(plain.forward, split.forward):
        if a.name.startswith(("norm", "bias_dropout_add")):
            weights = 2 * SHAPE.hidden * SIZES.weight if a.name.startswith("norm") else 0.0  # read either way
            assert b.bytes - weights == pytest.approx((a.bytes - weights) / tp)
        else:
            assert b == a


def test_every_compute_vertex_of_a_hybrid_graph_carries_kernels_of_its_flops():
    par = Parallelism(tp=2, pp=2, micro_batch=1, global_batch=4, recompute="selective", sequence_parallel=True)
    graph = build_hybrid_graph(SPEC, par, ParallelLayout([f"x{i}" for i in range(4)], {"tp": 2, "pp": 2}))
    for name, data in graph.nodes(data=True):
        if data["kind"] == "compute" and data.get("phase") != "optimizer" and ".head" not in name \
                and ".embedding" not in name:
            assert ops_flops(data["ops"]) == pytest.approx(data["flops"], rel=1e-12), name
    optimizer = graph.nodes["s0.optimizer"]["ops"]  # FP16: 16-bit main gradients, cast to FP32 for the step
    assert [op.name for op in optimizer] == ["main_grad_cast", "optimizer", "zero_grad_buffer"]
    assert [op.kind for op in optimizer] == [UPCAST, "multi_tensor", "memory"] and all(op.bytes > 0 for op in optimizer)


def test_the_optimizer_step_moves_megatrons_bytes_per_parameter_and_zeroes_the_whole_gradient_buffer():
    """Per parameter of the shard: the multi_tensor kernels' 38 B (BF16, FP8) or 46 B (FP16, + the unscale), the
    cast of 16-bit main gradients (2 + 4 B); the zeroing covers the whole buffer at the main gradients' size,
    which the distributed optimizer (ZeRO 1) does not shard."""
    def moved(precision, zero, dp=4):
        spec = WorkloadSpec(name="gpt", model=SHAPE, precision=precision, granularity="layer")
        par = Parallelism(dp=dp, micro_batch=1, global_batch=dp, zero=zero)
        graph = build_hybrid_graph(spec, par, ParallelLayout([f"x{i}" for i in range(dp)], {"dp": dp}))
        return {op.name: op.bytes for op in graph.nodes["s0.optimizer"]["ops"]}, spec

    for precision, zero in (("bf16", 0), ("fp16", 0), ("fp8", 1), ("bf16", 1)):
        ops, spec = moved(precision, zero)
        shard = ops["optimizer"] / {"fp16": 46.0, "bf16": 38.0, "fp8": 38.0}[precision]
        assert ops["zero_grad_buffer"] == pytest.approx(shard * (4 if zero else 1) * spec.main_gradient)
        assert ops.get("main_grad_cast", 0.0) == pytest.approx(shard * 6.0 if spec.main_gradient == 2 else 0.0)
    assert moved("bf16", 0)[0]["optimizer"] == pytest.approx(moved("bf16", 1)[0]["optimizer"] * 4)


def test_without_gradient_accumulation_fusion_each_weight_gradient_is_added_to_the_main_gradients():
    """Megatron-LM's hook (main_grad.add_(grad)) after every backward: read the buffer and the 16-bit gradient,
    write the buffer, once per weight of every op that has weights, in the pass that computes weight gradients."""
    spec = WorkloadSpec(name="gpt", model=SHAPE, precision="fp16", granularity="layer",
                        gradient_accumulation_fusion=False)
    assert spec.main_gradient == 2.0 and spec.gradient_add == 6.0
    assert replace(spec, grad_reduce_in_fp32=True).gradient_add == 10.0
    fused = block_kernels(replace(spec, gradient_accumulation_fusion=True), 1, 2)
    for blocks, plain in zip(block_kernels(spec, 1, 2), fused):
        adds = [k for k in blocks.backward if ".main_grad_add" in k.name]
        assert [k for k in blocks.backward if ".main_grad_add" not in k.name] == list(plain.backward)
        assert adds and all(k.name.endswith(".wgrad") and k.kind == "memory" for k in adds)
        assert blocks.forward == plain.forward
    layer = decoder_layer(SHAPE, micro_batch=1, tp=2)
    added = sum(k.bytes for b in block_kernels(spec, 1, 2) for k in b.backward if ".main_grad_add" in k.name)
    assert added == pytest.approx(6.0 * sum(op.parameters for op in layer.ops)) and added > 0


def test_only_a_weight_dimension_not_a_multiple_of_8_makes_a_gemm_unaligned():
    """What was measured slow is an unaligned weight width (GPT-2's 50257-wide head), every one with an aligned
    token count; the token dimension (m forward and for the input gradient, k for the weight gradient) is never
    a leading dimension, so 2,049 tokens run cuBLAS's aligned kernels."""
    from hcsim.workload.ops import _gemm, _gemm_backward

    assert _gemm("proj", 2049, 8192, 8192, 2.0).kind == "gemm"
    assert _gemm("logits", 2048, 50257, 768, 2.0).kind == "gemm_unaligned"
    assert _gemm("proj", 2048, 8192, 8190, 2.0).kind == "gemm_unaligned"
    dgrad, wgrad = _gemm_backward(_gemm("proj", 2049, 768, 768, 2.0), 2.0)
    assert (dgrad.m, wgrad.k) == (2049, 2049) and dgrad.kind == wgrad.kind == "gemm"
    dgrad, wgrad = _gemm_backward(_gemm("logits", 2048, 50257, 768, 2.0), 2.0)
    assert dgrad.kind == wgrad.kind == "gemm_unaligned"
    assert _gemm("gemm", 2049, 8192, 8192, 2.0, tokens="").kind == "gemm_unaligned"  # no token dimension


def test_each_kernel_inventory_says_what_it_needs():
    from hcsim.workload.ops import INVENTORIES, KERNEL_INVENTORIES

    assert KERNEL_INVENTORIES == tuple(INVENTORIES) == ("megatron", "pytorch-eager", "torch-compile")
    megatron, eager, compiled = (INVENTORIES[name] for name in KERNEL_INVENTORIES)
    assert megatron.fused and not megatron.needs_hybrid_graph and not megatron.needs_kernel_model
    assert "fp8" in megatron.precisions and megatron.precisions[0] == "fp32"  # the paper's default
    for pytorch in (eager, compiled):  # PyTorch's kernels exist only in the hybrid graph, timed by the kernel model
        assert pytorch.needs_hybrid_graph and pytorch.needs_kernel_model and pytorch.precisions[0] == "bf16"
    assert compiled.compiled and not eager.compiled


def test_a_workload_refuses_a_precision_its_inventory_does_not_run():
    from hcsim.errors import ConfigError

    shape = ModelShape(name="tiny", decoders=2, hidden=64, heads=4, ffn=256, sequence=32, vocabulary=128)
    assert WorkloadSpec(name="w", model=shape, kernels="pytorch-eager", precision="bf16").inventory.name == "pytorch-eager"
    with pytest.raises(ConfigError, match=r"training.kernels torch-compile .* in bf16 or fp16, not fp8"):
        WorkloadSpec(name="w", model=shape, kernels="torch-compile", precision="fp8")


def test_the_loss_fusion_is_a_workload_key_and_a_bad_one_is_refused_by_name():
    """native by default (NeMo's GPTConfig), none for the 2022 GPT runs; a wrong value names the key and the three."""
    from hcsim.errors import ConfigError
    from hcsim.workload.spec import load_workload_spec

    assert load_workload_spec("llama3-8b").cross_entropy_fusion == "native"
    assert load_workload_spec("gpt-megatron").cross_entropy_fusion == "none"
    assert load_workload_spec("llama3-8b", {"training.cross_entropy_fusion": "te"}).cross_entropy_fusion == "te"
    with pytest.raises(ConfigError, match=r"cross_entropy_fusion.*'triton'.*none, native, te"):
        load_workload_spec("llama3-8b", {"training.cross_entropy_fusion": "triton"})


@pytest.mark.parametrize("dp, cp, zero", [(1, 1, 0), (2, 1, 0), (1, 2, 1), (4, 1, 2)])
def test_megatron_scales_the_gradient_buffer_before_reducing_it_over_dp_x_cp(dp, cp, zero):
    """Megatron-LM's DistributedDataParallel multiplies its gradient buffer by 1/(dp x cp) before the reduction:
    one read and one write of the rank's buffer (sharded under ZeRO 2-3 as the zeroing is) where dp x cp > 1."""
    from hcsim.workload.hybrid import optimizer_kernels

    spec = replace(SPEC, precision="bf16")
    par = Parallelism(dp=dp, cp=cp, zero=zero, micro_batch=1, global_batch=dp * 4)
    kernels = {k.name: k for k in optimizer_kernels(spec, par, 1000.0, 1)}
    buffer = 1000.0 / (dp if zero >= 2 else 1)
    assert kernels["zero_grad_buffer"].bytes == buffer * spec.main_gradient
    if dp * cp > 1:
        assert kernels["scale_grad_buffer"].bytes == 2 * buffer * spec.main_gradient
    else:
        assert "scale_grad_buffer" not in kernels


def test_the_megatron_only_keys_given_to_a_pytorch_inventory_are_said_to_have_no_effect(monkeypatch, caplog):
    """gradient_accumulation_fusion and cross_entropy_fusion change Megatron-LM's kernels only: given to a PyTorch
    inventory, each is said once (nothing for a megatron workload)."""
    import logging

    import hcsim.errors as errors
    from hcsim.workload.spec import load_workload_spec

    monkeypatch.setattr(errors, "_SAID", set())
    keys = {"training.gradient_accumulation_fusion": False, "training.cross_entropy_fusion": "te"}
    with caplog.at_level(logging.WARNING, logger="hcsim.workload.spec"):
        load_workload_spec("llama3-8b", keys)
        load_workload_spec("gpt2-hf", keys)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all("applies to training.kernels megatron; pytorch-eager" in m for m in said), said
    assert "training.gradient_accumulation_fusion" in said[0] and "training.cross_entropy_fusion" in said[1]
