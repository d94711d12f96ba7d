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
being that of the kind of the transfer's bottleneck link; each member of a
collective call completes call_latency after its last transfer (kernel launch,
protocol hand-shakes). The bytes counted on the links stay the real bytes.

Every factor is named in a YAML file (``platforms/compute-model.yaml`` by
default, scenario key ``compute_factors``) with its source; this module is the
only place that turns them into times. Units: s, FLOP/s, B/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from hcsim.config import REPO_ROOT, Fields, load_yaml
from hcsim.errors import ConfigError

__all__ = ["DeviceFactors", "LinkFactors", "ComputeModel", "load_compute_model", "BUILTIN_FACTORS", "COMPUTE_MODELS"]

COMPUTE_MODELS = ("peak", "roofline")
BUILTIN_FACTORS = REPO_ROOT / "platforms" / "compute-model.yaml"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceFactors:
    """Achieved-efficiency factors of one device (dimensionless fractions in (0, 1], seconds).

    gemm_max_efficiency : fraction of peak a large GEMM reaches; gemm_half_dimension : the
    dimension (elements) at which one of m, n, k halves it (efficiency = max x prod d/(d + half));
    memory_efficiency : fraction of the memory bandwidth a memory-bound kernel reaches;
    flash_forward_efficiency, flash_backward_efficiency : fraction of peak of a fused attention
    kernel's FLOPs (4·b·s²·h forward, 10·b·s²·h backward: it recomputes Q·Kᵀ); kernel_overhead : s per kernel.
    """

    name: str
    gemm_max_efficiency: float
    gemm_half_dimension: float
    memory_efficiency: float
    flash_forward_efficiency: float
    flash_backward_efficiency: float
    kernel_overhead: float

    def __post_init__(self) -> None:
        for key in ("gemm_max_efficiency", "memory_efficiency", "flash_forward_efficiency",
                    "flash_backward_efficiency"):
            if not 0 < getattr(self, key) <= 1:
                raise ConfigError(f"compute model: devices.{self.name}: {key} must be in (0, 1], got {getattr(self, key)!r}")
        if not self.gemm_half_dimension >= 0:
            raise ConfigError(f"compute model: devices.{self.name}: gemm.half_dimension must be >= 0")
        if not self.kernel_overhead >= 0:
            raise ConfigError(f"compute model: devices.{self.name}: kernel_overhead must be >= 0")

    def gemm_efficiency(self, m: int, n: int, k: int) -> float:
        """Fraction of peak of an m x k by k x n GEMM: max x prod over the dimensions of d / (d + half).

        >>> f = DeviceFactors(name="x", gemm_max_efficiency=0.8, gemm_half_dimension=100,
        ...                   memory_efficiency=1, flash_forward_efficiency=1, flash_backward_efficiency=1,
        ...                   kernel_overhead=0)
        >>> round(f.gemm_efficiency(100, 1e12, 1e12), 6)
        0.4
        """
        half = self.gemm_half_dimension
        return self.gemm_max_efficiency * (m / (m + half)) * (n / (n + half)) * (k / (k + half))


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkFactors:
    """A link kind's collective factors: achieved fraction of the line rate, and s per collective call."""

    kind: str
    bandwidth_factor: float
    call_latency: float

    def __post_init__(self) -> None:
        if not 0 < self.bandwidth_factor <= 1:
            raise ConfigError(f"compute model: links.{self.kind}: bandwidth_factor must be in (0, 1], "
                              f"got {self.bandwidth_factor!r}")
        if not self.call_latency >= 0:
            raise ConfigError(f"compute model: links.{self.kind}: call_latency must be >= 0")


