"""Serving simulation: continuous batching of inference requests, the KV cache in HBM or extended memory.

A scenario whose workload is a serving workload (:mod:`hcsim.workload.serving`) runs here instead of the
training engine. The requests run on `dp` replicas of tp x pp XPUs (requests dealt to the replicas in turn);
each replica runs steps one after another (iteration-level scheduling, as vLLM and Orca do): at the start of
a step it admits waiting requests in arrival order while fewer than ``max_batch`` run and their whole KV cache
(prompt + output tokens) fits; the step prefills the admitted prompts (their first output token comes at its
end) and decodes one token of every other running sequence; a sequence leaves when its output is complete.
Nothing is lost or taken twice: every request is admitted once and finishes once (a test checks it).

A step's time is the kernel model's (:mod:`hcsim.engine.compute_model`, the device's measured factors, with
no host launch cost: serving engines replay decode steps as CUDA graphs) over the step's kernels on one TP
rank, stage after stage, plus two TP all-reduces per layer (ring: 2(n-1)·(α + S/(n·B)) at the link kind's
achieved bandwidth, plus its call latency) and a pipeline send per stage boundary. The KV cache fills HBM
first (after the weights); beyond it, tokens go to the XPU's extended memory when spilling is allowed
(``spill``): a CXL Type 3 expander on a coherent platform is read in place beside the HBM reads (the paper's
Fig. 3c: the step waits for the slower), host DRAM without coherence is copied over PCIe into HBM first
and then read (Fig. 3b). These are closed forms over the platform's links (the paper's topologies give
every XPU a non-blocking path to its extended memory); SimGrid is not needed for a step of this fixed shape.

Units: s, bytes, tokens.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import networkx as nx

from hcsim.errors import ConfigError
from hcsim.run.scenario import Scenario
from hcsim.workload.serving import Request, ServingSpec, kv_bytes_per_token, make_requests, step_kernels

__all__ = ["load_serving_spec", "serving_workload", "simulate_serving", "percentiles"]


def serving_workload(scenario: Scenario) -> ServingSpec | None:
    """The scenario's serving workload, or None when its workload is a training one."""
    from hcsim.config import load_yaml, resolve_spec
    from hcsim.workload.sources import is_graph_source
    from hcsim.workload.serving import is_serving

    if is_graph_source(scenario.workload):
        return None
    try:
        path = resolve_spec(scenario.workload, "workloads", Path(scenario.base))
    except ConfigError:
        return None  # the training path says what is wrong with the name
    data = load_yaml(path)
    return load_serving_spec(path, scenario.workload_overrides) if is_serving(data) else None


