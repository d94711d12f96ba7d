"""Planning: the best way to train a model on a given cluster (`hcsim plan`).

:func:`candidates` enumerates the valid configurations (tp, pp, dp, micro-batch,
schedule with virtual stages, recomputation, ZeRO stage 0-3 when dp > 1, and on
mixed clusters an even or a speed-proportional layer split), :func:`fits` keeps
those whose every pipeline stage fits in its XPUs' local memory (saying why the
others do not), and :func:`estimate` gives each an iteration time from closed
forms that follow the engine's own rules: a block takes max(FLOP / peak, bytes /
memory bandwidth); collectives are ring closed forms on the latency α and
bandwidth B of one ring step with every group of their axis running at once
(each link's bandwidth shared by the steps that cross it: the only contention
the estimate counts); a pipeline of per-micro-batch stage times τ_s takes
Σ τ + (m - 1)·max τ (the bubble shrinks by v with interleaving, and by the
weight-gradient passes with ZB-H1); the gradient communication over each DP
group and the optimizer step follow. With ZeRO (:mod:`hcsim.workload.zero`)
over N_d = dp ranks, for Ψ parameters of w and g bytes each (g as the graph
reduces them: 4 in BF16, Megatron-LM's FP32 main gradients):

- stage 0: all-reduce 2(N_d - 1)α + 2(N_d - 1)/N_d·gΨ/B, then the step on Ψ;
- stages 1-2: reduce-scatter (N_d - 1)α + (N_d - 1)/N_d·gΨ/B, the step on
  Ψ/N_d, all-gather (N_d - 1)α + (N_d - 1)/N_d·wΨ/B (the same bytes as the
  all-reduce when w = g; stage 2 differs from 1 in memory only); overlapped
  with the next forward pass unit by unit (``training.overlap_param_gather``,
  the default), only the first unit's gather shows; the gradients then go
  bucket by bucket during the last backward pass (``training.overlap_grad_reduce``):
  each bucket's ring starts when its decoders' backward is done and the bucket
  before it is reduced, and only what runs past the backward pass counts;
- stage 3: the reduce-scatter and the step on Ψ/N_d, no all-gather after it;
  instead every unit (a decoder, per micro-batch, in the forward and again in
  the backward pass) is preceded by an all-gather of its weights,
  γ = (N_d - 1)α + (N_d - 1)/N_d·wΨ_unit/B, one unit ahead: a unit of time c
  paces at max(c, γ), and the iteration's first gather is exposed.

The optimizer step takes max(FLOP / peak, bytes / memory bandwidth) of its
shard (dp x cp ranks under ZeRO 1), or under the kernel model its kernels'
time, as the simulations time it. The top candidates are then simulated with contention (hcsim.cli.plan)
and the two rankings compared.

Pure: specs and graphs in, plain data out; no SimGrid.
"""

from __future__ import annotations

import math
import statistics
import weakref
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import product

import networkx as nx

from hcsim.engine.collectives import channel_ring_orders, server_groups
from hcsim.errors import ConfigError
from hcsim.platform.devices import peak_flops
from hcsim.platform.routes import RouteSearch, route_bandwidth, route_latency
from hcsim.workload.hybrid import (BlockCost, Parallelism, block_cost, block_costs, checkpoint_stops_early,
                                   decoder_kernels, grad_bucket_size, in_flight, model_ends, optimizer_kernels,
                                   optimizer_traffic, overlaps_grad_reduce, overlaps_param_gather, overlaps_tp_comm,
                                   pipeline_send, stage_layers, tp_gather_share)
from hcsim.workload.ops import BlockOps, checkpoint_recompute
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.memory import framework_reserve, stage_memory
from hcsim.workload.placement import out_of_memory
from hcsim.workload.schedules import stage_order
from hcsim.workload.spec import WorkloadSpec
from hcsim.workload.split import largest_remainder
from hcsim.workload.transformer import decoder_layer, embedding, lm_head
from hcsim.workload.zero import ZERO_STAGES

__all__ = ["Candidate", "candidates", "fits", "stage_needs", "zero2_twins", "estimate", "rank_correlation", "Search",
           "MIN_RANKED_FOR_CORRELATION"]

MICRO_BATCHES = (1, 2, 4, 8)
MIN_RANKED_FOR_CORRELATION = 5  # below 5 pairs Spearman's rho takes so few values that it says little
RECOMPUTES = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One configuration: the parallelism (with its ZeRO stage), and whether its layer split follows the
    stages' speed."""

    parallelism: Parallelism
    split: str = "even"  # layer split: even | proportional
    batch: str = "even"  # batch split: even | proportional (parallelism.batch_split holds the counts)

    def settings(self) -> dict:
        """Scenario keys that run this candidate."""
        par = self.parallelism
        keys = {"tp": par.tp, "pp": par.pp, "micro_batch": par.micro_batch, "global_batch": par.global_batch,
                "schedule": par.schedule, "virtual_stages": par.virtual_stages, "recompute": par.recompute,
                "zero": par.zero}
        if par.cp > 1:
            keys["cp"] = par.cp
        if par.layer_split is not None:
            keys["layer_split"] = list(par.layer_split)
        if self.batch != "even":
            keys["batch_split"] = self.batch  # resolved by the run with the rule the counts here follow
        return keys

    def columns(self) -> dict:
        """One column per setting, as plan.csv writes them: tp, pp, dp, cp, ep, micro_batch, schedule,
        virtual_stages, recompute, zero, offload, layer_split ("even" or the decoders per stage joined with
        "+"), batch_split ("even" or "proportional")."""
        par = self.parallelism
        return {"tp": par.tp, "pp": par.pp, "dp": par.dp, "cp": par.cp, "ep": par.ep, "micro_batch": par.micro_batch,
                "micro_batches": par.micro_batches, "schedule": par.schedule, "virtual_stages": par.virtual_stages,
                "recompute": par.recompute, "zero": par.zero, "offload": par.offload,
                "layer_split": "+".join(map(str, par.layer_split)) if par.layer_split else "even",
                "batch_split": self.batch}

    def label(self) -> str:
        par = self.parallelism
        schedule = par.schedule + (f" v{par.virtual_stages}" if par.virtual_stages > 1 else "")
        zero = f" ZeRO-{par.zero}" if par.zero else ""
        split = f", split {'/'.join(map(str, par.layer_split))}" if par.layer_split else ""
        if par.batch_split:
            counts = Counter(par.batch_split)
            split += ", batch " + "/".join(f"{m}x{n}" for m, n in sorted(counts.items(), reverse=True))
        return (f"tp{par.tp} pp{par.pp} dp{par.dp}" + (f" cp{par.cp}" if par.cp > 1 else "")
                + f" mb{par.micro_batch} {schedule} recompute {par.recompute}"
                + zero + split)


