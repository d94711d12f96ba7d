"""`hcsim plan`: the best way to train a model on a cluster (hcsim.plan), simulated.

    hcsim plan llama2-70b --platform paper-cxl --xpus 256 --global-batch 256 --devices H100,A100
"""

from __future__ import annotations

import contextlib
import csv
import io
import re
import sys
from collections import Counter
from functools import lru_cache
from pathlib import Path

from hcsim.cli.sweep import add_execution_options, check_execution_options
from hcsim.errors import ConfigError

__all__ = ["register"]

SIMULATION = {"collective_model": "flow", "local_collectives": "analytic", "xpu_sampling": "representative",
              "iterations": 1}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="find the best parallel configuration of a model on a cluster",
        description="Enumerate tp x pp x dp x micro-batch x schedule x recomputation x ZeRO stage (and layer "
                    "and batch splits on mixed clusters), drop what does not fit in memory, rank the rest with closed forms, simulate the "
                    "best with contention and print them ranked by simulated throughput.",
        epilog="example: hcsim plan llama2-70b --platform paper-cxl --xpus 256 --global-batch 256 "
               "--devices H100,A100 --top 10 --jobs 2 --out plans/")
    parser.add_argument("model", metavar="MODEL", help="a workload spec (workloads/*.yaml) or its path")
    parser.add_argument("--platform", default="paper-cxl", help="platform spec (default paper-cxl)")
    parser.add_argument("--xpus", type=int, required=True, help="XPUs to train on (the platform's first ones)")
    parser.add_argument("--global-batch", type=int, required=True, help="samples per iteration")
    parser.add_argument("--devices", default=None, help="device per rack, comma-separated, cycling (H100,A100)")
    parser.add_argument("--top", type=int, default=10, help="plans to simulate (default 10)")
    add_execution_options(parser, "simulations", "its plan is listed as failed")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="any scenario key, e.g. precision=fp32 (repeatable)")
    parser.add_argument("--out", default=None, help="folder for plan.csv and plan.png")
    parser.set_defaults(run=run)


def run(args) -> int:
    from hcsim.plan import candidates, estimate, fits, rank_correlation, zero2_twins
    from hcsim.scenario import load_scenario

    from hcsim.limits import MAX_GLOBAL_BATCH, check_limit

    if args.top < 1:
        raise ConfigError(f"--top: must be >= 1, got {args.top}")
    if args.global_batch < 1:
        raise ConfigError(f"--global-batch: must be an integer >= 1 (samples per iteration), got {args.global_batch}")
    check_limit(args.global_batch, MAX_GLOBAL_BATCH, "the global batch", f"--global-batch {args.global_batch}",
                "give the samples per iteration of a real run (a few thousand at most)")
    if args.out:  # before any work: a bad folder must not cost the plans
        from hcsim.config import check_output_folder

        check_output_folder(args.out, "--out")
    check_execution_options(args)
    devices = [d.strip() for d in args.devices.split(",")] if args.devices else None
    base = {"platform": args.platform, "workload": args.model, "xpus": args.xpus, **SIMULATION}
    if devices:
        base["devices"] = devices
    scenario = load_scenario(None, {**base, **_settings(args.settings)})
    platform, xpus, spec = _cluster(scenario)
    mixed = devices and len(set(devices)) > 1
    stages = _speeds(platform, xpus, spec.precision, "pp") if mixed else None
    replicas = _speeds(platform, xpus, spec.precision, "dp") if mixed else None
    found = candidates(spec, xpus, args.global_batch, _server_size(platform, xpus), stages, replica_speeds=replicas)
    reasons = {c: _too_large(spec, c) or fits(spec, c, platform, xpus) for c in found}
    fitting = [c for c, reason in reasons.items() if reason is None]
    print(f"{len(found)} configurations of {spec.model.name} on {len(xpus)} XPUs "
          f"({', '.join(f'{n} {d}' for d, n in Counter(platform.nodes[x]['device'] for x in xpus).items())}), "
          f"global batch {args.global_batch}: {len(fitting)} fit in local memory")
    for reason, count in Counter(_kind(r) for r in reasons.values() if r).most_common():
        print(f"  {count} do not fit: {reason}")
    if found and all(r and r.startswith(_TOO_LARGE) for r in reasons.values()):
        raise ConfigError(f"--global-batch {args.global_batch}: every configuration's graph has more vertices than "
                          f"a simulation may build (hcsim.limits); valid: a smaller global batch (at most a few "
                          f"thousand micro-batches per replica), or HCSIM_NO_LIMITS=1")
    if not fitting:
        raise ConfigError(f"plan {args.model} on {len(xpus)} XPUs: no configuration fits in local memory "
                          f"(global batch {args.global_batch}); valid: more XPUs, a smaller global batch or a "
                          f"smaller model")
    twins = zero2_twins(fitting)
    if twins:
        fitting = [c for c in fitting if c not in twins]
        print(f"  {len(twins)} fitting at ZeRO stage 2 not ranked: the same plan fits at stage 1, which runs the "
              f"same communication and step (stage 2 saves memory only)")
    ranked = sorted(((estimate(spec, c, platform, xpus), c) for c in fitting), key=lambda e: e[0])[: args.top]
    results = _simulate(scenario, ranked, args.jobs, args.executor, args.timeout)
    rows = _rows(ranked, results, args.global_batch)
    print(_table(rows))
    done = [r for r in rows if r["simulated_s"] is not None]
    if len(done) > 1:
        rho = rank_correlation([r["estimated_s"] for r in done], [r["simulated_s"] for r in done])
        print(f"rank correlation (Spearman) of estimated and simulated iteration times: {rho:.2f}")
    if args.out:
        try:
            _write(Path(args.out), rows)
        except OSError as err:
            from hcsim.errors import OutputError

            raise OutputError(f"--out {args.out}: could not write plan.csv or plan.png ({err.strerror or err}); "
                              f"the table above is the result") from None
    return 0


