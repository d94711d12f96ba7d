"""Serving speed: wall time, requests/s and peak memory of a serving run against its request count.

Each point runs ``hcsim simulate`` of the built-in workload ``llama3-70b-serving`` (Llama 3.1 70B, prompts
2k-8k and outputs 256-1k tokens, Poisson arrivals) with ``serving.requests`` set to the point's count, in a
fresh process (the peak resident memory is that process's, ``ru_maxrss``; cpu s: its user and system time,
what the run costs on a shared machine). Default layout: 8 replicas of tp 8
on 64 H100 of paper-cxl at the built-in workload's 4 requests/s in all (``--rate-per-replica 4``: each replica
past its capacity, the queue growing). Quote the figures with the machine line (cores, load
average): the machine may be shared.

    .venv/bin/python benchmarks/serving_speed.py                          # 10,000 and 100,000 requests
    .venv/bin/python benchmarks/serving_speed.py --requests 1000 --replicas 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

POINT = """
import json, resource, sys, time
from hcsim.run.scenario import load_scenario
from hcsim.run.serving import serving_workload, simulate_serving

if __name__ == "__main__":
    requests, replicas, rate = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    settings = {"workload": "llama3-70b-serving", "platform": "paper-cxl", "devices": ["H100"], "tp": 8,
                "xpus": 8 * replicas, "name": "speed",
                "workload_overrides": {"serving.requests": requests, "serving.rate": rate}}
    wall = time.perf_counter()
    scenario = load_scenario(None, settings)
    result = simulate_serving(scenario, serving_workload(scenario))
    wall = time.perf_counter() - wall
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_bytes": usage.ru_maxrss * 1024, "steps": result["steps"],
                      "makespan_s": result["makespan_s"], "preemptions": result["preemptions"]}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--rate-per-replica", type=float, default=0.5, help="requests/s per replica")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'requests':>9} {'replicas':>8} {'wall s':>8} {'cpu s':>7} {'requests/s':>11} {'peak MiB':>9} {'B/request':>10} "
          f"{'steps':>11} {'simulated s':>12} {'preemptions':>11}")
    for count in args.requests:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", POINT, str(count), str(args.replicas),
                               str(args.rate_per_replica * args.replicas)], capture_output=True, text=True)
        if done.returncode:
            print(f"{count:>9} failed after {time.perf_counter() - start:.1f} s: {done.stderr.strip()[-500:]}")
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{count:>9,} {args.replicas:>8} {row['wall_s']:>8.1f} {row['cpu_s']:>7.1f} {count / row['wall_s']:>11,.0f} "
              f"{row['peak_bytes'] / 2**20:>9,.0f} {row['peak_bytes'] / count:>10,.0f} {row['steps']:>11,} "
              f"{row['makespan_s']:>12,.0f} {row['preemptions']:>11,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