def load_serving_spec(path, overrides=None) -> ServingSpec:
    """Read a serving workload YAML (``kind: serving``), with dotted `overrides` (``serving.rate: 8``)."""
    from hcsim.config import apply_overrides, load_yaml
    from hcsim.workload.serving import serving_spec_from_dict
    from hcsim.workload.spec import _shape

    data = apply_overrides(load_yaml(path), overrides, f"{path}: ") if overrides else load_yaml(path)
    return serving_spec_from_dict(data, str(path), _shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Replica:
    """What one replica's steps need: the compute model and device, HBM bandwidth, KV capacities in tokens
    (HBM, extended), the extended memory's path (bandwidth, latency) and whether it is read in place."""

    model: Any
    device: str
    peak: float
    hbm_bandwidth: float
    hbm_tokens: int
    ext_tokens: int
    ext_bandwidth: float
    ext_latency: float
    coherent: bool
    spilled_to: str | None
    tp_time: Any  # bytes -> s of one TP all-reduce
    p2p_time: Any  # bytes -> s of one pipeline send


def simulate_serving(scenario: Scenario, spec: ServingSpec) -> dict[str, Any]:
    """Run `spec` on the scenario's platform (module docstring); the result record."""
    import time

    wall = time.perf_counter()
    replica, layout = _replica(scenario, spec)
    requests = make_requests(spec)
    dp = layout["dp"]
    records, occupancy, steps = [], [], 0
    for r in range(dp):
        mine = [q for q in requests if q.index % dp == r]
        done, trace, count = _run_replica(spec, replica, layout, mine)
        records += done
        occupancy += [(r, *row) for row in trace]
        steps += count
    records.sort(key=lambda row: row["request"])
    if len(records) != len(requests) or sorted(row["request"] for row in records) != list(range(len(requests))):
        raise RuntimeError("serving: a request was lost or served twice (a bug)")
    makespan = max(row["finish_s"] for row in records)
    tokens = sum(row["output"] for row in records)
    return {
        "kind": "serving", "scenario": scenario.name, "platform": scenario.platform, "workload": spec.name,
        "model": spec.model.name, "precision": spec.precision, "xpus": scenario.xpus, "device": replica.device,
        "layout": layout, "requests": len(records), "output_tokens": tokens, "makespan_s": makespan,
        "throughput_tokens_per_s": tokens / makespan, "requests_per_s": len(records) / makespan, "steps": steps,
        "ttft_s": percentiles([row["ttft_s"] for row in records]),
        "tpot_s": percentiles([row["tpot_s"] for row in records]),
        "e2e_s": percentiles([row["finish_s"] - row["arrival_s"] for row in records]),
        "kv": {"bytes_per_token": kv_bytes_per_token(spec.model, spec.precision),
               "hbm_tokens_per_replica": replica.hbm_tokens, "extended_tokens_per_replica": replica.ext_tokens,
               "spilled_to": replica.spilled_to,
               "peak_hbm_tokens": max((row[2] for row in occupancy), default=0),
               "peak_extended_tokens": max((row[3] for row in occupancy), default=0)},
        "per_request": records, "occupancy": [list(row) for row in occupancy],
        "wall_time_s": time.perf_counter() - wall,
    }


def percentiles(values: list[float]) -> dict[str, float]:
    """Mean and nearest-rank p50, p90, p99 of `values`.

    >>> percentiles([1.0, 2.0, 3.0, 4.0])
    {'mean': 2.5, 'p50': 2.0, 'p90': 4.0, 'p99': 4.0}
    """
    ordered = sorted(values)
    rank = {p: ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] for p in (50, 90, 99)}
    return {"mean": sum(ordered) / len(ordered), "p50": rank[50], "p90": rank[90], "p99": rank[99]}


def _run_replica(spec: ServingSpec, replica: _Replica, layout: dict, requests: list[Request]):
    """Continuous batching on one replica: its finished requests, its KV occupancy over time, its step count."""
    waiting = deque(requests)
    running: list[dict] = []
    finished, trace = [], []
    now, hbm_used, ext_used, steps = 0.0, 0, 0, 0
    while waiting or running:
        if not running and waiting[0].arrival > now:
            now = waiting[0].arrival
        admitted, prefill = [], 0
        while waiting and waiting[0].arrival <= now and len(running) + len(admitted) < spec.max_batch \
                and (not admitted or prefill + waiting[0].prompt <= spec.max_prefill_tokens):
            need = waiting[0].prompt + waiting[0].output
            prefill += waiting[0].prompt
            in_hbm = min(need, replica.hbm_tokens - hbm_used)
            if need - in_hbm > replica.ext_tokens - ext_used:
                break  # its cache does not fit: it waits (first come, first served)
            request = waiting.popleft()
            hbm_used, ext_used = hbm_used + in_hbm, ext_used + need - in_hbm
            admitted.append({"request": request, "hbm": in_hbm, "ext": need - in_hbm, "made": 0})
        if not admitted and not running:
            q = waiting[0]
            raise ConfigError(f"serving workload {spec.name!r}: request {q.index} needs a KV cache of "
                              f"{q.prompt + q.output:,} tokens; one replica holds {replica.hbm_tokens:,} in HBM and "
                              f"{replica.ext_tokens:,} in extended memory. Fix: shorter requests, more tp or pp, "
                              f"or extended memory with spill: allow")
        now += _step_time(spec, replica, layout, admitted, running)
        steps += 1
        for row in admitted:
            row["first"] = now
        for row in running + admitted:
            row["made"] += 1
        still = []
        for row in running + admitted:
            request = row["request"]
            if row["made"] < request.output:
                still.append(row)
                continue
            hbm_used, ext_used = hbm_used - row["hbm"], ext_used - row["ext"]
            finished.append({"request": request.index, "arrival_s": request.arrival, "prompt": request.prompt,
                             "output": request.output, "first_token_s": row["first"], "finish_s": now,
                             "ttft_s": row["first"] - request.arrival,
                             "tpot_s": (now - row["first"]) / (request.output - 1)})
        running = still
        trace.append((now, hbm_used, ext_used, len(running)))
    return finished, trace, steps