def _settings(items: list[str]) -> dict:
    from hcsim.config import parse_settings

    return parse_settings(items) if items else {}


def _cluster(scenario):
    from hcsim.config import resolve_spec
    from hcsim.platform import build_platform, load_platform_spec
    from hcsim.platform.topology import xpus as platform_xpus
    from hcsim.workload import load_workload_spec

    base = Path(scenario.base)
    path = resolve_spec(scenario.platform, "platforms", base)
    try:
        spec = load_platform_spec(path, scenario.platform_settings())
    except ConfigError as err:
        raise scenario.blame(err, path, "platform") from err
    if scenario.xpus > spec.xpus:
        raise ConfigError(f"--xpus: {scenario.xpus} asked for, but platform {scenario.platform!r} has {spec.xpus}")
    platform = build_platform(spec, scenario.xpus)
    path = resolve_spec(scenario.workload, "workloads", base)
    try:
        workload = load_workload_spec(path, scenario.workload_settings())
    except ConfigError as err:
        raise scenario.blame(err, path, "workload") from err
    return platform, platform_xpus(platform)[: scenario.xpus], workload


_TOO_LARGE = "its graph would hold"


def _too_large(spec, candidate) -> str | None:
    """Why `candidate` cannot be simulated (its graph beyond the vertex limit), None if it can: checked before
    its memory, whose pipeline schedule grows with the micro-batches too."""
    import os

    from hcsim.limits import MAX_GRAPH_VERTICES, graph_vertices

    vertices = graph_vertices(spec) * candidate.parallelism.micro_batches
    if vertices <= MAX_GRAPH_VERTICES or os.environ.get("HCSIM_NO_LIMITS"):
        return None
    return f"{_TOO_LARGE} more than {MAX_GRAPH_VERTICES:,} vertices (hcsim.limits)"


def _server_size(platform, xpus) -> int:
    return max(Counter(platform.nodes[x].get("server", x) for x in xpus).values())


