"""hcsim plan: enumeration invariants, the memory filter, the closed-form estimate against the engine's
rules, speed-proportional layer splits on mixed clusters, and the command end to end."""

import csv
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hcsim.engine.api import RunOptions
from hcsim.run.simulation import simulate_graphs
from hcsim.platform import build_platform, load_platform_spec
from hcsim.platform.routes import route_bandwidth, route_latency
from hcsim.platform.topology import xpus as platform_xpus
from hcsim.study.plan import Search, candidates, estimate, fits, rank_correlation, zero2_twins
from hcsim.workload import load_workload_spec, validate_workload
from hcsim.workload.hybrid import Parallelism, block_costs, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.memory import stage_memory
from hcsim.workload.split import largest_remainder

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from cases import FAST, ZERO_SHAPE, hybrid_spec as tiny_spec, iteration_time  # noqa: E402
from hcsim.platform.builders import single_switch  # noqa: E402
from hcsim.study.plan import Candidate  # noqa: E402


def test_rank_correlation_of_known_orders():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert rank_correlation([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)  # 1 - 6·4/(5·24)


@pytest.mark.parametrize("decoders, speeds, expected", [(8, [3, 1], (6, 2)), (80, [989, 312], (61, 19)),
                                                        (10, [1, 1, 1], (4, 3, 3))])
def test_a_proportional_split_follows_speed_and_sums_to_the_decoders(decoders, speeds, expected):
    split = largest_remainder(decoders, speeds)
    assert sum(split) == decoders and min(split) >= 1
    assert sorted(split, reverse=True) == sorted(expected, reverse=True)


def test_every_candidate_is_a_valid_split_of_the_cluster():
    spec = load_workload_spec("llama2-7b")
    xpus = [f"x{i}" for i in range(32)]
    found = candidates(spec, xpus, 64, server_size=8)
    assert found
    for candidate in found:
        par = candidate.parallelism
        assert par.tp * par.pp * par.dp * par.cp == 32 and par.tp <= 8
        assert 64 % (par.dp * par.micro_batch) == 0 and spec.model.heads % par.tp == 0
        par.check_model(spec)  # raises if the model cannot be split this way


def test_what_does_not_fit_says_which_stage_and_how_much():
    spec = load_workload_spec("llama2-70b", {"training.precision": "bf16"})
    platform = build_platform(load_platform_spec("paper-cxl"), 16)
    xpus = platform_xpus(platform)[:16]
    pure_dp = Candidate(parallelism=Parallelism(dp=16, global_batch=16))
    assert fits(spec, pure_dp, platform, xpus).startswith("stage 0 needs ")  # 70B x 16 B on one 80 GiB XPU
    sharded = Candidate(parallelism=Parallelism(tp=8, pp=2, global_batch=2, recompute="full"))  # 70 GB each
    assert fits(spec, sharded, platform, xpus) is None


@pytest.mark.parametrize("schedule, v, p, m", [("1f1b", 1, 2, 8), ("interleaved", 2, 2, 8), ("zb-h1", 1, 4, 1),
                                                ("zb-h1", 1, 4, 2), ("zb-h1", 1, 4, 8)])
def test_the_estimate_is_the_engine_s_time_without_contention(schedule, v, p, m):
    """Uniform stages and nearly free communication (the fast platform of test_hybrid_schedules): the closed
    form Σ τ + (m - 1)·max τ (bubble / v when interleaved; ZB-H1's (p-1)(F+B) less the weight gradients of
    min(m, p) - 1 micro-batches, Qi et al.'s (p-1)(F+B-W) from m = p) is what the executor's rules give."""
    par = Parallelism(pp=p, global_batch=m, schedule=schedule, virtual_stages=v)
    platform = single_switch(p, FAST, xpu_link_bandwidth=1e18, xpu_link_latency=1e-15, hbm_latency=1e-15)
    estimated = estimate(tiny_spec(), Candidate(parallelism=par), platform, [f"xpu{i}" for i in range(p)])
    assert estimated == pytest.approx(iteration_time(par), rel=1e-5)


def _stage_compute(split: list[int] | None) -> list[float]:
    settings = ["xpus=16", "devices=[H100,A100]", "platform_overrides.rack.servers=1", "workload=llama2-7b",
                "pp=2", "global_batch=4", "iterations=1", "tp=8",
                "compute_model=peak"]  # compute in proportion to peak FLOP/s
    if split:
        settings.append(f"layer_split=[{split[0]},{split[1]}]")
    args = [a for s in settings for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", "--json", *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    stages = json.loads(done.stdout)["stages"]
    return [stages[s]["compute_s"] for s in ("0", "1")]


def test_a_speed_proportional_layer_split_equalises_the_stages_compute():
    """H100 stage and A100 stage (FP32: 67 and 19.5 TFLOP/s): an even split leaves the A100 stage 3.4x
    longer; the proportional split leaves them within one decoder's time."""
    even = _stage_compute(None)
    split = largest_remainder(32, [67e12, 19.5e12])
    proportional = _stage_compute(list(split))
    assert even[1] / even[0] == pytest.approx(67 / 19.5, rel=0.05)
    one_decoder = proportional[1] / split[1]
    assert abs(proportional[0] - proportional[1]) <= one_decoder


def test_plan_runs_end_to_end_on_a_mixed_cluster(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "plan", "llama2-7b", "--xpus", "16", "--global-batch",
                           "16", "--devices", "H100,A100", "--set", "platform_overrides.rack.servers=1", "--top", "3",
                           "--jobs", "2", "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fit in local memory" in done.stdout
    assert "not meaningful with 3 simulated plans (it needs 5" in done.stdout and "Spearman" not in done.stdout
    rows = list(csv.DictReader((tmp_path / "plan.csv").open()))
    enumerated = int(done.stdout.split(" configurations")[0].split()[-1])
    assert len(rows) == enumerated and (tmp_path / "plan.png").stat().st_size > 0  # every candidate, not the top 3
    for column in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "virtual_stages", "zero", "estimated_s",
                   "estimated_memory_gb"):
        assert all(float(r[column]) >= 0 for r in rows), column  # numbers, never blank or prose
    assert {r["schedule"] for r in rows} <= {"1f1b", "zb-h1", "interleaved"}
    assert {r["fits"] for r in rows} == {"True", "False"}
    assert all((r["fit_reason"] == "") == (r["fits"] == "True" and r["rank"] != "") for r in rows)
    simulated = [r for r in rows if r["simulated"] == "True"]
    ranks = sorted(int(r["rank"]) for r in simulated)  # the estimate's best two first (--jobs 2), then the search's
    assert len(ranks) == 3 and ranks[:2] == [1, 2] and "simulated 3 of" in done.stdout and "(--top 3 reached)" in done.stdout
    for row in simulated:  # each simulated plan's scenario runs as it is and gives the simulated time
        assert row["plan"] in done.stdout  # its description in full in the terminal
        run = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", str(tmp_path / row["scenario"]),
                              "--json"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        assert json.loads(run.stdout)["iteration_time_s"] == pytest.approx(float(row["simulated_s"]), rel=1e-9)


def test_plan_refuses_a_table_costed_workload_before_enumerating_and_names_its_shape_twin():
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "plan", "llama2-13b", "--platform", "paper-cxl",
                           "--xpus", "256", "--global-batch", "512", "--devices", "H100,A100"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "configurations" not in done.stdout
    assert "costs: table" in done.stderr
    assert ("hcsim plan llama2-13b-shape --platform paper-cxl --xpus 256 --global-batch 512 --devices H100,A100"
            in done.stderr) and "--set precision=fp32" in done.stderr


# --- ZeRO stages ------------------------------------------------------------------------------------------


def test_zero_stages_are_enumerated_only_where_a_dp_group_shards_them():
    spec = load_workload_spec("llama2-7b")
    found = candidates(spec, [f"x{i}" for i in range(32)], 64, server_size=8)
    by_plan: dict = {}
    for candidate in found:
        par = candidate.parallelism
        by_plan.setdefault(replace(par, zero=0), set()).add(par.zero)
    assert {(p.dp > 1, frozenset(z)) for p, z in by_plan.items()} == {(True, frozenset({0, 1, 2, 3})),
                                                                      (False, frozenset({0}))}
    assert all("zero" in c.settings() for c in found)
    assert {c.label().count("ZeRO-") for c in found} == {0, 1}  # stage 0 is not named in a label


def _seventy_b(zero: int) -> tuple:
    """LLaMA2-70B in BF16 on 16 XPUs of paper-cxl as tp 8 x dp 2, full recomputation, at ZeRO `zero`."""
    spec = load_workload_spec("llama2-70b", {"training.precision": "bf16"})
    platform = build_platform(load_platform_spec("paper-cxl"), 16)
    par = Parallelism(tp=8, dp=2, global_batch=2, recompute="full", zero=zero)
    return spec, Candidate(parallelism=par), platform, platform_xpus(platform)[:16]


def _need(spec, par, stage_zero: int) -> float:
    """stage_memory of the one pipeline stage (both ends, one micro-batch in flight) at ZeRO `stage_zero`, with the
    workload's main gradients, plus the process's framework_reserve."""
    from hcsim.workload.memory import framework_reserve

    memory = stage_memory(spec.model, layers=spec.model.decoders, first=True, last=True, in_flight=1,
                          micro_batch=par.micro_batch, tp=par.tp, precision=spec.precision, attention=spec.attention,
                          optimizer=spec.optimizer, recompute=par.recompute, dp=par.dp, zero_stage=stage_zero,
                          gradient=spec.main_gradient)
    return memory.total + framework_reserve(memory.activations)


def test_a_plan_too_big_at_zero_0_fits_at_zero_3_and_the_reason_names_the_stage_and_bytes():
    """18 B per parameter (FP32 main gradients) on 8.6 G parameters per TP rank (155 GB) do not fit in 80 GiB;
    sharded over dp 2 at ZeRO-3 (9 B per parameter, plus two gathered units) they do."""
    spec, unsharded, platform, xpus = _seventy_b(0)
    reason = fits(spec, unsharded, platform, xpus)
    need = _need(spec, unsharded.parallelism, 0)
    assert reason == f"stage 0 needs {need / 1e9:.1f} GB per XPU, each H100 holds {80 * 2**30 / 1e9:.1f} GB, at ZeRO stage 0"
    assert fits(spec, _seventy_b(3)[1], platform, xpus) is None


def test_zero_3_also_needs_room_for_two_gathered_units():
    """An XPU whose memory holds ZeRO-3's sharded stage but not the two largest units gathered at once (here a
    decoder on one TP rank, BF16: larger than the 32000 x 8192 / 8 embedding) is refused, with the gathered
    bytes in the need."""
    spec, candidate, platform, xpus = _seventy_b(3)
    sharded = _need(spec, candidate.parallelism, 3)
    attn, mlp = block_costs(spec, 1, 8)
    assert attn.parameters + mlp.parameters > spec.model.vocabulary * spec.model.hidden / 8
    unit = (attn.parameters + mlp.parameters) * spec.sizes.weight
    for x in xpus:
        platform.nodes[platform.nodes[x]["local_memory"]]["capacity"] = sharded + unit
    reason = fits(spec, candidate, platform, xpus)
    assert reason is not None and f"needs {(sharded + 2 * unit) / 1e9:.1f} GB" in reason
    assert reason.endswith("at ZeRO stage 3")


def test_rings_that_cross_one_link_share_its_bandwidth():
    """paper-cxl, 32 XPUs as tp 8 x dp 4: a leaf CXL switch serves two servers, so each of the 8 DP rings (one
    per TP rank) steps from a leaf's second server to the next leaf: 8 steps share each uplink direction. The
    TP rings, one per server, have their XPU links to themselves."""
    from hcsim.study.plan import _Cluster

    platform = build_platform(load_platform_spec("paper-cxl"), 32)
    cluster = _Cluster(platform, ParallelLayout(platform_xpus(platform)[:32], {"tp": 8, "dp": 4}))
    crossing = cluster.route("xpu8", "xpu16")
    uplink = platform.edges[crossing[1], crossing[2]]
    assert cluster.ring("dp") == (pytest.approx(route_latency(platform, crossing)), uplink["bandwidth"] / 8)
    neighbours = cluster.route("xpu0", "xpu1")
    assert cluster.ring("tp") == (pytest.approx(route_latency(platform, neighbours)),
                                  route_bandwidth(platform, neighbours))


def test_nccl_channel_rings_cross_between_servers_over_every_nic():
    """dgx-h100, 16 XPUs as dp 16 over two servers: one plain ring crosses between the servers through one NIC
    each way, so a step runs at a NIC's bandwidth. NCCL's 8 channel rings as the engine builds them
    (hcsim.engine.collectives.channel_ring_orders) each carry 1/8 of the step and cross on one rail, local rank
    r to local rank r, each through its own NIC and leaf switch: a step runs at the slower of the 8 NICs
    together and an XPU's own NVLink."""
    from hcsim.study.plan import _Cluster

    platform = build_platform(load_platform_spec("dgx-h100"), 16)
    cluster = _Cluster(platform, ParallelLayout(platform_xpus(platform)[:16], {"dp": 16}))
    crossing = cluster.route("xpu7", "xpu15")  # rail 7
    nic = min(platform.edges[link]["bandwidth"] for link in zip(crossing, crossing[1:]))
    inside = route_bandwidth(platform, cluster.route("xpu0", "xpu1"))
    assert cluster.ring("dp")[1] == pytest.approx(nic)
    assert cluster.ring("dp", nccl=True)[1] == pytest.approx(min(8 * nic, inside))


def _zero_engine(zero: int, bandwidth: float) -> tuple[float, float]:
    """(estimated, engine) iteration time of the tiny model of test_zero_offload as dp 2, two micro-batches,
    at ZeRO `zero`, on a switch of `bandwidth` B/s links, through the engine."""
    platform = single_switch(2, FAST, xpu_link_bandwidth=bandwidth, xpu_link_latency=1e-9, hbm_latency=1e-15)
    xpus = ["xpu0", "xpu1"]
    spec = load_workload_spec("gpt3-175b", ZERO_SHAPE)
    par = Parallelism(dp=2, global_batch=4, zero=zero)
    graph = build_hybrid_graph(spec, par, ParallelLayout(xpus, {"dp": 2}))
    validate_workload(graph, xpus)
    ends = simulate_graphs(platform, graph, RunOptions(iterations=2))["iteration_ends"]
    return estimate(spec, Candidate(parallelism=par), platform, xpus), ends[1] - ends[0]


@pytest.mark.parametrize("bandwidth", [1e11, 1e10, 1e9])  # ZeRO-3 gathers hidden, half hidden, exposed
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_the_zero_estimate_is_the_engine_s_time_without_contention(zero, bandwidth):
    estimated, engine = _zero_engine(zero, bandwidth)
    assert estimated == pytest.approx(engine, rel=1e-6)


# decoders of 50 M parameters each (4h^2 + 2h.ffn): above Megatron-LM's 40 M bucket, so one gradient bucket each
BUCKETED_SHAPE = {**ZERO_SHAPE, "model.decoders": 4, "model.hidden": 2048, "model.heads": 16, "model.ffn": 8192}


@pytest.mark.parametrize("fp32_grads", [False, True])  # FP32 main gradients (BF16's default): 4 B reduced, not 2
@pytest.mark.parametrize("bandwidth", [1e10, 1e9])  # a bucket's ring shorter, longer than a decoder's backward
def test_the_bucketed_gradient_reduction_estimate_is_the_engine_s_time(bandwidth, fp32_grads):
    """ZeRO-1 over 2 ranks, whose updated weights' gathers overlap: by default each decoder's gradients are
    reduce-scattered as soon as its last backward is done, one bucket after another (overlap_grad_reduce), so
    only what runs past the backward pass shows; the estimate follows the engine to 1e-6 with the overlap and
    without it, and the overlap is faster."""
    platform = single_switch(2, FAST, xpu_link_bandwidth=bandwidth, xpu_link_latency=1e-9, hbm_latency=1e-15)
    xpus, par = ["xpu0", "xpu1"], Parallelism(dp=2, global_batch=4, zero=1)
    times = {}
    for overlap in (True, False):
        spec = load_workload_spec("gpt3-175b", {**BUCKETED_SHAPE, "training.overlap_grad_reduce": overlap,
                                                "training.grad_reduce_in_fp32": fp32_grads})
        graph = build_hybrid_graph(spec, par, ParallelLayout(xpus, {"dp": 2}))
        buckets = [n for n, d in graph.nodes(data=True) if d.get("phase") == "allreduce"]
        assert len(buckets) == (4 if overlap else 1)
        ends = simulate_graphs(platform, graph, RunOptions(iterations=2))["iteration_ends"]
        times[overlap] = ends[1] - ends[0]
        assert estimate(spec, Candidate(parallelism=par), platform, xpus) == pytest.approx(times[overlap], rel=1e-6)
    assert times[True] < times[False]


@pytest.mark.parametrize("precision", ["fp16", "fp8"])  # FP8: the all-gathers move half the bytes
@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("bandwidth", [1e10, 1e9, 1e8])  # the overlapped chunks shorter than a block, about as
# long, far longer
def test_the_overlapped_tp_estimate_is_the_engine_s_time(bandwidth, recompute, precision):
    """tp_comm_overlap (sequence parallel, tp 2, four micro-batches): each block pays max(block, its collectives'
    first t - 1 chunks) + the last chunk; the estimate follows the engine to 1e-6, and the overlap is never
    slower."""
    device = replace(FAST, peaks={"fp8": 2e12})
    platform = single_switch(2, device, xpu_link_bandwidth=bandwidth, xpu_link_latency=1e-9, hbm_latency=1e-15)
    xpus = ["xpu0", "xpu1"]
    par = Parallelism(tp=2, global_batch=4, sequence_parallel=True, recompute=recompute)
    times = {}
    for overlap in (True, False):
        spec = load_workload_spec("gpt3-175b", {**ZERO_SHAPE, "training.tp_comm_overlap": overlap,
                                                "training.precision": precision})
        graph = build_hybrid_graph(spec, par, ParallelLayout(xpus, {"tp": 2}))
        ends = simulate_graphs(platform, graph, RunOptions(iterations=2))["iteration_ends"]
        times[overlap] = ends[1] - ends[0]
        assert estimate(spec, Candidate(parallelism=par), platform, xpus) == pytest.approx(times[overlap], rel=1e-6)
    assert times[True] <= times[False]


def test_zero_1_and_2_cost_zero_0_less_the_sharded_optimizer_step():
    """Reduce-scatter + all-gather move the all-reduce's bytes (w = g = 2 B in FP16), so with the gather after the
    step (overlap_param_gather false) ZeRO-1 saves exactly the optimizer step on the other half of the
    parameters; ZeRO-2 differs from 1 in memory only."""
    spec = load_workload_spec("gpt3-175b", {**ZERO_SHAPE, "training.overlap_param_gather": False})
    platform = single_switch(2, FAST, xpu_link_bandwidth=1e10, xpu_link_latency=1e-9, hbm_latency=1e-15)
    times = [estimate(spec, Candidate(parallelism=Parallelism(dp=2, global_batch=4, zero=z)), platform,
                      ["xpu0", "xpu1"]) for z in range(3)]
    attn, mlp = block_costs(spec, 1, 1)
    step = spec.optimizer_flops_per_parameter * spec.model.decoders * (attn.parameters + mlp.parameters) / 1e12
    assert spec.sizes.weight == spec.sizes.gradient
    assert times[0] - times[1] == pytest.approx(step / 2, rel=1e-9)
    assert times[2] == times[1]


def test_zero_2_twins_of_a_fitting_zero_1_plan_are_not_ranked():
    plans = [Candidate(parallelism=Parallelism(dp=2, global_batch=2, zero=z)) for z in (1, 2)]
    lone = Candidate(parallelism=Parallelism(dp=2, global_batch=4, zero=2))
    assert zero2_twins(plans + [lone]) == {plans[1]}


# --- the sweep's executor -----------------------------------------------------------------------------------


def test_plan_simulations_run_on_the_sweep_s_executor_and_come_back_in_order():
    from hcsim.run.scenario import load_scenario
    from hcsim.study.points import run_points

    scenarios = [load_scenario(None, {"xpus": n, "iterations": 1, "platform_overrides": {"rack.servers": 1}})
                 for n in (4, 2, 8)]
    results = dict(run_points(scenarios, jobs=2, executor="local"))
    assert sorted(results) == [0, 1, 2]
    assert [results[i]["xpus"] for i in range(3)] == [4, 2, 8]


def test_plan_refuses_an_unknown_executor_before_enumerating():
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "plan", "llama2-7b", "--xpus", "16", "--global-batch",
                           "16", "--executor", "ray://x"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "expected 'local' or 'dask://HOST:PORT'" in done.stderr
    assert "configurations" not in done.stdout


def test_plan_simulates_on_a_dask_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(processes=True, n_workers=1, threads_per_worker=2, dashboard_address=None) as cluster:
        address = cluster.scheduler_address.removeprefix("tcp://")
        done = subprocess.run([sys.executable, "-m", "hcsim.cli", "plan", "llama2-7b", "--xpus", "16",
                               "--global-batch", "16", "--devices", "H100,A100", "--set",
                               "platform_overrides.rack.servers=1", "--top", "2", "--executor", f"dask://{address}",
                               "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [r for r in csv.DictReader((tmp_path / "plan.csv").open()) if r["simulated"] == "True"]
    assert len(rows) == 2 and all(float(r["simulated_s"]) > 0 for r in rows)


def test_simulations_go_longest_first_and_come_back_in_rank_order(monkeypatch):
    """More micro-batches (and ZeRO-3's gathers, x2) make a longer simulation: submitted first, so that two jobs
    do not end on a long one; each result still lands on its own plan."""
    import hcsim.study.points
    from hcsim.cli.plan import _simulate
    from hcsim.run.scenario import load_scenario

    plans = [Parallelism(dp=2, global_batch=4), Parallelism(dp=2, global_batch=12),
             Parallelism(dp=2, global_batch=8, zero=3), Parallelism(dp=2, global_batch=8)]
    submitted = []

    def run_points(points, **_):
        submitted.extend(p.global_batch for p in points)
        for index in reversed(range(len(points))):  # finishing in any order
            yield index, {"global_batch": points[index].global_batch, "zero": points[index].zero}

    monkeypatch.setattr(hcsim.study.points, "run_points", run_points)
    results = _simulate(load_scenario(None, {}), [(1.0, Candidate(parallelism=p)) for p in plans], 2, "local", None)
    assert submitted == [8, 12, 8, 4]  # m = 4 x 2 (ZeRO-3), 6, 4, 2
    assert [(r["global_batch"], r["zero"]) for r in results] == [(p.global_batch, p.zero) for p in plans]


# --- batch split on a mixed cluster ---------------------------------------------------------------------


def _mixed_cluster():
    """16 XPUs in racks of one server, H100 and A100 alternating: tp 8 puts one replica on each type."""
    from hcsim.cli.plan import _speeds

    spec = load_platform_spec("paper-cxl", {"rack.servers": 1, "devices": ["H100", "A100"]})
    platform = build_platform(spec, 16)
    xpus = platform_xpus(platform)[:16]
    model = load_workload_spec("llama2-7b", {"model.decoders": 4})
    return model, platform, xpus, _speeds(platform, xpus, model.precision, "dp")


def test_a_mixed_cluster_tries_the_proportional_batch_split_the_run_will_resolve():
    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import Scenario

    model, platform, xpus, replica_speeds = _mixed_cluster()
    found = [c for c in candidates(model, xpus, 16, 8, replica_speeds=replica_speeds) if c.batch == "proportional"]
    assert found and all(c.parallelism.zero < 3 and c.parallelism.dp > 1 for c in found)
    pick = next(c for c in found if c.parallelism.tp == 8 and c.parallelism.micro_batch == 1)
    speeds = replica_speeds(8, 1)
    assert pick.parallelism.batch_split == largest_remainder(16, speeds)  # H100 replica 12, A100 replica 4
    assert "batch 12x1/4x1" in pick.label()
    run = prepare(Scenario(workload="llama2-7b", workload_overrides={"model.decoders": 4}, xpus=16,
                           devices=("H100", "A100"), platform_overrides={"rack.servers": 1}, **pick.settings()))
    assert tuple(run.workload.graph["batch_split"]) == pick.parallelism.batch_split


def test_the_estimate_of_a_batch_split_is_paced_by_its_slowest_replica():
    """pp 1: the estimate is max over replicas of m_r x t_r (a micro-batch's time on replica r's devices) plus
    terms the split leaves alone; t_A100 and those terms from two even estimates, t_H100 from a 15/1 split."""
    model, platform, xpus, replica_speeds = _mixed_cluster()
    both = {c.batch: c for c in candidates(model, xpus, 16, 8, replica_speeds=replica_speeds)
            if (c.parallelism.tp, c.parallelism.pp, c.parallelism.micro_batch, c.parallelism.zero) == (8, 1, 1, 0)
            and c.parallelism.recompute == "none" and c.parallelism.cp == 1}
    par = both["even"].parallelism

    def time_of(**change) -> float:
        return estimate(model, Candidate(parallelism=replace(par, **change)), platform, xpus)

    even, single = time_of(), time_of(global_batch=2)  # 8 t_A + rest, t_A + rest
    t_a100 = (even - single) / 7
    rest = single - t_a100
    t_h100 = (time_of(batch_split=(15, 1)) - rest) / 15  # 15 t_H > t_A
    assert t_h100 < t_a100 / 2  # the H100 replica is the faster one (FP32: 67 against 19.5 TFLOP/s)
    counts = both["proportional"].parallelism.batch_split
    proportional = estimate(model, both["proportional"], platform, xpus)
    assert proportional == pytest.approx(max(counts[0] * t_h100, counts[1] * t_a100) + rest, rel=1e-9)
    assert proportional < even


def test_plan_enumerates_context_parallelism_for_flash_attention_and_estimates_it():
    """cp 2, 4, 8 beside cp 1 for a flash-attention workload (none without flash); a cp plan holds s/cp of the
    activations and its estimate is finite; its settings name cp for the run."""
    from hcsim.platform import build_platform, load_platform_spec
    from hcsim.platform.topology import xpus as platform_xpus
    from hcsim.study.plan import candidates, estimate, stage_needs
    from hcsim.workload.spec import load_workload_spec

    spec = load_workload_spec("llama3-8b", {"training.attention": "flash", "model.decoders": 4,
                                            "model.sequence": 32768})
    platform = build_platform(load_platform_spec("dgx-h100"), 16)
    xpus = platform_xpus(platform)[:16]
    found = candidates(spec, xpus, 8, 8)
    assert {c.parallelism.cp for c in found} == {1, 2, 4, 8}
    standard = load_workload_spec("llama3-8b", {"model.decoders": 4, "training.attention": "standard"})
    assert {c.parallelism.cp for c in candidates(standard, xpus, 2, 8)} == {1}
    def plan(cp):
        return next(c for c in found if (c.parallelism.tp, c.parallelism.pp, c.parallelism.cp) == (2, 1, cp)
                    and c.parallelism.recompute == "none" and c.parallelism.zero == 0
                    and c.parallelism.micro_batch == 1)

    one, four = plan(1), plan(4)
    assert four.settings()["cp"] == 4 and "cp" not in one.settings()
    assert math.isfinite(estimate(spec, four, platform, xpus)) and estimate(spec, four, platform, xpus) > 0
    # the same state per XPU (tp 2, no ZeRO), a quarter of the activations
    assert stage_needs(spec, four, platform, xpus)[0][1] < stage_needs(spec, one, platform, xpus)[0][1]


# --- the search: which plans to simulate ------------------------------------------------------------------------


def _replay(search: Search, times: dict, jobs: int = 2) -> object:
    """Run `search` to its end with `times` as the simulations' results; its pick."""
    while not search.finished():
        for plan in search.next(jobs):
            search.record(plan, times[plan])
    return min((p for p, s in search.simulated.items() if s is not None), key=times.get)


def test_with_exact_estimates_the_search_simulates_few_plans_and_picks_the_best():
    estimates = {f"p{i}": 1.0 + 0.01 * i for i in range(100)}
    search = Search(estimates, shape=lambda plan: ("1f1b", 1, 1, 1))  # one shape: its factor is 1
    assert _replay(search, estimates) == "p0"
    assert len(search.simulated) == 6  # p0..p5 are within 5 % of 1.0; p6 (1.06) is not
    assert search.finished() == "no plan left is within 5% of the best simulated (1 s)"


def test_a_shape_the_estimate_flatters_does_not_hide_the_best_plan():
    """Zero-bubble plans estimated 20 % too fast (their bubble is not the closed form's): their factor, once one
    has run, ranks the rest of them, and the 1F1B plans' best, estimated 10 % slower, is still simulated."""
    shapes = {**{f"zb{i}": ("zb-h1", 1, 2, 1) for i in range(30)}, **{f"f{i}": ("1f1b", 2, 1, 1) for i in range(30)}}
    estimates = {**{f"zb{i}": 1.0 + 0.01 * i for i in range(30)}, **{f"f{i}": 1.1 + 0.01 * i for i in range(30)}}
    times = {p: estimates[p] * (1.2 if p.startswith("zb") else 1.0) for p in estimates}
    search = Search(estimates, shape=shapes.get)
    assert _replay(search, times) == "f0" == min(times, key=times.get)
    assert len(search.simulated) < 15  # of 60
    top5 = sorted(estimates, key=estimates.get)[:5]
    assert all(p.startswith("zb") for p in top5)  # what simulating the estimate's top 5 would have picked from


def test_without_a_margin_the_search_simulates_every_plan():
    estimates = {f"p{i}": float(i + 1) for i in range(9)}
    search = Search(estimates, shape=lambda plan: plan, margin=math.inf, explore=math.inf)
    _replay(search, estimates, jobs=4)
    assert len(search.simulated) == 9 and search.finished() == "every fitting plan simulated"


def test_failed_simulations_are_never_the_pick_and_do_not_stop_the_search():
    estimates = {"a": 1.0, "b": 1.02, "c": 1.04}
    search = Search(estimates, shape=lambda plan: plan)
    assert _replay(search, {"a": None, "b": 1.3, "c": 1.2}, jobs=1) == "c"


def test_under_the_kernel_model_the_estimate_s_rings_run_at_nccl_s_achieved_bandwidth():
    """The kernel model's collectives move each transfer at its route's link factor (NCCL below line rate: NVLink 4
    at 0.822 on H100); the estimate's rings do the same, so a TP ring inside a DGX H100 node runs at the factor
    times its NVLink bandwidth, and without the kernel model at the link's own."""
    from hcsim.engine.compute_model import load_compute_model
    from hcsim.study.plan import _Cluster, cluster_layout

    model = load_compute_model()
    platform = build_platform(load_platform_spec("dgx-h100"), 8)
    xpus = platform_xpus(platform)[:8]
    layout = cluster_layout(xpus, Parallelism(tp=8, global_batch=1))
    plain, nccl = _Cluster(platform, layout).ring("tp", True), _Cluster(platform, layout, model).ring("tp", True)
    route = _Cluster(platform, layout).route(xpus[0], xpus[1])
    factor = model.route_link(platform, route).bandwidth_factor
    assert factor < 1 and model.link("xpu_link", "H100").bandwidth_factor == factor
    assert nccl == (plain[0], pytest.approx(plain[1] * factor, rel=1e-12))
    assert plain[1] == route_bandwidth(platform, route)


@pytest.mark.parametrize("zero, cp", [(0, 1), (1, 1), (1, 2), (2, 1)])
def test_the_estimate_s_optimizer_step_is_the_engine_s(zero, cp):
    """Under the kernel model the estimate times the step's kernels as the simulation does: its vertex's kernels
    on the stage's device (a model without a vocabulary: a stage holds its decoders' parameters alone, as the
    estimate counts them); under the peak model the shard is the optimizer's, dp x cp ranks under ZeRO 1."""
    from hcsim.engine.compute_model import load_compute_model
    from hcsim.study.plan import _Cluster, _optimizer, cluster_layout

    spec = replace(load_workload_spec("llama3-8b"), precision="fp8")
    spec = replace(spec, model=replace(spec.model, decoders=4, vocabulary=0))
    par = Parallelism(dp=2, cp=cp, zero=zero, micro_batch=1, global_batch=2)
    platform = build_platform(load_platform_spec("dgx-h100"), 8)
    xpus = platform_xpus(platform)[:2 * cp]
    layout = cluster_layout(xpus, par)
    graph = build_hybrid_graph(spec, par, layout)
    model = load_compute_model()
    peak, bandwidth, device = _Cluster(platform, layout).slowest_device(0, spec.precision)
    decoder = sum(block.parameters for block in block_costs(spec, 1, 1, cp=cp))
    engine = model.time(graph.nodes["s0.optimizer"]["ops"], device, peak, bandwidth)
    assert _optimizer(spec, par, _Cluster(platform, layout, model), 0, 4 * decoder, 4) == pytest.approx(engine)
    closed = _optimizer(spec, par, _Cluster(platform, layout), 0, 4 * decoder, 4)
    unsharded = _optimizer(spec, replace(par, zero=0), _Cluster(platform, layout), 0, 4 * decoder, 4)
    assert closed == pytest.approx(unsharded / par.optimizer_shards) and par.optimizer_shards == (2 * cp if zero else 1)


@pytest.mark.parametrize("workload", ["llama3-8b", "gpt2-hf"])
def test_the_estimate_s_closed_form_optimizer_step_is_the_peak_model_s(workload):
    """Under the peak model the step is its vertex's max(FLOP / peak, bytes / bandwidth): the state read and
    written for Megatron-LM, fused AdamW's and the clipping's bytes for a PyTorch inventory (one rule:
    hybrid.optimizer_traffic)."""
    from hcsim.study.plan import _Cluster, _optimizer, cluster_layout

    spec = load_workload_spec(workload)
    spec = replace(spec, model=replace(spec.model, decoders=2, vocabulary=0))
    par = Parallelism(micro_batch=1, global_batch=1)
    platform = build_platform(load_platform_spec("dgx-h100"), 8)
    layout = cluster_layout(platform_xpus(platform)[:1], par)
    vertex = build_hybrid_graph(spec, par, layout).nodes["s0.optimizer"]
    peak, bandwidth = _Cluster(platform, layout).slowest(0, spec.precision)
    decoder = sum(block.parameters for block in block_costs(spec, 1, 1))
    assert _optimizer(spec, par, _Cluster(platform, layout), 0, 2 * decoder, 2) == pytest.approx(
        max(vertex["flops"] / peak, vertex["memory_bytes"] / bandwidth), rel=1e-12)


@pytest.mark.parametrize("workload, recompute", [("llama3-8b", "none"), ("llama3-8b", "selective"),
                                                  ("gpt-megatron", "full"), ("gpt2-hf", "none"),
                                                  ("llama3.2-1b-hf", "full")])
def test_the_estimate_times_the_embedding_and_the_head_as_the_graph_runs_them(workload, recompute):
    """On one XPU (no communication) the kernel-model estimate is the time of every compute vertex's kernels, each
    vertex one instance: the decoders' (a block's backward with its weight gradients, as one vertex runs them), the
    optimizer step's over every parameter the stage holds, and the embedding's and the head's (for Llama 3's 128k
    vocabulary the logits and the loss take more than the two decoders; the estimate counted neither before); the
    GEMMs at the clock the power limit leaves them, by their share of all those vertices' time, as the engine's."""
    from hcsim.engine.compute_model import load_compute_model
    from hcsim.study.plan import _Cluster, cluster_layout

    spec = load_workload_spec(workload)
    spec = replace(spec, model=replace(spec.model, decoders=2, sequence=1024))
    par = Parallelism(micro_batch=1, global_batch=2, recompute=recompute)
    platform = build_platform(load_platform_spec("dgx-h100"), 8)
    xpus = platform_xpus(platform)[:1]
    layout = cluster_layout(xpus, par)
    model = load_compute_model()
    peak, bandwidth, device = _Cluster(platform, layout).slowest_device(0, spec.precision)
    graph = build_hybrid_graph(spec, par, layout)
    vertices = {n: d for n, d in graph.nodes(data=True) if d["kind"] == "compute"}
    assert sum(n.endswith((".embedding", ".head")) for n in vertices) == 8  # forward and backward, 2 micro-batches
    shares = [model.gemm_share(d["ops"], device, peak, bandwidth) for d in vertices.values()]
    clock = model.device(device).sustained_clock(math.fsum(g for g, _ in shares) / math.fsum(s for _, s in shares))
    engine = sum(model.time(d["ops"], device, peak, bandwidth, clock=clock) for d in vertices.values())
    assert estimate(spec, Candidate(parallelism=par), platform, xpus, model) == pytest.approx(engine, rel=1e-12)


def test_a_pytorch_inventory_is_planned_as_its_script_trains():
    """training.kernels pytorch-eager runs plain data parallelism at the workload's own checkpointing: the plan
    enumerates only those plans (before, it ranked TP, pipeline and ZeRO plans the run then refused)."""
    spec = load_workload_spec("gpt2-hf")
    found = candidates(spec, [f"x{i}" for i in range(4)], global_batch=16, server_size=8)
    assert found and all((c.parallelism.tp, c.parallelism.pp, c.parallelism.cp, c.parallelism.zero) == (1, 1, 1, 0)
                         and c.parallelism.recompute == spec.recomputation for c in found)
    assert {c.parallelism.dp for c in found} == {4}
