"""Inference serving workloads: a model, a request mix, the scheduler's knobs, and the kernels of one serving
step (pure).

A serving workload (``kind: serving`` in a workload YAML) names a decoder model and its requests: how many,
their prompt and output lengths (fixed, or uniform between two bounds), when they arrive (Poisson at ``rate``
requests per second, or all at once: a fixed batch), a prompt prefix shared within groups of requests
(``shared_prefix``, ``prefix_groups``) or every request from a trace file (``trace``: :func:`read_trace`),
whether its prefills and decodes run on separate replicas (``disaggregation``), the latency targets a request
meets or misses (``slo``: :class:`Slo`), and the serving engine's
scheduler (``scheduler``: ``vllm-v1``, the default, ``vllm-v0`` or ``sglang``) with vLLM's knobs under their
vLLM names (:class:`ServingSpec`); the run's random numbers come from ``seed`` alone, so the same inputs give the
same run.

The KV cache of one token is layers x 2 (K and V) x kv_heads x head_dim x bytes per element
(:func:`kv_bytes_per_token`). One serving step runs, on one rank of a TP group and for the layers of one
pipeline stage (:func:`layer_kernels`, :func:`head_kernels`), prefill chunks (their GEMMs over every token,
causal flash attention over the chunk's keys, their KV written) and one decode token of every decoding
sequence (GEMMs over the batch, attention reading each sequence's KV cache), the norms, residual adds and
activations as memory-bound kernels, and (last stage) the logits of the sequences that get a token.

Units: bytes, FLOP, seconds, tokens, requests.
"""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from hcsim.config import Fields
from hcsim.errors import ConfigError
from hcsim.workload.model import ModelShape, element_sizes
from hcsim.workload.ops import Op, _gemm, _memory

__all__ = ["ServingSpec", "Slo", "SchedulerConfig", "SCHEDULERS", "Request", "KvOffload", "KV_TIERS", "KV_POLICIES",
           "ROUTINGS", "kv_bytes_per_token", "make_requests",
           "read_trace",
           "scheduler_config", "dense_kernels", "expert_kernels", "touched_experts", "attention_kernels", "layer_kernels", "head_kernels", "step_kernels", "is_serving", "serving_spec_path", "serving_spec_from_dict",
           "MAX_SERVING_REQUESTS"]

MAX_SERVING_REQUESTS = 1_000_000  # requests of one serving run (hcsim.run.serving keeps about 1 KB per request)


@dataclass(frozen=True, slots=True)
class NewTokenRatio:
    """SGLang's admission estimate (SCHEDULERS' comment): the share of a running request's remaining output its
    KV tokens are reserved for, from `start`, falling by `decay` a decode step to `floor`."""

    start: float
    floor: float
    decay: float
    clip: int = 4096  # outputs counted up to this many tokens
    retract_steps: int = 20  # decode steps of room a retraction makes for each request it keeps

    def after_decodes(self, ratio: float, steps: int) -> float:
        """The ratio after `steps` decode steps from `ratio`."""
        return max(ratio - steps * self.decay, self.floor)

    def after_retraction(self, made: int, outputs: int, running: int) -> float:
        """The ratio after a retraction that leaves `running` requests that made `made` tokens of `outputs`."""
        return min(1.0, (made + self.retract_steps * running) / (outputs + 1))


