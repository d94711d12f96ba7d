"""`hcsim simulate`: run one scenario and print its result."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hcsim.cli import path_arg
from hcsim.units import format_percent, format_quantity

__all__ = ["register"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate", help="run one scenario",
        description="Run one scenario (or the built-in default: the paper's coherent topology, 64 H100, "
                    "LLaMA2-13B data parallel, CXL 128 GB/s and 200 ns) and print the result.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=scenario_keys_help() + "\n\nexamples:\n  hcsim simulate\n"
               "  hcsim simulate --set xpus=256 --set devices=[H100,A100] --json\n"
               "  hcsim simulate --set workload_overrides.training.batch_per_xpu=2 --set platform_overrides.rack.servers=8\n"
               "  hcsim simulate my-scenario.yaml --out runs/a   # result.json, links.csv, xpus.csv, xpus.png,\n"
               "                                                 # trace.csv, trace.json (Perfetto)")
    parser.add_argument("scenario", nargs="?", type=Path, help="scenario YAML (default: the built-in default)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. xpus=256, cxl_latency=1us, coherent=false (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--out", type=path_arg, help="folder for result.json, links.csv, xpus.csv, xpus.png and the traces "
                        "(refused if it holds an earlier run's results, unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the earlier run's results in --out (all of them: none is left beside the new)")
    parser.set_defaults(run=run)


def _in_file(err, args, name: str):
    """`err` with each problem blamed on "scenario NAME" blamed on the scenario file the user gave instead (and
    its --set settings, if any): the name may differ from the file's."""
    import re

    if args.scenario is None:
        return err
    where = f"{args.scenario}{' (with --set)' if args.settings else ''}: "
    text = re.sub(rf"(?m)^scenario {re.escape(repr(name))}: ", lambda _: where, str(err))
    return err if text == str(err) else type(err)(text)


def run(args) -> int:
    from hcsim.errors import HcsimError, OutputError
    from hcsim.run.report import check_results_folder
    from hcsim.run.scenario import load_scenario
    from hcsim.run.simulation import run_here

    scenario = load_scenario(args.scenario, args.settings)
    if args.out is not None:
        check_results_folder(args.out, args.overwrite, "--out")
    bars = []

    def progress(total: int):
        from tqdm import tqdm

        bars.append(tqdm(total=total, unit="run", desc="simulating", disable=None, leave=False, file=sys.stderr))
        return bars[0].update

    unwritten = None
    try:
        result = run_here(scenario, args.out, progress, overwrite=args.overwrite)
    except OutputError as err:
        if err.result is None:
            raise
        result, unwritten = err.result, err
    except HcsimError as err:
        blamed = _in_file(err, args, scenario.name)
        if blamed is err:
            raise
        raise blamed from err
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
            from hcsim.run.report import RUN_OUTPUTS

            written = [name for name in RUN_OUTPUTS if (args.out / name).exists()]
            print(f"\nwrote {args.out}/{', '.join(written)}"
                  + (" (open trace.json in https://ui.perfetto.dev)" if "trace.json" in written else ""))
    return 0


def scenario_keys_help() -> str:
    """The scenario keys, their defaults and what they mean: generated from the Scenario dataclass (its
    fields, defaults, unit metadata, and the comment beside and below each field in hcsim/run/scenario.py)."""
    import dataclasses
    import inspect
    import re
    import textwrap

    from hcsim.run.scenario import Scenario

    comments: dict[str, list[str]] = {}
    current = None
    for line in inspect.getsource(Scenario).splitlines():
        field = re.match(r"^    (\w+): [^#]*?(?:#\s*(.*))?$", line)
        more = re.match(r"^    #\s*(.*)$", line)
        if field and not more:
            current = field.group(1)
            comments[current] = [field.group(2)] if field.group(2) else []
        elif more and current is not None and comments.get(current) \
                and not comments[current][-1].rstrip().endswith((".", ")", "}", "]")):
            comments[current].append(more.group(1))  # a comment goes on below its field until a sentence ends
        else:
            current = None
    lines = ["scenario keys (a YAML file of them, or --set KEY=VALUE; quantities with units, e.g. 128GB/s, 200ns):"]
    for f in dataclasses.fields(Scenario):
        if f.name == "base":
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        unit = f.metadata.get("unit")
        shown = format_quantity(default, unit).replace(" ", "") if unit and default is not None else default
        text = " ".join(comments.get(f.name, []))
        entry = f"{f.name} (default {'unset' if shown is None else shown}){': ' + text if text else ''}"
        lines.append(textwrap.fill(entry, 108, initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False))
    return "\n".join(lines)