def _speeds(platform, xpus, precision, axis: str):
    """Per index of `axis` (pp: each pipeline stage, dp: each DP replica) of a tp x pp layout, its slowest XPU's
    peak, as layer_split and batch_split: proportional weigh them."""
    from hcsim.platform.devices import peak_flops
    from hcsim.workload.layout import ParallelLayout

    def speed(x: str) -> float:
        return peak_flops(platform.nodes[x], precision)

    @lru_cache(maxsize=None)  # the enumeration asks once per micro-batch, schedule and recomputation
    def speeds(tp: int, pp: int) -> tuple[float, ...]:
        layout = ParallelLayout(xpus, {"tp": tp, "pp": pp, "dp": len(xpus) // (tp * pp)})
        return tuple(speed(x) for x in layout.slowest(axis, speed))

    return speeds


def _kind(reason: str) -> str:
    """A reason without its stage and bytes (its ZeRO stage kept), to count alike ones together."""
    return re.sub(r"^stage \d+ needs [0-9.]+ GB per XPU, each .+? holds [0-9.]+ Gi?B",
                  "a pipeline stage needs more than its XPUs' local memory", reason)


def _simulate(scenario, ranked, jobs: int, executor: str, timeout: float | None) -> list[dict]:
    """Simulate each ranked candidate in a process of its own, on the sweep's executor; results in order."""
    from dataclasses import replace

    from tqdm import tqdm

    from hcsim.sweep import run_points

    order = sorted(range(len(ranked)), key=lambda i: -_cost(ranked[i][1]))  # longest first: a short tail
    points = [replace(scenario, **_typed(ranked[i][1].settings())) for i in order]
    results: list[dict] = [{}] * len(points)
    with tqdm(total=len(points), unit="plan", desc="simulating", disable=None, file=sys.stderr) as bar, \
            contextlib.closing(run_points(points, jobs=jobs, executor=executor, timeout=timeout)) as finished:
        for index, result in finished:
            results[order[index]] = result
            bar.update()
    return results


def _cost(candidate) -> float:
    """A rough relative simulation time: m micro-batches (the vertices are m x the model's decoders x a few),
    twice as many with ZeRO-3's gathers. (Measured on LLaMA2-70B, 256 XPUs, load 4.5: 25-28 s at m 8-32,
    53 s at m 128, 83 s at m 256 and at m 128 with ZeRO-3.)"""
    par = candidate.parallelism
    return par.micro_batches * (2 if par.zero == 3 else 1)


def _typed(settings: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}


def _rows(ranked, results, global_batch: int) -> list[dict]:
    rows = []
    for (estimated, candidate), result in zip(ranked, results):
        row = {"plan": candidate.label(), "estimated_s": estimated, "simulated_s": None, "samples_per_s": None,
               "mfu": None, "memory_gb": None, "bottleneck": result.get("error", ""),
               "simulation_wall_s": result.get("wall_time_s")}
        if "error" not in result:
            times = result["breakdown"]
            slowest = max(times.values(), key=lambda t: t["compute_s"] + t["memory_stall_s"])
            part = max(("compute_s", "memory_stall_s", "exposed_comm_s", "idle_s"), key=lambda k: slowest[k])
            kind, busiest = max(((k, v[0]) for k, v in result["links"].items()), key=lambda kv: kv[1]["utilization"])
            row.update(simulated_s=result["iteration_time_s"], samples_per_s=result["samples_per_s"],
                       mfu=result.get("mfu"), memory_gb=max(m["state_bytes"] for m in result["memory"].values()) / 1e9,
                       bottleneck=f"{part.removesuffix('_s').replace('_', ' ')}; busiest {kind} link "
                                  f"{busiest['utilization']:.0%}")
        rows.append(row)
    return sorted(rows, key=lambda r: (r["simulated_s"] is None, r["simulated_s"] or 0.0))


def _table(rows: list[dict]) -> str:
    lines = [f"{'#':>2}  {'plan':<58} {'estimated':>9} {'simulated':>9} {'samples/s':>9} {'MFU':>6} {'GB/XPU':>6}  "
             "bottleneck"]
    for i, r in enumerate(rows, 1):
        sim = f"{r['simulated_s']:.3f} s" if r["simulated_s"] is not None else "failed"
        lines.append(f"{i:>2}  {r['plan'][:58]:<58} {r['estimated_s']:>7.3f} s {sim:>9} "
                     f"{(r['samples_per_s'] or 0):>9.2f} {(r['mfu'] or 0):>6.1%} {(r['memory_gb'] or 0):>6.1f}  "
                     f"{r['bottleneck']}")
    return "\n".join(lines)


def _write(out: Path, rows: list[dict]) -> None:
    from hcsim.plotting import plot_plans
    from hcsim.simulation import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(out / "plan.csv", table.getvalue())
    plot_plans(rows, out / "plan.png")
    print(f"wrote {out}/plan.csv, plan.png")