def candidates(spec: WorkloadSpec, layout_xpus: list[str], global_batch: int, server_size: int,
               stage_speeds=None, zero_stages: tuple[int, ...] = ZERO_STAGES, replica_speeds=None) -> list[Candidate]:
    """Every valid configuration of `spec` over the XPUs, with TP groups inside a server of `server_size`.

    `stage_speeds(tp, pp)`, if given, returns each stage's relative speed: on a mixed cluster a speed-proportional
    layer split is tried beside the even one. `replica_speeds(tp, pp)`, if given, returns each DP replica's
    speed: where they differ, a batch split in proportion to them (largest remainders, as the run resolves
    ``batch_split: proportional``) is tried too, with ZeRO 0-2 and the schedules that can run its counts.
    Each of `zero_stages` is tried when dp > 1 (with dp = 1 ZeRO shards nothing: only stage 0)."""
    model, n = spec.model, len(layout_xpus)
    found = []
    # context parallelism needs flash attention and the sequence in 2 x cp chunks (hcsim.workload.context)
    contexts = [cp for cp in _powers(min(8, n)) if cp == 1 or (spec.attention == "flash"
                                                               and model.sequence % (2 * cp) == 0)]
    # a PyTorch inventory trains as its script does: checkpointed or not by the workload's own recomputation
    recomputes = RECOMPUTES if spec.inventory.fused else (spec.recomputation,)
    for tp, pp, cp, mb, recompute in product(_powers(min(server_size, n)), range(1, model.decoders + 1), contexts,
                                             MICRO_BATCHES, recomputes):
        if n % (tp * pp * cp) or model.heads % tp or (model.kv_heads or model.heads) % tp \
                or (cp > 1 and recompute == "selective"):
            continue
        dp = n // (tp * pp * cp)
        if global_batch % (dp * mb):
            continue
        m = global_batch // (dp * mb)
        schedules = [("1f1b", 1)] + ([("zb-h1", 1)] if pp > 1 and cp == 1 else []) \
            + ([("interleaved", 2)] if pp > 1 and m % pp == 0 and model.decoders % (2 * pp) == 0 else [])
        for schedule, v in schedules:
            splits = [None]
            if stage_speeds is not None and pp > 1 and v == 1:
                proportional = largest_remainder(model.decoders, stage_speeds(tp, pp))  # as layer_split: proportional
                if min(proportional) >= 1 and proportional != (model.decoders // pp,) * pp:
                    splits.append(proportional)
            batches = [None] + _batch_split(replica_speeds, tp, pp, dp, m)
            for split, zero, batch in product(splits, zero_stages if dp > 1 else (0,), batches):
                if split is None and model.decoders % (pp * v):
                    continue
                try:
                    par = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=mb, global_batch=global_batch,
                                      schedule=schedule, virtual_stages=v, recompute=recompute, layer_split=split,
                                      zero=zero, batch_split=batch)
                    par.check_model(spec)
                except ConfigError:  # an uneven batch split with ZeRO-3, counts the schedule cannot run, or a
                    continue  # split the workload's framework does not run (a PyTorch inventory: data parallel only)
                found.append(Candidate(parallelism=par, split="proportional" if split else "even",
                                       batch="proportional" if batch else "even"))
    return found


def _batch_split(replica_speeds, tp: int, pp: int, dp: int, m: int) -> list[tuple[int, ...]]:
    """[the proportional batch split of m·dp micro-batches] where the replicas' speeds differ and it gives
    every replica one, else []."""
    if replica_speeds is None or dp == 1:
        return []
    speeds = replica_speeds(tp, pp)
    counts = largest_remainder(m * dp, speeds)
    return [counts] if len(set(speeds)) > 1 and min(counts) >= 1 else []


def _powers(limit: int) -> list[int]:
    return [2 ** k for k in range(int(math.log2(limit)) + 1)]


def zero2_twins(fitting: list[Candidate]) -> set[Candidate]:
    """The ZeRO-2 candidates of `fitting` whose ZeRO-1 twin (the same plan at stage 1) is in `fitting` too:
    stage 2 differs from 1 in memory only (it frees the unsharded gradients), so both run the same
    communication and optimizer step in the same time, and ranking or simulating both tells nothing new."""
    present = set(fitting)
    return {c for c in fitting if c.parallelism.zero == 2
            and replace(c, parallelism=replace(c.parallelism, zero=1)) in present}


_KNOWN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # platform -> what the estimates routed on it