SPILLED_TO = {"dram": "host DRAM", "cxl_type3": "CXL Type 3 memory"}


def serving_summary(result: dict) -> str:
    """The report of a serving run (hcsim.run.serving)."""
    from hcsim.units import format_quantity

    def spread(key):
        p = result[key]
        return (f"mean {format_quantity(p['mean'], 's')}, p50 {format_quantity(p['p50'], 's')}, "
                f"p90 {format_quantity(p['p90'], 's')}, p99 {format_quantity(p['p99'], 's')}")

    def goodput():
        slo, met = result["slo"], result["goodput"]
        targets = " and ".join(f"{name} <= {format_quantity(slo[key], 's')}" for key, name in
                               (("ttft_s", "first token"), ("tpot_s", "per output token")) if slo[key] is not None)
        return (f"  goodput          {rate(met['requests_per_s'])} requests/s meet the SLO ({targets}): "
                f"{met['requests']:,} of {result['requests']:,}, {met['share']:.1%}")

    def rate(value):  # three significant digits however small: a spilled run's 0.00291 tokens/s is not 0
        return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"

    layout, kv, scheduler = result["layout"], result["kv"], result["scheduler"]
    extended = kv["extended_tokens_per_replica"]
    offload = scheduler.get("kv_offload")
    where = (f", {'then' if not offload else 'its kv_offload tier'} {'unbounded' if extended is None else f'{extended:,}'}"
             f" in {kv['spilled_to']}" if kv["spilled_to"] else "")
    preemption = (f"offload to {offload['tier']} ({offload['policy']}) on preemption, recompute once it is full"
                  if offload else f"{scheduler['preemption']} on preemption")
    prefix = result["prefix_cache"]
    per_replica = layout["tp"] * layout["pp"]
    replicas = result.get("replica_devices", [result["device"]])
    mixed = len(set(replicas)) > 1  # a mixed cluster: each device's XPUs, and its replicas' KV blocks
    xpus = (" + ".join(f"{replicas.count(d) * per_replica} {d}" for d in dict.fromkeys(replicas)) if mixed
            else f"{result['xpus']} {result['device']}")
    holds = (", ".join(f"{tokens:,} ({d})" for d, tokens in kv["hbm_tokens_by_device"].items()) if mixed
             else f"{kv['hbm_tokens_per_replica']:,}")
    return "\n".join([
        f"hcsim {result['scenario']}: serving {result['model']} ({result['precision']}) on {xpus} "
        f"of {result['platform']}, tp {layout['tp']} x pp {layout['pp']} x {layout['dp']} "
        f"replica{'s' if layout['dp'] > 1 else ''}"
        + (f" ({layout['prefill']} prefill, {layout['decode']} decode)" if "prefill" in layout else ""),
        f"  scheduler        {scheduler['name']}: {scheduler['max_num_batched_tokens']:,} tokens and "
        f"{scheduler['max_num_seqs']:,} sequences per step, blocks of {scheduler['block_size']} tokens, "
        f"{'chunked prefill' if scheduler['chunked_prefill'] else 'whole prompts'}, "
        f"prefix caching {'on' if scheduler['prefix_caching'] else 'off'}, {preemption}",
        f"  requests         {result['requests']:,} in {format_quantity(result['makespan_s'], 's')} "
        f"({rate(result['requests_per_s'])} per s, {result['steps']:,} steps, {result['preemptions']:,} "
        f"preemptions, prefix cache hit rate {prefix['hit_rate']:.1%})",
        f"  throughput       {rate(result['throughput_tokens_per_s'])} output tokens/s",
        *([_power_line(result["gemm_clocks"], "down to", "each step by its own share of GEMMs")]
          if result.get("gemm_clocks") else []),
        f"  time to first    {spread('ttft_s')}",
        f"  per output token {spread('tpot_s')}",
        f"  between tokens   {spread('itl_s')}",
        f"  end to end       {spread('e2e_s')}",
        *([goodput()] if "goodput" in result else []),
        *([f"  KV handoff       {spread('handoff_s')} (prefill's first token to the cache on its decode replica)"]
          if "handoff_s" in result else []),
        f"  KV cache         {format_quantity(kv['bytes_per_token'], 'B')} per token; a replica holds "
        f"{holds} tokens in HBM{where}; peak {kv['peak_hbm_tokens']:,} in HBM, "
        f"{kv['peak_extended_tokens']:,} beyond",
        *_tier_lines(kv),
    ])


