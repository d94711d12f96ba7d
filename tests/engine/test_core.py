"""The C++ engine core (hcsim/engine/core): it is built, loads without LD_LIBRARY_PATH, refuses a second SimGrid
Engine in one process with an error and a transfer the compiled platform has no route for with another, and
runs executions that share an XPU and transfers that share a link at their closed forms.

Every run is in a fresh process (one SimGrid Engine per process, ever). The core is the engine: where it is
not built these tests fail, never skip (`make core` builds it and says what is missing).
"""

import math
import subprocess
import sys
from pathlib import Path

from hcsim.engine import core
from hcsim.engine.api import RunOptions
from hcsim.platform import build_platform, compile_platform, load_platform_spec
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


def test_executions_sharing_an_xpu_and_transfers_sharing_a_link_take_their_closed_forms():
    """On paper-cxl's first two servers: d1 (1e12 FLOPs) and d2 (2e12) start together on xpu3 and share it, each
    at half its FLOP/s S until d1 ends at 2e12 / S, then d2 alone: it ends at 3e12 / S (the core times an
    execution alone without SimGrid's CPU model and hands it to the model when a second starts beside it). a and
    b, alone on xpu0 and xpu1, end at their FLOPs / S; then pa and pb send 4 GB each to xpu8 over routes that
    share the link into it: each takes longer than alone, and both together no less than 8 GB at the shared
    link's bandwidth."""
    platform = build_platform(load_platform_spec("paper-cxl"), 16)
    graph = new_workload("shared")
    for name, xpu, flops in (("a", "xpu0", 1.0e12), ("b", "xpu1", 1.2e12), ("d1", "xpu3", 1.0e12),
                             ("d2", "xpu3", 2.0e12)):
        add_compute(graph, name, xpus=[xpu], flops=flops, start=True)
    add_comm(graph, "pa", pairs=[("xpu0", "xpu8")], bytes=4e9, collective="p2p")
    add_comm(graph, "pb", pairs=[("xpu1", "xpu8")], bytes=4e9, collective="p2p")
    add_dependency(graph, "a", "pa", wait="group")
    add_dependency(graph, "b", "pb", wait="group")
    result = simulate_graphs(platform, graph, RunOptions(collective_model="step",
                                                         trace_xpus=frozenset({"xpu0", "xpu1", "xpu3"})))
    compute = {name: (start, end) for _, _, name, kind, start, end in result["vertices"] if kind == "compute"}
    transfers = {label: (start, end) for _, _, _, label, _, start, end in result["transfers"]}
    speed = peak_flops(platform.nodes["xpu3"], "fp32")
    assert same(compute["d1"][1], 2.0e12 / speed) and same(compute["d2"][1], 3.0e12 / speed)
    assert same(compute["a"][1], 1.0e12 / speed) and same(compute["b"][1], 1.2e12 / speed)
    routes = compile_platform(platform, host_pairs(platform, graph)).routes
    shared = set(zip(routes["xpu0", "xpu8"], routes["xpu0", "xpu8"][1:])) & set(
        zip(routes["xpu1", "xpu8"], routes["xpu1", "xpu8"][1:]))
    assert shared  # the test's premise: the two routes meet
    for name, src, begin in (("pa", "xpu0", compute["a"][1]), ("pb", "xpu1", compute["b"][1])):
        route = routes[src, "xpu8"]
        assert same(transfers[name][0], begin)
        assert transfers[name][1] - begin > route_latency(platform, route) + 4e9 / route_bandwidth(platform, route)
    narrowest = min(platform.edges[e]["bandwidth"] for e in shared)
    assert max(transfers["pa"][1], transfers["pb"][1]) - compute["a"][1] >= 8e9 / narrowest * (1 - 1e-9)


def in_a_fresh_process(script: str) -> str:
    """`script` run by a fresh interpreter (its own SimGrid Engine); what it printed."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


ONE_SWITCH = ("from hcsim.engine.api import RunOptions, run\nfrom hcsim.errors import SimulationError\n"
              "from hcsim.platform.builders import single_switch\nfrom hcsim.platform.devices import builtin_catalog\n"
              "from hcsim.workload import add_comm, add_compute, new_workload\n"
              "p = single_switch(2, builtin_catalog()['H100'])\n")


def test_a_transfer_the_compiled_platform_has_no_route_for_is_an_error_not_a_dead_caller():
    """hcsim's runs ask only for the pairs they compiled; a run given fewer pairs than its transfers take gets one
    clear SimulationError naming the pair, from the core's route table, and its process lives on."""
    out = in_a_fresh_process(ONE_SWITCH + "g = new_workload('send')\n"
                             "add_comm(g, 's', pairs=[('xpu1', 'xpu0')], bytes=1e6, collective='p2p', start=True)\n"
                             "try:\n    run(p, g, RunOptions(), pairs=[('xpu0', 'xpu1')])\n"
                             "except SimulationError as e:\n    print('refused:', e)\n")
    assert "refused:" in out and "no route from xpu1 to xpu0" in out


def test_a_second_engine_in_one_process_is_an_error_not_an_abort():
    out = in_a_fresh_process(ONE_SWITCH + "g = new_workload('one')\n"
                             "add_compute(g, 'v', xpus=['xpu0'], flops=1e9, start=True)\n"
                             "run(p, g, RunOptions())\n"
                             "try:\n    run(p, g, RunOptions())\nexcept SimulationError as e:\n    print('refused:', e)\n")
    assert "refused: engine core: a SimGrid Engine already exists in this process" in out


def test_the_extension_is_found_without_ld_library_path():
    done = subprocess.run([sys.executable, "-c", "import hcsim.engine.core as c; print(c.load().simgrid_version())"],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert done.returncode == 0 and done.stdout.strip() == "(4, 1, 0)", done.stderr[-2000:]