# The schedulers of the serving engines published measurements were taken with: vLLM V1 (the default engine
# since vLLM 0.8: vllm/v1/core/sched/scheduler.py) and vLLM V0 (vllm/core/scheduler.py). What each does:
# prefill_first: a step with waiting prompts that fit runs only prefills (V0); otherwise decodes and prefill
# chunks share the token budget, running requests first (V1). chunked_prefill: a prompt may be split over steps.
# watermark: the fraction of the KV blocks a new request must leave free (V0's block manager: 0.01).
# SGLang (python/sglang/srt/managers/scheduler.py, schedule_policy.py's PrefillAdder) runs a prefill batch (new
# prompts and the next chunk of a chunked one) whenever one can be formed, else a decode batch, never both
# (prefill_first, and chunks_with_decodes off: enable_mixed_chunk is off by default); its KV pool is
# token-granular (page_size 1: blocks of 1 token), its radix cache reuses any cached prefix (prefix caching at
# token granularity), it retracts (recomputes) decodes when memory runs out, and its overlap scheduler hides the
# host's work (step_overhead 0, unless set).
# It admits a request only while the free and evictable tokens, less the tokens every running request is
# expected still to need (min(its remaining output, 4,096) x new_token_ratio) and those of the requests admitted
# in the step so far (prompt + min(output, 4,096)), exceed the request's prompt + min(output, 4,096):
# new_token_ratio starts at 0.7, falls by (0.7 - 0.7 x 0.14) / 600 after each decode step to 0.098, and is set
# after a retraction to (tokens decoded + 20 per running request) / their outputs (sglang/srt/environ.py:
# SGLANG_INIT_NEW_TOKEN_RATIO 0.7, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR 0.14, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS 600,
# SGLANG_RETRACT_DECODE_STEPS 20, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION 4096; schedule_batch.py retract_decode).
SCHEDULERS: dict[str, dict] = {
    "vllm-v1": {"prefill_first": False, "chunked_prefill": True, "prefix_caching": True, "preemption": "recompute",
                "block_size": 16, "watermark": 0.0},
    "vllm-v0": {"prefill_first": True, "chunked_prefill": False, "prefix_caching": False, "preemption": "recompute",
                "block_size": 16, "watermark": 0.01, "max_num_seqs": 256},
    "sglang": {"prefill_first": True, "chunked_prefill": True, "prefix_caching": True, "preemption": "recompute",
               "block_size": 1, "watermark": 0.0, "step_overhead": 0.0, "chunks_with_decodes": False,
               "new_token_ratio": NewTokenRatio(start=0.7, floor=0.7 * 0.14, decay=(0.7 - 0.7 * 0.14) / 600)},
}
PREEMPTION_MODES = ("recompute", "swap")
# How arriving requests are dealt to the replicas that take them (every replica, or the prefill ones): in turn
# (request i to replica i mod n, as a round-robin load balancer), or to the least loaded when it arrives (fewest
# requests waiting and running, then the most free KV blocks: hcsim.run.serving._Arrivals).
ROUTINGS = ("round_robin", "least_loaded")
# KV offload (serving.kv_offload): the lower tier a preempted sequence's blocks and an evicted cached prefix's go
# to instead of being dropped (LMCache's local CPU backend, vLLM's CPU offloading connector; a CXL Type 3
# expander), and how they come back. cpu: host DRAM (a superchip's CPU memory over NVLink-C2C); cxl: the XPU's
# CXL Type 3 memory. prefetch: copied back into HBM asynchronously, beside the running steps, the sequence
# joining the first step after its blocks land (vLLM V1's asynchronous KV load, LMCache's async loading); swap:
# copied back at the start of the step that resumes it, the step waiting for it (vLLM V0's swap_in); in_place:
# left in the tier and read in place by every step (coherent memory only: CXL Type 3, C2C).
KV_TIERS = ("cpu", "cxl")
KV_POLICIES = ("prefetch", "swap", "in_place")
BLOCK_SIZES = (8, 16, 32, 64, 128)  # what vLLM's CUDA attention backends take
# Host time per step that the GPU waits for (scheduling, input preparation, sampling's bookkeeping; decode
# replays a CUDA graph, so no per-kernel launches): an assumption of its order of magnitude, not a measurement
# here. Srivatsa et al. (2024, "Can scheduling overhead dominate LLM inference performance?",
# mlsys.wuklab.io/posts/scheduling_overhead) profiled vLLM's per-step host work as a large share of small
# models' decode steps; SGLang's v0.4 notes (lmsys.org/blog/2024-12-04-sglang-v0-4) say an unoptimised engine
# can spend up to half its time on it. Schedulers that overlap it with the GPU (SGLang v0.4, TensorRT-LLM's
# overlap scheduler) hide it: step_overhead 0. Measure yours (nsys) and set serving.step_overhead.
STEP_OVERHEAD = 0.5e-3  # s
SWAP_SPACE = 4 * 2**30  # B of host memory per GPU for swapped KV blocks (vLLM's swap_space default, 4 GiB)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of the GPU's memory it may use