def _power_line(clocks: dict, how: str, why: str) -> str:
    """The clock the power limit left a run's GEMMs, per device (a result's gemm_clocks)."""
    return ("  power limit      " + ", ".join(f"{device} GEMMs {how} {clock:.3f} of their clock alone"
                                              for device, clock in clocks.items()) + f" ({why})")


def _tier_lines(kv: dict) -> list[str]:
    """The memory beyond HBM that served KV blocks, when blocks moved through it: what it was used for and the
    bytes moved (hcsim.run.serving's kv.tiers)."""
    from hcsim.units import format_quantity

    lines = []
    for name, tier in kv.get("tiers", {}).items():
        if name == "hbm" or not (tier["stored_blocks"] or tier["loaded_blocks"] or tier["read_bytes"]
                                 or tier["use"] != "spill"):
            continue
        moved = (f"stored {tier['stored_blocks']:,} blocks ({format_quantity(tier['stored_bytes'], 'B')}), loaded "
                 f"{tier['loaded_blocks']:,} ({format_quantity(tier['loaded_bytes'], 'B')}), "
                 if tier["use"] != "spill" else "")
        lines.append(f"  KV tier          {SPILLED_TO.get(name, name)} ({tier['use']}): {moved}read "
                     f"{format_quantity(tier['read_bytes'], 'B')} {tier['read']} by steps (decodes read "
                     f"{format_quantity(kv['tiers']['hbm']['read_bytes'], 'B')} from HBM)")
    return lines


def _split_line(row: dict) -> list[str]:
    """The parts of a breakdown row, where it has any: exposed communication per kind, idle as bubble and as
    waiting for peers, recomputation (hcsim.run.results.SPLIT_PARTS)."""
    from hcsim.engine.api import COMM_KINDS
    from hcsim.units import format_quantity

    parts = [f"{kind} {format_quantity(row[f'comm_{kind}_s'], 's')}" for kind in COMM_KINDS
             if row.get(f"comm_{kind}_s")]
    if row.get("idle_s"):
        parts.append(f"bubble {format_quantity(row['idle_bubble_s'], 's')}, peers {format_quantity(row['idle_peers_s'], 's')}")
    if row.get("recompute_s"):
        parts.append(f"recompute {format_quantity(row['recompute_s'], 's')} of compute")
    return [f"      of which     {'; '.join(parts)}"] if parts else []


def _memory_lines(result: dict) -> list[str]:
    """Per device type: the state an XPU holds, and what spilled where, how it is read, and under which rule."""
    lines = []
    for device, row in result.get("memory", {}).items():
        text = f"{device} {format_quantity(row['state_bytes'], 'B')} of state per XPU"
        if row.get("offloaded_bytes"):
            text += f", {format_quantity(row['offloaded_bytes'], 'B')} offloaded"
        if row["spilled_bytes"]:
            where = SPILLED_TO.get(row.get("spilled_to"), row.get("spilled_to") or "extended memory")
            how = ("coherent: read in place alongside compute, the paper's Fig. 3c model" if result["coherent"] else
                   "not coherent: copied into local memory before use, the paper's Fig. 3b model")
            text += f", {format_quantity(row['spilled_bytes'], 'B')} spilled to {where} ({how}; spill: " \
                    f"{result.get('spill') or 'allow'})"
        else:
            text += ", nothing spilled"
        lines.append(("  memory           " if not lines else "                   ") + text)
    return lines


