"""The roofline compute model: how long a compute instance and a collective's transfers take.

Scenario key ``compute_model``: ``peak`` (the paper's model, the default: a
compute instance takes FLOPs / peak FLOP/s, a transfer latency + size /
bandwidth) or ``roofline``. With ``roofline`` a compute instance takes, over
the kernels of its vertex (``ops``, :mod:`hcsim.workload.ops`),

    sum over ops of  max(FLOPs / (peak x efficiency(op)), bytes / (B_mem x memory_efficiency))
                     + kernel_overhead

where B_mem is the bandwidth of the XPU's link to its own memory (the device's
memory bandwidth), efficiency(op) is the GEMM curve of the device for a GEMM
(``gemm_efficiency``), the flash-attention factor for a fused attention kernel
and 1 for a memory-bound kernel (FLOPs 0). The memory traffic of the vertex
still runs beside the computation over the platform's links, as in the peak
model: the roofline sets the XPU's own time, the platform keeps the contention
of reads from shared or extended memory (a spilled vertex can still stall).

Collectives: each transfer of a collective moves size / bandwidth_factor bytes'
worth of link time (NCCL reaches a fraction of the line rate), the factor
being that of the kind of the transfer's bottleneck link (and of the GPUs at
its ends: ``links.KIND.devices``, the NVLink generation); each member of a
collective call completes call_latency + steps x step_latency after its last
transfer (NCCL's tuning model: a base latency per call and a latency per step
of the algorithm's schedule). Where a link kind lists NCCL's other protocols
(LL, LL128) or NVLink SHARP factors (``nvls``), the collective runs the one of
least estimated time (:meth:`LinkFactors.fastest`, NCCL's rule). The bytes
counted on the links stay the real bytes.

Every factor is named in a YAML file (``platforms/compute-model.yaml`` by
default, scenario key ``compute_factors``) with its source; this module is the
only place that turns them into times. Units: s, FLOP/s, B/s.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path

from hcsim.config import REPO_ROOT, Fields, load_yaml
from hcsim.workload.ops import BACKWARD_SUFFIXES, BANDWIDTH_KINDS, DROPOUT, OP_KINDS
from hcsim.errors import ConfigError, brief

__all__ = ["DeviceFactors", "LinkFactors", "Protocol", "ComputeModel", "load_compute_model", "BUILTIN_FACTORS", "COMPUTE_MODELS"]

log = logging.getLogger(__name__)

COMPUTE_MODELS = ("peak", "roofline")
# the fractions of peak a device's factors give; one below IMPLAUSIBLE is said (a warning) when a user's file gives it
EFFICIENCIES = ("gemm_max_efficiency", "memory_efficiency", "reduction_efficiency", "mixed_efficiency",
                "upcast_efficiency", "decode_efficiency", "strided_efficiency", "multi_tensor_efficiency",
                "flash_forward_efficiency", "flash_backward_efficiency")
IMPLAUSIBLE = 0.01
BUILTIN_FACTORS = REPO_ROOT / "platforms" / "compute-model.yaml"


# the kernels whose clocks a power limit sets (measured: BF16 and FP8 GEMMs, each compute-bound); attention's and the
# unaligned GEMMs' draw is not measured apart: they count with the other kernels
POWERED_KINDS = ("gemm", "gemm8")
SPLIT_K = (1, 2, 4)  # split-K factors a wave-quantised GEMM may use (cuBLAS splits K when tiles leave SMs idle)
GEMM_TILE = 128      # output tile edge (elements) of the wave model: cuBLAS / CUTLASS BF16 kernels' 128 x 128 tiles
PROVENANCES = ("measured", "calibrated", "literature")


def gemm_utilization(m: float, n: float, k: float, sms: int, k_half: float, batch: int = 1) -> float:
    """Fraction of a GEMM's full rate the wave model gives an m x k by k x n GEMM (`batch` times).

    The output is cut into 128 x 128 tiles (x the split-K factor), run in waves of `sms` tiles; a wave
    that is not full leaves SMs idle (wave quantisation), and each tile's K loop pays a pipeline fill
    worth `k_half` elements of K. The best of the split-K factors :data:`SPLIT_K` is taken, as cuBLAS's
    heuristics pick a kernel. (NVIDIA, Matrix Multiplication Background User's Guide: tile and wave
    quantisation.)

    >>> round(gemm_utilization(128 * 132, 128, 1e9, sms=132, k_half=0), 6)
    1.0
    >>> round(gemm_utilization(128 * 133, 128, 1e9, sms=132, k_half=0), 4)  # a tile past one wave: split-K 4
    0.8061
    """
    best = 0.0
    tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE) * batch
    for split in SPLIT_K:
        waves = math.ceil(tiles * split / sms)
        depth = k / split
        best = max(best, tiles * split / (waves * sms) * depth / (depth + k_half))
    return best


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceFactors:
    """Achieved-efficiency factors of one device (dimensionless fractions in (0, 1], seconds).

    GEMMs, one of two forms. Measured (``sms`` set): efficiency = gemm_max_efficiency x
    :func:`gemm_utilization` (128 x 128 tiles in waves of ``sms``, a pipeline fill of ``gemm_k_half``
    elements of K), fitted to measured GEMMs by :mod:`hcsim.study.calibrate`. Formula (``sms`` 0): efficiency =
    gemm_max_efficiency x prod over m, n, k of d / (d + gemm_half_dimension). An FP8 GEMM (Transformer Engine's):
    fp8_gemm_speedup times that, its fill fp8_gemm_k_half (FP8 and BF16 GEMMs measured side by side: the FP8
    kernels' longer K tiles fill over more of K, so small GEMMs gain less than the large ones' speed-up).
    memory_efficiency : fraction of the memory bandwidth a streaming memory-bound kernel reaches;
    reduction_efficiency : the fraction a reducing one reaches (norm statistics, softmax, gradient sums, the
    optimizer's multi-tensor kernels; :data:`hcsim.workload.ops.OP_KINDS`), memory_efficiency when 0;
    mixed_efficiency, strided_efficiency : likewise for elementwise kernels over two dtypes and for kernels over
    transposed or sliced tensors (memory_efficiency when 0); cat_efficiency for torch.cat's kernel (strided_efficiency
    when 0); upcast_efficiency for PyTorch's copy of a 16-bit tensor to FP32 (mixed_efficiency when 0);
    decode_efficiency for decode attention's read of the key/value cache (memory_efficiency when 0).
    multi_tensor_efficiency : the fraction a launch of PyTorch's multi_tensor_apply reaches (fused AdamW, the foreach
    norm and scaling of gradient clipping: ``multi_tensor`` ops), measured on fused AdamW (memory_efficiency when 0).
    gemm_unaligned_forward, gemm_unaligned_backward : the fraction of peak a GEMM with a dimension that is not a
    multiple of 8 elements reaches (cuBLAS falls back to kernels without 16-byte aligned loads), as a forward GEMM
    and as a gradient GEMM (``.dgrad`` / ``.wgrad``); 0: the aligned model.
    Attention (fused FlashAttention kernels): ``attention_table`` rows (head dimension, sequence, forward
    efficiency, backward efficiency) measured per (s, d), interpolated in log2 s and d, clamped at the ends;
    without a table the constants flash_forward_efficiency / flash_backward_efficiency;
    attention_dropout_forward / _backward: how many times longer an attention kernel with dropout takes (1 when 0).
    power_gemm, power_other : the GPU's power limit (0: none modelled). A compute-bound GEMM run back to back
    would draw power_gemm times the limit at the clocks it was timed alone at, any other kernel power_other times
    it; the clocks settle where the mean of a compute instance's kernels meets the limit
    (:meth:`sustained_clock`), and its GEMMs run that much slower. Fitted to GEMMs timed by what runs around
    them (``benchmarks/gpu_kernels.py --only gemm_duty``).
    kernel_overhead : s the GPU spends per kernel beyond its work; launch : s the host needs to issue one
    forward kernel (PyTorch's Python dispatch, autograd's bookkeeping and cudaLaunchKernel), backward_launch
    one backward kernel (autograd's engine, in C++; launch when 0): a kernel starts no earlier than its
    issue, so a run of small kernels is bound by the host, not the GPU. provenance : measured | calibrated | literature.
    """

    name: str
    gemm_max_efficiency: float
    fp8_gemm_speedup: float = 0.0  # an FP8 GEMM's rate over the BF16 one's (measured side by side); 0: no FP8
    fp8_gemm_k_half: float = 0.0  # an FP8 GEMM's pipeline fill in elements of K; 0: gemm_k_half
    gemm_half_dimension: float = 0.0
    gemm_k_half: float = 0.0
    sms: int = 0
    memory_efficiency: float
    reduction_efficiency: float = 0.0  # 0: as memory_efficiency
    mixed_efficiency: float = 0.0
    upcast_efficiency: float = 0.0
    decode_efficiency: float = 0.0
    strided_efficiency: float = 0.0
    cat_efficiency: float = 0.0
    multi_tensor_efficiency: float = 0.0
    gemm_unaligned_forward: float = 0.0
    gemm_unaligned_backward: float = 0.0
    attention_dropout_forward: float = 0.0
    attention_dropout_backward: float = 0.0
    flash_forward_efficiency: float = 1.0
    flash_backward_efficiency: float = 1.0
    attention_table: tuple[tuple[float, float, float, float], ...] = ()
    power_gemm: float = 0.0
    power_other: float = 0.0
    kernel_overhead: float = 0.0
    launch: float = 0.0
    backward_launch: float = 0.0
    provenance: str = "literature"

    def __post_init__(self) -> None:
        for key in ("gemm_max_efficiency", "memory_efficiency", "flash_forward_efficiency",
                    "flash_backward_efficiency"):
            if not 0 < getattr(self, key) <= 1:
                raise ConfigError(f"compute model: devices.{self.name}: {key} must be in (0, 1], got {getattr(self, key)!r}")
        for key in ("reduction_efficiency", "mixed_efficiency", "upcast_efficiency", "decode_efficiency",
                    "strided_efficiency", "cat_efficiency", "multi_tensor_efficiency", "gemm_unaligned_forward",
                    "gemm_unaligned_backward"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"compute model: devices.{self.name}: {key} must be in (0, 1] (0: not measured), "
                                  f"got {getattr(self, key)!r}")
        for key in ("attention_dropout_forward", "attention_dropout_backward"):
            if not (getattr(self, key) == 0 or 1 <= getattr(self, key) <= 10):
                raise ConfigError(f"compute model: devices.{self.name}: {key} must be a slowdown in [1, 10] (0: not "
                                  f"measured), got {getattr(self, key)!r}")
        for row in self.attention_table:
            if len(row) != 4 or not (row[0] >= 1 and row[1] >= 1 and 0 < row[2] <= 1 and 0 < row[3] <= 1):
                raise ConfigError(f"compute model: devices.{self.name}: attention.table rows are [head_dim, sequence, "
                                  f"forward efficiency, backward efficiency] with efficiencies in (0, 1], got {row!r}")
        for key in ("gemm_half_dimension", "gemm_k_half", "kernel_overhead", "launch", "backward_launch", "sms",
                    "fp8_gemm_speedup", "fp8_gemm_k_half", "power_gemm", "power_other"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"compute model: devices.{self.name}: {key} must be >= 0, got {getattr(self, key)!r}")
        if not self.power_other < 1:  # other kernels alone stay under the limit: sustained_clock stays > 0
            raise ConfigError(f"compute model: devices.{self.name}: power.other must be in [0, 1) (a kernel that is "
                              f"not a GEMM draws less than the power limit), got {self.power_other!r}")
        if self.provenance not in PROVENANCES:
            raise ConfigError(f"compute model: devices.{self.name}: provenance {self.provenance!r} is not one of "
                              f"{', '.join(PROVENANCES)}")

    def gemm_efficiency(self, m: int, n: int, k: int, batch: int = 1, sm_margin: int = 0, fp8: bool = False) -> float:
        """Fraction of the BF16 peak of an m x k by k x n GEMM (`batch` times); on the SMs less `sm_margin` (those
        a communication kernel beside it holds: the GEMM's waves run on the rest, each SM at its own rate). In `fp8`
        the FP8 tensor cores reach ``fp8_gemm_speedup`` times the rate after a fill of ``fp8_gemm_k_half``. The
        formula form (no ``sms``) knows no SMs and ignores the margin.

        >>> f = DeviceFactors(name="x", gemm_max_efficiency=0.8, gemm_half_dimension=100, memory_efficiency=1)
        >>> round(f.gemm_efficiency(100, 1e12, 1e12), 6)
        0.4
        >>> g = DeviceFactors(name="y", gemm_max_efficiency=1.0, sms=4, memory_efficiency=1)
        >>> g.gemm_efficiency(128 * 4, 128, 1e9), round(g.gemm_efficiency(128 * 4, 128, 1e9, sm_margin=1), 6)
        (1.0, 0.666667)
        """
        speedup = self.fp8_gemm_speedup if fp8 else 1.0
        if self.sms:
            sms = self.sms - sm_margin
            if sms < 1:
                raise ConfigError(f"compute model: devices.{self.name}: a GEMM leaving {sm_margin} of its {self.sms} "
                                  f"SMs to communication has none left")
            k_half = (self.fp8_gemm_k_half or self.gemm_k_half) if fp8 else self.gemm_k_half
            return self.gemm_max_efficiency * sms / self.sms * gemm_utilization(m, n, k, sms, k_half, batch) * speedup
        half = self.gemm_half_dimension
        return self.gemm_max_efficiency * (m / (m + half)) * (n / (n + half)) * (k / (k + half)) * speedup

    def sustained_clock(self, share: float) -> float:
        """The fraction of the clock a compute-bound GEMM keeps when GEMMs fill `share` of the GPU's time and other
        kernels the rest: where share x power_gemm x clock + (1 - share) x power_other meets the limit (1 under
        it, and without a power limit).

        >>> f = DeviceFactors(name="x", gemm_max_efficiency=1, memory_efficiency=1, power_gemm=1.25, power_other=0.5)
        >>> f.sustained_clock(1.0), f.sustained_clock(0.8), f.sustained_clock(0.5)
        (0.8, 0.9, 1.0)
        """
        if not self.power_gemm or share <= 0:
            return 1.0
        return min(1.0, (1.0 - (1.0 - share) * self.power_other) / (share * self.power_gemm))

    def job_clock(self, gemms: Iterable[float], spans: Iterable[float]) -> float:
        """:meth:`sustained_clock` of a job whose compute vertices take `spans` seconds, `gemms` of them in
        compute-bound GEMMs (at the clocks kept alone): the limit averages over the job's many kernels."""
        span = math.fsum(spans)
        return self.sustained_clock(math.fsum(gemms) / span) if span > 0 else 1.0

    def bandwidth_efficiency(self, kind: str) -> float:
        """Fraction of the memory bandwidth a memory-bound kernel of `kind` reaches."""
        special = {"reduction": self.reduction_efficiency, "mixed": self.mixed_efficiency,
                   "upcast": self.upcast_efficiency or self.mixed_efficiency, "decode": self.decode_efficiency,
                   "strided": self.strided_efficiency, "cat": self.cat_efficiency or self.strided_efficiency,
                   "multi_tensor": self.multi_tensor_efficiency}.get(kind)
        return special or self.memory_efficiency

    def unaligned_gemm_efficiency(self, name: str) -> float:
        """The fraction of peak a ``gemm_unaligned`` kernel reaches (0 where the device has no measurement)."""
        return self.gemm_unaligned_backward if name.endswith((".dgrad", ".wgrad")) else self.gemm_unaligned_forward

    def attention_efficiency(self, sequence: float, head_dim: float, backward: bool) -> float:
        """Fraction of peak a fused attention kernel reaches at this sequence and head dimension."""
        if not self.attention_table:
            return self.flash_backward_efficiency if backward else self.flash_forward_efficiency
        column = 3 if backward else 2
        dims = sorted({row[0] for row in self.attention_table})

        def along_sequence(d):
            rows = sorted((row[1], row[column]) for row in self.attention_table if row[0] == d)
            return _interpolate(math.log2(max(sequence, 1)), [(math.log2(s), e) for s, e in rows])

        return _interpolate(head_dim, [(d, along_sequence(d)) for d in dims])


def _interpolate(x: float, points: list[tuple[float, float]]) -> float:
    """Piecewise-linear y(x) through sorted `points`, constant beyond the first and last."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


PROTOCOLS = ("LL", "LL128")
"""NCCL's protocols besides Simple (the bulk one, a link kind's own factors): LL (8-byte flag-and-data stores:
lowest latency, half the bandwidth) and LL128 (128-byte lines with a flag: most of Simple's bandwidth, less
latency per step); NVIDIA NCCL, src/graph/tuning.cc."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Protocol:
    """How NCCL moves a collective's data over a link kind: the achieved fraction of the line rate, the latency
    of a call and the latency of each step of the algorithm's schedule (s); NCCL's tuning model (tuning.cc)
    estimates a call as base latency + steps x per-step latency + bytes / bandwidth."""

    name: str
    bandwidth_factor: float
    call_latency: float
    step_latency: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.bandwidth_factor <= 1:
            raise ConfigError(f"compute model: {self.name}: bandwidth_factor must be in (0, 1], "
                              f"got {self.bandwidth_factor!r}")
        if not (self.call_latency >= 0 and self.step_latency >= 0):
            raise ConfigError(f"compute model: {self.name}: call_latency and step_latency must be >= 0")

    def latency(self, steps: int) -> float:
        """s a call costs beside its transfers: the base latency + `steps` x the per-step latency."""
        return self.call_latency + steps * self.step_latency

    def time(self, steps: int, size: float, bandwidth: float) -> float:
        """NCCL's estimate of a call, s: its latency + `size` (the busiest rank's bytes out, B) at the achieved
        share of `bandwidth` (B/s)."""
        return self.latency(steps) + size / (bandwidth * self.bandwidth_factor)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkFactors:
    """A link kind's collective factors: NCCL's Simple protocol (achieved fraction of the line rate, s per call,
    s per step of the schedule), the other protocols it may pick for small messages, and NVLink SHARP's."""

    kind: str
    bandwidth_factor: float
    call_latency: float
    step_latency: float = 0.0
    protocols: tuple[Protocol, ...] = ()  # LL, LL128: NCCL takes the fastest for the size
    nvls: Protocol | None = None  # the nvls all-reduce's (the switch reduces); None: no NVLink SHARP here

    def __post_init__(self) -> None:
        if not 0 < self.bandwidth_factor <= 1:
            raise ConfigError(f"compute model: links.{self.kind}: bandwidth_factor must be in (0, 1], "
                              f"got {self.bandwidth_factor!r}")
        if not (self.call_latency >= 0 and self.step_latency >= 0):
            raise ConfigError(f"compute model: links.{self.kind}: call_latency and step_latency must be >= 0")

    @property
    def simple(self) -> Protocol:
        """NCCL's Simple protocol on this link kind: its own factors."""
        return Protocol(name="Simple", bandwidth_factor=self.bandwidth_factor, call_latency=self.call_latency,
                        step_latency=self.step_latency)

    def fastest(self, nvls: bool, steps: int, size: float, bandwidth: float) -> Protocol:
        """NCCL's choice (tuning.cc, enqueue.cc topoGetAlgoInfo: the least estimated time) for a collective of
        `steps` steps whose busiest rank sends `size` B over a route of `bandwidth` B/s: Simple or a faster
        protocol for the size, or the nvls factors for the nvls all-reduce (NVLS runs Simple only; without
        nvls factors it runs at the link's own). Ties keep Simple."""
        if nvls:
            return self.nvls or self.simple
        return min((self.simple, *self.protocols), key=lambda p: p.time(steps, size, bandwidth))


@dataclass(frozen=True, kw_only=True)
class ComputeModel:
    """The roofline model's factors, per device name and per link kind (`source`: the file read)."""

    devices: dict[str, DeviceFactors]
    links: dict[str, LinkFactors]
    source: str = ""
    _times: dict = field(default_factory=dict, repr=False, compare=False)  # (id(ops), device, ...) -> (ops, s)
    _kernels: dict = field(default_factory=dict, repr=False, compare=False)  # likewise -> (ops, times, powered)
    _shares: dict = field(default_factory=dict, repr=False, compare=False)  # likewise -> (ops, (GEMM s, span s))

    def device(self, name: str) -> DeviceFactors:
        """The factors of device `name`; ConfigError naming the file and the devices it has."""
        try:
            return self.devices[name]
        except KeyError:
            raise ConfigError(f"{self.source}: devices: no roofline factors for device {name!r}; it has "
                              f"{', '.join(sorted(self.devices))}. Fix: add them (see platforms/compute-model.yaml), "
                              f"or run with compute_model: peak") from None

    def route_link(self, platform, route: list[str]) -> LinkFactors:
        """The factors of `route` (XPU to XPU over `platform`'s links): those of its bottleneck link's kind, for
        the device of the XPUs at both ends (a pair of different devices: the kind's own)."""
        edges, nodes = platform.edges, platform.nodes
        slowest = min(zip(route, route[1:]), key=lambda link: edges[link]["bandwidth"])
        device = nodes[route[0]].get("device")
        return self.link(edges[slowest]["kind"], device if device == nodes[route[-1]].get("device") else None)

    def link(self, kind: str, device: str | None = None) -> LinkFactors:
        """The factors of link kind `kind` between XPUs of `device` (its ``devices`` entry: the NVLink or
        InfiniBand generation that device's systems have), else the kind's own, else the ``default`` entry."""
        found = self.links.get(f"{kind}@{device}") if device else None
        found = found or self.links.get(kind) or self.links.get("default")
        if found is None:
            raise ConfigError(f"{self.source}: links: no factors for link kind {kind!r} and no default entry")
        return found

    def op_time(self, factors: DeviceFactors, op, peak: float, memory_bandwidth: float) -> float:
        """Seconds the GPU spends on one kernel (an :class:`hcsim.workload.ops.Op` or a tuple of its fields).

        An attention kernel's m is its sequence and k its head dimension."""
        return self.op_timing(factors, op, peak, memory_bandwidth)[0]

    def op_timing(self, factors: DeviceFactors, op, peak: float, memory_bandwidth: float) -> tuple[float, bool]:
        """(:meth:`op_time`, whether the kernel is a compute-bound GEMM: one whose clock a power limit sets,
        :data:`POWERED_KINDS`)."""
        compute, memory = self._op_parts(factors, op, peak, memory_bandwidth)
        return max(compute, memory) + factors.kernel_overhead, op[1] in POWERED_KINDS and compute >= memory

    def _op_parts(self, factors: DeviceFactors, op, peak: float, memory_bandwidth: float) -> tuple[float, float]:
        """A kernel's seconds bound by its FLOPs and by its bytes (:meth:`op_time`)."""
        name, kind, flops, size, m, n, k = op[:7]
        batch = op[7] if len(op) > 7 else 1
        margin = op[8] if len(op) > 8 else 0
        if kind == "gemm":
            efficiency = factors.gemm_efficiency(m, n, k, batch, margin)
        elif kind == "gemm_unaligned":
            efficiency = factors.unaligned_gemm_efficiency(name) or factors.gemm_efficiency(m, n, k, batch, margin)
        elif kind == "gemm8":  # `peak` is the BF16 one
            if not factors.fp8_gemm_speedup:
                raise ConfigError(f"compute model: device {factors.name!r} has no FP8 GEMM factors (gemm.fp8_speedup): "
                                  f"measure its FP8 GEMMs (benchmarks/gpu_kernels.py, hcsim calibrate), or train in "
                                  f"bf16")
            efficiency = factors.gemm_efficiency(m, n, k, batch, margin, fp8=True)
        elif kind == "attention":
            backward = name.endswith(".bwd")
            efficiency = factors.attention_efficiency(m, k, backward)
            if DROPOUT in name:
                efficiency /= (factors.attention_dropout_backward if backward else factors.attention_dropout_forward) \
                    or 1.0
        elif kind in BANDWIDTH_KINDS:
            efficiency = 1.0
        else:
            raise ConfigError(f"compute vertex op {name!r}: kind {kind!r} is not one of {', '.join(OP_KINDS)}")
        compute = flops / (peak * efficiency) if flops else 0.0
        memory = size / (memory_bandwidth * factors.bandwidth_efficiency(kind)) if size else 0.0
        return compute, memory

    def time(self, ops, device: str, peak: float, memory_bandwidth: float, clock: float = 1.0) -> float:
        """Seconds of a compute instance running `ops` on `device` (peak FLOP/s, memory bandwidth B/s).

        The host issues one kernel every ``launch`` seconds and the GPU runs them in order, each no earlier
        than its issue: the instance ends when the last kernel does (a stream fed by a host that starts
        with the instance). Its compute-bound GEMMs run at `clock` of the clock they keep alone (the one a
        power limit leaves them: :meth:`gemm_share`, :meth:`DeviceFactors.sustained_clock`)."""
        key = (id(ops), device, peak, memory_bandwidth, clock)
        cached = self._times.get(key)
        if cached is not None and cached[0] is ops:
            return cached[1]
        factors = self.device(device)
        times, powered = self._kernel_times(factors, ops, peak, memory_bandwidth)
        if clock != 1.0:
            times = [t / clock if p else t for t, p in zip(times, powered)]
        finished = self._span(factors, ops, times)
        self._times[key] = (ops, finished)
        return finished

    def gemm_share(self, ops, device: str, peak: float, memory_bandwidth: float) -> tuple[float, float]:
        """(seconds of compute-bound GEMMs, seconds of the whole instance) of `ops` at the clocks kept alone: what
        the GEMMs' share of a GPU's time under its power limit adds up from."""
        key = (id(ops), device, peak, memory_bandwidth)
        cached = self._shares.get(key)
        if cached is not None and cached[0] is ops:
            return cached[1]
        factors = self.device(device)
        times, powered = self._kernel_times(factors, ops, peak, memory_bandwidth)
        share = math.fsum(t for t, p in zip(times, powered) if p), self._span(factors, ops, times)
        self._shares[key] = (ops, share)
        return share

    def _kernel_times(self, factors: DeviceFactors, ops, peak: float, memory_bandwidth: float
                      ) -> tuple[list[float], list[bool]]:
        """Each kernel's seconds alone, and whether it is a compute-bound GEMM (POWERED_KINDS)."""
        key = (id(ops), factors.name, peak, memory_bandwidth)
        cached = self._kernels.get(key)
        if cached is not None and cached[0] is ops:
            return cached[1], cached[2]
        times, powered = [], []
        for op in ops:
            seconds, gemm = self.op_timing(factors, op, peak, memory_bandwidth)
            times.append(seconds)
            powered.append(gemm)
        self._kernels[key] = (ops, times, powered)
        return times, powered

    @staticmethod
    def _span(factors: DeviceFactors, ops, times: list[float]) -> float:
        """Seconds from the instance's start to its last kernel's end, kernels of `times` issued by the host."""
        if not factors.launch:  # the GPU never waits for the host: the kernels' sum
            return math.fsum(times)
        issued = finished = 0.0
        backward = factors.backward_launch or factors.launch
        for op, seconds in zip(ops, times):
            issued += backward if op[0].endswith(BACKWARD_SUFFIXES) else factors.launch
            finished = max(finished, issued) + seconds
        return finished


def lowest_clocks(clocks: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Device -> the lowest of `clocks` ((device, clock) pairs: the clocks GEMMs kept under a power limit) where below
    1, in device order: what a run reports.

    >>> lowest_clocks([("H100", 0.93), ("A100", 1.0), ("H100", 0.9)])
    {'H100': 0.9}
    """
    lowest: dict[str, float] = {}
    for device, clock in clocks:
        if clock < 1.0:
            lowest[device] = min(clock, lowest.get(device, 1.0))
    return dict(sorted(lowest.items()))


def load_compute_model(path: str | Path | None = None, devices: Collection[str] | None = None) -> ComputeModel:
    """Read roofline factors from YAML: the built-in ``platforms/compute-model.yaml``, with the devices and
    link kinds of `path` (a user's file, e.g. from ``hcsim calibrate``) over it.

    Shape: ``devices: {NAME: {provenance, gemm: {max_efficiency, and half_dimension, or k_half and sms},
    memory_efficiency, attention: {flash_forward_efficiency, flash_backward_efficiency} or {table: [[head_dim,
    sequence, forward, backward], ...]}, kernel_overhead, launch}}`` and ``links: {KIND or default:
    {bandwidth_factor, call_latency}}``; each value may carry its ``source`` beside it (``source_*`` keys are
    documentation and ignored).

    `path` must give factors (a file with neither ``devices`` nor ``links`` is refused), and with `devices`
    (the device names a run can have: the catalog's and its platform's) each device it names must be one of
    them, so a misspelt or lower-case name is an error rather than factors that go unused."""
    builtin = _read_factors(BUILTIN_FACTORS)
    if path is None or Path(path).resolve() == BUILTIN_FACTORS.resolve():
        return builtin
    mine = _read_factors(Path(path), devices)
    for factors in mine.devices.values() if devices is not None else ():  # said once, where a run reads it
        low = {key: getattr(factors, key) for key in EFFICIENCIES if 0 < getattr(factors, key) < IMPLAUSIBLE}
        if low:
            log.warning("%s: devices.%s: %s of the GPU's peak: below %g, its kernels would run %.3gx slower than its "
                        "datasheet (measured GPUs reach 0.3 to 0.9); efficiencies are fractions (0.7 for 70 %%)", path,
                        factors.name, ", ".join(f"{key} {value:g}" for key, value in low.items()), IMPLAUSIBLE,
                        1 / min(low.values()))
    return ComputeModel(devices={**builtin.devices, **mine.devices}, links={**_without_kinds(builtin.links, mine.links), **mine.links},
                        source=f"{path} (over {BUILTIN_FACTORS.name})")


def _without_kinds(links: dict[str, LinkFactors], replacing: dict[str, LinkFactors]) -> dict[str, LinkFactors]:
    """`links` less every entry of a kind `replacing` gives: a user's kind replaces the built-in one whole, its
    device entries too (keys KIND@DEVICE)."""
    kinds = {key.split("@")[0] for key in replacing}
    return {key: value for key, value in links.items() if key.split("@")[0] not in kinds}


def _read_factors(path: Path, known: Collection[str] | None = None) -> ComputeModel:
    """The factors of one file; `known`: the device names it may give (None: any), for a user's file."""
    top = Fields(load_yaml(path), f"{path}: ")
    devices: dict[str, DeviceFactors] = {}
    entries = top.raw("devices", {})
    if not isinstance(entries, dict):
        top.problems.append(f"{path}: devices: expected a mapping of device name to factors")
        entries = {}
    link_entries = top.raw("links") or {}
    if not isinstance(link_entries, dict):
        top.problems.append(f"{path}: links: expected a mapping of link kind (or default) to {{bandwidth_factor, "
                            f"call_latency}}, got {brief(link_entries)}")
        link_entries = {}
    if not entries and not link_entries and not top.problems:
        top.problems.append(f"{path}: gives no factors: expected devices: {{NAME: {{gemm, memory_efficiency, "
                            f"attention, kernel_overhead, ...}}}} and/or links: {{KIND: {{bandwidth_factor, "
                            f"call_latency}}}}, as in platforms/compute-model.yaml (hcsim calibrate writes one)")
    for name in entries if known is not None else ():
        if str(name) not in known:
            same = [k for k in known if k.lower() == str(name).lower()] or get_close_matches(str(name), known, 1)
            top.problems.append(f"{path}: devices.{name}: no device of that name (names are case-sensitive)"
                                + (f"; did you mean {same[0]!r}" if same else "")
                                + f"; the devices of this run's catalog and platform: {', '.join(sorted(known))}")
    for name, data in entries.items():
        fields = Fields(data, f"{path}: devices.{name}", top.problems)
        gemm, attention, power = fields.sub("gemm"), fields.sub("attention"), fields.sub("power")
        measured = gemm.has("sms")
        table = attention.raw("table", [])
        if not isinstance(table, list) or not all(isinstance(row, list) for row in table):
            top.problems.append(f"{path}: devices.{name}.attention.table: expected a list of [head_dim, sequence, "
                                f"forward efficiency, backward efficiency] rows")
            table = ()
        for i, row in enumerate(table):
            if len(row) != 4 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                        for x in row):
                top.problems.append(f"{path}: devices.{name}.attention.table[{i}]: expected 4 numbers [head_dim, "
                                    f"sequence, forward efficiency, backward efficiency], got {brief(row)}")
        attention.seen.add("table")
        values = dict(
            provenance=fields.choice("provenance", PROVENANCES, "literature"),
            gemm_max_efficiency=gemm.number("max_efficiency"),
            fp8_gemm_speedup=gemm.number("fp8_speedup", 0.0, minimum=0),
            fp8_gemm_k_half=gemm.number("fp8_k_half", 0.0, minimum=0),
            gemm_half_dimension=gemm.number("half_dimension", 0.0 if measured else ..., minimum=0),
            gemm_k_half=gemm.number("k_half", ... if measured else 0.0, minimum=0),
            sms=gemm.number("sms", 0, kind=int, minimum=1),
            memory_efficiency=fields.number("memory_efficiency"),
            reduction_efficiency=fields.number("reduction_efficiency", 0.0),
            mixed_efficiency=fields.number("mixed_efficiency", 0.0),
            upcast_efficiency=fields.number("upcast_efficiency", 0.0),
            decode_efficiency=fields.number("decode_efficiency", 0.0),
            strided_efficiency=fields.number("strided_efficiency", 0.0),
            cat_efficiency=fields.number("cat_efficiency", 0.0),
            multi_tensor_efficiency=fields.number("multi_tensor_efficiency", 0.0),
            gemm_unaligned_forward=gemm.number("unaligned_forward", 0.0),
            gemm_unaligned_backward=gemm.number("unaligned_backward", 0.0),
            attention_dropout_forward=attention.number("dropout_forward", 0.0),
            attention_dropout_backward=attention.number("dropout_backward", 0.0),
            flash_forward_efficiency=attention.number("flash_forward_efficiency", ... if not table else 1.0),
            flash_backward_efficiency=attention.number("flash_backward_efficiency", ... if not table else 1.0),
            attention_table=tuple(tuple(float(x) for x in row) for row in table
                                  if all(isinstance(x, (int, float)) for x in row)),
            power_gemm=power.number("gemm", 0.0, minimum=0),
            power_other=power.number("other", 0.0, minimum=0),
            kernel_overhead=fields.quantity("kernel_overhead", "time", positive=False),
            launch=fields.quantity("launch", "time", 0.0, positive=False),
            backward_launch=fields.quantity("backward_launch", "time", 0.0, positive=False),
        )
        for sub in (gemm, attention, power, fields):
            sub.check_unknown(_documentation(sub))
        if None not in values.values():
            try:
                devices[str(name)] = DeviceFactors(name=str(name), **values)
            except ConfigError as err:
                top.problems.append(f"{path}: {err}")
    links: dict[str, LinkFactors] = {}
    for kind, data in link_entries.items():
        fields = Fields(data, f"{path}: links.{kind}", top.problems)
        devices_of_kind = fields.sub("devices")
        _read_link(fields, str(kind), str(kind), links)
        for device, entry in devices_of_kind.data.items():  # links.KIND.devices.NAME: that generation's factors
            _read_link(Fields(entry, devices_of_kind.path(str(device)), top.problems), str(kind),
                       f"{kind}@{device}", links)
            devices_of_kind.seen.add(device)
    top.check_unknown(_documentation(top))
    top.done()
    return ComputeModel(devices=devices, links=links, source=str(path))


def _read_protocol(fields: Fields, name: str) -> Protocol | None:
    """A {bandwidth_factor, call_latency, step_latency} mapping (step_latency: 0 s unless given)."""
    factor = fields.number("bandwidth_factor")
    latency = fields.quantity("call_latency", "time", positive=False)
    step = fields.quantity("step_latency", "time", 0.0, positive=False)
    fields.check_unknown(_documentation(fields))
    if factor is None or latency is None or step is None:
        return None
    try:
        return Protocol(name=name, bandwidth_factor=factor, call_latency=latency, step_latency=step)
    except ConfigError as err:
        fields.problems.append(f"{fields.where}: {err}")
        return None


def _read_link(fields: Fields, kind: str, key: str, links: dict[str, LinkFactors]) -> None:
    """One link entry (a kind's, or a device's under it) into `links` under `key`, problems into `fields`'s."""
    protocols, read = fields.sub("protocols"), []
    for name, entry in protocols.data.items():
        if name not in PROTOCOLS:
            protocols.problems.append(f"{protocols.path(str(name))}: not one of NCCL's protocols besides Simple "
                                      f"(the entry's own factors): {', '.join(PROTOCOLS)}")
            continue
        protocols.seen.add(name)
        read.append(_read_protocol(Fields(entry, protocols.path(str(name)), fields.problems), str(name)))
    nvls = _read_protocol(fields.sub("nvls"), "NVLS") if fields.has("nvls") else None
    simple = _read_protocol(fields, "Simple")  # last: it checks the entry's unknown keys
    if simple is not None and None not in read and (nvls is not None or not fields.has("nvls")):
        links[key] = LinkFactors(kind=kind, bandwidth_factor=simple.bandwidth_factor, call_latency=simple.call_latency,
                                 step_latency=simple.step_latency, protocols=tuple(read), nvls=nvls)


def _documentation(fields: Fields) -> list[str]:
    """The ``source`` / ``source_*`` keys of a mapping: documentation beside the factors."""
    return [k for k in fields.data if str(k) == "source" or str(k).startswith("source_")]
