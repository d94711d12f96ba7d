"""batch_split on a two-device system, through the engine on SimGrid, against closed forms.

A fast device of 1 GFLOP/s and a slow one of 0.25 GFLOP/s (speed ratio 4; slow enough that an iteration of the
tiny model takes seconds, far above SimGrid's timing precision of 1e-9 s), memory of 1e20 B/s and links of
1e18 B/s and 1e-15 s: every vertex is compute-bound and communication costs nothing measurable, so an XPU's
compute time is its FLOPs / its speed and an iteration is the slowest replica's compute (plus its pipeline
bubble).

With M units (micro-batches, or samples in the paper's graph) split n_r over replicas of speed s_r and w
FLOP per unit, replica r computes c_r = n_r·w/s_r. Even (n_r = M/R): c_slow / c_fast = s_fast / s_slow.
Proportional (largest remainders, |n_r - M·s_r/S| < 1): |c_r - M·w/S| < w/s_r, so two replicas differ by
less than one unit's time on each, w/s_r + w/s_q.
"""

import pytest

from hcsim.engine.api import RunOptions
from hcsim.platform.builders import single_switch
from hcsim.platform.devices import Device
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import build_training_graph, load_workload_spec, validate_workload
from hcsim.workload.hybrid import Parallelism, block_costs, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.split import largest_remainder

FAST = Device(name="fast", fp32_flops=1e9, fp16_flops=1e9, memory=1e15, memory_bandwidth=1e20)
SLOW = Device(name="slow", fp32_flops=0.25e9, fp16_flops=0.25e9, memory=1e15, memory_bandwidth=1e20)
SHAPE = {"model.decoders": 4, "model.hidden": 64, "model.heads": 4, "model.ffn": 256, "model.sequence": 32,
         "model.vocabulary": 0, "training.precision": "fp16", "training.optimizer_flops_per_parameter": 0}


def spec(**overrides):
    return load_workload_spec("gpt3-175b", {**SHAPE, **overrides})


def two_devices(n: int, slow: set[str]):
    """n XPUs on one switch, those named in `slow` of the slow device."""
    platform = single_switch(n, FAST, xpu_link_bandwidth=1e18, xpu_link_latency=1e-15, hbm_latency=1e-15)
    for x in slow:
        platform.nodes[x].update(device=SLOW.name, peak_flops=dict(SLOW.peaks), fp32_flops=SLOW.fp32_flops,
                                 fp16_flops=SLOW.fp16_flops)
    return platform


def run(platform, graph, xpus):
    """Two iterations of `graph`, in a fresh process: the result's plain data."""
    validate_workload(graph, xpus)
    return simulate_graphs(platform, graph, RunOptions(iterations=2))


def hybrid_run(par: Parallelism, slow: set[str]):
    """(iteration time, per-XPU times) of `par` on the fast/slow switch."""
    n = par.tp * par.pp * par.dp
    xpus = [f"xpu{i}" for i in range(n)]
    graph = build_hybrid_graph(spec(), par, ParallelLayout(xpus, {"tp": par.tp, "pp": par.pp, "dp": par.dp}))
    outcome = run(two_devices(n, slow), graph, xpus)
    return outcome["iteration_ends"][1] - outcome["iteration_ends"][0], outcome["xpu_times"]


def unit_flops(pp: int = 1, tp: int = 2) -> float:
    """FLOP of one micro-batch's forward and backward on one XPU of a stage (w)."""
    attn, mlp = block_costs(spec(), 1, tp)
    return 4 // pp * (attn.fwd_flops + attn.bwd_flops + mlp.fwd_flops + mlp.bwd_flops)


SPEED = {"fast": FAST.fp16_flops, "slow": SLOW.fp16_flops}
# tp 2 x dp 2 over 4 XPUs: replica 0 is xpu0 and xpu1 (fast), replica 1 xpu2 and xpu3 (slow)
REPLICA = {"xpu0": "fast", "xpu1": "fast", "xpu2": "slow", "xpu3": "slow"}


def test_an_even_split_leaves_the_fast_replica_idle_for_the_speed_ratio():
    w = unit_flops()
    period, times = hybrid_run(Parallelism(tp=2, dp=2, global_batch=10), {"xpu2", "xpu3"})
    for x, kind in REPLICA.items():
        assert times[x]["compute_s"] == pytest.approx(5 * w / SPEED[kind], rel=1e-9)
    assert times["xpu2"]["compute_s"] / times["xpu0"]["compute_s"] == pytest.approx(4.0, rel=1e-9)
    assert period == pytest.approx(5 * w / SPEED["slow"], rel=1e-6)
    assert times["xpu0"]["idle_s"] == pytest.approx(5 * w / SPEED["slow"] - 5 * w / SPEED["fast"], rel=1e-6)


