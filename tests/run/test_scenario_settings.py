"""Scenario and run settings (issue 11, item 7): constraints declared once, the platform's own CXL values by
default, and the four settings once all called "fidelity" under names of their own."""

from __future__ import annotations

import logging
import re

import pytest

from hcsim.config import REPO_ROOT
from hcsim.engine.api import RunOptions
from hcsim.errors import ConfigError
from hcsim.platform import build_platform, load_platform_spec
from hcsim.run.scenario import RENAMED_KEYS, Scenario, load_scenario
from hcsim.study.experiment import load_experiment
from hcsim.workload import load_workload_spec

TINY_PLATFORM = """
name: tiny
links:
  hbm: {latency: 100ns}
topology:
  nodes:
    - {name: sw, kind: switch}
    - {name: a, kind: xpu, device: H100, extended_memory: pool}
    - {name: b, kind: xpu, device: H100, extended_memory: pool}
    - {name: pool, kind: memory, capacity: unbounded, role: dram}
  links:
    - {ends: [pool, sw], bandwidth: 64GB/s, latency: 1us, kind: pcie}
    - {ends: [a, sw], bandwidth: 100GB/s, latency: 1us, kind: eth}
    - {ends: [b, sw], bandwidth: 100GB/s, latency: 1us, kind: eth}
"""


def test_the_cxl_settings_default_to_the_platforms_own_values():
    scenario = Scenario()
    assert (scenario.cxl_bandwidth, scenario.cxl_latency) == (None, None)
    assert not any(key.startswith("links.cxl") for key in scenario.platform_settings())
    assert load_scenario(None, ["cxl_bandwidth=null", "cxl_latency=null"]) == Scenario()


@pytest.mark.parametrize("platform", ["paper-cxl", "paper-traditional"])
def test_the_paper_platforms_keep_128_gbs_and_200_ns_so_results_do_not_change(platform):
    spec = load_platform_spec(platform)
    assert (spec.links["cxl"].bandwidth, spec.links["cxl"].latency) == (128e9, 200e-9)
    # the graph built with the new defaults is the one the old defaults (explicit 128 GB/s, 200 ns) built
    old = Scenario(platform=platform, xpus=32, cxl_bandwidth=128e9, cxl_latency=200e-9)
    new = Scenario(platform=platform, xpus=32)
    graphs = [build_platform(load_platform_spec(platform, s.platform_settings()), 32) for s in (old, new)]
    assert sorted(graphs[0].edges(data=True)) == sorted(graphs[1].edges(data=True))
    assert dict(graphs[0].nodes(data=True)) == dict(graphs[1].nodes(data=True))


def test_a_platform_without_cxl_links_prepares_with_the_default_scenario(tmp_path):
    from hcsim.run.prepare import prepare

    (tmp_path / "tiny.yaml").write_text(TINY_PLATFORM)
    scenario = load_scenario(None, {"platform": str(tmp_path / "tiny.yaml"), "xpus": 2, "workload": "llama2-7b"})
    prepared = prepare(scenario)
    assert prepared.xpus == ["a", "b"] and "cxl" not in prepared.platform_spec.links


def test_setting_cxl_values_on_a_platform_without_cxl_links_says_why_it_fails(tmp_path):
    from hcsim.run.prepare import prepare

    (tmp_path / "tiny.yaml").write_text(TINY_PLATFORM)
    scenario = Scenario(platform=str(tmp_path / "tiny.yaml"), xpus=2, workload="llama2-7b", cxl_bandwidth=1e9)
    with pytest.raises(ConfigError, match=r"links\.cxl: an explicit topology reads only links\.hbm.*leave them out"):
        prepare(scenario)


@pytest.mark.parametrize("make", [
    lambda: RunOptions(collective_model="flwo"),
    lambda: RunOptions(local_access="analytical"),
    lambda: RunOptions(step_limit=0),
    lambda: Scenario(collective_model="flwo"),
    lambda: Scenario(granularity="op"),
    lambda: Scenario(local_access="x"),
])
def test_a_misspelled_choice_is_refused_from_python_as_from_yaml(make):
    with pytest.raises(ConfigError, match=r"expected (one of|an integer)"):
        make()


def test_the_yaml_reader_and_the_dataclass_share_one_declaration_of_each_choice():
    for key in ("collective_model", "local_access", "local_collectives"):
        assert Scenario._constraints[key] == RunOptions._constraints[key]
        for option in Scenario._constraints[key].options:
            assert getattr(load_scenario(None, {key: option}), key) == option


def test_the_old_names_still_work_with_a_warning(caplog):
    import hcsim.run.scenario

    hcsim.run.scenario._warned.clear()
    with caplog.at_level(logging.WARNING):
        scenario = load_scenario(None, {"fidelity": "decoder", "collective_fidelity": "flow", "xpu_fidelity": "all"})
    assert (scenario.granularity, scenario.collective_model) == ("decoder", "flow")
    for old, new in RENAMED_KEYS.items():
        assert f"{old}: renamed {new}" in caplog.text
    assert "xpu_fidelity: retired (every XPU is simulated" in caplog.text


