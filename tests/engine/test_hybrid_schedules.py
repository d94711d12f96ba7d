"""Pipeline schedules on uniform stages with nearly free communication, and one contended end-to-end run.

A device of 1 TFLOP/s with 1e20 B/s memory makes every vertex compute-bound, and links of 1e18 B/s
and 1e-15 s make collectives and p2p transfers cost nothing measurable, so an iteration takes exactly
what the schedule's bubble formula says (Narayanan et al. 2021; Qi et al. 2023, REFERENCE.md).
"""

import json
import subprocess
from collections import defaultdict
import sys

import pytest

from hcsim.engine.trace import TraceRecorder
from hcsim.workload.hybrid import Parallelism, block_costs
from hcsim.workload.schedules import stage_order
from cases import hybrid_run as run, hybrid_spec as spec, iteration_time


def pass_times(p: int, micro_batch: int = 1, tp: int = 1) -> tuple[float, float, float]:
    """(t_F, t_B, t_W) of one stage of p and one micro-batch, in s (t_B includes t_W)."""
    attn, mlp = block_costs(spec(), micro_batch, tp)
    layers = 8 // p
    return tuple(layers * (getattr(attn, k) + getattr(mlp, k)) / 1e12
                 for k in ("fwd_flops", "bwd_flops", "weight_grad_flops"))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 4), (4, 8)])
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_passes(schedule, p, m):
    t_f, t_b, _ = pass_times(p)
    measured = iteration_time(Parallelism(pp=p, global_batch=m, schedule=schedule))
    assert measured == pytest.approx((m + p - 1) * (t_f + t_b), rel=1e-6)
    bubble = measured / (m * (t_f + t_b)) - 1
    assert bubble == pytest.approx((p - 1) / m, rel=1e-5)


@pytest.mark.parametrize("p, v, m", [(2, 2, 4), (2, 4, 4), (4, 2, 8)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p, v, m):
    t_f, t_b, _ = pass_times(p)
    measured = iteration_time(Parallelism(pp=p, global_batch=m, schedule="interleaved", virtual_stages=v))
    assert measured / (m * (t_f + t_b)) - 1 == pytest.approx((p - 1) / (v * m), rel=1e-5)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8)])
def test_zb_h1_bubble_is_below_1f1b_and_its_authors_bound(p, m):
    t_f, t_b, t_w = pass_times(p)
    one_f_one_b = iteration_time(Parallelism(pp=p, global_batch=m, schedule="1f1b"))
    zero_bubble = iteration_time(Parallelism(pp=p, global_batch=m, schedule="zb-h1"))
    assert zero_bubble < one_f_one_b
    assert zero_bubble - m * (t_f + t_b) <= (p - 1) * (t_f + t_b - t_w) * (1 + 1e-6)  # Qi et al.: ZB-H1's bubble


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_the_perfetto_schedule_track_shows_each_stage_s_passes_in_schedule_order(tmp_path, schedule, v):
    par = Parallelism(pp=2, dp=2, global_batch=8, schedule=schedule, virtual_stages=v)
    platform, graph, result = run(par, trace=True)
    recorder = TraceRecorder(frozenset(x for x, kind in platform.nodes(data="kind") if kind == "xpu"))
    recorder.vertices, recorder.transfers = list(result["vertices"]), list(result["transfers"])
    recorder.write_perfetto(tmp_path / "trace.json", platform, graph)
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    slices = defaultdict(list)  # (iteration, track name) -> its schedule slices
    for e in events:
        if e.get("cat") == "schedule":
            slices[e["args"]["iteration"], names[e["pid"], e["tid"]]].append(e)
    assert len(slices) == 2 * 4  # two iterations x every XPU
    for (_, track), passes in slices.items():
        stage = passes[0]["args"]["stage"]
        assert track.endswith(f"schedule (stage {stage})")
        passes.sort(key=lambda e: e["ts"])
        expected = stage_order(schedule, stages=2, micro_batches=4, stage=stage, chunks=v)
        assert [e["name"] for e in passes] == [f"mb{op.micro_batch} {op.kind}" + (f" c{op.chunk}" if op.chunk else "")
                                                for op in expected]
        for before, after in zip(passes, passes[1:]):  # one pass at a time on an XPU
            assert before["ts"] + before["dur"] <= after["ts"] * (1 + 1e-12)


def test_tensor_parallelism_divides_a_stage_s_compute_time():
    measured = {tp: iteration_time(Parallelism(tp=tp, pp=2, global_batch=4)) for tp in (1, 2)}
    assert measured[2] == pytest.approx(measured[1] / 2, rel=1e-5)


def test_schedules_order_as_their_bubbles_on_a_contended_platform(tmp_path):
    """On the paper's CXL platform (TP over the XPU switch, p2p and DP over CXL, shared links): GPipe and
    1F1B have the same bubble, interleaving and ZB-H1 shrink it, so they are faster."""
    times = {}
    for schedule, extra in (("1f1b", []), ("gpipe", []), ("interleaved", ["virtual_stages=2"]), ("zb-h1", [])):
        settings = ["xpus=16", "workload=llama2-7b", "tp=2", "pp=4", "global_batch=16", "iterations=2",
                    "workload_overrides.model.decoders=16", f"schedule={schedule}", *extra]
        args = [a for s in settings for a in ("--set", s)]
        done = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", "--json", *args], capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        times[schedule] = json.loads(done.stdout)["iteration_time_s"]
    assert times["gpipe"] == pytest.approx(times["1f1b"], rel=0.02)
    assert times["interleaved"] < times["1f1b"] and times["zb-h1"] < times["1f1b"]
