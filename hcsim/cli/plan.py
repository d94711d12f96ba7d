"""`hcsim plan`: the best way to train a model on a cluster (hcsim.study.plan), or to serve one
(hcsim.study.serving_plan), simulated.

    hcsim plan llama2-70b --platform paper-cxl --xpus 256 --global-batch 256 --devices H100,A100
    hcsim plan llama3-70b-serving --platform dgx-h100 --xpus 16 --set "workload_overrides={serving.slo: ...}"
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import re
import sys
import time
from collections import Counter
from functools import lru_cache
from pathlib import Path

from hcsim.cli import path_arg
from hcsim.cli.sweep import add_execution_options, check_execution_options
from hcsim.errors import ConfigError
from hcsim.units import format_quantity

__all__ = ["register"]

SIMULATION = {"collective_model": "flow", "local_collectives": "analytic",
              "iterations": 1}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="find the best parallel configuration of a model on a cluster (training or serving)",
        description="Training workload: enumerate tp x pp x dp x cp x micro-batch x schedule x recomputation x "
                    "ZeRO stage (and layer "
                    "and batch splits on mixed clusters), drop what does not fit in memory, rank the rest with closed forms, simulate "
                    "the most promising with contention (best corrected estimate first, until no plan left can "
                    "beat the best simulated, or --time) and print them ranked by simulated throughput. Serving "
                    "workload (kind: serving, with serving.slo): enumerate tp x pp x replicas x prefill/decode split "
                    "on at most --xpus XPUs, drop what does not fit in memory, bound each layout's goodput in "
                    "closed form, simulate the best bounds first until no layout left can change the pick (or "
                    "--time), and print them ranked by goodput: the pick has the most goodput (within 1 percent: the "
                    "fewest XPUs, then the lowest p90 time to first token).",
        epilog="examples: hcsim plan llama2-70b --platform paper-cxl --xpus 256 --global-batch 256 "
               "--devices H100,A100 --time 600 --jobs 2 --out plans/ ; hcsim plan llama3-70b-serving --platform "
               "dgx-h100 --xpus 16 --set \"workload_overrides={serving.slo: {ttft: 1s, tpot: 50ms}}\" --out plans/")
    parser.add_argument("model", metavar="MODEL", help="a workload spec (workloads/*.yaml) or its path")
    parser.add_argument("--platform", default="paper-cxl", help="platform spec (default paper-cxl)")
    parser.add_argument("--xpus", type=int, required=True, help="XPUs to train on (the platform's first ones); "
                        "serving: the most XPUs a layout may use")
    parser.add_argument("--global-batch", type=int, default=None, help="samples per iteration (training "
                        "workloads; a serving workload's load is its serving: section)")
    parser.add_argument("--devices", default=None, help="device per rack, comma-separated, cycling (H100,A100)")
    parser.add_argument("--time", type=_seconds, default=300.0, metavar="SECONDS",
                        help="the whole plan (enumeration, estimates, simulations) takes about this long at most, in "
                             "seconds or with a unit (default 300; 10min, 1h): it simulates best corrected estimates "
                             "first, until no plan left can beat the best simulated (hcsim.study.plan.Search) or the "
                             "next batch would pass the time")
    parser.add_argument("--all", action="store_true", help="simulate every fitting plan, whatever --time says (to "
                        "check the search against the exhaustive best: benchmarks/plan_search.py)")
    parser.add_argument("--top", type=int, default=None, help="simulate at most this many plans (default: as many "
                        "as --time allows)")
    add_execution_options(parser, "simulations", "its plan is listed as failed")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="any scenario key, e.g. precision=fp32 (repeatable); a layout key ("
                             f"{', '.join(LAYOUT_KEYS)}) fixes it: only the plans with that value are ranked")
    parser.add_argument("--out", type=path_arg, default=None, help="folder for plan.csv and plan.png; each finished simulation is "
                        "kept in OUT/plan.journal.jsonl until they are written, so a killed plan loses none")
    parser.add_argument("--resume", action="store_true",
                        help="after a killed plan: keep its finished simulations (OUT/plan.journal.jsonl), simulate "
                             "the other plans")
    parser.add_argument("--overwrite", action="store_true",
                        help="after a killed plan: discard its finished simulations and start over")
    parser.set_defaults(run=run)


def _seconds(text: str) -> float:
    """--time's value: seconds (300) or a duration with its unit (10min, 1h); checked > 0 by run."""
    try:
        return float(text)
    except ValueError:
        pass
    from hcsim.units import parse_quantity

    try:
        return parse_quantity(text, "time", "--time")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected a time budget in seconds (300) or with its unit (10min, 1h), "
                                         f"got {text!r}") from None


