"""Serving simulation: a serving engine's scheduler over paged KV blocks, and each step's time.

A scenario whose workload is a serving workload (:mod:`hcsim.workload.serving`) runs here instead of the
training engine. The requests run on `dp` replicas of tp x pp XPUs (requests dealt to the replicas in turn, or
each to the least loaded as it arrives: ``serving.routing``, :class:`_Arrivals`),
each with its own scheduler (:class:`_Scheduler`), as vLLM schedules (``serving.scheduler``). A replica's XPUs are
of one device; on a mixed cluster replicas differ, each with its device's side (:func:`_side`: kernel times,
memory bandwidth, KV blocks, scheduler defaults):

- KV cache in blocks of ``block_size`` tokens. A replica's HBM holds ``gpu_memory_utilization`` of the GPU's
  memory less the weights and the activation workspace of a step of ``max_num_batched_tokens`` tokens
  (:func:`activation_workspace`; vLLM profiles it), in blocks; beyond them, when ``spill`` allows, blocks in the
  XPU's extended memory (CXL Type 3 read in place on a coherent platform, host DRAM copied over PCIe first).
  A block is taken when a sequence's tokens need it (admission while blocks are free, not a whole-output
  reservation), HBM first.
- vLLM V1 (the default): a token budget per step (``max_num_batched_tokens``) shared by running requests first
  (a decode token each, or the next chunk of a prompt) and then waiting requests in arrival order (chunked
  prefill: a prompt may be split over steps), at most ``max_num_seqs`` running; when a running request needs a
  block and none is free, the last running request is preempted (``preemption: recompute``: its blocks freed,
  recomputed from its prompt and the tokens it has made when it runs again; ``swap``: its blocks copied to host
  memory over the host link and back when it resumes, up to ``swap_space``), and no waiting request is admitted
  in that step. With prefix caching, a request whose prompt starts with a prefix group's blocks already
  computed (``shared_prefix``) reuses them (the hit rate is reported); unreferenced cached blocks are evicted,
  least recently released first, when blocks run out.
- vLLM V0: a step with waiting prompts that fit (whole prompts, within the token budget, leaving 1 % of the
  blocks free) runs only those prefills; otherwise every running request decodes.

A request's first token comes at the end of the step that computes its last prompt token; it finishes when
its output is complete. Every request is served once (a test checks it), none is lost to preemption. Its
inter-token gaps are the times between the ends of the steps that make its tokens (those of a run of decodes,
which the engine ends once, each the run's mean); with ``serving.slo`` it meets the SLO when its time to first
token and its time per output token are within the targets, and goodput is the requests that do, per second
of the run (:func:`_goodput`).

KV offload (``serving.kv_offload: {tier, policy, size}``, :class:`~hcsim.workload.serving.KvOffload`): the XPU's
tier memory below HBM (:func:`kv_tier_memory`: host DRAM, or its CXL Type 3 expander) takes the place of the
extended memory; admission takes HBM blocks only. A preempted request's blocks are copied there in the step that
preempts it (the swap phase, as vLLM's swap-out) while the tier has room (else it is recomputed), and a cached
prefix that HBM evicts goes there too (dropped there least recently offloaded first when the tier needs room).
They come back as the policy says (:meth:`_Scheduler._resume`, :meth:`_Scheduler._load_prefix`): ``prefetch``
takes HBM blocks for them and copies them as flows on the engine beside the running steps (the core's handoff
flows, tagged after the handoffs' request indices), the request waiting out of the queue until they land
(:meth:`_Scheduler.prefetched`: it returns to the queue's head; a replica with nothing else to run waits for the
landing, and an arrival meanwhile waits with it); ``swap`` copies them in the swap phase of the step that resumes
the request; ``in_place`` (coherent memory only: ``prepare.coherent_memory``) leaves them in the tier, read there
by each step as spilled blocks are. The result counts the blocks stored and loaded and the tokens read beyond
HBM (``kv.tiers``, kv.csv per row). Stores (offloads, evictions, and vLLM's swap-outs alike) run in a step's
store phase, after its swap-ins as copies on one stream run, from each XPU to its tier or host memory: on the
platform's split-duplex links they do not contend with the loads, prefetches and reads in place coming the
other way.

Prefill/decode disaggregation (``serving.disaggregation: {prefill: N, decode: M}``, N + M = dp): request i's
prompt runs on prefill replica i mod N (role ``prefill``), which hands the request off at its first token: its
KV cache of the prompt goes, as flows XPU k to XPU k, to the decode replica :class:`_Router` picks then (the
least loaded), as a handoff on the engine core (``steps.hpp``: flows started beside the prefill replica's next
answer, running outside any step, on links the core counts as shared). The prefill replica holds the request's
blocks until the last flow has landed (the cache is read from them while it crosses); a prefill replica whose
next prompt needs blocks that handoffs in flight hold waits for a landing. At the landing the decode scheduler
(role ``decode``) takes the request into its waiting queue (:meth:`_Scheduler.receive`), computed up to its
prompt with one token made, and a decode replica with nothing to do waits for the next landing (the core's idle
until +inf).

A step's work (:class:`StepWork`, from :class:`_StepCost`) is the kernel model's
(:mod:`hcsim.engine.compute_model`, the device's measured factors, with no per-kernel launch cost: serving
engines replay decode steps as CUDA graphs; under a power limit the compute-bound GEMMs at the clock the step's
own GEMM share leaves them) over the step's kernels on one TP rank, layer after layer and stage after stage,
plus its transfers: two TP all-reduces per layer, a pipeline send per stage boundary, the spilled
KV read from extended memory (in place beside the HBM reads, the paper's Fig. 3c; or copied first, Fig. 3b),
swap copies over the host link, and the host's ``step_overhead``. The steps run on the engine core
(:class:`_Engine`; ``hcsim/engine/core/steps.hpp``): every replica's loop in one SimGrid run, each step as
activities on the platform (each XPU's compute, its spilled read or copy from its extended memory, its swap
copy from its server's nearest DRAM, the all-reduces as one ring flow per rank, the send from stage to stage),
so replicas whose transfers cross one link (a CXL switch port, a host's PCIe uplink, a NIC) share it. Alone
on links of its own, a step takes the closed form's time (:meth:`_Platform.step_time`: ring all-reduces
2(n-1)·(α + S/(n·B)) at the achieved bandwidth plus the call and step latencies of the protocol NCCL's cost model
picks for the size on the XPUs' link generation, as training's collectives are timed: :class:`Link`), which the
tests hold the engine to; a phase of a step that nothing else can slow runs as one delay of that time.

Each replica's scheduler is asked by the engine at the end of each step (:meth:`_Scheduler.advance`): it
records that step's tokens, first tokens and finishes at the engine's time, and says what comes next. Between
events (an arrival that can be admitted, a request finishing, a block that cannot be had) a replica's steps
are decodes of the same sequences, each reading one more token per sequence than the one before: they go to
the engine as one run of k steps whose compute grows by the same amount each step (checked at three points),
each step simulated, the run ending early after the step in which the next request arrives
(:meth:`_Scheduler._decode_run`). Per-request state lives in arrays.

Units: s, bytes, tokens.
"""

from __future__ import annotations

import math
import os
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hcsim.engine.compute_model import lowest_clocks
from hcsim.errors import ConfigError
from hcsim.run.scenario import Scenario
from hcsim.units import format_quantity
from hcsim.workload.model import element_sizes
from hcsim.workload.serving import (KvOffload, Request, SchedulerConfig, ServingSpec, attention_kernels,
                                    dense_kernels, head_kernels, kv_bytes_per_token, make_requests, scheduler_config)

__all__ = ["load_serving_spec", "serving_workload", "simulate_serving", "ServingRun", "TRAINING_KEYS", "percentiles",
           "StepWork", "ServingBounds", "serving_bounds", "activation_workspace", "check_serving_scenario",
           "BYTES_PER_REQUEST", "MAX_SERVING_MEMORY",
           "EVENTS_PER_REQUEST"]

BYTES_PER_REQUEST = 2_000  # B of this process's memory per request at the peak (benchmarks/serving_speed.py: ~1.2 KB)
MAX_SERVING_MEMORY = 4e9  # B: a run whose estimate is above it is refused before it starts
# A replica's scheduling events (steps, decode runs) at most, per prompt chunk and per request (4 each: an
# arrival, a first token, a finish, a block boundary), beyond 10,000: a run that passes it is preempting and
# recomputing over and over (outputs far longer than the KV cache holds for max_num_seqs sequences).
EVENTS_PER_REQUEST = 10


def serving_workload(scenario: Scenario) -> ServingSpec | None:
    """The scenario's serving workload, or None when its workload is a training one."""
    from hcsim.workload.serving import serving_spec_path

    path = serving_spec_path(scenario.workload, Path(scenario.base))
    return load_serving_spec(path, scenario.workload_overrides) if path is not None else None


def load_serving_spec(path, overrides=None) -> ServingSpec:
    """Read a serving workload YAML (``kind: serving``), with dotted `overrides` (``serving.rate: 8``)."""
    from hcsim.config import apply_overrides, load_yaml
    from hcsim.workload.serving import serving_spec_from_dict
    from hcsim.workload.spec import _shape

    data = apply_overrides(load_yaml(path), overrides, f"{path}: ") if overrides else load_yaml(path)
    return serving_spec_from_dict(data, str(path), _shape)


# scenario keys a serving run has no use for: key -> (the value that means "not asked for", what to do instead)
TRAINING_KEYS = {
    "cp": (1, "serving splits no sequence over XPUs (cp is a training key); replicas come from xpus / (tp x pp)"),
    "ep": (1, "serving splits each expert's FFN over the replica's tp ranks (no expert parallelism)"),
    "zero": (0, "ZeRO shards training state; a serving replica holds its weights"),
    "offload": ("none", "offload moves training state; the KV cache spills by spill: allow"),
    "recompute": (None, "activation recomputation is a training key"),
    "global_batch": (None, "the requests come from the workload's serving: section"),
    "micro_batch": (None, "the requests come from the workload's serving: section"),
    "virtual_stages": (1, "interleaved pipeline schedules are training's"),
    "sequence_parallel": (False, "sequence parallelism is a training key"),
    "layer_split": (None, "serving splits the decoders evenly over pp stages"),
    "collective": (None, "serving's TP all-reduces are rings, one flow per rank a step"),
    "stragglers": ({}, "a serving replica's XPUs are of one device and run alike: no stragglers"),
    "straggler_spread": (0.0, "a serving replica's XPUs are of one device and run alike: no stragglers"),
    "iterations": (2, "a serving run lasts until its requests are served (serving.requests, serving.rate)"),
    "granularity": (None, "a serving step is timed from its kernels, layer by layer"),
    "schedule": ("1f1b", "pipeline schedules are training's; a serving step crosses the stages once"),
    "batch_split": ("even", "the requests come from the workload's serving: section"),
    "cp_algorithm": ("ring", "serving splits no sequence over XPUs (cp is a training key)"),
    "moe_skew": (1.0, "serving routes each token to top_k experts chosen uniformly (moe_skew is training's)"),
    "offload_state": (("optimizer",), "offload moves training state; the KV cache spills by spill: allow"),
    "collective_model": ("auto", "serving's TP all-reduces are rings, one flow per rank a step, on the engine core"),
    "collective_chunks": (None, "serving's TP all-reduces are rings, one flow per rank a step"),
    "ring_order": ("topology", "serving's TP all-reduces are rings over a replica's XPUs in order"),
    "step_limit": (64, "serving's TP all-reduces are rings, one flow per rank a step"),
    "local_collectives": ("simulated", "serving runs every transfer of a step on the engine core"),
    "local_access": ("analytic", "serving reads HBM at the kernel model's memory bandwidth"),
    "trace_xpus": ("per-stage", "a serving run writes requests.csv and kv.csv, not a trace"),
    "trace_iterations": (None, "a serving run writes requests.csv and kv.csv, not a trace"),
}


def check_serving_scenario(scenario: Scenario, spec: ServingSpec) -> None:
    """Refuse scenario keys a serving run would otherwise ignore (one ConfigError naming each, and the fix)."""
    problems = []
    for key, (unset, why) in TRAINING_KEYS.items():
        value = getattr(scenario, key, unset)
        if value != unset:
            problems.append(f"scenario {scenario.name!r}: {key}: {value!r} does not apply to serving workload "
                            f"{spec.name!r} ({why}). Fix: leave {key} out")
    if scenario.compute_model not in (None, "roofline"):
        problems.append(f"scenario {scenario.name!r}: compute_model: {scenario.compute_model!r} does not apply to "
                        f"serving workload {spec.name!r} (a serving step is timed by the kernel model: roofline, the "
                        f"device's factors). Fix: leave compute_model out")
    if scenario.precision is not None and scenario.precision not in ("fp16", "bf16"):
        problems.append(f"scenario {scenario.name!r}: precision: {scenario.precision!r}: serving runs fp16 or bf16 "
                        f"(FP8 and FP32 serving are not modelled). Fix: precision=bf16, or leave it out")
    if scenario.dp is not None and scenario.dp * scenario.tp * scenario.pp != scenario.xpus:
        problems.append(f"scenario {scenario.name!r}: dp: {scenario.dp} is not xpus / (tp x pp) = {scenario.xpus} / "
                        f"({scenario.tp} x {scenario.pp}); a serving run has one replica per tp x pp XPUs. "
                        f"Fix: leave dp out")
    if problems:
        raise ConfigError("\n".join(problems))