def test_a_proportional_split_equalises_compute_and_the_iteration_takes_m_w_over_the_total_speed():
    """M = 10 at speeds 4:1 gives 8 and 2 exactly: both replicas compute M·w/S, none idles; the even split's
    period 5·w/s_slow shrinks by S / (2·s_slow) = 2.5."""
    w = unit_flops()
    split = largest_remainder(10, [SPEED["fast"], SPEED["slow"]])
    assert split == (8, 2)
    period, times = hybrid_run(Parallelism(tp=2, dp=2, global_batch=10, batch_split=split), {"xpu2", "xpu3"})
    ideal = 10 * w / (SPEED["fast"] + SPEED["slow"])
    for x in REPLICA:
        assert times[x]["compute_s"] == pytest.approx(ideal, rel=1e-9)
        assert times[x]["idle_s"] == pytest.approx(0.0, abs=1e-6 * ideal)
    assert period == pytest.approx(ideal, rel=1e-6)


@pytest.mark.parametrize("total, split", [(12, (10, 2)), (14, (11, 3)), (18, (14, 4))])
def test_rounding_leaves_each_replica_within_one_micro_batch_of_the_ideal(total, split):
    """9.6/2.4, 11.2/2.8 and 14.4/3.6 micro-batches rounded by largest remainders."""
    w = unit_flops()
    assert largest_remainder(total, [SPEED["fast"], SPEED["slow"]]) == split
    period, times = hybrid_run(Parallelism(tp=2, dp=2, global_batch=total, batch_split=split), {"xpu2", "xpu3"})
    ideal = total * w / (SPEED["fast"] + SPEED["slow"])
    for x, kind in REPLICA.items():
        assert times[x]["compute_s"] == pytest.approx(split[kind == "slow"] * w / SPEED[kind], rel=1e-9)
        assert abs(times[x]["compute_s"] - ideal) < w / SPEED[kind]
    assert abs(times["xpu0"]["compute_s"] - times["xpu2"]["compute_s"]) < w / SPEED["fast"] + w / SPEED["slow"]
    assert period == pytest.approx(max(t["compute_s"] for t in times.values()), rel=1e-6)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_replica_s_pipeline_takes_its_own_m_plus_p_minus_1_passes(schedule):
    """pp 2 x dp 2: replica 0 is xpu0 and xpu2 (fast), replica 1 xpu1 and xpu3 (slow). With uniform stages a
    replica of m_r micro-batches takes (m_r + p - 1)·T_r, T_r = one micro-batch's pass on a stage; the
    iteration is the slower replica's. Split 8/2: compute 8·T_fast = 2·T_slow on every XPU."""
    w = unit_flops(pp=2, tp=1)
    period, times = hybrid_run(Parallelism(pp=2, dp=2, global_batch=10, schedule=schedule, batch_split=(8, 2)),
                               {"xpu1", "xpu3"})
    t_fast, t_slow = w / SPEED["fast"], w / SPEED["slow"]
    for x in ("xpu0", "xpu2"):
        assert times[x]["compute_s"] == pytest.approx(8 * t_fast, rel=1e-9)
    for x in ("xpu1", "xpu3"):
        assert times[x]["compute_s"] == pytest.approx(2 * t_slow, rel=1e-9)
    assert period == pytest.approx(max((8 + 1) * t_fast, (2 + 1) * t_slow), rel=1e-6)


def test_the_paper_s_graph_splits_samples_in_proportion_to_speed():
    """Two fast and two slow XPUs, 5 samples each by default (20 in all): proportional gives 8, 8, 2, 2 and every
    XPU computes 20·w/S, w the FLOPs of one sample through the decoders; even leaves the ratio 4."""
    workload = spec(**{"training.batch_per_xpu": 5})
    table = workload.decoder_table()
    w = 4 * sum(layer.fwd_flops(1) + layer.bwd_flops(1) for layer in table.layers)
    assert all(layer.fwd_flops.constant == layer.bwd_flops.constant == 0 for layer in table.layers)  # FLOPs ∝ batch
    xpus = [f"xpu{i}" for i in range(4)]
    speeds = [SPEED["fast"]] * 2 + [SPEED["slow"]] * 2
    split = largest_remainder(20, speeds)
    assert split == (8, 8, 2, 2)
    platform = two_devices(4, {"xpu2", "xpu3"})
    even = run(platform, build_training_graph(workload, xpus), xpus)["xpu_times"]
    assert even["xpu2"]["compute_s"] / even["xpu0"]["compute_s"] == pytest.approx(4.0, rel=1e-9)
    outcome = run(platform, build_training_graph(workload, xpus, batches=dict(zip(xpus, split))), xpus)
    ideal = 20 * w / sum(speeds)
    for x in xpus:
        assert outcome["xpu_times"][x]["compute_s"] == pytest.approx(ideal, rel=1e-9)
    assert outcome["iteration_ends"][1] - outcome["iteration_ends"][0] == pytest.approx(ideal, rel=1e-6)