def _compute_line(result: dict) -> list[str]:
    """How compute was timed: the compute model (and its factors file), the kernel inventory, the precision recipe."""
    if "compute_model" not in result:
        return []
    model = ("peak model (FLOPs / peak FLOP/s)" if result["compute_model"] == "peak" else
             f"roofline model ({result['compute_factors']})")
    kernels = f"; kernels {result['kernels']}" if result.get("kernels") else ""
    lines = [f"  compute          {model}{kernels}; {result['precision_recipe']}"]
    if result.get("gemm_clocks"):
        lines.append(_power_line(result["gemm_clocks"], "at", "their share of the kernel time"))
    return lines


def _straggler_line(result: dict) -> list[str]:
    """The slowest XPU, its factor, and what it costs (hcsim.run.stragglers.straggler_report), if any is slowed."""
    if "stragglers" not in result:
        return []
    s = result["stragglers"]
    sign = "+" if s["extra_compute_s"] >= 0 else "-"  # a factor below 1 speeds an XPU up
    return [f"  straggler        {s['xpu']} x{s['factor']:.3g} ({s['count']} of {result['xpus']} XPUs "
            f"{'slowed' if s['factor'] > 1 else 'given a factor, none slower'}): "
            f"{sign}{format_quantity(abs(s['extra_compute_s']), 's')} of its own compute per iteration; its peers "
            f"waited {format_quantity(s['peers_idle_s'], 's')} per iteration in collectives (mean; it waited "
            f"{format_quantity(s['own_idle_s'], 's')})"]


def summary(result: dict) -> str:
    """A short human-readable report of a result record."""
    if result.get("kind") == "serving":
        return serving_summary(result)
    if result.get("jobs"):
        return _jobs_summary(result)
    inputs = result["inputs"]
    devices = " + ".join(f"{n} {d}" for d, n in result["devices"].items())
    lines = [
        f"hcsim {result['scenario']}: {devices} on {inputs['platform']} "
        f"({'coherent' if result['coherent'] else 'not coherent'}), workload {inputs['workload']}"
        + (f", precision {result['precision']}" if result.get("precision") else ""),
        *_job_lines(result), *_run_lines(result)]
    return "\n".join(lines)


def _jobs_summary(result: dict) -> str:
    """A run of several jobs on one fabric: the platform, one block per job (as a run of its own prints it, and
    its iteration time alone when the run has it), then the run's links and counts."""
    devices = " + ".join(f"{n} {d}" for d, n in result["devices"].items())
    lines = [f"hcsim {result['scenario']}: {len(result['jobs'])} jobs on {devices} of {result['inputs']['platform']} "
             f"({'coherent' if result['coherent'] else 'not coherent'}), sharing its links"]
    for job in result["jobs"]:
        if job.get("kind") == "serving":
            lines += _serving_job_lines(job)
            continue
        job_devices = " + ".join(f"{n} {d}" for d, n in job["devices"].items())
        lines.append(f"job {job['name']}: {job_devices} ({job['xpu_names']}), workload {job['workload']}"
                     + (f", precision {job['precision']}" if job.get("precision") else ""))
        lines += ["  " + line for line in _job_lines(job)]
        if "alone_iteration_time_s" in job:
            lines.append(f"    alone          {format_quantity(job['alone_iteration_time_s'], 's')} per iteration on "
                         f"the same XPUs: sharing costs it {format_percent(job['slowdown'] - 1)} "
                         f"(x{job['slowdown']:.4f})")
    return "\n".join(lines + _run_lines(result))


def _serving_job_lines(job: dict) -> list[str]:
    """A serving job among training jobs: its serving report under a job line, and what sharing costs it when the
    run has its run alone (hcsim.run.cojobs.compare_serving)."""
    head, *rest = serving_summary(job).splitlines()
    lines = [f"job {job['name']}: {head.split(': ', 1)[1]} ({job['xpu_names']})", *("  " + line for line in rest)]
    if "alone" in job:
        alone, slow = job["alone"], job["slowdown"]
        lines.append(f"    alone          time to first mean {format_quantity(alone['ttft_s'], 's')}, per output "
                     f"token mean {format_quantity(alone['tpot_s'], 's')}, {alone['throughput_tokens_per_s']:,.0f} "
                     f"output tokens/s on the same XPUs: sharing costs it x{slow['ttft_s']:.4f} in time to first, "
                     f"x{slow['tpot_s']:.4f} per output token, x{slow['throughput']:.4f} in throughput")
    return lines