def run(args) -> int:
    args.started = time.perf_counter()  # --time counts from here: the whole plan, not only its simulations
    from hcsim.limits import MAX_GLOBAL_BATCH, check_limit
    from hcsim.study.store import check_resume

    if args.top is not None and args.top < 1:
        raise ConfigError(f"--top: must be >= 1, got {args.top}; leave it out to simulate as many as --time allows")
    if not 0 < args.time < float("inf"):
        raise ConfigError(f"--time: must be > 0 seconds (the time the plan may take), got {args.time:g}")
    serving = _serving(args)
    if serving and args.global_batch is not None:
        raise ConfigError(f"--global-batch: does not apply to serving workload {args.model!r} (its requests, "
                          f"their lengths and rate come from its serving: section). Fix: leave --global-batch out")
    if not serving and args.global_batch is None:
        raise ConfigError(f"--global-batch: required to plan training workload {args.model!r} (samples per "
                          f"iteration, an integer >= 1)")
    if not serving and args.global_batch < 1:
        raise ConfigError(f"--global-batch: must be an integer >= 1 (samples per iteration), got {args.global_batch}")
    if not serving:
        check_limit(args.global_batch, MAX_GLOBAL_BATCH, "the global batch", f"--global-batch {args.global_batch}",
                    "give the samples per iteration of a real run (a few thousand at most)")
    check_resume(args.resume, args.overwrite, "the finished simulations in plan.journal.jsonl")
    if args.out:  # before any work: a bad folder must not cost the plans
        from hcsim.config import check_output_folder

        check_output_folder(args.out, "--out")
    elif args.resume or args.overwrite:
        raise ConfigError(f"--{'resume' if args.resume else 'overwrite'}: needs --out, the folder of the plan it "
                          f"resumes or starts over (its plan.journal.jsonl)")
    check_execution_options(args)
    plan = _plan_serving if serving else _plan
    if args.out:
        from hcsim.study.journal import Journal

        with Journal(Path(args.out), "plan", "plan", resume=args.resume, overwrite=args.overwrite) as journal:
            plan(args, journal)
            journal.finish()
    else:
        plan(args, None)
    return 0


def _serving(args) -> bool:
    """Whether the workload to plan is a serving one (kind: serving)."""
    from hcsim.workload.serving import serving_spec_path

    return serving_spec_path(args.model, Path(".")) is not None


