"""`hcsim simulate` end to end: results, traces, determinism and errors.

Every simulation runs in a subprocess: SimGrid allows one engine per process.
"""

import csv
import json
import re
import subprocess
import sys

import pytest

from hcsim.errors import ConfigError
from hcsim.run.report import atomic_write
from hcsim.run.scenario import load_scenario

SMALL = ["--set", "xpus=8", "--set", "iterations=2"]


def hcsim(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "hcsim.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    done = hcsim("simulate", *SMALL, "--json", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), out


def test_json_result_has_the_documented_fields(small_run):
    result, out = small_run
    for key in ("iteration_times_s", "iteration_time_s", "batches_per_s", "samples_per_s", "breakdown",
                "links", "activities", "wall_time_s", "xpus"):
        assert key in result
    for rows in result["links"].values():
        assert rows == sorted(rows, key=lambda r: -r["utilization"]) and all(0 < r["utilization"] <= 1 for r in rows)
    assert result["xpus"] == 8 and len(result["iteration_times_s"]) == 2
    assert result["iteration_time_s"] == result["iteration_times_s"][1]  # steady state: after the first
    assert result["batches_per_s"] == pytest.approx(8 / result["iteration_time_s"], rel=1e-12)
    row = result["breakdown"]["H100"]
    assert row["xpus"] == 8 and result["measured_iterations"] == "2..2"
    assert row["compute_s"] + row["memory_stall_s"] + row["exposed_comm_s"] + row["idle_s"] == pytest.approx(
        result["iteration_time_s"], rel=1e-12)  # the breakdown adds up to the reported iteration time
    assert not any(isinstance(v, str) and (v.startswith(("[", "{")) or " " in v)  # no JSON or prose
                   for v in result["inputs_resolved"].values())
    assert json.loads((out / "result.json").read_text()) == result


def test_links_csv_lists_every_loaded_link_and_agrees_with_the_result(small_run):
    result, out = small_run
    with open(out / "links.csv") as handle:
        rows = list(csv.DictReader(handle))
    utilization = [float(r["utilization"]) for r in rows]
    assert utilization == sorted(utilization, reverse=True) and 0 < utilization[-1] and utilization[0] <= 1
    for kind, busiest in result["links"].items():
        first = next(r for r in rows if r["kind"] == kind)
        assert f"{first['source']} -> {first['target']}" == busiest[0]["link"]
        assert float(first["bytes"]) == busiest[0]["bytes"]


def test_traces_have_one_event_per_vertex_run(small_run):
    result, out = small_run
    with open(out / "trace.csv") as handle:
        rows = list(csv.DictReader(handle))
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    vertex_events = [e for e in events if e["ph"] == "X" and e["cat"] in ("compute", "comm")]
    assert len(rows) == len(vertex_events) > 0
    runs = {(r["iteration"], r["xpu"], r["vertex"]) for r in rows}
    assert len(runs) == len(rows)  # each vertex run once
    assert {r["iteration"] for r in rows} == {"1", "2"}
    for event in events:
        assert event["ph"] in ("X", "M")
        if event["ph"] == "X":
            assert event["dur"] >= 0 and {"pid", "tid", "ts", "name"} <= set(event)
    assert any(e["ph"] == "X" and e["cat"] == "memory-traffic" for e in events)


def test_same_inputs_same_numbers(small_run):
    first, _ = small_run
    again = hcsim("simulate", *SMALL, "--json")
    second = json.loads(again.stdout)
    for volatile in ("wall_time_s", "setup_time_s", "peak_rss_mb"):
        first = {k: v for k, v in first.items() if k != volatile}
        second.pop(volatile)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def test_analytic_local_access_is_exact_on_data_parallel_training():
    """The analytic fold of private HBM reads is exact when each XPU computes one vertex at a time."""
    times = {}
    for mode in ("analytic", "simulated"):
        done = hcsim("simulate", "--set", "xpus=4", "--set", "iterations=1", "--set", f"local_access={mode}",
                     "--set", "platform_overrides.cxl.type3_capacity=unbounded", "--json")
        assert done.returncode == 0, done.stderr
        times[mode] = json.loads(done.stdout)["iteration_time_s"]
    assert times["analytic"] == pytest.approx(times["simulated"], rel=1e-12)


def test_coherence_beats_no_coherence_at_small_scale():
    rates = {}
    for coherent in ("true", "false"):
        done = hcsim("simulate", "--set", "xpus=8", "--set", "iterations=1", "--set", f"coherent={coherent}", "--json")
        rates[coherent] = json.loads(done.stdout)["batches_per_s"]
    assert rates["true"] > rates["false"]


@pytest.mark.parametrize("settings,message", [
    (["--set", "xpus=5000"], r"xpus: 5000 XPUs asked for, but platform 'paper-cxl' has 4096"),
    (["--set", "devices=[H900]"], r"devices.*H900"),
    (["--set", "xpu=8"], r"xpu: unknown key \(did you mean 'xpus'\?\)"),
    (["--set", "cxl_bandwidth=128"], r"cxl_bandwidth: 128 has no unit"),
    (["--set", "platform=no-such-platform"], r"no-such-platform: no such file"),
    (["--set", "xpus=2", "--set", "platform_overrides.cxl.type3_capacity=1GiB"], r"does not fit even with spilling"),
    (["--set", "collective=rign"], r"collective: 'rign' is not one of .*\(did you mean 'ring'\?\)"),
    (["--set", "collective=coherent_ring", "--set", "coherent=false"],
     r"collective: coherent_ring keeps the reduced shards in coherent memory.*coherent: false"),
    (["--set", "xpus=12", "--set", "collective=halving_doubling"], r"halving_doubling.*power-of-two group, got 12"),
    (["--set", "platform=gh200", "--set", "xpus=8", "--set", "collective=pooled_memory"],
     r"collective: algorithm 'pooled_memory': the group's 8 XPUs do not share one memory device.*valid: a group"),
])
def test_bad_input_gets_one_clear_line(settings, message):
    done = hcsim("simulate", *settings)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("hcsim: error")]
    assert error
    assert re.search(message, done.stderr), done.stderr