@dataclass(frozen=True)
class _Cluster:
    """What the estimate needs of a platform: per stage its slowest XPU, and the links between XPUs."""

    platform: nx.Graph
    layout: ParallelLayout
    model: object = None  # the kernel model (ComputeModel) the simulations run: NCCL's achieved link bandwidth

    def slowest(self, stage: int, precision: str, members: frozenset[str] | None = None) -> tuple[float, float]:
        """(peak FLOP/s, HBM B/s) of the stage's slowest XPU (of those in `members`, when given)."""
        peak, bandwidth, _ = self.slowest_device(stage, precision, members)
        return peak, bandwidth

    def slowest_device(self, stage: int, precision: str, members: frozenset[str] | None = None
                       ) -> tuple[float, float, str]:
        """(peak FLOP/s, HBM B/s, device name) of the stage's slowest XPU (of `members`, when given)."""
        nodes = self.platform.nodes
        xpus = [x for x in self.layout.stage_xpus(stage) if members is None or x in members]
        xpu = min(xpus, key=lambda x: peak_flops(nodes[x], precision))
        return (peak_flops(nodes[xpu], precision), self.platform.edges[nodes[xpu]["local_memory"], xpu]["bandwidth"],
                nodes[xpu]["device"])

    def known(self) -> dict:
        """The route search, routes and rings of this platform, kept while the platform lives."""
        if self.platform not in _KNOWN:
            _KNOWN[self.platform] = {"search": RouteSearch(self.platform), "routes": {}, "rings": {}}
        return _KNOWN[self.platform]

    def route(self, src: str, dst: str) -> list[str]:
        """The least-latency route src -> dst (searched once per platform: the candidates of one plan ask for
        the same pairs)."""
        known = self.known()
        if (src, dst) not in known["routes"]:
            known["routes"][src, dst] = known["search"](src, [dst])[dst]
        return known["routes"][src, dst]

    def path(self, src: str, dst: str) -> tuple[float, float]:
        """(latency s, bottleneck B/s) of the least-latency route src -> dst."""
        route = self.route(src, dst)
        return route_latency(self.platform, route), route_bandwidth(self.platform, route)

    def ring(self, axis: str, nccl: bool = False) -> tuple[float, float]:
        """(latency s, B/s) of one step of the rings over the groups of `axis`, every group of the layout at
        once (all stages' DP groups gather together with ZeRO-3): each rank sends to the next along its route,
        a link's bandwidth (per direction) is shared by the steps that cross it, and the slowest step paces
        the ring. `nccl`: NCCL's channel rings, as the kernel model's graphs run them
        (hcsim.engine.collectives.channel_ring_orders): a group of g ranks on each of several servers runs g
        rings side by side, each with 1/g of every step and crossing between servers on its own rail, so the
        step crosses over g NICs at once; each step at the kernel model's achieved fraction of its route's
        bandwidth (`model`'s link factors, as the engine moves a transfer). (0, inf) when the groups are single
        XPUs."""
        rings = self.known()
        factors = None if self.model is None else tuple(sorted(
            (kind, link.bandwidth_factor) for kind, link in self.model.links.items()))  # what a ring follows from
        key = (self.layout.xpus, tuple(sorted(self.layout.sizes.items())), axis, nccl, factors)
        if key not in rings["rings"]:
            steps = [(self.route(a, b), share) for group in self.layout.groups(axis) if len(group) > 1
                     for order, share in self._lanes(group, nccl) for a, b in zip(order, order[1:] + order[:1])]
            load: Counter = Counter()
            for route, share in steps:
                if nccl and self.model is not None:  # NCCL below line rate: as if it moved share / factor
                    share /= self.model.route_link(self.platform, route).bandwidth_factor
                for link in zip(route, route[1:]):
                    load[link] += share
            edges = self.platform.edges
            rings["rings"][key] = (max((route_latency(self.platform, r) for r, _ in steps), default=0.0),
                                   min((edges[link]["bandwidth"] / n for link, n in load.items()), default=math.inf))
        return rings["rings"][key]

    def _lanes(self, group: tuple[str, ...], nccl: bool) -> list[tuple[list[str], float]]:
        """(ring order, the share of a step it carries) of each ring `group` runs."""
        orders = channel_ring_orders(server_groups(self.platform, group)) if nccl else [list(range(len(group)))]
        return [([group[r] for r in order], 1.0 / len(orders)) for order in orders]


def cluster_layout(xpus: list[str], par: Parallelism) -> ParallelLayout:
    return ParallelLayout(xpus, {"tp": par.tp, "pp": par.pp, "dp": par.dp, "cp": par.cp})


def fits(spec: WorkloadSpec, candidate: Candidate, platform: nx.Graph, xpus: list[str]) -> str | None:
    """None when every stage fits its XPUs' local memory, else why not (stage, bytes needed, bytes held, ZeRO
    stage): the rule and words of :func:`~hcsim.workload.placement.out_of_memory`, which a simulation on a
    platform that does not spill applies too.

    A stage's XPU holds :func:`~hcsim.workload.memory.stage_memory` (model state sharded over its DP group by
    the ZeRO stage, activations of the micro-batches in flight) and with ZeRO-3 two gathered units (the one
    running and the next: twice the largest unit's weights), as the engine places them, plus the process's
    own :func:`~hcsim.workload.memory.framework_reserve`, as the simulation's out-of-memory rule counts it."""
    nodes = platform.nodes
    for stage, need, smallest in stage_needs(spec, candidate, platform, xpus):
        shortfall = out_of_memory(stage, need, nodes[nodes[smallest]["local_memory"]]["capacity"],
                                  nodes[smallest]["device"])
        if shortfall:
            return f"{shortfall}, at ZeRO stage {candidate.parallelism.zero}"
    return None


