"""The benchmark scripts still run against today's API (they are not timed here: speed is measured by running
them, README "Speed"). Smallest points only."""

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "failed" not in done.stdout, done.stdout
    return done.stdout


def test_the_2d_hierarchical_case_runs():
    out = run(str(BENCHMARKS / "hierarchical_2d.py"), "--xpus", "16")
    assert " 16 " in out and "iteration time" in out


def test_engine_speed_prints_a_row_per_point_and_the_fitted_exponent():
    out = run(str(BENCHMARKS / "engine_speed.py"), "--case", "gpt3-mb", "simgrid", "--micro-batches", "2", "4",
              "--xpus", "8", "--firings", "2000")
    rows = [line.split() for line in out.splitlines()]
    assert [r[1] for r in rows if r and r[0] == "gpt3-mb" and r[1].isdigit()] == ["2", "4"]
    assert any(r[:2] == ["simgrid", "8"] for r in rows)
    assert "wall time ~ micro-batches^" in out
