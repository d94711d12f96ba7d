"""``engine: core`` on hypothesis-generated workload graphs (issue 29): for every graph, valid or not, the core
gives the Python executor's numbers or the same clear error, and never takes the process down.

Graphs: 2 to 5 vertices on 2 to 4 XPUs of one switch, computes of random lengths on random XPUs, all-reduces
(every registered algorithm) and p2p sends of random sizes, forward edges of random wait rules and a back edge
that closes the iteration; some edges and back edges break the graph contract on purpose.
"""

import os

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from hcsim.engine.collectives import algorithms
from hcsim.engine.api import RunOptions
from hcsim.errors import HcsimError
from hcsim.platform.builders import single_switch
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import add_comm, add_compute, add_dependency, new_workload
from cases import H100, SECOND, assert_same  # tests/engine is on sys.path

ALGORITHMS = tuple(algorithms()["all_reduce"])


@st.composite
def graphs(draw):
    n = draw(st.integers(2, 4))
    xpus = [f"xpu{i}" for i in range(n)]
    some = st.lists(st.sampled_from(xpus), min_size=1, max_size=n, unique=True)
    g = new_workload("fuzz")
    names = []
    for i in range(draw(st.integers(2, 5))):
        name, start = f"v{i}", i == 0
        kind = draw(st.sampled_from(("compute", "compute", "all_reduce", "p2p")))
        if kind == "compute":
            add_compute(g, name, xpus=sorted(draw(some)), flops=SECOND * draw(st.integers(1, 8)) / 4, start=start)
        elif kind == "all_reduce":
            group = sorted(draw(st.lists(st.sampled_from(xpus), min_size=2, max_size=n, unique=True)))
            add_comm(g, name, xpus=group, bytes=float(draw(st.sampled_from((8, 1e6, 1e9)))), collective="all_reduce",
                     algorithm=draw(st.sampled_from(ALGORITHMS)), start=start)
        else:
            pair = tuple(draw(st.lists(st.sampled_from(xpus), min_size=2, max_size=2, unique=True)))
            add_comm(g, name, pairs=[pair], bytes=float(draw(st.sampled_from((8, 1e8)))), collective="p2p",
                     start=start)
        if i:
            for before in draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True)):
                add_dependency(g, before, name, wait=draw(st.sampled_from(("xpu", "group", "all"))))
        names.append(name)
    # the back edge closes the iteration; without skip_first_iteration it makes a cycle the contract refuses
    add_dependency(g, names[-1], names[0], wait=draw(st.sampled_from(("xpu", "group", "all"))),
                   skip_first_iteration=draw(st.sampled_from((True, True, True, False))))
    return n, g


def outcome(n, graph, engine, model):
    """The run's result, or the error it raised (its class and message)."""
    try:
        return simulate_graphs(single_switch(n, H100), graph,
                               RunOptions(engine=engine, iterations=3, collective_model=model))
    except HcsimError as err:
        return type(err), str(err)


# derandomized: CI runs the same graphs every time (HCSIM_FUZZ_EXAMPLES=300 passes; randomized runs found the xfail below)
@settings(max_examples=int(os.environ.get("HCSIM_FUZZ_EXAMPLES", 40)), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=graphs(), model=st.sampled_from(("flow", "step")))
def test_random_graphs_give_the_python_executors_numbers_or_its_error(case, model):
    n, graph = case
    note(f"vertices {dict(graph.nodes(data=True))}; edges {list(graph.edges(data=True))}")
    python = outcome(n, graph, "python", model)
    core_run = outcome(n, graph, "core", model)
    event("refused" if isinstance(python, tuple) else "ran")
    if isinstance(python, tuple):
        assert core_run == python  # the same clean error, raised before either engine runs
    else:
        assert not isinstance(core_run, tuple), core_run
        assert_same(python, core_run)


@pytest.mark.xfail(strict=True, reason="found by the fuzzer, not yet explained: an 8-byte coherent_ring between p2p "
                                       "sends ends 2.2e-12 s later per iteration in the core (exact at 1 MB and 1 GB)")
def test_a_tiny_coherent_ring_beside_p2p_sends():
    g = new_workload("tiny-coherent-ring")
    add_comm(g, "v0", pairs=[("xpu1", "xpu2")], bytes=1e8, collective="p2p", start=True)
    add_comm(g, "v1", xpus=["xpu0", "xpu1"], bytes=8.0, collective="all_reduce", algorithm="coherent_ring")
    add_comm(g, "v2", pairs=[("xpu0", "xpu3")], bytes=1e8, collective="p2p")
    add_dependency(g, "v0", "v1", wait="group")
    add_dependency(g, "v1", "v2", wait="group")
    add_dependency(g, "v2", "v0", wait="group", skip_first_iteration=True)
    python, core_run = (outcome(4, g, engine, "flow") for engine in ("python", "core"))
    assert_same(python, core_run)
