"""hcsim.run.results: per-XPU times under one name, the pace setter, the scenario recorded whole and resolved."""

import dataclasses

import pytest

from hcsim.run.results import (SPLIT_PARTS, TIME_PARTS, pace_setters, per_xpu_times, resolve_scenario, scenario_column,
                           scenario_columns)
from hcsim.run.scenario import Scenario, load_scenario


def test_per_xpu_times_take_the_engines_clocks_under_one_name():
    engine = {"x0": {"compute_s": 2.0, "memory_stall_s": 0.5, "comm_s": 0.25, "idle_s": 1.25, "comm_tp_s": 0.25,
                     "idle_bubble_s": 1.0, "idle_peers_s": 0.25}}
    times = per_xpu_times(engine)
    assert times["x0"].as_dict() == {"compute_s": 2.0, "memory_stall_s": 0.5, "exposed_comm_s": 0.25, "idle_s": 1.25,
                                     **dict.fromkeys(SPLIT_PARTS, 0.0), "comm_tp_s": 0.25, "idle_bubble_s": 1.0,
                                     "idle_peers_s": 0.25}
    assert tuple(times["x0"].as_dict()) == (*TIME_PARTS, *SPLIT_PARTS)


def test_the_pace_setter_of_a_device_type_is_its_least_idle_xpu():
    engine = {x: {"compute_s": c, "memory_stall_s": 0.0, "comm_s": 0.0, "idle_s": 4.0 - c}
              for x, c in [("h0", 1.0), ("h1", 1.5), ("a0", 3.0), ("a1", 4.0)]}
    pace = pace_setters(per_xpu_times(engine), {"h0": "H100", "h1": "H100", "a0": "A100", "a1": "A100"})
    assert pace == {"A100": {"xpu": "a1", "idle_s": 0.0}, "H100": {"xpu": "h1", "idle_s": 2.5}}


def test_every_scenario_field_has_a_column_with_its_unit():
    names = [f.name for f in dataclasses.fields(Scenario) if f.name != "base"]
    assert scenario_columns() == [scenario_column(n) for n in names]
    assert "cxl_bandwidth_Bps" in scenario_columns() and "cxl_latency_s" in scenario_columns()
    assert scenario_column("xpus") == "xpus" and scenario_column("platform_overrides.rack.servers") == \
        "platform_overrides.rack.servers"


@pytest.mark.parametrize("settings", [{}, {"platform": "paper-traditional", "devices": ["H100", "A100"]},
                                      {"granularity": "decoder", "trace_xpus": ["xpu1"]}])
def test_the_resolved_scenario_holds_numbers_words_or_nothing(settings):
    """Blank (None) only where nothing exists (no overrides or stragglers, the algorithm's own chunk count, no
    CXL link); never "none", prose or JSON."""
    values = resolve_scenario(load_scenario(None, settings))
    assert list(values) == scenario_columns()
    blank = {k for k, v in values.items() if v is None}
    assert blank <= {"platform_overrides", "workload_overrides", "stragglers", "collective_chunks",
                     "cxl_bandwidth_Bps", "cxl_latency_s", "jobs"}, values
    for key, value in values.items():  # a word ("none" is recompute's or offload's choice), never a phrase
        assert not isinstance(value, str) or (" " not in value and not value.startswith(("[", "{"))), (key, value)
    for key in ("cxl_bandwidth_Bps", "cxl_latency_s", "collective_chunks", "dp", "micro_batch", "global_batch"):
        assert values[key] is None or isinstance(values[key], (int, float)), (key, values[key])


def test_defaults_resolve_to_the_specs_values():
    values = resolve_scenario(load_scenario(None, {"platform": "paper-traditional"}))
    assert values["coherent"] is False and values["devices"] == "H100"
    default = resolve_scenario(Scenario())
    assert default["collective"] == "ring" and default["platform_overrides"] is None
    assert default["trace_iterations"] == "1+2" and default["collective_chunks"] is None
    dgx = resolve_scenario(load_scenario(None, {"platform": "dgx-h100", "xpus": 8}))
    assert dgx["cxl_bandwidth_Bps"] is None and dgx["cxl_latency_s"] is None  # no CXL link: blank, not "none"


def test_a_mapping_has_a_column_per_key_and_a_list_is_joined():
    values = resolve_scenario(load_scenario(None, {"workload_overrides": {"model.sequence": 8192},
                                                   "layer_split": [20, 20], "pp": 2}))
    assert values["workload_overrides"] == "model.sequence" and values["workload_overrides.model.sequence"] == 8192
    assert values["layer_split"] == "20+20" and list(values)[-1] == "workload_overrides.model.sequence"
