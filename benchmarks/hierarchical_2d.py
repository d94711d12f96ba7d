"""The 2-D data-parallel case: servers of 8 XPUs on a switch, rings across servers,
40 layers with fixed compute and a 634 MB ``hierarchical`` all-reduce each.

As ASTRA-sim 2.0's analytical backend describes a [Switch, Ring] network: inside a
server, 8 H100 on one XPU switch (Table 5 XPU_link, 900 GB/s, 100 ns); across
servers, XPU ``l`` of server ``j`` has a direct link (100 GB/s, 500 ns) to XPU
``l`` of server ``j + 1 mod m``: eight rings of m XPUs. XPUs forward
(``transit``), as in a direct-connect topology.

The workload is a backward pass without memory traffic: layer 40 down to 1,
each a compute vertex of fixed duration on every XPU (FLOPs = duration x the
H100's FP32 FLOP/s) followed by the 634 MB all-reduce of its gradients, which
overlaps the next layer's computation. One iteration.

    .venv/bin/python benchmarks/hierarchical_2d.py --xpus 64 256 1024     # each point in a fresh process
    .venv/bin/python benchmarks/hierarchical_2d.py --xpus 256 --profile /tmp/h2d.prof   # cProfile the point
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SERVER_XPUS = 8
LAYERS = 40
GRADIENT_BYTES = 634e6
LAYER_TIME_S = 10e-3
INTRA = (900e9, 100e-9)  # B/s, s: XPU to the server's switch
ACROSS = (100e9, 500e-9)  # B/s, s: XPU to the same XPU of the next server


def build_platform(xpus: int):
    """The [Switch, Ring] platform graph of `xpus` H100 (a multiple of 8)."""
    import networkx as nx

    from hcsim.platform.devices import builtin_catalog
    from hcsim.platform.topology import add_link, add_xpu, validate_topology

    if xpus % SERVER_XPUS:
        raise SystemExit(f"--xpus: {xpus} is not a multiple of {SERVER_XPUS}")
    catalog = builtin_catalog()
    servers = xpus // SERVER_XPUS
    graph = nx.Graph(name=f"switch{SERVER_XPUS}-ring{servers}", coherent=False)
    for s in range(servers):
        switch = f"s{s}.xsw"
        graph.add_node(switch, kind="switch", role="xpu", rack=0, server=f"s{s}")
        for local in range(SERVER_XPUS):
            name = f"xpu{s * SERVER_XPUS + local}"
            add_xpu(graph, name, catalog["H100"], hbm_latency=100e-9, rack=0, server=f"s{s}", transit=True)
            add_link(graph, name, switch, bandwidth=INTRA[0], latency=INTRA[1], kind="xpu_link")
    if servers > 1:
        for s in range(servers if servers > 2 else 1):
            for local in range(SERVER_XPUS):
                u = f"xpu{s * SERVER_XPUS + local}"
                v = f"xpu{(s + 1) % servers * SERVER_XPUS + local}"
                add_link(graph, u, v, bandwidth=ACROSS[0], latency=ACROSS[1], kind="eth")
    validate_topology(graph, catalog)
    return graph


def build_workload(xpus: list[str], speed: float):
    """Layers 40..1, each a compute vertex then its hierarchical all-reduce (one iteration)."""
    from hcsim.workload import add_comm, add_compute, add_dependency, new_workload

    graph = new_workload(f"2d-{len(xpus)}")
    group = tuple(xpus)
    previous = None
    for layer in range(LAYERS, 0, -1):
        compute = add_compute(graph, f"layer{layer}.bwd", xpus=group, flops=LAYER_TIME_S * speed,
                              start=previous is None)
        reduce = add_comm(graph, f"layer{layer}.allreduce", xpus=group, bytes=GRADIENT_BYTES,
                          collective="all_reduce", algorithm="hierarchical")
        add_dependency(graph, compute, reduce)
        if previous is not None:
            add_dependency(graph, previous, compute)
        previous = compute
    return graph


def run_point(xpus: int, model: str) -> dict:
    """Build and simulate one point in this process (SimGrid: once per process)."""
    from hcsim.engine.api import RunOptions
    from hcsim.platform.topology import xpus as platform_xpus
    from hcsim.engine.api import run

    start = time.perf_counter()
    platform = build_platform(xpus)
    names = platform_xpus(platform)
    workload = build_workload(names, platform.nodes[names[0]]["fp32_flops"])
    outcome = run(platform, workload, RunOptions(collective_model=model))
    return {"xpus": xpus, "iteration_time_s": outcome.iteration_ends[-1], "activities": outcome.activities,
            "sim_s": outcome.wall_time_s, "wall_s": time.perf_counter() - start,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def closed_form(xpus: int) -> float:
    """The hierarchical all-reduce alone on this platform, uncontended (collectives.py closed form)."""
    g, m, s = SERVER_XPUS, xpus // SERVER_XPUS, GRADIENT_BYTES
    intra = 2 * (g - 1) * 2 * INTRA[1] + 2 * (g - 1) / g * s / INTRA[0]
    across = 2 * (m - 1) * ACROSS[1] + 2 * (m - 1) / (m * g) * s / ACROSS[0] if m > 1 else 0.0
    return intra + across


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xpus", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--collective-model", default="flow", choices=["flow", "step", "auto"])
    parser.add_argument("--profile", help="cProfile the (single) point into this file")
    parser.add_argument("--point", type=int, help=argparse.SUPPRESS)  # run one point here, print JSON
    args = parser.parse_args()
    if args.point:
        print(json.dumps(run_point(args.point, args.collective_model)))
        return
    print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}; 2-D hierarchical, "
          f"{LAYERS} layers x {GRADIENT_BYTES / 1e6:.0f} MB, {args.collective_model} collectives")
    print(f"{'xpus':>5} {'wall s':>8} {'sim s':>8} {'activities':>11} {'act/s':>9} {'peak MB':>8}  iteration time")
    for xpus in args.xpus:
        command = [sys.executable]
        if args.profile:
            command += ["-m", "cProfile", "-o", args.profile]
        command += [__file__, "--point", str(xpus), "--collective-model", args.collective_model]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            print(f"{xpus:>5}  failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{xpus:>5} {r['wall_s']:>8.2f} {r['sim_s']:>8.2f} {r['activities']:>11,} "
              f"{r['activities'] / r['sim_s']:>9,.0f} {r['peak_rss_mb']:>8.0f}  {r['iteration_time_s']:.12g} s "
              f"(one all-reduce alone: {closed_form(xpus):.6g} s)", flush=True)


if __name__ == "__main__":
    main()
