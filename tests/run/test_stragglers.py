"""Stragglers (issue 37 §4): XPUs whose compute takes a factor longer, named or drawn from a seeded spread.

The closed form: a data-parallel iteration (compute F FLOPs on each of n XPUs, then a ring all-reduce of S
bytes) on one switch (links of bandwidth B and latency α/2) takes F/P + 2(n-1)α + 2(n-1)/n·S/B; with one
XPU k times slower, k·F/P + the same all-reduce: the all-reduce waits for its last member, which its peers
spend waiting, (k-1)·F/P each. (One iteration: the skeleton graph has no back edge, so a second iteration's
compute would start beside the first's all-reduce.) Simulations run in fresh processes (one SimGrid Engine per process).
"""

from __future__ import annotations

import csv
import math

import pytest

from hcsim.engine.api import RunOptions
from hcsim.errors import MESSAGE_TEMPLATE, ConfigError
from hcsim.platform.builders import single_switch
from hcsim.platform.devices import builtin_catalog
from hcsim.run.prepare import prepare
from hcsim.run.scenario import Scenario, load_scenario
from hcsim.run.simulation import simulate, simulate_graphs
from hcsim.run.stragglers import straggler_factors
from hcsim.workload import save_workload, skeleton_graph

H100 = builtin_catalog()["H100"]
PEAK = H100.fp32_flops  # the skeleton graph is FP32
LINK_BW, LINK_LAT = 900e9, 100e-9  # single_switch's links and paper-traditional's XPU switch (Table 5 XPU_link)
ALPHA = 2 * LINK_LAT  # XPU -> switch -> XPU
F, S = 6.7e12, 9e8  # 100 ms of FP32 compute on an H100; the all-reduce's bytes


def ring(n: int) -> float:
    return 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * S / LINK_BW


def close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-15)


@pytest.mark.parametrize("model", ["step", "flow"])
@pytest.mark.parametrize("k", [1.5, 3.0])
def test_a_straggler_lengthens_a_data_parallel_iteration_by_its_extra_compute(model, k):
    n = 4
    platform = single_switch(n, H100)
    platform.nodes["xpu2"]["slowdown"] = k
    run = simulate_graphs(platform, skeleton_graph([f"xpu{i}" for i in range(n)], F, S),
                          RunOptions(collective_model=model))
    assert close(run["iteration_ends"][0], k * F / PEAK + ring(n))
    times = run["xpu_times"]
    assert close(times["xpu2"]["compute_s"], k * F / PEAK)
    assert times["xpu2"]["idle_peers_s"] == pytest.approx(0.0, abs=1e-12)
    for peer in ("xpu0", "xpu1", "xpu3"):  # each waits in the all-reduce for the straggler
        assert close(times[peer]["compute_s"], F / PEAK)
        assert close(times[peer]["idle_peers_s"], (k - 1) * F / PEAK)


def test_a_measured_duration_slows_down_too():
    from hcsim.workload import add_compute, new_workload

    platform = single_switch(1, H100)
    platform.nodes["xpu0"]["slowdown"] = 2.5
    graph = new_workload("timed")
    add_compute(graph, "c", xpus=["xpu0"], flops=0.0, duration=0.1, start=True)
    run = simulate_graphs(platform, graph)
    assert close(run["iteration_ends"][0], 2.5 * 0.1)


def test_a_scenario_reports_the_straggler_and_its_cost(tmp_path):
    """End to end on paper-traditional's first server (an XPU switch of 900 GB/s, 100 ns links): the run's
    iteration against the same scenario without stragglers, and the closed forms the report states."""
    n, k = 4, 2.0
    path = tmp_path / "dp.json"
    save_workload(skeleton_graph([f"xpu{i}" for i in range(n)], F, S), path)
    base = dict(platform="paper-traditional", workload=str(path), xpus=n, iterations=1)
    plain = simulate(Scenario(**base))
    slow = simulate(Scenario(**base, stragglers={"xpu3": k}, straggler_spread=0.0), out=tmp_path / "run")
    assert "stragglers" not in plain
    assert close(plain["iteration_time_s"], F / PEAK + ring(n))
    assert close(slow["iteration_time_s"] - plain["iteration_time_s"], (k - 1) * F / PEAK)
    report = slow["stragglers"]
    assert report["xpu"] == "xpu3" and report["factor"] == k and report["count"] == 1
    assert report["factors"] == {"xpu3": k}
    assert close(report["extra_compute_s"], (k - 1) * F / PEAK)
    assert close(report["peers_idle_s"], (k - 1) * F / PEAK)
    assert report["own_idle_s"] == pytest.approx(0.0, abs=1e-12)
    from hcsim.cli.simulate import summary

    line = next(line for line in summary(slow).splitlines() if "straggler" in line)
    assert "xpu3 x2" in line and "1 of 4 XPUs" in line
    with open(tmp_path / "run" / "xpus.csv", newline="") as table:
        assert {row["xpu"]: float(row["slowdown"]) for row in csv.DictReader(table)} == \
            {"xpu0": 1.0, "xpu1": 1.0, "xpu2": 1.0, "xpu3": k}


