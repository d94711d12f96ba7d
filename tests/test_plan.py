"""hcsim plan: enumeration invariants, the memory filter, the closed-form estimate against the engine's
rules, speed-proportional layer splits on mixed clusters, and the command end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hcsim.plan import _proportional, candidates, estimate, fits, rank_correlation
from hcsim.platform import build_platform, load_platform_spec
from hcsim.platform.topology import xpus as platform_xpus
from hcsim.workload import load_workload_spec
from hcsim.workload.hybrid import Parallelism

sys.path.insert(0, str(Path(__file__).parent / "engine"))
from test_hybrid_schedules import FAST, iteration_time, spec as tiny_spec  # noqa: E402
from hcsim.plan import Candidate  # noqa: E402
from hcsim.platform.builders import single_switch  # noqa: E402


def test_rank_correlation_of_known_orders():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert rank_correlation([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)  # 1 - 6·4/(5·24)


@pytest.mark.parametrize("decoders, speeds, expected", [(8, [3, 1], (6, 2)), (80, [989, 312], (61, 19)),
                                                        (10, [1, 1, 1], (4, 3, 3))])
def test_a_proportional_split_follows_speed_and_sums_to_the_decoders(decoders, speeds, expected):
    split = _proportional(decoders, speeds)
    assert sum(split) == decoders and min(split) >= 1
    assert sorted(split, reverse=True) == sorted(expected, reverse=True)


def test_every_candidate_is_a_valid_split_of_the_cluster():
    spec = load_workload_spec("llama2-7b")
    xpus = [f"x{i}" for i in range(32)]
    found = candidates(spec, xpus, 64, server_size=8)
    assert found
    for candidate in found:
        par = candidate.parallelism
        assert par.tp * par.pp * par.dp == 32 and par.tp <= 8
        assert 64 % (par.dp * par.micro_batch) == 0 and spec.model.heads % par.tp == 0
        par.check_model(spec)  # raises if the model cannot be split this way


def test_what_does_not_fit_says_which_stage_and_how_much():
    spec = load_workload_spec("llama2-70b", {"training.precision": "bf16"})
    platform = build_platform(load_platform_spec("paper-cxl"), 16)
    xpus = platform_xpus(platform)[:16]
    pure_dp = Candidate(parallelism=Parallelism(dp=16, global_batch=16))
    assert fits(spec, pure_dp, platform, xpus).startswith("stage 0 needs ")  # 70B x 16 B on one 80 GiB XPU
    sharded = Candidate(parallelism=Parallelism(tp=8, pp=2, global_batch=2, recompute="full"))  # 70 GB each
    assert fits(spec, sharded, platform, xpus) is None


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved", 2)])
def test_the_estimate_is_the_engine_s_time_without_contention(schedule, v):
    """Uniform stages and nearly free communication (the fake kernel of test_hybrid_schedules): the closed
    form Σ τ + (m - 1)·max τ (bubble / v when interleaved) is what the executor's rules give."""
    par = Parallelism(pp=2, global_batch=8, schedule=schedule, virtual_stages=v)
    platform = single_switch(2, FAST, xpu_link_bandwidth=1e18, xpu_link_latency=1e-15, hbm_latency=1e-15)
    estimated = estimate(tiny_spec(), Candidate(parallelism=par), platform, ["xpu0", "xpu1"])
    assert estimated == pytest.approx(iteration_time(par), rel=1e-5)


def _stage_compute(split: list[int] | None) -> list[float]:
    settings = ["xpus=16", "devices=[H100,A100]", "platform_overrides.rack.servers=1", "workload=llama2-7b",
                "pp=2", "global_batch=4", "iterations=1", "xpu_sampling=representative", "tp=8"]
    if split:
        settings.append(f"layer_split=[{split[0]},{split[1]}]")
    args = [a for s in settings for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", "--json", *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    stages = json.loads(done.stdout)["stages"]
    return [stages[s]["compute_s"] for s in ("0", "1")]


def test_a_speed_proportional_layer_split_equalises_the_stages_compute():
    """H100 stage and A100 stage (FP32: 67 and 19.5 TFLOP/s): an even split leaves the A100 stage 3.4x
    longer; the proportional split leaves them within one decoder's time."""
    even = _stage_compute(None)
    split = _proportional(32, [67e12, 19.5e12])
    proportional = _stage_compute(list(split))
    assert even[1] / even[0] == pytest.approx(67 / 19.5, rel=0.05)
    one_decoder = proportional[1] / split[1]
    assert abs(proportional[0] - proportional[1]) <= one_decoder


def test_plan_runs_end_to_end_on_a_mixed_cluster(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "plan", "llama2-7b", "--xpus", "16", "--global-batch",
                           "16", "--devices", "H100,A100", "--set", "platform_overrides.rack.servers=1", "--top", "3",
                           "--jobs", "2", "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fit in local memory" in done.stdout and "rank correlation" in done.stdout
    rows = (tmp_path / "plan.csv").read_text().splitlines()
    assert len(rows) == 4 and (tmp_path / "plan.png").stat().st_size > 0
