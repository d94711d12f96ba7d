"""Inference serving (hcsim.run.serving, hcsim.workload.serving): closed forms of a step, the KV cache, and continuous
batching that loses or duplicates no request."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from hcsim.engine.compute_model import load_compute_model
from hcsim.errors import ConfigError
from hcsim.platform.devices import builtin_catalog
from hcsim.run.scenario import Scenario
from hcsim.run.report import RUN_OUTPUTS
from hcsim.run.serving import _replica, _step_time, percentiles, simulate_serving
from hcsim.workload.model import ModelShape
from hcsim.workload.serving import ServingSpec, kv_bytes_per_token, make_requests, step_kernels
from hcsim.workload.transformer import model_parameters

MODEL = ModelShape(name="llama", decoders=4, hidden=4096, heads=32, kv_heads=8, ffn=14336, mlp="swiglu",
                   norm="rmsnorm", dropout=False, sequence=8192, vocabulary=32000, positions="rope")
H100 = builtin_catalog()["H100"]


def test_the_kv_cache_of_a_token_is_layers_x_2_x_kv_heads_x_head_dim_x_bytes():
    assert kv_bytes_per_token(MODEL) == 4 * 2 * 8 * 128 * 2
    assert kv_bytes_per_token(MODEL, "fp16") == kv_bytes_per_token(MODEL, "bf16")


def test_one_decode_step_of_one_sequence_reads_the_weights_and_its_kv_at_the_memory_bandwidth():
    """Batch 1 is memory-bound everywhere: the step takes its kernels' bytes over the achieved bandwidth, and
    those bytes are the weights and the sequence's KV cache (plus activations of one token, < 0.1 %)."""
    model = load_compute_model()
    factors = replace(model.device("H100"), launch=0.0)
    context = 4000
    kernels, kv = step_kernels(MODEL, prompts=[], decode=1, context=context)
    time = sum(model.op_time(factors, op, H100.peaks["bf16"], H100.memory_bandwidth) for op in kernels)
    streamed = sum(op.bytes for op in kernels) / (H100.memory_bandwidth * factors.memory_efficiency)
    assert time == pytest.approx(streamed, rel=1e-9)
    weights = (model_parameters(MODEL) - MODEL.vocabulary * MODEL.hidden) * 2  # the embedding is not read
    assert kv == context * kv_bytes_per_token(MODEL)
    assert sum(op.bytes for op in kernels) == pytest.approx(weights + kv, rel=1e-3)


def test_a_prefill_step_is_compute_bound_at_the_gemm_rate():
    """A 4096-token prompt: the GEMMs take their FLOPs at the wave model's rate (compute-bound)."""
    model = load_compute_model()
    factors = model.device("H100")
    kernels, _ = step_kernels(MODEL, prompts=[4096], decode=0, context=0)
    gemms = [op for op in kernels if op.kind == "gemm" and op.m == 4096]
    for op in gemms:
        rate = H100.peaks["bf16"] * factors.gemm_efficiency(op.m, op.n, op.k)
        assert model.op_time(factors, op, H100.peaks["bf16"], H100.memory_bandwidth) == pytest.approx(op.flops / rate)
    assert sum(op.flops for op in gemms) == pytest.approx(2 * 4096 * (model_parameters(MODEL)
                                                                       - 2 * MODEL.vocabulary * MODEL.hidden
                                                                       - MODEL.decoders * 2 * MODEL.hidden
                                                                       - MODEL.hidden), rel=1e-9)


def spec(**keys):
    return ServingSpec(name="s", model=MODEL, **({"requests": 40, "prompt": (256, 1024), "output": (8, 64),
                                                  "rate": 50.0, "max_batch": 16, "seed": 3} | keys))


def scenario(**keys):
    return Scenario(**({"platform": "paper-cxl", "xpus": 4, "tp": 2, "devices": ("H100",)} | keys))


