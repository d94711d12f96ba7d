"""`hcsim validate`: RUNS files, unit conversions, reasons for rows it cannot simulate, the report, the
peak model's independence of op-level costs, and the reduced validation set (issue 14, item 5).

Every simulation runs in a subprocess: SimGrid allows one engine per process.
"""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcsim.config import REPO_ROOT
from hcsim.errors import ConfigError
from hcsim.study.validate import RunRow, measured_seconds, read_runs, summarize_rows, validate

VALIDATION = REPO_ROOT / "experiments" / "validation"
SELENE = str(VALIDATION / "selene.yaml")
HEADER = "name,layers,hidden,heads,vocabulary,sequence,gpus,tp,pp,micro_batch,global_batch,recompute,measured,unit\n"


def row(**cells):
    return RunRow(line=2, cells={k: str(v) for k, v in cells.items()})


def test_throughputs_become_the_iteration_times_they_imply():
    shape = dict(global_batch=512, sequence=2048, layers=24, hidden=2304, vocabulary=51200, gpus=32)
    assert measured_seconds(row(measured=1500, unit="ms")) == 1.5
    assert measured_seconds(row(measured=8, unit="samples/s", **shape)) == 64.0
    assert measured_seconds(row(measured=2048 * 8, unit="tokens/s", **shape)) == 64.0
    b, s, L, h, V = 512, 2048, 24, 2304, 51200
    flops = 96 * b * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))  # Narayanan et al. 2021, eq. (3)
    assert measured_seconds(row(measured=137, unit="tflops/gpu", **shape)) == pytest.approx(flops / (137e12 * 32))


