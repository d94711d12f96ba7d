"""ZeRO-1's parameter all-gather beside the next forward pass (Megatron-LM's --overlap-param-gather), run: it hides
communication the exposed gather after the optimizer step pays (tests/workload/test_zero.py checks both move the
same bytes)."""

from hcsim.run.scenario import load_scenario
from hcsim.run.simulation import simulate

BASE = ["workload=llama3-8b", "platform=dgx-h100", "xpus=16", "tp=2", "pp=2", "global_batch=16", "zero=1",
        "iterations=2"]


def test_overlapped_gathers_hide_what_the_gather_after_the_step_exposes():
    overlapped, exposed = (simulate(load_scenario(None, BASE + [
        f"workload_overrides={{training.overlap_param_gather: {flag}}}"])) for flag in ("true", "false"))
    dp = {name: r["breakdown"]["H100"]["comm_dp_s"] for name, r in (("overlapped", overlapped), ("exposed", exposed))}
    assert dp["overlapped"] < dp["exposed"]
    assert overlapped["iteration_time_s"] < exposed["iteration_time_s"]


def test_gradient_buckets_reduced_during_the_backward_pass_hide_what_one_reduction_after_it_exposes():
    """Megatron-LM's --overlap-grad-reduce (on by default beside the overlapped gathers): the last micro-batch's
    backward pass hides every gradient bucket's reduce-scatter but what runs past it."""
    overlapped, after = (simulate(load_scenario(None, BASE + [
        f"workload_overrides={{training.overlap_grad_reduce: {flag}}}"])) for flag in ("true", "false"))
    dp = {name: r["breakdown"]["H100"]["comm_dp_s"] for name, r in (("overlapped", overlapped), ("after", after))}
    assert dp["overlapped"] < dp["after"]
    assert overlapped["iteration_time_s"] < after["iteration_time_s"]