def test_continuous_batching_serves_every_request_once_and_in_order_of_time():
    result = simulate_serving(scenario(), spec())
    rows = result["per_request"]
    assert sorted(r["request"] for r in rows) == list(range(40))  # none lost, none twice (2 replicas)
    assert result["output_tokens"] == sum(q.output for q in make_requests(spec()))
    for r in rows:
        assert r["arrival_s"] <= r["first_token_s"] <= r["finish_s"]
        assert r["tpot_s"] > 0
    assert result["layout"] == {"tp": 2, "pp": 1, "dp": 2}
    assert max(row[4] for row in result["occupancy"]) <= 16  # max_batch
    assert result["ttft_s"]["p50"] <= result["ttft_s"]["p90"] <= result["ttft_s"]["p99"]


def test_the_same_inputs_give_the_same_run():
    a, b = (simulate_serving(scenario(), spec()) for _ in range(2))
    assert a["per_request"] == b["per_request"]


def test_a_spilled_kv_cache_is_read_in_place_over_cxl_or_copied_first_without_coherence():
    """The same step with part of its cache beyond HBM: the coherent read (beside the HBM reads) is never
    slower than the copy over PCIe into HBM first (paper Fig. 3c against 3b)."""
    times = {}
    for coherent in (True, False):
        replica, layout = _replica(scenario(coherent=coherent, xpus=2), spec())
        replica = replace(replica, hbm_tokens=1000)
        running = [{"request": q, "hbm": 500, "ext": q.prompt + q.output - 500, "made": 4}
                   for q in make_requests(spec())[:8]]
        times[coherent] = _step_time(spec(), replica, layout, [], running)
        assert replica.coherent == coherent
    assert times[True] < times[False]


def test_percentiles_are_nearest_rank():
    assert percentiles([5.0] * 99 + [100.0]) == {"mean": 5.95, "p50": 5.0, "p90": 5.0, "p99": 5.0}


def test_a_request_bigger_than_the_cache_is_refused_by_name():
    with pytest.raises(ConfigError, match="request 0 needs a KV cache"):
        simulate_serving(scenario(platform="dgx-h100", xpus=1, tp=1),
                         spec(requests=1, prompt=(10**7, 10**7), output=(2, 2)))


def test_hcsim_simulate_runs_a_serving_workload():
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", "--set=workload=llama3-70b-serving",
                           "--set=platform=paper-cxl", "--set=xpus=8", "--set=tp=8", "--set=devices=[H100]",
                           "--set=workload_overrides={serving.requests: 16}", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["kind"] == "serving" and result["requests"] == 16 and result["throughput_tokens_per_s"] > 0


def test_out_holds_one_runs_results_whether_it_trained_or_served(tmp_path):
    """A serving run's outputs count as a run's results: refused over an earlier run without --overwrite, and
    with it no training output is left beside them (nor serving outputs beside a training run's)."""
    serve = ["--set=workload=llama3-70b-serving", "--set=platform=paper-cxl", "--set=xpus=8", "--set=tp=8",
             "--set=devices=[H100]", "--set=workload_overrides={serving.requests: 4}"]
    train = ["--set=xpus=4", "--set=iterations=2"]
    trained = {"result.json", "links.csv", "xpus.csv", "xpus.png", "trace.csv", "trace.json"}
    served = {"result.json", "requests.csv", "kv.csv", "kv.png"}
    for first, second, outputs in ((serve, train, trained), (train, serve, served)):
        out = tmp_path / str(len(first))

        def simulate(settings, *extra):
            return subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", *settings, "--out", str(out),
                                   *extra], capture_output=True, text=True, timeout=600)

        assert simulate(first).returncode == 0
        refused = simulate(second)
        assert refused.returncode == 2 and "holds the results of an earlier run" in refused.stderr, refused.stderr
        done = simulate(second, "--overwrite")
        assert done.returncode == 0, done.stderr
        written = {p.name for p in out.iterdir()}
        assert written == outputs, written
        assert f"wrote {out}/" + ", ".join(sorted(outputs, key=RUN_OUTPUTS.index)) in done.stdout
