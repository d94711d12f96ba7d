"""The compute model a run uses when its scenario names none: the kernel model (roofline) wherever the workload's
graph lists kernels and every device has kernel factors, the paper's peak model elsewhere; a value the user gives
always wins, and the committed experiments that ran the peak model name it, so their results stay as they are."""

from __future__ import annotations

import csv
import dataclasses

import pytest
import yaml

from hcsim.config import REPO_ROOT
from hcsim.engine.compute_model import load_compute_model
from hcsim.platform.devices import builtin_catalog
from hcsim.run.prepare import prepare, resolve_compute_model
from hcsim.run.results import resolve_scenario
from hcsim.run.scenario import Scenario, load_scenario
from hcsim.study.experiment import load_experiment

DGX = dict(platform="dgx-h100", workload="llama3-8b", xpus=8)


def test_a_hybrid_run_on_devices_with_factors_uses_the_kernel_model_and_an_explicit_value_wins():
    factors = load_compute_model().devices
    for device in ("H100", "H200"):
        assert factors[device].provenance == "measured"
        assert resolve_compute_model(Scenario(**DGX, tp=8, devices=[device])) == "roofline"
    literature = [d for d in factors if factors[d].provenance == "literature" and d in builtin_catalog()]
    assert "A100" in literature and all(resolve_compute_model(Scenario(**DGX, tp=8, devices=[d])) == "roofline"
                              for d in literature)  # run with the warning of compute_model()
    for explicit in ("peak", "roofline"):
        assert resolve_compute_model(Scenario(**DGX, tp=8, compute_model=explicit)) == explicit


def test_devices_without_factors_and_graphs_without_kernels_keep_the_peak_model():
    unmeasured = sorted(set(builtin_catalog()) - set(load_compute_model().devices))
    assert unmeasured  # B200, MI300X, ... in the catalog without kernel factors
    for device in unmeasured:
        assert resolve_compute_model(Scenario(**DGX, tp=8, devices=[device])) == "peak"
    assert resolve_compute_model(Scenario(**DGX, tp=8, devices=["H100", unmeasured[0]])) == "peak"  # one lacks them
    assert resolve_compute_model(Scenario(**DGX)) == "peak"  # the paper's data-parallel graph: no kernels
    assert resolve_compute_model(Scenario(xpus=8)) == "peak"  # the built-in default, the paper's
    assert resolve_compute_model(Scenario(xpus=8, workload="chakra:traces/run")) == "peak"  # a trace


def test_a_framework_kernel_inventory_is_timed_by_its_kernels_without_tp():
    scenario = Scenario(platform="dgx-h100", workload="gpt2-hf", xpus=1)
    assert resolve_compute_model(scenario) == "roofline"


def test_the_resolved_model_is_recorded_and_drives_megatrons_communication():
    """inputs_resolved (and a sweep's CSV columns) name the model the run used; the graph a kernel-model run
    builds is Megatron-LM's (NCCL channel rings), the peak model's the paper's."""
    small = dict(DGX, tp=2, micro_batch=1, global_batch=4, iterations=1,
                 workload_overrides={"model.decoders": 2, "model.sequence": 256})
    auto, peak = Scenario(**small), Scenario(**small, compute_model="peak")
    assert resolve_scenario(auto)["compute_model"] == "roofline"
    assert resolve_scenario(peak)["compute_model"] == "peak"
    assert resolve_scenario(Scenario(xpus=8))["compute_model"] == "peak"
    algorithms = {name: {a for _, a in prepare(s).workload.nodes(data="algorithm") if a}
                  for name, s in (("auto", auto), ("peak", peak))}
    assert "nccl" in algorithms["auto"] and "nccl" not in algorithms["peak"]


def test_a_scenario_that_names_peak_keeps_the_digest_it_had_when_peak_was_the_default():
    """Committed sweep points were keyed without compute_model (it was peak by default): naming peak now keeps
    those keys; the new default (None) is a scenario of its own, and roofline stays what it was."""
    base = Scenario(xpus=8, coherent=False)
    assert dataclasses.replace(base, compute_model="peak").digest() != base.digest()
    fields = {k: v for k, v in base.to_dict().items() if k not in ("base", "compute_model")}
    assert Scenario(**fields, compute_model="peak").digest() == dataclasses.replace(base, compute_model="peak").digest()
    assert dataclasses.replace(base, compute_model="roofline").digest() not in (
        base.digest(), dataclasses.replace(base, compute_model="peak").digest())


def test_load_scenario_leaves_compute_model_to_the_default_and_reads_an_explicit_one():
    assert load_scenario(None).compute_model is None
    assert load_scenario(None, ["compute_model=peak"]).compute_model == "peak"
    with pytest.raises(Exception, match="compute_model"):
        load_scenario(None, ["compute_model=kernels"])


def _experiments():
    for path in sorted((REPO_ROOT / "experiments").rglob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if "results" not in path.parts and isinstance(data, dict) and "axes" in data:
            yield path


@pytest.mark.parametrize("path", list(_experiments()), ids=lambda p: p.stem)
def test_every_committed_experiment_names_its_compute_model_and_keeps_its_point_keys(path):
    """Each experiment names the model its committed results ran (peak, the paper's; roofline where it says so),
    and its points still have the keys and compute_model column of its committed CSV: the same scenarios."""
    experiment = load_experiment(path)
    points = experiment.points()
    assert all(p.scenario.compute_model in ("peak", "roofline") for p in points), path
    table = next((p for p in (path.parent / "results" / f"{experiment.name}.csv",) if p.exists()), None)
    if table is None:
        pytest.skip(f"{path.name}: no committed results")
    with table.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {r["point"] for r in rows} == {p.key for p in points}
    by_key = {p.key: p for p in points}
    for row in rows:
        assert row["compute_model"] == by_key[row["point"]].inputs["compute_model"]


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b"])
def test_the_megatron_era_workloads_run_flash_attention_and_take_context_parallelism(name):
    from hcsim.workload import load_workload_spec

    assert load_workload_spec(name).attention == "flash" and load_workload_spec("mixtral-8x7b").attention == "flash"
    scenario = Scenario(platform="dgx-h100", workload=name, xpus=8, tp=2, cp=2, micro_batch=1, recompute="full",
                        spill="allow", workload_overrides={"model.decoders": 2, "model.sequence": 4096})
    assert prepare(scenario).workload.graph["layout"]["sizes"]["cp"] == 2  # (cp with experts: not modelled)


def test_the_validation_workload_keeps_the_standard_attention_its_rows_measured():
    from hcsim.workload import load_workload_spec

    assert load_workload_spec("gpt-megatron").attention == "standard"
