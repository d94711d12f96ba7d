"""`hcsim simulate`: run one scenario and print its result."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hcsim.units import format_quantity

__all__ = ["register"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate", help="run one scenario",
        description="Run one scenario (or the built-in default: the paper's coherent topology, 64 H100, "
                    "LLaMA2-13B data parallel, CXL 128 GB/s and 200 ns) and print the result.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  hcsim simulate\n  hcsim simulate --set xpus=256 --set devices=[H100,A100] --json\n"
               "  hcsim simulate my-scenario.yaml --out runs/a   # result.json, links.csv, trace.csv, trace.json (Perfetto)")
    parser.add_argument("scenario", nargs="?", type=Path, help="scenario YAML (default: the built-in default)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. xpus=256, cxl_latency=1us, coherent=false (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--out", type=Path, help="folder for result.json and the traces")
    parser.set_defaults(run=run)


def run(args) -> int:
    from hcsim.config import check_output_folder
    from hcsim.errors import OutputError
    from hcsim.scenario import load_scenario
    from hcsim.simulation import run_here

    scenario = load_scenario(args.scenario, args.settings)
    if args.out is not None:
        check_output_folder(args.out, "--out")
    bars = []

    def progress(total: int):
        from tqdm import tqdm

        bars.append(tqdm(total=total, unit="run", desc="simulating", disable=None, leave=False, file=sys.stderr))
        return bars[0].update

    unwritten = None
    try:
        result = run_here(scenario, args.out, progress)
    except OutputError as err:
        if err.result is None:
            raise
        result, unwritten = err.result, err
    finally:
        for bar in bars:
            bar.close()
    if unwritten is not None:  # the run finished: show its result before saying what was not saved
        print(json.dumps(result) if args.json else summary(result))
        raise unwritten
    if args.json:
        print(json.dumps(result))
    else:
        print(summary(result))
        if args.out:
            print(f"\nwrote {args.out}/result.json, links.csv" + (", trace.csv, trace.json (open in https://ui.perfetto.dev)"
                                                       if scenario.trace_xpus else ""))
    return 0


def summary(result: dict) -> str:
    """A short human-readable report of a result record."""
    inputs = result["inputs"]
    devices = " + ".join(f"{n} {d}" for d, n in result["devices"].items())
    lines = [
        f"hcsim {result['scenario']}: {devices} on {inputs['platform']} "
        f"({'coherent' if result['coherent'] else 'not coherent'}), workload {inputs['workload']}",
        f"  iteration time   {format_quantity(result['iteration_time_s'], 's')}"
        f"  (iterations: {', '.join(format_quantity(t, 's') for t in result['iteration_times_s'])})",
        f"  throughput       {result['batches_per_s']:.3f} batches/s, {result['samples_per_s']:.3f} samples/s"
        + (f", {result['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in result else "")
        + (f", MFU {result['mfu']:.1%}" if "mfu" in result else ""),
        f"  per iteration    compute     memory stall  exposed comm  idle          "
        f"(mean per XPU, iterations {result['measured_iterations']})",
    ]
    for device, row in result["breakdown"].items():
        lines.append(f"    {device:<14} {format_quantity(row['compute_s'], 's'):<11} "
                     f"{format_quantity(row['memory_stall_s'], 's'):<13} {format_quantity(row['exposed_comm_s'], 's'):<13} "
                     f"{format_quantity(row['idle_s'], 's')}")
    if result.get("stages"):
        lines.append("  per stage        compute     memory stall  exposed comm  idle (bubble)")
        for stage, row in result["stages"].items():
            lines.append(f"    stage {stage:<8} {format_quantity(row['compute_s'], 's'):<11} "
                         f"{format_quantity(row['memory_stall_s'], 's'):<13} "
                         f"{format_quantity(row['exposed_comm_s'], 's'):<13} {format_quantity(row['idle_s'], 's')}")
    busiest = sorted(((rows[0]["utilization"], kind, rows[0]["link"]) for kind, rows in result["links"].items()),
                     reverse=True)
    lines.append("  busiest links    " + "   ".join(f"{kind} {link} {u:.0%}" for u, kind, link in busiest[:3]))
    lines.append(f"  simulated {result['activities']:,} activities in {result['wall_time_s']:.2f} s wall "
                 f"({result['activities'] / max(result['wall_time_s'], 1e-9):,.0f}/s), peak {result['peak_rss_mb']:.0f} MB")
    return "\n".join(lines)
