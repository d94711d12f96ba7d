"""FP8 training as Transformer Engine runs it (precision: fp8): FP8 GEMMs in the decoder layers, the rest BF16."""

import json
import subprocess
import sys

import pytest

from hcsim.engine.compute_model import gemm_utilization, load_compute_model
from hcsim.errors import ConfigError
from hcsim.platform.devices import builtin_catalog
from hcsim.workload.memory import zero_state
from hcsim.workload.model import ModelShape, element_sizes
from hcsim.workload import load_workload_spec
from hcsim.workload.ops import FP8_RECIPES, Op, megatron_ops, optimizer_step_ops
from hcsim.workload.spec import WorkloadSpec
from hcsim.workload.transformer import decoder_layer, lm_head

MODEL = load_compute_model()
H100 = builtin_catalog()["H100"]
SHAPE = ModelShape(name="llama", decoders=2, hidden=4096, heads=32, kv_heads=8, ffn=14336, mlp="swiglu",
                   norm="rmsnorm", dropout=False, sequence=4096, vocabulary=128256, positions="rope")


def gemm(kind, m, n, k):
    return Op("g", kind, 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), m, n, k, 1)


def test_an_fp8_gemm_takes_half_the_time_only_where_compute_bound():
    """Compute-bound: BF16 time / FP8 time = the measured FP8 speedup (about 2) times the ratio of the two fills
    (the FP8 kernels' is longer: a short K gains less); memory-bound: the same time."""
    f = MODEL.device("H100")
    peak, bandwidth = H100.peaks["bf16"], H100.memory_bandwidth
    assert 1.7 < f.fp8_gemm_speedup < 2.0 and f.fp8_gemm_k_half > f.gemm_k_half
    for k in (512, 8192):
        bf16, fp8 = (MODEL.op_time(f, gemm(kind, 8192, 8192, k), peak, bandwidth) for kind in ("gemm", "gemm8"))
        fills = gemm_utilization(8192, 8192, k, f.sms, f.fp8_gemm_k_half) / gemm_utilization(8192, 8192, k, f.sms,
                                                                                        f.gemm_k_half)
        assert bf16 / fp8 == pytest.approx(f.fp8_gemm_speedup * fills, rel=1e-12)
    assert 1.2 < f.fp8_gemm_speedup * (512 / (512 + f.fp8_gemm_k_half)) / (512 / (512 + f.gemm_k_half)) < 1.5
    skinny = [MODEL.op_time(f, gemm(kind, 1, 8192, 8192), peak, bandwidth) for kind in ("gemm", "gemm8")]
    assert skinny[0] == skinny[1]


def test_a_device_without_fp8_factors_is_refused_by_name():
    with pytest.raises(ConfigError, match="'A100' has no FP8 GEMM factors"):
        MODEL.op_time(MODEL.device("A100"), gemm("gemm8", 4096, 4096, 4096), 312e12, 2e12)


def test_transformer_engine_keeps_an_fp8_weight_and_its_transpose():
    """18 B per parameter: BF16 weight and gradient (2 + 2), FP32 master and Adam (12), FP8 copies (1 + 1)."""
    assert element_sizes("fp8").state == 18.0
    assert zero_state(1.0, 1, 0, precision="fp8").weights == 4.0
    assert zero_state(1.0, 8, 1, precision="fp8").total == pytest.approx(4 + 2 + 12 / 8)


def test_an_fp8_layer_runs_its_gemms_in_fp8_with_casts_and_keeps_fp8_inputs():
    fp8, bf16 = (decoder_layer(SHAPE, micro_batch=1, tp=1, precision=p, attention="flash") for p in ("fp8", "bf16"))
    kernels = megatron_ops(fp8.ops)
    gemms = [k for k in kernels.forward if k.kind.startswith("gemm")]
    assert gemms and all(k.kind == "gemm8" for k in gemms)
    casts = [k for k in kernels.forward if k.name.endswith((".cast_transpose_fp8", ".transpose_fp8"))]
    assert len(casts) == len(gemms)
    assert all(k.kind == "gemm8" for k in kernels.backward if k.name.endswith(("dgrad", "wgrad")))
    assert [k.kind for k in megatron_ops(lm_head(SHAPE, precision="fp8").ops).forward if k.name == "logits"] == ["gemm"]
    assert fp8.forward.flops == bf16.forward.flops
    assert fp8.activation_bytes() < bf16.activation_bytes()
    cast = optimizer_step_ops(1e6, "fp8")
    assert [k.name for k in cast] == ["optimizer", "zero_grad_buffer", "fp8_weights.cast_transpose_fp8",
                                      "fp8_scale_update"]
    assert cast[2].bytes == 4e6  # BF16 read, FP8 weight and transpose written, once a step


def test_fp8_is_refused_for_a_pytorch_autocast_inventory():
    with pytest.raises(ConfigError, match="not fp8"):
        WorkloadSpec(name="x", model=SHAPE, precision="fp8", kernels="pytorch-eager")


def simulate(*settings):
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", "--json", "--set=workload=llama3-8b",
                           "--set=xpus=8", "--set=tp=8", "--set=micro_batch=1", "--set=global_batch=2",
                           "--set=compute_model=roofline", "--set=recompute=full",
                           "--set=workload_overrides={model.decoders: 2}", *settings],
                          capture_output=True, text=True, timeout=600)
    return done


def test_an_fp8_step_on_h100_is_faster_than_bf16_and_an_a100_refuses_it():
    times = {}
    for precision in ("bf16", "fp8"):
        done = simulate("--set=platform=dgx-h100", f"--set=precision={precision}")
        assert done.returncode == 0, done.stderr
        times[precision] = json.loads(done.stdout)["iteration_time_s"]
    assert times["fp8"] < times["bf16"] < 2 * times["fp8"]
    refused = simulate("--set=platform=dgx-a100", "--set=precision=fp8")
    assert refused.returncode == 2 and "fp8" in refused.stderr and "A100" in refused.stderr


