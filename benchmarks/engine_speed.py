"""Engine speed: wall time, activities per second and peak memory at each scale and fidelity.

LLaMA2-13B data parallel on the paper's coherent topology, one iteration
(the defaults of `hcsim simulate` otherwise). Each point runs in a process of
its own. Quote the figures with the machine's size: `nproc`, `free -g`.

    .venv/bin/python benchmarks/engine_speed.py                    # 64..4096, both fidelities
    .venv/bin/python benchmarks/engine_speed.py --xpus 64 256 --level decoder layer+repr
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


LEVELS = {  # name: scenario settings
    "layer": ["fidelity=layer"],
    "layer+repr": ["fidelity=layer", "xpu_fidelity=representative"],
    "decoder": ["fidelity=decoder"],
    "decoder+repr": ["fidelity=decoder", "xpu_fidelity=representative"],
}


def run_point(xpus: int, level: str, iterations: int, timeout: float) -> dict:
    command = [sys.executable, "-m", "hcsim.cli", "simulate", "--json", "--set", f"xpus={xpus}",
               "--set", f"iterations={iterations}"]
    for setting in LEVELS[level]:
        command += ["--set", setting]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"> {timeout:.0f} s"}
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    result = json.loads(done.stdout)
    result["process_s"] = time.perf_counter() - start
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xpus", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--level", nargs="+", default=list(LEVELS), choices=list(LEVELS),
                        help="fidelity levels: workload fidelity (+repr: representative XPUs)")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per point")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores; LLaMA2-13B data parallel, paper-cxl, {args.iterations} iteration(s)")
    print(f"{'level':<13} {'xpus':>5} {'wall s':>8} {'sim s':>8} {'activities':>11} {'act/s':>9} {'peak MB':>8}  "
          "iteration time")
    for level in args.level:
        for xpus in args.xpus:
            r = run_point(xpus, level, args.iterations, args.timeout)
            if "error" in r:
                print(f"{level:<13} {xpus:>5}  failed: {r['error']}", flush=True)
                continue
            print(f"{level:<13} {xpus:>5} {r['process_s']:>8.1f} {r['wall_time_s']:>8.1f} {r['activities']:>11,} "
                  f"{r['activities'] / r['wall_time_s']:>9,.0f} {r['peak_rss_mb']:>8.0f}  {r['iteration_time_s']:.6g} s",
                  flush=True)


if __name__ == "__main__":
    main()