def _step_time(spec: ServingSpec, replica: _Replica, layout: dict, admitted: list[dict], running: list[dict]) -> float:
    """Seconds of one step: each stage's kernels on one TP rank (the KV read from HBM; the spilled part from
    extended memory, in place or copied first), its TP all-reduces, the pipeline sends."""
    tp, pp, model = layout["tp"], layout["pp"], spec.model
    prompts = [row["request"].prompt for row in admitted]
    context = hbm_context = 0.0
    for row in running:  # the tokens cached so far, spilled last
        cached = row["request"].prompt + row["made"]
        context += cached
        hbm_context += min(cached, row["hbm"])
    spilled = context - hbm_context
    tokens = sum(prompts) + len(running)
    total = 0.0
    per_stage = model.decoders // pp
    for stage in range(pp):
        layers = per_stage + (model.decoders % pp if stage == pp - 1 else 0)
        kernels, _ = step_kernels(model, prompts=prompts, decode=len(running), context=hbm_context, tp=tp,
                                  layers=layers, head=stage == pp - 1, precision=spec.precision)
        total += replica.model.time(tuple(kernels), replica.device, replica.peak, replica.hbm_bandwidth)
        if spilled:
            kv_bytes = spilled * 2.0 * model.kv_hidden / tp * 2.0 * layers  # the spilled cache of these layers
            remote = kv_bytes / replica.ext_bandwidth + layers * replica.ext_latency
            factors = replica.model.device(replica.device)
            if replica.coherent:  # read in place beside the HBM reads: the slower part sets the time
                local = hbm_context * 2.0 * model.kv_hidden / tp * 2.0 * layers / (
                    replica.hbm_bandwidth * factors.memory_efficiency)
                total += max(0.0, remote - local)
            else:  # copied into HBM first, then read from there
                total += remote + kv_bytes / (replica.hbm_bandwidth * factors.memory_efficiency)
        if tp > 1:
            total += 2 * layers * replica.tp_time(tokens * model.hidden * 2.0)
        if stage < pp - 1:
            total += replica.p2p_time(tokens * model.hidden * 2.0)
    return total