def _plan(args, journal) -> None:
    """hcsim plan once its options are checked; `journal` (with --out) keeps each finished simulation."""
    from hcsim.run.scenario import load_scenario
    from hcsim.study.plan import (MIN_RANKED_FOR_CORRELATION, Search, candidates, estimate, fits, rank_correlation,
                                  zero2_twins)

    devices = [d.strip() for d in args.devices.split(",")] if args.devices else None
    base = {"platform": args.platform, "workload": args.model, "xpus": args.xpus, **SIMULATION}
    if devices:
        base["devices"] = devices
    scenario = load_scenario(None, {**base, **_settings(args.settings)}, "--set ")
    platform, xpus, spec = _cluster(scenario)
    _check_costs(spec, args)
    mixed = devices and len(set(devices)) > 1
    stages = _speeds(platform, xpus, spec.precision, "pp") if mixed else None
    replicas = _speeds(platform, xpus, spec.precision, "dp") if mixed else None
    found = candidates(spec, xpus, args.global_batch, _server_size(platform, xpus), stages, replica_speeds=replicas)
    found = _fixed_by_set(found, scenario, _settings(args.settings))
    reasons = {c: _too_large(spec, c) or fits(spec, c, platform, xpus) for c in found}
    fitting = [c for c, reason in reasons.items() if reason is None]
    print(f"{len(found)} configurations of {spec.model.name} on {len(xpus)} XPUs ({_cluster_words(platform, xpus)}), "
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
    model = _kernel_model(scenario, fitting[0])
    estimates = {c: estimate(spec, c, platform, xpus, model) for c in found}
    order = sorted(fitting, key=lambda c: estimates[c])
    every = dict(margin=math.inf, explore=math.inf) if args.all else {}
    found_results = _search(scenario, Search({c: estimates[c] for c in fitting}, **every), args, journal)
    ranked = [(estimates[c], c) for c in order if c in found_results]
    rank_of = {c: i for i, c in enumerate(order, 1)}
    results = [found_results[c] for _, c in ranked]
    rows = _rows(ranked, results, args.global_batch, rank_of)
    print(_table(rows))
    done = [r for r in rows if r["simulated_s"] is not None]
    if len(done) >= MIN_RANKED_FOR_CORRELATION:
        rho = rank_correlation([r["estimated_s"] for r in done], [r["simulated_s"] for r in done])
        print(f"rank correlation (Spearman) of estimated and simulated iteration times over {len(done)} plans: "
              f"{rho:.2f}")
    else:
        print(f"rank correlation of estimated and simulated times: not meaningful with {len(done)} simulated "
              f"plan{'s' if len(done) != 1 else ''} (it needs {MIN_RANKED_FOR_CORRELATION}; simulate more with "
              f"--time)")
    if args.out:
        table = _candidate_rows(scenario, spec, platform, xpus, found, reasons, twins, order, estimates, rows)
        title = (f"{spec.model.name} on {len(xpus)} XPUs ({_cluster_words(platform, xpus)}, {args.platform}), "
                 f"global batch {args.global_batch}")
        try:
            _write(Path(args.out), scenario, ranked, rows, table, title, rank_of)
        except OSError as err:
            from hcsim.errors import OutputError

            raise OutputError(f"--out {args.out}: could not write plan.csv, plan.png or the scenarios "
                              f"({err.strerror or err}); the table above is the result, and "
                              f"{journal.path} keeps every simulation: run again with --resume") from None


def _check_costs(spec, args) -> None:
    """Refuse, before enumerating, a workload whose costs come from a table: a plan is simulated with hybrid
    parallelism, which derives each rank's costs from the model shape; name the built-in spec of the same
    model with costs from its shape, if there is one, in the command to run."""
    if spec.costs != "table":
        return
    twins = _shape_twins(spec)
    if twins:
        from hcsim.workload import load_workload_spec
        from hcsim.config import resolve_spec

        twin = load_workload_spec(resolve_spec(twins[0], "workloads"))
        words = [arg if arg != args.model else twins[0] for arg in sys.argv[sys.argv.index("plan") + 1:]] \
            if "plan" in sys.argv and args.model in sys.argv else [twins[0], "..."]
        fix = f"plan its shape twin instead: hcsim plan {' '.join(words)}"
        if twin.precision != spec.precision:
            fix += (f" (the twin trains in {twin.precision}, {args.model} in {spec.precision}: add --set "
                    f"precision={spec.precision} to keep {spec.precision})")
    else:
        fix = "copy the spec, set costs: shape and plan that"
    raise ConfigError(f"plan {args.model}: workload {spec.name!r} takes its costs from a table (costs: table), "
                      f"which only runs data parallel; a plan's tensor and pipeline splits derive each rank's costs "
                      f"from the model shape. Fix: {fix}")


def _shape_twins(spec) -> list[str]:
    """The built-in workload specs of `spec`'s model (same name and shape) whose costs come from the shape."""
    from hcsim.config import REPO_ROOT
    from hcsim.errors import HcsimError
    from hcsim.workload import load_workload_spec

    found = []
    for path in sorted((REPO_ROOT / "workloads").glob("*.yaml")):
        try:
            other = load_workload_spec(path)
        except (HcsimError, OSError, AttributeError):  # a serving or another kind of spec
            continue
        model = getattr(other, "model", None)
        if other.costs == "shape" and model is not None and (model.name, model.decoders, model.hidden) == (
                spec.model.name, spec.model.decoders, spec.model.hidden):
            found.append(path.stem)
    return found


def _cluster_words(platform, xpus) -> str:
    return ", ".join(f"{n} {d}" for d, n in Counter(platform.nodes[x]["device"] for x in xpus).items())


def _settings(items: list[str]) -> dict:
    from hcsim.config import parse_settings

    return parse_settings(items) if items else {}


# layout keys plan searches over: one given by --set keeps only the plans with its value
LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "micro_batch", "schedule", "virtual_stages", "recompute", "zero")


def _fixed_by_set(found: list, scenario, given: dict) -> list:
    """The candidates whose layout has each layout key's value the user gave by --set (the scenario's, read and
    checked); ConfigError naming the key and the values plan could rank when none has it."""
    for key in (k for k in LAYOUT_KEYS if k in given):
        value = getattr(scenario, key)
        kept = [c for c in found if getattr(c.parallelism, key) == value]
        if found and not kept:
            valid = sorted({getattr(c.parallelism, key) for c in found}, key=str)
            raise ConfigError(f"--set {key}: no configuration of this plan has {key} {value}; valid here: "
                              f"{', '.join(map(str, valid))}, or leave {key} out to search it")
        found = kept
    return found


def _cluster(scenario):
    from hcsim.config import resolve_spec
    from hcsim.run.prepare import check_precision, scenario_platform
    from hcsim.workload import load_workload_spec

    _, platform, xpus = scenario_platform(scenario, "--xpus")
    path = resolve_spec(scenario.workload, "workloads", Path(scenario.base))
    try:
        workload = load_workload_spec(path, scenario.workload_settings())
    except ConfigError as err:
        raise scenario.blame(err, path, "workload") from err
    check_precision(scenario, workload, platform, xpus)  # fp8 on an A100: before any plan is ranked
    return platform, xpus, workload


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


