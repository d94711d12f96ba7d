"""Schedules built once and shared: the flow phases and pairs of the streaming path equal those of the step schedule.

Table algorithms (collectives.py ``_Table``) compute their pairs while checking the group, and their
flow phases from a replay of ``build()`` that merges steps as they stream in, without the step
table; :meth:`Algorithm.flow_phases` and :meth:`Algorithm.flows` are the reference: they read the
step table. The phases must be equal object for object (same pairs, bytes, step counts, lanes), so
a simulation at flow fidelity is the same before and after.
"""

import math

import pytest

from hcsim.engine import collectives
from hcsim.engine.collectives import Algorithm, algorithms, get_algorithm
from hcsim.engine.api import RunOptions
from hcsim.platform.builders import single_switch
from hcsim.platform.devices import builtin_catalog
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import add_comm, add_compute, add_dependency, new_workload

TABLES = [(c, name) for c, names in algorithms().items() for name in names
          if issubclass(collectives._REGISTRY[c, name], collectives._Table)]


def _cases(collective, name):
    """(ranks, groups) to try: one server, and servers of 2, 4 and 8 where the group divides."""
    sizes = (2, 4, 8, 16, 32) if name == "halving_doubling" else (2, 3, 8, 12, 16, 24)
    for n in sizes:
        yield n, None
        for g in (2, 4, 8):
            if n % g == 0 and n > g:
                yield n, [list(range(i, i + g)) for i in range(0, n, g)]


@pytest.mark.parametrize("collective,name", TABLES)
def test_streamed_phases_and_pairs_equal_the_step_schedule(collective, name):
    for n, groups in _cases(collective, name):
        for size in (0.0, 1e6, 6.34e8 / 3):
            cls = collectives._REGISTRY[collective, name]
            fresh = cls(n, size, groups)
            streamed = collectives._Table.flow_phases(fresh)  # the streaming path (before any step table)
            assert fresh._table is None, "the flow phases built the step table"
            pairs = fresh.pairs()
            reference = cls(n, size, groups)
            assert streamed == Algorithm.flow_phases(reference), f"{collective}.{name} n={n} groups={groups} S={size}"
            assert pairs == set(Algorithm.flows(reference))


def test_out_of_order_builds_fall_back_to_collecting_every_step():
    """The double binary tree sends to steps out of order (node by node): the fallback merges the same phases."""
    for n in (3, 7, 8, 16):
        tree = get_algorithm("all_reduce", "double_binary_tree", n, 1e8)
        assert collectives._Table.flow_phases(tree) == Algorithm.flow_phases(tree)


def test_algorithms_are_shared_per_collective_algorithm_group_and_size():
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    first = get_algorithm("all_reduce", "hierarchical", 8, 6.34e8, groups)
    assert get_algorithm("all_reduce", "hierarchical", 8, 6.34e8, [tuple(g) for g in groups]) is first
    assert get_algorithm("all_reduce", "hierarchical", 8, 6.34e8 + 1, groups) is not first
    assert get_algorithm("all_reduce", "hierarchical", 8, 6.34e8) is not first  # one server: another schedule
    assert get_algorithm("all_reduce", "ring", 8, 6.34e8, groups) is not first


def test_flow_fidelity_never_builds_the_step_table():
    algorithm = get_algorithm("all_reduce", "hierarchical", 64, 1e9, [list(range(i, i + 8)) for i in range(0, 64, 8)])
    algorithm.pairs()
    phases = algorithm.flow_phases()
    assert algorithm._table is None
    assert [p.steps for p in phases] == [7, 14, 7]  # reduce-scatter in servers, across them, all-gather
    assert algorithm.flow_phases() == phases


def test_a_shared_algorithm_gives_every_vertex_the_same_time():
    """Forty identical all-reduces in sequence (one algorithm instance) each take the closed form."""
    n, g, size, bandwidth, alpha = 8, 4, 1e8, 900e9, 2 * 100e-9
    platform = single_switch(n, builtin_catalog()["H100"])
    for i in range(n):
        platform.nodes[f"xpu{i}"]["server"] = f"s{i // g}"
    graph = new_workload("chain")
    group = [f"xpu{i}" for i in range(n)]
    previous = add_compute(graph, "c0", xpus=group, flops=0.0, start=True)
    for layer in range(1, 41):
        add_comm(graph, f"ar{layer}", xpus=group, bytes=size, collective="all_reduce", algorithm="hierarchical")
        add_dependency(graph, previous, f"ar{layer}")
        previous = f"ar{layer}"
    result = simulate_graphs(platform, graph, RunOptions(collective_model="flow"))
    m = n // g
    one = 2 * (g - 1) * alpha + 2 * (g - 1) / g * size / bandwidth + 2 * (m - 1) * alpha + 2 * (m - 1) / (m * g) * size / bandwidth
    assert math.isclose(result["iteration_ends"][-1], 40 * one, rel_tol=1e-6)