def stage_needs(spec: WorkloadSpec, candidate: Candidate, platform: nx.Graph, xpus: list[str]
                ) -> list[tuple[int, float, str]]:
    """Per pipeline stage: (stage, bytes each of its XPUs holds, its XPU with the least local memory), as
    :func:`fits` counts them."""
    par = candidate.parallelism
    layout = cluster_layout(xpus, par)
    layers = stage_layers(spec, par)
    nodes = platform.nodes
    needs = []
    for stage in range(par.pp):
        first, last = stage == 0, stage == par.pp - 1
        most = max(par.batch_split) if par.batch_split else par.micro_batches  # the replica that holds most
        flight = _in_flight(par.schedule, par.pp, most, stage, par.virtual_stages)
        memory = stage_memory(spec.model, layers=sum(layers[stage]), first=first, last=last, in_flight=flight,
                              micro_batch=par.micro_batch, sequence=spec.model.sequence // par.cp, tp=par.tp,
                              sequence_parallel=par.sequence_parallel,
                              precision=spec.precision, attention=spec.attention, optimizer=spec.optimizer,
                              recompute=par.recompute, dp=par.optimizer_shards, zero_stage=par.zero,
                              gradient=spec.main_gradient)
        need = memory.total + framework_reserve(memory.activations)  # the CUDA context, workspaces, allocator
        if par.zero == 3 and par.dp > 1:
            need += 2 * max(_unit_parameters(spec, par.tp, first, last)) * spec.sizes.weight
        smallest = min(layout.stage_xpus(stage), key=lambda x: nodes[nodes[x]["local_memory"]]["capacity"])
        needs.append((stage, need, smallest))
    return needs


@lru_cache(maxsize=4096)
def _in_flight(schedule: str, stages: int, micro_batches: int, stage: int, chunks: int) -> float:
    """Micro-batches whose activations `stage` holds at its peak, per chunk (the engine's count)."""
    order = stage_order(schedule, stages=stages, micro_batches=micro_batches, stage=stage, chunks=chunks)
    return in_flight(order) / chunks


def _unit_parameters(spec: WorkloadSpec, tp: int, first: bool, last: bool) -> list[float]:
    """Parameters per TP rank of each kind of unit ZeRO-3 gathers on a stage: a decoder, and the embedding on
    the first stage and the head on the last."""
    keywords = dict(tp=tp, precision=spec.precision, attention=spec.attention)
    units = [decoder_layer(spec.model, **keywords).parameters]
    if spec.model.vocabulary:
        units += [embedding(spec.model, **keywords).parameters] * first
        units += [lm_head(spec.model, tied_copy=not first, **keywords).parameters] * last
    return units


def estimate(spec: WorkloadSpec, candidate: Candidate, platform: nx.Graph, xpus: list[str],
             kernel_model=None) -> float:
    """Iteration time (s) of `candidate` by the closed forms of the module docstring (no contention).

    `kernel_model`: the :class:`hcsim.engine.compute_model.ComputeModel` the simulations time kernels with
    (None: they run the peak model); a block is then its kernels' time on the stage's slowest device, as the
    engine times it, instead of max(FLOP / peak, bytes / bandwidth)."""
    par = candidate.parallelism
    cluster = _Cluster(platform, cluster_layout(xpus, par), kernel_model)
    attn, mlp = block_costs(spec, par.micro_batch, par.tp, par.sequence_parallel, cp=par.cp)
    layers = stage_layers(spec, par)
    sizes = spec.sizes
    activation = par.micro_batch * spec.model.sequence // par.cp * spec.model.hidden * sizes.activation
    layout = cluster.layout
    nccl = kernel_model is not None  # the kernel model's graphs run NCCL's channel rings (Megatron-LM's comms)
    tp_ring = cluster.ring("tp", nccl)
    # a block's TP collectives: an all-reduce, or (SP) a reduce-scatter and an all-gather of tp_gather_share of it
    gathered = tp_gather_share(spec) if par.sequence_parallel else 1.0

    def tp_collectives(size: float) -> float:
        return _ring(par.tp, 1, size, *tp_ring) + _ring(par.tp, 1, size * gathered, *tp_ring)

    allreduce, tp_hidden = tp_collectives(activation), 0.0
    if overlaps_tp_comm(spec, par):  # one chunk exposed, the rest beside the block (the graph's rule)
        allreduce = tp_collectives(activation / par.tp)
        tp_hidden = tp_collectives(activation * (par.tp - 1) / par.tp)
    dp_latency, dp_bandwidth = cluster.ring("dp", nccl)
    decoder = attn.parameters + mlp.parameters  # per TP rank
    attn_ops, mlp_ops = decoder_kernels(spec, par) if kernel_model is not None else (None, None)
    attn = _Block.of(attn, attn_ops, kernel_model)
    mlp = _Block.of(mlp, mlp_ops, kernel_model, checkpointed=checkpoint_stops_early(spec))
    gather = _ring(par.dp, 1, decoder * sizes.weight, dp_latency, dp_bandwidth) if par.zero == 3 else 0.0
    overlapped = overlaps_param_gather(spec, par)
    ends = tuple(_Block.of(block_cost(block.ops), ops, kernel_model) for block, ops in model_ends(spec, par) or ())
    first = ends[0].cost.parameters if ends else decoder
    first_gathers = (_ring(par.dp, 1, first * sizes.weight, dp_latency, dp_bandwidth),
                     _ring(par.dp, 1, decoder * sizes.weight, dp_latency, dp_bandwidth)) if overlapped else None
    decoder_costs = _DecoderCosts(attn, mlp, allreduce, gather, activation, first_gathers, tp_hidden, ends)
    p = par.pp
    parameters = [sum(layers[s]) * decoder + sum(end.cost.parameters for end in decoder_costs.ends_on(s, p))
                  for s in range(p)]
    if kernel_model is not None:  # the GEMMs' clock under the power limit: the job's on each device
        decoder_costs = decoder_costs.clocked(_gemm_clocks(spec, par, cluster, decoder_costs, layers, parameters))
    pipeline = max(_pipeline(spec, par, cluster, layers, decoder_costs, m, members)
                   for m, members in _replica_classes(par, layout))
    gradients = 0.0
    if par.dp * par.cp > 1:  # all-reduce (ZeRO 0), reduce-scatter + all-gather (1-2), reduce-scatter (3), over
        # the dp x cp ranks that hold the same parameters (CP's K/V exchange hides behind the attention: not here)
        if par.dp == 1:
            dp_latency, dp_bandwidth = cluster.ring("cp", nccl)
        reduction = (dp_latency, dp_bandwidth, 1 if par.zero else 2)
        if overlaps_grad_reduce(spec, par):  # bucket by bucket in the last backward pass: what runs past it
            gradients = max(_gradient_tail(spec, par, cluster, decoder_costs, layers, s, reduction)
                            for s in range(p))
        else:
            gradients = _ring(par.dp * par.cp, reduction[2], max(parameters) * spec.main_sizes.gradient, dp_latency,
                              dp_bandwidth)
        if par.zero in (1, 2) and not overlapped:  # after the step, exposed
            gradients += _ring(par.dp, 1, max(parameters) * sizes.weight, dp_latency, dp_bandwidth)
    optimizer = max(_optimizer(spec, par, cluster, s, parameters[s], sum(layers[s])) for s in range(p))
    return pipeline + gradients + optimizer