def _search(scenario, search, args, journal, record=None, point=None, noun: str = "fitting plans") -> dict:
    """Simulate the plans `search` proposes, `--jobs` at a time, until it is finished, `--top` plans have run or
    the next batch would pass `--time`; says how many ran and why it stopped. Returns candidate -> result.
    `record(search, candidate, result)` tells the search a result (default: its iteration time), `point`
    as :func:`_simulate`'s."""
    record = record or _record_time
    results: dict = {}
    start, batches = time.perf_counter(), []
    while not (reason := search.finished()):
        if args.top is not None and len(results) >= args.top:
            reason = f"--top {args.top} reached"
            break
        elapsed = time.perf_counter() - args.started  # --time is the whole plan's (run() sets started)
        if batches and elapsed + max(batches) > args.time and not args.all:
            reason = f"--time {args.time:g} s spent"
            break
        batch = search.next(args.jobs if args.top is None else min(args.jobs, args.top - len(results)))
        batch_start = time.perf_counter()
        for candidate, result in zip(batch, _simulate(scenario, [(search.estimates[c], c) for c in batch], args.jobs,
                                                      args.executor, args.timeout, journal, point)):
            results[candidate] = result
            record(search, candidate, result)
        batches.append(time.perf_counter() - batch_start)
    print(f"simulated {len(results)} of {len(search.estimates)} {noun} in {time.perf_counter() - start:.0f} s "
          f"({reason})")
    return results


def _record_time(search, candidate, result: dict) -> None:
    search.record(candidate, None if "error" in result else result["iteration_time_s"])


def _simulate(scenario, ranked, jobs: int, executor: str, timeout: float | None, journal=None, point=None
              ) -> list[dict]:
    """Simulate each ranked candidate in a process of its own, on the sweep's executor; results in order. With a
    :class:`~hcsim.study.journal.Journal`, each result is recorded there as it ends, and a candidate whose
    scenario it already holds (a resumed plan) is not simulated again. `point(candidate)`: the scenario that runs
    it (default: `scenario` with the candidate's settings)."""
    from dataclasses import replace

    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from hcsim.study.points import run_points

    point = point or (lambda candidate: replace(scenario, **_typed(candidate.settings())))
    order = sorted(range(len(ranked)), key=lambda i: -_cost(ranked[i][1]))  # longest first: a short tail
    points = [point(ranked[i][1]) for i in order]
    keys = [p.digest() for p in points]
    done = journal.done if journal is not None else {}
    results: list[dict] = [{}] * len(points)
    for i, key in enumerate(keys):
        if key in done:
            results[order[i]] = done[key]
    todo = [i for i, key in enumerate(keys) if key not in done]
    with tqdm(total=len(todo), unit="plan", desc="simulating", disable=None, file=sys.stderr) as bar, \
            logging_redirect_tqdm(), \
            contextlib.closing(run_points([points[i] for i in todo], jobs=jobs, executor=executor,
                                          timeout=timeout)) as finished:
        for index, result in finished:
            if journal is not None:
                journal.record(keys[todo[index]], result)
            results[order[todo[index]]] = result
            bar.update()
    return results


def _kernel_model(scenario, candidate):
    """The ComputeModel the plan's simulations time their kernels with (every candidate runs the hybrid graph
    with the same compute model), None where they run the peak model: the estimate times blocks the same way."""
    from dataclasses import replace

    from hcsim.engine.compute_model import load_compute_model
    from hcsim.run.prepare import compute_factors_path, resolve_compute_model

    if resolve_compute_model(replace(scenario, **_typed(candidate.settings()))) != "roofline":
        return None
    return load_compute_model(compute_factors_path(scenario))


def _cost(candidate) -> float:
    """A rough relative simulation time: m micro-batches (the vertices are m x the model's decoders x a few),
    twice as many with ZeRO-3's gathers. (Measured on LLaMA2-70B, 256 XPUs, load 4.5: 25-28 s at m 8-32,
    53 s at m 128, 83 s at m 256 and at m 128 with ZeRO-3.) A serving layout: its replicas (each its own
    scheduler's steps)."""
    if not hasattr(candidate, "parallelism"):
        return candidate.replicas
    par = candidate.parallelism
    return par.micro_batches * (2 if par.zero == 3 else 1)


def _typed(settings: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}


def _rows(ranked, results, global_batch: int, rank_of: dict) -> list[dict]:
    """The simulated plans, fastest first: rank (by the estimate), plan, estimate, simulated results."""
    rows = []
    for (estimated, candidate), result in zip(ranked, results):
        row = {"rank": rank_of[candidate], "plan": candidate.label(), "estimated_s": estimated, "simulated_s": None,
               "samples_per_s": None, "mfu": None, "memory_gb": None, "bottleneck": "",
               "error": result.get("error", ""), "simulation_wall_s": result.get("wall_time_s")}
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
    return sorted(rows, key=lambda r: (r["simulated_s"] is None, r["simulated_s"] or 0.0, r["rank"]))