def test_the_spread_is_seeded_half_normal_and_named_factors_win():
    xpus = [f"xpu{i}" for i in range(4096)]
    spread = 0.05
    drawn = straggler_factors(Scenario(straggler_spread=spread, seed=11), xpus)
    assert drawn == straggler_factors(Scenario(straggler_spread=spread, seed=11), xpus)  # the same seed
    assert drawn != straggler_factors(Scenario(straggler_spread=spread, seed=12), xpus)
    assert list(drawn) == xpus and min(drawn.values()) >= 1.0
    # half-normal: mean 1 + σ·sqrt(2/π), standard deviation σ·sqrt(1 - 2/π); the sample mean of 4096 within
    # five standard errors
    mean = math.fsum(drawn.values()) / len(drawn)
    assert abs(mean - (1 + spread * math.sqrt(2 / math.pi))) < 5 * spread * math.sqrt(1 - 2 / math.pi) / 64
    named = straggler_factors(Scenario(straggler_spread=spread, seed=11, stragglers={"xpu7": 3.0}), xpus)
    assert named["xpu7"] == 3.0 and {x: f for x, f in named.items() if x != "xpu7"} == \
        {x: f for x, f in drawn.items() if x != "xpu7"}
    assert straggler_factors(Scenario(), xpus) == {}
    assert straggler_factors(Scenario(stragglers={"xpu1": 1.0}), xpus) == {}  # a factor of 1 slows nothing


def test_prepare_puts_the_factors_on_the_platform_nodes():
    prepared = prepare(Scenario(xpus=8, stragglers={"xpu5": 1.25}, straggler_spread=0.1, seed=3))
    factors = straggler_factors(prepared.scenario, prepared.xpus)
    assert factors["xpu5"] == 1.25 and len(factors) == 8
    assert {x: prepared.platform.nodes[x].get("slowdown", 1.0) for x in prepared.xpus} == factors


def test_stragglers_change_the_digest_only_when_given():
    assert Scenario(stragglers={}, straggler_spread=0.0, seed=0).digest() == Scenario().digest()
    assert Scenario(stragglers={"xpu1": 2.0}).digest() != Scenario().digest()


# --- bad values: one ConfigError naming the key, the problem and what is valid ---------------------------

def check(message: str, *fragments: str) -> None:
    for line in message.splitlines():
        assert line.startswith("  ") or MESSAGE_TEMPLATE.match(line), line
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize("setting,fragments", [
    ("stragglers.xpu3=0", ("--set stragglers.xpu3", "> 0", "got 0")),
    ("stragglers.xpu3=-1.5", ("stragglers.xpu3", "> 0", "got -1.5")),
    ("stragglers.xpu3=.nan", ("stragglers.xpu3", "finite", "got nan")),
    ("stragglers.xpu3=.inf", ("stragglers.xpu3", "finite", "got inf")),
    ("stragglers.xpu3=slow", ("stragglers.xpu3", "slowdown factor", "got 'slow'")),
    ("stragglers=[xpu3]", ("stragglers", "mapping of XPU names to slowdown factors")),
    ("straggler_spread=-0.1", ("straggler_spread", ">= 0", "-0.1")),
    ("straggler_spread=.nan", ("straggler_spread", "finite number >= 0", "nan")),
    ("straggler_spread=.inf", ("straggler_spread", "finite number >= 0", "inf")),
    ("seed=1.5", ("seed", "integer", "1.5")),
])
def test_bad_values_are_refused_where_the_scenario_is_read(setting, fragments):
    with pytest.raises(ConfigError) as caught:
        load_scenario(settings=[setting])
    check(str(caught.value), *fragments)