@pytest.mark.parametrize("key, value, why", [
    ("xpu_sampling", "representative", "every XPU is simulated"),
    ("xpu_fidelity", "representative", "every XPU is simulated"),
    ("engine", "python", "every run is on the C++ engine core"),
])
def test_a_retired_key_naming_what_is_gone_is_refused_with_the_reason(key, value, why):
    with pytest.raises(ConfigError, match=rf"{key}: '?{value}'? is no longer available: {re.escape(why)}.*remove the {key} key"):
        load_scenario(None, {key: value})


def test_a_retired_key_naming_what_every_run_does_is_read_with_a_warning(caplog):
    import hcsim.run.scenario

    hcsim.run.scenario._warned.clear()
    with caplog.at_level(logging.WARNING):
        assert load_scenario(None, {"xpu_sampling": "all", "engine": "core"}) == load_scenario(None, {})
    assert "xpu_sampling: retired" in caplog.text and "engine: retired" in caplog.text


def test_the_workload_specs_old_key_still_works(tmp_path, caplog):
    text = (REPO_ROOT / "workloads" / "llama2-7b.yaml").read_text().replace("granularity: layer", "fidelity: decoder")
    (tmp_path / "old.yaml").write_text(text)
    with caplog.at_level(logging.WARNING):
        assert load_workload_spec(tmp_path / "old.yaml").granularity == "decoder"
    assert "fidelity: renamed granularity" in caplog.text
    assert load_workload_spec("llama2-7b", {"fidelity": "decoder"}).granularity == "decoder"


def test_an_experiment_with_the_old_keys_makes_the_same_points_as_with_the_new(tmp_path):
    old = "name: x\nbase: {xpu_fidelity: all}\naxes:\n  level: [{fidelity: layer}, {fidelity: decoder}]\n"
    new = old.replace("xpu_fidelity", "xpu_sampling").replace("fidelity:", "granularity:")
    keys = []
    for text in (old, new):
        (tmp_path / "x.yaml").write_text(text)
        keys.append([p.key for p in load_experiment(tmp_path / "x.yaml").points()])
    assert keys[0] == keys[1]


# --- issue 26: precision as a user says it, and which platforms spill -------------------------------------


def test_precision_overrides_the_workloads_training_precision():
    from hcsim.run.prepare import prepare

    assert load_scenario(None, ["precision=bf16"]).workload_settings() == {"training.precision": "bf16"}
    both = load_scenario(None, {"precision": "fp16", "workload_overrides": {"training.precision": "fp32"}})
    assert both.workload_settings()["training.precision"] == "fp16"  # the key wins, as collective does
    assert prepare(Scenario(xpus=2, precision="bf16")).workload.graph["precision"] == "bf16"
    assert prepare(Scenario(xpus=2)).workload.graph["precision"] == "fp32"  # llama2-13b: the paper's FP32
    with pytest.raises(ConfigError, match=r"precision: expected one of fp32, fp16, bf16, fp8 or None .*got 'fp4'"):
        Scenario(precision="fp4")


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b",
                                  "mixtral-8x7b"])
def test_modern_workloads_train_in_bf16_and_the_papers_in_fp32(name):
    assert load_workload_spec(name).precision == "bf16"
    assert load_workload_spec("llama2-13b").precision == "fp32"


def test_every_experiment_on_a_workload_whose_default_changed_names_its_precision():
    """The built-in llama2-7b, llama2-70b and gpt3-175b trained in FP32 until issue 26: an experiment that uses
    them names its precision, so its committed results do not move."""
    import yaml

    changed = {"llama2-7b", "llama2-70b", "gpt3-175b"}
    checked = 0
    for path in sorted((REPO_ROOT / "experiments").rglob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if "results" in path.parts or not isinstance(data, dict):
            continue
        if "axes" in data:  # an experiment
            scenarios = [point.scenario for point in load_experiment(path).points()]
        elif "workload" in data:  # a scenario (experiments/offload/llama70b-zero3.yaml)
            scenarios = [load_scenario(path)]
        else:  # a platform
            continue
        for scenario in scenarios:
            if scenario.workload in changed:
                checked += 1
                assert scenario.precision or "training.precision" in scenario.workload_overrides, path
    assert checked > 0


def test_dgx_platforms_do_not_spill_and_the_papers_do():
    assert load_platform_spec("dgx-h100").spill == load_platform_spec("dgx-a100").spill == "error"
    assert load_platform_spec("paper-cxl").spill == load_platform_spec("paper-traditional").spill == "allow"


def test_a_bad_value_is_blamed_where_it_was_written(tmp_path):
    """A value --set gave is named as --set KEY, one the file gave by the file, in the same message."""
    path = tmp_path / "sc.yaml"
    path.write_text("xpus: 0\ncxl_latency: 200ns\n")
    with pytest.raises(ConfigError) as err:
        load_scenario(path, ["cxl_bandwidth=5", "iterations=0"])
    lines = str(err.value).splitlines()
    assert any(line.startswith("--set cxl_bandwidth: 5 has no unit") for line in lines), lines
    assert any(line.startswith("--set iterations:") for line in lines), lines
    assert any(line.startswith(f"{path}: xpus: must be >= 1") for line in lines), lines