@dataclass(frozen=True, slots=True, kw_only=True)
class KvOffload:
    """``serving.kv_offload``: the `tier` (KV_TIERS) offloaded KV blocks go to, `size` bytes of it per XPU (None:
    the tier memory's capacity shared by the XPUs it serves), and the `policy` (KV_POLICIES) that brings them
    back."""

    tier: str
    policy: str = "prefetch"
    size: float | None = None

    def __post_init__(self) -> None:
        if self.tier not in KV_TIERS:
            raise ConfigError(f"serving.kv_offload.tier: {self.tier!r} is not one of {', '.join(KV_TIERS)}")
        if self.policy not in KV_POLICIES:
            raise ConfigError(f"serving.kv_offload.policy: {self.policy!r} is not one of {', '.join(KV_POLICIES)}")
        if self.size is not None and not 0 < self.size <= 1e15:
            raise ConfigError(f"serving.kv_offload.size: must be > 0 B, got {self.size!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingSpec:
    """A serving workload: `requests` requests with prompt and output lengths in [low, high] (tokens), arriving
    at `rate` per second (None: all at t = 0); the first `shared_prefix` tokens of each prompt are the same for
    every request of one of `prefix_groups` groups (a system prompt: what prefix caching reuses); and the
    serving engine's scheduler (`scheduler`, one of SCHEDULERS) with its knobs, None where the scheduler's
    preset (or vLLM's device-dependent default) decides: `max_num_seqs` sequences and `max_num_batched_tokens`
    tokens per step at most, KV blocks of `block_size` tokens in `gpu_memory_utilization` of the GPU's memory,
    `preemption` (recompute | swap, with `swap_space` bytes of host memory per GPU), `prefix_caching`,
    `chunked_prefill`, and `step_overhead` seconds of host time per step. `written`: the serving keys the file
    gave, when read from one (a message then says which values are defaults)."""

    name: str
    model: ModelShape
    precision: str = "bf16"
    requests: int = 64
    prompt: tuple[int, int] = (512, 512)
    output: tuple[int, int] = (128, 128)
    rate: float | None = None
    shared_prefix: int = 0
    prefix_groups: int = 1
    scheduler: str = "vllm-v1"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    preemption: str | None = None
    swap_space: float = SWAP_SPACE
    prefix_caching: bool | None = None
    chunked_prefill: bool | None = None
    step_overhead: float | None = None  # None: the scheduler's (host_time)
    seed: int = 0
    routing: str = "round_robin"
    slo: Slo | None = None
    trace: str | None = None
    trace_requests: tuple | None = field(default=None, compare=False, repr=False)
    disaggregation: tuple[int, int] | None = None
    kv_offload: KvOffload | None = None
    description: str = ""
    source: str = ""
    written: frozenset[str] | None = None

    @property
    def host_time(self) -> float:
        """Host seconds per step: `step_overhead` where given, else the scheduler's (SGLang's overlap scheduler
        hides it: 0) or STEP_OVERHEAD."""
        if self.step_overhead is not None:
            return self.step_overhead
        return SCHEDULERS[self.scheduler].get("step_overhead", STEP_OVERHEAD)

    def __post_init__(self) -> None:
        where = f"serving workload {self.name!r}"
        if self.trace is not None:  # the requests are the trace's: the lengths, groups and count follow from it
            rows = self.trace_requests
            if rows is None:
                rows = read_trace(self.trace, self.model.sequence)
                object.__setattr__(self, "trace_requests", rows)
            object.__setattr__(self, "requests", len(rows))
            object.__setattr__(self, "prompt", (min(q.prompt for q in rows), max(q.prompt for q in rows)))
            object.__setattr__(self, "output", (min(q.output for q in rows), max(q.output for q in rows)))
            object.__setattr__(self, "prefix_groups", max(q.group for q in rows) + 1)
            object.__setattr__(self, "rate", None)

        def given(key):  # the value as the message shows it: the file's, or the default's
            value = getattr(self, key)
            shown = list(value) if isinstance(value, tuple) else value
            if self.written is None or key in self.written:
                return f"{shown!r}"
            return f"{shown!r} (the default; the file gives no serving.{key})"

        def integer(key, low, high=None):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low or (high and value > high):
                bound = f"from {low:,} to {high:,}" if high else f">= {low}"
                raise ConfigError(f"{where}: serving.{key} must be an integer {bound}, got {given(key)}")

        integer("requests", 1, MAX_SERVING_REQUESTS)
        for key in ("prompt", "output"):
            low, high = getattr(self, key)
            if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
                raise ConfigError(f"{where}: serving.{key} must be a length or [low, high] with 1 <= low <= high "
                                  f"tokens, got {given(key)}")
        if self.output[0] < 2:
            raise ConfigError(f"{where}: serving.output must be at least 2 tokens (a time per output token needs "
                              f"two), got {given('output')}")
        longest = self.longest
        if longest > self.model.sequence:
            raise ConfigError(f"{where}: a request of prompt {given('prompt')} and output {given('output')} tokens "
                              f"can reach {longest:,} tokens, beyond the model's sequence of {self.model.sequence:,} "
                              f"(model.sequence: its context length). Fix: shorter prompts or outputs (prompt + output "
                              f"<= {self.model.sequence:,}), or a model with a longer context")
        if self.rate is not None and (isinstance(self.rate, bool) or not 0 < self.rate <= 1e6):
            raise ConfigError(f"{where}: serving.rate must be > 0 and <= 1e6 requests per second, or absent (a fixed "
                              f"batch), got {given('rate')}")
        integer("prefix_groups", 1)
        integer("shared_prefix", 0)
        if self.shared_prefix >= self.prompt[0]:
            raise ConfigError(f"{where}: serving.shared_prefix {self.shared_prefix:,} must be shorter than the "
                              f"shortest prompt ({self.prompt[0]:,} tokens{' of the trace' if self.trace else ''}): "
                              f"a prompt is its prefix and more")
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(f"{where}: serving.scheduler {given('scheduler')} is not one of {', '.join(SCHEDULERS)}")
        for key in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, key) is not None:
                integer(key, 1)
        if self.block_size is not None and self.block_size not in BLOCK_SIZES:
            raise ConfigError(f"{where}: serving.block_size must be one of {', '.join(map(str, BLOCK_SIZES))} "
                              f"tokens (vLLM's CUDA backends), got {given('block_size')}")
        if isinstance(self.gpu_memory_utilization, bool) or not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"{where}: serving.gpu_memory_utilization must be in (0, 1], got "
                              f"{given('gpu_memory_utilization')}")
        if self.preemption is not None and self.preemption not in PREEMPTION_MODES:
            raise ConfigError(f"{where}: serving.preemption {given('preemption')} is not one of "
                              f"{', '.join(PREEMPTION_MODES)}")
        if self.kv_offload is not None and self.preemption == "swap":
            raise ConfigError(f"{where}: serving.preemption: swap beside serving.kv_offload: a preempted sequence's "
                              f"blocks go to the kv_offload tier (serving.kv_offload.policy: swap copies them back "
                              f"as vLLM's swap does). Fix: leave serving.preemption out")
        if not 0 <= self.swap_space <= 1e15:
            raise ConfigError(f"{where}: serving.swap_space must be >= 0 B, got {given('swap_space')}")
        if self.step_overhead is not None and not 0 <= self.step_overhead <= 1:
            raise ConfigError(f"{where}: serving.step_overhead must be from 0 to 1 s, got {given('step_overhead')}")
        if self.routing not in ROUTINGS:
            raise ConfigError(f"{where}: serving.routing {given('routing')} is not one of {', '.join(ROUTINGS)}")
        if self.disaggregation is not None:
            for key, value in zip(("prefill", "decode"), self.disaggregation):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ConfigError(f"{where}: serving.disaggregation.{key} must be an integer >= 1 (replicas), "
                                      f"got {value!r}")
        if self.precision not in ("fp16", "bf16"):
            raise ConfigError(f"{where}: precision must be fp16 or bf16 for serving (FP8 and FP32 serving are not "
                              f"modelled), got {self.precision!r}")

    @property
    def longest(self) -> int:
        """Tokens of the longest request there can be: the trace's longest, or the longest prompt and output."""
        if self.trace_requests is not None:
            return max(q.prompt + q.output for q in self.trace_requests)
        return self.prompt[1] + self.output[1]