def _optimizer(spec: WorkloadSpec, par: Parallelism, cluster: _Cluster, stage: int, parameters: float, decoders: int) -> float:
    """The optimizer step of a rank of `stage` holding `parameters` of `decoders` decoders, as the simulations
    time it: its kernels under the kernel model, else max(FLOP / peak, bytes / bandwidth) over its shard."""
    peak, bandwidth, device = cluster.slowest_device(stage, spec.precision)
    if cluster.model is not None:
        return cluster.model.time(optimizer_kernels(spec, par, parameters, decoders), device, peak, bandwidth)
    shard = parameters / par.optimizer_shards
    return _time(spec.optimizer_flops_per_parameter * shard, optimizer_traffic(spec) * shard, peak, bandwidth)


def _replica_classes(par: Parallelism, layout: ParallelLayout) -> list[tuple[int, frozenset[str] | None]]:
    """(micro-batches, the XPUs of the replicas that run that many; None: every XPU) per class of replicas."""
    return [(m, None if coordinates is None else
             frozenset(x for x in layout.xpus if layout.coordinates(x)["dp"] in coordinates))
            for m, coordinates in par.replica_classes()]


@dataclass(frozen=True)
class _DecoderCosts:
    """A decoder's costs per micro-batch on one TP rank: its two blocks, the TP all-reduce after each block
    (s), the ZeRO-3 gather of its weights (s; 0 without ZeRO-3) and the activation a stage sends on (bytes)."""

    attn: "_Block"
    mlp: "_Block"
    allreduce: float
    gather: float
    activation: float
    # ZeRO 1-2 overlapped: the gathers (s) of the first unit and of a decoder before the first forward pass
    first_gathers: tuple[float, float] | None = None
    tp_hidden: float = 0.0  # tp_comm_overlap: the part of the TP collectives that runs beside the block (s)
    ends: tuple = ()  # the embedding's and the head's _Block (none without a vocabulary)

    def clocked(self, clocks: tuple[tuple[str, float], ...]) -> "_DecoderCosts":
        """These costs with every block's GEMMs at `clocks` (device, clock)."""
        return replace(self, attn=replace(self.attn, clocks=clocks), mlp=replace(self.mlp, clocks=clocks),
                       ends=tuple(replace(end, clocks=clocks) for end in self.ends))

    def ends_on(self, stage: int, stages: int) -> list["_Block"]:
        """The model's ends `stage` of `stages` holds: the embedding on the first, the head on the last."""
        return [end for end, here in zip(self.ends, (stage == 0, stage == stages - 1)) if here]

    def end_passes(self, stage: int, stages: int, on: tuple[float, float, str], split: bool
                   ) -> tuple[float, float, float]:
        """(forward, backward, weight gradients) s of the ends `stage` runs per micro-batch: the backward with its
        weight gradients (0 then) unless `split` (ZB-H1)."""
        held = self.ends_on(stage, stages)
        forward = sum(end.forward(*on) for end in held)
        if split:
            return forward, sum(end.input_grad(*on) for end in held), sum(end.weight_grad(*on) for end in held)
        return forward, sum(end.backward(*on) for end in held), 0.0

    def tp_after(self, block: float) -> float:
        """Seconds the TP collectives add after a block of `block` s: the exposed part (all of them unless
        overlapped) and whatever of the overlapped part the block does not hide."""
        return self.allreduce + max(0.0, self.tp_hidden - block)

    def with_tp(self, block: float) -> float:
        """Seconds of a block of `block` s and the TP collectives after it."""
        return block + self.tp_after(block)


