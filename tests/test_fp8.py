"""FP8 training as Transformer Engine runs it (precision: fp8): FP8 GEMMs in the decoder layers, the rest BF16."""

import json
import subprocess
import sys

import pytest

from hcsim.engine.compute_model import load_compute_model
from hcsim.errors import ConfigError
from hcsim.platform.devices import builtin_catalog
from hcsim.workload.memory import zero_state
from hcsim.workload.model import ModelShape, element_sizes
from hcsim.workload.ops import Op, megatron_ops, optimizer_step_ops
from hcsim.workload.spec import WorkloadSpec
from hcsim.workload.transformer import decoder_layer, lm_head

MODEL = load_compute_model()
H100 = builtin_catalog()["H100"]
SHAPE = ModelShape(name="llama", decoders=2, hidden=4096, heads=32, kv_heads=8, ffn=14336, mlp="swiglu",
                   norm="rmsnorm", dropout=False, sequence=4096, vocabulary=128256, positions="rope")


def gemm(kind, m, n, k):
    return Op("g", kind, 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), m, n, k, 1)


def test_an_fp8_gemm_takes_half_the_time_only_where_compute_bound():
    """Compute-bound: BF16 time / FP8 time = the measured FP8 speedup (about 2); memory-bound: the same time."""
    f = MODEL.device("H100")
    peak, bandwidth = H100.peaks["bf16"], H100.memory_bandwidth
    big = [MODEL.op_time(f, gemm(kind, 8192, 8192, 8192), peak, bandwidth) for kind in ("gemm", "gemm8")]
    assert big[0] / big[1] == pytest.approx(f.fp8_gemm_speedup, rel=1e-12)
    assert 1.7 < f.fp8_gemm_speedup < 2.0
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
    casts = [k for k in kernels.forward if k.name.endswith(".cast_fp8")]
    assert len(casts) == len(gemms)
    assert all(k.kind == "gemm8" for k in kernels.backward if k.name.endswith(("dgrad", "wgrad")))
    assert [k.kind for k in megatron_ops(lm_head(SHAPE, precision="fp8").ops).forward if k.name == "logits"] == ["gemm"]
    assert fp8.forward.flops == bf16.forward.flops
    assert fp8.activation_bytes() < bf16.activation_bytes()
    cast = optimizer_step_ops(1e6, "fp8")
    assert [k.name for k in cast] == ["optimizer", "fp8_weight_cast"] and cast[1].bytes == 4e6


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