@dataclass(frozen=True, slots=True, kw_only=True)
class StepWork:
    """What one replica does in one step (the engine runs it as :meth:`_Engine.encode` says): `compute` seconds
    of kernels on each XPU (one TP rank's, every stage in turn); `allreduces` TP all-reduces of `allreduce_bytes`
    each; `sends` pipeline sends of `send_bytes` each; `spilled_bytes` of KV read per XPU from extended memory
    beside `resident_bytes` read from HBM (the attention's KV reads), over `spilled_layers` layers; `swap_bytes`
    copied from host memory (or the kv_offload tier) into HBM per XPU and then `store_bytes` from HBM to it
    (swapped out, offloaded); `host` seconds of host work before the step; `head` seconds of the logits, part of
    `compute`, on the last pipeline stage."""

    compute: float
    allreduces: int = 0
    allreduce_bytes: float = 0.0
    sends: int = 0
    send_bytes: float = 0.0
    spilled_bytes: float = 0.0
    resident_bytes: float = 0.0
    spilled_layers: int = 0
    swap_bytes: float = 0.0
    store_bytes: float = 0.0
    host: float = 0.0
    head: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class _Platform:
    """One replica's side of the platform: the compute model and device, HBM bandwidth, KV blocks (HBM,
    extended), the extended memory's path (bandwidth, latency) and whether it is read in place, the host link
    for swapping, the TP all-reduce and pipeline send closed forms, and the layout. :meth:`step_time` is the
    closed form of a step alone on the replica's links: the tests' oracle for the engine's runs."""

    model: Any
    device: str
    peak: float
    hbm_bandwidth: float
    memory_efficiency: float
    hbm_blocks: int
    ext_blocks: int
    ext_bandwidth: float
    ext_latency: float
    coherent: bool
    spilled_to: str | None
    ext_unbounded: bool  # the platform gives the extended memory no capacity (ext_blocks: 2^50 B of them)
    # serving.kv_offload: the extended memory above is its tier (ext_blocks its blocks), which admission does not
    # take from; stores and swapped loads cross its route (host_bandwidth, host_latency)
    offload: KvOffload | None
    host_bandwidth: float
    host_latency: float
    tp_route: Link | None  # the TP ring's route between neighbours (None: tp 1)
    pp_route: Link | None  # a pipeline send's (None: pp 1)
    tp: int
    pp: int
    dp: int
    token_bytes: float  # KV bytes of one token on one XPU (its layers, its heads)
    weights: float
    workspace: float

    @property
    def admit_beyond_hbm(self) -> bool:
        """Whether admission takes blocks beyond HBM (spill; not with kv_offload, whose tier holds offloaded ones)."""
        return self.offload is None

    def step_time(self, work: StepWork) -> float:
        """Seconds of a step alone on this replica's links (closed forms; module docstring)."""
        total = work.host + work.compute
        if work.allreduces:
            total += work.allreduces * self.tp_route.time(2 * (self.tp - 1), self.tp, work.allreduce_bytes)
        if work.sends:
            total += work.sends * self.pp_route.time(1, 1, work.send_bytes)
        if work.spilled_bytes:
            remote = work.spilled_bytes / self.ext_bandwidth + work.spilled_layers * self.ext_latency
            hbm = self.hbm_bandwidth * self.memory_efficiency
            if self.coherent:  # read in place beside the HBM reads: the slower part sets the time
                total += max(0.0, remote - work.resident_bytes / hbm)
            else:  # copied into HBM first, then read from there
                total += remote + work.spilled_bytes / hbm
        for copied in (work.swap_bytes, work.store_bytes):  # in, then out (the route's both ways alike)
            if copied:
                total += copied / self.host_bandwidth + self.host_latency
        return total


class _StepCost:
    """A replica's step work from the step's make-up (tokens, decodes and their context, prefill chunks), the
    token-count-dependent kernels timed once per count (a run's memo, not a module cache)."""

    def __init__(self, spec: ServingSpec, platform: _Platform):
        self.spec, self.platform = spec, platform
        self.factors = platform.model.device(platform.device)
        self.layers = spec.model.decoders
        self._dense: dict[int, float] = {}
        self._head: dict[int, float] = {}
        e = element_sizes(spec.precision).activation
        self.token_kv = 2.0 * spec.model.kv_hidden / platform.tp * e  # one layer's KV of a token on one XPU
        self.hidden_bytes = spec.model.hidden * e  # one token's activations between layers
        self.lowest_clock = 1.0  # the lowest clock a step's GEMMs ran at under the power limit (the run reports it)

    def _time(self, ops) -> tuple[float, float]:
        """(seconds of `ops` back to back, of which compute-bound GEMMs) at the clocks the kernels keep alone."""
        p = self.platform
        timed = [p.model.op_timing(self.factors, op, p.peak, p.hbm_bandwidth) for op in ops]
        return math.fsum(t for t, _ in timed), math.fsum(t for t, gemm in timed if gemm)

    def _timed(self, table: dict, count: int, kernels) -> tuple[float, float]:
        """:meth:`_time` of `kernels(model, count, tp, precision)`, timed once per count (`table`)."""
        found = table.get(count)
        if found is None:
            found = table[count] = self._time(kernels(self.spec.model, count, self.platform.tp, self.spec.precision))
        return found

    def dense(self, tokens: int) -> tuple[float, float]:
        """Seconds of one layer's kernels other than attention over `tokens` tokens (of which GEMMs: :meth:`_time`)."""
        return self._timed(self._dense, tokens, dense_kernels)

    def head(self, sampled: int) -> tuple[float, float]:
        """Seconds of the logits of `sampled` sequences (of which GEMMs: :meth:`_time`)."""
        return self._timed(self._head, sampled, head_kernels)

    def work(self, tokens: int, sampled: int, chunks, decode: int, resident: float, spilled: float,
             swap_bytes: float = 0.0, store_bytes: float = 0.0) -> StepWork:
        """The step's work: `tokens` through the GEMMs, `sampled` logits, prefill `chunks` ((new, cached) pairs),
        `decode` decoding sequences whose KV reads are `resident` tokens in HBM and `spilled` beyond it."""
        p, model = self.platform, self.spec.model
        attention = (0.0, 0.0)
        if chunks or decode:
            attention = self._time(attention_kernels(model, chunks=chunks, decode=decode, context=resident,
                                                     tp=p.tp, precision=self.spec.precision))
        (dense, dense_gemms), (head, head_gemms) = self.dense(tokens), self.head(sampled)
        busy = self.layers * (dense + attention[0]) + head
        gemms = self.layers * (dense_gemms + attention[1]) + head_gemms
        # under the device's power limit its compute-bound GEMMs run at the clock the step's mix leaves them: the
        # step's own share (a step lasts milliseconds, as long as the measured GEMM and copy interleavings; a
        # prefill's GEMMs are compute-bound, a decode step's are not)
        clock = self.factors.sustained_clock(gemms / busy) if gemms else 1.0
        self.lowest_clock = min(self.lowest_clock, clock)
        slower = 1.0 / clock - 1.0
        compute, head = busy + gemms * slower, head + head_gemms * slower
        size = tokens * self.hidden_bytes
        return StepWork(compute=compute, allreduces=2 * self.layers if p.tp > 1 else 0, allreduce_bytes=size,
                        sends=p.pp - 1, send_bytes=size, spilled_bytes=spilled * self.token_kv * self.layers,
                        resident_bytes=resident * self.token_kv * self.layers,
                        spilled_layers=self.layers if spilled else 0, swap_bytes=swap_bytes, store_bytes=store_bytes,
                        host=self.spec.host_time, head=head)


KV_TIER_NAMES = {"cpu": "host DRAM", "cxl": "CXL Type 3 memory"}  # serving.kv_offload.tier -> what it is


def nearest_dram(graph, xpu: str, search) -> str | None:
    """The DRAM of `xpu`'s server with the shortest route to it (least latency, then most bandwidth), or None."""
    from hcsim.platform.routes import route_bandwidth, route_latency

    nodes = graph.nodes
    server = nodes[xpu].get("server")
    drams = sorted(n for n, data in nodes(data=True) if data.get("role") == "dram" and data.get("server") == server)
    if not drams:
        return None
    routes = {d: search(d, [xpu])[xpu] for d in drams}
    return min(drams, key=lambda d: (route_latency(graph, routes[d]), -route_bandwidth(graph, routes[d]), d))


def kv_tier_memory(graph, xpu: str, tier: str, search) -> str | None:
    """The memory node of `xpu`'s KV offload `tier` (KV_TIERS), or None where the platform has none: ``cxl`` its
    CXL Type 3 expander; ``cpu`` its extended memory where that is DRAM (a superchip's CPU memory, a host's
    DRAM as the platform attaches it), else its server's nearest DRAM."""
    ext = graph.nodes[xpu].get("extended_memory")
    role = graph.nodes[ext].get("role") if ext else None
    if tier == "cxl":
        return ext if role == "cxl_type3" else None
    return ext if role == "dram" else nearest_dram(graph, xpu, search)


@dataclass(frozen=True, slots=True)
class Link:
    """A route between two XPUs as NCCL's cost model sees it (the engine's rule, ``WorkloadRules.protocol``): its
    latency and bottleneck bandwidth, and the collective factors of its slowest link's kind between XPUs of the
    sender's device (``ComputeModel.link``); each call runs the protocol NCCL would pick for its size."""

    latency: float
    bandwidth: float
    factors: Any  # compute_model.LinkFactors
    _calls: dict = field(default_factory=dict, repr=False, compare=False)  # (steps, ranks, size) -> call(): a
    # step's sizes repeat (tokens x hidden), and picking the protocol costs more than the rest of a step's encoding

    @classmethod
    def of(cls, graph, model, device: str, route) -> Link | None:
        """`route`'s link (None for no route: the XPU itself)."""
        from hcsim.platform.routes import route_bandwidth, route_latency

        if not route:
            return None
        slowest = min(zip(route, route[1:]), key=lambda e: graph.edges[e]["bandwidth"])
        return cls(route_latency(graph, route), route_bandwidth(graph, route),
                   model.link(graph.edges[slowest]["kind"], device))

    def call(self, steps: int, ranks: int, size: float) -> tuple[float, float]:
        """(s beside the bytes: `steps` route latencies + the protocol's call and step latencies, the protocol's
        achieved share of the bandwidth) of a call of `steps` steps over `ranks` ranks moving `size` B, whose busiest
        rank sends steps x size / ranks B (a ring all-reduce: 2(n-1) steps over n ranks; a send: 1 over 1)."""
        key = (steps, ranks, size)
        found = self._calls.get(key)
        if found is None:
            protocol = self.factors.fastest(False, steps, steps * size / ranks, self.bandwidth)
            found = self._calls[key] = (steps * self.latency + protocol.latency(steps), protocol.bandwidth_factor)
        return found

    def time(self, steps: int, ranks: int, size: float) -> float:
        """Seconds of that call alone on the route."""
        fixed, share = self.call(steps, ranks, size)
        return fixed + steps * size / (self.bandwidth * share * ranks)


