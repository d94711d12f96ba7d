"""Inference serving workloads: a model, a request mix, and the kernels of one serving step (pure).

A serving workload (``kind: serving`` in a workload YAML) names a decoder model and its requests: how many,
their prompt and output lengths (fixed, or uniform between two bounds), when they arrive (Poisson at
``rate`` requests per second, or all at once: a fixed batch) and the most sequences decoded together
(``max_batch``); the run's random numbers come from ``seed`` alone, so the same inputs give the same run.

The KV cache of one token is layers x 2 (K and V) x kv_heads x head_dim x bytes per element
(:func:`kv_bytes_per_token`). One serving step (:func:`step_kernels`) runs, on one rank of a TP group and
for the layers of one pipeline stage, the prefill of the prompts admitted in that step (their GEMMs over
every prompt token, causal flash attention per prompt, their KV written) and one decode token of every
running sequence (GEMMs over the batch, attention reading each sequence's KV cache), the norms, residual
adds and activations as memory-bound kernels, and (last stage) the logits GEMM.

Units: bytes, FLOP, seconds, tokens, requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from hcsim.config import Fields
from hcsim.errors import ConfigError
from hcsim.workload.model import ModelShape, element_sizes
from hcsim.workload.ops import Op, _gemm, _memory

__all__ = ["ServingSpec", "Request", "kv_bytes_per_token", "make_requests", "step_kernels", "is_serving",
           "serving_spec_from_dict"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingSpec:
    """A serving workload: `requests` requests with prompt and output lengths in [low, high] (tokens), arriving
    at `rate` per second (None: all at t = 0), at most `max_batch` sequences in flight and at most
    `max_prefill_tokens` prompt tokens prefilled in one step (vLLM's max_num_batched_tokens; a longer prompt
    goes alone)."""

    name: str
    model: ModelShape
    precision: str = "bf16"
    requests: int = 64
    prompt: tuple[int, int] = (512, 512)
    output: tuple[int, int] = (128, 128)
    rate: float | None = None
    max_batch: int = 256
    max_prefill_tokens: int = 8192
    seed: int = 0
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        where = f"serving workload {self.name!r}"
        if isinstance(self.requests, bool) or not isinstance(self.requests, int) or not 1 <= self.requests <= 10**6:
            raise ConfigError(f"{where}: requests must be an integer from 1 to 1,000,000, got {self.requests!r}")
        for key in ("prompt", "output"):
            low, high = getattr(self, key)
            if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high <= 10**7):
                raise ConfigError(f"{where}: {key} must be a length or [low, high] with 1 <= low <= high <= 10^7 "
                                  f"tokens, got {[low, high]}")
        if self.output[0] < 2:
            raise ConfigError(f"{where}: output must be at least 2 tokens (a time per output token needs two)")
        if self.rate is not None and not 0 < self.rate <= 1e6:
            raise ConfigError(f"{where}: rate must be > 0 and <= 1e6 requests per second, or absent (a fixed "
                              f"batch), got {self.rate!r}")
        for key in ("max_batch", "max_prefill_tokens"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}: {key} must be an integer >= 1, got {value!r}")
        if self.precision not in ("fp16", "bf16"):
            raise ConfigError(f"{where}: precision must be fp16 or bf16 for serving, got {self.precision!r}")


@dataclass(frozen=True, slots=True)
class Request:
    """One request: its index, arrival time (s), prompt and output lengths (tokens)."""

    index: int
    arrival: float
    prompt: int
    output: int


def kv_bytes_per_token(model: ModelShape, precision: str = "bf16") -> float:
    """KV-cache bytes of one token: layers x 2 x kv_heads x head_dim x bytes per element.

    >>> m = ModelShape(name="llama3-70b", decoders=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, sequence=8192)
    >>> kv_bytes_per_token(m)  # 80 x 2 x 8 x 128 x 2
    327680.0
    """
    return model.decoders * 2.0 * model.kv_hidden * element_sizes(precision).activation


def make_requests(spec: ServingSpec) -> list[Request]:
    """The requests of `spec` in arrival order, from its seed alone (the same spec gives the same requests)."""
    rng = random.Random(spec.seed)
    now, requests = 0.0, []
    for index in range(spec.requests):
        if spec.rate is not None:
            now += rng.expovariate(spec.rate)
        requests.append(Request(index, now, rng.randint(*spec.prompt), rng.randint(*spec.output)))
    return requests


def step_kernels(model: ModelShape, *, prompts: list[int], decode: int, context: float, tp: int = 1,
                 layers: int | None = None, head: bool = True, precision: str = "bf16") -> tuple[list[Op], float]:
    """The kernels of one serving step on one TP rank over `layers` decoder layers (default: all), and the
    bytes of KV cache they read.

    prompts : the prompt lengths prefilled in this step; decode : sequences decoding one token;
    context : their KV-cache tokens in all (each decode token's attention reads its sequence's cache);
    head : the step includes the logits GEMM (the last pipeline stage). The attention of a decode token is a
    memory-bound kernel reading its cache; a prompt's is a causal flash attention kernel."""
    e = element_sizes(precision).activation
    h, kv, f, d = model.hidden, model.kv_hidden, model.ffn, model.hidden // model.heads
    layers = model.decoders if layers is None else layers
    tokens = sum(prompts) + decode
    if tokens < 1:
        raise ConfigError(f"serving step of {model.name!r}: needs at least one token to prefill or decode, got none")
    widen = 2 if model.mlp == "swiglu" else 1
    kv_read = context * 2.0 * kv / tp * e  # one layer's cache of the decoding sequences
    kernels: list[Op] = []
    for layer in range(layers):
        kernels += [_memory("norm_attn", 2 * tokens * h * e),
                    _gemm("qkv", tokens, (h + 2 * kv) // tp, h, e)]
        for p in prompts:  # causal: the kernel skips the masked half
            kernels.append(Op("flash_attention", "attention", 2.0 * p * p * h / tp, 4.0 * p * h / tp * e, p,
                              model.heads // tp, d))
        if decode:
            kernels.append(Op("decode_attention", "memory", 4.0 * context * h / tp, kv_read + 2 * decode * h / tp * e))
        kernels += [_gemm("proj", tokens, h, h // tp, e), _memory("add_attn", 3 * tokens * h * e),
                    _memory("norm_mlp", 2 * tokens * h * e), _gemm("up", tokens, widen * f // tp, h, e),
                    _memory("activation", (widen + 1) * tokens * f / tp * e), _gemm("down", tokens, h, f // tp, e),
                    _memory("add_mlp", 3 * tokens * h * e)]
    if head:
        kernels.append(_gemm("logits", len(prompts) + decode, -(-model.vocabulary // tp) or 1, h, e))
    return kernels, kv_read * layers


def is_serving(data) -> bool:
    """Whether parsed workload YAML describes a serving workload (``kind: serving``)."""
    return isinstance(data, dict) and data.get("kind") == "serving"


def serving_spec_from_dict(data: dict, where: str, shape_of) -> ServingSpec:
    """A ServingSpec from parsed YAML (`shape_of(fields)` reads its model section); one ConfigError listing every
    problem, each naming its key."""
    top = Fields(data, f"{where}: ")
    top.choice("kind", ("serving",))
    name = top.string("name", Path(where).stem)
    shape = shape_of(top.sub("model"), name)
    serving = top.sub("serving")

    def lengths(key, default):
        value = serving.raw(key, default)
        if isinstance(value, int) and not isinstance(value, bool):
            return (value, value)
        if isinstance(value, list) and len(value) == 2:
            return tuple(value)
        serving.problems.append(f"{serving.path(key)}: expected a length in tokens or [low, high], got {value!r}")
        return default

    serving.seen.update(("prompt", "output"))
    values = dict(requests=serving.number("requests", 64, kind=int, minimum=1),
                  prompt=lengths("prompt", (512, 512)), output=lengths("output", (128, 128)),
                  rate=serving.number("rate", None), max_batch=serving.number("max_batch", 256, kind=int, minimum=1),
                  max_prefill_tokens=serving.number("max_prefill_tokens", 8192, kind=int, minimum=1),
                  seed=serving.number("seed", 0, kind=int, minimum=0))
    precision = top.choice("precision", ("fp16", "bf16"), "bf16")
    description = top.string("description", "")
    top.done()
    try:
        return ServingSpec(name=name, model=shape, precision=precision, description=description, source=where,
                           **values)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
