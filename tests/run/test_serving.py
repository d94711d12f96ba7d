"""Inference serving (hcsim.run.serving, hcsim.workload.serving): closed forms of a step, the KV cache, continuous
batching that loses or duplicates no request, and steps on the engine: a replica alone takes the closed form's
times, replicas sharing a link slow each other down."""

import json
import math
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from hcsim.engine.compute_model import load_compute_model
from hcsim.errors import ConfigError
from hcsim.platform.devices import builtin_catalog
from hcsim.run.scenario import Scenario
from hcsim.run.report import RUN_OUTPUTS
from hcsim.run.serving import (_checked, _inputs, _platform, _Scheduler, _StepCost, activation_workspace,
                               load_serving_spec, percentiles, simulate_serving)
from hcsim.workload.model import ModelShape
from hcsim.workload.serving import Request, ServingSpec, kv_bytes_per_token, make_requests, step_kernels
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


def test_under_the_power_limit_a_prefill_steps_gemms_run_at_the_clock_its_mix_leaves_them():
    """A 4096-token prefill on 2 H100 (tp 2): its compute-bound GEMMs run at the clock the step's own GEMM share
    leaves them (DeviceFactors.sustained_clock), the other kernels as alone; a decode step's GEMMs are
    memory-bound, so it takes its kernels' times; an A100 (no power limit) takes them too."""
    for device in ("H100", "A100"):
        platform, _ = _platform(scenario(xpus=2, devices=(device,)), spec())
        cost, factors, clocks = _StepCost(spec(), platform), platform.model.device(device), []
        for chunks, decode, context in (([(4096, 0)], 0, 0), ((), 8, 4000)):
            kernels, _ = step_kernels(MODEL, chunks=chunks, decode=decode, context=context, tp=2)
            timed = [platform.model.op_timing(factors, op, platform.peak, platform.hbm_bandwidth) for op in kernels]
            gemms = math.fsum(t for t, gemm in timed if gemm)
            others = math.fsum(t for t, gemm in timed if not gemm)
            work = cost.work(4096 if chunks else decode, len(chunks) + decode, chunks, decode, context, 0)
            clock = factors.sustained_clock(gemms / (gemms + others))
            clocks.append(clock)
            assert work.compute == pytest.approx(others + gemms / clock, rel=1e-9)
            limited = device == "H100" and bool(chunks)  # only there do GEMMs hold most of the time
            assert (clock < 0.97) == limited and (gemms > 0) == bool(chunks)
        assert cost.lowest_clock == pytest.approx(min(clocks), rel=1e-12)  # what the run reports: the prefill's on the H100, 1 on the A100


def spec(**keys):
    return ServingSpec(name="s", **({"model": MODEL, "requests": 40, "prompt": (256, 1024), "output": (8, 64),
                                                  "rate": 50.0, "max_num_seqs": 16, "seed": 3} | keys))


def scenario(**keys):
    return Scenario(**({"platform": "paper-cxl", "xpus": 4, "tp": 2, "devices": ("H100",)} | keys))


def closed_form(where, mix, **changes):
    """Each request's (first token, finish) times as the closed form gives them: every replica's scheduler driven
    by _Platform.step_time over its steps' StepWork (each replica alone, on links of its own), the oracle of the
    engine's runs; and the steps. `changes`: _Platform fields to replace (a shared link's bandwidth)."""
    mix, platform, config, _, _, requests = _checked(where, mix)
    platform = replace(platform, **changes)
    cost = _StepCost(mix, platform)
    rows, steps = [], 0
    for r in range(platform.dp):
        scheduler = _Scheduler(mix, config, platform, cost, requests[r::platform.dp])
        now, done = 0.0, 0
        while (reply := scheduler.advance(now, done)) is not None:
            done = 0
            if reply.__class__ is float:  # idle until then
                now = reply
                continue
            k, until, work, following = reply
            while True:  # as the core runs a run of k decodes: the j-th takes j slopes more compute and KV reads
                j = replace(work, compute=work.compute + done * (following.compute - work.compute),
                            resident_bytes=work.resident_bytes + done * (following.resident_bytes
                                                                         - work.resident_bytes)) if done else work
                now += platform.step_time(j)
                done += 1
                if done == k or now >= until:
                    break
        rows += [(row["request"], row["first_token_s"], row["finish_s"]) for row in scheduler.records()]
        steps += scheduler.steps
    return sorted(rows), steps


# s: SimGrid's timing precision (its precision/timing): an activity may end this much off its exact time. A step
# chains at most 3 + 6 pp activities (host, swap, store; per stage a pad and a transfer beside the compute, the
# all-reduce's pad and flows, the send's pad and flow), so after n steps a time is off by at most n (3 + 6 pp) of it.
TIMING = 1e-9


def same_times(result, oracle, steps, pp=1, bound=None):
    """The run's request times are the oracle's, within SimGrid's timing precision over the steps."""
    bound = steps * (3 + 6 * pp) * TIMING if bound is None else bound
    got = [(row["request"], row["first_token_s"], row["finish_s"]) for row in result["per_request"]]
    assert [row[0] for row in got] == [row[0] for row in oracle]
    worst = max(abs(a - b) for mine, theirs in zip(got, oracle) for a, b in zip(mine[1:], theirs[1:]))
    assert worst <= bound, (worst, bound)
    return worst


def served_once(result, spec):
    """Every request of `spec` served exactly once, with all its output tokens, in order of time."""
    rows = result["per_request"]
    assert [r["request"] for r in rows] == list(range(spec.requests))
    assert result["output_tokens"] == sum(q.output for q in make_requests(spec))
    for r in rows:
        assert r["arrival_s"] <= r["first_token_s"] <= r["finish_s"]
        assert r["tpot_s"] > 0


def test_continuous_batching_serves_every_request_once_and_in_order_of_time():
    result = simulate_serving(scenario(), spec())
    served_once(result, spec())
    assert result["layout"] == {"tp": 2, "pp": 1, "dp": 2}
    assert max(row[4] for row in result["occupancy"]) <= 16  # max_num_seqs
    assert result["ttft_s"]["p50"] <= result["ttft_s"]["p90"] <= result["ttft_s"]["p99"]