def _pipeline(spec: WorkloadSpec, par: Parallelism, cluster: "_Cluster", layers, costs: _DecoderCosts, m: int,
              members: frozenset[str] | None) -> float:
    """Seconds the pipeline of the replicas of `members` (None: every replica) takes for its `m` micro-batches:
    each stage paced by its slowest XPU among them."""
    attn, mlp, gather = costs.attn, costs.mlp, costs.gather
    decoder_units, decoder_forward = [], []  # per stage, a decoder's backward and forward unit
    zero_bubble = par.schedule == "zb-h1"
    tau, forward, backward_input, weight = [], [], [], []
    for stage in range(par.pp):
        on = cluster.slowest_device(stage, spec.precision, members)
        decoders = sum(layers[stage])
        f = sum(costs.with_tp(b.forward(*on)) for b in (attn, mlp))
        b_in, w = _decoder_backward(par, costs, on)
        # ZeRO-3: a decoder's forward and its backward (with the weight gradients unless ZB-H1 defers them)
        # wait for the gather of its weights, one decoder ahead: each paces at max(its time, the gather)
        backward_unit = b_in + (0.0 if zero_bubble else w)
        decoder_units.append(backward_unit)
        if gather:
            f, b_in = max(f, gather), max(backward_unit, gather) - (0.0 if zero_bubble else w)
        decoder_forward.append(f)
        e_f, e_b, e_w = costs.end_passes(stage, par.pp, on, zero_bubble)
        forward.append(decoders * f + e_f)
        backward_input.append(decoders * b_in + e_b)
        weight.append(decoders * w + e_w)
        tau.append(forward[-1] + backward_input[-1] + weight[-1])
    p = par.pp
    slowest = max(tau)
    bubble = sum(tau) - slowest
    if par.schedule == "interleaved":
        bubble /= par.virtual_stages
    elif zero_bubble:  # the weight gradients of min(m, p) - 1 micro-batches fill the drain: (p-1)(F+B) less
        # (min(m, p) - 1)·W on uniform stages, Qi et al.'s (p-1)(F+B-W) from m = p on (the engine's order)
        filled = (min(m, p) - 1) / (p - 1) if p > 1 else 0.0
        paced = max(range(p), key=lambda s: forward[s] + backward_input[s] - weight[s])
        bubble = max(0.0, sum(forward[s] + backward_input[s] - filled * weight[s] for s in range(p) if s != paced))
    pipeline = m * slowest + bubble
    if p > 1:
        layout = cluster.layout
        latency, bandwidth = cluster.path(layout.stage_xpus(0)[0], layout.stage_xpus(1)[0])
        share, _ = pipeline_send(spec, replace(par, megatron_comm=cluster.model is not None))  # as the run sends
        pipeline += 2 * (p - 1) * (latency + share * costs.activation / bandwidth)
    if gather:  # the iteration's first gather is exposed; its last decoder (stage 0's) waits for no next one
        pipeline += gather - (max(decoder_units[0], gather) - decoder_units[0])
    if costs.first_gathers:  # ZeRO 1-2: stage 0's first forward waits for the first gather, then paces each
        # decoder at max(its forward, a decoder's gather), the gathers one after another
        first, per_decoder = costs.first_gathers
        decoders = sum(layers[0])
        f = decoder_forward[0]
        pipeline += first + (decoders - (0 if spec.model.vocabulary else 1)) * (max(f, per_decoder) - f)
    return pipeline


def _decoder_backward(par: Parallelism, costs: _DecoderCosts, on: tuple[float, float, str]) -> tuple[float, float]:
    """(seconds of a decoder's backward pass with any recomputation and the TP collectives, but under ZB-H1 its
    weight gradients; seconds of the weight gradients ZB-H1 defers, 0 otherwise) on the device `on` (peak,
    bandwidth, name)."""
    if par.schedule != "zb-h1":  # the graph's one backward vertex a block (what overlapped TP chunks run beside),
        # the weight gradients and a selective recomputation in it
        selective = par.recompute == "selective"
        passes = [b.backward(*on, selective) for b in (costs.attn, costs.mlp)]
        return sum(t + costs.tp_after(t) for t in passes) + _recompute(par.recompute, costs, on, selective), 0.0
    grads = [(b.input_grad(*on), b.weight_grad(*on)) for b in (costs.attn, costs.mlp)]
    b_in = sum(i + costs.tp_after(i) for i, _ in grads) + _recompute(par.recompute, costs, on)
    return b_in, sum(w for _, w in grads)


def _gradient_tail(spec: WorkloadSpec, par: Parallelism, cluster: "_Cluster", costs: _DecoderCosts, layers,
                   stage: int, reduction: tuple[float, float, int]) -> float:
    """Seconds the bucketed gradient reduction of `stage`'s first chunk runs past its last backward pass (the
    graph's buckets, hcsim.workload.hybrid: whole units from the last back, each reduced when its units' backward
    is done and the bucket before it reduced; the head's and the embedding's backward passes as the pipeline's).
    `reduction`: the DP ring's latency, bandwidth and phases (1 reduce-scatter, 2 all-reduce)."""
    latency, bandwidth, phases = reduction
    on = cluster.slowest_device(stage, spec.precision, None)
    decoder = costs.attn.cost.parameters + costs.mlp.cost.parameters
    first, last = costs.ends or (None, None)

    def end(block: _Block) -> tuple[float, float]:
        return block.cost.parameters, block.backward(*on)

    head = last is not None and stage == par.pp - 1 and par.virtual_stages == 1
    units = ([end(last)] if head else []) + [(decoder, sum(_decoder_backward(par, costs, on)))] * layers[stage][0] \
        + ([end(first)] if first is not None and stage == 0 else [])
    size, ranks = grad_bucket_size(par), par.dp * par.cp
    ready = reduced = held = 0.0
    for i, (parameters, seconds) in enumerate(units):
        ready, held = ready + seconds, held + parameters
        if held >= size or i == len(units) - 1:
            reduced = max(reduced, ready) + _ring(ranks, phases, held * spec.main_sizes.gradient, latency, bandwidth)
            held = 0.0
    return max(0.0, reduced - ready)


def _ring(n: int, phases: int, size: float, latency: float, bandwidth: float) -> float:
    """`phases` ring passes (reduce-scatter or all-gather: 1, all-reduce: 2) of `size` bytes over `n` ranks:
    phases·((n - 1)·latency + (n - 1)/n·size/bandwidth)."""
    return phases * (n - 1) * (latency + size / (n * bandwidth)) if n > 1 else 0.0


def _time(flops: float, size: float, peak: float, bandwidth: float) -> float:
    return max(flops / peak, size / bandwidth)


