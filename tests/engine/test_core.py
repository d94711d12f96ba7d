"""The C++ engine core (hcsim/engine/core, issue 27's first step): its activity drivers against the engine's
workload executor and closed forms.

The same activities as a plain activity graph (s4u::Exec / s4u::Comm, `core.run_activities`) and as a workload
run through the engine's front door (the executor's rules in the core) on the same compiled platform must take
the same times.
Every run is in a fresh process (one SimGrid Engine per process, ever). The core is the engine: where it is
not built these tests fail, never skip (`make core` builds it and says what is missing).
"""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from hcsim.engine import core
from hcsim.engine.api import RunOptions
from hcsim.errors import ConfigError, SimulationError
from hcsim.platform import build_platform, compile_platform, load_platform_spec
from hcsim.platform.builders import single_switch
from hcsim.platform.devices import builtin_catalog, peak_flops
from hcsim.platform.routes import route_bandwidth, route_latency
from hcsim.engine.api import host_pairs
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import add_comm, add_compute, add_dependency, new_workload

H100 = builtin_catalog()["H100"]


def test_the_core_is_built():
    assert core.available(), f"the C++ engine core is not built: {core.unavailable_reason()} (run: make core)"


def same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


# Activities as (name, kind, hosts, amount, predecessors): the core's graph and the executor's workload
# are both built from this list, on paper-cxl's first two servers (16 XPUs): transfers cross the server
# boundary and share a link (pa, pb), executions share an XPU (d1, d2).
ACTIVITIES = [
    ("a", "exec", ("xpu0",), 1.0e12, ()),
    ("b", "exec", ("xpu1",), 1.2e12, ()),
    ("d1", "exec", ("xpu3",), 1.0e12, ()),  # d1 and d2 share xpu3
    ("d2", "exec", ("xpu3",), 2.0e12, ()),
    ("pa", "comm", ("xpu0", "xpu8"), 4e9, ("a",)),  # pa and pb overlap on the way into xpu8
    ("pb", "comm", ("xpu1", "xpu8"), 4e9, ("b",)),
    ("c", "exec", ("xpu8",), 1.0e12, ("pa", "pb")),
    ("pc", "comm", ("xpu8", "xpu3"), 1e9, ("c", "d2")),
    ("pd", "comm", ("xpu3", "xpu1"), 3e8, ("d1",)),
    ("e", "exec", ("xpu3",), 5.0e11, ("pc",)),
    ("f", "exec", ("xpu1",), 3.0e11, ("pd",)),
]


def executor_workload():
    """ACTIVITIES as a workload graph: compute vertices without memory traffic, p2p vertices."""
    graph = new_workload("core-comparison")
    for name, kind, hosts, amount, preds in ACTIVITIES:
        if kind == "exec":
            add_compute(graph, name, xpus=hosts, flops=amount, start=not preds)
        else:
            add_comm(graph, name, pairs=[hosts], bytes=amount, collective="p2p", start=not preds)
        for pred in preds:
            # a transfer starts when its sender is ready ("group"); an execution after its own XPU's unit
            add_dependency(graph, pred, name, wait="group" if kind == "comm" else "xpu")
    return graph


def core_graph(hosts):
    builder = core.GraphBuilder(hosts)
    number = {}
    for name, kind, where, amount, preds in ACTIVITIES:
        after = [number[p] for p in preds]
        number[name] = (builder.exec(where[0], amount, after) if kind == "exec"
                        else builder.comm(where[0], where[1], amount, after))
    return builder.build()


def test_an_activity_graph_takes_the_times_of_the_same_workload_run(tmp_path):
    platform = build_platform(load_platform_spec("paper-cxl"), 16)
    workload = executor_workload()
    compiled = compile_platform(platform, host_pairs(platform, workload))
    hosts = sorted({h for _, _, where, *_ in ACTIVITIES for h in where})
    ours = core.run_activities(compiled, core_graph(hosts))

    theirs = simulate_graphs(platform, workload,
                             RunOptions(collective_model="step", trace_xpus=frozenset(hosts)))
    compute = {name: (start, end) for _, _, name, kind, start, end in theirs["vertices"] if kind == "compute"}
    transfers = {label: (start, end) for _, _, _, label, _, start, end in theirs["transfers"]}
    for i, (name, kind, *_rest) in enumerate(ACTIVITIES):
        expected = compute[name] if kind == "exec" else transfers[name]
        assert same(ours.start[i], expected[0]) and same(ours.end[i], expected[1]), \
            (name, (ours.start[i], ours.end[i]), expected)
    assert same(ours.simulated_s, theirs["iteration_ends"][0])
    assert ours.activities == len(ACTIVITIES)
    # the run was not trivial: d1 and d2 shared xpu3, pa and pb the CXL link into xpu8
    speed = peak_flops(platform.nodes["xpu3"], "fp32")
    assert ours.end[2] > 1.5 * 1.0e12 / speed
    route = compiled.routes["xpu0", "xpu8"]
    assert ours.end[4] - ours.start[4] > 1.5 * (route_latency(platform, route) + 4e9 / route_bandwidth(platform, route))


