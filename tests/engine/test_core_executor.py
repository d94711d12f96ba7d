"""The engine (the C++ core) on whole scenarios and hand-built graphs: the numbers the Python executor gave
before its run loop was retired (data/python_executor_results.json), closed forms and the run's invariants.

Each run is in a fresh process (one SimGrid Engine per process). The core is the engine: these tests need it
built and never skip (`make core`).
"""

import json
from pathlib import Path

import pytest

from hcsim.engine.api import RunOptions
from hcsim.errors import HcsimError
from hcsim.platform.builders import single_switch
from hcsim.run.prepare import compute_model, prepare
from hcsim.run.scenario import Scenario
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import add_comm, add_compute, add_dependency, new_workload, validate_workload
from hcsim.workload import ops
from cases import (A, B, H100, SECOND, TINY, check_invariants, pipeline_graph, spans_of,
                   wait_graph)  # tests/engine is on sys.path

RECORDED = json.loads((Path(__file__).parent / "data" / "python_executor_results.json").read_text())["scenarios"]


RECORDED_LINKS = str(Path(__file__).parent / "data" / "recorded-links.yaml")  # the link factors they were recorded on


def scenario_case(**settings) -> tuple:
    scenario = Scenario(**{"compute_factors": RECORDED_LINKS, **settings})
    prepared = prepare(scenario)
    options = dict(iterations=settings.get("iterations", 2), coherent=prepared.coherent,
                   collective_model=settings.get("collective_model", "flow"),
                   local_access=settings.get("local_access", "analytic"),
                   local_collectives=settings.get("local_collectives", "simulated"),
                   compute_model=compute_model(scenario, prepared.workload, prepared.platform))
    return prepared.platform, prepared.workload, options


TINY_GPT = {"model.decoders": 4, "model.hidden": 256, "model.heads": 4, "model.ffn": 1024, "model.sequence": 128,
            "model.vocabulary": 1000, "training.precision": "fp16",
            "training.overlap_param_gather": False}  # ZeRO-2's gather after the step, as when recorded
# each TP rank's pipeline send carries 1/t of the activation, all-gathered on arrival (Megatron-LM's scatter-gather),
# as when recorded
SCATTER_GATHER = {"training.pipeline_scatter_gather": True}
HYBRID = dict(platform="dgx-h100", workload="llama3-8b", workload_overrides=SCATTER_GATHER, xpus=16, tp=2, pp=2,
              micro_batch=1, global_batch=16, schedule="1f1b", precision="bf16", recompute="full")
