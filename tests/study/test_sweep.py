"""Sweeps: experiment specs, the grid, the CSV (atomic rows, resume, errors), kill-and-resume, Dask, reports.

Every point runs in a process of its own (SimGrid allows one engine per
process), so these tests use tiny points: 2 to 8 XPUs, one iteration.
"""

import ast
import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import hcsim
from hcsim.errors import ConfigError
from hcsim.run.results import SPLIT_PARTS
from hcsim.study.findings import evaluate
from hcsim.study.experiment import load_experiment
from hcsim.study.store import columns, read_results
from hcsim.study.summary import write_report
from hcsim.study.sweep import run_sweep

TINY = """
name: tiny
description: Two to eight XPUs, with and without coherence.
base:
  iterations: 1
  granularity: decoder
  platform_overrides: {rack.servers: 1}
axes:
  coherent: [true, false]
  xpus: [2, 4]
plots:
  - {x: xpus, y: batches_per_s, series: coherent}
findings:
  - {check: better, claim: coherence wins, axis: coherent, better: true, worse: false}
"""


def write(folder: Path, text: str, name: str = "exp.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def data_rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as stream:
        return list(csv.reader(stream))[1:]


def hcsim_cli(*args, cwd=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "hcsim.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, **kwargs)


# --- experiment specs and the grid -------------------------------------------------------------


def test_the_grid_is_the_product_of_the_axes_in_order(tmp_path):
    experiment = load_experiment(write(tmp_path, TINY))
    points = experiment.points()
    assert [(p.labels["coherent"], p.labels["xpus"]) for p in points] == [(True, 2), (True, 4), (False, 2), (False, 4)]
    assert len({p.key for p in points}) == 4
    assert all(p.scenario.iterations == 1 and p.scenario.platform_overrides == {"rack.servers": 1} for p in points)


def test_axis_values_are_recorded_in_si_units_and_devices_joined(tmp_path):
    experiment = load_experiment(write(tmp_path, """
name: units
axes:
  cxl_bandwidth: [64GB/s, 128GB/s]
  cxl_latency: [200ns]
  devices: [[H100, A100]]
"""))
    labels = [p.labels for p in experiment.points()]
    assert labels == [{"cxl_bandwidth_Bps": 64e9, "cxl_latency_s": 2e-7, "devices": "H100+A100"},
                      {"cxl_bandwidth_Bps": 128e9, "cxl_latency_s": 2e-7, "devices": "H100+A100"}]


def test_a_zip_group_sets_several_keys_together(tmp_path):
    experiment = load_experiment(write(tmp_path, """
name: table
axes:
  system:
    - {label: 64 H100, xpus: 64, devices: [H100]}
    - {label: 128 H100 + 128 A100, xpus: 256, devices: [H100, A100]}
  collective: [ring, coherent_ring]
"""))
    points = experiment.points()
    assert len(points) == 4
    assert points[2].labels == {"system": "128 H100 + 128 A100", "xpus": 256, "devices": "H100+A100",
                                "collective": "ring"}
    assert points[2].scenario.devices == ("H100", "A100") and points[2].scenario.xpus == 256
    assert columns(experiment)[:5] == ["point", "system", "xpus", "devices", "collective"]


def test_dotted_override_axes_reach_the_override_maps(tmp_path):
    experiment = load_experiment(write(tmp_path, """
name: racks
base: {platform_overrides: {cxl.radix: 16}}
axes:
  platform_overrides.rack.servers: [1, 2]
"""))
    scenario = experiment.points()[1].scenario
    assert scenario.platform_overrides == {"cxl.radix": 16, "rack.servers": 2}


def test_a_base_scenario_file_is_read_relative_to_the_experiment(tmp_path):
    write(tmp_path, "xpus: 16\ncoherent: false\n", "base.yaml")
    experiment = load_experiment(write(tmp_path, "name: b\nbase: {scenario: base.yaml}\naxes: {iterations: [1, 3]}\n"))
    assert [(p.scenario.xpus, p.scenario.coherent, p.scenario.iterations) for p in experiment.points()] == \
        [(16, False, 1), (16, False, 3)]


@pytest.mark.parametrize("text, message", [
    ("name: x\naxes: {xpu: [1]}\n", r"axes\.xpu: not a scenario key \(did you mean 'xpus'\?\)"),
    ("name: x\naxes: {xpus: []}\n", r"axes\.xpus: expected a non-empty list"),
    ("name: x\nbase: {cxl_bandwith: 1GB/s}\n", r"base\.cxl_bandwith: not a scenario key \(did you mean 'cxl_bandwidth'\?\)"),
    ("name: x\naxis: {xpus: [1]}\n", r"axis: unknown key \(did you mean 'axes'\?\)"),
    ("name: x\nplots: [{x: xpus}]\n", r"plots\[0\]: y: required"),
    ("name: x\nplots: [{x: xpus, y: b, colour: red}]\n", r"plots\[0\]: colour: unknown plot key"),
    ("name: x\nfindings: [{check: faster}]\n", r"findings\[0\]: check: 'faster' is not one of"),
    ("name: x\nfindings: [{check: better, axis: coherent}]\n", r"findings\[0\]: better: required"),
    ("name: x\nbase: {scenario: nowhere.yaml}\n", r"base\.scenario: no such file"),
])
def test_experiment_errors_name_the_field(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(write(tmp_path, text))


def test_a_bad_value_names_the_point(tmp_path):
    with pytest.raises(ConfigError, match=r"point 1 \(cxl_latency=200\).*cxl_latency"):
        load_experiment(write(tmp_path, "name: x\naxes: {cxl_latency: [200ns, 200]}\n"))


def test_repeated_points_are_rejected(tmp_path):
    with pytest.raises(ConfigError, match="two points make the same scenario"):
        load_experiment(write(tmp_path, "name: x\naxes: {xpus: [8, 8]}\n"))


# --- running -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    experiment = load_experiment(write(folder, TINY))
    seen = []
    report = run_sweep(experiment, folder / "results", jobs=2, progress=lambda p, row, cost: seen.append(row))
    return experiment, report, seen


def test_a_sweep_writes_one_row_per_point_with_every_column(tiny_sweep):
    experiment, report, seen = tiny_sweep
    assert (report.total, report.ran, report.skipped, report.failed) == (4, 4, 0, 0)
    rows = read_results(report.csv)
    assert len(rows) == 4 and len(seen) == 4
    assert list(rows[0]) == columns(experiment)
    assert {(r["coherent"], r["xpus"]) for r in rows} == {(True, 2), (True, 4), (False, 2), (False, 4)}
    for row in rows:
        assert row["status"] == "ok" and row["error"] is None
        assert row["batches_per_s"] == pytest.approx(row["xpus"] / row["iteration_time_s"])
        assert row["batches_per_s_per_xpu"] == pytest.approx(1 / row["iteration_time_s"])
        assert (row["device"], row["device_xpus"]) == ("H100", row["xpus"])
        parts = row["compute_s"] + row["memory_stall_s"] + row["exposed_comm_s"] + row["idle_s"]
        assert parts == pytest.approx(row["iteration_time_s"], rel=1e-12)
        assert row["device_counts"] == f"{row['xpus']} H100"
        assert row["cxl_bandwidth_Bps"] == 128e9 and row["cxl_latency_s"] == 2e-7 and row["iterations"] == 1
        kind, link = row["busiest_link"].split(" ", 1)
        assert kind in ("cxl", "eth", "pcie", "xpu_link", "hbm", "dram", "upi") and " -> " in link
        assert 0 < row["busiest_link_utilization"] <= 1


def test_rows_are_whole_lines_in_a_file_that_pandas_would_read(tiny_sweep):
    _, report, _ = tiny_sweep
    text = report.csv.read_text()
    assert text.endswith("\n") and text.count("\n") == 5
    assert len({len(row) for row in csv.reader(text.splitlines())}) == 1


def test_a_sweep_draws_its_plots_and_summarises_its_findings(tiny_sweep):
    _, report, _ = tiny_sweep
    names = sorted(p.name for p in report.outputs)
    assert names == ["tiny.md", "tiny.png", "tiny.svg"]
    assert report.csv.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    summary = report.csv.with_suffix(".md").read_text()
    assert "**holds**: coherence wins" in summary and "![tiny](tiny.png)" in summary
    assert "| coherent | xpus | batches_per_s |" in summary


def test_point_keys_that_look_like_numbers_stay_text_and_every_point_is_reported(tiny_sweep, tmp_path, monkeypatch):
    """36725e2733359637 is a hex digest, not 3.6e2733359637 (= inf): no point may drop out of a report."""
    from hcsim.run.scenario import Scenario

    experiment, report, _ = tiny_sweep
    digest = Scenario.digest
    keys = ["36725e2733359637", "1234567890123456", "00000000000000e1", "7e100"]
    fake = {p.key: k for p, k in zip(experiment.points(), keys)}
    text = report.csv.read_text()
    for real, key in fake.items():
        text = text.replace(real, key)  # the point key and inputs_hash
    (tmp_path / "tiny.csv").write_text(text)
    monkeypatch.setattr(Scenario, "digest", lambda self: fake[digest(self)])
    rows = read_results(tmp_path / "tiny.csv")
    assert sorted(r["point"] for r in rows) == sorted(keys)
    assert sorted(r["inputs_hash"] for r in rows) == sorted(keys)
    again = run_sweep(experiment, tmp_path, resume=True)
    assert (again.ran, again.skipped) == (0, 4)
    summary = (tmp_path / "tiny.md").read_text()
    assert "4 points, 0 failed" in summary and len([line for line in summary.splitlines() if " H100 |" in line]) == 4


def test_a_mixed_point_has_one_row_per_device_type_never_their_mean(tmp_path):
    from hcsim.study.store import result_rows

    experiment = load_experiment(write(tmp_path, "name: m\naxes: {devices: [[H100, A100]]}\n"))
    point = experiment.points()[0]
    parts = {"H100": (4.0, 1.0, 0.0, 6.0), "A100": (10.0, 1.0, 0.0, 0.0)}  # the H100 wait 6 s for the A100
    result = {"xpus": 256, "devices": {"H100": 128, "A100": 128}, "iteration_time_s": 11.0, "batches_per_s": 256 / 11,
              "samples_per_s": 256 / 11, "iteration_times_s": [11.5, 11.0], "measured_iterations": "2..2",
              "breakdown": {d: {"xpus": 128, **dict(zip(("compute_s", "memory_stall_s", "exposed_comm_s", "idle_s"), p))}
                            for d, p in parts.items()},
              "pace": {"H100": {"xpu": "xpu0", "idle_s": 6.0}, "A100": {"xpu": "xpu128", "idle_s": 0.0}},
              "links": {"cxl": [{"link": "a -> b", "utilization": 0.5}]}, "activities": 1, "wall_time_s": 1.0,
              "peak_rss_mb": 1.0, "inputs_hash": point.key, "versions": {"hcsim": "x", "simgrid": "y"}}
    rows = result_rows(point, result, columns(experiment))
    assert [(r["device"], r["device_xpus"], r["idle_s"], r["least_idle_xpu"]) for r in rows] == \
        [("H100", 128, 6.0, "xpu0"), ("A100", 128, 0.0, "xpu128")]
    assert all(r["devices"] == "H100+A100" and r["batches_per_s"] == 256 / 11 for r in rows)
    assert all(list(r) == columns(experiment) for r in rows)


def test_columns_are_typed_as_a_whole():
    from hcsim.study.store import _column_kind

    assert _column_kind("level", ["1", "2.5", ""]) == "number"
    assert _column_kind("level", ["1", "1e999"]) == "text"  # inf is no value an axis takes
    assert _column_kind("label", ["64 H100", "128"]) == "text"
    assert _column_kind("coherent", ["True", "False"]) == "bool"
    assert _column_kind("point", ["1234567890123456"]) == "text"


def test_every_row_records_the_whole_resolved_scenario(tiny_sweep):
    from hcsim.run.results import scenario_columns

    _, report, _ = tiny_sweep
    for row in read_results(report.csv):
        for column in scenario_columns():  # blank only where nothing exists: the algorithm's own chunk count,
            # mappings that name no key
            assert row[column] not in (None, "") or column in ("collective_chunks", "workload_overrides",
                                                               "stragglers", "jobs"), column
        assert "xpu_sampling" not in row and row["platform"] == "paper-cxl" and row["collective"] == "ring"
        assert row["platform_overrides"] == "rack.servers" and row["platform_overrides.rack.servers"] == 1
        assert row["granularity"] == "decoder"


def test_resume_skips_what_is_done_and_a_plain_rerun_refuses(tiny_sweep):
    experiment, report, _ = tiny_sweep
    with pytest.raises(ConfigError, match=r"exists\. Fix: --resume"):
        run_sweep(experiment, report.csv.parent)
    again = run_sweep(experiment, report.csv.parent, resume=True, report=False)
    assert (again.ran, again.skipped) == (0, 4)
    assert len(data_rows(report.csv)) == 4


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    experiment = load_experiment(write(tmp_path, """
name: failing
base: {iterations: 1, granularity: decoder, platform_overrides: {rack.servers: 1}}
axes:
  xpus: [2, 5000]
"""))
    report = run_sweep(experiment, tmp_path / "r", jobs=2, report=False)
    assert (report.ran, report.failed) == (2, 1)
    rows = {r["xpus"]: r for r in read_results(report.csv)}
    assert rows[2]["status"] == "ok"
    assert rows[5000]["status"] == "error" and rows[5000]["batches_per_s"] is None
    assert "5000 XPUs asked for" in rows[5000]["error"]
    # --resume keeps the failure; --retry-errors runs it again (and it fails again, once)
    assert run_sweep(experiment, tmp_path / "r", resume=True, report=False).ran == 0
    retried = run_sweep(experiment, tmp_path / "r", resume=True, retry_errors=True, report=False)
    assert (retried.ran, retried.failed) == (1, 1)
    assert sorted(r["xpus"] for r in read_results(report.csv)) == [2, 5000]


def test_resume_drops_a_torn_last_line_and_reruns_its_point(tmp_path, tiny_sweep):
    experiment, report, _ = tiny_sweep
    folder = tmp_path / "torn"
    folder.mkdir()
    text = report.csv.read_text()
    (folder / "tiny.csv").write_text(text[: text.rfind("\n", 0, len(text) - 1) + 1] + text.splitlines()[-1][:30])
    again = run_sweep(experiment, folder, resume=True, report=False)
    assert again.ran == 1
    rows = data_rows(folder / "tiny.csv")
    assert len(rows) == 4 and len({r[0] for r in rows}) == 4


def test_resume_refuses_a_csv_of_another_experiment(tmp_path, tiny_sweep):
    _, report, _ = tiny_sweep
    (tmp_path / "tiny.csv").write_text("point,other\n")
    experiment = load_experiment(write(tmp_path, TINY))
    with pytest.raises(ConfigError, match="columns are not this experiment's"):
        run_sweep(experiment, tmp_path, resume=True)


def test_a_killed_sweep_loses_no_finished_point_and_resume_completes_it(tmp_path):
    spec = write(tmp_path, TINY.replace("xpus: [2, 4]", "xpus: [2, 4, 8]"))
    out = tmp_path / "results"
    result = out / "tiny.csv"
    sweep = subprocess.Popen([sys.executable, "-m", "hcsim.cli", "sweep", str(spec), "--jobs", "1", "--out", str(out),
                              "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (result.exists() and len(data_rows(result)) >= 1):
        assert sweep.poll() is None, sweep.stderr.read().decode()
        time.sleep(0.05)
    children = psutil.Process(sweep.pid).children(recursive=True)
    sweep.kill()  # SIGKILL: no cleanup runs in the sweep; its point process dies with it (PR_SET_PDEATHSIG)
    sweep.wait()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, "a point process outlived its killed sweep"
    before = data_rows(result)
    assert 1 <= len(before) < 6
    done = hcsim_cli("sweep", str(spec), "--jobs", "2", "--out", str(out), "--resume", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert f"{6 - len(before)} points run, {len(before)} already done, 0 failed" in done.stdout
    after = data_rows(result)
    assert len(after) == 6 and len({r[0] for r in after}) == 6
    assert after[: len(before)] == before  # the finished rows are kept as they were


def test_the_cli_reports_a_bad_experiment_in_one_line(tmp_path):
    done = hcsim_cli("sweep", str(write(tmp_path, "name: x\naxes: {xpu: [1]}\n")))
    assert done.returncode == 2
    assert done.stderr.startswith("hcsim: error: ") and "did you mean 'xpus'" in done.stderr


def test_a_csv_written_before_a_scenario_key_existed_is_reported_and_resumed_with_its_default(tiny_sweep, tmp_path):
    """An older hcsim wrote no batch_split column: its runs had the default (even), which the report reads
    and --resume writes into the file before it appends."""
    experiment, report, _ = tiny_sweep
    table = [row for row in csv.reader(io.StringIO(report.csv.read_text()))]
    drop = table[0].index("batch_split")
    old = [row[:drop] + row[drop + 1:] for row in table]
    folder = tmp_path / "old"
    folder.mkdir()
    with open(folder / "tiny.csv", "w", newline="") as stream:
        csv.writer(stream, lineterminator="\n").writerows(old)
    write_report(experiment, folder / "tiny.csv", folder)
    assert "tiny.md" in os.listdir(folder)
    with open(folder / "tiny.csv", "w", newline="") as stream:
        csv.writer(stream, lineterminator="\n").writerows(old[:-1])  # one point left to run
    again = run_sweep(experiment, folder, resume=True, report=False)
    assert (again.ran, again.skipped) == (1, 3)
    rows = read_results(folder / "tiny.csv")
    assert list(rows[0]) == columns(experiment) and {r["batch_split"] for r in rows} == {"even"}
    with pytest.raises(ConfigError, match="columns are not this experiment's"):  # a column missing that is no key
        (folder / "tiny.csv").write_text(",".join(c for c in table[0] if c != "iteration_time_s") + "\n")
        run_sweep(experiment, folder, resume=True, report=False)


def _as_written_before_issue_28(table: list[list[str]]) -> list[list[str]]:
    """A CSV of `table` as hcsim wrote it before issue 28: no result columns added since (mfu, tokens, the
    time split, memory per XPU), no column per override key, mappings and lists as JSON, "none" and prose
    where nothing exists."""
    from hcsim.study.store import ADDED_RESULT_COLUMNS

    header = table[0]
    keep = [i for i, c in enumerate(header) if c not in ADDED_RESULT_COLUMNS and not c.startswith("platform_overrides.")]
    old = []
    for row in table:
        cells = dict(zip(header, row))
        if row is not table[0]:
            cells["platform_overrides"] = json.dumps({"rack.servers": int(cells["platform_overrides.rack.servers"])})
            cells["workload_overrides"] = "{}"
            cells["collective_chunks"] = "the algorithm's default"
            cells["iteration_times_s"] = json.dumps([float(t) for t in cells["iteration_times_s"].split("+")])
            cells["trace_iterations"] = json.dumps([int(n) for n in cells["trace_iterations"].split("+")])
        old.append([cells[header[i]] for i in keep])
    return old


def test_a_csv_written_before_the_new_result_columns_is_reported_and_resumed_and_no_number_changes(tiny_sweep,
                                                                                                   tmp_path):
    """Committed sweep CSVs predate mfu, tokens_per_s, the time split and memory columns, and wrote JSON,
    "none" and prose: --report-only reads them, --resume rewrites them as today's (the new result columns
    blank, the override keys from the JSON), and every number stays what it was."""
    experiment, report, _ = tiny_sweep
    table = [row for row in csv.reader(io.StringIO(report.csv.read_text()))]
    old = _as_written_before_issue_28(table)
    folder = tmp_path / "old"
    folder.mkdir()
    with open(folder / "tiny.csv", "w", newline="") as stream:
        csv.writer(stream, lineterminator="\n").writerows(old)
    write_report(experiment, folder / "tiny.csv", folder)
    before = read_results(folder / "tiny.csv")
    again = run_sweep(experiment, folder, resume=True, report=False)
    assert again.ran == 0
    rows = read_results(folder / "tiny.csv")
    assert list(rows[0]) == columns(experiment)
    for was, now, fresh in zip(before, rows, read_results(report.csv)):
        for column, value in was.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert now[column] == value, column
        assert now["mfu"] is None and now["comm_dp_s"] is None  # not recorded by the older run
        assert now["platform_overrides.rack.servers"] == 1 and now["platform_overrides"] == "rack.servers"
        assert now["collective_chunks"] is None
        for column in ("trace_iterations", "iteration_times_s"):  # lists joined with +, as today's rows
            assert not str(now[column]).startswith("[") and now[column] == fresh[column], column


def test_two_sweeps_concatenate_and_group_in_pandas(tiny_sweep, tmp_path):
    """Numeric columns hold numbers or blanks (NaN), so pandas types them as numbers; the results of two sweeps
    (one written by an older hcsim and resumed) concatenate and group."""
    pandas = pytest.importorskip("pandas")
    experiment, report, _ = tiny_sweep
    table = [row for row in csv.reader(io.StringIO(report.csv.read_text()))]
    folder = tmp_path / "old"
    folder.mkdir()
    with open(folder / "tiny.csv", "w", newline="") as stream:
        csv.writer(stream, lineterminator="\n").writerows(_as_written_before_issue_28(table))
    run_sweep(experiment, folder, resume=True, report=False)
    text = {"point": str, "inputs_hash": str}
    frames = [pandas.read_csv(report.csv, dtype=text), pandas.read_csv(folder / "tiny.csv", dtype=text)]
    both = pandas.concat(frames, ignore_index=True)
    numeric = ["xpus", "iteration_time_s", "samples_per_s", "batches_per_s", "cxl_bandwidth_Bps", "cxl_latency_s",
               "collective_chunks", "mfu", "tokens_per_s", "model_flops_per_s_per_xpu", "state_per_xpu_bytes",
               "spilled_per_xpu_bytes", "compute_s", "exposed_comm_s", *SPLIT_PARTS, "platform_overrides.rack.servers"]
    for column in numeric:
        assert pandas.api.types.is_numeric_dtype(both[column]), (column, both[column].tolist())
    fresh = frames[0]
    assert fresh["mfu"].between(0, 1).all() and (fresh["tokens_per_s"] > 0).all()
    assert (fresh["state_per_xpu_bytes"] > 0).all()
    parts = fresh[[c for c in SPLIT_PARTS if c.startswith("comm_")]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(fresh["exposed_comm_s"].to_numpy(), rel=1e-9, abs=1e-15)
    grouped = both.groupby(["coherent", "xpus"])["iteration_time_s"].agg(["count", "mean"])
    assert (grouped["count"] == 2).all() and len(grouped) == len(fresh)


def test_report_only_redraws_from_the_csv(tiny_sweep, tmp_path):
    experiment, report, _ = tiny_sweep
    done = hcsim_cli("sweep", str(experiment.path), "--out", str(report.csv.parent), "--report-only")
    assert done.returncode == 0, done.stderr
    assert "tiny.md" in done.stdout


def test_an_unknown_executor_is_an_error(tiny_sweep):
    experiment, report, _ = tiny_sweep
    with pytest.raises(ConfigError, match="expected 'local' or 'dask://HOST:PORT'"):
        run_sweep(experiment, report.csv.parent, resume=True, executor="ray://x")


def test_points_run_on_a_dask_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    experiment = load_experiment(write(tmp_path, TINY))
    with distributed.LocalCluster(processes=True, n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster:
        address = cluster.scheduler_address.removeprefix("tcp://")
        report = run_sweep(experiment, tmp_path / "dask", executor=f"dask://{address}", report=False)
    assert (report.ran, report.failed) == (4, 0)
    local = {(r["coherent"], r["xpus"]): r["iteration_time_s"] for r in read_results(report.csv)}
    assert local[(True, 4)] < local[(False, 4)]


def test_findings_report_failures_with_their_numbers():
    rows = [{"status": "ok", "coherent": c, "xpus": x, "batches_per_s": b}
            for c, x, b in [(True, 8, 2.0), (False, 8, 1.0), (True, 16, 3.0), (False, 16, 3.5)]]
    finding = evaluate({"check": "better", "axis": "coherent", "better": True, "worse": False}, rows,
                       ["coherent", "xpus"])
    assert not finding.ok
    assert "0.8571x to 2x over 2 pairs" in finding.detail and "xpus=16: 0.8571x" in finding.detail


def test_matplotlib_is_imported_only_by_plotting_and_simgrid_never_by_sweeps():
    root = Path(hcsim.__file__).parent
    for path in [root / "study" / "sweep.py", root / "study" / "findings.py", root / "study" / "plotting.py",
                 root / "cli" / "sweep.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.startswith(("simgrid", "hcsim.engine")), f"{path.name} imports {name}"
                assert path.name == "plotting.py" or not name.startswith("matplotlib"), f"{path.name} imports {name}"


def test_close_compares_the_members_of_a_zip_group_against_a_reference():
    rows = [{"status": "ok", "level": level, "fidelity": fidelity, "xpus": x, "batches_per_s": b}
            for level, fidelity, x, b in [("exact", "layer", 8, 1.0), ("cheap", "decoder", 8, 1.004),
                                          ("exact", "layer", 16, 2.0), ("cheap", "decoder", 16, 2.2)]]
    spec = {"check": "close", "axis": "level", "reference": "exact", "other": "cheap", "tolerance": 0.01}
    finding = evaluate(spec, rows, ["level", "fidelity", "xpus"])  # fidelity varies with level: not a group key
    assert not finding.ok
    assert "at most 10.00% apart over 2 pairs" in finding.detail and "xpus=16: +10.00%" in finding.detail


def test_findings_read_quantities_in_where():
    rows = [{"status": "ok", "point": f"p{i}", "coherent": c, "cxl_bandwidth_Bps": bw, "batches_per_s": b}
            for i, (c, bw, b) in enumerate([(True, 32e9, 1.0), (False, 32e9, 2.0), (True, 128e9, 3.0),
                                            (False, 128e9, 2.0)])]
    spec = {"check": "better", "axis": "coherent", "better": True, "worse": False, "where": {"cxl_bandwidth": "128GB/s"}}
    assert evaluate(spec, rows, ["cxl_bandwidth_Bps", "coherent"]).ok


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    """Make run_point start a shell script of ours instead of Python."""
    def install(body: str) -> None:
        script = tmp_path / "python"
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
        monkeypatch.setattr("hcsim.study.points.sys.executable", str(script))
    return install


def test_a_point_whose_process_crashes_is_an_error_naming_the_signal(fake_python):
    from hcsim.run.scenario import Scenario
    from hcsim.study.points import run_point

    fake_python('echo "terminate called after throwing an instance of xbt::Exception" >&2; kill -SEGV $$')
    result = run_point(Scenario(xpus=2))
    assert result == {"error": "the simulation process died (signal SIGSEGV): "
                               "terminate called after throwing an instance of xbt::Exception"}


def test_a_point_that_runs_too_long_is_killed_and_recorded(fake_python):
    from hcsim.run.scenario import Scenario
    from hcsim.study.points import run_point

    fake_python("exec sleep 30")
    started = time.monotonic()
    assert run_point(Scenario(xpus=2), timeout=0.5) == {"error": "timed out after 0.5 s"}
    assert time.monotonic() - started < 10


def test_a_running_point_reports_how_far_it_is(fake_python):
    """The progress bar moves during a point: its process writes the fraction done, run_point passes it on."""
    from hcsim.run.scenario import Scenario
    from hcsim.study.points import run_point

    fake_python('echo 0.25 > "$(dirname "$4")/progress"; sleep 1.5; echo 0.5 > "$(dirname "$4")/progress"; sleep 1.5')
    seen = []
    run_point(Scenario(xpus=2), progress=seen.append)
    assert seen and seen == sorted(seen) and {0.25, 0.5} >= set(seen) and 0.5 in seen


def test_what_a_point_warns_is_said_once_a_run_and_left_out_of_its_result(monkeypatch, caplog):
    """A point's process keeps its stderr only when it fails: what it warns comes back with its result and the
    run says each message once, however many points warned it (here two A100 points, whose kernel factors are
    literature figures, and a workload note each point's spec says), never as a result key; a note the run
    said itself (checking the specs before the points run) is not said again."""
    import hcsim.errors as errors
    from hcsim.run.scenario import Scenario
    from hcsim.study.points import WARNINGS, run_points
    from hcsim.workload import load_workload_spec

    monkeypatch.setattr(errors, "_SAID", set())  # what this test process said before does not count
    overrides = {"model.decoders": 2, "training.fp8_recipe": "current"}  # no effect in BF16: a note
    point = Scenario(platform="dgx-a100", workload="llama3-8b", xpus=8, tp=2, iterations=1,
                     workload_overrides=overrides)
    with caplog.at_level("WARNING"):
        load_workload_spec("llama3-8b", overrides)  # as a sweep checks its points' specs first
        results = [result for _, result in run_points([point, point], jobs=2)]
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "literature figures" in m and "A100" in m]) == 1
    assert len([m for m in said if "training.fp8_recipe: 'current' applies to precision fp8" in m]) == 1, said
    assert all("error" not in result and WARNINGS not in result for result in results)
