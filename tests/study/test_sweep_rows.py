"""A sweep's results CSV read back: ``--resume`` checks each row before it trusts it, ``--report-only`` refuses a
CSV whose rows are not the experiment's points.

--resume: a row whose point key is no point of the experiment (a damaged key, a point removed), or whose axis
values, inputs hash, status or results do not hold, is moved to NAME.dropped.csv, said in a warning, and its
point is run again; the other rows are kept as they were. --report-only (and the report at a sweep's end)
refuses a CSV with points added, removed or changed since it was written, naming the file and what differs.

The points are tiny (2 and 4 XPUs, one iteration): each damaged point runs again in a second or two.
"""

import csv
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hcsim.study.experiment import load_experiment
from hcsim.study.sweep import run_sweep

TINY = """
name: tiny
base:
  iterations: 1
  granularity: decoder
  platform_overrides: {rack.servers: 1}
axes:
  coherent: [true, false]
  xpus: [2, 4]
plots:
  - {x: xpus, y: batches_per_s, series: coherent}
"""


def table(path: Path) -> list[list[str]]:
    with open(path, newline="") as stream:
        return list(csv.reader(stream))


def save(path: Path, rows: list[list[str]]) -> None:
    with open(path, "w", newline="") as stream:
        csv.writer(stream, lineterminator="\n").writerows(rows)


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """The experiment and its finished CSV (4 points, one row each: every point is one device type)."""
    folder = tmp_path_factory.mktemp("rows")
    spec = folder / "tiny.yaml"
    spec.write_text(TINY)
    experiment = load_experiment(spec)
    report = run_sweep(experiment, folder / "results", jobs=2, report=False)
    assert (report.ran, report.failed) == (4, 0)
    return spec, experiment, report.csv


def resumed(done, tmp_path, damage, caplog):
    """Copy the finished CSV, damage its second data row with damage(header, row), --resume: the report, the
    CSV after, the rows before, the warnings."""
    spec, experiment, finished = done
    before = table(finished)
    rows = [list(r) for r in before]
    damage(rows[0], rows[2])
    folder = tmp_path / "out"
    folder.mkdir()
    save(folder / "tiny.csv", rows)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hcsim.study"):
        report = run_sweep(experiment, folder, resume=True, report=False)
    warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    return report, table(folder / "tiny.csv"), before, rows[2], warnings, folder


def cell(header, name):
    return header.index(name)


def flip(text: str) -> str:
    """`text` with its last character changed (a one-character damage)."""
    return text[:-1] + ("0" if text[-1] != "0" else "1")


@pytest.mark.parametrize("case, damage, said", [
    ("point key damaged by one character", lambda h, r: r.__setitem__(0, flip(r[0])),
     r"point '?[0-9a-f]{15}\w'? is no point of this experiment"),
    ("inputs_hash damaged", lambda h, r: r.__setitem__(cell(h, "inputs_hash"), flip(r[cell(h, "inputs_hash")])),
     r"inputs_hash .* is not the point's"),
    ("iteration time blank", lambda h, r: r.__setitem__(cell(h, "iteration_time_s"), ""),
     r"iteration_time_s is '', not a number > 0"),
    ("throughput not a number", lambda h, r: r.__setitem__(cell(h, "batches_per_s"), "1.2.3"),
     r"batches_per_s is '1\.2\.3', not a number > 0"),
    ("status damaged", lambda h, r: r.__setitem__(cell(h, "status"), "okk"), r"status 'okk'"),
    ("columns missing", lambda h, r: r.__delitem__(slice(len(r) - 5, len(r))), r"\d+ of \d+ columns"),
    ("axis value changed under the same key", lambda h, r: r.__setitem__(cell(h, "xpus"), "8"),
     r"xpus is '8', the point's is 4"),
    ("error row without its error", lambda h, r: (r.__setitem__(cell(h, "status"), "error"),
                                                   r.__setitem__(cell(h, "error"), "")),
     r"status error without its error"),
])
def test_resume_runs_again_the_point_of_a_row_it_cannot_trust_and_says_so(done, tmp_path, caplog, case, damage,
                                                                          said):
    report, after, before, bad, warnings, folder = resumed(done, tmp_path, damage, caplog)
    assert (report.ran, report.skipped) == (1, 3), case
    assert re.search(said, warnings) and "tiny.dropped.csv" in warnings and "line 3" in warnings, warnings
    assert len(after) == 5 and sorted(r[0] for r in after[1:]) == sorted(r[0] for r in before[1:])  # one row a point
    assert after[1] == before[1] and after[2:4] == before[3:]  # the trusted rows kept as they were, in order
    ok = after[0].index("status")
    assert after[4][0] == before[2][0] and after[4][ok] == "ok"  # its point run again
    dropped = table(folder / "tiny.dropped.csv")
    assert dropped[0] == before[0] and dropped[1:] == [bad]  # nothing read back is lost