def test_the_same_inputs_give_the_same_bytes():
    a, b = (simulate_serving(scenario(), spec(shared_prefix=128, prefix_groups=3)) for _ in range(2))
    a.pop("wall_time_s"), b.pop("wall_time_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_a_spilled_kv_cache_is_read_in_place_over_cxl_or_copied_first_without_coherence():
    """The same step with part of its cache beyond HBM: the coherent read (beside the HBM reads) is never
    slower than the copy over PCIe into HBM first (paper Fig. 3c against 3b); with nothing spilled, the same."""
    times = {}
    for coherent in (True, False):
        platform, _ = _platform(scenario(coherent=coherent, xpus=2), spec())
        assert platform.coherent == coherent
        cost = _StepCost(spec(), platform)
        spilled = cost.work(8, 8, (), 8, resident=4000, spilled=4000)
        resident = cost.work(8, 8, (), 8, resident=4000, spilled=0)
        times[coherent] = platform.step_time(spilled)
        assert platform.step_time(resident) < times[coherent]
    assert times[True] < times[False]


TIGHT = dict(requests=40, rate=None, prompt=(800, 1000), output=(100, 200), max_num_seqs=64,
             gpu_memory_utilization=0.04)  # KV blocks for a few sequences in HBM: the rest spills or preempts


@pytest.mark.parametrize("where, keys, private", [
    (dict(), dict(), "analytic"),  # 2 replicas of tp 2, TP all-reduces on the XPU links
    (dict(xpus=1, tp=1), TIGHT, "analytic"),  # KV spilled to the XPU's CXL memory, read in place beside the compute
    (dict(xpus=1, tp=1), TIGHT, "simulated"),
    (dict(xpus=2, tp=2, coherent=False), TIGHT | dict(gpu_memory_utilization=0.02), "simulated"),  # copied first
    (dict(xpus=4, tp=2, pp=2), TIGHT | dict(requests=80, gpu_memory_utilization=0.01, max_num_batched_tokens=1024),
     "simulated"),  # pipeline sends
    (dict(xpus=1, tp=1, spill="error"), TIGHT | dict(preemption="swap"), "simulated"),  # swaps over PCIe
])
def test_a_replica_alone_on_links_of_its_own_takes_the_closed_forms_times(where, keys, private):
    """Every step on the engine (compute, the spilled KV read or copy, swaps, all-reduce flows, pipeline sends): a
    replica whose links no other replica crosses serves each request at the time the closed form sums its steps to
    (_Platform.step_time), whether its phases run as SimGrid activities (simulated) or, as nothing can slow them,
    as one delay of their time alone (analytic)."""
    mix, here = spec(**keys), scenario(**where)
    result = simulate_serving(here, mix, private=private)
    oracle, steps = closed_form(here, mix)
    assert result["steps"] == steps
    same_times(result, oracle, steps, here.pp)
    if keys.get("preemption") == "swap":
        assert result["preemptions"] > 0
    elif keys:
        assert result["kv"]["peak_extended_tokens"] > 0


def test_two_replicas_sharing_a_cxl_link_each_take_the_closed_form_at_half_its_bandwidth():
    """cxl-pool: XPUs 0 and 1 read their spilled KV blocks from the pool over one CXL port and one PCIe uplink
    (64 GB/s each) and then links of their own (64 GB/s). Two replicas with the same requests run in lockstep, so
    every spilled read shares those links with the other's: each replica serves its requests at the closed form's
    times at half the bandwidth (32 GB/s), later than alone. On paper-cxl each XPU reads its own CXL memory over a
    link of its own: two replicas serve exactly as one alone does."""
    same = TIGHT | dict(prompt=(900, 900), output=(150, 150))  # the replicas' requests alike
    pair, alone = spec(**same), spec(**same | dict(requests=same["requests"] // 2))
    shared = simulate_serving(scenario(platform="cxl-pool", xpus=2, tp=1), pair)
    assert shared["kv"]["peak_extended_tokens"] > 0
    one_platform, _ = _platform(scenario(platform="cxl-pool", xpus=1, tp=1), alone)
    halved, steps = closed_form(scenario(platform="cxl-pool", xpus=2, tp=1), pair,
                                ext_bandwidth=one_platform.ext_bandwidth / 2)
    same_times(shared, halved, steps)
    by_itself, _ = closed_form(scenario(platform="cxl-pool", xpus=1, tp=1), alone)
    first = [row for row in shared["per_request"] if row["request"] % 2 == 0]
    assert all(row["finish_s"] > theirs[2] for row, theirs in zip(first, by_itself))
    apart = simulate_serving(scenario(xpus=2, tp=1), pair)
    single = simulate_serving(scenario(xpus=1, tp=1), alone)
    steps = single["steps"]
    mine = sorted((row["request"] // 2, row["first_token_s"], row["finish_s"]) for row in apart["per_request"]
                  if row["request"] % 2 == 0)
    same_times(single, mine, steps)


def test_a_bad_step_is_one_error_naming_its_field_and_the_core_survives():
    """The core checks every step the scheduler gives it: a negative amount stops every replica's loop with one
    ValueError naming the replica and the field; an exception the scheduler raises comes out as it is."""
    code = """
import math, sys
from array import array
from pathlib import Path
from hcsim.config import resolve_spec
from hcsim.engine import core
from hcsim.platform import build_platform, compile_platform, load_platform_spec
graph = build_platform(load_platform_spec(resolve_spec("paper-cxl", "platforms", Path(".")), {}), 1)
platform = compile_platform(graph, [("xpu0.cxl", "xpu0")], "bf16")
layout = {"r_tp": array("i", [1]), "r_xpus": array("q", [0, 1]), "x_host": array("i", [0]),
          "x_ext": array("i", [1]), "x_dram": array("i", [-1])}
step = [1.0, math.inf, 0.0, 0.0, 0.0] + [0.0] * 12
step[5 + int(sys.argv[1])] = float(sys.argv[2])
def next_step(replica, now, done):
    if now > 0:
        raise KeyError("the scheduler's own error")
    return tuple(step)
try:
    core.load().run_steps(platform.tables, ["xpu0", "xpu0.cxl"], layout, next_step)
except Exception as err:
    print(type(err).__name__, err)
"""
    for field, value, expected in ((4, -1.0, "ValueError run_steps: replica 0: SPILL of stage 0 = -1"),
                                   (0, 0.0, "ValueError run_steps: replica 0: a step with nothing to run"),
                                   (0, 1e-3, "KeyError \"the scheduler's own error\"")):
        done = subprocess.run([sys.executable, "-c", code, str(field), str(value)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0 and done.stdout.startswith(expected), (done.stdout, done.stderr)


def test_a_request_bigger_than_the_cache_is_refused_by_name():
    with pytest.raises(ConfigError, match="request 0 needs a KV cache"):
        simulate_serving(scenario(platform="dgx-h100", xpus=1, tp=1),
                         spec(model=replace(MODEL, sequence=10**7), requests=1, prompt=(5 * 10**6,) * 2,
                              output=(2, 2)))


def test_the_token_budget_is_never_exceeded_and_long_prompts_are_chunked():
    """A budget of 512 tokens per step with prompts of up to 1,024: every prompt still gets its first token, and
    no step computes more than the budget (prefill chunks and decodes together)."""
    small = spec(max_num_batched_tokens=512)
    result = simulate_serving(scenario(), small)
    served_once(result, small)
    assert result["max_step_tokens"] <= 512
    assert result["scheduler"]["chunked_prefill"] and result["scheduler"]["max_num_batched_tokens"] == 512


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_loses_no_request(mode):
    """KV blocks for a few sequences only (a small share of HBM after the weights): requests are preempted, and
    every one is still served once with all its tokens; recomputation costs time, swapping the copies."""
    tight = spec(requests=60, rate=None, prompt=(800, 1000), output=(200, 300), max_num_seqs=64,
                 gpu_memory_utilization=0.04, preemption=mode)
    result = simulate_serving(scenario(xpus=1, tp=1, spill="error"), tight)
    served_once(result, tight)
    assert result["preemptions"] > 0
    assert sum(r["preemptions"] for r in result["per_request"]) == result["preemptions"]
    assert result["kv"]["peak_hbm_tokens"] <= result["kv"]["hbm_tokens_per_replica"]


def test_prefix_caching_reuses_a_groups_prefix_blocks():
    """Requests far apart in time, 4 groups sharing a 300-token prefix in blocks of 16: every request after the
    first of its group hits the prefix's 18 full blocks (288 tokens), and none of the first ones does."""
    apart = spec(requests=20, rate=0.5, prompt=(400, 1024), shared_prefix=300, prefix_groups=4)
    result = simulate_serving(scenario(xpus=2), apart)
    requests = make_requests(apart)
    assert result["prefix_cache"]["hit_tokens"] == (20 - 4) * 288
    assert result["prefix_cache"]["query_tokens"] == sum(q.prompt for q in requests)
    without = simulate_serving(scenario(xpus=2), replace(apart, prefix_caching=False))
    assert without["prefix_cache"]["hit_tokens"] == 0
    later = [r["request"] for r in result["per_request"] if r["request"] >= 4]
    for index in later:
        assert result["per_request"][index]["ttft_s"] < without["per_request"][index]["ttft_s"]


def test_a_requests_time_to_first_token_grows_with_its_prompt_token_by_token():
    """One request alone: its time to first token never falls as the prompt grows by one token, and no token
    adds more than a GEMM tile's worth (2 %; an unaligned token count is not cuBLAS's unaligned rate)."""
    ttft = []
    for prompt in range(2040, 2058):  # (the closed form's times: a replica alone takes them on the engine)
        one = spec(requests=1, rate=None, prompt=(prompt, prompt), output=(2, 2))
        ttft.append(closed_form(scenario(xpus=1, tp=1), one)[0][0][1])
    for shorter, longer in zip(ttft, ttft[1:]):
        assert shorter <= longer < 1.02 * shorter


def test_the_built_in_workloads_2049_token_prompt_takes_about_as_long_as_2048():
    """The issue's case: Llama 3 70B on 8 H100, one request; 2,049 tokens were charged cuBLAS's unaligned rate
    (383 ms against 77 ms). Now one token more costs at most a GEMM tile's worth."""
    from hcsim.config import resolve_spec

    path = resolve_spec("llama3-70b-serving", "workloads")
    ttft = {}
    for prompt in (2048, 2049):
        one = load_serving_spec(path, {"serving.requests": 1, "serving.rate": None, "serving.prompt": prompt,
                                       "serving.output": 2})
        ttft[prompt] = simulate_serving(scenario(xpus=8, tp=8), one)["ttft_s"]["p50"]
    assert ttft[2048] <= ttft[2049] < 1.03 * ttft[2048]


def test_past_its_capacity_a_replica_queues_and_time_to_first_token_grows_without_bound():
    """The replica's capacity C (requests/s) from a batch served at once. Arrivals at C/2: time to first token
    stays put when twice as many requests come; at 2C: the queue grows with every request, and so does it."""
    batch = spec(requests=200, rate=None, max_num_seqs=64, prompt=(256, 512), output=(32, 64))
    capacity = simulate_serving(scenario(xpus=1, tp=1), batch)["requests_per_s"]

    def ttft(rate, requests):
        load = replace(batch, rate=rate, requests=requests)
        return simulate_serving(scenario(xpus=1, tp=1), load)["ttft_s"]["mean"]

    assert ttft(capacity / 2, 400) < 1.5 * ttft(capacity / 2, 200)
    assert ttft(2 * capacity, 400) > 1.8 * ttft(2 * capacity, 200)


def test_vllm_v0_prefills_first_whole_prompts_in_blocks_of_16_and_256_sequences():
    v0 = spec(scheduler="vllm-v0", max_num_seqs=None)
    result = simulate_serving(scenario(), v0)
    served_once(result, v0)
    assert {k: result["scheduler"][k] for k in ("block_size", "max_num_seqs", "chunked_prefill", "prefix_caching",
                                                "preemption")} == {"block_size": 16, "max_num_seqs": 256,
                                                                   "chunked_prefill": False, "prefix_caching": False,
                                                                   "preemption": "recompute"}
    assert result["max_step_tokens"] <= result["scheduler"]["max_num_batched_tokens"] == MODEL.sequence
    kinds = result["steps_by_kind"]
    assert kinds["mixed"] == 0 and kinds["prefill"] > 0 and sum(kinds.values()) == result["steps"]
    v1 = simulate_serving(scenario(), spec())["steps_by_kind"]
    assert v1["mixed"] > 0  # V1 runs prefill chunks beside the decodes


def test_the_kv_blocks_are_the_memory_left_after_weights_and_activations():
    platform, config = _platform(scenario(xpus=1, tp=1), spec())
    free = 80 * 2**30 * 0.9 - model_parameters(MODEL) * 2.0 - activation_workspace(spec(), 8192, 16, 1)
    assert platform.hbm_blocks == int(free / (kv_bytes_per_token(MODEL) * 16))
    assert (config.max_num_batched_tokens, config.block_size) == (8192, 16)  # vLLM V1 on an H100


def test_percentiles_are_nearest_rank():
    assert percentiles([5.0] * 99 + [100.0]) == {"mean": 5.95, "p50": 5.0, "p90": 5.0, "p99": 5.0}
    assert percentiles([100.0, 5.0], [1, 99]) == percentiles([5.0] * 99 + [100.0])  # counted, not listed


# ---- latency targets and goodput -----------------------------------------------------------------------------

def test_a_request_meets_the_slo_when_both_its_first_token_and_its_time_per_token_are_within():
    """One request alone: its time to first token is its prefill step and its time per output token its decode
    steps' mean (closed forms); an objective a hair above each is met, a hair below either is missed."""
    from hcsim.workload.serving import Slo

    prompt, output = 2000, 30
    where = scenario(platform="dgx-h100", xpus=1, tp=1, devices=None)
    alone = spec(requests=1, rate=None, prompt=(prompt, prompt), output=(output, output))
    mix, platform, _, _, _, _ = _checked(where, alone)
    cost = _StepCost(mix, platform)
    ttft = platform.step_time(cost.work(prompt, 1, [(prompt, 0)], 0, 0, 0))
    tpot = math.fsum(platform.step_time(cost.work(1, 1, (), 1, prompt + j + 1, 0)) for j in range(output - 1)) / (
        output - 1)
    for scale_ttft, scale_tpot, met in ((1.001, 1.001, 1), (0.999, 1.001, 0), (1.001, 0.999, 0), (None, 1.001, 1)):
        slo = Slo(ttft=scale_ttft and ttft * scale_ttft, tpot=tpot * scale_tpot)
        result = simulate_serving(where, replace(alone, slo=slo))
        row, = result["per_request"]
        assert row["ttft_s"] == pytest.approx(ttft, abs=10 * TIMING) and row["tpot_s"] == pytest.approx(tpot, rel=1e-9)
        assert row["meets_slo"] is bool(met)
        assert result["goodput"] == {"requests": met, "share": float(met), "requests_per_s": met / row["finish_s"]}
        assert result["slo"] == {"ttft_s": slo.ttft, "tpot_s": slo.tpot}


@pytest.mark.parametrize("split", [None, (1, 1)])
def test_goodput_counts_the_requests_meeting_both_objectives_and_the_gaps_between_tokens_add_up(split):
    """A loaded mix (queueing, chunked prompts, runs of decodes; co-located, and disaggregated): goodput's share is
    the rows meeting both objectives over all rows, in [0, 1], its rate that count over the makespan; each row's
    meets_slo is its own times against the objectives. Inter-token gaps: a request's gaps add up to its finish less
    its first token, so their token-weighted mean is the sum of those over the sum of (output - 1); no gap is
    longer than the longest of its request, and each request's longest is at least its mean (time per token)."""
    from hcsim.workload.serving import Slo

    slo = Slo(ttft=0.1, tpot=2.5e-3)
    mix = spec(**DISAGGREGATED | dict(disaggregation=split, slo=slo))
    where = scenario(platform="dgx-h100", xpus=2, tp=1, devices=None)
    result = simulate_serving(where, mix)
    rows = result["per_request"]
    met = [row for row in rows if row["ttft_s"] <= slo.ttft and row["tpot_s"] <= slo.tpot]
    assert [row["meets_slo"] for row in rows] == [row in met for row in rows]
    assert 0 < len(met) < len(rows)  # (the targets split this mix: the check is not vacuous)
    assert result["goodput"]["requests"] == len(met)
    assert result["goodput"]["share"] == len(met) / len(rows)
    assert result["goodput"]["requests_per_s"] == len(met) / result["makespan_s"]
    itl = result["itl_s"]
    gaps = math.fsum(row["finish_s"] - row["first_token_s"] for row in rows)
    assert itl["mean"] == pytest.approx(gaps / sum(row["output"] - 1 for row in rows), rel=1e-9)
    assert itl["p50"] <= itl["p90"] <= itl["p99"] <= max(row["itl_max_s"] for row in rows)
    assert all(row["itl_max_s"] >= row["tpot_s"] * (1 - 1e-9) for row in rows)
    assert all(row["e2e_s"] == row["finish_s"] - row["arrival_s"] for row in rows)


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
    served = {"result.json", "requests.csv", "kv.csv", "kv.png", "latency.png"}
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


SERVE = ["--set=workload=llama3-70b-serving", "--set=platform=paper-cxl", "--set=xpus=16", "--set=tp=8",
         "--set=devices=[H100]"]


@pytest.mark.parametrize("settings, expected", [
    (["--set=cp=2"], r"cp: 2 does not apply to serving"),
    (["--set=ep=2"], r"ep: 2 does not apply to serving"),
    (["--set=zero=1"], r"zero: 1 does not apply"),
    (["--set=offload=cpu"], r"offload: 'cpu' does not apply"),
    (["--set=recompute=full"], r"recompute: 'full' does not apply"),
    (["--set=global_batch=64"], r"global_batch: 64 does not apply"),
    (["--set=micro_batch=2"], r"micro_batch: 2 does not apply"),
    (["--set=dp=3"], r"dp: 3 is not xpus / \(tp x pp\)"),
    (["--set=precision=fp8"], r"precision: 'fp8': serving runs fp16 or bf16"),
    (["--set=workload_overrides={serving.output: 200000}"], r"can reach 208,192 tokens, beyond the model's sequence"),
    (["--set=workload_overrides={serving.requests: 1000001}"], r"serving.requests: must be <= 1,000,000"),
    (["--set=workload_overrides={serving.bogus: 1}"], r"serving.bogus: unknown key; valid keys: block_size, "),
    (["--set=workload_overrides={serving.max_batch: 4}"], r"serving.max_batch: renamed max_num_seqs"),
    (["--set=workload_overrides={serving.block_size: 7}"], r"block_size must be one of 8, 16, 32, 64, 128"),
    (["--set=workload_overrides={serving.max_num_batched_tokens: 100}"], r"less than max_num_seqs 256"),
    (["--set=workload_overrides={serving.gpu_memory_utilization: 0.2}"], r"no room for a KV block"),
    (["--set=workload_overrides={kind: inference}"], r"kind: 'inference' beside a serving: section; a serving "
                                                      r"workload is kind: serving"),
    (["--set=workload_overrides={serving.step_overhead: 0.001}"], r"serving.step_overhead: 0.001 has no unit"),
    (["--set=workload_overrides={serving.slo: {ttft: 200}}"], r"serving.slo.ttft: 200 has no unit; write it with one"),
    (["--set=workload_overrides={serving.slo: {ttft: 2s, tbt: 5ms}}"], r"serving.slo.tbt: unknown key; valid keys: "
                                                                       r"tpot, ttft"),
    (["--set=workload_overrides={serving.slo: {}}"], r"serving.slo: give ttft, tpot or both"),
    (["--set=workload_overrides={serving.routing: jsq}"], r"serving.routing: 'jsq' is not one of round_robin, "
                                                          r"least_loaded"),
])
def test_bad_serving_input_ends_in_one_message_naming_the_key(settings, expected):
    """Each ends with exit 2 and one message that names the key and what would be valid: no traceback, no hang,
    nothing served silently."""
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", *SERVE, *settings], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert re.search(expected, done.stderr), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_default_the_file_did_not_write_is_called_a_default(tmp_path):
    """A model too short for the built-in prompt and output (512 + 128 tokens): the message says those lengths are
    the defaults, not values the file gave."""
    path = tmp_path / "short.yaml"
    path.write_text("kind: serving\nmodel: {decoders: 2, hidden: 512, heads: 8, ffn: 1024, sequence: 600}\n"
                    "serving: {requests: 2}\n")
    with pytest.raises(ConfigError, match=r"prompt \[512, 512\] \(the default; the file gives no serving.prompt\)"):
        load_serving_spec(path)


def test_a_run_that_preempts_over_and_over_stops_with_what_it_did():
    """Outputs far longer than the KV cache holds for the sequences admitted: recomputation after recomputation;
    the run stops with a message, not after hours."""
    thrash = spec(model=replace(MODEL, sequence=40_000), requests=40, rate=None, prompt=(1000, 1000),
                  output=(15_000, 15_000), max_num_seqs=40, gpu_memory_utilization=0.04, max_num_batched_tokens=512)
    with pytest.raises(ConfigError, match=r"preemptions recomputed .* tokens.*Fix: fewer sequences at once"):
        simulate_serving(scenario(xpus=1, tp=1, spill="error"), thrash)


def test_the_summary_keeps_three_digits_of_a_small_throughput():
    from hcsim.cli.simulate import serving_summary

    result = simulate_serving(scenario(), spec(requests=4))
    result["throughput_tokens_per_s"] = 0.0029123
    assert "throughput       0.00291 output tokens/s" in serving_summary(result)


def test_random_workloads_keep_every_invariant():
    """Thirty random mixes of scheduler, budget, sequences, block size, memory, preemption mode, prefixes and
    spill (seeded): every request served once with all its tokens, no step over the budget or the sequences, HBM
    never over its blocks, at the end no block held but the cached prefixes, and the request times the closed
    form's (each replica's XPU reads its own CXL memory; two replicas' swaps cross one host link, which has room
    for both)."""
    import random

    rng = random.Random(7)
    for _ in range(30):
        low, high = sorted(rng.randint(300, 3000) for _ in range(2))
        short, long = sorted(rng.randint(2, 2000) for _ in range(2))
        keys = dict(requests=rng.randint(1, 60), prompt=(low, high), output=(short, long),
                    rate=rng.choice([None, 1.0, 20.0, 300.0]), max_num_seqs=rng.choice([1, 4, 32]),
                    scheduler=rng.choice(["vllm-v1", "vllm-v0"]), block_size=rng.choice([8, 16, 64]),
                    gpu_memory_utilization=rng.choice([0.04, 0.05, 0.9]), preemption=rng.choice(["recompute", "swap"]),
                    shared_prefix=rng.choice([0, 100, 290]), prefix_groups=rng.randint(1, 5),
                    prefix_caching=rng.choice([None, True, False]), seed=rng.randint(0, 99),
                    max_num_batched_tokens=rng.choice([None, 256, 2048]))
        if keys["scheduler"] == "vllm-v0" and keys["max_num_batched_tokens"]:
            keys["max_num_batched_tokens"] = max(keys["max_num_batched_tokens"], high + long)
        where = scenario(xpus=rng.choice([1, 2]), tp=1, spill=rng.choice(["error", "allow"]))
        mix = spec(**keys)
        result = simulate_serving(where, mix)
        served_once(result, mix)
        same_times(result, *closed_form(where, mix))  # paper-cxl: links of their own, but for swaps' host link
        scheduler, bs = result["scheduler"], result["scheduler"]["block_size"]
        assert result["max_step_tokens"] <= scheduler["max_num_batched_tokens"]
        assert max(row[4] for row in result["occupancy"]) <= scheduler["max_num_seqs"]
        assert result["kv"]["peak_hbm_tokens"] <= result["kv"]["hbm_tokens_per_replica"]
        cached = (mix.shared_prefix // bs) * bs * mix.prefix_groups if scheduler["prefix_caching"] else 0
        for replica in range(where.xpus):
            rows = [row for row in result["occupancy"] if row[0] == replica]
            assert not rows or (rows[-1][2] + rows[-1][3] <= cached and rows[-1][4] == 0)


def test_a_run_too_big_for_memory_is_refused_before_it_starts_with_its_estimate(monkeypatch):
    import hcsim.run.serving as serving

    monkeypatch.setattr(serving, "MAX_SERVING_MEMORY", 1e6)  # 1 MB: 600 requests at about 2 kB each pass it
    with pytest.raises(ConfigError, match=r"600 requests would take about 1.2 MB \(2,000 B per request\), more "
                                          r"than the 1 MB"):
        simulate_serving(scenario(), spec(requests=600))


def test_progress_counts_every_request_once():
    told = []

    def progress(total):
        told.append(total)
        return told.append

    simulate_serving(scenario(), spec(requests=40), progress)
    assert told[0] == 40 and sum(told[1:]) == 40 and min(told[1:]) >= 0


def test_the_steps_whose_decodes_are_counted_together_give_the_same_run(monkeypatch):
    """A step whose running requests all decode a token from HBM is counted in one pass (_decodes_fit); walking
    them one by one gives the same steps, preemptions and request times, prefix caching and preemption included
    (the scheduler's decisions, checked in this process with the closed form's step times)."""
    import hcsim.run.serving as serving

    mixes = [spec(requests=45, rate=rate, prompt=(2051, 2546), output=(1392, 1426), max_num_seqs=32, block_size=bs,
                  gpu_memory_utilization=0.05, shared_prefix=290, prefix_groups=groups, seed=8)
             for rate, bs, groups in ((None, 8, 2), (300.0, 64, 1), (20.0, 16, 3))]
    runs = []
    for fast in (True, False):
        monkeypatch.setattr(serving._Scheduler, "_fast", fast)
        runs += [closed_form(scenario(xpus=1, tp=1, spill="error"), mix) for mix in mixes]
    assert runs[:3] == runs[3:]


# ---- request traces --------------------------------------------------------------------------------------------

def write_trace(path, requests, jsonl=False):
    """The requests as a trace file: arrival times as Python's shortest repr (read back bit for bit)."""
    if jsonl:
        path.write_text("".join(json.dumps({"arrival_s": q.arrival, "prompt": q.prompt, "output": q.output,
                                            "group": q.group}) + "\n" for q in requests))
    else:
        path.write_text("arrival_s,prompt,output,group\n" + "".join(
            f"{q.arrival!r},{q.prompt},{q.output},{q.group}\n" for q in requests))
    return path


@pytest.mark.parametrize("jsonl", [False, True])
def test_a_trace_of_the_generators_requests_gives_the_same_run_bit_for_bit(tmp_path, jsonl):
    """The generator's requests (Poisson arrivals, three prefix groups) written as a trace and read back: the
    same requests, and every request's arrival, first token and finish the same floats."""
    generated = spec(shared_prefix=128, prefix_groups=3)
    requests = make_requests(generated)
    path = write_trace(tmp_path / ("trace.jsonl" if jsonl else "trace.csv"), requests, jsonl)
    traced = ServingSpec(name="s", model=MODEL, max_num_seqs=16, shared_prefix=128, trace=str(path))
    assert make_requests(traced) == requests and traced.requests == 40 and traced.prefix_groups == 3
    a, b = simulate_serving(scenario(), generated), simulate_serving(scenario(), traced)
    times = [[(r["arrival_s"], r["first_token_s"], r["finish_s"]) for r in result["per_request"]] for result in (a, b)]
    assert times[0] == times[1]
    assert a["prefix_cache"] == b["prefix_cache"] and a["prefix_cache"]["hit_tokens"] > 0


def test_a_trace_is_read_beside_its_workload_and_its_requests_key_takes_its_first_rows(tmp_path):
    write_trace(tmp_path / "mix.csv", [Request(i, 0.25 * i, 100 + i, 10 + i, i % 2) for i in range(6)])
    workload = tmp_path / "w.yaml"
    workload.write_text("kind: serving\nmodel: {decoders: 2, hidden: 512, heads: 8, ffn: 1024, sequence: 600}\n"
                        "serving: {trace: mix.csv, requests: 4}\n")
    loaded = load_serving_spec(workload)
    assert [(q.arrival, q.prompt, q.output, q.group) for q in make_requests(loaded)] == [
        (0.25 * i, 100 + i, 10 + i, i % 2) for i in range(4)]
    assert (loaded.prompt, loaded.output, loaded.prefix_groups, loaded.rate) == ((100, 103), (10, 13), 2, None)
    workload.write_text("kind: serving\nmodel: {decoders: 2, hidden: 512, heads: 8, ffn: 1024, sequence: 600}\n"
                        "serving: {trace: mix.csv, requests: 7, rate: 2, prompt: 10}\n")
    with pytest.raises(ConfigError) as err:
        load_serving_spec(workload)
    for key in ("serving.rate: the trace", "serving.prompt: the trace"):
        assert key in str(err.value)
    workload.write_text("kind: serving\nmodel: {decoders: 2, hidden: 512, heads: 8, ffn: 1024, sequence: 600}\n"
                        "serving: {trace: mix.csv, requests: 7}\n")
    with pytest.raises(ConfigError, match=r"7 requests, more than the trace's 6"):
        load_serving_spec(workload)
    workload.write_text("kind: serving\nmodel: {decoders: 2, hidden: 512, heads: 8, ffn: 1024, sequence: 600}\n"
                        "serving: {trace: nowhere.csv}\n")
    with pytest.raises(ConfigError, match=r"serving.trace 'nowhere.csv': no such file beside the workload"):
        load_serving_spec(workload)


def test_every_bad_row_of_a_trace_is_named_by_file_line_and_field_in_one_message(tmp_path):
    from hcsim.workload.serving import read_trace

    csv_path = tmp_path / "bad.csv"
    csv_path.write_text("arrival_s,prompt,output\n0,100,10\n0.5,x,10\n0.4,-3,1\n0.6,100\n\n1.0,8000,500\n"
                        "nan,5,5\n2,5.5,5\n")
    with pytest.raises(ConfigError) as err:
        read_trace(csv_path, 8192)
    lines = str(err.value).splitlines()
    assert lines[0] == f"serving.trace {str(csv_path)!r}: 8 bad fields:"
    assert [line.strip() for line in lines[1:]] == [f"{csv_path}:{tail}" for tail in (
        "3: prompt 'x' is not a whole number",
        "4: prompt '-3' must be >= 1",
        "4: output '1' must be >= 2 (a time per output token needs two)",
        "4: arrival_s '0.4' is before line 3's 0.5 (a trace is in order of arrival)",
        "5: no output",
        "7: prompt + output = 8,000 + 500 tokens, beyond the model's context of 8,192 (model.sequence)",
        "8: arrival_s 'nan' must be a finite number >= 0",
        "9: prompt '5.5' is not a whole number")]
    (tmp_path / "cols.csv").write_text("time,prompt,output\n0,1,2\n")
    with pytest.raises(ConfigError, match=r"cols.csv:1: the header has no column arrival_s \(it has time, prompt, "
                                          r"output"):
        read_trace(tmp_path / "cols.csv", 8192)
    (tmp_path / "bad.jsonl").write_text('{"arrival_s": 0, "prompt": 10, "output": 5}\n[1]\n'
                                        '{"arrival_s": -1, "prompt": 10, "output": true}\n')
    with pytest.raises(ConfigError) as err:
        read_trace(tmp_path / "bad.jsonl", 8192)
    assert str(err.value).splitlines()[1:] == [f"  {tmp_path / 'bad.jsonl'}:{tail}" for tail in (
        "2: not a JSON object (a list)", "3: arrival_s -1 must be a finite number >= 0",
        "3: output True is not a number")]
    (tmp_path / "t.txt").write_text("")
    with pytest.raises(ConfigError, match=r"a trace is a .csv file"):
        read_trace(tmp_path / "t.txt", 8192)


# ---- prefill/decode disaggregation -----------------------------------------------------------------------------

def handoff_time(where, mix, tokens, src="xpu0", dst="xpu1"):
    """Seconds of a `tokens`-token KV handoff alone from src to dst, each XPU's share of it (tokens x KV bytes per
    token / (tp x pp)) over the route, as NCCL's cost model times a send between XPUs of src's device: the route's
    latency + the fastest protocol's (of its slowest link kind's for that device) call and one step's latency +
    bytes / (bandwidth x that protocol's achieved share)."""
    from hcsim.platform.routes import route_bandwidth, route_latency, shortest_routes

    _, platform, _, graph, _, _ = _checked(where, mix)
    route = shortest_routes(graph, src, [dst])[dst]
    slowest = min(zip(route, route[1:]), key=lambda e: graph.edges[e]["bandwidth"])
    kind = load_compute_model().link(graph.edges[slowest]["kind"], graph.nodes[src]["device"])
    size = tokens * kv_bytes_per_token(mix.model, mix.precision) / (where.tp * where.pp)
    times = {p.name: p.call_latency + p.step_latency + size / (route_bandwidth(graph, route) * p.bandwidth_factor)
             for p in (kind.simple, *kind.protocols)}
    return route_latency(graph, route) + min(times.values())


def test_one_disaggregated_request_is_its_prefill_then_its_kv_handoff_then_its_decodes():
    """One prefill and one decode replica, one request alone: its first token ends its prefill step; it finishes
    after the KV cache of its prompt crosses the route between the replicas and its output's other tokens are
    decoded on the decode replica, each step at its closed form's time."""
    prompt, output = 3000, 40
    where = scenario(platform="dgx-h100", xpus=2, tp=1, devices=None)
    mix = spec(requests=1, rate=None, prompt=(prompt, prompt), output=(output, output), disaggregation=(1, 1))
    result = simulate_serving(where, mix)
    mix_, platform, _, _, _, _ = _checked(where, mix)
    cost = _StepCost(mix_, platform)
    prefill = platform.step_time(cost.work(prompt, 1, [(prompt, 0)], 0, 0, 0))
    handoff = handoff_time(where, mix, prompt)
    decodes = [platform.step_time(cost.work(1, 1, (), 1, prompt + j + 1, 0)) for j in range(output - 1)]
    row, = result["per_request"]
    assert row["first_token_s"] == pytest.approx(prefill, abs=10 * TIMING)
    assert row["kv_landed_s"] == pytest.approx(prefill + handoff, abs=20 * TIMING)
    assert row["finish_s"] == pytest.approx(prefill + handoff + math.fsum(decodes), abs=output * 10 * TIMING)
    assert handoff > 1e-4  # (the handoff is not lost in the precision: 3,000 tokens of 16 KiB over NVLink)
    assert result["layout"] == {"tp": 1, "pp": 1, "dp": 2, "prefill": 1, "decode": 1}
    assert result["steps_by_kind"] == {"prefill": 1, "mixed": 0, "decode": output - 1}


def test_prefill_on_h100_and_decode_on_h200_each_run_at_their_devices_closed_forms():
    """A mixed DGX cluster (an H100 node, then an H200 node; tp 8): the prefill replica's step is the H100's closed
    form, the KV handoff crosses InfiniBand between the nodes, and the decode steps are the H200's closed forms
    (faster than the H100's: more memory bandwidth), each side with its own KV blocks (the H200's 141 GiB hold
    more). A replica whose XPUs span the two devices is refused, naming it."""
    prompt, output = 3000, 30
    where = scenario(platform="dgx-h100", xpus=16, tp=8, devices=("H100", "H200"))
    mix = spec(requests=1, rate=None, prompt=(prompt, prompt), output=(output, output), disaggregation=(1, 1))
    result = simulate_serving(where, mix)
    mix_, sides, _, _, _ = _inputs(where, mix)
    (h100, _), (h200, _) = sides
    assert (h100.device, h200.device) == ("H100", "H200") and h200.hbm_blocks > h100.hbm_blocks
    prefill = h100.step_time(_StepCost(mix_, h100).work(prompt, 1, [(prompt, 0)], 0, 0, 0))

    def decodes(side):
        cost = _StepCost(mix_, side)
        return [side.step_time(cost.work(1, 1, (), 1, prompt + j + 1, 0)) for j in range(output - 1)]

    handoff = handoff_time(where, mix, prompt, "xpu0", "xpu8")
    row, = result["per_request"]
    assert row["first_token_s"] == pytest.approx(prefill, abs=10 * TIMING)
    assert row["kv_landed_s"] == pytest.approx(prefill + handoff, abs=20 * TIMING)
    assert row["finish_s"] == pytest.approx(prefill + handoff + math.fsum(decodes(h200)), abs=output * 10 * TIMING)
    assert math.fsum(decodes(h200)) < 0.99 * math.fsum(decodes(h100))  # (the small model: host and all-reduce bound)
    assert result["replica_devices"] == ["H100", "H200"] and result["device"] == "H100 + H200"
    assert result["kv"]["hbm_tokens_by_device"] == {"H100": h100.hbm_blocks * 16, "H200": h200.hbm_blocks * 16}
    with pytest.raises(ConfigError, match=r"replica 0's 16 XPUs \(tp 8 x pp 2, xpu0 to xpu15\) are H100 and H200; "
                                          r"a replica runs on one device"):
        simulate_serving(replace(where, pp=2), replace(mix, disaggregation=None))


def test_the_first_handoff_goes_to_the_decode_replica_with_more_free_blocks_the_next_to_the_emptier_one():
    """Decode replicas of an H100 node and an H200 node, two prompts prefilled in one step: the first handoff goes
    to the H200 (no requests on either, and its 141 GiB leave more blocks free), the second to the H100 (the
    H200 now has one landing): the router's rule, not the replicas' order."""
    where = scenario(platform="dgx-h100", xpus=24, tp=8, devices=("H100", "H100", "H200"))
    mix = spec(requests=2, rate=None, prompt=(1000, 1000), output=(10, 10), disaggregation=(1, 2))
    result = simulate_serving(where, mix)
    assert [row["decode_replica"] for row in result["per_request"]] == [2, 1]
    assert result["replica_devices"] == ["H100", "H100", "H200"]


def test_least_loaded_routing_gives_each_arrival_to_the_replica_with_the_fewest_requests_then_the_most_free_blocks():
    """serving.routing: least_loaded on co-located replicas of an H100 node and an H200 node, three requests at
    once: the first to the H200 replica (none on either; its 141 GiB leave more blocks free), the second to the
    H100 one (fewer requests), the third to the H200 one again (one each); round_robin deals them 0, 1, 0. Each is
    served once either way, and the run is the same bytes twice."""
    where = scenario(platform="dgx-h100", xpus=16, tp=8, devices=("H100", "H200"))
    mix = spec(requests=3, rate=None, prompt=(1000, 1000), output=(10, 10))
    dealt = simulate_serving(where, mix)
    assert [row["replica"] for row in dealt["per_request"]] == [0, 1, 0]
    routed = simulate_serving(where, replace(mix, routing="least_loaded"))
    assert [row["replica"] for row in routed["per_request"]] == [1, 0, 1]
    served_once(routed, mix)
    again = simulate_serving(where, replace(mix, routing="least_loaded"))
    routed.pop("wall_time_s"), again.pop("wall_time_s")
    assert json.dumps(routed, sort_keys=True) == json.dumps(again, sort_keys=True)


def test_least_loaded_routing_to_prefill_replicas_keeps_every_invariant():
    """Two prefill and two decode replicas, requests arriving at 400 per second routed to the least loaded
    prefill replica: every request served once, first token before its landing before its finish, both prefill
    replicas used, each request's prefill replica the one that made its first token (its preemptions and first
    token merged from there)."""
    mix = spec(**DISAGGREGATED | dict(disaggregation=(2, 2), routing="least_loaded"))
    result = simulate_serving(scenario(platform="dgx-h100", xpus=4, tp=1, devices=None), mix)
    served_once(result, mix)
    for row in result["per_request"]:
        assert row["arrival_s"] < row["first_token_s"] < row["kv_landed_s"] < row["finish_s"]
    assert {row["prefill_replica"] for row in result["per_request"]} == {0, 1}
    assert {row["decode_replica"] for row in result["per_request"]} == {2, 3}


def decode_closed_form(where, mix, result):
    """Each request's finish as the closed form gives it on its decode replica: the replica's scheduler driven by
    _Platform.step_time from the times the run's KV handoffs landed on it (result's kv_landed_s, decode_replica),
    a run of decodes ending after the step in which a handoff lands, as the core ends it; and the longest step
    it timed."""
    from types import SimpleNamespace

    mix, platform, config, _, _, requests = _checked(where, mix)
    cost, (prefill, decode) = _StepCost(mix, platform), mix.disaggregation
    rows, longest = [], 0.0
    for d in range(prefill, prefill + decode):
        events = sorted((row["kv_landed_s"], row["request"], row["first_token_s"]) for row in result["per_request"]
                        if row["decode_replica"] == d)
        scheduler = _Scheduler(mix, config, platform, cost, [], "decode", d)
        scheduler.router = SimpleNamespace(expects=lambda _: e < len(events), prefill_replica=lambda q: q % prefill)

        def land(event):
            q = requests[event[1]]
            scheduler.receive(q.index, q.prompt, q.output, q.group, event[0], event[2])

        now, done, e = 0.0, 0, 0
        while (reply := scheduler.advance(now, done)) is not None:
            done = 0
            if reply == math.inf:  # waits for the next handoff
                now = events[e][0]
                land(events[e])
                e += 1
                continue
            k, until, work, following = reply
            while True:
                j = replace(work, compute=work.compute + done * (following.compute - work.compute),
                            resident_bytes=work.resident_bytes + done * (following.resident_bytes
                                                                         - work.resident_bytes)) if done else work
                longest = max(longest, platform.step_time(j))
                now += platform.step_time(j)
                done += 1
                arrived = e < len(events) and events[e][0] <= now
                while e < len(events) and events[e][0] <= now:
                    land(events[e])
                    e += 1
                if done == k or now >= until or arrived:
                    break
        rows += [(row["request"], row["finish_s"]) for row in scheduler.records()]
    return sorted(rows), longest


DISAGGREGATED = dict(requests=40, rate=400.0, prompt=(1500, 3000), output=(20, 60), max_num_seqs=16,
                     disaggregation=(1, 1))


def test_decode_replicas_sharing_links_with_the_kv_handoffs_slow_down():
    """dgx-h100, prefill and decode replicas of tp 2 on one NVSwitch: the handoffs into the decode XPUs cross the
    switch's links into them, as the decode replica's all-reduce flows do, so its steps during a handoff take
    longer than their closed form: its requests finish later than the decode replica alone would serve them
    from the same landing times, none earlier by a step or more (a handoff joins the batch at the end of the step
    it lands in, and the slowed steps end at other times than the closed form's: a request landing inside a long
    step of the run can join before the closed form's next step ends, never more than one step before). On two
    servers (tp 8: the prefill replica on one, the decode
    replica on the other), the handoffs cross InfiniBand and PCIe, the all-reduces NVLink: each request finishes
    at the closed form's time."""
    mix = spec(model=replace(MODEL, decoders=32), **DISAGGREGATED)
    shared = scenario(platform="dgx-h100", xpus=4, tp=2, devices=None)
    result = simulate_serving(shared, mix)
    served_once(result, mix)
    oracle, longest = decode_closed_form(shared, mix, result)
    got = [(row["request"], row["finish_s"]) for row in result["per_request"]]
    late = [mine[1] - theirs[1] for mine, theirs in zip(got, oracle)]
    assert min(late) > -longest
    assert max(late) > 1e-5, max(late)
    apart = scenario(platform="dgx-h100", xpus=16, tp=8, devices=None)
    result = simulate_serving(apart, mix)
    served_once(result, mix)
    got = sorted((row["request"], row["finish_s"]) for row in result["per_request"])
    oracle, _ = decode_closed_form(apart, mix, result)
    assert max(abs(a[1] - b[1]) for a, b in zip(got, oracle)) <= result["steps"] * 8 * TIMING


def test_disaggregation_keeps_every_invariant_and_its_first_tokens_end_the_prefill():
    """Two prefill and two decode replicas: every request served once; its first token comes before its KV
    cache lands and that before its finish; no step mixes prefills and decodes (with no preemption, the decode
    replicas only decode and the prefill replicas only prefill)."""
    mix = spec(**DISAGGREGATED | dict(disaggregation=(2, 2), shared_prefix=200, prefix_groups=2))
    result = simulate_serving(scenario(platform="dgx-h100", xpus=8, tp=2, devices=None), mix)
    served_once(result, mix)
    for row in result["per_request"]:
        assert row["arrival_s"] < row["first_token_s"] < row["kv_landed_s"] < row["finish_s"]
    assert result["preemptions"] == 0 and result["steps_by_kind"]["mixed"] == 0  # no decode beside a prefill
    assert result["prefix_cache"]["hit_tokens"] > 0
    assert {row["prefill_replica"] for row in result["per_request"]} == {0, 1}
    assert {row["decode_replica"] for row in result["per_request"]} == {2, 3}  # (both decode replicas used)
    again = simulate_serving(scenario(platform="dgx-h100", xpus=8, tp=2, devices=None), mix)
    result.pop("wall_time_s"), again.pop("wall_time_s")
    assert json.dumps(result, sort_keys=True) == json.dumps(again, sort_keys=True)  # the same bytes


def test_a_prefill_replica_holds_a_requests_blocks_until_its_kv_cache_has_landed():
    """Two 2,000-token prompts at once on a prefill replica whose KV blocks hold one and a half of them: the
    second prompt gets its blocks only when the first's handoff has landed (its cache is read from them while it
    crosses), so its first token is the first's landing plus its own prefill step, not the first's first token
    plus it; the replica's occupancy shows the first's blocks held at its first token and freed at its landing."""
    prompt, output = 2000, 20
    where = scenario(platform="dgx-h100", xpus=2, tp=1, devices=None)
    pair = spec(requests=2, rate=None, prompt=(prompt, prompt), output=(output, output), disaggregation=(1, 1))
    mix, platform, config, graph, xpus, _ = _checked(where, pair)
    capacity = graph.nodes[graph.nodes[xpus[0]]["local_memory"]]["capacity"]
    blocks = 1.5 * prompt / config.block_size
    utilization = (platform.weights + platform.workspace + blocks * platform.token_bytes * config.block_size) / capacity
    pair = replace(pair, gpu_memory_utilization=utilization)
    assert _checked(where, pair)[1].hbm_blocks == int(blocks)
    result = simulate_serving(where, pair)
    cost = _StepCost(mix, platform)
    prefill = platform.step_time(cost.work(prompt, 1, [(prompt, 0)], 0, 0, 0))
    first, second = result["per_request"]
    assert first["first_token_s"] == pytest.approx(prefill, abs=10 * TIMING)
    assert first["kv_landed_s"] == pytest.approx(prefill + handoff_time(where, pair, prompt), abs=20 * TIMING)
    assert second["first_token_s"] == pytest.approx(first["kv_landed_s"] + prefill, abs=20 * TIMING)
    assert second["first_token_s"] - first["first_token_s"] - prefill > 1e-4  # (later than freeing at the prompt)
    held = [(row[1], row[2]) for row in result["occupancy"] if row[0] == 0]  # (replica, time, HBM tokens, ...)
    tokens = -(-prompt // config.block_size) * config.block_size
    assert held[0] == (first["first_token_s"], tokens)  # held at its first token
    assert held[1] == (first["kv_landed_s"], 0)  # freed at its landing


def test_a_decode_replicas_new_slot_grows_every_per_slot_array():
    """A decode replica's slots come as requests land (_Scheduler.receive appends to each array PER_SLOT names):
    PER_SLOT is every array a scheduler keeps per request slot, so none is left short."""
    from array import array

    mix, platform, config, _, _, requests = _checked(scenario(), spec(requests=7))
    scheduler = _Scheduler(mix, config, platform, _StepCost(mix, platform), requests[:7], "decode")
    per_slot = {name for name, value in vars(scheduler).items() if isinstance(value, array) and len(value) == 7}
    assert per_slot == set(_Scheduler.PER_SLOT)
    empty = _Scheduler(mix, config, platform, _StepCost(mix, platform), [], "decode")
    empty.receive(5, 300, 40, 0, 1.5, 1.25)
    assert {len(getattr(empty, name)) for name in _Scheduler.PER_SLOT} == {1}
    assert (empty.index[0], empty.computed[0], empty.made[0], empty.first[0], empty.landed[0]) == (5, 300, 1, 1.25, 1.5)


def test_the_router_sends_a_handoff_to_the_decode_replica_with_the_fewest_requests_then_the_most_free_blocks():
    """_Router's rule on decode replicas in given states: fewest requests (waiting, running, in flight) first;
    among equals the most free blocks (less those in flight to it); one whose free blocks cannot hold the prompt
    and its next token passed over while another can; each pick counted in flight until it lands."""
    from types import SimpleNamespace

    from hcsim.run.serving import _Router

    def replica(waiting, running, free):
        return SimpleNamespace(index=[], waiting=[0] * waiting, running=[0] * running, config=SimpleNamespace(
            block_size=16), _available=lambda: free)

    prefill = replica(0, 0, 0)
    prefill.index = list(range(5))
    router = _Router([prefill, replica(2, 1, 900), replica(1, 1, 100), replica(1, 1, 500)], 1)
    assert router.route(10, 160) == 3  # two requests each on 2 and 3: the most free blocks (500 > 100)
    assert router.route(11, 160) == 2  # 3 now has one in flight: 2 has fewer
    assert router.route(12, 160) == 1  # three each: 1 has the most free blocks (900; 2: 100 - 11, 3: 500 - 11)
    assert router.route(13, 8000) == 1  # 501 blocks: only 1 holds them (889 free), though it has four requests
    assert router.route(14, 160) == 3  # 1: five requests; 2 and 3: three, 3 with more free blocks (489 > 89)
    assert router.in_flight == [0, 2, 1, 2] and router.in_flight_blocks == [0, 512, 11, 22]
    assert router.landed(13) == 1 and router.landed(12) == 1 and router.in_flight_blocks[1] == 0
    assert router.expects(1) is False and router.expects(2) is True  # (every request routed; 2 has two in flight)


@pytest.mark.parametrize("split, xpus, expected", [
    ("{prefill: 1, decode: 2}", 4, r"serving.disaggregation.prefill 1 \+ serving.disaggregation.decode 2 = 3 "
                                   r"replicas, but xpus 4 / \(tp 1 x pp 1\) gives 4. Fix: prefill \+ decode = 4"),
    ("{prefill: 0, decode: 2}", 2, r"serving.disaggregation.prefill: must be >= 1, got 0"),
    ("{prefill: 1}", 2, r"serving.disaggregation.decode: is required"),
    ("{prefill: 1, decode: 1, decod: 2}", 2, r"serving.disaggregation.decod: unknown key \(did you mean 'decode'"),
])
def test_a_bad_disaggregation_is_refused_naming_its_key(tmp_path, split, xpus, expected):
    workload = tmp_path / "w.yaml"
    workload.write_text("kind: serving\nmodel: {decoders: 2, hidden: 512, heads: 8, ffn: 1024, sequence: 4096}\n"
                        f"serving: {{requests: 4, disaggregation: {split}}}\n")
    with pytest.raises(ConfigError, match=expected):
        simulate_serving(scenario(platform="dgx-h100", xpus=xpus, tp=1, devices=None), load_serving_spec(workload))


def test_a_bad_handoff_or_a_wait_for_none_is_one_error_naming_it():
    """The core checks each handoff flow beside an answer (a replica no handoff pair reaches is refused by field);
    a replica that waits for a handoff no one sends ends the run with an error, not a hang; a good one lands
    once, with its tag, and wakes the replica that waits for it."""
    code = """
import math, sys
from array import array
from pathlib import Path
from hcsim.config import resolve_spec
from hcsim.engine import core
from hcsim.platform import build_platform, compile_platform, load_platform_spec
graph = build_platform(load_platform_spec(resolve_spec("dgx-h100", "platforms", Path(".")), {}), 2)
platform = compile_platform(graph, [("xpu0", "xpu1")], "bf16")
layout = {"r_tp": array("i", [1, 1]), "r_xpus": array("q", [0, 1, 2]), "x_host": array("i", [0, 1]),
          "x_ext": array("i", [-1, -1]), "x_dram": array("i", [-1, -1])}
case = sys.argv[1]
if case != "unpaired":
    layout |= {"h_src": array("i", [0]), "h_dst": array("i", [1])}
step = tuple([1.0, math.inf, 1e-3, 0.0, 0.0] + [0.0] * 12)
asked, landings = [], []
def next_step(replica, now, done):
    asked.append((replica, now))
    if replica == 0:
        if now > 0 or case == "none":
            return None
        return [step, (0.0, 1.0, 1e6, 0.0, 1.0, 7.0)]
    return math.inf if not landings else None
def landed(tag, now):
    landings.append((tag, now))
try:
    core.load().run_steps(platform.tables, ["xpu0", "xpu1"], layout, next_step, True, landed)
    print("ok", landings, [a for a in asked if a[0] == 1])
except Exception as err:
    print(type(err).__name__, err)
"""
    for case, expected in (("unpaired", "ValueError run_steps: replica 0: handoff flow 0: REPLICA"),
                           ("none", "ValueError run_steps: replica 1 waits for a handoff that never came"),
                           ("good", "ok [(7, ")):
        done = subprocess.run([sys.executable, "-c", code, case], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.startswith(expected), (done.stdout, done.stderr)
    landed_at = float(done.stdout.split("(7, ")[1].split(")")[0])
    assert done.stdout.strip().endswith(f"[(1, 0.0), (1, {landed_at})]")  # asked again when it landed, then done


# ---- SGLang's scheduler (scheduler: sglang) ----------------------------------------------------------------------

def test_sglang_never_runs_a_prefill_chunk_beside_decodes():
    """SGLang runs a prefill batch (new prompts, the next chunk of a chunked one) whenever it can form one and a
    decode batch otherwise: with prompts longer than the token budget, vLLM V1 mixes chunks into decode steps and
    SGLang never does; both serve every request once, and SGLang's KV pool is token-granular."""
    where = scenario(platform="paper-cxl", xpus=2, tp=2)
    results = {}
    for scheduler in ("vllm-v1", "sglang"):
        mix = spec(scheduler=scheduler, max_num_batched_tokens=512)
        results[scheduler] = simulate_serving(where, mix)
        served_once(results[scheduler], mix)
    assert results["vllm-v1"]["steps_by_kind"]["mixed"] > 0
    assert results["sglang"]["steps_by_kind"]["mixed"] == 0
    assert results["sglang"]["steps_by_kind"]["prefill"] > results["vllm-v1"]["steps_by_kind"]["prefill"]
    _, _, config, _, _, _ = _checked(where, spec(scheduler="sglang"))
    assert config.block_size == 1 and config.prefill_first and config.chunked_prefill and not config.chunks_with_decodes


def test_sglang_admits_a_request_only_while_its_prompt_and_expected_output_fit():
    """Two 3,000-token prompts with 2,000-token outputs at once, on a replica whose HBM holds 8,000 tokens of KV
    cache: both prompts fit (6,000), so vLLM V1 prefills them together; SGLang admits the first (5,000 tokens of
    prompt and expected output < 8,000) and not the second beside it (5,000 more would exceed the 3,000 left),
    nor while the first decodes (its expected output stays reserved), so the second's first token comes after
    the first's finish (dgx-h100: no extended memory to admit into)."""
    from hcsim.workload.serving import scheduler_config

    where = scenario(platform="dgx-h100", xpus=2, tp=2, devices=None)
    base = spec(requests=2, rate=None, prompt=(3000, 3000), output=(2000, 2000), scheduler="sglang")
    _, platform, _, _, _, _ = _checked(where, base)
    token = platform.token_bytes  # one XPU's KV bytes of a token: a block of SGLang's pool
    share = (platform.weights + platform.workspace + 8000.5 * token) / H100.memory
    results = {}
    for scheduler in ("vllm-v1", "sglang"):
        mix = replace(base, scheduler=scheduler, gpu_memory_utilization=share)
        _, sized, config, _, _, _ = _checked(where, mix)
        assert sized.hbm_blocks * config.block_size == pytest.approx(8000, abs=16)  # the premise
        results[scheduler] = simulate_serving(where, mix)
        served_once(results[scheduler], mix)
    first, second = results["vllm-v1"]["per_request"]
    assert first["first_token_s"] == second["first_token_s"]
    first, second = results["sglang"]["per_request"]
    assert second["first_token_s"] > first["finish_s"]
    assert scheduler_config(base, "H100", H100.memory).new_token_ratio is not None


def test_sglangs_new_token_ratio_falls_linearly_to_its_floor_and_a_retraction_resets_it():
    """SGLang's defaults: 0.7 falling to 0.7 x 0.14 over 600 decode steps; after a retraction, (tokens made + 20
    per request kept) / (their outputs + 1), at most 1."""
    from hcsim.workload.serving import SCHEDULERS

    estimate = SCHEDULERS["sglang"]["new_token_ratio"]
    assert estimate.after_decodes(0.7, 300) == pytest.approx(0.7 - 300 * (0.7 - 0.098) / 600)
    assert estimate.after_decodes(0.7, 600) == pytest.approx(0.098)
    assert estimate.after_decodes(0.7, 10_000) == estimate.floor == pytest.approx(0.098)
    assert estimate.after_retraction(made=100, outputs=1999, running=5) == pytest.approx((100 + 100) / 2000)
    assert estimate.after_retraction(made=100, outputs=10, running=5) == 1.0


def test_a_step_charges_the_schedulers_host_time_unless_step_overhead_is_given():
    """SGLang's overlap scheduler hides the host's work (0 s a step); vLLM's steps wait for it (STEP_OVERHEAD);
    serving.step_overhead, where given, is what every step takes, and the run's summary says the same."""
    from hcsim.workload.serving import STEP_OVERHEAD

    where = scenario(platform="paper-cxl", xpus=2, tp=2)
    for keys, host in ((dict(scheduler="sglang"), 0.0), (dict(scheduler="vllm-v1"), STEP_OVERHEAD),
                       (dict(scheduler="sglang", step_overhead=2e-4), 2e-4)):
        mix, platform, config, _, _, _ = _checked(where, spec(**keys))
        assert _StepCost(mix, platform).work(1, 1, (), 1, 100, 0).host == host == config.step_overhead