def _job_lines(result: dict) -> list[str]:
    """The lines of one job: compute model, iteration time, throughput, where the time goes, memory, pace."""
    lines = [
        *_compute_line(result),
        f"  iteration time   {format_quantity(result['iteration_time_s'], 's')}"
        f"  (iterations: {', '.join(format_quantity(t, 's') for t in result['iteration_times_s'])})",
        f"  throughput       {result['batches_per_s']:.3f} batches/s, {result['samples_per_s']:.3f} samples/s"
        + (f", {result['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in result else "")
        + (f", MFU {result['mfu']:.1%}" if "mfu" in result else ""),
        f"  per iteration    compute     memory stall  exposed comm  idle (waiting)  "
        f"(mean over each type's XPUs, iterations {result['measured_iterations']})",
    ]
    for device, row in result["breakdown"].items():
        lines.append(f"    {device:<14} {format_quantity(row['compute_s'], 's'):<11} "
                     f"{format_quantity(row['memory_stall_s'], 's'):<13} {format_quantity(row['exposed_comm_s'], 's'):<13} "
                     f"{format_quantity(row['idle_s'], 's')}")
        lines.extend(_split_line(row))
    if result.get("stages"):
        lines.append("  per stage        compute     memory stall  exposed comm  idle (bubble)")
        for stage, row in result["stages"].items():
            lines.append(f"    stage {stage:<8} {format_quantity(row['compute_s'], 's'):<11} "
                         f"{format_quantity(row['memory_stall_s'], 's'):<13} "
                         f"{format_quantity(row['exposed_comm_s'], 's'):<13} {format_quantity(row['idle_s'], 's')}")
    if "batch_split" in result:
        split = result["batch_split"]
        lines.append(f"  batch split      {split['unit']} per DP replica: " + ", ".join(
            f"{d} {c['fewest']}{'-' + str(c['most']) if c['most'] != c['fewest'] else ''} "
            f"({c['replicas']} replica{'s' if c['replicas'] > 1 else ''})" for d, c in split["by_device"].items()))
    if "tp_across_servers" in result:
        span = result["tp_across_servers"]
        lines.append(f"  TP groups        span servers: {span['groups']} TP group{'s' if span['groups'] > 1 else ''} "
                     f"of {span['tp']} XPUs across up to {span['servers']} servers each (TP larger than a server); "
                     f"their all-reduces cross the network, simulated as such")
    lines.extend(_memory_lines(result))
    pace = result["pace"]
    setter = min(pace, key=lambda d: pace[d]["idle_s"])
    others = ", ".join(f"{d} {format_quantity(p['idle_s'], 's')}" for d, p in pace.items() if d != setter)
    lines.append(f"  pace set by      {setter} ({pace[setter]['xpu']}, idle {format_quantity(pace[setter]['idle_s'], 's')}"
                 f" per iteration{'; least idle of the other types: ' + others if others else ''})")
    lines.extend(_straggler_line(result))
    return lines


def _run_lines(result: dict) -> list[str]:
    """The run's busiest links and its counts."""
    lines = []
    busiest = sorted(((rows[0]["utilization"], kind, rows[0]["link"]) for kind, rows in result["links"].items()),
                     reverse=True)
    lines.append("  busiest links    " + "   ".join(f"{kind} {link} {format_percent(u)}" for u, kind, link in busiest[:3]))
    engine = " on the C++ core" if result.get("engine") == "core" else ""
    lines.append(f"  simulated {result['activities']:,} activities{engine} in {result['wall_time_s']:.2f} s wall "
                 f"({result['activities'] / max(result['wall_time_s'], 1e-9):,.0f}/s), peak {result['peak_rss_mb']:.0f} MB")
    return lines
