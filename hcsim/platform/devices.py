"""The device catalog: accelerators described by peak FLOP/s per precision and memory only.

Built-in devices live in ``platforms/devices.yaml``; users add their own
(FPGA, ASIC, anything measured) in YAML files of the same shape. A device
has a dense peak (no structured sparsity) for each precision it supports,
among :data:`PRECISIONS`; ``fp32`` and ``fp16`` are required, ``tf32``,
``bf16`` and ``fp8`` are given only where the device has them (a V100 has no
BF16, TF32 or FP8 tensor cores).

:func:`peak_flops` is the one lookup of a peak, for a :class:`Device` and for
an XPU node of a platform graph (whose ``peak_flops`` attribute holds the
same mapping; see :mod:`hcsim.platform.topology`).

A catalog file may also list host CPUs under ``cpus:`` (:class:`CpuDevice`:
FP32 peak, memory capacity and bandwidth), for platforms that name their CPU
(``kind: superchip``: a Grace beside its GPUs); :func:`load_cpu_catalog` reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from hcsim.config import REPO_ROOT, Fields, load_yaml
from hcsim.errors import ConfigError
from hcsim.units import FlopsPerSecond

__all__ = ["Device", "CpuDevice", "load_catalog", "load_cpu_catalog", "builtin_catalog", "peak_flops", "PRECISIONS",
           "REQUIRED_PRECISIONS"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")  # every precision a catalog entry may give a peak for
REQUIRED_PRECISIONS = ("fp32", "fp16")  # every device has these (the platform graph's fp32_flops / fp16_flops)
BUILTIN_CATALOG = REPO_ROOT / "platforms" / "devices.yaml"


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """An accelerator: dense peak FLOP/s per precision, memory in bytes, memory bandwidth in B/s.

    `fp32_flops` and `fp16_flops` are required; `peaks` adds the other
    precisions the device has (tf32, bf16, fp8) and, once built, holds every
    peak, fp32 and fp16 included, in :data:`PRECISIONS` order.

    >>> d = Device(name="X", fp32_flops=1e12, fp16_flops=4e12, memory=2**30, memory_bandwidth=1e11,
    ...            peaks={"bf16": 4e12})
    >>> dict(d.peaks), d.precisions
    ({'fp32': 1000000000000.0, 'bf16': 4000000000000.0, 'fp16': 4000000000000.0}, ('fp32', 'bf16', 'fp16'))
    """

    name: str
    fp32_flops: FlopsPerSecond
    fp16_flops: FlopsPerSecond
    memory: float
    memory_bandwidth: float
    peaks: Mapping[str, FlopsPerSecond] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        peaks = dict(self.peaks)
        for precision, value in (("fp32", self.fp32_flops), ("fp16", self.fp16_flops)):
            if peaks.setdefault(precision, value) != value:
                raise ConfigError(f"device {self.name!r}: peaks[{precision!r}] = {peaks[precision]!r} differs from "
                                  f"{precision}_flops = {value!r}; give it once")
        unknown = sorted(set(peaks) - set(PRECISIONS))
        if unknown:
            raise ConfigError(f"device {self.name!r}: unknown precision {unknown[0]!r}; valid: {', '.join(PRECISIONS)}")
        for precision, value in peaks.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"device {self.name!r}: {precision} peak must be > 0 FLOP/s, got {value!r}")
        for name in ("memory", "memory_bandwidth"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"device {self.name!r}: {name} must be > 0, got {getattr(self, name)!r}")
        object.__setattr__(self, "peaks", MappingProxyType({p: float(peaks[p]) for p in PRECISIONS if p in peaks}))

    @property
    def precisions(self) -> tuple[str, ...]:
        """The precisions this device has a peak for, in :data:`PRECISIONS` order."""
        return tuple(self.peaks)

    def flops(self, precision: str) -> FlopsPerSecond:
        """Dense peak FLOP/s at `precision` (see :func:`peak_flops`)."""
        return peak_flops(self, precision)


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuDevice:
    """A host CPU: FP32 peak FLOP/s (what an offloaded optimizer step runs at), memory in bytes, memory
    bandwidth in B/s (to its own DRAM / LPDDR5X).

    >>> CpuDevice(name="C", flops=1e12, memory=2**30, memory_bandwidth=1e11).flops
    1000000000000.0
    """

    name: str
    flops: FlopsPerSecond
    memory: float
    memory_bandwidth: float

    def __post_init__(self) -> None:
        for key in ("flops", "memory", "memory_bandwidth"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"cpu {self.name!r}: {key} must be > 0, got {value!r}")


def peak_flops(node_or_device: Device | Mapping, precision: str) -> FlopsPerSecond:
    """Dense peak FLOP/s of a device, or of an XPU node of a platform graph, at `precision`.

    A node's peaks are its ``peak_flops`` attribute (set by
    :func:`hcsim.platform.topology.add_xpu`); a node built by hand with only
    the older ``fp32_flops`` / ``fp16_flops`` keys reads those, with bf16 at
    the fp16 figure as before.

    Raises
    ------
    ConfigError
        naming the device, the precision and the precisions the device has,
        when it has no peak at `precision` (a V100 has no bf16), or when
        `precision` is not one of :data:`PRECISIONS`.

    >>> from hcsim.platform.devices import builtin_catalog
    >>> peak_flops(builtin_catalog()["H100"], "fp16")
    989000000000000.0
    """
    if isinstance(node_or_device, Device):
        name, peaks = node_or_device.name, node_or_device.peaks
    else:
        name = node_or_device.get("device", "?")
        peaks = node_or_device.get("peak_flops")
        if peaks is None:  # a node made without add_xpu: the two keys every XPU node has
            legacy = {"fp32": node_or_device.get("fp32_flops"), "fp16": node_or_device.get("fp16_flops")}
            peaks = {**legacy, "bf16": legacy["fp16"]}
    if precision not in PRECISIONS:
        raise ConfigError(f"device {name!r}: precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    value = peaks.get(precision)
    if value is None:
        has = ", ".join(p for p in PRECISIONS if peaks.get(p) is not None)
        raise ConfigError(f"device {name!r} has no {precision} peak FLOP/s; it has {has}. Fix: choose one of "
                          f"those precisions, or add `{precision}:` to the device's catalog entry if it has one")
    return float(value)


def load_catalog(path: str | Path) -> dict[str, Device]:
    """Read a device catalog YAML.

    Shape: ``devices: {NAME: {fp32, fp16, [tf32, bf16, fp8], memory, memory_bandwidth}}``,
    peaks in FLOP/s units (``989TFLOPS``), dense (no structured sparsity).
    """
    top = Fields(load_yaml(path), f"{path}: ")
    entries = top.raw("devices")
    top.raw("cpus")  # host CPUs: load_cpu_catalog
    catalog: dict[str, Device] = {}
    if not isinstance(entries, dict):
        top.problems.append(f"{path}: devices: expected a mapping of device name to figures")
        entries = {}
    for name, data in entries.items():
        fields = Fields(data, f"{path}: devices.{name}", top.problems)
        peaks = {p: fields.quantity(p, "flops", default=... if p in REQUIRED_PRECISIONS else None)
                 for p in PRECISIONS}
        memory = fields.quantity("memory", "size")
        bandwidth = fields.quantity("memory_bandwidth", "bandwidth")
        fields.check_unknown()
        if None not in (memory, bandwidth) and all(peaks[p] is not None for p in REQUIRED_PRECISIONS):
            catalog[str(name)] = Device(name=str(name), fp32_flops=peaks.pop("fp32"), fp16_flops=peaks.pop("fp16"),
                                        memory=memory, memory_bandwidth=bandwidth,
                                        peaks={p: v for p, v in peaks.items() if v is not None})
    top.done()
    return catalog


def load_cpu_catalog(path: str | Path) -> dict[str, CpuDevice]:
    """The host CPUs of a device catalog YAML (its optional ``cpus:`` section).

    Shape: ``cpus: {NAME: {flops, memory, memory_bandwidth}}``; ``flops`` is the FP32 peak.

    >>> load_cpu_catalog(BUILTIN_CATALOG)["Grace"].memory_bandwidth
    512000000000.0
    """
    top = Fields(load_yaml(path), f"{path}: ")
    top.raw("devices")  # accelerators: load_catalog
    entries = top.raw("cpus", {})
    catalog: dict[str, CpuDevice] = {}
    if not isinstance(entries, dict):
        top.problems.append(f"{path}: cpus: expected a mapping of CPU name to figures (flops, memory, "
                            f"memory_bandwidth)")
        entries = {}
    for name, data in entries.items():
        fields = Fields(data, f"{path}: cpus.{name}", top.problems)
        values = dict(flops=fields.quantity("flops", "flops"), memory=fields.quantity("memory", "size"),
                      memory_bandwidth=fields.quantity("memory_bandwidth", "bandwidth"))
        fields.check_unknown()
        if None not in values.values():
            catalog[str(name)] = CpuDevice(name=str(name), **values)
    top.done()
    return catalog


def builtin_catalog() -> dict[str, Device]:
    """The catalog shipped in ``platforms/devices.yaml``."""
    return load_catalog(BUILTIN_CATALOG)