def test_closed_forms_and_both_drivers(tmp_path):
    """An execution alone takes FLOPs / FLOP/s, a transfer alone latency + size / bandwidth (XPU link
    900 GB/s, 100 ns each way through the switch); the actor driver gives the callback driver's times."""
    hosts = [f"xpu{i}" for i in range(4)]
    compiled = compile_platform(single_switch(4, H100), {(h, g) for h in hosts for g in hosts})
    builder = core.GraphBuilder(hosts)
    for i, host in enumerate(hosts):  # four chains: exec, comm to the ring neighbour, exec
        first = builder.exec(host, 1e12 * (i + 1))
        send = builder.comm(host, hosts[(i + 1) % 4], 9e8, [first])
        builder.exec(host, 1e12, [send])
    graph = builder.build()
    results = {driver: core.run_activities(compiled, graph, driver) for driver in core.DRIVERS}
    callbacks = results["callbacks"]
    assert same(callbacks.end[0], 1e12 / H100.fp32_flops)
    assert same(callbacks.end[1] - callbacks.start[1], 2 * 100e-9 + 9e8 / 900e9)
    for a, b in zip(callbacks.end, results["actors"].end):
        assert same(a, b)


def test_bad_graphs_are_refused_with_the_activity_named():
    from array import array

    cycle = core.ActivityGraph(hosts=("xpu0",), kind=array("B", [0, 0, 0]), host=array("i", [0, 0, 0]),
                               peer=array("i", [-1, -1, -1]), amount=array("d", [1.0, 1.0, 1.0]),
                               pred_offsets=array("q", [0, 0, 1, 2]), preds=array("i", [2, 1]))  # 1 <-> 2
    platform = compile_platform(single_switch(2, H100), {("xpu0", "xpu1")})
    with pytest.raises(ConfigError, match=r"cycle: 2 activities can never start, activity 1 \(exec\)"):
        core.run_activities(platform, cycle)
    builder = core.GraphBuilder(["xpu0", "xpu1"])
    builder.comm("xpu0", "xpu1", -5.0)
    with pytest.raises(ConfigError, match=r"activity 0 \(comm\): amount must be finite and >= 0, got -5"):
        core.run_activities(platform, builder.build())
    with pytest.raises(ConfigError, match="not one of the 2 hosts"):
        core.GraphBuilder(["xpu0", "xpu1"]).exec("xpu7", 1.0)
    with pytest.raises(ConfigError, match="driver must be one of"):
        core.run_here(platform, builder.build(), "threads")


def test_a_transfer_the_compiled_platform_has_no_route_for_is_an_error_not_a_dead_caller():
    """hcsim's runs only ask for the pairs they compiled (run_workload's transfers come from the compiled
    routes); a raw activity graph that asks for another pair gets one clear SimulationError naming it, from
    the core's route table, and the caller's process lives on."""
    platform = compile_platform(build_platform(load_platform_spec("paper-cxl"), 16), [("xpu0", "xpu1")])
    builder = core.GraphBuilder(["xpu0", "xpu8"])
    builder.comm("xpu0", "xpu8", 1e6)
    with pytest.raises(SimulationError, match="no route from xpu0 to xpu8"):
        core.run_activities(platform, builder.build())


def test_a_second_engine_in_one_process_is_an_error_not_an_abort():
    script = ("from hcsim.engine import core\nfrom hcsim.errors import SimulationError\n"
              "from hcsim.platform import compile_platform\nfrom hcsim.platform.builders import single_switch\n"
              "from hcsim.platform.devices import builtin_catalog\n"
              "p = compile_platform(single_switch(2, builtin_catalog()['H100']), {('xpu0', 'xpu1')})\n"
              "b = core.GraphBuilder(['xpu0']); b.exec('xpu0', 1e9); g = b.build()\n"
              "core.run_here(p, g)\n"
              "try:\n    core.run_here(p, g)\nexcept SimulationError as e:\n    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: engine core: a SimGrid Engine already exists in this process" in done.stdout


def test_the_extension_is_found_without_ld_library_path():
    done = subprocess.run([sys.executable, "-c", "import hcsim.engine.core as c; print(c.load().simgrid_version())"],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert done.returncode == 0 and done.stdout.strip() == "(4, 1, 0)", done.stderr[-2000:]