def test_a_runs_file_with_an_unknown_column_is_refused(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("name,gpus,measured,unit,colour\nx,8,1,s,red\n")
    with pytest.raises(ConfigError, match="unknown columns colour"):
        read_runs(path)


def test_rows_it_cannot_simulate_keep_their_reason(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + "# a comment line\n"
                    "no micro-batch,2,256,4,1024,128,2,2,1,,2,full,1.0,s\n"
                    "heads,2,258,3,1024,128,2,2,1,1,2,full,1.0,s\n"
                    "too large,2,256,4,1024,128,2,2,1,1,2,full,1.0,s\n")
    records = validate(read_runs(path), SELENE, max_runs=10)
    reasons = {r["name"]: r["reason"] for r in records}
    assert "micro_batch: not given" in reasons["no micro-batch"]
    assert "does not divide the 3 attention heads" in reasons["heads"]
    assert "exceed --max-runs 10" in reasons["too large"]
    assert all(r["error"] is None for r in records)
    assert summarize_rows(records)["not_simulated"]["rows"] == 3


def test_a_row_that_is_malformed_refuses_the_file_before_any_row_runs(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + "# a comment line\nbad unit,2,256,4,1024,128,2,2,1,1,2,full,1.0,furlongs\n")
    with pytest.raises(ConfigError, match=r"runs\.csv:3: unit: 'furlongs' is not one of s, ms"):
        read_runs(path)


def test_the_peak_model_gives_the_same_times_with_or_without_op_level_costs():
    """compute_model: peak is the paper's FLOPs / FLOP/s whatever kernels the vertices list (bit for bit)."""
    script = f"""
import sys
from hcsim.engine.api import RunOptions
from hcsim.run.prepare import prepare
from hcsim.run.scenario import load_scenario
from hcsim.run.simulation import simulate_graphs
scenario = load_scenario(None, dict(platform={SELENE!r}, workload="gpt-megatron", xpus=4, tp=2, pp=2, micro_batch=1,
                         global_batch=4, recompute="selective", iterations=2,
                         workload_overrides={{"model.decoders": 4, "model.hidden": 512, "model.heads": 8,
                                              "model.ffn": 2048, "model.sequence": 256}}))
prepared = prepare(scenario)
with_ops = simulate_graphs(prepared.platform, prepared.workload, RunOptions(iterations=2))
for _, data in prepared.workload.nodes(data=True):
    data.pop("ops", None)
without = simulate_graphs(prepared.platform, prepared.workload, RunOptions(iterations=2))
assert with_ops["iteration_ends"] == without["iteration_ends"], (with_ops["iteration_ends"], without["iteration_ends"])
print("same")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "same" in done.stdout, done.stderr


def test_validate_writes_its_table_and_plot(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text(HEADER + "tiny,2,256,4,1024,128,2,2,1,1,2,full,0.01,s\n"
                             "tiny 2,2,256,4,1024,128,2,2,1,1,4,full,0.02,s\n")
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "validate", str(runs), "--platform", SELENE,
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    table = list(csv.DictReader((tmp_path / "out" / "validation.csv").open()))
    assert [r["name"] for r in table] == ["tiny", "tiny 2"]
    for r in table:
        assert float(r["error"]) == pytest.approx(float(r["simulated_s"]) / float(r["measured_s"]) - 1, rel=1e-5)
    assert (tmp_path / "out" / "validation.png").stat().st_size > 0
    assert "mean abs error" in (tmp_path / "out" / "validation.md").read_text()


def test_the_report_is_the_same_bytes_when_written_again(tmp_path):
    """A committed validation reproduces bit for bit: its SVG too (matplotlib salts its element ids at random
    unless told otherwise), and its PNG and table."""
    from hcsim.study.validate import write_report

    records = [{"name": n, "role": role, "measured": m, "unit": "s", "measured_s": m, "simulated_s": s,
                "error": s / m - 1, "mfu": 0.5, "reason": ""} for n, role, m, s in
               (("22B", "calibration", 1.42, 1.40), ("175B", "", 18.1, 18.6), ("1T", "", 37.8, 36.9))]
    first, second = write_report(records, tmp_path / "a", "t"), write_report(records, tmp_path / "b", "t")
    assert sorted(p.suffix for p in first) == [".csv", ".md", ".png", ".svg"]
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes(), a.name


# The reduced set of issue 14: the four models of Korthikanti et al. Table 5, both modes. By default the test runs
# the smallest model's rows (22B, 8 GPUs, both modes); HCSIM_VALIDATION=full runs all eight (about 20 s with two
# processes). Every row is held out: no factor is fitted to a training step's time (the A100's GEMM factor comes
# from per-kernel figures, platforms/compute-model.yaml), so the rows check the model, they do not set it.
def test_the_reduced_validation_set_reproduces_the_committed_table_and_each_row_is_within_12_percent():
    """The committed validation.csv is what the model gives today, row for row (a change to the A100's model
    must recommit it), and each row stays within the issue's per-row bound (max |error| 12 %). The issue's mean
    bound (5 %) is not met since the A100 factor stopped being fitted to two of these rows: docs/validation.md."""
    rows = read_runs(VALIDATION / "korthikanti-table5.csv")
    if os.environ.get("HCSIM_VALIDATION") != "full":
        rows = [r for r in rows if r.name.startswith("22B")]
    records = validate(rows, SELENE, jobs=2, base=str(VALIDATION))
    assert all(r["error"] is not None for r in records), [r["reason"] for r in records]
    with open(VALIDATION / "results" / "korthikanti-table5" / "validation.csv", newline="") as f:
        committed = {row["name"]: float(row["simulated_s"]) for row in csv.DictReader(f)}
    for record in records:
        assert record["simulated_s"] == pytest.approx(committed[record["name"]], rel=1e-5), record["name"]
    assert all(r["role"] != "calibration" for r in records)
    assert max(abs(r["error"]) for r in records) <= 0.12, [(r["name"], r["error"]) for r in records]


@pytest.mark.parametrize("option, message", [
    (["--set", "bogus=1"], "hcsim: error: --set bogus: unknown key; valid keys: "),
    (["--max-runs", "-1"], "hcsim: error: --max-runs: must be an integer >= 1 (vertex runs per row), got -1"),
    (["--platform", "nosuch"], "hcsim: error: nosuch: no such file, nor a built-in platforms spec; built-in ones: "),
])
def test_an_option_wrong_for_every_row_is_one_message_before_any_row_runs(tmp_path, option, message):
    """The real command: exit 2 and one line, not a note per row with exit 0; no row simulated, no folder made."""
    (tmp_path / "runs.csv").write_text(HEADER + "r1,2,256,4,1024,128,2,2,1,1,2,full,1.0,s\n"
                                       "r2,2,256,4,1024,128,2,2,1,1,4,full,1.0,s\n")
    platform = [] if "--platform" in option else ["--platform", SELENE]
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "validate", "runs.csv", *platform, *option, "--out",
                           "out"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "out").exists()
