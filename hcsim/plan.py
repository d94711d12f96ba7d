"""Planning: the best way to train a model on a given cluster (`hcsim plan`).

:func:`candidates` enumerates the valid configurations (tp, pp, dp, micro-batch,
schedule with virtual stages, recomputation, and on mixed clusters an even or a
speed-proportional layer split), :func:`fits` keeps those whose every pipeline
stage fits in its XPUs' local memory (saying why the others do not), and
:func:`estimate` gives each an iteration time from closed forms that follow the
engine's own rules without contention: a block takes max(FLOP / peak, bytes /
memory bandwidth); tensor-parallel all-reduces are ring closed forms on the
server's links; a pipeline of per-micro-batch stage times τ_s takes
Σ τ + (m - 1)·max τ (the bubble shrinks by v with interleaving, and by the
weight-gradient passes with ZB-H1); the gradient all-reduce over each DP group
and the optimizer step follow. The top candidates are then simulated with
contention (hcsim.cli.plan) and the two rankings compared.

Pure: specs and graphs in, plain data out; no SimGrid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

import networkx as nx

from hcsim.errors import ConfigError
from hcsim.platform.devices import peak_flops
from hcsim.platform.routes import route_bandwidth, route_latency, shortest_routes
from hcsim.workload.hybrid import BlockCost, Parallelism, block_costs, in_flight, stage_layers
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.memory import stage_memory
from hcsim.workload.schedules import stage_order
from hcsim.workload.spec import WorkloadSpec

__all__ = ["Candidate", "candidates", "fits", "estimate", "rank_correlation"]

MICRO_BATCHES = (1, 2, 4, 8)
RECOMPUTES = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One configuration: the parallelism, and whether its layer split follows the stages' speed."""

    parallelism: Parallelism
    split: str = "even"  # even | proportional

    def settings(self) -> dict:
        """Scenario keys that run this candidate."""
        par = self.parallelism
        keys = {"tp": par.tp, "pp": par.pp, "micro_batch": par.micro_batch, "global_batch": par.global_batch,
                "schedule": par.schedule, "virtual_stages": par.virtual_stages, "recompute": par.recompute}
        if par.layer_split is not None:
            keys["layer_split"] = list(par.layer_split)
        return keys

    def label(self) -> str:
        par = self.parallelism
        schedule = par.schedule + (f" v{par.virtual_stages}" if par.virtual_stages > 1 else "")
        split = f", split {'/'.join(map(str, par.layer_split))}" if par.layer_split else ""
        return (f"tp{par.tp} pp{par.pp} dp{par.dp} mb{par.micro_batch} {schedule} recompute {par.recompute}"
                + split)