SCENARIOS = {
    # LLaMA2-13B data parallel, decoder vertices, ring all-reduce, spilled and read in place over CXL
    "dp-ring-paper-cxl": dict(platform="paper-cxl", xpus=8, granularity="decoder", iterations=3),
    # the same without coherence: spilled data copied into HBM before each vertex computes (paper Fig. 3b)
    "dp-ring-paper-cxl-copies": dict(platform="paper-cxl", xpus=8, granularity="decoder", iterations=2,
                                     coherent=False, local_access="simulated"),
    # tp 2 x pp 2 x dp 4, 1F1B, on DGX H100, the peak model
    "hybrid-1f1b-dgx-h100": dict(HYBRID),
    # the same with its in-server collectives analytic (one delay each)
    "hybrid-local-analytic": dict(HYBRID, local_collectives="analytic"),
    # ZeRO-2 with its optimizer state offloaded, read in place over CXL beside the step (test_zero_offload's run;
    # its CPU-offload twin was recorded with the kernel model pricing the CPU's step as GPU kernels at the CPU's
    # speed, a rule both engines shared and since fixed: tests/run/test_coherent_offload.py checks that step)
    "offload-cxl": dict(platform="paper-cxl", xpus=8, workload="gpt3-175b", workload_overrides=TINY_GPT, zero=2,
                        offload="cxl", coherent=True, platform_overrides={"server.cpu_flops": "1GFLOPS"},
                        collective_model="auto"),
    # the roofline model: kernel times, NCCL's wire bytes below line rate and a latency per call, at flow and step
    "hybrid-roofline": dict(HYBRID, compute_model="roofline"),
    "hybrid-roofline-step": dict(HYBRID, compute_model="roofline", collective_model="auto"),
    # the step model (collective_model: auto, every group under step_limit): the ring step by step, p2p sends
    # that leave when their sender is ready
    "dp-ring-paper-cxl-step": dict(platform="paper-cxl", xpus=8, granularity="decoder", collective_model="auto"),
    "hybrid-1f1b-dgx-h100-step": dict(HYBRID, collective_model="auto"),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenarios_give_the_numbers_the_python_executor_gave(name, monkeypatch):
    """Iteration ends, the activity count, link bytes and every XPU's clock parts (compute, memory stall,
    exposed communication per kind, idle, waiting for peers, recomputation) as the Python executor recorded
    them, to 1e-9 (clock parts to 1e-9 of the iteration); and the clock parts add up to the iteration.

    The graphs are built as when recorded: Megatron-LM's optimizer step was then one streaming kernel of 46 B a
    parameter in every 16-bit precision (hcsim.workload.ops.optimizer_ops: since, its unscale is FP16's alone, its
    multi_tensor_apply kernels run at their measured rate, 16-bit main gradients are cast first, the whole
    gradient buffer is zeroed and scaled before its reduction), and its loss one kernel each way, 6 B a logit
    (since, the kernels of ops._vocab_parallel_cross_entropy)."""
    monkeypatch.setattr(ops, "optimizer_ops", lambda parameters, precision, main_gradient, buffer, scaled: (
        ops.Op("optimizer", "memory", 0.0, parameters * (36.0 if precision == "fp32" else 46.0)),))
    monkeypatch.setattr(ops, "_vocab_parallel_cross_entropy", lambda logits, element, fusion: (
        [ops.Op("cross_entropy", "memory", 0.0, logits * (element + 4.0))],
        [ops.Op("cross_entropy.bwd", "memory", 0.0, logits * (4.0 + element))]))
    platform, workload, options = scenario_case(**SCENARIOS[name])
    mine, theirs = simulate_graphs(platform, workload, RunOptions(**options)), RECORDED[name]
    assert mine["iteration_ends"] == pytest.approx(theirs["iteration_ends"], rel=1e-9)
    assert mine["activities"] == theirs["activities"]
    ends = mine["iteration_ends"]
    period = ends[-1] - ends[-2]
    assert mine["xpu_times"].keys() == theirs["xpu_times"].keys()
    for xpu, times in theirs["xpu_times"].items():
        assert {k: mine["xpu_times"][xpu][k] for k in times} == pytest.approx(times, rel=1e-9, abs=1e-9 * period), xpu
        parts = [mine["xpu_times"][xpu][k] for k in ("compute_s", "memory_stall_s", "comm_s", "idle_s")]
        assert sum(parts) == pytest.approx(period, rel=1e-9), xpu
    link_bytes = {f"{u} -> {v}": size for (u, v), size in mine["link_bytes"].items()}
    assert link_bytes == pytest.approx(theirs["link_bytes"], rel=1e-9)


def rules_graph():
    """test_executor_rules' per-XPU, group and barrier edges (c, r, d, e, f) closed by back edges (wait all)."""
    g = new_workload("rules")
    add_compute(g, "a", xpus=["xpu0"], flops=SECOND, start=True)
    add_compute(g, "a2", xpus=["xpu1"], flops=2 * SECOND, start=True)
    add_compute(g, "c", xpus=["xpu0", "xpu1"], flops=SECOND)
    add_comm(g, "r", groups=[["xpu0", "xpu1"]], bytes=TINY, collective="all_reduce", algorithm="ring")
    add_compute(g, "d", xpus=["xpu0"], flops=SECOND)
    add_compute(g, "e", xpus=["xpu1"], flops=SECOND)
    add_compute(g, "f", xpus=["xpu2"], flops=SECOND)
    for before, after, wait in (("a", "c", "xpu"), ("a2", "c", "xpu"), ("c", "r", "xpu"), ("r", "d", "xpu"),
                                ("r", "e", "group"), ("c", "f", "all")):
        add_dependency(g, before, after, wait=wait)
    for vertex in ("d", "e", "f"):
        add_dependency(g, vertex, "a" if vertex == "d" else "a2", skip_first_iteration=True, wait="all")
    return g


def p2p_graph():
    g = new_workload("p2p")
    add_compute(g, "send", xpus=["xpu0"], flops=SECOND, start=True)
    add_comm(g, "act", pairs=[("xpu0", "xpu1")], bytes=1e9, collective="p2p")
    add_compute(g, "recv", xpus=["xpu1"], flops=SECOND)
    add_dependency(g, "send", "act", wait="group")
    add_dependency(g, "act", "recv")
    add_dependency(g, "recv", "send", skip_first_iteration=True, wait="all")
    return g


def ring(n, size):
    return 2 * (n - 1) * A + 2 * (n - 1) / n * size / B


# (graph, XPUs, period): rules: c ends at 3 on xpu1, the tiny ring, d and e 1 s, then a and a2 wait for them;
# p2p: 1 s, one transfer alone on its route, 1 s; wait: 3 s on xpu0 then both ranks at the ring's closed form
HAND_BUILT = {"rules": (rules_graph, 3, 4 + ring(2, TINY)), "p2p": (p2p_graph, 2, 2 + A + 1e9 / B),
              "wait": (wait_graph, 2, 3 + ring(2, 1e9))}


@pytest.mark.parametrize("model", ["flow", "step"])
@pytest.mark.parametrize("name", sorted(HAND_BUILT))
def test_hand_built_graphs_take_their_closed_forms(name, model):
    build, n, period = HAND_BUILT[name]
    graph = build()
    xpus = frozenset(f"xpu{i}" for i in range(n))
    result = simulate_graphs(single_switch(n, H100), graph,
                             RunOptions(iterations=3, collective_model=model, trace_xpus=xpus))
    assert result["iteration_ends"] == pytest.approx([period, 2 * period, 3 * period], rel=1e-12)
    check_invariants(graph, result, 3)


@pytest.mark.parametrize("model", ["flow", "step"])
def test_a_trace_holds_the_traced_iteration_and_every_byte_its_xpus_send(model):
    """Every XPU of the hand-built pipeline traced in iteration 2 of 3: each unit's run 2 once, nothing of the
    other iterations; the bytes each XPU sends in iteration 2 are a third of its uplink's bytes over the run
    (every unit runs every iteration), and no transfer beats α + size / B."""
    graph = pipeline_graph()[1]
    xpus = frozenset(x for _, data in graph.nodes(data=True) for x in data["xpus"])
    result = simulate_graphs(single_switch(8, H100), graph,
                             RunOptions(iterations=3, collective_model=model, trace_xpus=xpus,
                                        trace_iterations=frozenset({2})))
    spans = spans_of(result)
    assert {k for k, _, _ in spans} == {2}
    assert len(spans) == len(result["vertices"]) == sum(len(d["xpus"]) for _, d in graph.nodes(data=True))
    sent = dict.fromkeys(xpus, 0.0)
    assert result["transfers"]
    for run, src, dst, _, size, start, end in result["transfers"]:
        assert run == 2
        sent[src] += size
        assert end - start >= A + size / B - 1e-12 * end, (src, dst, size, start, end)  # to the clock's precision
    assert sent == pytest.approx({x: result["link_bytes"][x, "xswitch"] / 3 for x in xpus}, rel=1e-12)


def test_a_collective_whose_units_are_not_listed_group_by_group_is_refused_before_the_run():
    """A graph JSON may list a collective's units in any order; the engine needs them group by group."""
    graph = new_workload("interleaved")
    add_compute(graph, "c", xpus=["xpu0", "xpu1", "xpu2", "xpu3"], flops=SECOND, start=True)
    add_comm(graph, "r", groups=[("xpu0", "xpu1"), ("xpu2", "xpu3")], bytes=1e9, collective="all_reduce",
             algorithm="ring")
    graph.nodes["r"]["xpus"] = ("xpu0", "xpu2", "xpu1", "xpu3")
    add_dependency(graph, "c", "r")
    add_dependency(graph, "r", "c", skip_first_iteration=True)
    with pytest.raises(HcsimError, match="groups' members in group order"):
        validate_workload(graph)


def test_an_instance_across_the_window_start_counts_its_time_inside_the_window():
    """xpu0's vertex takes d = 100 ns + 2 s (1 s compute beside 2 s of reads: the rest a stall) every
    iteration, xpu1's 3 s: iteration 1 ends at 3 s, in the middle of xpu0's second instance (d to 2d).
    Inside the window (3 s to 6 s) that instance counts the share (2d - 3) / d of its compute and of its
    stall, then xpu0 waits 6 - 2d (the rule was: counted whole where it ends, compute 1 s and no stall)."""
    platform = single_switch(2, H100)
    hbm = next(d["bandwidth"] for _, _, d in platform.edges(data=True) if d.get("kind") == "hbm")
    g = new_workload("window")
    add_compute(g, "a", xpus=["xpu0"], flops=SECOND, memory_bytes=2 * hbm, start=True)
    add_compute(g, "b", xpus=["xpu1"], flops=3 * SECOND, start=True)
    add_dependency(g, "a", "a", skip_first_iteration=True, wait="xpu")
    add_dependency(g, "b", "b", skip_first_iteration=True, wait="xpu")
    result = simulate_graphs(platform, g, RunOptions(iterations=2, local_access="simulated"))
    assert result["iteration_ends"] == pytest.approx([3.0, 6.0], rel=1e-12)
    d = 100e-9 + 2.0  # single_switch's HBM latency + 2 s of reads
    share = (2 * d - 3) / d
    times = result["xpu_times"]["xpu0"]
    assert times["compute_s"] == pytest.approx(share * 1.0, rel=1e-9)
    assert times["memory_stall_s"] == pytest.approx(share * (d - 1), rel=1e-9)
    assert times["idle_s"] == pytest.approx(6 - 2 * d, rel=1e-9)