def _table(rows: list[dict]) -> str:
    """The simulated plans as printed: every plan in full (the column as wide as the longest), the failed
    ones with their error."""
    width = max([len("plan")] + [len(r["plan"]) for r in rows])
    lines = [f"{'#':>2}  {'rank':>4}  {'plan':<{width}} {'estimated':>9} {'simulated':>9} {'samples/s':>9} "
             f"{'MFU':>6} {'GB/XPU':>6}  bottleneck"]
    for i, r in enumerate(rows, 1):
        if r["simulated_s"] is None:
            lines.append(f"{i:>2}  {r['rank']:>4}  {r['plan']:<{width}} {r['estimated_s']:>7.3f} s {'failed':>9}  "
                         f"{r['error']}")
            continue
        lines.append(f"{i:>2}  {r['rank']:>4}  {r['plan']:<{width}} {r['estimated_s']:>7.3f} s "
                     f"{r['simulated_s']:>7.3f} s {r['samples_per_s']:>9.2f} {(r['mfu'] or 0):>6.1%} "
                     f"{r['memory_gb']:>6.1f}  {r['bottleneck']}")
    lines.append("(#: simulated, fastest first; rank: by the closed-form estimate, as in plan.csv)")
    return "\n".join(lines)


PLAN_COLUMNS = ("rank", "tp", "pp", "dp", "cp", "ep", "micro_batch", "micro_batches", "global_batch", "schedule",
                "virtual_stages", "recompute", "zero", "offload", "layer_split", "batch_split", "estimated_s",
                "estimated_memory_gb", "fits", "fit_reason", "simulated", "simulated_s", "samples_per_s", "mfu",
                "memory_gb", "bottleneck", "error", "scenario", "plan")


def _candidate_rows(scenario, spec, platform, xpus, found, reasons, twins, order, estimates, simulated) -> list[dict]:
    """A row of plan.csv (PLAN_COLUMNS) per enumerated candidate: the ranked ones in estimate order, then those
    left out (ZeRO-2 twins, then those that do not fit). Numbers or blank; fits and simulated True or False."""
    from hcsim.study.plan import stage_needs

    by_rank = {r["rank"]: r for r in simulated}
    rank_of = {c: i for i, c in enumerate(order, 1)}
    rows = []
    for candidate in [*order, *sorted(twins, key=estimates.get), *(c for c in found if reasons[c] is not None)]:
        rank = rank_of.get(candidate)
        sim = by_rank.get(rank, {}) if rank is not None else {}
        need = max(n for _, n, _ in stage_needs(spec, candidate, platform, xpus))
        reason = reasons[candidate] or ("not ranked: the same plan at ZeRO stage 1 fits and runs the same "
                                        "communication and step" if candidate in twins else "")
        rows.append({"rank": rank, **candidate.columns(), "ep": scenario.ep, "offload": scenario.offload,
                     "global_batch": candidate.parallelism.global_batch,
                     "estimated_s": estimates[candidate], "estimated_memory_gb": need / 1e9,
                     "fits": reasons[candidate] is None, "fit_reason": reason, "simulated": bool(sim),
                     "simulated_s": sim.get("simulated_s"), "samples_per_s": sim.get("samples_per_s"),
                     "mfu": sim.get("mfu"), "memory_gb": sim.get("memory_gb"), "bottleneck": sim.get("bottleneck"),
                     "error": sim.get("error"), "scenario": _scenario_file(rank) if sim else None,
                     "plan": candidate.label()})
    return rows


def _scenario_file(rank: int) -> str:
    return f"scenarios/rank-{rank:03d}.yaml"