def test_bad_values_are_refused_from_python_too():
    with pytest.raises(ConfigError, match=r"stragglers: expected a mapping of XPU names to finite numbers > 0"):
        Scenario(stragglers={"xpu1": 0.0})
    with pytest.raises(ConfigError, match=r"straggler_spread: expected a finite number >= 0, got nan"):
        Scenario(straggler_spread=float("nan"))


def test_a_name_not_in_the_run_is_refused():
    with pytest.raises(ConfigError) as caught:
        prepare(Scenario(xpus=8, stragglers={"xpu8": 1.5, "gpu1": 2.0}))
    check(str(caught.value), "scenario 'default': stragglers: 'xpu8', 'gpu1' are not among this run's 8 XPUs",
          "xpu0..xpu7")


def test_serving_refuses_stragglers():
    from hcsim.run.serving import check_serving_scenario, serving_workload

    scenario = Scenario(workload="llama3-70b-serving", xpus=4, tp=4, stragglers={"xpu0": 2.0}, straggler_spread=0.1)
    with pytest.raises(ConfigError) as caught:
        check_serving_scenario(scenario, serving_workload(scenario))
    check(str(caught.value), "stragglers: {'xpu0': 2.0} does not apply to serving workload",
          "straggler_spread: 0.1 does not apply", "Fix: leave straggler_spread out")


def test_kernel_model_times_scale_on_a_hybrid_run():
    """tp 2 x pp 2 x dp 2 on a DGX H100 timed by the kernel model: the straggler's compute is its DP twin's
    (the same stage and TP rank, the same kernels) times its factor."""
    from hcsim.run.prepare import compute_model
    from hcsim.workload.layout import ParallelLayout

    scenario = Scenario(platform="dgx-h100", workload="llama3-8b", xpus=8, tp=2, pp=2, micro_batch=1,
                        global_batch=4, precision="bf16", recompute="full", compute_model="roofline",
                        workload_overrides={"model.decoders": 4}, stragglers={"xpu1": 1.5})
    prepared = prepare(scenario)
    model = compute_model(scenario, prepared.workload, prepared.platform)
    assert model is not None
    runs = [simulate_graphs(prepared.platform, prepared.workload, RunOptions(compute_model=model))]
    layout = prepared.workload.graph["layout"]
    ranks = ParallelLayout(prepared.xpus, layout["sizes"], layout["order"]).coordinates

    def role(x):
        return {axis: rank for axis, rank in ranks(x).items() if axis != "dp"}

    twin = next(x for x in prepared.xpus if x != "xpu1" and role(x) == role("xpu1"))
    for run in runs:
        times = run["xpu_times"]
        assert times["xpu1"]["compute_s"] == pytest.approx(1.5 * times[twin]["compute_s"], rel=1e-9)


def test_a_factor_below_1_alone_is_reported_as_given_not_as_xpu0_x1():
    """Only xpu1 sped up (0.5): the report names xpu1 x0.5 and the compute it saves (was: xpu0 x1, +0 s); with a
    slowed XPU beside it, the slowest."""
    import networkx as nx

    from hcsim.cli.simulate import _straggler_line
    from hcsim.run.results import XpuTimes
    from hcsim.run.stragglers import straggler_report

    def report(factors):
        platform = nx.Graph()
        platform.add_nodes_from((f"xpu{i}", {"slowdown": factors.get(f"xpu{i}", 1.0)}) for i in range(4))
        times = {f"xpu{i}": XpuTimes(compute_s=2.0, memory_stall_s=0.0, exposed_comm_s=0.0, idle_s=0.0)
                 for i in range(4)}
        return straggler_report(platform, [f"xpu{i}" for i in range(4)], times)

    faster = report({"xpu1": 0.5})["stragglers"]
    assert (faster["xpu"], faster["factor"], faster["extra_compute_s"]) == ("xpu1", 0.5, -2.0)
    assert _straggler_line({"xpus": 4, **report({"xpu1": 0.5})})[0].startswith(
        "  straggler        xpu1 x0.5 (1 of 4 XPUs given a factor, none slower): -2 s of its own compute")
    both = report({"xpu1": 0.5, "xpu2": 1.5})["stragglers"]
    assert (both["xpu"], both["factor"], both["count"]) == ("xpu2", 1.5, 2)