@dataclass(frozen=True, kw_only=True)
class ComputeModel:
    """The roofline model's factors, per device name and per link kind (`source`: the file read)."""

    devices: dict[str, DeviceFactors]
    links: dict[str, LinkFactors]
    source: str = ""

    def device(self, name: str) -> DeviceFactors:
        """The factors of device `name`; ConfigError naming the file and the devices it has."""
        try:
            return self.devices[name]
        except KeyError:
            raise ConfigError(f"{self.source}: devices: no roofline factors for device {name!r}; it has "
                              f"{', '.join(sorted(self.devices))}. Fix: add them (see platforms/compute-model.yaml), "
                              f"or run with compute_model: peak") from None

    def link(self, kind: str) -> LinkFactors:
        """The factors of link kind `kind` (the ``default`` entry when the kind has none)."""
        found = self.links.get(kind) or self.links.get("default")
        if found is None:
            raise ConfigError(f"{self.source}: links: no factors for link kind {kind!r} and no default entry")
        return found

    def op_time(self, factors: DeviceFactors, op, peak: float, memory_bandwidth: float) -> float:
        """Seconds of one kernel (an :class:`hcsim.workload.ops.Op` or a tuple of its fields)."""
        name, kind, flops, size, m, n, k = op[:7]
        if kind == "gemm":
            efficiency = factors.gemm_efficiency(m, n, k)
        elif kind == "attention":
            efficiency = factors.flash_backward_efficiency if name.endswith(".bwd") else factors.flash_forward_efficiency
        elif kind == "memory":
            efficiency = 1.0
        else:
            raise ConfigError(f"compute vertex op {name!r}: kind {kind!r} is not one of gemm, attention, memory")
        compute = flops / (peak * efficiency) if flops else 0.0
        memory = size / (memory_bandwidth * factors.memory_efficiency) if size else 0.0
        return max(compute, memory) + factors.kernel_overhead

    def time(self, ops, device: str, peak: float, memory_bandwidth: float) -> float:
        """Seconds of a compute instance running `ops` on `device` (peak FLOP/s, memory bandwidth B/s)."""
        factors = self.device(device)
        return math.fsum(self.op_time(factors, op, peak, memory_bandwidth) for op in ops)


def load_compute_model(path: str | Path | None = None) -> ComputeModel:
    """Read roofline factors from YAML (default: the built-in ``platforms/compute-model.yaml``).

    Shape: ``devices: {NAME: {gemm: {max_efficiency, half_dimension}, memory_efficiency,
    attention: {flash_forward_efficiency, flash_backward_efficiency}, kernel_overhead}}`` and
    ``links: {KIND or default: {bandwidth_factor, call_latency}}``; each value may carry its
    ``source`` beside it (``source_*`` keys are documentation and ignored)."""
    path = Path(path) if path else BUILTIN_FACTORS
    top = Fields(load_yaml(path), f"{path}: ")
    devices: dict[str, DeviceFactors] = {}
    entries = top.raw("devices")
    if not isinstance(entries, dict):
        top.problems.append(f"{path}: devices: expected a mapping of device name to factors")
        entries = {}
    for name, data in entries.items():
        fields = Fields(data, f"{path}: devices.{name}", top.problems)
        gemm, attention = fields.sub("gemm"), fields.sub("attention")
        values = dict(
            gemm_max_efficiency=gemm.number("max_efficiency"),
            gemm_half_dimension=gemm.number("half_dimension", minimum=0),
            memory_efficiency=fields.number("memory_efficiency"),
            flash_forward_efficiency=attention.number("flash_forward_efficiency"),
            flash_backward_efficiency=attention.number("flash_backward_efficiency"),
            kernel_overhead=fields.quantity("kernel_overhead", "time", positive=False),
        )
        for sub in (gemm, attention, fields):
            sub.check_unknown(_documentation(sub))
        if None not in values.values():
            try:
                devices[str(name)] = DeviceFactors(name=str(name), **values)
            except ConfigError as err:
                top.problems.append(f"{path}: {err}")
    links: dict[str, LinkFactors] = {}
    for kind, data in (top.raw("links") or {}).items():
        fields = Fields(data, f"{path}: links.{kind}", top.problems)
        factor = fields.number("bandwidth_factor")
        latency = fields.quantity("call_latency", "time", positive=False)
        fields.check_unknown(_documentation(fields))
        if factor is not None and latency is not None:
            try:
                links[str(kind)] = LinkFactors(kind=str(kind), bandwidth_factor=factor, call_latency=latency)
            except ConfigError as err:
                top.problems.append(f"{path}: {err}")
    top.check_unknown(_documentation(top))
    top.done()
    return ComputeModel(devices=devices, links=links, source=str(path))


def _documentation(fields: Fields) -> list[str]:
    """The ``source`` / ``source_*`` keys of a mapping: documentation beside the factors."""
    return [k for k in fields.data if str(k) == "source" or str(k).startswith("source_")]