def test_resume_keeps_error_rows_but_says_so(done, tmp_path, caplog):
    def error(header, row):
        row[cell(header, "status")], row[cell(header, "error")] = "error", "out of memory (as recorded)"

    report, after, _, _, warnings, _ = resumed(done, tmp_path, error, caplog)
    assert (report.ran, report.skipped) == (0, 4)
    assert "1 point recorded with an error kept (--retry-errors runs them again)" in warnings


def hcsim(*args, cwd):
    return subprocess.run([sys.executable, "-m", "hcsim.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def stale(done, tmp_path, edit) -> tuple[subprocess.CompletedProcess, Path]:
    spec, _, finished = done
    folder = tmp_path / "results"
    folder.mkdir()
    shutil.copy(finished, folder / "tiny.csv")
    edited = tmp_path / "tiny.yaml"
    edited.write_text(edit(spec.read_text()))
    return hcsim("sweep", "tiny.yaml", "--out", "results", "--report-only", cwd=tmp_path), folder


def test_report_only_draws_a_csv_that_holds_every_point(done, tmp_path):
    run, folder = stale(done, tmp_path, lambda text: text)
    assert run.returncode == 0, run.stderr
    assert (folder / "tiny.png").exists() and "4 points, 0 failed" in (folder / "tiny.md").read_text()


def test_the_report_lists_failed_points_in_the_tables_order_not_as_they_failed(done, tmp_path):
    """Points fail in whatever order their processes end: the report sorts them as its table, so a re-run
    writes the same report."""
    spec, _, finished = done
    header, *rows = table(finished)
    for row in rows:
        row[cell(header, "status")] = "error"
        row[cell(header, "error")] = f"failed: xpus {row[cell(header, 'xpus')]}, coherent {row[cell(header, 'coherent')]}"
    folder = tmp_path / "results"
    folder.mkdir()
    shutil.copy(spec, tmp_path / "tiny.yaml")
    for order in (rows, rows[::-1]):
        save(folder / "tiny.csv", [header, *order])
        run = hcsim("sweep", "tiny.yaml", "--out", "results", "--report-only", cwd=tmp_path)
        listed = [line for line in (folder / "tiny.md").read_text().splitlines() if line.startswith("- ")]
        assert run.returncode == 0 and listed == [
            f"- coherent={c}, xpus={x}: failed: xpus {x}, coherent {c}" for c in (False, True) for x in (2, 4)], listed


@pytest.mark.parametrize("edit, what", [
    (lambda t: t.replace("xpus: [2, 4]", "xpus: [2, 4, 8]"),
     r"2 points without a row \(added to the experiment, or not run yet: coherent=True, xpus=8; coherent=False, xpus=8\)"),
    (lambda t: t.replace("xpus: [2, 4]", "xpus: [2]"),
     r"rows of 2 points the experiment no longer has \((coherent=True, xpus=4; coherent=False, xpus=4|"
     r"coherent=False, xpus=4; coherent=True, xpus=4)\)"),
    (lambda t: t.replace("iterations: 1", "iterations: 2"),
     r"4 points changed \(the same axis values, another scenario: [^:]*: coherent=\w+, xpus=[24]; "
     r"coherent=\w+, xpus=[24]; coherent=\w+, xpus=[24]; and 1 more\)"),
])
def test_report_only_refuses_a_csv_whose_points_are_not_the_experiments(done, tmp_path, edit, what):
    run, folder = stale(done, tmp_path, edit)
    assert run.returncode == 2 and run.stdout == "", run.stderr
    message = run.stderr
    assert message.startswith("hcsim: error: results/tiny.csv: its rows are not the points of tiny.yaml: ")
    assert message.count("\n") == 1 and "Traceback" not in message
    assert re.search(what, message), message
    assert "Fix: hcsim sweep tiny.yaml --out results --resume" in message
    assert not (folder / "tiny.png").exists() and not (folder / "tiny.md").exists()  # no report of old numbers


def test_resume_after_points_changed_sets_their_rows_aside_and_reports_the_new_ones(done, tmp_path):
    run, folder = stale(done, tmp_path, lambda t: t.replace("xpus: [2, 4]", "xpus: [2]"))
    assert run.returncode == 2
    again = hcsim("sweep", "tiny.yaml", "--out", "results", "--resume", "--no-progress", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "0 points run, 2 already done" in again.stdout
    assert "no point of this experiment" in again.stderr and "tiny.dropped.csv" in again.stderr
    assert len(table(folder / "tiny.csv")) == 3 and len(table(folder / "tiny.dropped.csv")) == 3
    assert "2 points, 0 failed" in (folder / "tiny.md").read_text()