def candidates(spec: WorkloadSpec, layout_xpus: list[str], global_batch: int, server_size: int,
               stage_speeds=None) -> list[Candidate]:
    """Every valid configuration of `spec` over the XPUs, with TP groups inside a server of `server_size`.

    `stage_speeds(pp)`, if given, returns each stage's relative speed: on a mixed cluster a speed-proportional
    layer split is tried beside the even one."""
    model, n = spec.model, len(layout_xpus)
    found = []
    for tp, pp, mb, recompute in product(_powers(min(server_size, n)), range(1, model.decoders + 1), MICRO_BATCHES,
                                         RECOMPUTES):
        if n % (tp * pp) or model.heads % tp or (model.kv_heads or model.heads) % tp:
            continue
        dp = n // (tp * pp)
        if global_batch % (dp * mb):
            continue
        m = global_batch // (dp * mb)
        schedules = [("1f1b", 1)] + ([("zb-h1", 1)] if pp > 1 else []) \
            + ([("interleaved", 2)] if pp > 1 and m % pp == 0 and model.decoders % (2 * pp) == 0 else [])
        for schedule, v in schedules:
            splits = [None]
            if stage_speeds is not None and pp > 1 and v == 1:
                proportional = _proportional(model.decoders, stage_speeds(pp))
                if proportional != (model.decoders // pp,) * pp:
                    splits.append(proportional)
            for split in splits:
                if split is None and model.decoders % (pp * v):
                    continue
                par = Parallelism(tp=tp, pp=pp, dp=dp, micro_batch=mb, global_batch=global_batch, schedule=schedule,
                                  virtual_stages=v, recompute=recompute, layer_split=split)
                found.append(Candidate(parallelism=par, split="proportional" if split else "even"))
    return found


def _powers(limit: int) -> list[int]:
    return [2 ** k for k in range(int(math.log2(limit)) + 1)]


def _proportional(decoders: int, speeds: list[float]) -> tuple[int, ...]:
    """Decoders per stage in proportion to speed, each >= 1, summing to `decoders` (largest remainders)."""
    total = sum(speeds)
    shares = [decoders * s / total for s in speeds]
    counts = [max(1, int(share)) for share in shares]
    order = sorted(range(len(speeds)), key=lambda i: counts[i] - shares[i])
    i = 0
    while sum(counts) != decoders:
        step = 1 if sum(counts) < decoders else -1
        j = order[i % len(order)]
        if counts[j] + step >= 1:
            counts[j] += step
        i += 1
    return tuple(counts)


@dataclass(frozen=True)
class _Cluster:
    """What the estimate needs of a platform: per stage its slowest XPU, and the links between XPUs."""

    platform: nx.Graph
    layout: ParallelLayout

    def slowest(self, stage: int, precision: str) -> tuple[float, float]:
        """(peak FLOP/s, HBM B/s) of the stage's slowest XPU."""
        nodes = self.platform.nodes
        xpu = min(self.layout.stage_xpus(stage), key=lambda x: peak_flops(nodes[x], precision))
        return peak_flops(nodes[xpu], precision), self.platform.edges[nodes[xpu]["local_memory"], xpu]["bandwidth"]

    def path(self, src: str, dst: str) -> tuple[float, float]:
        """(latency s, bottleneck B/s) of the least-latency route src -> dst."""
        route = shortest_routes(self.platform, src, [dst])[dst]
        return route_latency(self.platform, route), route_bandwidth(self.platform, route)


def cluster_layout(xpus: list[str], par: Parallelism) -> ParallelLayout:
    return ParallelLayout(xpus, {"tp": par.tp, "pp": par.pp, "dp": par.dp})


def fits(spec: WorkloadSpec, candidate: Candidate, platform: nx.Graph, xpus: list[str]) -> str | None:
    """None when every stage fits its XPUs' local memory, else why not (stage, bytes needed, bytes held)."""
    par = candidate.parallelism
    layout = cluster_layout(xpus, par)
    layers = stage_layers(spec, par)
    for stage in range(par.pp):
        order = stage_order(par.schedule, stages=par.pp, micro_batches=par.micro_batches, stage=stage,
                            chunks=par.virtual_stages)
        need = stage_memory(spec.model, layers=sum(layers[stage]), first=stage == 0, last=stage == par.pp - 1,
                            in_flight=in_flight(order) / par.virtual_stages, micro_batch=par.micro_batch, tp=par.tp,
                            sequence_parallel=par.sequence_parallel, precision=spec.precision,
                            attention=spec.attention, optimizer=spec.optimizer, recompute=par.recompute,
                            dp=par.dp).total
        nodes = platform.nodes
        held = min(nodes[nodes[x]["local_memory"]]["capacity"] for x in layout.stage_xpus(stage))
        if need > held:
            return f"stage {stage} needs {need / 1e9:.1f} GB > {held / 1e9:.1f} GB of local memory"
    return None


def estimate(spec: WorkloadSpec, candidate: Candidate, platform: nx.Graph, xpus: list[str]) -> float:
    """Iteration time (s) of `candidate` by the closed forms of the module docstring (no contention)."""
    par = candidate.parallelism
    cluster = _Cluster(platform, cluster_layout(xpus, par))
    attn, mlp = block_costs(spec, par.micro_batch, par.tp, par.sequence_parallel)
    layers = stage_layers(spec, par)
    sizes = spec.sizes
    activation = par.micro_batch * spec.model.sequence * spec.model.hidden * sizes.activation
    layout = cluster.layout
    tp_latency, tp_bandwidth = cluster.path(*layout.groups("tp")[0][:2]) if par.tp > 1 else (0.0, math.inf)
    allreduce = 2 * (par.tp - 1) * tp_latency + 2 * (par.tp - 1) / par.tp * activation / tp_bandwidth
    tau, forward, backward_input, weight = [], [], [], []
    for stage in range(par.pp):
        peak, bandwidth = cluster.slowest(stage, spec.precision)
        decoders = sum(layers[stage])
        f = decoders * sum(_time(b.fwd_flops, b.fwd_bytes, peak, bandwidth) + allreduce for b in (attn, mlp))
        b_in = decoders * sum(_time(b.input_grad_flops, b.bwd_bytes / 2, peak, bandwidth) + allreduce
                              for b in (attn, mlp))
        w = decoders * sum(_time(b.weight_grad_flops, b.bwd_bytes / 2, peak, bandwidth) for b in (attn, mlp))
        extra = decoders * _recompute(par.recompute, (attn, mlp), peak, bandwidth, allreduce)
        forward.append(f)
        backward_input.append(b_in + extra)
        weight.append(w)
        tau.append(f + b_in + extra + w)
    m, p = par.micro_batches, par.pp
    slowest = max(tau)
    bubble = sum(tau) - slowest
    if par.schedule == "interleaved":
        bubble /= par.virtual_stages
    elif par.schedule == "zb-h1":
        bubble = max(0.0, sum(f + b - w for f, b, w in zip(forward, backward_input, weight))
                     - max(f + b - w for f, b, w in zip(forward, backward_input, weight)))
    pipeline = m * slowest + bubble
    if p > 1:
        latency, bandwidth = cluster.path(layout.stage_xpus(0)[0], layout.stage_xpus(1)[0])
        pipeline += 2 * (p - 1) * (latency + activation / bandwidth)
    gradients = 0.0
    if par.dp > 1:
        group = next(g for g in layout.groups("dp") if g[0] in layout.stage_xpus(0))
        latency, bandwidth = cluster.path(group[0], group[1])
        parameters = max(sum(layers[s]) for s in range(p)) * (attn.parameters + mlp.parameters)
        gradients = 2 * (par.dp - 1) * latency + 2 * (par.dp - 1) / par.dp * parameters * sizes.gradient / bandwidth
    optimizer = spec.optimizer_flops_per_parameter * max(sum(layers[s]) for s in range(p)) \
        * (attn.parameters + mlp.parameters) / min(cluster.slowest(s, spec.precision)[0] for s in range(p))
    return pipeline + gradients + optimizer


def _time(flops: float, size: float, peak: float, bandwidth: float) -> float:
    return max(flops / peak, size / bandwidth)


def _recompute(mode: str, blocks: tuple[BlockCost, ...], peak: float, bandwidth: float, allreduce: float) -> float:
    if mode == "full":
        return sum(_time(b.fwd_flops, b.fwd_bytes, peak, bandwidth) + allreduce for b in blocks)
    if mode == "selective":
        return sum(b.core_flops / peak for b in blocks)
    return 0.0


def rank_correlation(first: list[float], second: list[float]) -> float:
    """Spearman's rank correlation of two equally long lists (ties get their mean rank)."""
    if len(first) != len(second) or len(first) < 2:
        raise ConfigError("rank correlation: needs two lists of the same length, at least 2")

    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                result[order[k]] = (i + j) / 2
            i = j + 1
        return result

    a, b = ranks(first), ranks(second)
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b))
    norm = math.sqrt(sum((x - mean_a) ** 2 for x in a) * sum((y - mean_b) ** 2 for y in b))
    return cov / norm if norm else 1.0