def test_missing_scenario_file_is_named(tmp_path):
    done = hcsim("simulate", str(tmp_path / "nope.yaml"))
    assert done.returncode == 2 and "nope.yaml: cannot read" in done.stderr


def test_scenario_file_errors_name_the_file_and_every_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("xpus: -3\ncxl_latency: 5\ncolective: ring\n")
    with pytest.raises(ConfigError) as error:
        load_scenario(path)
    text = str(error.value)
    assert f"{path}: xpus: must be >= 1" in text
    assert f"{path}: cxl_latency: 5 has no unit" in text
    assert "colective: unknown key (did you mean 'collective'?)" in text


def test_interrupted_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "result.json"
    target.write_text("old")

    with pytest.raises(TypeError):
        atomic_write(target, object())  # fails mid-write
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_atomic_write_gives_a_plain_new_file_mode(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        atomic_write(tmp_path / "result.json", "{}")
    finally:
        os.umask(umask)
    assert (tmp_path / "result.json").stat().st_mode & 0o777 == 0o644


MIXED = ["--set", "xpus=16", "--set", "devices=[H100,A100]", "--set", "platform_overrides.rack.servers=1",
         "--set", "granularity=decoder"]


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """8 H100 in rack 0 and 8 A100 in rack 1: the A100 set the pace."""
    out = tmp_path_factory.mktemp("mixed")
    done = hcsim("simulate", *MIXED, "--set", "trace_xpus=[xpu2, xpu9]", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads((out / "result.json").read_text()), out


def test_a_mixed_system_reports_each_device_type_and_who_sets_the_pace(mixed_run):
    stdout, result, _ = mixed_run
    h100, a100 = result["breakdown"]["H100"], result["breakdown"]["A100"]
    assert h100["xpus"] == a100["xpus"] == 8
    for row in (h100, a100):
        assert sum(row[p] for p in ("compute_s", "memory_stall_s", "exposed_comm_s", "idle_s")) == pytest.approx(
            result["iteration_time_s"], rel=1e-12)
    # the A100 compute longer (19.5 against 67 TFLOP/s fp32), the H100 wait for them. (Not to 1e-9: only an
    # instance's time inside the measured window counts, and the H100 start iteration 2 before the A100 end
    # iteration 1.)
    assert a100["compute_s"] == pytest.approx(h100["compute_s"] * 67 / 19.5, rel=0.01)
    assert h100["idle_s"] > a100["idle_s"] and result["pace"]["A100"]["idle_s"] < result["pace"]["H100"]["idle_s"]
    assert re.search(r"pace set by\s+A100 \(xpu\d+, idle .* least idle of the other types: H100 ", stdout), stdout


def test_xpus_csv_has_a_row_per_xpu_that_adds_up(mixed_run):
    _, result, out = mixed_run
    with open(out / "xpus.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["xpu"] for r in rows] == [f"xpu{i}" for i in range(16)]
    assert {r["device"] for r in rows[:8]} == {"H100"} and {r["device"] for r in rows[8:]} == {"A100"}
    assert {r["rack"] for r in rows[:8]} == {"0"} and {r["rack"] for r in rows[8:]} == {"1"}
    for row in rows:
        parts = sum(float(row[p]) for p in ("compute_s", "memory_stall_s", "exposed_comm_s", "idle_s"))
        assert parts == pytest.approx(float(row["iteration_time_s"]), rel=1e-12)
        assert float(row["iteration_time_s"]) == result["iteration_time_s"]
    assert (out / "xpus.png").read_bytes().startswith(b"\x89PNG")


def test_named_trace_xpus_are_traced_with_their_memory_track(mixed_run):
    _, _, out = mixed_run
    with open(out / "trace.csv") as handle:
        assert {r["xpu"] for r in csv.DictReader(handle)} == {"xpu2", "xpu9"}
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"xpu2 compute", "xpu2 memory", "xpu9 compute", "xpu9 memory"} <= tracks
    memory = [e for e in events if e["ph"] == "X" and e["cat"] == "memory-traffic"]
    assert {e["args"]["dst"] for e in memory} == {"xpu2", "xpu9"}
    assert all(e["args"]["src"].startswith(e["args"]["dst"] + ".") for e in memory)  # from their own memories


def test_trace_xpus_per_device(tmp_path):
    done = hcsim("simulate", *MIXED, "--set", "iterations=1", "--set", "trace_xpus=per-device", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "trace.csv") as handle:
        names = {r["xpu"] for r in csv.DictReader(handle)}
    assert names == {"xpu0", "xpu8"}  # the first H100 and the first A100


def test_trace_xpus_errors_name_the_key():
    done = hcsim("simulate", "--set", "xpus=4", "--set", "trace_xpus=[xpu9]", "--out", "/tmp/hcsim-never-written")
    assert done.returncode == 2 and "trace_xpus: xpu9 is not among this run's XPUs" in done.stderr
    done = hcsim("simulate", "--set", "trace_xpus=per-class")  # representative XPUs' classes, retired
    assert done.returncode == 2 and "trace_xpus" in done.stderr
    assert "per-stage, per-device; got 'per-class'" in done.stderr


def test_simulate_help_lists_every_scenario_key_with_its_default():
    import dataclasses

    from hcsim.run.scenario import Scenario

    done = hcsim("simulate", "--help")
    keys = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ") and "(default " in line]
    assert keys == [f.name for f in dataclasses.fields(Scenario) if f.name != "base"]
    assert "cxl_bandwidth (default unset)" in done.stdout and "workload_overrides (default {}): any key" in done.stdout


DGX_SPILLS = ["--set", "platform=dgx-h100", "--set", "workload=llama3-8b", "--set", "xpus=16", "--set",
              "global_batch=32", "--set", "tp=2"]  # 157.7 GB per GPU: activations of 4-sample micro-batches


def test_state_beyond_hbm_on_a_dgx_cluster_is_out_of_memory_unless_spilling_is_allowed():
    """Issue 26: Megatron-LM and PyTorch stop out of memory where hcsim used to spill over PCIe in silence."""
    done = hcsim("simulate", *DGX_SPILLS)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert re.search(r"^hcsim: error: scenario 'default': out of memory: stage 0 needs [0-9.]+ GB per XPU, each H100 "
                     r"holds 85\.9 GB \(parameters .*activations [0-9.]+ GB, CUDA context, workspaces and allocator reserve [0-9.]+ GB\); platform 'dgx-h100' is a DGX cluster.*"
                     r"Fix: offload \(offload=cpu\), ZeRO \(zero=1, 2 or 3\), more pipeline stages \(pp\), "
                     r"recomputation \(recompute=full\), a smaller micro_batch, or allow spilling .*--set spill=allow$",
                     done.stderr.strip()), done.stderr
    allowed = hcsim("simulate", *DGX_SPILLS, "--set", "spill=allow")
    assert allowed.returncode == 0, allowed.stderr
    assert re.search(r"memory\s+H100 [0-9.]+ GB of state per XPU, [0-9.]+ GB spilled to host DRAM \(not coherent: "
                     r"copied into local memory before use, .*; spill: allow\)", allowed.stdout), allowed.stdout
    result = json.loads(hcsim("simulate", *DGX_SPILLS, "--set", "spill=allow", "--set", "iterations=1",
                              "--json").stdout)
    row = result["memory"]["H100"]
    assert result["spill"] == "allow" and row["spilled_to"] == "dram"
    beyond = row["state_bytes"] - 80 * 2**30
    assert beyond <= row["spilled_bytes"] < beyond + row["state_bytes"] / 32  # whole decoders (of 32) spill


def test_a_layout_that_fits_runs_on_a_dgx_cluster_and_says_nothing_spilled():
    done = hcsim("simulate", *DGX_SPILLS, "--set", "recompute=full", "--set", "iterations=1")
    assert done.returncode == 0, done.stderr
    assert re.search(r"memory\s+H100 [0-9.]+ GB of state per XPU, nothing spilled", done.stdout), done.stdout


@pytest.mark.parametrize("coherent, where", [("true", r"CXL Type 3 memory \(coherent: read in place"),
                                             ("false", r"host DRAM \(not coherent: copied into local memory")])
def test_the_papers_topologies_still_spill_and_the_summary_says_where(coherent, where):
    """LLaMA2-13B in FP32 (208 GB of state) spills on both of the paper's topologies: its model (Fig. 3b, 3c)."""
    done = hcsim("simulate", "--set", "xpus=2", "--set", "iterations=1", "--set", f"coherent={coherent}")
    assert done.returncode == 0, done.stderr
    assert re.search(r"memory\s+H100 [0-9.]+ GB of state per XPU, [0-9.]+ GB spilled to " + where, done.stdout), \
        done.stdout
    assert "spill: allow" in done.stdout


def test_precision_overrides_the_workloads_and_shows_in_the_header():
    done = hcsim("simulate", "--set", "xpus=2", "--set", "iterations=1", "--set", "precision=bf16", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["precision"] == "bf16" and result["inputs_resolved"]["precision"] == "bf16"
    from hcsim.cli.simulate import summary

    assert summary(result).splitlines()[0].endswith("workload llama2-13b, precision bf16")
    fp32 = json.loads(hcsim("simulate", "--set", "xpus=2", "--set", "iterations=1", "--json").stdout)
    assert fp32["precision"] == "fp32" and fp32["inputs_resolved"]["precision"] == "fp32"
    assert result["iteration_time_s"] < fp32["iteration_time_s"]  # the H100's BF16 peak is 989 TFLOP/s, FP32 67


def test_out_refuses_an_earlier_run_s_results_and_overwrite_leaves_none_of_them(tmp_path):
    first = hcsim("simulate", "--set", "xpus=4", "--set", "iterations=1", "--out", str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "trace.json").exists()
    (tmp_path / "notes.txt").write_text("mine")
    again = hcsim("simulate", "--set", "xpus=4", "--set", "iterations=1", "--out", str(tmp_path))
    assert again.returncode == 2 and "holds the results of an earlier run (result.json" in again.stderr
    assert "--overwrite" in again.stderr and "Traceback" not in again.stderr
    before = (tmp_path / "result.json").read_text()
    replaced = hcsim("simulate", "--set", "xpus=2", "--set", "iterations=1", "--set", "trace_xpus=0",
                     "--out", str(tmp_path), "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert not (tmp_path / "trace.json").exists() and not (tmp_path / "trace.csv").exists()  # the earlier run's
    assert json.loads((tmp_path / "result.json").read_text())["xpus"] == 2 != json.loads(before)["xpus"]
    assert (tmp_path / "notes.txt").read_text() == "mine"  # not a result: kept


def test_the_summary_says_the_clock_the_power_limit_leaves_the_gemms():
    """A `power limit` line under `compute` for the devices whose GEMMs run below their clock alone, none else."""
    from hcsim.cli.simulate import _compute_line

    base = {"compute_model": "roofline", "compute_factors": "platforms/compute-model.yaml", "kernels": "megatron",
            "precision_recipe": "bf16"}
    assert len(_compute_line({**base, "gemm_clocks": {}})) == 1
    assert _compute_line({**base, "gemm_clocks": {"H100": 0.8931}})[1] == (
        "  power limit      H100 GEMMs at 0.893 of their clock alone (their share of the kernel time)")