def scenario_yaml(scenario, settings: dict, name: str) -> str:
    """A scenario YAML that `hcsim simulate` runs as it is: the keys `scenario` sets (with `settings` applied)
    other than their defaults, quantities with their units, and spec files as absolute paths (built-in specs
    by name)."""
    import dataclasses

    import yaml

    from hcsim.config import REPO_ROOT, resolve_spec
    from hcsim.run.scenario import Scenario

    scenario = dataclasses.replace(scenario, name=name, **_typed(settings))
    defaults = Scenario(name=name).to_dict()
    data = {}
    for f in dataclasses.fields(Scenario):
        value = scenario.to_dict()[f.name]
        if f.name == "base" or (value == defaults[f.name] and f.name != "name"):
            continue
        if f.name in ("platform", "workload"):
            folder = f"{f.name}s"
            path = resolve_spec(value, folder, Path(scenario.base))
            value = path.stem if path.parent == REPO_ROOT / folder and path.stem == value else str(path)
        unit = f.metadata.get("unit")
        if unit and value is not None:
            value = f"{value!r}{unit}"
        data[f.name] = value
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _write_scenarios(out: Path, scenario, items: list[tuple[int, dict, str, str]]) -> None:
    """OUT/scenarios/rank-NNN.yaml per (rank, settings, label, what ranked it) of `items`, each a scenario that
    `hcsim simulate` runs as it is; those of an earlier plan in `out` are removed first, so none is left beside
    these."""
    from hcsim.run.report import atomic_write

    folder = out / "scenarios"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("rank-*.yaml"):
        old.unlink()
    for rank, settings, label, ranked_by in items:
        head = f"# hcsim plan, rank {rank} by {ranked_by}: {label}\n"
        atomic_write(folder / f"rank-{rank:03d}.yaml", head + scenario_yaml(scenario, settings, f"plan-rank-{rank}"))


def _write_csv(path: Path, columns, table: list[dict]) -> None:
    """`table` as a CSV of `columns` (None written blank), loadable with pandas.read_csv."""
    from hcsim.run.report import atomic_write

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in table)
    atomic_write(path, text.getvalue())


def _write(out: Path, scenario, ranked, rows: list[dict], table: list[dict], title: str, rank_of: dict) -> None:
    """plan.csv (every candidate), plan.png (the simulated ones) and scenarios/rank-NNN.yaml (one per simulated
    plan); scenarios of an earlier plan in `out` are removed first, so none is left beside these."""
    from hcsim.study.plotting import plot_plans

    _write_scenarios(out, scenario, [(rank_of[c], c.settings(), c.label(), "the closed-form estimate")
                                     for _, c in ranked])
    _write_csv(out / "plan.csv", PLAN_COLUMNS, table)
    plot_plans(rows, out / "plan.png", title)
    print(f"wrote {out}/plan.csv ({len(table)} configurations), plan.png, scenarios/rank-NNN.yaml (one per "
          f"simulated plan: hcsim simulate {out / 'scenarios'}/rank-{rows[0]['rank']:03d}.yaml runs the fastest)")


# --- serving ------------------------------------------------------------------------------------------------

SERVING_LAYOUT_KEYS = ("tp", "pp")  # layout keys a serving plan searches; --set fixes them


def _plan_serving(args, journal) -> None:
    """hcsim plan for a serving workload (hcsim.study.serving_plan): every layout on at most --xpus XPUs, those
    that fit bounded and the best bounds simulated until no layout left can change the pick."""
    from hcsim.study.serving_plan import ServingSearch, pick

    scenario, spec, platform, xpus = _serving_cluster(args)
    found, reasons, bounds = _serving_layouts(args, scenario, spec, platform, xpus)
    goodput = {c: b.goodput(spec.slo) for c, b in bounds.items()}
    order = sorted(goodput, key=lambda c: (-goodput[c], c.xpus, c))
    rank_of = {c: i for i, c in enumerate(order, 1)}
    hopeless = [c for c in order if goodput[c] <= 0]
    if hopeless:
        print(f"  {len(hopeless)} cannot meet the SLO even with a replica to each request: not simulated")
    if len(hopeless) == len(order):
        raise ConfigError(_slo_out_of_reach(args, spec, bounds))
    search = ServingSearch(goodput, every=args.all)
    results = _search(scenario, search, args, journal, record=_record_goodput,
                      point=lambda c: _serving_point(scenario, c), noun="fitting layouts")
    rows = _serving_rows(results, goodput, rank_of)
    chosen = pick({c: (r["goodput"], r["ttft_p90_s"]) for c, r in rows.items() if r["goodput"] is not None})
    print(_serving_table(rows, chosen))
    if chosen is not None:
        row = rows[chosen]
        slo = _slo_words(spec.slo)
        print(f"pick: {chosen.label()} on {chosen.xpus} XPUs: {row['goodput']:.4g} requests/s meet the SLO ({slo}), "
              f"{row['met_share']:.1%} of the requests; p90 time to first token "
              f"{format_quantity(row['ttft_p90_s'], 's')}" + (" (no simulated layout met the SLO for any request: "
                                                              "loosen it or give more XPUs)" if not row["goodput"]
                                                              else ""))
    if args.out:
        out = Path(args.out)
        table = _serving_csv_rows(found, reasons, goodput, rank_of, rows, chosen)
        try:
            _write_scenarios(out, scenario, [(rank_of[c], c.settings(scenario.workload_overrides), c.label(),
                                              "the goodput bound") for c in results])
            _write_csv(out / "plan.csv", SERVING_PLAN_COLUMNS, table)
        except OSError as err:
            from hcsim.errors import OutputError

            raise OutputError(f"--out {args.out}: could not write plan.csv or the scenarios "
                              f"({err.strerror or err}); the table above is the result, and "
                              f"{journal.path} keeps every simulation: run again with --resume") from None
        print(f"wrote {out}/plan.csv ({len(table)} layouts), scenarios/rank-NNN.yaml (one per simulated layout"
              + (f": hcsim simulate {out / 'scenarios'}/rank-{rank_of[chosen]:03d}.yaml runs the pick)"
                 if chosen is not None else ")"))


