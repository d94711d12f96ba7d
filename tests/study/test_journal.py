"""hcsim.study.journal: `hcsim plan` and `hcsim validate` killed with SIGKILL (no cleanup) and resumed lose
no finished simulation and duplicate none (issue 29), as a sweep's CSV does."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hcsim.config import REPO_ROOT
from hcsim.errors import ConfigError
from hcsim.study.journal import Journal

SELENE = str(REPO_ROOT / "experiments" / "validation" / "selene.yaml")
RUNS = "name,layers,hidden,heads,vocabulary,sequence,gpus,tp,pp,micro_batch,global_batch,recompute,measured,unit\n" + \
    "".join(f"r{i},2,256,4,1024,128,2,2,1,1,{2 * i},full,1.0,s\n" for i in range(1, 7))  # ~0.4 s a row
PLAN = ["plan", "llama2-7b", "--xpus", "8", "--global-batch", "8", "--top", "6"]
MARK = 123.25  # an iteration time no simulation gives: a result read back from the journal, not run again


def _hcsim(*args, cwd):
    return subprocess.run([sys.executable, "-m", "hcsim.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def _kill_after_first(args: list[str], journal: Path, cwd: Path) -> list[dict]:
    """Start hcsim, SIGKILL it and its children once `journal` holds a line; return the journal's entries."""
    process = subprocess.Popen([sys.executable, "-m", "hcsim.cli", *args], cwd=cwd, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    try:
        while not (journal.exists() and journal.read_bytes().count(b"\n")) and time.monotonic() < deadline:
            assert process.poll() is None, "it ended before the first simulation was journaled"
            time.sleep(0.005)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return [json.loads(line) for line in journal.read_text().splitlines()]


def _mark(journal: Path, field: str) -> str:
    """Give the journal's first result a marked iteration time; return its key."""
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    entries[0]["result"][field] = MARK
    journal.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return entries[0]["key"]


def test_a_killed_validation_resumes_without_losing_or_repeating_a_row(tmp_path):
    (tmp_path / "runs.csv").write_text(RUNS)
    args = ["validate", "runs.csv", "--platform", SELENE, "--out", "out"]
    journal = tmp_path / "out" / "validation.journal.jsonl"
    kept = _kill_after_first(args, journal, tmp_path)
    assert 1 <= len(kept) < 6 and not (tmp_path / "out" / "validation.csv").exists()
    _mark(journal, "iteration_time_s")

    again = _hcsim(*args, cwd=tmp_path)  # neither flag: refused, nothing lost
    assert again.returncode == 2 and "an interrupted validation left its finished simulations here" in again.stderr
    assert "Fix: --resume" in again.stderr and journal.exists()
    assert "taking over the lock of validation process" in again.stderr  # the killed run's lock, said

    done = _hcsim(*args, "--resume", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming: {len(kept)} finished simulations kept" in done.stderr
    rows = list(csv.DictReader((tmp_path / "out" / "validation.csv").open()))
    assert sorted(r["name"] for r in rows) == [f"r{i}" for i in range(1, 7)]  # each row once
    assert all(r["simulated_s"] and not r["reason"] for r in rows)
    assert sum(float(r["simulated_s"]) == MARK for r in rows) == 1  # the journaled one was not simulated again
    assert not journal.exists() and not (tmp_path / "out" / ".validation.journal.lock").exists()


def test_a_killed_plan_resumes_without_losing_or_repeating_a_simulation(tmp_path):
    args = [*PLAN, "--out", "out"]
    journal = tmp_path / "out" / "plan.journal.jsonl"
    kept = _kill_after_first(args, journal, tmp_path)
    assert 1 <= len(kept) < 6 and not (tmp_path / "out" / "plan.csv").exists()
    _mark(journal, "iteration_time_s")

    assert "Fix: --resume to run only the missing ones" in _hcsim(*args, cwd=tmp_path).stderr
    done = _hcsim(*args, "--resume", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming: {len(kept)} finished simulations kept" in done.stderr
    rows = [r for r in csv.DictReader((tmp_path / "out" / "plan.csv").open()) if r["simulated"] == "True"]
    ranks = [int(r["rank"]) for r in rows]  # which plans follow the first is the search's choice (--top 6)
    assert len(ranks) == len(set(ranks)) == 6 and 1 in ranks  # each plan once; the estimate's best first
    assert sum(float(r["simulated_s"]) == MARK for r in rows) == 1
    assert not journal.exists()

    over = _hcsim(*args, "--overwrite", cwd=tmp_path)  # nothing to discard: a plan as without the flag
    assert over.returncode == 0 and str(MARK) not in (tmp_path / "out" / "plan.csv").read_text()


@pytest.mark.parametrize("argv, message", [
    (["validate", "runs.csv", "--platform", "paper-cxl", "--resume", "--overwrite"],
     r"--resume, --overwrite: they contradict each other \(keep the finished simulations in "
     r"validation\.journal\.jsonl, or start over"),
    ([*PLAN, "--out", "out", "--resume", "--overwrite"], r"--resume, --overwrite: they contradict each other"),
    ([*PLAN, "--resume"], r"--resume: needs --out, the folder of the plan it resumes"),
    ([*PLAN, "--overwrite"], r"--overwrite: needs --out"),
])
def test_contradictory_or_useless_resume_flags_are_refused_before_anything_runs(argv, message, tmp_path, capsys,
                                                                                monkeypatch):
    import re

    from hcsim.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs.csv").write_text(RUNS)
    monkeypatch.setattr("hcsim.study.points.run_points", lambda *a, **k: pytest.fail("a simulation ran"))
    monkeypatch.setattr("hcsim.study.validate._simulate_row", lambda *a, **k: pytest.fail("a row ran"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hcsim: error: ") and err.count("\n") == 1 and re.search(message, err), err
    assert not (tmp_path / "validation").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, where", [
    ('{"key": "a", "result": {}}\nnot json\n', ":2: not a line of a plan journal"),
    ('{"key": 5, "result": {}}\n', ":1: not a line of a plan journal"),
    ('["key", "result"]\n', ":1: not a line of a plan journal"),
])
def test_a_journal_line_that_is_not_one_is_named_by_file_and_line(tmp_path, text, where):
    (tmp_path / "plan.journal.jsonl").write_text(text)
    with pytest.raises(ConfigError, match=rf"plan\.journal\.jsonl{where} .*delete that line, or run with "
                                          r"--overwrite"):
        with Journal(tmp_path, "plan", "plan", resume=True):
            pass
    assert not (tmp_path / ".plan.journal.lock").exists()  # released on the error


def test_a_torn_last_line_is_dropped_and_the_rest_kept(tmp_path):
    (tmp_path / "plan.journal.jsonl").write_text('{"key": "a", "result": {"x": 1}}\n{"key": "b", "resu')
    with Journal(tmp_path, "plan", "plan", resume=True) as journal:
        assert journal.done == {"a": {"x": 1}}
        journal.record("b", {"x": 2})
    lines = (tmp_path / "plan.journal.jsonl").read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines] == ["a", "b"]


def test_a_second_process_into_the_same_folder_is_refused_while_the_first_runs(tmp_path):
    with Journal(tmp_path, "validation", "validation"):
        with pytest.raises(ConfigError, match=r"validation\.journal\.jsonl: another validation is writing it"):
            with Journal(tmp_path, "validation", "validation"):
                pass


def _children(process: subprocess.Popen) -> list:
    import psutil

    try:
        return psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _cmdline(child) -> str:
    import psutil

    try:
        return " ".join(child.cmdline())
    except psutil.Error:
        return ""


def test_a_row_whose_process_is_killed_ends_validate_with_one_error_naming_it_and_no_zombie(tmp_path):
    """SIGKILL of a row's simulation process (the OOM killer, a user): the other rows run and are journaled, the
    command ends with one error naming the row, the dead process is reaped, and --resume runs only that row."""
    import psutil

    (tmp_path / "runs.csv").write_text(RUNS)
    args = ["validate", "runs.csv", "--platform", SELENE, "--out", "out"]
    journal = tmp_path / "out" / "validation.journal.jsonl"
    process = subprocess.Popen([sys.executable, "-m", "hcsim.cli", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    killed, seen = None, set()
    try:
        deadline = time.monotonic() + 120
        while killed is None and time.monotonic() < deadline and process.poll() is None:
            for child in _children(process):
                seen.add(_cmdline(child))
                if "hcsim.study.points" in _cmdline(child):
                    child.kill()
                    killed = child
                    break
            time.sleep(0.002)
        assert killed is not None, "no row process seen"
        while psutil.pid_exists(killed.pid):  # reaped while validate goes on with the other rows (~2 s)
            assert process.poll() is None, f"row process {killed.pid} not reaped before validate ended"
            time.sleep(0.01)
        out, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert not any("resource_tracker" in line or "spawn_main" in line for line in seen), seen
    assert process.returncode == 2 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("hcsim: error: ")]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    assert errors[0] == ("hcsim: error: runs.csv:2 (r1): the simulation process died (signal SIGKILL); the other "
                         "rows' simulations are kept in out/validation.journal.jsonl: run again with --resume")
    kept = [json.loads(line) for line in journal.read_text().splitlines()]
    assert len(kept) == 5 and not (tmp_path / "out" / "validation.csv").exists()  # every other row, no report
    done = _hcsim(*args, "--resume", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resuming: 5 finished simulations kept" in done.stderr
    rows = list(csv.DictReader((tmp_path / "out" / "validation.csv").open()))
    assert sorted(r["name"] for r in rows) == [f"r{i}" for i in range(1, 7)] and all(r["simulated_s"] for r in rows)


def test_a_killed_validate_leaves_no_process_behind(tmp_path):
    """SIGKILL of `hcsim validate` itself: its row processes die with it (no orphan, no resource tracker)."""
    import psutil

    (tmp_path / "runs.csv").write_text(RUNS)
    process = subprocess.Popen([sys.executable, "-m", "hcsim.cli", "validate", "runs.csv", "--platform", SELENE,
                                "--out", "out", "--jobs", "2"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    children = []
    deadline = time.monotonic() + 120
    while not any("hcsim.study.points" in _cmdline(c) for c in children) and time.monotonic() < deadline:
        assert process.poll() is None, "it ended before a row process started"
        children = _children(process)
        time.sleep(0.002)
    children = _children(process)
    process.kill()  # the parent only: no cleanup runs in it
    process.wait()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert children and not alive, [_cmdline(c) for c in alive]
