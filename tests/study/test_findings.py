"""The paper's qualitative findings, checked at reduced scale with real simulations.

Each test takes a paper experiment from experiments/paper/, keeps its base
scenario and its findings, and shrinks it: racks of one server (8 XPUs, set
with ``platform_overrides: {rack.servers: 1}``) so that the second device
type of a mixed system enters at 16 XPUs instead of 256, and scales of 4 to
32 XPUs. The full-scale runs are ``hcsim sweep experiments/paper/NAME.yaml``;
their summaries (experiments/paper/results/NAME.md) evaluate the same findings.
"""

import dataclasses
from pathlib import Path

import pytest

from hcsim.study.findings import evaluate
from hcsim.study.experiment import Axis, load_experiment
from hcsim.study.store import read_results
from hcsim.study.sweep import run_sweep

PAPER = Path(__file__).resolve().parents[2] / "experiments" / "paper"
SMALL_RACKS = {"rack.servers": 1}  # 8 XPUs per rack (paper: 128)


def reduced(name: str, axes: dict, findings: dict | None = None):
    """The paper experiment `name` with racks of 8 XPUs, the given axes, and findings edited by index."""
    experiment = load_experiment(PAPER / f"{name}.yaml")
    base = {**experiment.base, "platform_overrides": {**experiment.base.get("platform_overrides", {}), **SMALL_RACKS}}
    specs = [dict(spec) for spec in experiment.findings]
    for index, changes in (findings or {}).items():
        specs[index].update(changes)
    return dataclasses.replace(
        experiment, name=f"{name}-reduced", base=base, findings=tuple(specs),
        axes=tuple(Axis(name=k, values=tuple(v), group=all(isinstance(x, dict) for x in v)) for k, v in axes.items()))


def run_and_check(experiment, folder: Path):
    report = run_sweep(experiment, folder, jobs=2, report=False)
    assert report.failed == 0, [r["error"] for r in read_results(report.csv) if r["error"]]
    rows = read_results(report.csv)
    return [evaluate(spec, rows, experiment.axis_columns()) for spec in experiment.findings]


@pytest.fixture(scope="module")
def fig8(tmp_path_factory):
    experiment = reduced("fig8", {"devices": [["H100"], ["H100", "A100"], ["H100", "V100"]], "coherent": [True, False],
                                  "xpus": [4, 8, 16]},
                         findings={1: {"from": 8, "to": 16}})  # the second device type enters with the second rack
    return run_and_check(experiment, tmp_path_factory.mktemp("fig8"))


def test_coherence_beats_no_coherence_at_every_scale_and_device_mix(fig8):
    assert fig8[0].ok, fig8[0].detail


def test_in_mixed_systems_throughput_per_xpu_drops_where_the_second_device_type_enters(fig8):
    assert fig8[1].ok, fig8[1].detail


def test_more_cxl_bandwidth_helps_with_diminishing_returns(tmp_path):
    experiment = reduced("fig10", {"xpus": [8, 32],
                                   "cxl_bandwidth": ["16GB/s", "32GB/s", "64GB/s", "128GB/s", "512GB/s"]},
                         findings={1: {"from": 8, "to": 32}})
    saturating, scaling = run_and_check(experiment, tmp_path)
    assert saturating.ok, saturating.detail
    assert scaling.ok, scaling.detail


def test_latency_hardly_matters_below_1us_and_dominates_above_10us_more_so_at_larger_scale(tmp_path):
    experiment = reduced("fig11", {"xpus": [8, 32], "cxl_latency": ["100ns", "1us", "10us", "100us"]})
    (threshold,) = run_and_check(experiment, tmp_path)
    assert threshold.ok, threshold.detail


def test_the_coherent_ring_all_reduce_is_never_slower_than_the_ring(tmp_path):
    systems = [{"label": "8 H100", "xpus": 8, "devices": ["H100"]},
               {"label": "32 H100", "xpus": 32, "devices": ["H100"]},
               {"label": "16 H100 + 16 A100", "xpus": 32, "devices": ["H100", "H100", "A100", "A100"]},
               {"label": "16 H100 + 16 V100", "xpus": 32, "devices": ["H100", "H100", "V100", "V100"]}]
    experiment = reduced("table6", {"cxl_latency": ["200ns"], "system": systems, "collective": ["ring", "coherent_ring"]})
    (never_slower,) = run_and_check(experiment, tmp_path)
    assert never_slower.ok, never_slower.detail


def test_compared_values_of_a_quantity_axis_may_carry_units():
    """`better` and `close` read `better`/`worse` and `reference`/`other` with units, as `where` and `step` do."""
    rows = [{"status": "ok", "cxl_latency_s": latency, "offload": "none", "batches_per_s": speed}  # CSV columns
            for latency, speed in ((2e-7, 1.0), (2e-6, 1.005), (2e-5, 0.5))]
    close = evaluate({"check": "close", "axis": "cxl_latency", "reference": "200ns", "other": "2us",
                      "tolerance": 0.01}, rows, ["cxl_latency_s", "offload"])
    better = evaluate({"check": "better", "axis": "cxl_latency", "better": "2us", "worse": "20us"}, rows,
                      ["cxl_latency_s", "offload"])
    assert close.ok and "over 1 pairs" in close.detail
    assert better.ok and "2.01x" in better.detail


def test_a_metric_that_is_zero_compares_without_dividing_by_it():
    """A time that is 0 in a row (exposed dp communication with dp 1): equal zeros are 1x (not better, within any
    tolerance), a positive value over a zero one is infinitely better: a verdict, never a ZeroDivisionError."""
    rows = [{"status": "ok", "offload": offload, "batches_per_s": speed}
            for offload, speed in (("none", 0.0), ("cpu", 0.0), ("cxl", 2.0))]
    tie = evaluate({"check": "better", "axis": "offload", "better": "cpu", "worse": "none"}, rows, ["offload"])
    close = evaluate({"check": "close", "axis": "offload", "reference": "none", "other": "cpu"}, rows, ["offload"])
    beats = evaluate({"check": "better", "axis": "offload", "better": "cxl", "worse": "none"}, rows, ["offload"])
    assert not tie.ok and "1x" in tie.detail
    assert close.ok
    assert beats.ok and "infx" in beats.detail