def _serving_cluster(args):
    """The serving plan's base scenario (its --set keys checked as a serving run checks them), its workload with
    an SLO, the platform graph and its first --xpus XPUs."""
    from hcsim.run.prepare import scenario_platform
    from hcsim.run.scenario import load_scenario
    from hcsim.run.serving import check_serving_scenario, serving_workload

    base = {"platform": args.platform, "workload": args.model, "xpus": args.xpus}
    if args.devices:
        base["devices"] = [d.strip() for d in args.devices.split(",")]
    settings = _settings(args.settings)
    scenario = load_scenario(None, {**base, **settings}, "--set ")
    spec = serving_workload(scenario)
    if spec.slo is None:
        raise ConfigError(f"plan {args.model}: serving workload {spec.name!r} gives no serving.slo, and a serving "
                          f"plan ranks layouts by goodput under it. Fix: give the latency targets, e.g. --set "
                          f"\"workload_overrides={{serving.slo: {{ttft: 1s, tpot: 50ms}}}}\"")
    check_serving_scenario(scenario, spec)
    _, platform, xpus = scenario_platform(scenario, "--xpus")
    return scenario, spec, platform, xpus


def _serving_point(scenario, candidate):
    from dataclasses import replace

    return replace(scenario, **_typed(candidate.settings(scenario.workload_overrides)))


def _serving_layouts(args, scenario, spec, platform, xpus):
    """Every layout (those --set fixes), why each that does not fit does not (the serving run's own checks),
    and the goodput bounds of those that fit; says how many fit. ConfigError when none does."""
    from hcsim.errors import HcsimError
    from hcsim.run.serving import serving_bounds, serving_workload
    from hcsim.study.serving_plan import serving_candidates

    given = _settings(args.settings)
    found = serving_candidates(spec.model, len(xpus), _server_size(platform, xpus), spec.disaggregation,
                               spec.requests, {k: getattr(scenario, k) for k in SERVING_LAYOUT_KEYS if k in given})
    memo, reasons, bounds = {}, {}, {}
    for candidate in found:
        point = _serving_point(scenario, candidate)
        try:
            bounds[candidate] = serving_bounds(point, serving_workload(point), memo)
        except HcsimError as err:  # the run's own refusal: what does not fit, and why
            reasons[candidate] = str(err).removeprefix(f"scenario {point.name!r}: ")
    print(f"{len(found)} layouts of {spec.model.name} on at most {len(xpus)} XPUs ({_cluster_words(platform, xpus)}), "
          f"{spec.requests} requests: {len(bounds)} fit in memory")
    for reason, count in Counter(_serving_kind(r) for r in reasons.values()).most_common():
        print(f"  {count} do not fit: {reason}")
    if not bounds:
        first = next(iter(reasons.values()), "no layout of tp x pp dividing the model's heads")
        raise ConfigError(f"plan {args.model} on at most {_xpus(len(xpus))}: no layout fits in memory ({first}); "
                          f"valid: more XPUs, a larger tp or pp, or shorter requests")
    return found, reasons, bounds


def _serving_kind(reason: str) -> str:
    """A serving run's refusal without its numbers, to count alike ones together."""
    if "no room for a KV block" in reason:
        return "the weights and a step's activations leave no room for a KV block"
    if "needs a KV cache of" in reason:
        return "a request's KV cache is more than a replica holds"
    if "a replica runs on one device" in reason:
        return "a replica's XPUs are of two devices"
    return reason


def _slo_out_of_reach(args, spec, bounds) -> str:
    """Why no layout can meet the SLO: the best time to first token and per output token any request gets
    alone."""
    ttft = min(min(b.ttft) for b in bounds.values())
    tpot = min(min(b.tpot) for b in bounds.values())
    return (f"plan {args.model} on at most {_xpus(args.xpus)}: no layout can meet serving.slo ({_slo_words(spec.slo)}) "
            f"for any request: alone on a replica, a request's first token takes at least "
            f"{format_quantity(ttft, 's')} and each output token {format_quantity(tpot, 's')}. Fix: looser targets, "
            f"more XPUs, or a faster device")