@dataclass(frozen=True, slots=True, kw_only=True)
class Slo:
    """``serving.slo``: a request meets its service-level objective when its time to first token is at most
    `ttft` and its time per output token (after the first) at most `tpot`, seconds; None: that one unconstrained.
    Goodput, as DistServe counts it (Zhong et al., OSDI 2024; hao-ai-lab.github.io/blogs/distserve: "the number
    of completed requests per second adhering to the SLOs"), is the requests per second that meet both; the
    paper's per-GPU goodput is the highest rate at which a share of them (90 %) does."""

    ttft: float | None = None
    tpot: float | None = None

    def __post_init__(self) -> None:
        if self.ttft is None and self.tpot is None:
            raise ConfigError("serving.slo: give ttft, tpot or both (a duration with its unit, e.g. {ttft: 200ms, "
                              "tpot: 50ms})")
        for key in ("ttft", "tpot"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < math.inf):
                raise ConfigError(f"serving.slo.{key}: must be a duration > 0 s, got {value!r}")

    def met(self, ttft: float, tpot: float) -> bool:
        """Whether a request of these times (s) meets both objectives."""
        return (self.ttft is None or ttft <= self.ttft) and (self.tpot is None or tpot <= self.tpot)


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """A serving scheduler with every knob resolved (:func:`scheduler_config`): token budget and sequences per
    step, KV block size in tokens, the V0/V1 rules (SCHEDULERS), preemption mode, host swap bytes per GPU, host
    seconds per step."""

    name: str
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    prefill_first: bool
    chunked_prefill: bool
    prefix_caching: bool
    preemption: str
    watermark: float
    swap_space: float
    step_overhead: float
    gpu_memory_utilization: float
    new_token_ratio: NewTokenRatio | None = None  # SGLang's admission by expected output (None: by blocks alone)
    chunks_with_decodes: bool = True  # a chunked prompt's next chunk runs beside decodes (SGLang's: alone)


def scheduler_config(spec: ServingSpec, device: str, memory: float) -> SchedulerConfig:
    """The scheduler `spec` asks for on a GPU named `device` with `memory` bytes: its keys over its preset, and
    where neither gives them, vLLM's defaults: V1's OpenAI server takes 8,192 tokens and 1,024 sequences per step
    on GPUs of 70 GiB or more other than the A100, 2,048 and 256 elsewhere (vllm/engine/arg_utils.py); V0
    without chunked prefill takes the longest sequence (max(max_model_len, 2048) tokens).

    >>> m = ModelShape(name="m", decoders=2, hidden=64, heads=4, ffn=256, sequence=4096)
    >>> c = scheduler_config(ServingSpec(name="s", model=m), "H100", 80 * 2**30)
    >>> (c.max_num_batched_tokens, c.max_num_seqs, c.block_size, c.chunked_prefill)
    (8192, 1024, 16, True)
    """
    preset = SCHEDULERS[spec.scheduler]
    chunked = preset["chunked_prefill"] if spec.chunked_prefill is None else spec.chunked_prefill
    large = memory >= 70 * 2**30 and "A100" not in device.upper()
    seqs = spec.max_num_seqs or preset.get("max_num_seqs") or (1024 if large else 256)
    if spec.max_num_batched_tokens is not None:
        budget = spec.max_num_batched_tokens
    elif not chunked:
        budget = max(spec.model.sequence, 2048)
    else:
        budget = 8192 if large else 2048
    where = f"{spec.source + ': ' if spec.source else ''}serving workload {spec.name!r}"
    if budget < seqs:
        raise ConfigError(f"{where}: serving.max_num_batched_tokens {budget:,} is less than max_num_seqs {seqs:,} "
                          f"(every running sequence needs a token of the budget, as vLLM requires). Fix: raise "
                          f"max_num_batched_tokens or lower max_num_seqs")
    longest = spec.longest
    if not chunked and budget < longest:
        raise ConfigError(f"{where}: without chunked prefill a prompt (and its recomputation after a preemption) "
                          f"runs in one step, so serving.max_num_batched_tokens {budget:,} must hold the longest "
                          f"request, {longest:,} tokens. Fix: max_num_batched_tokens >= {longest:,}, or "
                          f"chunked_prefill: true")
    return SchedulerConfig(
        name=spec.scheduler, max_num_seqs=seqs, max_num_batched_tokens=budget,
        block_size=spec.block_size or preset["block_size"], prefill_first=preset["prefill_first"],
        chunked_prefill=chunked,
        prefix_caching=preset["prefix_caching"] if spec.prefix_caching is None else spec.prefix_caching,
        preemption=spec.preemption or preset["preemption"], watermark=preset["watermark"],
        swap_space=spec.swap_space, step_overhead=spec.host_time,
        gpu_memory_utilization=spec.gpu_memory_utilization, new_token_ratio=preset.get("new_token_ratio"),
        chunks_with_decodes=preset.get("chunks_with_decodes", True))


