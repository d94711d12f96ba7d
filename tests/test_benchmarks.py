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


def test_repeat_reports_one_row_per_point_the_fastest_of_its_runs():
    out = run(str(BENCHMARKS / "engine_speed.py"), "--case", "layer", "--xpus", "8", "--repeat", "2")
    assert "the fastest of 2 runs per point" in out
    assert len([line for line in out.splitlines() if line.split()[:2] == ["layer", "8"]]) == 1


def test_a_ratio_pairs_each_run_with_its_ceiling_s_of_the_same_round():
    """The machine's speed drifts between rounds: round 1 at full speed, round 2 at half. Each round's ratio is 0.8
    and 0.9; the reported one is their median (0.85), not the fastest over the fastest (80 / 100 = 0.8)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import engine_speed
    finally:
        sys.path.remove(str(BENCHMARKS))
    runs = {("simgrid-cpp", 8): [{"activities": 100, "run_s": 1.0}, {"activities": 100, "run_s": 2.0}],
            ("layer", 8): [{"activities": 80, "run_s": 1.0}, {"activities": 90, "run_s": 2.0}]}
    assert engine_speed._ratio("layer", 8, "simgrid-cpp", runs) == "0.85"
    assert engine_speed._ratio("simgrid-cpp", 8, "simgrid-cpp", runs) == "-"  # not against itself
    runs[("layer", 8)][1] = {"error": "> 900 s"}  # a failed round drops out
    assert engine_speed._ratio("layer", 8, "simgrid-cpp", runs) == "0.80"


def test_the_ceiling_runs_on_the_layer_case_s_own_platform_and_the_case_is_compared_to_it():
    out = run(str(BENCHMARKS / "engine_speed.py"), "--case", "simgrid", "layer", "--xpus", "8", "--firings", "2000",
              "--ceiling-platform", "layer")
    rows = {r[0]: r for r in (line.split() for line in out.splitlines()) if r and r[0] in ("simgrid", "layer")
            and len(r) > 1 and r[1] == "8"}
    assert set(rows) == {"simgrid", "layer"}
    assert float(rows["layer"][6]) > 0  # its /simgrid column: a ratio to that ceiling


def test_gpu_kernels_writes_what_hcsim_calibrate_reads(tmp_path):
    """benchmarks/gpu_kernels.py needs a GPU to measure; here its row format goes through calibrate's reader,
    and without PyTorch or CUDA the script says so and exits 2."""
    import csv

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gpu_kernels
    finally:
        sys.path.remove(str(BENCHMARKS))
    from hcsim.study.calibrate import read_kernels

    path = tmp_path / "k.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, gpu_kernels.COLUMNS)
        writer.writeheader()
        writer.writerow(gpu_kernels.row("gemm", 1e-3, flops=2.0 * 4096**3, m=4096, n=4096, k=4096, batch=1))
        writer.writerow(gpu_kernels.row("add_bf16", 2e-5, size=6.0 * 1024, elements=1024))
        writer.writerow(gpu_kernels.row("gemm_bf16", 1e-3, flops=2.0 * 8**3, note="m=8 n=8 k=8"))
    rows = read_kernels([path])
    assert [(r.kind, r.shape()) for r in rows if r.kind.startswith("gemm")] == \
        [("gemm", {"m": 4096, "n": 4096, "k": 4096}), ("gemm_bf16", {"m": 8, "n": 8, "k": 8})]
    assert rows[1].bytes == 6144 and rows[1].elements == 1024
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_kernels.py"), "-o", str(tmp_path / "o.csv")],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:  # no PyTorch, or no GPU: one clear line
        assert done.returncode == 2 and "gpu_kernels: " in done.stderr


def test_serving_speed_prints_a_row_per_request_count():
    out = run(str(BENCHMARKS / "serving_speed.py"), "--requests", "50", "100", "--replicas", "1")
    rows = [line.split() for line in out.splitlines()]
    assert [r[0] for r in rows if r and r[0].replace(",", "").isdigit()] == ["50", "100"]
    assert "peak MiB" in out and "machine:" in out
