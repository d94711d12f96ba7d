"""``engine: core`` against the Python executor: the same scenarios, the same numbers (issue 27).

Each case runs through both engines (each in a fresh process: one SimGrid Engine per process) on the same
compiled platform; iteration ends, every XPU's clocks (compute, memory stall, exposed communication per
kind, idle, waiting for peers, recomputation), link bytes and the count of activities must agree to 1e-9
relative. The core is the engine: these tests need it built and never skip (`make core`).
"""

import dataclasses

import pytest

from hcsim.engine.api import RunOptions
from hcsim.errors import ConfigError
from hcsim.platform.builders import single_switch
from hcsim.run.prepare import compute_model, prepare
from hcsim.run.scenario import Scenario
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import add_comm, add_compute, add_dependency, new_workload
from cases import H100, SECOND, TINY, assert_same, close, pipeline_graph, wait_graph  # tests/engine is on sys.path


def both(platform, workload, **options) -> tuple[dict, dict]:
    runs = [simulate_graphs(platform, workload, RunOptions(engine=engine, **options)) for engine in ("python", "core")]
    return runs[0], runs[1]


def scenario_case(**settings) -> tuple:
    scenario = Scenario(**settings)
    prepared = prepare(scenario)
    options = dict(iterations=settings.get("iterations", 2), coherent=prepared.coherent,
                   collective_model=settings.get("collective_model", "flow"),
                   local_access=settings.get("local_access", "analytic"),
                   local_collectives=settings.get("local_collectives", "simulated"),
                   compute_model=compute_model(scenario, prepared.workload, prepared.platform))
    return prepared.platform, prepared.workload, options


TINY_GPT = {"model.decoders": 4, "model.hidden": 256, "model.heads": 4, "model.ffn": 1024, "model.sequence": 128,
            "model.vocabulary": 1000, "training.precision": "fp16"}