@pytest.mark.parametrize("recipe", FP8_RECIPES)
def test_each_fp8_gemm_quantizes_its_input_and_its_output_gradient_as_the_recipe_says(recipe):
    """Transformer Engine on Hopper: before each FP8 GEMM the BF16 input is cast to FP8 with its transpose in one
    fused kernel (2 B read, 1 + 1 B written per element of the m x k input), before its backward GEMMs the output
    gradient likewise (m x n); current scaling first reads each tensor once more for its amax. A GEMM after a
    norm (LayerNormLinear: qkv, mlp_in) has the norm quantize: under delayed scaling the norm writes FP8 (half
    its output's bytes fewer) and a transpose follows (1 B read, 1 B written), under current scaling the norm
    records the amax, so only the cast-transpose follows."""
    layer = decoder_layer(SHAPE, micro_batch=1, tp=1, precision="fp8", attention="flash")
    kernels = megatron_ops(layer.ops, recipe)
    amax = recipe == "current"
    after_norm = {"qkv", "mlp_in"}
    for before, op in zip(layer.ops, layer.ops[1:]):
        if op.kernel != "gemm8":
            continue
        assert (before.kind == "norm") == (op.name in after_norm)
        m, n, k, batch = op.shape
        i = next(i for i, x in enumerate(kernels.forward) if x.name == op.name)
        if op.name in after_norm:
            fused = recipe == "delayed"
            quantize = kernels.forward[i - 1]
            assert quantize.name == f"{op.name}.{'transpose_fp8' if fused else 'cast_transpose_fp8'}"
            assert quantize.bytes == (2.0 if fused else 4.0) * m * k * batch
            norm = kernels.forward[i - 2]
            assert norm.name == before.name  # writing FP8: half its BF16 output (the size it saves) fewer bytes
            assert norm.bytes == before.forward.bytes - (before.saved / 2 if fused else 0.0)
            continue
        ahead = kernels.forward[i - 1 - amax:i]
        assert [x.name for x in ahead] == [f"{op.name}.amax"] * amax + [f"{op.name}.cast_transpose_fp8"]
        assert ahead[-1].bytes == 4.0 * m * k * batch and (not amax or ahead[0].bytes == 2.0 * m * k * batch)
        j = next(j for j, x in enumerate(kernels.backward) if x.name == f"{op.name}.dgrad")
        behind = kernels.backward[j - 1 - amax:j]
        assert [x.name for x in behind] == [f"{op.name}.bwd.amax"] * amax + [f"{op.name}.bwd.cast_transpose_fp8"]
        assert behind[-1].bytes == 4.0 * m * n * batch
    assert not [x for x in kernels.backward if "transpose_fp8" in x.name and ".bwd." not in x.name]


def test_current_scaling_adds_an_amax_pass_and_delayed_scaling_a_scale_update_per_step():
    delayed, current = (optimizer_step_ops(1e6, "fp8", fp8_recipe=r) for r in FP8_RECIPES)
    assert [k.name for k in current] == ["optimizer", "zero_grad_buffer", "fp8_weights.amax",
                                         "fp8_weights.cast_transpose_fp8"]
    assert current[2].kind == "reduction" and current[2].bytes == 2e6
    assert delayed[-1].name == "fp8_scale_update" and delayed[-1].bytes == 0.0  # a launch, its bytes negligible
    f = MODEL.device("H100")
    layer = decoder_layer(SHAPE, micro_batch=1, tp=1, precision="fp8", attention="flash")
    times = {r: sum(MODEL.op_time(f, k, H100.peaks["bf16"], H100.memory_bandwidth)
                    for k in megatron_ops(layer.ops, r).forward) for r in FP8_RECIPES}
    assert times["delayed"] < times["current"]


def test_the_recipe_is_a_workload_key_and_a_bad_one_is_refused_by_name():
    spec = load_workload_spec("llama3-8b", {"training.precision": "fp8", "training.fp8_recipe": "current"})
    assert spec.fp8_recipe == "current" and load_workload_spec("llama3-8b").fp8_recipe == "delayed"
    with pytest.raises(ConfigError, match=r"fp8_recipe.*'mxfp8'.*delayed, current"):
        load_workload_spec("llama3-8b", {"training.fp8_recipe": "mxfp8"})


def test_the_weights_are_quantized_whole_once_a_step_whatever_the_optimizer_shards():
    """Megatron-LM's distributed optimizer updates a shard, all-gathers the BF16 weights, and Transformer Engine
    casts every FP8 GEMM weight of the rank on the step's first micro-batch (not the embedding or output layer)."""
    from hcsim.workload.hybrid import Parallelism, build_hybrid_graph
    from hcsim.workload.layout import ParallelLayout

    spec = load_workload_spec("llama3-8b", {"training.precision": "fp8", "model.decoders": 2, "model.sequence": 512})
    par = Parallelism(tp=1, pp=1, dp=2, micro_batch=1, global_batch=4, zero=1)
    graph = build_hybrid_graph(spec, par, ParallelLayout(["x0", "x1"], {"tp": 1, "pp": 1, "dp": 2}))
    ops = next(d["ops"] for _, d in graph.nodes(data=True) if d.get("phase") == "optimizer")
    layer = decoder_layer(spec.model, micro_batch=1, sequence=512, precision="fp8", attention="flash")
    fp8 = 2 * sum(op.parameters for op in layer.ops if op.kernel == "gemm8")
    assert next(k for k in ops if k.name == "fp8_weights.cast_transpose_fp8").bytes == 4.0 * fp8