@dataclass(frozen=True, slots=True)
class Request:
    """One request: its index, arrival time (s), prompt and output lengths (tokens), and its prefix group."""

    index: int
    arrival: float
    prompt: int
    output: int
    group: int = 0


def kv_bytes_per_token(model: ModelShape, precision: str = "bf16") -> float:
    """KV-cache bytes of one token: layers x 2 x kv_heads x head_dim x bytes per element.

    >>> m = ModelShape(name="llama3-70b", decoders=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, sequence=8192)
    >>> kv_bytes_per_token(m)  # 80 x 2 x 8 x 128 x 2
    327680.0
    """
    return model.decoders * 2.0 * model.kv_hidden * element_sizes(precision).activation


def make_requests(spec: ServingSpec) -> list[Request]:
    """The requests of `spec` in arrival order: its trace's, or from its seed alone (the same spec gives the same
    requests), request i in prefix group i mod prefix_groups."""
    if spec.trace_requests is not None:
        return list(spec.trace_requests)
    rng = random.Random(spec.seed)
    now, requests = 0.0, []
    for index in range(spec.requests):
        if spec.rate is not None:
            now += rng.expovariate(spec.rate)
        requests.append(Request(index, now, rng.randint(*spec.prompt), rng.randint(*spec.output),
                                index % spec.prefix_groups))
    return requests


TRACE_COLUMNS = ("arrival_s", "prompt", "output")  # and, optional, "group": a prefix group's label
TRACE_SHOWN = 20  # bad rows a trace's error lists (then how many more)