def _replica(scenario: Scenario, spec: ServingSpec) -> tuple[_Replica, dict]:
    """The platform side of the run: one replica's XPUs, memories and paths, and the layout (tp, pp, dp)."""
    from hcsim.config import resolve_spec
    from hcsim.engine.compute_model import load_compute_model
    from hcsim.platform import build_platform, load_platform_spec
    from hcsim.platform.devices import peak_flops
    from hcsim.platform.routes import route_bandwidth, route_latency, shortest_routes
    from hcsim.platform.topology import xpus as platform_xpus
    from hcsim.run.prepare import spill_policy

    base = Path(scenario.base)
    platform_spec = load_platform_spec(resolve_spec(scenario.platform, "platforms", base),
                                       scenario.platform_settings())
    if scenario.xpus > platform_spec.xpus:
        raise ConfigError(f"scenario {scenario.name!r}: xpus: {scenario.xpus} is more than platform "
                          f"{scenario.platform!r} has ({platform_spec.xpus})")
    graph = build_platform(platform_spec, scenario.xpus)
    xpus = platform_xpus(graph)[: scenario.xpus]
    tp, pp = scenario.tp, scenario.pp
    if scenario.xpus % (tp * pp):
        raise ConfigError(f"scenario {scenario.name!r}: xpus {scenario.xpus} is not a multiple of tp x pp = "
                          f"{tp} x {pp}; valid: a multiple of {tp * pp}")
    model = spec.model
    for key, value in (("heads", model.heads), ("kv_heads", model.kv_heads or model.heads), ("ffn", model.ffn)):
        if value % tp:
            raise ConfigError(f"scenario {scenario.name!r}: tp {tp} does not divide the model's {key} ({value})")
    if pp > model.decoders:
        raise ConfigError(f"scenario {scenario.name!r}: pp {pp} is more than the model's {model.decoders} decoders")
    layout = {"tp": tp, "pp": pp, "dp": scenario.xpus // (tp * pp)}
    nodes = graph.nodes
    x0 = xpus[0]
    device = nodes[x0]["device"]
    factors_path = resolve_spec(scenario.compute_factors, "platforms", base) if scenario.compute_factors else None
    compute = load_compute_model(factors_path)
    factors = compute.device(device)
    compute = replace(compute, devices={device: replace(factors, launch=0.0, backward_launch=0.0)})
    hbm = nodes[x0]["local_memory"]
    hbm_bandwidth = graph.edges[x0, hbm]["bandwidth"]
    per_token = kv_bytes_per_token(model, spec.precision) / (tp * pp)  # one XPU's share of a token's cache
    from hcsim.workload.transformer import model_parameters

    weights = model_parameters(model) * 2.0 / (tp * pp)
    free = nodes[hbm]["capacity"] - weights
    if free <= 0:
        raise ConfigError(f"scenario {scenario.name!r}: the weights of {model.name} need "
                          f"{weights / 1e9:.1f} GB per XPU at tp {tp} x pp {pp}, more than a {device}'s HBM; "
                          f"fix: more tp or pp")
    ext, coherent, ext_tokens, ext_bandwidth, ext_latency = nodes[x0].get("extended_memory"), False, 0, 1.0, 0.0
    spilled_to = None
    if ext and spill_policy(scenario, platform_spec) == "allow":
        sharing = sum(1 for x in xpus if nodes[x].get("extended_memory") == ext)
        capacity = nodes[ext]["capacity"]
        capacity = capacity if math.isfinite(capacity) else 2**50
        ext_tokens = int(capacity / sharing / per_token)
        route = shortest_routes(graph, ext, [x0])[x0]
        ext_bandwidth, ext_latency = route_bandwidth(graph, route), route_latency(graph, route)
        coherent = nodes[ext].get("role") == "cxl_type3" and bool(graph.graph.get("coherent"))
        spilled_to = nodes[ext].get("role")
    peers = xpus[:tp * pp]
    routes = shortest_routes(graph, peers[0], peers[1:2] + peers[tp:tp + 1]) if len(peers) > 1 else {}

    def link_time(route, size, collective_steps, ranks):
        if not route:
            return 0.0
        kinds = [graph.edges[a, b]["kind"] for a, b in zip(route, route[1:])]
        slowest = min(zip(route, route[1:]), key=lambda e: graph.edges[e]["bandwidth"])
        link = compute.link(graph.edges[slowest]["kind"] if kinds else "default")
        bandwidth = route_bandwidth(graph, route) * link.bandwidth_factor
        return collective_steps * (route_latency(graph, route) + size / ranks / bandwidth) + link.call_latency

    tp_route = routes.get(peers[1]) if tp > 1 else None
    pp_route = routes.get(peers[tp]) if pp > 1 else None
    replica = _Replica(model=compute, device=device, peak=peak_flops(nodes[x0], spec.precision),
                       hbm_bandwidth=hbm_bandwidth, hbm_tokens=int(free / per_token), ext_tokens=ext_tokens,
                       ext_bandwidth=ext_bandwidth, ext_latency=ext_latency, coherent=coherent, spilled_to=spilled_to,
                       tp_time=lambda size: link_time(tp_route, size, 2 * (tp - 1), tp),
                       p2p_time=lambda size: link_time(pp_route, size, 1, 1))
    return replica, layout


def write_serving_outputs(out: Path, result: dict) -> None:
    """result.json, requests.csv (one row per request), kv.csv (the KV cache over time) and kv.png in `out`."""
    import csv
    import io
    import json

    from hcsim.run.pictures import plot_kv_occupancy
    from hcsim.run.report import atomic_write, clear_outputs

    clear_outputs(out)
    for name, rows, columns in (("requests.csv", result["per_request"], list(result["per_request"][0])),
                                ("kv.csv", [dict(zip(("replica", "time_s", "hbm_tokens", "extended_tokens", "running"),
                                                     row)) for row in result["occupancy"]],
                                 ["replica", "time_s", "hbm_tokens", "extended_tokens", "running"])):
        table = io.StringIO()
        writer = csv.DictWriter(table, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(out / name, table.getvalue())
    plot_kv_occupancy(result, out / "kv.png")
    summary = {k: v for k, v in result.items() if k not in ("per_request", "occupancy")}
    atomic_write(out / "result.json", json.dumps(summary, indent=2) + "\n")