@dataclass(frozen=True)
class _Block:
    """One block's passes timed as the simulations time them: by its kernels under the kernel model (a pass
    with kernels), else max(FLOP / peak, bytes / bandwidth). The backward kernels are split once, here, into
    the weight-gradient GEMMs (what ZB-H1 defers) and the rest."""

    cost: BlockCost
    model: object = None  # a hcsim.engine.compute_model.ComputeModel, or None: the closed forms
    forward_ops: tuple = ()
    backward_ops: tuple = ()  # the backward pass but its weight gradients
    weight_grad_ops: tuple = ()
    core_ops: tuple = ()
    timed_backward: bool = False  # the backward pass has kernels (either part may be empty)
    all_backward_ops: tuple = ()  # the backward kernels in the order the framework runs them
    recompute_ops: tuple = ()  # what full recomputation runs again, where not the whole forward pass
    clocks: tuple = ()  # (device, the compute-bound GEMMs' clock under its power limit): _gemm_clocks; else 1

    @classmethod
    def of(cls, cost: BlockCost, ops: BlockOps | None = None, model=None, checkpointed: bool = False) -> "_Block":
        """`checkpointed`: a layer's last block under torch.utils.checkpoint, whose recomputation stops before its
        last GEMM (:func:`hcsim.workload.ops.checkpoint_recompute`, as the graph runs it)."""
        if model is None or ops is None:
            return cls(cost)
        wgrad = tuple(op for op in ops.backward if op.name.endswith(".wgrad"))
        rest = tuple(op for op in ops.backward if not op.name.endswith(".wgrad"))
        again = checkpoint_recompute(ops.forward) if checkpointed else ()
        return cls(cost, model, ops.forward, rest, wgrad, ops.core, bool(ops.backward), ops.backward, again)

    def vertices(self, par: Parallelism, end: bool = False) -> list[tuple]:
        """The kernels of each compute vertex the block's passes make per micro-batch, as the graph runs them:
        forward, a full recomputation's forward again, the backward (a selective recomputation's core in it) or
        ZB-H1's two; an end (`end`: the embedding, the head) is not recomputed. None without the kernel model."""
        if self.model is None:
            return []
        passes = [self.forward_ops]
        if par.recompute == "full" and not end:
            passes.append(self._recompute_ops())
        if par.schedule == "zb-h1":
            passes += [self.backward_ops, self.weight_grad_ops]
        elif self.timed_backward:
            passes.append(self._backward_ops(par.recompute == "selective" and not end))
        return [ops for ops in passes if ops]

    def _recompute_ops(self) -> tuple:
        """The kernels full recomputation runs again: the forward pass, or where it stops early its part."""
        return self.recompute_ops or self.forward_ops

    def _backward_ops(self, selective: bool) -> tuple:
        """The backward vertex's kernels: after the attention core's recomputation where `selective`."""
        return (self.core_ops if selective else ()) + self.all_backward_ops

    def _kernels(self, ops, peak: float, bandwidth: float, device: str) -> float:
        clock = next((c for d, c in self.clocks if d == device), 1.0)
        return self.model.time(ops, device, peak, bandwidth, clock=clock) if ops else 0.0

    def forward(self, peak: float, bandwidth: float, device: str) -> float:
        if self.forward_ops:
            return self._kernels(self.forward_ops, peak, bandwidth, device)
        return _time(self.cost.fwd_flops, self.cost.fwd_bytes, peak, bandwidth)

    def input_grad(self, peak: float, bandwidth: float, device: str) -> float:
        """The backward pass but its weight-gradient GEMMs (what ZB-H1 keeps on the critical path)."""
        if self.timed_backward:
            return self._kernels(self.backward_ops, peak, bandwidth, device)
        return _time(self.cost.input_grad_flops, self.cost.bwd_bytes / 2, peak, bandwidth)

    def weight_grad(self, peak: float, bandwidth: float, device: str) -> float:
        if self.timed_backward:
            return self._kernels(self.weight_grad_ops, peak, bandwidth, device)
        return _time(self.cost.weight_grad_flops, self.cost.bwd_bytes / 2, peak, bandwidth)

    def recomputed(self, peak: float, bandwidth: float, device: str) -> float:
        """The forward pass full recomputation runs again."""
        if self.recompute_ops:
            return self._kernels(self._recompute_ops(), peak, bandwidth, device)
        return self.forward(peak, bandwidth, device)

    def backward(self, peak: float, bandwidth: float, device: str, selective: bool = False) -> float:
        """The whole backward pass as one vertex runs it (after the attention core's recomputation where
        `selective`), as the graph runs it unless ZB-H1 splits it."""
        if self.timed_backward:
            return self._kernels(self._backward_ops(selective), peak, bandwidth, device)
        cost = self.cost
        return _time(cost.bwd_flops + selective * cost.core_flops, cost.bwd_bytes + selective * cost.core_bytes,
                     peak, bandwidth)

    def core(self, peak: float, bandwidth: float, device: str) -> float:
        """The attention core's forward (what selective recomputation redoes)."""
        if self.core_ops:
            return self._kernels(self.core_ops, peak, bandwidth, device)
        return self.cost.core_flops / peak


def _gemm_clocks(spec: WorkloadSpec, par: Parallelism, cluster: "_Cluster", costs: _DecoderCosts, layers,
                 parameters: list[float]) -> tuple[tuple[str, float], ...]:
    """(device, the clock compute-bound GEMMs keep under its power limit), by their share of the kernel time of
    the job's compute vertices on that device as the engine adds it up
    (:meth:`hcsim.engine.rules.WorkloadRules.gemm_clock`): per class of replicas and stage, on its slowest device,
    each decoder's and end's passes once per micro-batch and the optimizer step over the stage's `parameters`,
    each once per XPU of the class."""
    model, parts = cluster.model, {}
    for micro_batches, members in _replica_classes(par, cluster.layout):
        xpus = len(cluster.layout.xpus if members is None else members)
        for stage in range(par.pp):
            peak, bandwidth, device = cluster.slowest_device(stage, spec.precision, members)
            decoders = sum(layers[stage])
            counted = [(ops, micro_batches * decoders) for block in (costs.attn, costs.mlp)
                       for ops in block.vertices(par)]
            counted += [(ops, micro_batches) for end in costs.ends_on(stage, par.pp)
                        for ops in end.vertices(par, True)]
            counted.append((optimizer_kernels(spec, par, parameters[stage], decoders), 1))
            gemms, spans = parts.setdefault(device, ([], []))
            for ops, count in counted:
                gemm, span = model.gemm_share(ops, device, peak, bandwidth)
                gemms.append(xpus * count * gemm)
                spans.append(xpus * count * span)
    return tuple((device, model.device(device).job_clock(gemms, spans)) for device, (gemms, spans) in parts.items())