def read_trace(path, sequence: int) -> tuple[Request, ...]:
    """The requests of a trace file: CSV with a header row, or JSON Lines (``.jsonl``: an object a line), each row
    a request's ``arrival_s`` (s from the run's start, >= 0, in order), ``prompt`` and ``output`` (tokens; output
    >= 2, prompt + output <= `sequence`, the model's context) and, optional, ``group`` (any label: requests of one
    label share the workload's ``shared_prefix``; groups are numbered in order of first appearance); other columns
    are ignored (hcsim's own ``requests.csv`` is a trace). One ConfigError naming the file, and each bad row's line
    and field.

    Arrival times are read as written (Python's float of the text: the shortest repr of a float reads back to
    it bit for bit)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl"):
        raise ConfigError(f"serving.trace {str(path)!r}: a trace is a .csv file (a header row: arrival_s, prompt, "
                          f"output, group) or a .jsonl file (one JSON object a line with those keys), got a "
                          f"{suffix or 'file with no extension'}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"serving.trace {str(path)!r}: cannot be read ({err})") from None
    problems: list[str] = []
    rows: list[tuple[int, dict]] = []  # (line, fields)
    if suffix == ".csv":
        lines = text.splitlines()
        reader = csv.reader(lines)
        header = next(reader, None)
        if header is None:
            raise ConfigError(f"{path}: an empty trace (a header row arrival_s,prompt,output[,group] and a row per "
                              f"request)")
        header = [name.strip() for name in header]
        missing = [name for name in TRACE_COLUMNS if name not in header]
        if missing:
            raise ConfigError(f"{path}:1: the header has no column {', '.join(missing)} (it has "
                              f"{', '.join(header) or 'none'}; a trace's columns: arrival_s, prompt, output and, "
                              f"optional, group)")
        for line, cells in enumerate(reader, start=2):
            if not any(cell.strip() for cell in cells):
                continue
            rows.append((line, {name: cells[i].strip() if i < len(cells) else None for i, name in enumerate(header)}))
    else:
        for line, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as err:
                problems.append(f"{path}:{line}: not a JSON object ({err.msg})")
                continue
            if not isinstance(row, dict):
                problems.append(f"{path}:{line}: not a JSON object (a {type(row).__name__})")
                continue
            rows.append((line, row))
    if not rows and not problems:
        raise ConfigError(f"{path}: a trace with no request")
    if len(rows) > MAX_SERVING_REQUESTS:
        raise ConfigError(f"{path}: {len(rows):,} requests, more than the {MAX_SERVING_REQUESTS:,} of one serving "
                          f"run (hcsim.workload.serving.MAX_SERVING_REQUESTS). Fix: a shorter trace")

    def number(line, row, name, integer, low):
        value = row.get(name)
        if value is None or value == "":
            problems.append(f"{path}:{line}: no {name}")
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            problems.append(f"{path}:{line}: {name} {value!r} is not a number")
            return None
        try:
            parsed = (int(value) if isinstance(value, str) else value) if integer else float(value)
        except ValueError:
            problems.append(f"{path}:{line}: {name} {value!r} is not {'a whole number' if integer else 'a number'}")
            return None
        if integer and (isinstance(parsed, float) or not isinstance(parsed, int)):
            problems.append(f"{path}:{line}: {name} {value!r} is not a whole number")
            return None
        if not (math.isfinite(parsed) and parsed >= low):
            problems.append(f"{path}:{line}: {name} {value!r} must be {'a finite number ' if not integer else ''}"
                            f">= {low}{' (a time per output token needs two)' if name == 'output' else ''}")
            return None
        return parsed

    requests, labels, last = [], {}, (0.0, 0)
    for line, row in rows:
        arrival = number(line, row, "arrival_s", False, 0)
        prompt = number(line, row, "prompt", True, 1)
        output = number(line, row, "output", True, 2)
        if arrival is not None:
            if arrival < last[0]:
                problems.append(f"{path}:{line}: arrival_s {row['arrival_s']!r} is before line {last[1]}'s "
                                f"{last[0]!r} (a trace is in order of arrival)")
            else:
                last = (arrival, line)
        if prompt is not None and output is not None and prompt + output > sequence:
            problems.append(f"{path}:{line}: prompt + output = {prompt:,} + {output:,} tokens, beyond the model's "
                            f"context of {sequence:,} (model.sequence)")
        label = row.get("group")
        label = None if label is None or label == "" else str(label)
        group = labels.setdefault(label, len(labels))
        if not problems:
            requests.append(Request(len(requests), arrival, prompt, output, group))
    if problems:
        shown = problems[:TRACE_SHOWN]
        more = len(problems) - len(shown)
        raise ConfigError(f"serving.trace {str(path)!r}: {len(problems):,} bad field{'s' if len(problems) > 1 else ''}"
                          f":\n  " + "\n  ".join(shown) + (f"\n  ... and {more:,} more" if more else ""))
    return tuple(requests)


def dense_kernels(model: ModelShape, tokens: int, tp: int = 1, precision: str = "bf16") -> list[Op]:
    """One decoder layer's kernels other than attention over `tokens` tokens on one TP rank: the norms, the
    GEMMs (the token count is their m), the residual adds and the MLP (:func:`expert_kernels` for a
    mixture-of-experts model)."""
    if tokens < 1:
        raise ConfigError(f"serving step of {model.name!r}: needs at least one token to prefill or decode, got none")
    e = element_sizes(precision).activation
    h, kv, f = model.hidden, model.kv_hidden, model.ffn
    widen = 2 if model.mlp == "swiglu" else 1
    mlp = expert_kernels(model, tokens, tp, precision) if model.moe else [
        _gemm("up", tokens, widen * f // tp, h, e), _memory("activation", (widen + 1) * tokens * f / tp * e),
        _gemm("down", tokens, h, f // tp, e)]
    return [_memory("norm_attn", 2 * tokens * h * e), _gemm("qkv", tokens, (h + 2 * kv) // tp, h, e),
            _gemm("proj", tokens, h, h // tp, e), _memory("add_attn", 3 * tokens * h * e),
            _memory("norm_mlp", 2 * tokens * h * e), *mlp, _memory("add_mlp", 3 * tokens * h * e)]


def touched_experts(tokens: float, experts: int, top_k: int) -> float:
    """Expected number of distinct experts `tokens` tokens route to, each to `top_k` of `experts` chosen
    uniformly and independently: E·(1 - (1 - k/E)^n) (an expert is outside one token's top-k with probability
    1 - k/E).

    >>> touched_experts(1, 8, 2), touched_experts(2, 4, 2), round(touched_experts(64, 8, 2), 4)
    (2.0, 3.0, 8.0)
    """
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def expert_kernels(model: ModelShape, tokens: int, tp: int = 1, precision: str = "bf16") -> list[Op]:
    """A mixture-of-experts MLP over `tokens` tokens on one TP rank, each expert's FFN split over the tp ranks
    (tensor-parallel experts, as vLLM's fused MoE runs without expert parallelism): the router GEMM (h x E,
    every rank), the top-k routing, the dispatch copying each token to its k experts, the experts' GEMMs as one
    grouped GEMM each way over the token-expert pairs (k per token: FLOP 2·k·n·h·f/t each way), which reads the
    weights of every expert a token routes to (:func:`touched_experts` of them, in expectation: a decode step of
    a small batch reads a few experts, a long prefill all of them), and the weighted combine. The grouped GEMM's
    shape (for the kernel model's efficiency) is the touched experts as its batch of k·n / touched rows each,
    rounded; its FLOP and bytes are the expectations."""
    e = element_sizes(precision).activation
    h, experts, k = model.hidden, model.experts, model.top_k
    f, widen = model.expert_hidden / tp, 2 if model.mlp == "swiglu" else 1
    pairs, touched = k * tokens, touched_experts(tokens, experts, k)
    rows, batch = max(1, round(pairs / touched)), max(1, round(touched))

    def grouped(name: str, n: float, inner: float) -> Op:  # pairs x inner by inner x n, each touched expert's
        return Op(name, "gemm", 2.0 * pairs * n * inner, (touched * inner * n + pairs * (inner + n)) * e, rows,
                  round(n), round(inner), batch)

    return [_gemm("router", tokens, experts, h, e), _memory("routing", 2 * tokens * experts * e),
            _memory("dispatch", (tokens + pairs) * h * e), grouped("expert_up", widen * f, h),
            _memory("activation", (widen + 1) * pairs * f * e), grouped("expert_down", h, f),
            _memory("combine", (k + 1) * tokens * h * e)]


def attention_kernels(model: ModelShape, *, chunks=(), decode: int = 0, context: float = 0.0, tp: int = 1,
                      precision: str = "bf16") -> list[Op]:
    """One decoder layer's attention kernels on one TP rank: a causal flash attention kernel per prefill chunk
    ((new, cached) tokens: 4·new·(cached + new/2)·h FLOP over its cached + new keys, the masked half skipped)
    and one memory-bound kernel for the `decode` decoding sequences reading their `context` cached tokens."""
    e = element_sizes(precision).activation
    h, kv, d = model.hidden, model.kv_hidden, model.hidden // model.heads
    kernels = []
    for new, cached in chunks:
        keys = cached + new
        kernels.append(Op("flash_attention", "attention", 2.0 * new * (2 * cached + new) * h / tp,
                          (2.0 * new * h + 2.0 * keys * kv) / tp * e, keys, model.heads // tp, d))
    if decode:
        kernels.append(Op("decode_attention", "decode", 4.0 * context * h / tp,
                          context * 2.0 * kv / tp * e + 2 * decode * h / tp * e))
    return kernels


def layer_kernels(model: ModelShape, *, chunks=(), decode: int = 0, context: float = 0.0, tp: int = 1,
                  precision: str = "bf16") -> list[Op]:
    """The kernels of one decoder layer in one serving step on one TP rank, in launch order.

    chunks : (new, cached) token pairs: prefill chunks, each computing `new` tokens of a sequence whose first
    `cached` tokens are already in the KV cache (a whole prompt is (prompt, 0)); decode : sequences decoding one
    token; context : their KV-cache tokens in all (:func:`dense_kernels`, :func:`attention_kernels`)."""
    dense = dense_kernels(model, sum(new for new, _ in chunks) + decode, tp, precision)
    return dense[:2] + attention_kernels(model, chunks=chunks, decode=decode, context=context, tp=tp,
                                         precision=precision) + dense[2:]


def head_kernels(model: ModelShape, sampled: int, tp: int = 1, precision: str = "bf16") -> list[Op]:
    """The logits GEMM of the `sampled` sequences that get a token this step (the last pipeline stage; none when
    the step only prefills chunks that do not finish their prompt)."""
    if not sampled:
        return []
    e = element_sizes(precision).activation
    return [_gemm("logits", sampled, -(-model.vocabulary // tp) or 1, model.hidden, e)]


def step_kernels(model: ModelShape, *, prompts=(), decode: int, context: float, tp: int = 1,
                 layers: int | None = None, head: bool = True, precision: str = "bf16", chunks=()
                 ) -> tuple[list[Op], float]:
    """The kernels of one serving step on one TP rank over `layers` decoder layers (default: all), and the
    bytes of KV cache the decodes read: :func:`layer_kernels` per layer (`prompts`: whole prompts prefilled,
    besides the `chunks`), then (`head`) the logits of every decoding sequence and of every prompt."""
    e = element_sizes(precision).activation
    chunks = [(p, 0) for p in prompts] + list(chunks)
    layers = model.decoders if layers is None else layers
    one = layer_kernels(model, chunks=chunks, decode=decode, context=context, tp=tp, precision=precision)
    kernels = one * layers + (head_kernels(model, len(chunks) + decode, tp, precision) if head else [])
    return kernels, context * 2.0 * model.kv_hidden / tp * e * layers


def is_serving(data) -> bool:
    """Whether parsed workload YAML describes a serving workload (``kind: serving``)."""
    return isinstance(data, dict) and data.get("kind") == "serving"


def serving_spec_path(workload: str, base: Path) -> Path | None:
    """The spec file of a scenario's `workload` (a name or path, resolved from `base`) when it serves (``kind:
    serving``, or a ``serving:`` section without ``training:``); None for a training spec, a graph, or a name that
    does not resolve (the training path says what is wrong with it)."""
    from hcsim.config import load_yaml, resolve_spec
    from hcsim.workload.sources import is_graph_source

    if is_graph_source(workload):
        return None
    try:
        path = resolve_spec(workload, "workloads", base)
    except ConfigError:
        return None
    data = load_yaml(path)
    return path if is_serving(data) or (isinstance(data, dict) and "serving" in data and "training" not in data) \
        else None


RENAMED = {"max_batch": "max_num_seqs", "max_prefill_tokens": "max_num_batched_tokens"}  # vLLM's names


def serving_spec_from_dict(data: dict, where: str, shape_of) -> ServingSpec:
    """A ServingSpec from parsed YAML (`shape_of(fields)` reads its model section); one ConfigError listing every
    problem, each naming its key; an unknown key under ``serving:`` is one of them, with the valid keys."""
    top = Fields(data, f"{where}: ")
    if isinstance(data, dict) and data.get("kind") != "serving":
        top.problems.append(f"{where}: kind: {data.get('kind')!r} beside a serving: section; a serving workload is "
                            f"kind: serving (a training workload has a training: section, not serving:)")
        top.seen.add("kind")
    else:
        top.choice("kind", ("serving",))
    name = top.string("name", Path(where).stem)
    shape = shape_of(top.sub("model"), name)
    serving = top.sub("serving")

    def lengths(key, default):
        value = serving.raw(key, default)
        if not serving.has(key):
            return default
        if isinstance(value, int) and not isinstance(value, bool):
            return (value, value)
        if isinstance(value, list) and len(value) == 2:
            return tuple(value)
        serving.problems.append(f"{serving.path(key)}: expected a length in tokens or [low, high], got {value!r}")
        return default

    for old, new in RENAMED.items():
        if serving.has(old):
            serving.seen.add(old)
            serving.problems.append(f"{serving.path(old)}: renamed {new} (vLLM's name for it)")
    values = dict(requests=serving.number("requests", 64, kind=int, minimum=1, maximum=MAX_SERVING_REQUESTS),
                  prompt=lengths("prompt", (512, 512)), output=lengths("output", (128, 128)),
                  rate=None if serving.raw("rate") is None else serving.number("rate", None), seed=serving.number("seed", 0, kind=int, minimum=0),
                  shared_prefix=serving.number("shared_prefix", 0, kind=int, minimum=0),
                  prefix_groups=serving.number("prefix_groups", 1, kind=int, minimum=1),
                  scheduler=serving.choice("scheduler", tuple(SCHEDULERS), "vllm-v1"),
                  max_num_seqs=serving.number("max_num_seqs", None, kind=int, minimum=1),
                  max_num_batched_tokens=serving.number("max_num_batched_tokens", None, kind=int, minimum=1),
                  block_size=serving.number("block_size", None, kind=int, minimum=1),
                  gpu_memory_utilization=serving.number("gpu_memory_utilization", GPU_MEMORY_UTILIZATION),
                  preemption=serving.choice("preemption", PREEMPTION_MODES, None),
                  swap_space=serving.quantity("swap_space", "size", SWAP_SPACE, positive=False),
                  prefix_caching=serving.flag("prefix_caching", None),
                  chunked_prefill=serving.flag("chunked_prefill", None),
                  step_overhead=serving.quantity("step_overhead", "time", None, positive=False),
                  routing=serving.choice("routing", ROUTINGS, "round_robin"))
    trace = serving.string("trace", None)
    if serving.has("slo"):
        objectives = serving.sub("slo")
        ttft, tpot = (objectives.quantity(key, "time", None, physical="duration") for key in ("ttft", "tpot"))
        objectives.check_unknown()
        if serving.raw("slo") in (None, {}):
            objectives.problems.append(f"{objectives.where}: give ttft, tpot or both (a duration with its unit, "
                                       f"e.g. {{ttft: 200ms, tpot: 50ms}})")
        elif ttft is not None or tpot is not None:
            values["slo"] = Slo(ttft=ttft, tpot=tpot)
    disaggregation = None
    if serving.has("disaggregation"):
        split = serving.sub("disaggregation")
        disaggregation = (split.number("prefill", ..., kind=int, minimum=1),
                          split.number("decode", ..., kind=int, minimum=1))
        split.check_unknown()
        if None in disaggregation:
            disaggregation = None
    kv_offload = None
    if serving.has("kv_offload"):
        offload = serving.sub("kv_offload")
        tier = offload.choice("tier", KV_TIERS)
        policy = offload.choice("policy", KV_POLICIES, "prefetch")
        size = offload.quantity("size", "size", None)
        offload.check_unknown()
        if tier is not None and policy is not None:
            kv_offload = KvOffload(tier=tier, policy=policy, size=size)
    written = frozenset(key for key in (serving.data if isinstance(serving.data, dict) else {}) if key in values)
    trace_requests = None
    if trace is not None:
        for key in ("prompt", "output", "rate", "prefix_groups"):
            if key in written:
                serving.problems.append(f"{serving.path(key)}: the trace ({trace}) gives each request's arrival, "
                                        f"prompt, output and prefix group. Fix: leave serving.{key} out (over a "
                                        f"file that has it: workload_overrides={{serving: {{trace: {trace}}}}}, "
                                        f"the whole section)")
        trace = str(_trace_path(trace, where))
        if not serving.problems and not top.problems:
            trace_requests = read_trace(trace, shape.sequence)
            if "requests" in written:
                if values["requests"] > len(trace_requests):
                    serving.problems.append(f"{serving.path('requests')}: {values['requests']:,} requests, more "
                                            f"than the trace's {len(trace_requests):,} ({trace})")
                trace_requests = trace_requests[:values["requests"]]
    precision = top.choice("precision", ("fp16", "bf16"), "bf16")
    description = top.string("description", "")
    serving.check_unknown()
    top.done()
    try:
        return ServingSpec(name=name, model=shape, precision=precision, description=description, source=where,
                           written=written, trace=trace, trace_requests=trace_requests,
                           disaggregation=disaggregation, kv_offload=kv_offload, **values)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def _trace_path(name: str, where: str) -> Path:
    """A trace file's path: as written when absolute; else beside the workload file `where`, or else in the
    current folder; ConfigError naming both places when neither has it."""
    path = Path(name).expanduser()
    beside = Path(where).parent / path
    for candidate in [path] if path.is_absolute() else [beside, Path.cwd() / path]:
        if candidate.is_file():
            return candidate
        if candidate.exists():  # a folder, a device, a pipe: there, but not a trace
            raise ConfigError(f"{where}: serving.trace {name!r}: {candidate} is "
                              f"{'a folder' if candidate.is_dir() else 'not a regular file'}; give the trace's file "
                              f"(.csv or .jsonl)")
    if path.is_absolute():
        raise ConfigError(f"{where}: serving.trace {name!r}: no such file")
    raise ConfigError(f"{where}: serving.trace {name!r}: no such file beside the workload ({beside}) nor in the "
                      f"current folder ({Path.cwd() / path})")