def _xpus(count: int) -> str:
    return f"{count} XPU{'s' if count != 1 else ''}"


def _slo_words(slo) -> str:
    return " and ".join(f"{name} <= {format_quantity(value, 's')}" for name, value in
                        (("first token", slo.ttft), ("per output token", slo.tpot)) if value is not None)


def _record_goodput(search, candidate, result: dict) -> None:
    if "error" in result:
        search.record(candidate, None)
    else:
        search.record(candidate, result["goodput"]["requests_per_s"], result["ttft_s"]["p90"])


def _serving_rows(results: dict, goodput: dict, rank_of: dict) -> dict:
    """candidate -> its simulated row: rank (by the bound), bound, goodput and latencies, or its error."""
    rows = {}
    for candidate, result in results.items():
        row = {"rank": rank_of[candidate], "goodput_bound": goodput[candidate], "goodput": None, "met_share": None,
               "ttft_p50_s": None, "ttft_p90_s": None, "tpot_p50_s": None, "tpot_p90_s": None,
               "throughput_tokens_per_s": None, "makespan_s": None, "error": result.get("error")}
        if "error" not in result:
            row.update(goodput=result["goodput"]["requests_per_s"], met_share=result["goodput"]["share"],
                       ttft_p50_s=result["ttft_s"]["p50"], ttft_p90_s=result["ttft_s"]["p90"],
                       tpot_p50_s=result["tpot_s"]["p50"], tpot_p90_s=result["tpot_s"]["p90"],
                       throughput_tokens_per_s=result["throughput_tokens_per_s"], makespan_s=result["makespan_s"])
        rows[candidate] = row
    return rows


def _serving_table(rows: dict, chosen) -> str:
    """The simulated layouts as printed, most goodput first (then fewer XPUs), the pick marked *; the failed
    ones last with their error."""
    order = sorted(rows, key=lambda c: (rows[c]["goodput"] is None, -(rows[c]["goodput"] or 0.0), c.xpus,
                                        rows[c]["ttft_p90_s"] or 0.0, c))
    width = max([len("layout")] + [len(c.label()) for c in order])
    lines = [f"{'#':>3}  {'rank':>4}  {'layout':<{width}} {'XPUs':>4} {'bound/s':>8} {'goodput/s':>9} {'met':>6} "
             f"{'TTFT p50':>9} {'p90':>9} {'TPOT p50':>9} {'p90':>9}"]
    def t(seconds: float) -> str:
        return format_quantity(seconds, "s")

    for i, c in enumerate(order, 1):
        r, mark = rows[c], "*" if c == chosen else " "
        head = f"{i:>2}{mark}  {r['rank']:>4}  {c.label():<{width}} {c.xpus:>4} {r['goodput_bound']:>8.3g}"
        if r["goodput"] is None:
            lines.append(f"{head} {'failed':>9}  {r['error']}")
            continue
        lines.append(f"{head} {r['goodput']:>9.3g} {r['met_share']:>6.1%} {t(r['ttft_p50_s']):>9} "
                     f"{t(r['ttft_p90_s']):>9} {t(r['tpot_p50_s']):>9} {t(r['tpot_p90_s']):>9}")
    lines.append("(#: simulated, most goodput first, * the pick; rank: by the goodput bound, as in plan.csv; "
                 "goodput: requests/s meeting the SLO)")
    return "\n".join(lines)


SERVING_PLAN_COLUMNS = ("rank", "tp", "pp", "replicas", "prefill", "decode", "xpus", "goodput_bound", "fits",
                        "fit_reason", "simulated", "pick", "goodput", "met_share", "ttft_p50_s", "ttft_p90_s",
                        "tpot_p50_s", "tpot_p90_s", "throughput_tokens_per_s", "makespan_s", "error", "scenario",
                        "plan")


def _serving_csv_rows(found, reasons, goodput, rank_of, rows, chosen) -> list[dict]:
    """A row of plan.csv (SERVING_PLAN_COLUMNS) per enumerated layout: those that fit in bound order, then those
    that do not. Numbers or blank; fits, simulated and pick True or False."""
    table = []
    for candidate in [*sorted(goodput, key=rank_of.get), *(c for c in found if c in reasons)]:
        sim = rows.get(candidate, {})
        table.append({**{k: None for k in SERVING_PLAN_COLUMNS}, **candidate.columns(),
                      "rank": rank_of.get(candidate), "goodput_bound": goodput.get(candidate),
                      "fits": candidate not in reasons, "fit_reason": reasons.get(candidate, ""),
                      "simulated": bool(sim), "pick": candidate == chosen,
                      **{k: v for k, v in sim.items() if k not in ("rank", "goodput_bound")},
                      "scenario": _scenario_file(rank_of[candidate]) if sim else None, "plan": candidate.label()})
    return table
