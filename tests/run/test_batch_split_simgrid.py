"""batch_split end to end on SimGrid: 8 H100 + 8 A100 on paper-cxl (one server per rack, so a rack of each),
FP32 peaks 67 and 19.5 TFLOP/s.

An XPU's compute_s is its FLOPs at its peak, so with n_r units (micro-batches or samples) of w FLOP each,
replica r computes n_r·w/s_r (plus, in the paper's graph, the optimizer step's FLOPs / s_r). Even splits
leave the A100 computing s_H100 / s_A100 = 3.44 times as long; proportional ones (largest remainders)
leave each replica within one unit's time of the ideal, so two replicas within w/s_H100 + w/s_A100.

One iteration each: the measured window then holds all of an iteration's work. With two, the window is the
second iteration [end of the first, end of the second] and counts the time inside it: the faster replica's
second iteration starts before the slower one ends the first, so part of its work falls before the window.
"""

import json
import subprocess
import sys

import pytest

from hcsim.cli.simulate import summary
from hcsim.platform.devices import builtin_catalog
from hcsim.workload import load_workload_spec
from hcsim.workload.split import largest_remainder

CATALOG = builtin_catalog()
PEAK = {d: CATALOG[d].peaks["fp32"] for d in ("H100", "A100")}
MIXED = ["xpus=16", "devices=[H100,A100]", "platform_overrides.rack.servers=1"]
HYBRID = ["workload=llama2-7b", "precision=fp32", "workload_overrides.model.decoders=4", "tp=8", "global_batch=16",
          "iterations=1", "compute_model=peak"]  # the peak model: compute in proportion to peak FLOP/s
PAPER = ["workload_overrides.training.batch_per_xpu=4", "workload_overrides.model.decoders=4", "iterations=1",
         "collective_model=flow"]


def simulate(settings: list[str]) -> dict:
    args = [a for s in settings for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", "--json", *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def hybrid_runs():
    """tp 8 inside each rack: dp 2, one H100 replica and one A100 replica, 16 micro-batches of 1 sample."""
    return {split: simulate(MIXED + HYBRID + [f"batch_split={split}"]) for split in ("even", "proportional")}


def hybrid_flops() -> tuple[float, float]:
    """(FLOP of one micro-batch's passes, FLOP of the optimizer step) on one XPU of the even run's graph."""
    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import load_scenario

    graph = prepare(load_scenario(None, MIXED + HYBRID)).workload
    on_xpu0 = [d for _, d in graph.nodes(data=True) if d["kind"] == "compute" and "xpu0" in d["xpus"]]
    passes = sum(d["flops"] for d in on_xpu0 if d["phase"] in ("fwd", "bwd"))
    return passes / 8, sum(d["flops"] for d in on_xpu0 if d["phase"] == "optimizer")


def test_an_even_split_leaves_the_a100_replica_computing_the_speed_ratio_longer(hybrid_runs):
    even = hybrid_runs["even"]["breakdown"]  # the same FLOPs on both replicas
    assert even["A100"]["compute_s"] / even["H100"]["compute_s"] == pytest.approx(PEAK["H100"] / PEAK["A100"],
                                                                                  rel=1e-9)
    assert even["A100"]["idle_s"] < 1e-3 * even["H100"]["idle_s"]  # the H100 wait, the A100 set the pace
    assert "batch_split" not in hybrid_runs["even"]


def test_a_proportional_split_equalises_compute_per_replica_within_one_micro_batch(hybrid_runs):
    split = largest_remainder(16, [PEAK["H100"], PEAK["A100"]])
    assert split == (12, 4)
    even, proportional = (hybrid_runs[s]["breakdown"] for s in ("even", "proportional"))
    w, step = hybrid_flops()
    one = {d: w / PEAK[d] for d in PEAK}  # one micro-batch's compute time on each device
    for d, n in (("H100", 12), ("A100", 4)):
        assert even[d]["compute_s"] == pytest.approx(8 * one[d] + step / PEAK[d], rel=1e-9)
        assert proportional[d]["compute_s"] == pytest.approx(n * one[d] + step / PEAK[d], rel=1e-9)
    assert abs(12 * one["H100"] - 4 * one["A100"]) < one["H100"] + one["A100"]
    assert hybrid_runs["proportional"]["iteration_time_s"] < hybrid_runs["even"]["iteration_time_s"]
    assert proportional["H100"]["idle_s"] < even["H100"]["idle_s"]
    assert hybrid_runs["proportional"]["batch_split"] == {
        "unit": "micro-batches", "per_replica": [12, 4],
        "by_device": {"A100": {"replicas": 1, "fewest": 4, "most": 4}, "H100": {"replicas": 1, "fewest": 12, "most": 12}}}
    for result in hybrid_runs.values():  # the same job: samples per iteration and model FLOPs
        assert result["samples_per_s"] * result["iteration_time_s"] == pytest.approx(16, rel=1e-9)


def test_the_summary_shows_the_split_and_each_type_s_idle_time(hybrid_runs):
    text = summary(hybrid_runs["proportional"])
    assert "batch split      micro-batches per DP replica: A100 4 (1 replica), H100 12 (1 replica)" in text
    assert "pace set by" in text and "idle (waiting)" in text
    assert "batch split" not in summary(hybrid_runs["even"])


def test_an_explicit_list_runs_as_given():
    result = simulate(MIXED + HYBRID + ["batch_split=[10,6]", "iterations=1"])
    assert result["batch_split"]["per_replica"] == [10, 6]


def test_the_paper_s_graph_splits_samples_in_proportion_to_speed():
    """LLaMA2-13B as in Table 4 (4 decoders), 4 samples per XPU by default: proportional gives each H100 6
    and each A100 2 of the 64; compute is samples x one sample's FLOPs plus the optimizer step, at the peak."""
    split = largest_remainder(64, [PEAK["H100"]] * 8 + [PEAK["A100"]] * 8)
    assert split == (6,) * 8 + (2,) * 8
    result = simulate(MIXED + PAPER + ["batch_split=proportional"])
    spec = load_workload_spec("llama2-13b", {"model.decoders": 4})
    table = spec.decoder_table()
    sample = 4 * sum(layer.fwd_flops(1) + layer.bwd_flops(1) for layer in table.layers)
    optimizer = spec.optimizer_flops_per_parameter * 4 * table.parameters
    breakdown = result["breakdown"]
    for device, samples in (("H100", 6), ("A100", 2)):
        assert breakdown[device]["compute_s"] == pytest.approx((samples * sample + optimizer) / PEAK[device], rel=1e-6)
    gap = abs(6 * sample / PEAK["H100"] - 2 * sample / PEAK["A100"])
    assert gap < sample / PEAK["H100"] + sample / PEAK["A100"]
    assert result["batch_split"]["unit"] == "samples" and result["batch_split"]["per_replica"] == list(split)