class _Engine:
    """The run on the engine core (:mod:`hcsim.engine.core`, ``steps.hpp``): the replicas' XPUs (replica r: XPUs
    r·tp·pp to (r+1)·tp·pp - 1, stage after stage), each XPU's extended memory (where KV blocks spill) and
    host memory (the nearest DRAM of its server, where swapped blocks go) or, with kv_offload, its tier memory
    for both (read in place; stores and swapped loads in the swap phase; prefetches as the core's handoff flows,
    beside the steps), the platform compiled for the routes between them, and each step's work as the core takes
    it (:meth:`encode`). Every replica runs in one SimGrid run, so replicas whose reads, copies or flows cross
    one link share it."""

    def __init__(self, spec: ServingSpec, sides: list[tuple[_Platform, SchedulerConfig]], graph, xpus: list[str]):
        from hcsim.platform.routes import RouteSearch

        self.graph = graph
        p, nodes = sides[0][0], graph.nodes  # (tp, pp, dp and kv_offload: every replica's)
        hosts: dict[str, int] = {x: i for i, x in enumerate(xpus)}
        x_ext, x_dram, pairs = array("i"), array("i"), set()
        search, nearest = RouteSearch(graph), {}

        def dram_of(x):  # the DRAM of x's server with the shortest route to x
            if x not in nearest:
                nearest[x] = nearest_dram(graph, x, search)
                if nearest[x] is None:
                    raise ConfigError(f"serving.preemption: swap needs host memory beside the XPUs, and {x}'s server "
                                      f"has none. Fix: preemption: recompute")
            return nearest[x]

        offload = p.offload
        h_src, h_dst, self.tier_of = array("i"), array("i"), []  # (kv_offload: each XPU's tier host)
        for n, x in enumerate(xpus):
            side, config = sides[n // (p.tp * p.pp)]
            ext = nodes[x].get("extended_memory") if side.spilled_to is not None else None
            dram = dram_of(x) if config.preemption == "swap" else None
            if offload is not None:  # the tier: read in place (in_place), stores and swapped loads (the swap phase)
                ext = dram = kv_tier_memory(graph, x, offload.tier, search)
            for memory, column in ((ext, x_ext), (dram, x_dram)):
                column.append(hosts.setdefault(memory, len(hosts)) if memory else -1)
                if memory:
                    pairs.add((memory, x))
            if dram:  # (stores: the other way)
                pairs.add((x, dram))
            if offload is not None:
                self.tier_of.append(hosts[ext])
                if offload.policy == "prefetch":  # prefetches run as flows beside the steps (steps.hpp's handoffs)
                    h_src.append(hosts[ext])
                    h_dst.append(hosts[x])
        size = p.tp * p.pp
        for first in range(0, len(xpus), size):
            group = xpus[first:first + size]
            for stage in range(p.pp):
                ring = group[stage * p.tp:(stage + 1) * p.tp]
                if p.tp > 1:
                    pairs.update(zip(ring, ring[1:] + ring[:1]))
                if stage + 1 < p.pp:
                    pairs.add((ring[0], group[(stage + 1) * p.tp]))
        # prefill/decode disaggregation: the first `prefill` replicas hand each request's KV cache off to a decode
        # replica, XPU i of the one to XPU i of the other (the same layers and heads)
        self.prefill, self.decode = spec.disaggregation or (0, 0)
        self.handoff_link = {}
        for source in range(self.prefill):
            for target in range(self.prefill, self.prefill + self.decode):
                for i in range(size):
                    a, b = xpus[source * size + i], xpus[target * size + i]
                    pairs.add((a, b))
                    h_src.append(hosts[a])
                    h_dst.append(hosts[b])
                    self.handoff_link[hosts[a], hosts[b]] = Link.of(graph, p.model, sides[source][0].device,
                                                                    search(a, [b])[b])
        self.size = size
        self.hosts, self.pairs = list(hosts), pairs
        self.layout = {"r_tp": array("i", [p.tp]) * p.dp, "r_xpus": array("q", range(0, len(xpus) + 1, size)),
                       "x_host": array("i", range(len(xpus))), "x_ext": x_ext, "x_dram": x_dram}
        if h_src:
            self.layout |= {"h_src": h_src, "h_dst": h_dst}
        # kv_offload prefetches are tagged after the handoffs' tags (request indices): tag -> (replica, slot)
        self.next_tag, self.prefetching = spec.requests, {}
        layers = spec.model.decoders
        self.stage_layers = [layers // p.pp + (s < layers % p.pp) for s in range(p.pp)]
        self.layers = layers
        self.precision = spec.precision

    def encode(self, p: _Platform, k: int, until: float, work: StepWork, following: StepWork | None) -> tuple:
        """The core's fields of a step of a replica of side `p` (``steps.hpp``): the work of the closed form
        (:meth:`_Platform.step_time`) as activities that, alone on the replica's links, take its time: host, swap,
        store, then per pipeline stage its share of the layers (compute; the spilled KV read beside it after the
        stage's HBM reads would have led, or copied first without coherence), its TP all-reduces as one ring flow
        per rank (count x 2(tp-1)/tp x bytes over the achieved share of the bandwidth) and its pipeline send."""
        hbm = p.hbm_bandwidth * p.memory_efficiency
        fields = [k, until, work.host, work.swap_bytes, work.store_bytes]
        slope = following.compute - work.compute if following is not None else 0.0
        resident_slope = following.resident_bytes - work.resident_bytes if following is not None else 0.0
        body, last = work.compute - work.head, p.pp - 1
        for stage, layers in enumerate(self.stage_layers):
            share = layers / self.layers
            compute = body * share + (work.head if stage == last else 0.0)
            lead = lead_slope = spill = spill_pad = copy = copy_pad = ar = ar_pad = send = send_pad = 0.0
            if work.spilled_bytes:
                part, pad = work.spilled_bytes * share, (layers - 1) * p.ext_latency  # the flow crosses one latency
                if p.coherent:
                    spill, spill_pad = part, pad
                    lead = compute - work.resident_bytes * share / hbm
                    lead_slope = (slope - resident_slope / hbm) * share
                else:
                    copy, copy_pad = part, pad
                    compute += part / hbm  # read from HBM once copied
            if work.allreduces:
                count, steps = work.allreduces * layers // self.layers, 2 * (p.tp - 1)
                fixed, achieved = p.tp_route.call(steps, p.tp, work.allreduce_bytes)
                ar = count * steps * work.allreduce_bytes / (p.tp * achieved)
                ar_pad = count * fixed - p.tp_route.latency
            if work.sends and stage < last:
                fixed, achieved = p.pp_route.call(1, 1, work.send_bytes)
                send, send_pad = work.send_bytes / achieved, fixed - p.pp_route.latency
            fields += (compute, slope * share, lead, lead_slope, spill, spill_pad, copy, copy_pad, ar, ar_pad, send,
                       send_pad)
        return tuple(fields)

    def handoffs(self, replica: int, scheduler, router: _Router) -> tuple:
        """The core's flows (``steps.hpp``: src, dst, bytes, pad, replica, tag) of the KV caches prefill replica
        `replica`'s scheduler hands off now: request q's to the decode replica `router` picks, each XPU's share
        (prompt tokens x KV bytes per token on one XPU) over its route as NCCL's cost model times a send
        (:class:`Link`: the achieved bandwidth after the call latency); its tag q."""
        flows, size = [], self.size
        for i in scheduler.outgoing:
            q = scheduler.index[i]
            target = router.route(q, scheduler.prompt[i])
            kv = scheduler.prompt[i] * scheduler.platform.token_bytes
            for x in range(size):
                src, dst = replica * size + x, target * size + x
                link = self.handoff_link[src, dst]
                fixed, share = link.call(1, 1, kv)
                flows += (src, dst, kv / share, fixed - link.latency, target, q)
        scheduler.outgoing.clear()
        return tuple(flows)

    def prefetches(self, replica: int, scheduler) -> tuple:
        """The core's flows of the KV blocks replica `replica`'s scheduler prefetches now (kv_offload, policy
        prefetch): each slot's blocks, each XPU's share, from its tier memory to it as the swap phase moves them (the
        route's latency + bytes / its bottleneck bandwidth alone), tagged for :meth:`run`'s landing."""
        flows, size, block = [], self.size, scheduler.platform.token_bytes * scheduler.config.block_size
        for i, blocks in scheduler.loads:
            tag, self.next_tag = self.next_tag, self.next_tag + 1
            self.prefetching[tag] = (replica, i)
            for x in range(replica * size, (replica + 1) * size):
                flows += (self.tier_of[x], x, blocks * block, 0.0, replica, tag)
        scheduler.loads.clear()
        return tuple(flows)

    def run(self, schedulers: list, arrivals: _Arrivals, analytic: bool = True) -> dict:
        """Every replica's scheduler driven by the core until each has served its requests; the core's counters.
        An error a scheduler raises (ConfigError) comes out as it is."""
        from hcsim.engine import core
        from hcsim.errors import HcsimError, SimulationError
        from hcsim.platform import compile_platform

        compiled = compile_platform(self.graph, self.pairs, self.precision)
        next_step, landed = self.callbacks(schedulers, arrivals)
        try:
            return core.load().run_steps(compiled.tables, self.hosts, self.layout, next_step, analytic, landed)
        except HcsimError:
            raise
        except (ValueError, TypeError, RuntimeError) as err:  # a bad step or layout: a bug, said as one
            raise SimulationError(f"engine core: {err}") from err

    def callbacks(self, schedulers: list, arrivals: _Arrivals):
        """The core's ``next_step(replica, now, done)`` and ``landed(tag, now)`` (None without handoffs) driving
        `schedulers` (steps.hpp)."""
        encode = self.encode

        prefill, handoffs, prefetches = self.prefill, self.handoffs, self.prefetches
        router = _Router(schedulers, prefill, arrivals) if prefill else None
        dispatch = arrivals.dispatch if arrivals.next < len(arrivals.requests) else None  # (least_loaded)

        def next_step(replica, now, done):
            scheduler = schedulers[replica]
            if dispatch is not None:
                dispatch(now)
            reply = scheduler.advance(now, done)
            if reply is not None and reply.__class__ is not float:
                reply = encode(scheduler.platform, *reply)
            if scheduler.outgoing or scheduler.loads:
                flows = handoffs(replica, scheduler, router) if scheduler.outgoing else ()
                return [reply, flows + (prefetches(replica, scheduler) if scheduler.loads else ())]
            return reply

        def landed(tag, now):
            if tag in self.prefetching:  # a kv_offload prefetch: its blocks are in HBM
                replica, i = self.prefetching.pop(tag)
                schedulers[replica].prefetched(i, now)
            else:  # request `tag`'s KV cache is on its decode replica: the prefill replica's blocks are free
                source, slot = schedulers[arrivals.replica[tag]], arrivals.slot[tag]
                source.handed_off(slot, now)
                schedulers[router.landed(tag)].receive(tag, source.prompt[slot], source.output[slot],
                                                       source.group[slot], now, source.first[slot])

        return next_step, landed if "h_src" in self.layout else None


class _Arrivals:
    """Where each request goes when it arrives (``serving.routing``), among the replicas that take arrivals (every
    replica, or the prefill ones): ``round_robin`` deals request i to replica i mod n before the run (as a
    round-robin load balancer); ``least_loaded`` gives it, at the first step boundary at or after its arrival
    (the first question any replica is asked then: :meth:`dispatch`), to the replica with the fewest requests
    waiting and running, ties to the most free KV blocks, then the lowest index (the decode router's rule,
    :class:`_Router`, for arrivals). Each request's replica and slot there."""

    def __init__(self, requests: list[Request], schedulers: list, takers: int, routing: str):
        self.requests, self.schedulers, self.takers, self.next = requests, schedulers, takers, len(requests)
        self.replica, self.slot = array("i", bytes(4 * len(requests))), array("q", bytes(8 * len(requests)))
        if routing == "least_loaded":
            self.next = 0  # the first request not routed yet (they come in order of arrival)
            for scheduler in schedulers[:takers]:
                scheduler.arrivals = self
        else:
            for q in requests:
                self.replica[q.index], self.slot[q.index] = q.index % takers, q.index // takers

    def dispatch(self, now: float) -> None:
        """Route every request that has arrived by `now` and is not routed yet."""
        requests, schedulers = self.requests, self.schedulers
        while self.next < len(requests) and requests[self.next].arrival <= now:
            q = requests[self.next]
            self.next += 1
            r = min(range(self.takers), key=lambda r: (len(schedulers[r].waiting) + len(schedulers[r].running),
                                                       -schedulers[r]._available(), r))
            self.replica[q.index], self.slot[q.index] = r, schedulers[r].take(q)

    def upcoming(self) -> float | None:
        """When the next request not routed yet arrives (None: every one is routed)."""
        return self.requests[self.next].arrival if self.next < len(self.requests) else None


class _Router:
    """Which decode replica a prefilled request goes to, picked when its handoff starts: the one with the fewest
    requests (waiting, running and landing there), ties to the one with the most free KV blocks (less those the
    handoffs in flight to it will take), then the lowest index; a replica whose free blocks cannot hold the
    request's prompt and next token is passed over while another can. Fewest requests first is join-the-shortest-
    queue, as the Splitwise authors' simulator routes (SplitwiseSim, scheduler.py: its JSQ schedulers, and
    MixedPoolScheduler's "instance with smallest pending tokens queue"; here counted in requests, as a decode
    replica's step grows with its batch): the shortest queue keeps time per output token lowest, and a faster
    replica (more memory bandwidth) drains its queue sooner and so takes more; free blocks decide a tie, and
    keep a request off a replica that would have to preempt to take it. Each decode scheduler asks
    :meth:`expects` whether a handoff may still come to it."""

    def __init__(self, schedulers: list, prefill: int, arrivals: _Arrivals | None = None):
        self.schedulers, self.first, self.arrivals = schedulers, prefill, arrivals
        # requests not handed off yet
        self.unrouted = len(arrivals.requests) if arrivals else sum(len(s.index) for s in schedulers[:prefill])
        self.bound: dict[int, tuple[int, int]] = {}  # request -> (its decode replica, blocks), handoff in flight
        self.in_flight = [0] * len(schedulers)
        self.in_flight_blocks = [0] * len(schedulers)
        for scheduler in schedulers[prefill:]:
            scheduler.router = self

    def route(self, q: int, prompt: int) -> int:
        """The decode replica request q (of `prompt` tokens) goes to, its handoff now counted in flight there."""
        def load(d):
            scheduler = self.schedulers[d]
            free = scheduler._available() - self.in_flight_blocks[d]
            return (free < need, len(scheduler.waiting) + len(scheduler.running) + self.in_flight[d], -free, d)

        need = -(-(prompt + 1) // self.schedulers[self.first].config.block_size)
        target = min(range(self.first, len(self.schedulers)), key=load)
        self.bound[q] = (target, need)
        self.unrouted -= 1
        self.in_flight[target] += 1
        self.in_flight_blocks[target] += need
        return target

    def landed(self, q: int) -> int:
        """Request q's handoff landed: its decode replica, no longer counted in flight."""
        target, need = self.bound.pop(q)
        self.in_flight[target] -= 1
        self.in_flight_blocks[target] -= need
        return target

    def prefill_replica(self, q: int) -> int:
        """The prefill replica request q arrived at."""
        return self.arrivals.replica[q]

    def expects(self, d: int) -> bool:
        """Whether a handoff may still land on decode replica d: one is in flight to it, or a request is still to
        be routed."""
        return self.unrouted > 0 or self.in_flight[d] > 0


class _Group:
    """A prefix group's cached blocks (HBM and extended) and the requests referencing them."""

    __slots__ = ("hbm", "ext", "refs")

    def __init__(self):
        self.hbm = self.ext = self.refs = 0


class _Scheduler:
    """One replica's serving engine (module docstring): waiting and running queues of request slots, per-slot
    arrays (tokens computed, made, blocks held per tier, prefix blocks referenced), free blocks per tier, the
    prefix cache, and the clock. A decode replica's slots come as requests land (:meth:`receive` appends one to
    each array of PER_SLOT, which lists every per-slot array: a test checks it)."""

    PER_SLOT = ("index", "arrival", "prompt", "output", "group", "computed", "made", "hbm", "ext", "hit", "first",
                "finish", "last_token", "itl_max", "preemptions", "swapped", "landed")

    def __init__(self, spec: ServingSpec, config: SchedulerConfig, platform: _Platform, cost: _StepCost,
                 requests: list[Request], role: str | None = None, replica: int = 0):
        self.spec, self.config, self.platform, self.cost = spec, config, platform, cost
        self.role, self.replica = role, replica  # role None: prefill and decode here; "prefill": hand off at the
        # first token; "decode": take them as they land, from the prefill replicas through `router` (_Router)
        self.outgoing: list[int] = []  # (prefill) slots whose prompt ended in the step that ended: to hand off
        self.holding = 0  # (prefill) slots handed off whose blocks it holds until their handoff lands
        self.router = self.arrivals = None  # (decode: its _Router; routing least_loaded: the _Arrivals it takes)
        self.received, self.landed = 0, array("d", bytes(8 * len(requests)))  # (decode) handoffs landed, when
        n = len(requests)
        self.index = array("q", (q.index for q in requests))
        self.arrival = array("d", (q.arrival for q in requests))
        self.prompt = array("q", (q.prompt for q in requests))
        self.output = array("q", (q.output for q in requests))
        self.group = array("q", (q.group for q in requests))
        self.computed, self.made = array("q", bytes(8 * n)), array("q", bytes(8 * n))
        self.hbm, self.ext, self.hit = array("q", bytes(8 * n)), array("q", bytes(8 * n)), array("q", bytes(8 * n))
        self.first, self.finish = array("d", bytes(8 * n)), array("d", bytes(8 * n))
        # inter-token latency: when each slot's last token came, its longest gap, and every gap of the run as
        # (seconds, tokens) pairs (a step's equal gaps counted together)
        self.last_token, self.itl_max = array("d", bytes(8 * n)), array("d", bytes(8 * n))
        self.itl_values, self.itl_weights = array("d"), array("q")
        self.preemptions, self.swapped = array("q", bytes(8 * n)), array("b", bytes(n))
        self.free_hbm, self.free_ext = platform.hbm_blocks, platform.ext_blocks
        self.beyond_hbm = platform.admit_beyond_hbm
        self.total_blocks = platform.hbm_blocks + (platform.ext_blocks if self.beyond_hbm else 0)
        # kv_offload (the extended memory is its tier): a slot's swapped flag is 1 while its blocks are in the tier
        # waiting to come back, 2 once prefetched into HBM; `loads` the (slot, blocks) to prefetch now, `loading`
        # the prefetches in flight; blocks stored into and loaded from the tier, tokens read from it by steps
        self.offload, self.loads, self.loading = platform.offload, [], 0
        self.block_bytes = platform.token_bytes * config.block_size  # one block on one XPU
        self.stored_blocks = self.loaded_blocks = self.read_tokens = self.hbm_read_tokens = 0
        # evicted cached prefixes in the tier: groups with no reference, least recently offloaded first; bytes per
        # XPU swapped out, offloaded or evicted to the tier since the last step, stored by the next; prefixes being
        # prefetched (group -> the slot waiting)
        self.tier_lru: OrderedDict[int, None] = OrderedDict()
        self.pending_store, self.loading_groups, self.group_loads = 0.0, set(), {}
        estimate = config.new_token_ratio  # (SGLang: admission by the running requests' expected output)
        self.ratio = estimate.start if estimate is not None else None
        bs = config.block_size
        self.prefix_blocks = spec.shared_prefix // bs if config.prefix_caching and role != "decode" else 0
        self.groups = [_Group() for _ in range(spec.prefix_groups)]
        self.evictable: OrderedDict[int, None] = OrderedDict()  # groups with no references, least recent first
        self.evictable_blocks = 0
        self.waiting: deque[int] = deque(range(n) if role != "decode" else ())  # (decode: as they land)
        self.running: list[int] = []
        self.now, self.steps, self.swap_used = 0.0, 0, 0.0
        self._pending = None  # the step or run in flight on the engine: what it does when it ends
        self.limit, self.update, self.events, self.reported = 10_000, None, 0, 0  # (run sets them)
        self.hit_tokens = self.query_tokens = self.preempted = self.max_tokens = self.recomputed = 0
        self.kinds = {"prefill": 0, "mixed": 0, "decode": 0}  # steps of prefill chunks only, both, decodes only
        self.trace_time, self.trace_hbm, self.trace_ext, self.trace_running = (array("d"), array("q"), array("q"),
                                                                              array("q"))
        # per row, so far: blocks stored, blocks loaded, tokens the steps' decodes read beyond HBM and in HBM
        self.trace_moved = array("q")

    # ---- blocks ------------------------------------------------------------------------------------------------

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def _available(self) -> int:
        """Blocks that can be had: free ones (HBM's; beyond it where admission takes them) and unreferenced cached
        ones."""
        return self.free_hbm + (self.free_ext if self.beyond_hbm else 0) + self.evictable_blocks

    def _evictable_size(self, group: _Group) -> int:
        """The blocks evicting `group` frees for admission (its HBM ones, and beyond HBM where admission takes them)."""
        return group.hbm + (group.ext if self.beyond_hbm else 0)

    def _hold(self, g: int) -> None:
        """Group `g` gets a reference: its cached blocks are no longer evictable."""
        group = self.groups[g]
        if g in self.evictable:
            del self.evictable[g]
            self.evictable_blocks -= self._evictable_size(group)
        self.tier_lru.pop(g, None)
        group.refs += 1

    def _evict_for(self, blocks: int) -> None:
        """Evict unreferenced cached prefixes, least recently released first, until HBM has `blocks` free or none
        is left."""
        while self.free_hbm < blocks and self.evictable:
            g, _ = self.evictable.popitem(last=False)
            group = self.groups[g]
            self.evictable_blocks -= self._evictable_size(group)
            if self.offload is not None:  # kv_offload: its HBM blocks go to the tier, where it has room
                self.free_hbm += group.hbm
                if self._tier_room(group.hbm):
                    self.free_ext -= group.hbm
                    group.ext += group.hbm
                    self.stored_blocks += group.hbm
                    self.pending_store += group.hbm * self.block_bytes
                group.hbm = 0
                if group.ext:
                    self.tier_lru[g] = None
                continue
            self.free_hbm, self.free_ext = self.free_hbm + group.hbm, self.free_ext + group.ext
            group.hbm = group.ext = 0

    def _tier_room(self, blocks: int) -> bool:
        """(kv_offload) Whether the tier has `blocks` free, dropping offloaded prefixes no request references (least
        recently offloaded first) for them."""
        while self.free_ext < blocks and self.tier_lru:
            g, _ = self.tier_lru.popitem(last=False)
            self.free_ext += self.groups[g].ext
            self.groups[g].ext = 0
        return self.free_ext >= blocks

    def _take_hbm(self, blocks: int, watermark: bool) -> bool:
        """Take `blocks` HBM blocks (evicting cached prefixes for them); False, taking none, when they cannot be had
        (or, with `watermark`, not while leaving the scheduler's watermark free)."""
        reserve = math.ceil(self.config.watermark * self.total_blocks) if watermark else 0
        if blocks + reserve > self.free_hbm + self.evictable_blocks:
            return False
        self._evict_for(blocks)
        self.free_hbm -= blocks
        return True

    def _allocate(self, i: int, tokens: int, watermark: bool = False) -> bool:
        """Give slot `i` the blocks its first `tokens` tokens need (HBM first, then evicting unreferenced cached
        prefixes, least recently released first, then extended memory); False, taking none, when they cannot all
        be had (or, with `watermark`, not while leaving the scheduler's watermark of the blocks free)."""
        need = self._blocks(tokens) - self.hit[i] - self.hbm[i] - self.ext[i]
        if need <= 0:
            return True
        reserve = math.ceil(self.config.watermark * self.total_blocks) if watermark else 0
        if need + reserve > self._available():
            return False
        self._evict_for(need)  # cached blocks in HBM make room before extended memory
        from_hbm = min(need, self.free_hbm)
        self.free_hbm -= from_hbm
        self.free_ext -= need - from_hbm
        self.hbm[i] += from_hbm
        self.ext[i] += need - from_hbm
        return True

    def _release(self, i: int) -> None:
        """Free slot `i`'s own blocks and drop its reference to its group's cached prefix."""
        self.free_hbm += self.hbm[i]
        self.free_ext += self.ext[i]
        self.hbm[i] = self.ext[i] = 0
        if self.hit[i]:
            g = self.group[i]
            group = self.groups[g]
            group.refs -= 1
            if not group.refs:
                self.evictable[g] = None
                self.evictable_blocks += self._evictable_size(group)
            self.hit[i] = 0

    def _prefix_hit(self, i: int) -> int:
        """Reference slot `i`'s group's cached prefix blocks (at most all but the prompt's last token, which is
        computed again for its logits); the tokens they hold."""
        if not self.prefix_blocks or self.computed[i] or self.swapped[i] or self.group[i] in self.loading_groups:
            return 0
        g = self.group[i]
        group = self.groups[g]
        cached = min(group.hbm + group.ext, (self.prompt[i] + self.made[i] - 1) // self.config.block_size)
        if not cached:
            return 0
        self._hold(g)
        self.hit[i] = cached
        self.computed[i] = cached * self.config.block_size
        return self.computed[i]

    def _donate(self, i: int) -> None:
        """Once slot `i` has computed its group's prefix blocks that are not cached yet, they become the group's
        (its own blocks for those positions, HBM first)."""
        group = self.groups[self.group[i]]
        have = group.hbm + group.ext
        full = min(self.prefix_blocks, self.computed[i] // self.config.block_size)
        if full <= have or self.hit[i] != have:
            return
        extra = full - have
        from_hbm = min(extra, self.hbm[i])
        self.hbm[i] -= from_hbm
        self.ext[i] -= extra - from_hbm
        group.hbm += from_hbm
        group.ext += extra - from_hbm
        if not self.hit[i]:
            self._hold(self.group[i])
        self.hit[i] = full

    def _preempt(self, i: int) -> None:
        """Preempt slot `i` (back to the front of the waiting queue); its bytes swapped out or offloaded per XPU are
        stored by the next step."""
        self.preempted += 1
        self.preemptions[i] += 1
        if self.offload is not None:
            stored = self._offload(i)
            if stored is not None:
                self.waiting.appendleft(i)
                self.pending_store += stored
                return
        size = self.computed[i] * self.platform.token_bytes
        if self.config.preemption == "swap" and self.swap_used + size <= self.config.swap_space:
            self.swapped[i] = 1
            self.swap_used += size
            self.pending_store += size
        else:
            self.recomputed += self.computed[i]
            self.computed[i] = 0
        self._release(i)
        self.waiting.appendleft(i)

    def _offload(self, i: int) -> float | None:
        """(kv_offload) Preempted slot `i`'s blocks moved to the tier, where it has room (the blocks it holds there
        already stay): the bytes per XPU stored in this step; None (to recompute) where the tier is full."""
        blocks = self._blocks(self.computed[i])
        moving = blocks - self.ext[i]
        if not self.computed[i] or not self._tier_room(moving):
            return None
        self.ext[i] = 0
        self._release(i)  # its HBM blocks and its reference to a cached prefix (whose blocks it copies)
        self.free_ext -= moving
        self.ext[i] = blocks
        self.swapped[i] = 1
        self.stored_blocks += moving
        return moving * self.block_bytes

    def _resume(self, i: int, new: int, watermark: bool) -> float | None:
        """(kv_offload) Offloaded slot `i` admitted with `new` tokens to compute: its blocks brought back as the
        policy says: -1.0 when prefetched (HBM taken for them, the copy started beside this step: it waits for it),
        else the bytes per XPU copied in this step (swap; 0 in_place: read where they are); None when HBM has no
        room for them."""
        tier, policy = self.ext[i], self.offload.policy
        if policy == "in_place":
            return 0.0
        count = tier if policy == "prefetch" else self._blocks(self.computed[i] + new)
        if not self._take_hbm(count, watermark):
            return None
        self.hbm[i] += count
        self.loaded_blocks += tier
        if policy == "prefetch":
            self.loads.append((i, tier))
            self.loading += 1
            return -1.0
        self.free_ext += tier
        self.ext[i] = 0
        return tier * self.block_bytes

    def _load_prefix(self, i: int, watermark: bool) -> float | None:
        """(kv_offload, policy prefetch or swap) Slot `i`'s group's cached prefix, offloaded, brought back into HBM
        before `i` hits it: -1.0 when prefetched (`i` waits for it), else the bytes per XPU copied in this step;
        None when HBM has no room for it."""
        g = self.group[i]
        group = self.groups[g]
        count = group.ext
        if not self._take_hbm(count, watermark):
            return None
        self.tier_lru.pop(g, None)
        group.hbm += count
        group.ext = 0
        self.free_ext += count
        self.loaded_blocks += count
        if self.offload.policy == "prefetch":
            self._hold(g)  # (not evicted while it lands; other requests do not hit it until then)
            self.loading_groups.add(g)
            self.group_loads[i] = g
            self.loads.append((i, count))
            self.loading += 1
            return -1.0
        if not group.refs:  # cached in HBM again, evictable until `i` hits it
            self.evictable[g] = None
            self.evictable_blocks += self._evictable_size(group)
        return count * self.block_bytes

    def prefetched(self, i: int, now: float) -> None:
        """(kv_offload) Slot `i`'s prefetched blocks (its own, or its group's prefix) landed in HBM at `now`: it goes
        back to the head of the waiting queue (a preempted slot was preempted before every request waiting)."""
        self.loading -= 1
        self.waiting.appendleft(i)
        g = self.group_loads.pop(i, None)
        if g is not None:  # its group's prefix: hit when it is admitted
            self.loading_groups.discard(g)
            group = self.groups[g]
            group.refs -= 1
            if not group.refs:
                self.evictable[g] = None
                self.evictable_blocks += self._evictable_size(group)
            return
        self.free_ext += self.ext[i]
        self.ext[i] = 0
        self.swapped[i] = 2

    # ---- steps -------------------------------------------------------------------------------------------------

    def advance(self, now: float, done: int):
        """The engine's question when this replica's step, run of decodes or idle time ends at `now` (`done`: the
        steps of the run that ran): what they produced, at `now`, then what the replica does next: None (every
        request served), a float (idle until then: no request to run before it arrives), or a step as
        ``(k, until, work, following)``: the StepWork of a step, and for a run of k >= 2 decodes the StepWork of
        the one after it (each further one as much more), ending early after the first step that ends at or
        after `until` (s; inf: none). ConfigError after `limit` steps and runs (:meth:`run`), which only
        preemptions that recompute over and over reach (the run would not end in reasonable time)."""
        if self._pending:
            self._finish(now, done)
        elif now > self.now:  # (after idling: the arrival it waited for, exactly)
            self.now = now
        while self.waiting or self.running or self.loading:
            if self.update is not None and not self.events % 4096:
                arrived = self.received if self.role == "decode" else len(self.index)
                finished = arrived - len(self.waiting) - len(self.running) - self.loading
                self.update(finished - self.reported)
                self.reported = finished
            if not self.running and (not self.waiting or self.arrival[self.waiting[0]] > self.now):
                if self.loading:  # a prefetch lands first (an arrival before it waits for it)
                    return math.inf
                self.now = self.arrival[self.waiting[0]]
                return self.now
            self.events += 1
            if self.events > self.limit and not os.environ.get("HCSIM_NO_LIMITS"):  # hcsim.limits' switch
                longest = max(p + o for p, o in zip(self.prompt, self.output))
                raise ConfigError(
                    f"serving workload {self.spec.name!r}: a replica stopped after {self.events:,} scheduling steps, "
                    f"more than the {self.limit:,} its {len(self.index):,} requests need (10 per prompt chunk and "
                    f"request: hcsim.run.serving.EVENTS_PER_REQUEST): {self.preempted:,} preemptions recomputed "
                    f"{self.recomputed:,} tokens, the KV cache of {self.platform.hbm_blocks * self.config.block_size:,}"
                    f" tokens in HBM thrashing between requests of up to {longest:,} tokens. Fix: fewer sequences at "
                    f"once (serving.max_num_seqs), shorter requests, or more KV memory (more tp or pp, extended memory "
                    f"with spill: allow), or set HCSIM_NO_LIMITS=1 to run it anyway")
            step = self._decode_run() or self._step()
            if step is not None:
                return step
        if self.role == "decode" and self.router.expects(self.replica):  # requests still to land: wait for one
            return math.inf
        if self.arrivals is not None and self.arrivals.upcoming() is not None:  # requests still to arrive
            return self.arrivals.upcoming()
        if self.update is not None:
            self.update(len(self.index) - self.reported)
            self.update = None
        return None

    def _new_slot(self, q: int, prompt: int, output: int, group: int) -> int:
        """A slot for request q appended to every per-slot array (PER_SLOT)."""
        i = len(self.index)
        for name in self.PER_SLOT:
            getattr(self, name).append(0)
        self.index[i], self.prompt[i], self.output[i], self.group[i] = q, prompt, output, group
        return i

    def take(self, q: Request) -> int:
        """(routing least_loaded) Request q, arrived, routed here: its new slot, at the end of the waiting queue."""
        i = self._new_slot(q.index, q.prompt, q.output, q.group)
        self.arrival[i] = q.arrival
        self.waiting.append(i)
        return i

    def receive(self, q: int, prompt: int, output: int, group: int, now: float, first: float) -> None:
        """(decode) Request q's KV cache of its `prompt` landed at `now`, its first token made by its prefill
        replica at `first`: a new slot, which waits for blocks here (in order of landing: its arrival here is
        `now` until the run ends), then decodes the rest of its `output`."""
        i = self._new_slot(q, prompt, output, group)
        self.received += 1
        self.landed[i] = self.arrival[i] = now
        self.first[i] = self.last_token[i] = first
        self.computed[i] = prompt
        self.made[i] = 1
        self.waiting.append(i)

    def handed_off(self, i: int, now: float) -> None:
        """(prefill) Slot `i`'s handoff landed at `now`: its blocks are free."""
        self._release(i)
        self.holding -= 1
        self._record(now)

    def run(self, limit: int, update=None) -> None:
        """Ready for the engine's run, which asks this scheduler step by step (:meth:`advance`): at most `limit`
        steps and runs; `update`, if given, receives how many more requests have finished, now and then."""
        self.limit, self.update, self.events, self.reported = limit, update, 0, 0

    def _finish(self, now: float, done: int) -> None:
        """The pending step's (or run's `done` steps') effects at `now`, when it ended."""
        self.now = now
        kind, self._pending = self._pending, None
        if kind[0] == "run":
            self.read_tokens += kind[2] * done  # (its spilled part stays as it is over the run; HBM's grows by
            self.hbm_read_tokens += kind[3] * done + kind[4] * done * (done - 1) // 2  # a token per sequence a step)
            self._finish_run(done, kind[1])
        else:
            self._finish_step(*kind[1:])

    def _tokens(self, i: int) -> int:
        return self.prompt[i] + self.made[i]

    def _expected(self, i: int) -> int:
        """(SGLang) The output tokens slot `i` is expected still to make, as its admission counts them."""
        return min(self.output[i] - self.made[i], self.config.new_token_ratio.clip)

    def _reserved(self) -> float:
        """(SGLang) The KV tokens the running requests are expected still to need: their remaining outputs x the
        new-token ratio; 0 for schedulers that admit by blocks alone."""
        if self.ratio is None:
            return 0.0
        return math.fsum(self._expected(r) for r in self.running) * self.ratio

    def _estimate_admits(self, i: int, reserved: float) -> bool:
        """Whether SGLang admits slot `i` (SCHEDULERS' comment) while `reserved` tokens are expected to be taken
        (the running requests' and those admitted before it in this step): True for schedulers that admit by
        blocks alone."""
        if self.ratio is None:
            return True
        room = self._available() * self.config.block_size - reserved
        return self._tokens(i) - self.computed[i] + self._expected(i) < room

    def _admit(self, budget: int, scheduled: list) -> tuple[int, float]:
        """Admit waiting requests in arrival order while they fit; the budget left and the bytes swapped in."""
        config, swap_in, reserved = self.config, 0.0, self._reserved()
        while self.waiting and budget > 0 and len(self.running) < config.max_num_seqs:
            i = self.waiting[0]
            if self.arrival[i] > self.now:
                break
            if not self._estimate_admits(i, reserved):
                break
            if (self.offload is not None and self.offload.policy != "in_place" and self.prefix_blocks
                    and not self.computed[i] and not self.swapped[i] and self.groups[self.group[i]].ext
                    and self.group[i] not in self.loading_groups):  # its prefix offloaded: back into HBM first
                moved = self._load_prefix(i, config.watermark > 0)
                if moved is None:
                    break
                if moved < 0:
                    self.waiting.popleft()
                    continue
                swap_in += moved
            hit = self._prefix_hit(i)
            new = self._tokens(i) - self.computed[i]
            watermark = config.watermark > 0
            if self.swapped[i] == 1 and self.offload is not None and (config.chunked_prefill or new <= budget):
                moved = self._resume(i, min(new, budget), watermark)
                if moved is None:
                    break
                if moved < 0:  # prefetching: it joins a step once its blocks land
                    self.waiting.popleft()
                    continue
                swap_in += moved
            if (not config.chunked_prefill and new > budget) or not self._allocate(
                    i, self.computed[i] + min(new, budget), watermark=watermark):
                if hit:
                    self._release(i)
                    self.computed[i] = 0
                break
            self.waiting.popleft()
            self.query_tokens += self._tokens(i) if not self.swapped[i] and self.role != "decode" else 0
            self.hit_tokens += hit
            if self.swapped[i] and self.offload is None:  # (vLLM's swap: back from host memory in this step)
                size = self.computed[i] * self.platform.token_bytes
                self.swap_used -= size
                swap_in += size
            self.swapped[i] = 0
            new = min(new, budget)
            if self.ratio is not None:  # its prompt's chunks to come and expected output (its first chunk's blocks
                reserved += self._tokens(i) - self.computed[i] - new + self._expected(i)  # are taken already)
            self.running.append(i)
            scheduled.append((i, new))
            budget -= new
        return budget, swap_in

    def _continue_prefills(self, budget: int, scheduled: list) -> int:
        """(chunks_with_decodes off) The next chunk of every running request whose prompt is not all computed, in
        order, within `budget` and the free blocks: SGLang's chunked request, which runs in a prefill batch, never
        beside decodes. The budget left."""
        for i in self.running:
            if self.made[i] or budget <= 0:
                continue
            new = min(self._tokens(i) - self.computed[i], budget)
            if not self._allocate(i, self.computed[i] + new):
                break
            scheduled.append((i, new))
            budget -= new
        return budget

    def _step(self):
        """One step as the scheduler builds it (its blocks taken, its preemptions done): what :meth:`advance`
        returns for it, or None when it preempted every running request and has nothing to run."""
        config = self.config
        scheduled: list[tuple[int, int]] = []
        swap = 0.0
        budget = config.max_num_batched_tokens
        preempted = False
        if config.prefill_first:  # V0, SGLang: waiting prompts that fit run alone (SGLang: chunks continue first)
            if config.chunked_prefill and not config.chunks_with_decodes:
                budget = self._continue_prefills(budget, scheduled)
            budget, swap = self._admit(budget, scheduled)
        if not scheduled and self._decodes_fit(budget):  # every running request decodes a token from HBM
            decodes = list(self.running)
            if not config.prefill_first:
                swap += self._admit(budget - len(decodes), scheduled)[1]
            return self._plan_step(scheduled, swap, decodes)
        if not scheduled:
            index, running, computed, prompt, made = 0, self.running, self.computed, self.prompt, self.made
            bs, hit, hbm, ext = config.block_size, self.hit, self.hbm, self.ext
            while index < len(running) and budget > 0:
                i = running[index]
                new = prompt[i] + made[i] - computed[i]
                if new > budget:
                    new = budget
                need = -(-(computed[i] + new) // bs) - hit[i] - hbm[i] - ext[i]
                if need <= 0 or 0 < need <= self.free_hbm:  # the common cases, inline: no block, or one from HBM
                    if need > 0:
                        self.free_hbm -= need
                        hbm[i] += need
                    scheduled.append((i, new))
                    budget -= new
                    index += 1
                    continue
                while not self._allocate(i, computed[i] + new):
                    victim = self.running.pop()
                    self._preempt(victim)
                    preempted = True
                    if self.ratio is not None:  # SGLang's retraction resets its estimate from those it keeps
                        self.ratio = config.new_token_ratio.after_retraction(
                            sum(made[r] for r in running), sum(self.output[r] for r in running), len(running))
                    if victim == i:
                        break
                else:
                    scheduled.append((i, new))
                    budget -= new
                    index += 1
                    continue
                break
            if not preempted and not config.prefill_first:
                budget, swap_in = self._admit(budget, scheduled)
                swap += swap_in
        if not scheduled:
            if preempted:  # every running request gave its blocks back: the next step admits again
                return None
            # the next request to run waits for its prefetch (or for blocks one frees), or (prefill) for blocks
            # held for handoffs in flight, which free them as they land
            if self.loading or self.holding:
                return math.inf
            i = self.waiting[0]
            raise ConfigError(f"serving workload {self.spec.name!r}: request {self.index[i]} cannot be scheduled on "
                              f"an idle replica: it needs {self._tokens(i):,} tokens of KV cache "
                              f"({self._blocks(self._tokens(i)):,} blocks of {config.block_size}) and the replica has "
                              f"{self.total_blocks:,} blocks, {config.watermark:.0%} of them kept free by the "
                              f"{config.name} scheduler. Fix: shorter requests, more tp or pp, or extended memory "
                              f"with spill: allow")
        return self._plan_step(scheduled, swap)

    def _decodes_fit(self, budget: int) -> bool:
        """Whether every running request decodes its next token this step with no preemption, no block beyond
        HBM and no spilled read (then the step's decodes are counted together); if so, their new blocks taken."""
        running, computed, prompt, made = self.running, self.computed, self.prompt, self.made
        if not running or len(running) > budget or self.free_ext != self.platform.ext_blocks or not self._fast:
            return False
        if not all(made[i] and computed[i] == prompt[i] + made[i] - 1 for i in running):
            return False
        bs, hit, hbm, ext = self.config.block_size, self.hit, self.hbm, self.ext
        short = [i for i in running if -(-(computed[i] + 1) // bs) > hit[i] + hbm[i] + ext[i]]
        if len(short) > self.free_hbm:
            return False
        for i in short:  # one block each: the token starts it
            hbm[i] += 1
        self.free_hbm -= len(short)
        return True

    _fast = True  # (tests turn the path of _decodes_fit off to check it gives the same run)

    def _plan_step(self, scheduled: list[tuple[int, int]], swap: float, decodes=()):
        """The work of the step of the `scheduled` (slot, tokens) entries and of the `decodes` (slots decoding a
        token from HBM, :meth:`_decodes_fit`), pending until it ends (:meth:`_finish_step`)."""
        bs, tokens, sampled, chunks, decode, resident, spilled = self.config.block_size, 0, 0, [], 0, 0, 0
        computed, prompt, made, ext, hit = self.computed, self.prompt, self.made, self.ext, self.hit
        if decodes:
            n = len(decodes)
            tokens, sampled, decode, resident = n, n, n, sum(computed[i] for i in decodes) + n
        for i, new in scheduled:  # (the loops are written out: a step of 1,024 sequences runs them 1,024 times)
            before = computed[i]
            tokens += new
            if before + new >= prompt[i] + made[i]:
                sampled += 1
            spilled_i = ext[i] + (self.groups[self.group[i]].ext if hit[i] else 0)
            ext_tokens = min(before, bs * spilled_i) if spilled_i else 0
            spilled += ext_tokens
            if new == 1 and before >= prompt[i]:
                decode += 1
                resident += before + 1 - ext_tokens
            else:
                chunks.append((new, before))
        if tokens > self.max_tokens:
            self.max_tokens = tokens
        store, self.pending_store = self.pending_store, 0.0  # (preemptions and evictions since the last step)
        self.kinds["mixed" if chunks and decode else "prefill" if chunks else "decode"] += 1
        self.read_tokens += spilled
        self.hbm_read_tokens += resident
        self._pending = ("step", scheduled, decodes)
        return 1, math.inf, self.cost.work(tokens, sampled, chunks, decode, resident, spilled, swap, store), None

    def _finish_step(self, scheduled, decodes) -> None:
        """The step's effects at its end (`now`): a token for each entry that has computed all it knows, the first
        token's and the finish's times, blocks freed at the finish, the gaps since each slot's last token."""
        computed, prompt, made, output = self.computed, self.prompt, self.made, self.output
        now, last, longest, gaps = self.now, self.last_token, self.itl_max, {}
        self.steps += 1
        done = False
        for i in decodes:
            computed[i] += 1
            made[i] += 1
            gap = now - last[i]
            gaps[gap] = gaps.get(gap, 0) + 1
            last[i] = now
            if gap > longest[i]:
                longest[i] = gap
            if self.prefix_blocks:  # its prefix blocks become its group's if the group's were evicted
                self._donate(i)
            if made[i] >= output[i]:
                self.finish[i] = now
                self._release(i)
                done = True
        for i, new in scheduled:
            computed[i] += new
            if self.prefix_blocks:
                self._donate(i)
            if computed[i] >= prompt[i] + made[i]:
                made[i] += 1
                if made[i] > 1:  # (a recomputed request's next token: its gap holds the time it waited)
                    gap = now - last[i]
                    gaps[gap] = gaps.get(gap, 0) + 1
                    if gap > longest[i]:
                        longest[i] = gap
                last[i] = now
                if made[i] == 1:
                    self.first[i] = now
                    if self.role == "prefill":  # its KV cache goes to its decode replica, read from its blocks,
                        self.outgoing.append(i)  # which it holds until the cache has landed (handed_off)
                        self.holding += 1
                        done = True
                        continue
                if made[i] >= output[i]:
                    self.finish[i] = now
                    self._release(i)
                    done = True
        if done:
            if self.role == "prefill":  # (handed off at their first token)
                self.running = [i for i in self.running if not made[i]]
            else:
                self.running = [i for i in self.running if made[i] < output[i]]
        for gap, tokens in gaps.items():
            self.itl_values.append(gap)
            self.itl_weights.append(tokens)
        if self.ratio is not None and all(new == 1 for _, new in scheduled):  # a decode batch
            self.ratio = self.config.new_token_ratio.after_decodes(self.ratio, 1)
        self._record()

    def _record(self, now: float | None = None) -> None:
        bs = self.config.block_size
        self.trace_time.append(self.now if now is None else now)
        self.trace_hbm.append((self.platform.hbm_blocks - self.free_hbm) * bs)
        self.trace_ext.append((self.platform.ext_blocks - self.free_ext) * bs)
        self.trace_running.append(len(self.running))
        self.trace_moved.extend((self.stored_blocks, self.loaded_blocks, self.read_tokens, self.hbm_read_tokens))

    def _decode_run(self):
        """k >= 2 steps as one run where they are decodes of the same running sequences with nothing else possible
        (module docstring): what :meth:`advance` returns for it; False where not."""
        running, config = self.running, self.config
        n = len(running)
        if not n or n > config.max_num_batched_tokens:
            return False
        computed, made, prompt, output = self.computed, self.made, self.prompt, self.output
        remaining = min([output[i] - made[i] for i in running]) - 1  # steps before the first finish
        if remaining < 2 or self.pending_store or not all([made[i] and computed[i] == prompt[i] + made[i] - 1
                                                           for i in running]):
            return False  # (bytes to store go in the next step: not a plain decode)
        if self.waiting and self.arrival[self.waiting[0]] <= self.now and (self.ratio is not None
                                                                            or self._admissible(n)):
            return False  # the next step admits a request (SGLang's estimate may let it in any step): not a run
        # the steps for which HBM has a block for every new token (the spilled part stays as it is)
        bs, hit, hbm, ext = config.block_size, self.hit, self.hbm, self.ext

        def blocks_for(k):
            return sum([max(0, -(-(computed[i] + k) // bs) - hit[i] - hbm[i] - ext[i]) for i in running])

        k = remaining
        if blocks_for(k) > self.free_hbm:
            low, high = 0, k
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if blocks_for(mid) <= self.free_hbm else (low, mid - 1)
            k = low
        if k < 2:
            return False
        resident = spilled = 0
        if self.free_ext == self.platform.ext_blocks:  # nothing beyond HBM
            resident = sum([computed[i] for i in running]) + n
        else:
            for i in running:
                ext_tokens = min(computed[i], bs * (ext[i] + (self.groups[self.group[i]].ext if hit[i] else 0)))
                spilled += ext_tokens
                resident += computed[i] + 1 - ext_tokens

        cost = self.cost
        work, following = cost.work(n, n, (), n, resident, spilled), cost.work(n, n, (), n, resident + n, spilled)
        slope = following.compute - work.compute
        while k > 2 and abs(cost.work(n, n, (), n, resident + (k - 1) * n, spilled).compute
                            - (work.compute + (k - 1) * slope)) > 1e-9 * work.compute:
            k //= 2  # the kernels' time is not affine in the context over the run (a roofline's kink): a shorter run
        if k < 2:
            return False
        until = math.inf
        if self.waiting and self.arrival[self.waiting[0]] > self.now and n < config.max_num_seqs:
            until = self.arrival[self.waiting[0]]  # stop after the step in which it arrives
        elif self.arrivals is not None and self.arrivals.upcoming() is not None and n < config.max_num_seqs:
            until = self.arrivals.upcoming()  # (least_loaded: it may be routed here)
        self._pending = ("run", self.now, spilled, resident, n)
        return k, until, work, following

    def _finish_run(self, k: int, start: float) -> None:
        """The effects of `k` decodes of every running sequence (:meth:`_decode_run`), begun at `start`, at their
        end (`now`). The engine tells the run's end, not each step's: each of its k gaps is taken as its mean, the
        steps differing by one token of context each (and the first gap of a sequence that made no token at
        `start`, a handoff's, by the time before it)."""
        running, bs, hit, hbm, ext = self.running, self.config.block_size, self.hit, self.hbm, self.ext
        computed, made, last, longest = self.computed, self.made, self.last_token, self.itl_max
        step, now = (self.now - start) / k, self.now
        if self.ratio is not None:
            self.ratio = self.config.new_token_ratio.after_decodes(self.ratio, k)
        late = 0
        for i in running:
            if last[i] != start:
                gap = start + step - last[i]
                self.itl_values.append(gap)
                self.itl_weights.append(1)
                late += 1
                longest[i] = max(longest[i], gap, step if k > 1 else 0.0)
            elif step > longest[i]:
                longest[i] = step
            last[i] = now
        self.itl_values.append(step)
        self.itl_weights.append(len(running) * k - late)
        self.steps += k
        self.kinds["decode"] += k
        self.max_tokens = max(self.max_tokens, len(running))
        taken = 0
        for i in running:  # the blocks of their k new tokens, from HBM (blocks_for made sure it has them)
            computed[i] += k
            made[i] += k
            need = -(-computed[i] // bs) - hit[i] - hbm[i] - ext[i]
            if need > 0:
                hbm[i] += need
                taken += need
        self.free_hbm -= taken
        self._record()

    def _admissible(self, decodes: int) -> bool:
        """Whether the waiting queue's head (arrived) would be admitted in a step beside `decodes` decodes. What
        holds it back (sequences, the budget, blocks) does not ease while those sequences decode."""
        config, i = self.config, self.waiting[0]
        if len(self.running) >= config.max_num_seqs:
            return False
        budget = config.max_num_batched_tokens - (0 if config.prefill_first else decodes)
        if budget <= 0:
            return False
        group = self.groups[self.group[i]]
        cached = 0
        if (self.prefix_blocks and not self.computed[i] and not self.swapped[i]
                and self.group[i] not in self.loading_groups):
            cached = min(group.hbm + group.ext, (self._tokens(i) - 1) // config.block_size)
        computed = self.computed[i] if self.swapped[i] else cached * config.block_size
        new = self._tokens(i) - computed
        if not config.chunked_prefill and new > budget:
            return False
        need = self._blocks(computed + min(new, budget)) - cached - self.hbm[i]  # (a prefetched slot's are in HBM)
        if self.swapped[i] == 1 and self.offload is not None:  # offloaded: in_place reads its tier blocks there,
            policy = self.offload.policy  # prefetch needs HBM for them first
            need = need - self.ext[i] if policy == "in_place" else self.ext[i] if policy == "prefetch" else need
        reserve = math.ceil(config.watermark * self.total_blocks) if config.watermark else 0
        return need + reserve <= self._available()

    def records(self) -> list[dict]:
        rows = []
        for i in range(len(self.index)):
            first, finish, out = self.first[i], self.finish[i], self.output[i]
            rows.append({"request": self.index[i], "arrival_s": self.arrival[i], "prompt": self.prompt[i],
                         "output": out, "first_token_s": first, "finish_s": finish,
                         "ttft_s": first - self.arrival[i], "tpot_s": (finish - first) / (out - 1),
                         "e2e_s": finish - self.arrival[i], "itl_max_s": self.itl_max[i],
                         "preemptions": self.preemptions[i]})
        if self.role == "decode":  # when its KV cache landed here from its prefill replica, and the two replicas
            for row, landed in zip(rows, self.landed):
                row["kv_landed_s"] = landed
                row["prefill_replica"] = self.router.prefill_replica(row["request"])
                row["decode_replica"] = self.replica
        else:
            for row in rows:
                row["replica"] = self.replica
        return rows


def simulate_serving(scenario: Scenario, spec: ServingSpec, progress=None, *, private: str = "analytic"
                     ) -> dict[str, Any]:
    """Run `spec` on the scenario's platform (module docstring); the result record. `progress`, if given, is
    called with the number of requests and returns a callable that receives how many more have finished.
    `private`: ``analytic`` (a step's phase that no other transfer can slow is one delay of its time alone) or
    ``simulated`` (every phase in full; the same times, more activities: for tests).

    The steps run on the engine core, whose SimGrid Engine a process may make once: where this process has made
    it already, the run goes to a fresh process (its progress then told at its end)."""
    import time

    from hcsim.engine import core

    wall = time.perf_counter()
    if private not in ("analytic", "simulated"):
        raise ConfigError(f"simulate_serving: private must be analytic or simulated, got {private!r}")
    inputs = _inputs(scenario, spec)
    if not core.available():
        raise ConfigError(f"the engine core is not built: {core.unavailable_reason()}")
    if core.load().engine_started():
        from hcsim.run.fresh import in_fresh_process

        result = in_fresh_process(_serve_here, scenario, spec, private)
        if progress:
            progress(spec.requests)(spec.requests)
        return result
    serving = ServingRun(scenario, spec, progress, inputs=inputs)
    counters = serving.engine.run(serving.schedulers, serving.arrivals, analytic=private == "analytic")
    return serving.result(counters, wall)


class ServingRun:
    """A serving run set up on its platform (:func:`simulate_serving`'s, or a serving job's beside training jobs,
    :mod:`hcsim.run.cojobs`): its schedulers, its engine (:class:`_Engine`) and arrivals; :meth:`result` makes
    the result record once the core has run them. `placed`: the platform spec, graph and XPUs of a job (else the
    scenario's first ``xpus`` XPUs of its platform); `progress` as :func:`simulate_serving`'s."""

    def __init__(self, scenario: Scenario, spec: ServingSpec, progress=None, placed=None, inputs=None):
        spec, sides, graph, xpus, requests = inputs or _inputs(scenario, spec, placed)
        platform = sides[0][0]
        self.scenario, self.spec, self.sides, self.requests = scenario, spec, sides, requests
        costs = {}  # one per side (replicas of one device)
        update = progress(spec.requests) if progress else None
        schedulers = []
        prefill, decode = spec.disaggregation or (0, 0)
        # co-located: request i on replica i mod dp, or the least loaded when it arrives (_Arrivals); disaggregated:
        # its prompt on prefill replica i mod prefill (or the least loaded), its decode on the decode replica (after
        # the prefill ones) _Router picks as its handoff starts
        takers = prefill or platform.dp
        dealt = spec.routing == "round_robin"
        roles = [("prefill" if prefill else None, requests[r::takers] if dealt else []) for r in range(takers)] + [
            ("decode", [])] * decode
        for r, (role, mine) in enumerate(roles):
            side, side_config = sides[r]
            cost = costs.setdefault(id(side), _StepCost(spec, side))
            bound = mine if dealt and role != "decode" else requests  # (a replica may be given any request)
            chunks = sum(-(-q.prompt // side_config.max_num_batched_tokens) for q in bound)
            scheduler = _Scheduler(spec, side_config, side, cost, mine, role, r)
            scheduler.run(EVENTS_PER_REQUEST * (chunks + 4 * len(bound)) + 10_000,
                          update if role != "prefill" else None)
            schedulers.append(scheduler)
        self.schedulers = schedulers
        self.engine = _Engine(spec, sides, graph, xpus)
        self.arrivals = _Arrivals(requests, schedulers, takers, spec.routing)

    def result(self, counters: dict, wall: float) -> dict[str, Any]:
        """The result record of the run the core has run (`counters`: its activities; `wall`: when it began, a
        time.perf_counter())."""
        import time

        scenario, spec, sides, requests = self.scenario, self.spec, self.sides, self.requests
        schedulers, arrivals = self.schedulers, self.arrivals
        platform, config = sides[0]
        prefill, decode = spec.disaggregation or (0, 0)
        if prefill:  # a request's rows of its two replicas as one: its first token from prefill, the rest from decode
            for scheduler in schedulers[prefill:]:
                slots = scheduler.index
                scheduler.arrival = array("d", (requests[q].arrival for q in slots))
                for i, q in enumerate(slots):
                    scheduler.preemptions[i] += schedulers[arrivals.replica[q]].preemptions[arrivals.slot[q]]
        records, occupancy = [], []
        token_total = kv_bytes_per_token(spec.model, spec.precision)  # one token's KV over a replica's XPUs
        block_total = token_total * config.block_size
        moved = {"stored_blocks": 0, "loaded_blocks": 0, "read_tokens": 0, "hbm_read_tokens": 0}
        steps = preempted = hits = queries = most = recomputed = 0
        kinds = {"prefill": 0, "mixed": 0, "decode": 0}
        for r, scheduler in enumerate(schedulers):
            if scheduler.role != "prefill":
                records += scheduler.records()
            occupancy += _occupancy_rows(r, scheduler, block_total, token_total)
            for key, blocks in (("stored", scheduler.stored_blocks), ("loaded", scheduler.loaded_blocks)):
                moved[key + "_blocks"] += blocks
            moved["read_tokens"] += scheduler.read_tokens
            moved["hbm_read_tokens"] += scheduler.hbm_read_tokens
            steps += scheduler.steps
            preempted += scheduler.preempted
            recomputed += scheduler.recomputed
            hits += scheduler.hit_tokens
            queries += scheduler.query_tokens
            most = max(most, scheduler.max_tokens)
            kinds = {kind: kinds[kind] + scheduler.kinds[kind] for kind in kinds}
        records.sort(key=lambda row: row["request"])
        if [row["request"] for row in records] != list(range(len(requests))) or any(
                not row["finish_s"] >= row["first_token_s"] >= row["arrival_s"] for row in records):
            raise RuntimeError("serving: a request was lost, served twice or not finished (a bug)")
        makespan = max(row["finish_s"] for row in records)
        tokens = sum(row["output"] for row in records)
        bs = config.block_size
        devices = {side.device: side for side, _ in sides}  # (in order of the replicas)
        return {
            "kind": "serving", "scenario": scenario.name, "platform": scenario.platform, "workload": spec.name,
            "model": spec.model.name, "precision": spec.precision, "xpus": scenario.xpus,
            "device": " + ".join(devices), "replica_devices": [side.device for side, _ in sides],
            "layout": {"tp": platform.tp, "pp": platform.pp, "dp": platform.dp}
            | ({"prefill": prefill, "decode": decode} if prefill else {}),
            "scheduler": {"name": config.name, "max_num_seqs": config.max_num_seqs,
                          "max_num_batched_tokens": config.max_num_batched_tokens, "block_size": bs,
                          "chunked_prefill": config.chunked_prefill, "prefix_caching": config.prefix_caching,
                          "preemption": config.preemption, "gpu_memory_utilization": config.gpu_memory_utilization,
                          **({"kv_offload": {"tier": spec.kv_offload.tier, "policy": spec.kv_offload.policy,
                                             "size_per_xpu": spec.kv_offload.size}} if spec.kv_offload else {}),
                          "step_overhead_s": config.step_overhead},
            "requests": len(records), "output_tokens": tokens, "makespan_s": makespan,
            "throughput_tokens_per_s": tokens / makespan, "requests_per_s": len(records) / makespan, "steps": steps,
            "steps_by_kind": kinds, "max_step_tokens": most, "preemptions": preempted,
            "gemm_clocks": lowest_clocks((s.platform.device, s.cost.lowest_clock) for s in schedulers),
            "recomputed_tokens": recomputed,
            "prefix_cache": {"hit_tokens": hits, "query_tokens": queries, "hit_rate": hits / queries if queries else 0.0},
            "ttft_s": percentiles([row["ttft_s"] for row in records]),
            "tpot_s": percentiles([row["tpot_s"] for row in records]),
            "e2e_s": percentiles([row["e2e_s"] for row in records]),
            "itl_s": percentiles([gap for scheduler in schedulers for gap in scheduler.itl_values],
                                 [tokens for scheduler in schedulers for tokens in scheduler.itl_weights]),
            **(_goodput(spec.slo, records, makespan) if spec.slo else {}),
            **({"handoff_s": percentiles([row["kv_landed_s"] - row["first_token_s"] for row in records])} if prefill
               else {}),
            "kv": {"bytes_per_token": kv_bytes_per_token(spec.model, spec.precision),
                   "hbm_tokens_per_replica": platform.hbm_blocks * bs,
                   "hbm_tokens_by_device": {device: side.hbm_blocks * bs for device, side in devices.items()},
                   "extended_tokens_per_replica": None if platform.ext_unbounded else platform.ext_blocks * bs,
                   "spilled_to": platform.spilled_to, "weights_bytes_per_xpu": platform.weights,
                   "workspace_bytes_per_xpu": platform.workspace,
                   "peak_hbm_tokens": max((row[2] for row in occupancy), default=0),
                   "peak_extended_tokens": max((row[3] for row in occupancy), default=0),
                   "tiers": _tiers(platform, moved, block_total, token_total)},
            "per_request": records, "occupancy": occupancy, "activities": counters["activities"],
            "wall_time_s": time.perf_counter() - wall,
        }


def _goodput(slo, records: list[dict], makespan: float) -> dict[str, Any]:
    """The result's SLO keys: the objectives, and the requests that met both (each row's meets_slo, set here) as
    a count, a share of the requests and a rate over the run's makespan (DistServe's goodput)."""
    met = 0
    for row in records:
        row["meets_slo"] = slo.met(row["ttft_s"], row["tpot_s"])
        met += row["meets_slo"]
    return {"slo": {"ttft_s": slo.ttft, "tpot_s": slo.tpot},
            "goodput": {"requests": met, "share": met / len(records), "requests_per_s": met / makespan}}


OCCUPANCY_COLUMNS = ("replica", "time_s", "hbm_tokens", "extended_tokens", "running", "stored_bytes", "loaded_bytes",
                     "extended_read_bytes", "hbm_read_bytes")


def _occupancy_rows(replica: int, scheduler: _Scheduler, block_total: float, token_total: float) -> list[tuple]:
    """Replica `replica`'s KV cache after each step or run of steps (OCCUPANCY_COLUMNS): tokens in HBM and beyond
    it, sequences running, and the bytes over the replica's XPUs moved since the row before: stored into the
    offload tier, loaded back from it (counted when the load starts), read by the steps beyond HBM (in place or
    copied) and by the decodes in HBM."""
    rows, before = [], (0, 0, 0, 0)
    moved = scheduler.trace_moved
    for n, (t, h, e, running) in enumerate(zip(scheduler.trace_time, scheduler.trace_hbm, scheduler.trace_ext,
                                                scheduler.trace_running)):
        now = tuple(moved[4 * n:4 * n + 4])
        rows.append((replica, t, h, e, running, (now[0] - before[0]) * block_total,
                     (now[1] - before[1]) * block_total, (now[2] - before[2]) * token_total,
                     (now[3] - before[3]) * token_total))
        before = now
    return rows


def _tiers(platform: _Platform, moved: dict, block_total: float, token_total: float) -> dict:
    """result["kv"]["tiers"]: HBM, and the memory beyond it (the kv_offload tier, or where blocks spill) with the
    blocks and bytes (over every XPU) stored into it and loaded back; the bytes the steps read from each: beyond
    HBM every step's reads there (in place where coherent, else copied into HBM for the step), from HBM the
    decodes' (a prefill chunk's reads of its cached tokens in HBM are not counted)."""
    tiers = {"hbm": {"blocks_per_replica": platform.hbm_blocks, "read_bytes": moved["hbm_read_tokens"] * token_total}}
    if platform.spilled_to is not None:
        tiers[platform.spilled_to] = {
            "blocks_per_replica": None if platform.ext_unbounded else platform.ext_blocks,
            "use": (f"kv_offload {platform.offload.tier}, policy {platform.offload.policy}" if platform.offload
                    else "spill"),
            "read": "in place" if platform.coherent else "copied",
            "stored_blocks": moved["stored_blocks"], "stored_bytes": moved["stored_blocks"] * block_total,
            "loaded_blocks": moved["loaded_blocks"], "loaded_bytes": moved["loaded_blocks"] * block_total,
            "read_bytes": moved["read_tokens"] * token_total}
    return tiers


def _serve_here(scenario: Scenario, spec: ServingSpec, private: str) -> dict[str, Any]:
    """:func:`simulate_serving` in a fresh process (its SimGrid Engine)."""
    return simulate_serving(scenario, spec, private=private)


def _checked(scenario: Scenario, spec: ServingSpec):
    """:func:`_inputs` with the first replica's side: the spec, its platform and scheduler, the platform graph,
    the run's XPUs and its requests."""
    spec, sides, graph, xpus, requests = _inputs(scenario, spec)
    return (spec, *sides[0], graph, xpus, requests)


def _inputs(scenario: Scenario, spec: ServingSpec, placed=None):
    """The run's inputs checked before anything runs: the spec at the scenario's precision, each replica's side
    (platform and scheduler), the platform graph, the run's XPUs and its requests; one ConfigError for what cannot
    run. `placed`: :func:`_setup`'s."""
    check_serving_scenario(scenario, spec)
    if scenario.precision is not None:
        spec = replace(spec, precision=scenario.precision)
    estimate = spec.requests * BYTES_PER_REQUEST
    if estimate > MAX_SERVING_MEMORY:
        raise ConfigError(f"serving workload {spec.name!r}: {spec.requests:,} requests would take about "
                          f"{format_quantity(estimate, 'B')} ({BYTES_PER_REQUEST:,} B per request), more than the "
                          f"{format_quantity(MAX_SERVING_MEMORY, 'B')} a serving run may use (hcsim.run.serving). "
                          f"Fix: fewer requests per run")
    sides, graph, xpus = _setup(scenario, spec, placed)
    requests = make_requests(spec)
    longest = max(requests, key=lambda q: q.prompt + q.output)
    for platform, config in {id(side): side for side in sides}.values():
        blocks = -(-(longest.prompt + longest.output) // config.block_size)
        if blocks > platform.hbm_blocks + (platform.ext_blocks if platform.admit_beyond_hbm else 0):  # (unbounded)
            bs = config.block_size
            raise ConfigError(f"serving workload {spec.name!r}: request {longest.index} needs a KV cache of "
                              f"{longest.prompt + longest.output:,} tokens; one {platform.device} replica holds "
                              f"{platform.hbm_blocks * bs:,} in HBM and "
                              f"{platform.ext_blocks * bs if platform.admit_beyond_hbm else 0:,} in extended memory"
                              f"{' (the kv_offload tier holds only preempted requests)' if platform.offload else ''}. "
                              f"Fix: shorter requests, more tp or pp, or extended memory with spill: allow")
    return spec, sides, graph, xpus, requests


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingBounds:
    """Lower bounds on a serving run's times (s), in closed form: each request's time to first token (`ttft`)
    and per output token (`tpot`) alone on the fastest replica of its role (:func:`serving_bounds`), and the run's
    makespan. :meth:`goodput` is then an upper bound on the run's goodput."""

    ttft: tuple[float, ...]
    tpot: tuple[float, ...]
    makespan: float

    def goodput(self, slo) -> float:
        """Requests per second that meet `slo` at most: those whose bounds meet it, over the makespan's bound."""
        return sum(slo.met(a, b) for a, b in zip(self.ttft, self.tpot)) / self.makespan


def serving_bounds(scenario: Scenario, spec: ServingSpec, memo: dict | None = None) -> ServingBounds:
    """:class:`ServingBounds` of `spec` on the scenario's layout, after the checks a run makes before it starts
    (ConfigError: the weights leave no room for a KV block, a request's cache does not fit a replica, ...).

    A request alone on a replica takes the closed form's time (:meth:`_Platform.step_time` of each step; the
    tests hold the engine to it), and a step with more in it is not faster: its time to first token is at least
    its prompt's chunks alone (every prefix block it may hit already cached), its time per output token at least
    one decode step alone at its prompt's context. The makespan is at least each request's arrival plus those
    times, and at least the FLOP of the tokens through the GEMMs over the replicas' peak (no kernel runs faster
    than peak; a step's pipeline stages run one after another): prompts on the prefill replicas and outputs on
    the decode ones when disaggregated. `memo` (one per plan) keeps a device's per-request bounds across calls
    that share tp and pp."""
    spec, sides, _, _, requests = _inputs(scenario, spec)
    memo = {} if memo is None else memo
    prefill = (spec.disaggregation or (0, 0))[0]
    takers, decoders = (sides[:prefill], sides[prefill:]) if prefill else (sides, sides)
    lone = {}
    for side, config in sides:
        key = (side.device, side.tp, side.pp, config)
        if key not in memo:
            memo[key] = _lone_times(spec, side, config, requests)
        lone[id(side)] = memo[key]
    ttft = tuple(map(min, zip(*(lone[id(side)][0] for side, _ in takers))))
    tpot = tuple(map(min, zip(*(lone[id(side)][1] for side, _ in decoders))))
    makespan = max(q.arrival + a + (q.output - 1) * b for q, a, b in zip(requests, ttft, tpot))
    cost = _StepCost(spec, sides[0][0])  # FLOP per token on one TP rank (the same on every replica of the run)
    dense = cost.layers * math.fsum(op.flops for op in dense_kernels(spec.model, 1, sides[0][0].tp, spec.precision))
    head = math.fsum(op.flops for op in head_kernels(spec.model, 1, sides[0][0].tp, spec.precision))
    cached = [_cached_prefix(spec, sides[0][1], q) for q in requests]
    prompts = math.fsum((q.prompt - c) * dense + head for q, c in zip(requests, cached))
    outputs = math.fsum((q.output - 1) * (dense + head) for q in requests)
    peak = {role: math.fsum(side.peak for side, _ in group) for role, group in (("prefill", takers),
                                                                                 ("decode", decoders))}
    work = max(prompts / peak["prefill"], outputs / peak["decode"]) if prefill else \
        (prompts + outputs) / peak["prefill"]
    return ServingBounds(ttft=ttft, tpot=tpot, makespan=max(makespan, work))


def _cached_prefix(spec: ServingSpec, config: SchedulerConfig, q: Request) -> int:
    """The most prompt tokens request `q` may find cached (its group's shared prefix blocks, as
    :meth:`_Scheduler._prefix_hit` takes them)."""
    if not (config.prefix_caching and spec.shared_prefix):
        return 0
    bs = config.block_size
    return min(spec.shared_prefix // bs, (q.prompt - 1) // bs) * bs


def _lone_times(spec: ServingSpec, platform: _Platform, config: SchedulerConfig, requests) -> tuple[list, list]:
    """Per request, (its time to first token, its time per output token) alone on a replica of `platform`: its
    prompt's chunks of at most max_num_batched_tokens one step each, the last sampling its first token; then a
    decode step reading its prompt and that token."""
    cost = _StepCost(spec, platform)
    ttft, tpot = [], []
    for q in requests:
        done, total = _cached_prefix(spec, config, q), 0.0
        while done < q.prompt:
            new = min(config.max_num_batched_tokens, q.prompt - done)
            total += platform.step_time(cost.work(new, int(done + new >= q.prompt), [(new, done)], 0, 0, 0))
            done += new
        ttft.append(total)
        tpot.append(platform.step_time(cost.work(1, 1, (), 1, q.prompt + 1, 0)))
    return ttft, tpot


def percentiles(values, weights=None) -> dict[str, float]:
    """Mean and nearest-rank p50, p90, p99 of `values`, each counted `weights` times where given (the inter-token
    gaps of a step, equal for its sequences, come as one value and a count).

    >>> percentiles([1.0, 2.0, 3.0, 4.0])
    {'mean': 2.5, 'p50': 2.0, 'p90': 4.0, 'p99': 4.0}
    >>> percentiles([4.0, 1.0], [1, 3])
    {'mean': 1.75, 'p50': 1.0, 'p90': 4.0, 'p99': 4.0}
    """
    if weights is None:
        ordered = sorted(values)
        rank = {p: ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] for p in (50, 90, 99)}
        return {"mean": math.fsum(ordered) / len(ordered), "p50": rank[50], "p90": rank[90], "p99": rank[99]}
    pairs = sorted((v, w) for v, w in zip(values, weights) if w)
    total = sum(w for _, w in pairs)
    rank, seen, p = {}, 0, iter((50, 90, 99))
    wanted = next(p)
    for value, weight in pairs:
        seen += weight
        while wanted and seen >= math.ceil(wanted / 100 * total):
            rank[wanted] = value
            wanted = next(p, None)
    mean = math.fsum(v * w for v, w in pairs) / total
    return {"mean": mean, "p50": rank[50], "p90": rank[90], "p99": rank[99]}


def activation_workspace(spec: ServingSpec, tokens: int, sequences: int, tp: int) -> float:
    """Bytes per XPU a step of `tokens` tokens and `sequences` sampled sequences needs beside weights and KV
    (what vLLM's profiling forward pass measures, estimated): one layer's largest live tensors (its input,
    residual and the MLP's widened intermediate over the tokens, or over their top_k token-expert pairs in a
    mixture of experts) and the FP32 logits of the sequences."""
    from hcsim.workload.model import element_sizes

    model, e = spec.model, element_sizes(spec.precision).activation
    widen = 2 if model.mlp == "swiglu" else 1
    inner = model.top_k * model.expert_hidden if model.moe else model.ffn
    return tokens * (2 * model.hidden + (widen + 1) * inner / tp) * e + sequences * model.vocabulary / tp * 4.0


def _platform(scenario: Scenario, spec: ServingSpec) -> tuple[_Platform, SchedulerConfig]:
    """The platform side of the run's first replica: its XPUs, memories and paths, and the scheduler's knobs."""
    sides, _, _ = _setup(scenario, spec)
    return sides[0]


def _setup(scenario: Scenario, spec: ServingSpec, placed=None):
    """Each replica's side (:func:`_side`: its platform and scheduler; replicas of one device share one, from the
    first of them), the platform graph and the run's XPUs (in order). A replica's XPUs are of one device; replicas
    may differ (a mixed cluster: H100 prefill replicas beside H200 decode replicas). `placed`: (platform spec,
    platform graph, XPUs) of a serving job on a platform it shares (:mod:`hcsim.run.cojobs`), else the scenario's
    platform is built and its first ``xpus`` XPUs taken."""
    from hcsim.config import resolve_spec
    from hcsim.engine.compute_model import load_compute_model
    from hcsim.platform import build_platform, load_platform_spec
    from hcsim.platform.topology import xpus as platform_xpus
    from hcsim.run.prepare import check_whole_superchips, compute_factors_path

    if placed is not None:
        platform_spec, graph, xpus = placed
    else:
        base = Path(scenario.base)
        platform_spec = load_platform_spec(resolve_spec(scenario.platform, "platforms", base),
                                           scenario.platform_settings())
        if scenario.xpus > platform_spec.xpus:
            raise ConfigError(f"scenario {scenario.name!r}: xpus: {scenario.xpus} is more than platform "
                              f"{scenario.platform!r} has ({platform_spec.xpus})")
        check_whole_superchips(platform_spec, scenario.xpus, f"scenario {scenario.name!r}: xpus", scenario.platform)
        graph = build_platform(platform_spec, scenario.xpus)
        xpus = platform_xpus(graph)[: scenario.xpus]
    tp, pp = scenario.tp, scenario.pp
    if scenario.xpus % (tp * pp):
        raise ConfigError(f"scenario {scenario.name!r}: xpus {scenario.xpus} is not a multiple of tp x pp = "
                          f"{tp} x {pp}; valid: a multiple of {tp * pp}")
    if spec.disaggregation is not None:
        prefill, decode = spec.disaggregation
        dp = scenario.xpus // (tp * pp)
        if prefill + decode != dp:
            raise ConfigError(f"scenario {scenario.name!r}: serving.disaggregation.prefill {prefill} + "
                              f"serving.disaggregation.decode {decode} = {prefill + decode} replicas, but xpus "
                              f"{scenario.xpus} / (tp {tp} x pp {pp}) gives {dp}. Fix: prefill + decode = {dp}, or "
                              f"xpus = {(prefill + decode) * tp * pp}")
    model = spec.model
    for key, value in (("heads", model.heads), ("kv_heads", model.kv_heads or model.heads),
                       ("expert_ffn" if model.moe else "ffn", model.expert_hidden)):
        if value % tp:
            raise ConfigError(f"scenario {scenario.name!r}: tp {tp} does not divide the model's {key} ({value})")
    if pp > model.decoders:
        raise ConfigError(f"scenario {scenario.name!r}: pp {pp} is more than the model's {model.decoders} decoders")
    nodes, size = graph.nodes, tp * pp
    compute = load_compute_model(compute_factors_path(scenario))
    by_device, sides = {}, []
    for first in range(0, len(xpus), size):
        devices = sorted({nodes[x]["device"] for x in xpus[first:first + size]})
        if len(devices) > 1:
            raise ConfigError(f"scenario {scenario.name!r}: replica {first // size}'s {size} XPUs (tp {tp} x pp {pp}, "
                              f"{xpus[first]} to {xpus[first + size - 1]}) are {' and '.join(devices)}; a replica "
                              f"runs on one device. Fix: tp x pp within each device's XPUs (on a DGX platform a "
                              f"node's 8 GPUs are of one device: tp x pp dividing 8), or devices=[{devices[0]}]")
        if devices[0] not in by_device:
            by_device[devices[0]] = _side(scenario, spec, platform_spec, graph, xpus, first, compute)
        sides.append(by_device[devices[0]])
    return sides, graph, xpus


def _side(scenario: Scenario, spec: ServingSpec, platform_spec, graph, xpus: list[str], first: int, compute):
    """The platform and scheduler of the replica whose XPUs start at `first` (of `xpus`): its device's compute
    factors and peak, HBM blocks, extended memory or kv_offload tier, host memory, TP and pipeline links."""
    from hcsim.platform.devices import peak_flops
    from hcsim.platform.routes import RouteSearch, route_bandwidth, route_latency, shortest_routes
    from hcsim.run.prepare import coherent_memory, spill_policy
    from hcsim.workload.transformer import model_parameters

    nodes, model, tp, pp = graph.nodes, spec.model, scenario.tp, scenario.pp
    x0 = xpus[first]
    device = nodes[x0]["device"]
    factors = compute.device(device)
    compute = replace(compute, devices={device: replace(factors, launch=0.0, backward_launch=0.0)})
    config = scheduler_config(spec, device, nodes[nodes[x0]["local_memory"]]["capacity"])
    hbm = nodes[x0]["local_memory"]
    hbm_bandwidth = graph.edges[x0, hbm]["bandwidth"]
    token_bytes = kv_bytes_per_token(model, spec.precision) / (tp * pp)  # one XPU's share of a token's cache
    block_bytes = token_bytes * config.block_size
    weights = model_parameters(model) * 2.0 / (tp * pp)
    workspace = activation_workspace(spec, config.max_num_batched_tokens, config.max_num_seqs, tp)
    capacity = nodes[hbm]["capacity"]
    free = capacity * config.gpu_memory_utilization - weights - workspace
    if free < block_bytes:
        raise ConfigError(f"scenario {scenario.name!r}: {config.gpu_memory_utilization:g} of a {device}'s "
                          f"{format_quantity(capacity, 'B')} holds the weights of {model.name} "
                          f"({format_quantity(weights, 'B')} per XPU at tp {tp} x pp {pp}) and a step's activations "
                          f"({format_quantity(workspace, 'B')}) with no room for a KV block. Fix: more tp or pp, a smaller max_num_batched_tokens, or a larger "
                          f"serving.gpu_memory_utilization")
    ext, coherent, ext_blocks, ext_bandwidth, ext_latency = nodes[x0].get("extended_memory"), False, 0, 1.0, 0.0
    ext_unbounded = False
    spilled_to = None
    offload = spec.kv_offload
    search = RouteSearch(graph)
    if offload is not None:  # the tier takes the offloaded blocks; admission stays in HBM (spill does not apply)
        ext = kv_tier_memory(graph, x0, offload.tier, search)
        if ext is None:
            raise ConfigError(f"scenario {scenario.name!r}: serving.kv_offload.tier: {offload.tier}: platform "
                              f"{scenario.platform!r} has no {KV_TIER_NAMES[offload.tier]} beside {x0}. Fix: tier: "
                              f"{'cpu' if offload.tier == 'cxl' else 'cxl'} where the platform has it, or a platform "
                              f"with one (paper-cxl, cxl-pool: CXL Type 3; every platform's hosts: cpu)")
    elif not (ext and spill_policy(scenario, platform_spec) == "allow"):
        ext = None
    if ext:
        sharing = sum(1 for x in xpus if nodes[x].get("extended_memory") == ext) if offload is None else sum(
            1 for x in xpus if kv_tier_memory(graph, x, offload.tier, search) == ext)
        size = nodes[ext]["capacity"]
        ext_unbounded = not math.isfinite(size) and (offload is None or offload.size is None)
        share = (2**50 if ext_unbounded else size) / sharing
        if offload is not None and offload.size is not None:  # the tier's bytes per XPU, as the key says
            share = offload.size if not math.isfinite(size) else min(offload.size, size / sharing)
        ext_blocks = int(share / block_bytes)
        route = shortest_routes(graph, ext, [x0])[x0]
        ext_bandwidth, ext_latency = route_bandwidth(graph, route), route_latency(graph, route)
        # read in place: a CXL Type 3 expander, or a superchip CPU's memory over NVLink-C2C (prepare's rule)
        coherent = bool(graph.graph.get("coherent")) and coherent_memory(graph, x0, ext) is not None
        spilled_to = nodes[ext].get("role")
    if offload is not None and offload.policy == "in_place" and not coherent:
        raise ConfigError(f"scenario {scenario.name!r}: serving.kv_offload.policy: in_place reads offloaded blocks "
                          f"where they are, which needs coherent memory (CXL Type 3, or a superchip CPU's memory over "
                          f"NVLink-C2C); {offload.tier} on platform {scenario.platform!r} ({ext}) is not. Fix: policy: "
                          f"prefetch or swap")
    host_bandwidth, host_latency = 1.0, 0.0
    if offload is not None:  # stores and swapped loads cross the tier's route
        host_bandwidth, host_latency = ext_bandwidth, ext_latency
    elif config.preemption == "swap":
        drams = sorted(n for n, data in nodes(data=True) if data.get("role") == "dram"
                       and data.get("server") == nodes[x0].get("server"))
        if not drams:
            raise ConfigError(f"scenario {scenario.name!r}: serving.preemption: swap needs host memory beside the "
                              f"XPUs, and platform {scenario.platform!r} has none on {x0}'s server. Fix: "
                              f"preemption: recompute")
        route = shortest_routes(graph, drams[0], [x0])[x0]
        host_bandwidth, host_latency = route_bandwidth(graph, route), route_latency(graph, route)
    peers = xpus[first:first + tp * pp]
    routes = shortest_routes(graph, peers[0], peers[1:2] + peers[tp:tp + 1]) if len(peers) > 1 else {}
    tp_route = Link.of(graph, compute, device, routes.get(peers[1])) if tp > 1 else None
    pp_route = Link.of(graph, compute, device, routes.get(peers[tp])) if pp > 1 else None
    platform = _Platform(model=compute, device=device, peak=peak_flops(nodes[x0], spec.precision),
                         hbm_bandwidth=hbm_bandwidth, memory_efficiency=factors.memory_efficiency,
                         hbm_blocks=int(free / block_bytes), ext_blocks=ext_blocks, ext_bandwidth=ext_bandwidth,
                         ext_latency=ext_latency, coherent=coherent, spilled_to=spilled_to, ext_unbounded=ext_unbounded,
                         offload=offload,
                         host_bandwidth=host_bandwidth, host_latency=host_latency,
                         tp_route=tp_route, pp_route=pp_route, tp=tp, pp=pp,
                         dp=scenario.xpus // (tp * pp), token_bytes=token_bytes, weights=weights, workspace=workspace)
    return platform, config


def write_serving_outputs(out: Path, result: dict) -> None:
    """result.json, requests.csv (one row per request), kv.csv (the KV cache over time), kv.png and latency.png
    (the requests' latency distributions) in `out`."""
    import csv
    import io
    import json

    from hcsim.run.pictures import plot_kv_occupancy, plot_latencies
    from hcsim.run.report import atomic_write, clear_outputs

    clear_outputs(out)
    for name, rows, columns in (("requests.csv", result["per_request"], list(result["per_request"][0])),
                                ("kv.csv", [dict(zip(OCCUPANCY_COLUMNS, row)) for row in result["occupancy"]],
                                 OCCUPANCY_COLUMNS)):
        table = io.StringIO()
        writer = csv.DictWriter(table, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(out / name, table.getvalue())
    plot_kv_occupancy(result, out / "kv.png")
    plot_latencies(result, out / "latency.png")
    summary = {k: v for k, v in result.items() if k not in ("per_request", "occupancy")}
    atomic_write(out / "result.json", json.dumps(summary, indent=2) + "\n")