SCENARIOS = {
    # LLaMA2-13B data parallel, decoder vertices, ring all-reduce, spilled and read in place over CXL
    "dp-ring-paper-cxl": dict(platform="paper-cxl", xpus=8, granularity="decoder", iterations=3),
    # the same without coherence: spilled data copied into HBM before each vertex computes (paper Fig. 3b)
    "dp-ring-paper-cxl-copies": dict(platform="paper-cxl", xpus=8, granularity="decoder", iterations=2,
                                     coherent=False, local_access="simulated"),
    # tp 2 x pp 2 x dp 4, 1F1B, on DGX H100, the peak model
    "hybrid-1f1b-dgx-h100": dict(platform="dgx-h100", workload="llama3-8b", xpus=16, tp=2, pp=2, micro_batch=1,
                                 global_batch=16, schedule="1f1b", precision="bf16", recompute="full"),
    # the same with its in-server collectives analytic (one delay each)
    "hybrid-local-analytic": dict(platform="dgx-h100", workload="llama3-8b", xpus=16, tp=2, pp=2, micro_batch=1,
                                  global_batch=16, schedule="1f1b", precision="bf16", recompute="full",
                                  local_collectives="analytic"),
    # ZeRO-2 with its optimizer state offloaded: CPU steps on the shared CPU and moves over PCIe (no coherence),
    # or read in place over CXL beside the step (tests/engine/test_zero_offload.py's runs)
    "offload-cpu": dict(platform="paper-traditional", xpus=8, workload="gpt3-175b", workload_overrides=TINY_GPT,
                        zero=2, offload="cpu", coherent=False, platform_overrides={"server.cpu_flops": "1GFLOPS"}),
    "offload-cxl": dict(platform="paper-cxl", xpus=8, workload="gpt3-175b", workload_overrides=TINY_GPT, zero=2,
                        offload="cxl", coherent=True, platform_overrides={"server.cpu_flops": "1GFLOPS"},
                        collective_model="auto"),
    # the roofline model: kernel times, NCCL's wire bytes below line rate and a latency per call, at flow and step
    "hybrid-roofline": dict(platform="dgx-h100", workload="llama3-8b", xpus=16, tp=2, pp=2, micro_batch=1,
                            global_batch=16, schedule="1f1b", precision="bf16", recompute="full",
                            compute_model="roofline"),
    "hybrid-roofline-step": dict(platform="dgx-h100", workload="llama3-8b", xpus=16, tp=2, pp=2, micro_batch=1,
                                 global_batch=16, schedule="1f1b", precision="bf16", recompute="full",
                                 compute_model="roofline", collective_model="auto"),
    # the step model (collective_model: auto, every group under step_limit): the ring step by step, p2p sends
    # that leave when their sender is ready
    "dp-ring-paper-cxl-step": dict(platform="paper-cxl", xpus=8, granularity="decoder", collective_model="auto"),
    "hybrid-1f1b-dgx-h100-step": dict(platform="dgx-h100", workload="llama3-8b", xpus=16, tp=2, pp=2,
                                      micro_batch=1, global_batch=16, schedule="1f1b", precision="bf16",
                                      recompute="full", collective_model="auto"),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenarios_give_the_python_executors_numbers(name):
    platform, workload, options = scenario_case(**SCENARIOS[name])
    python, core_run = both(platform, workload, **options)
    assert_same(python, core_run)


def rules_graph():
    """test_executor_rules' per-XPU, group and barrier edges (c, r, d, e, f) closed by a back edge."""
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


HAND_BUILT = {"rules": (rules_graph, 3), "p2p": (p2p_graph, 2), "wait": (wait_graph, 2),
              "pp2-tp2-dp2-1f1b": (lambda: pipeline_graph()[1], 8)}


@pytest.mark.parametrize("model", ["flow", "step"])
@pytest.mark.parametrize("name", sorted(HAND_BUILT))
def test_hand_built_graphs_give_the_python_executors_numbers(name, model):
    build, n = HAND_BUILT[name]
    python, core_run = both(single_switch(n, H100), build(), iterations=3, collective_model=model)
    assert_same(python, core_run)


@pytest.mark.parametrize("model", ["flow", "step"])
def test_traces_are_the_python_executors(model):
    """Every XPU of the hand-built pipeline and of the DP ring (reads of spilled data) traced in iteration 2:
    the same vertex runs and transfers at the same times (in the order they ended where the times are
    identical; sorted here, as the pipeline at flow differs by 1e-12 s, enough to swap two ends)."""
    cases = [(single_switch(8, H100), pipeline_graph()[1], dict(iterations=3)),
             scenario_case(platform="paper-cxl", xpus=8, granularity="decoder", iterations=2)]
    for platform, workload, options in cases:
        xpus = frozenset(x for _, data in workload.nodes(data=True) for x in data["xpus"])
        options = {**options, "collective_model": model, "trace_xpus": xpus, "trace_iterations": frozenset({2})}
        python, core_run = both(platform, workload, **options)
        assert_same(python, core_run)
        for key in ("vertices", "transfers"):
            assert len(core_run[key]) == len(python[key]) > 0, key
            for mine, theirs in zip(sorted(core_run[key]), sorted(python[key])):
                assert mine[:-2] == theirs[:-2] and close(mine[-2], theirs[-2]) and close(mine[-1], theirs[-1]), key


@pytest.mark.parametrize("options, named", [
    (dict(collective_model="flow", xpu_sampling="representative"), r"representative XPUs"),
    (dict(collective_model="flow", xpu_sampling="representative", trace_xpus="per-class"), r"representative XPUs .*; traces per class"),
])
def test_what_the_core_lacks_is_refused_by_name(options, named):
    with pytest.raises(ConfigError, match=rf"engine: core does not support yet: {named}"):
        simulate_graphs(single_switch(2, H100), wait_graph(), RunOptions(engine="core", **options))


def test_a_workload_the_core_refuses_runs_on_python_under_auto():
    """A collective whose units are not listed group by group (a graph JSON may list them so) is refused by
    name with engine: core; engine: auto runs it on the Python executor, with the Python executor's numbers."""
    graph = new_workload("interleaved")
    add_compute(graph, "c", xpus=["xpu0", "xpu1", "xpu2", "xpu3"], flops=SECOND, start=True)
    add_comm(graph, "r", groups=[("xpu0", "xpu1"), ("xpu2", "xpu3")], bytes=1e9, collective="all_reduce",
             algorithm="ring")
    graph.nodes["r"]["xpus"] = ("xpu0", "xpu2", "xpu1", "xpu3")
    add_dependency(graph, "c", "r")
    add_dependency(graph, "r", "c", skip_first_iteration=True)
    with pytest.raises(ConfigError, match="engine: core does not support yet: collective vertices whose units"):
        simulate_graphs(single_switch(4, H100), graph, RunOptions(engine="core"))
    auto, python = (simulate_graphs(single_switch(4, H100), graph, RunOptions(engine=engine))
                    for engine in ("auto", "python"))
    assert auto["engine"] == "python"
    assert auto["iteration_ends"] == python["iteration_ends"]


def test_engine_is_a_checked_choice():
    with pytest.raises(ConfigError, match="engine"):
        RunOptions(engine="cpp")
    with pytest.raises(ConfigError, match="engine"):
        dataclasses.replace(Scenario(), engine="fast")
    assert Scenario().engine == "auto" and RunOptions().engine == "auto"


def test_auto_runs_the_core_unless_the_run_uses_what_it_lacks():
    """engine: auto (the default) runs the C++ core where it is built and every XPU is simulated, the Python
    executor for representative XPUs; the result says which ran, and both give the same iteration to 1e-9."""
    from hcsim.engine.api import run_engine

    assert run_engine(RunOptions()) == "core"
    assert run_engine(RunOptions(xpu_sampling="representative")) == "python"
    assert run_engine(RunOptions(engine="python")) == "python"
    graph = wait_graph()
    results = {engine: simulate_graphs(single_switch(2, H100), graph, RunOptions(engine=engine))
               for engine in ("auto", "python")}
    assert results["auto"]["engine"] == run_engine(RunOptions())
    assert results["python"]["engine"] == "python"
    assert results["auto"]["iteration_ends"] == pytest.approx(results["python"]["iteration_ends"], rel=1e-9)


def test_an_instance_across_the_window_start_counts_its_time_inside_the_window():
    """xpu0's vertex takes 2 s (1 s compute beside 2 s of reads: 1 s stall) every iteration, xpu1's 3 s:
    iteration 1 ends at 3 s, in the middle of xpu0's second instance (2 s to 4 s). Inside the window
    (3 s to 6 s) that instance has half its compute and half its stall, then xpu0 waits 2 s; both engines
    (the rule was: counted whole where it ends, compute 1 s and no stall)."""
    from hcsim.platform.builders import single_switch as build

    platform = build(2, H100)
    hbm = next(d["bandwidth"] for _, _, d in platform.edges(data=True) if d.get("kind") == "hbm")
    g = new_workload("window")
    add_compute(g, "a", xpus=["xpu0"], flops=SECOND, memory_bytes=2 * hbm, start=True)
    add_compute(g, "b", xpus=["xpu1"], flops=3 * SECOND, start=True)
    add_dependency(g, "a", "a", skip_first_iteration=True, wait="xpu")
    add_dependency(g, "b", "b", skip_first_iteration=True, wait="xpu")
    python, core_run = both(platform, g, iterations=2, local_access="simulated")
    assert_same(python, core_run)
    assert python["iteration_ends"] == pytest.approx([3.0, 6.0], rel=1e-6)
    times = python["xpu_times"]["xpu0"]
    assert times["compute_s"] == pytest.approx(0.5, rel=1e-6)
    assert times["memory_stall_s"] == pytest.approx(0.5, rel=1e-6)
    assert times["idle_s"] == pytest.approx(2.0, rel=1e-6)