def _recompute(mode: str, costs: _DecoderCosts, on: tuple[float, float, str], in_backward: bool = False) -> float:
    """Seconds a decoder's recomputation adds: full, its blocks' forward passes again; selective, the attention
    core's forward (nothing where `in_backward`: the backward vertex runs it, :meth:`_Block.backward`)."""
    blocks = (costs.attn, costs.mlp)
    if mode == "full":
        return sum(costs.with_tp(b.recomputed(*on)) for b in blocks)
    if mode == "selective" and not in_backward:
        return sum(b.core(*on) for b in blocks)
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


class Search:
    """Which candidates to simulate, in what order, and when more simulation cannot change the pick.

    The closed-form estimate is right about a plan's compute and off by a factor that depends on its shape
    (pipeline schedule, tp, pp, cp: the contention, the overlap and the bubble the closed forms leave out),
    so candidates are simulated best-corrected-estimate first, each estimate scaled by the median simulated /
    estimated ratio seen so far among plans of its shape (else of its schedule, else of every plan). The best
    plan of every shape whose corrected estimate is within `explore` of the best simulated time is simulated
    too (a shape's factor is unknown until one of its plans has run), and the search is over when no plan left
    is within `margin` of it: then, unless the estimates misjudge a plan by more than the margin beyond its
    shape's factor, simulating the rest cannot change the pick.

    Pure: estimates in, candidates out; the caller simulates them and :meth:`record` s the times.

    >>> estimates = {"a": 1.0, "b": 1.1, "c": 2.0}
    >>> search = Search(estimates, shape=lambda c: c)  # every plan its own shape
    >>> search.next(2)
    ['a', 'b']
    >>> search.record("a", 1.5); search.record("b", 1.2)
    >>> search.next(2), search.finished()  # c: 2.0 x the median factor 1.295 is far from 1.2
    ([], 'no plan left is within 5% of the best simulated (1.2 s)')
    """

    def __init__(self, estimates: dict, shape=None, margin: float = 0.05, explore: float = 0.25):
        self.estimates = estimates
        self.shape = shape or _shape
        self.margin, self.explore = margin, explore
        self.simulated: dict = {}  # candidate -> simulated s (None: failed)
        self._order = {c: i for i, c in enumerate(sorted(estimates, key=lambda c: estimates[c]))}

    def record(self, candidate, seconds: float | None) -> None:
        """The simulated iteration time of `candidate` (None: its simulation failed)."""
        self.simulated[candidate] = seconds

    def best(self) -> float | None:
        times = [s for s in self.simulated.values() if s is not None]
        return min(times) if times else None

    def corrected(self, candidate, factors: dict | None = None) -> float:
        """`candidate`'s estimate times the median factor of the plans of its shape (or schedule, or all);
        `factors`: :meth:`factors`, when the caller corrects many candidates at once."""
        factors = self.factors() if factors is None else factors
        for level in self._levels(candidate):
            if level in factors:
                return self.estimates[candidate] * factors[level]
        return self.estimates[candidate]

    def factors(self) -> dict:
        """The median simulated / estimated factor of the simulated plans at each level they share: their
        shape, its first element (the schedule) and all of them (the level None)."""
        ratios: dict = {}
        for c, seconds in self.simulated.items():
            if seconds is not None:
                for level in self._levels(c):
                    ratios.setdefault(level, []).append(seconds / self.estimates[c])
        return {level: statistics.median(values) for level, values in ratios.items()}

    def _levels(self, candidate) -> tuple:
        shape = self.shape(candidate)
        return (shape, ("schedule", shape[0]), None) if isinstance(shape, tuple) else (shape, None)

    def next(self, count: int) -> list:
        """Up to `count` candidates to simulate next: unexplored shapes' best plans that may win first, then the
        best corrected estimates that may win; [] when :meth:`finished`."""
        factors = self.factors()
        corrected = {c: self.corrected(c, factors) for c in self.estimates if c not in self.simulated}
        left = sorted(corrected, key=lambda c: (corrected[c], self._order[c]))
        best = self.best()
        if best is None:
            return left[:count]
        seen = {self.shape(c) for c in self.simulated}
        firsts, shapes = [], set()
        for c in left:
            if self.shape(c) not in seen and self.shape(c) not in shapes:
                shapes.add(self.shape(c))
                if corrected[c] <= best * (1 + self.explore):
                    firsts.append(c)
        chosen = set(firsts)
        close = [c for c in left if corrected[c] <= best * (1 + self.margin) and c not in chosen]
        return (firsts + close)[:count]

    def finished(self) -> str | None:
        """Why simulating more cannot change the pick (None: it may)."""
        if len(self.simulated) == len(self.estimates):
            return "every fitting plan simulated"
        if self.best() is not None and not self.next(1):
            return (f"no plan left is within {self.margin:.0%} of the best simulated "
                    f"({self.best():.4g} s)")
        return None


def _shape(candidate: Candidate) -> tuple:
    """What the estimate's error depends on most: the schedule first (the bubble), then tp, pp and cp."""
    par = candidate.parallelism
    return (par.schedule, par.tp, par.pp, par.cp)
